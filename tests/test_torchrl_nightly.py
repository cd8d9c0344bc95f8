"""``benchmarks/torchrl_nightly.py``'s own logic, without a network install.

The benchmark installs TorchRL's nightly builds into a scratch venv; these tests check what it decides before and
after: its command line, what it installs and with which pip commands, how it runs a test file and counts its
cases, and the install page's section it renders from a results file.
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
from pathlib import Path

import pytest
import torchrl_nightly as tn

PYPROJECT = """
[project]
name = "x"
dependencies = ["torch>=2.14,<2.15", "torchrl==0.14.1", "tensordict>=0.14,<0.15", "gymnasium[mujoco]>=1.0",
                "envpool==1.2.5", "Torch_Foo>=1"]
[project.optional-dependencies]
test = ["pytest>=8", "pytest-timeout"]
docs = ["sphinx"]
"""


def test_the_command_line_defaults_and_its_errors(tmp_path, capsys):
    args = tn.parse_args([])
    assert args.stacks == ["nightly", "stable"] and args.tests == list(tn.DEFAULT_TESTS)
    assert args.venv is None and not args.keep and args.rl_root is None and args.conformance_side == "ours"
    args = tn.parse_args(["--venv", str(tmp_path), "--rl-root", str(tmp_path), "--tests", "tests/a.py::t", "--keep"])
    assert args.venv == tmp_path and args.rl_root == tmp_path.resolve() and args.tests == ["tests/a.py::t"]
    with pytest.raises(SystemExit):
        tn.parse_args(["--stacks", "stable"])  # no nightly to take a torch from
    assert "--stable-torch" in capsys.readouterr().err
    assert tn.parse_args(["--stacks", "stable", "--stable-torch", "2.15.0"]).stable_torch == "2.15.0"
    with pytest.raises(SystemExit):
        tn.parse_args(["--rl-root", str(tmp_path / "missing")])


def test_the_default_tests_exist():
    root = Path(tn.__file__).resolve().parents[1]
    for test in [*tn.DEFAULT_TESTS, *tn.QUICK_TESTS]:
        file, _, name = test.partition("::")
        assert (root / file).is_file(), file
        assert not name or f"def {name}(" in (root / file).read_text(), test


def test_what_each_stack_installs(tmp_path):
    (tmp_path / "pyproject.toml").write_text(PYPROJECT)
    pinned, others = tn.project_requirements(tmp_path / "pyproject.toml")
    assert pinned == ["torch>=2.14,<2.15", "torchrl==0.14.1", "tensordict>=0.14,<0.15"]
    assert others == ["gymnasium[mujoco]>=1.0", "envpool==1.2.5", "Torch_Foo>=1", "pytest>=8", "pytest-timeout"]
    assert tn.stack_requirements("nightly", None, pinned) == ["torchrl-nightly", "tensordict-nightly"]
    assert tn.stack_requirements("nightly", "2.15.0", pinned)[-1] == "torch==2.15.0"
    assert tn.stack_requirements("stable", "2.15.0", pinned) == ["torchrl==0.14.1", "tensordict>=0.14,<0.15",
                                                                 "torch==2.15.0"]
    with pytest.raises(ValueError, match="torch version"):
        tn.stack_requirements("stable", None, pinned)


def test_the_pip_commands_keep_our_pins_out_and_lift_a_configured_constraint():
    python = Path("/v/bin/python")
    first, second = tn.pip_commands(python, ["torchrl-nightly", "tensordict-nightly"], ["numpy", "pytest>=8"],
                                    Path("/repo"))
    # one resolve for the stack and the other requirements, then the checkout without its dependencies
    assert first == ["/v/bin/python", "-m", "pip", "install", "torchrl-nightly", "tensordict-nightly", "numpy",
                     "pytest>=8"]
    assert second == ["/v/bin/python", "-m", "pip", "install", "--no-deps", "-e", "/repo"]
    assert tn.PIP_ENV == {"PIP_CONSTRAINT": os.devnull}


def test_a_test_file_runs_in_its_own_pytest_and_each_case_is_counted(tmp_path):
    test = tmp_path / "test_sample.py"
    test.write_text(textwrap.dedent("""
        import pytest

        def test_ok():
            pass

        def test_bad():
            raise ValueError("boom")

        @pytest.mark.skip(reason="not here")
        def test_skipped():
            pass
    """))
    files, failures, reruns = tn.run_tests(Path(sys.executable), ["test_sample.py::test_ok", "test_sample.py::test_bad",
                                                                  "test_sample.py::test_skipped"], tmp_path / "runs",
                                           120, root=tmp_path)
    assert list(files) == ["test_sample.py"]
    assert {k: files["test_sample.py"][k] for k in ("passed", "failed", "skipped", "crashed")} == {
        "passed": 1, "failed": 1, "skipped": 1, "crashed": None}
    [(case, error)] = failures.items()
    assert case == "test_sample.py::test_bad" and "ValueError: boom" in error
    assert reruns == {case: "failed"}  # run once more, alone: it fails again


def test_a_case_that_passes_when_run_again_is_told_apart(tmp_path):
    test = tmp_path / "test_flaky.py"
    marker = tmp_path / "ran_once"
    test.write_text(textwrap.dedent(f"""
        from pathlib import Path

        def test_flaky():
            marker = Path({str(marker)!r})
            first = not marker.exists()
            marker.touch()
            assert not first, "a timing bound missed once"
    """))
    files, failures, reruns = tn.run_tests(Path(sys.executable), [test.name], tmp_path / "runs", 120, root=tmp_path)
    assert files[test.name]["failed"] == 1 and reruns == {"test_flaky.py::test_flaky": "passed"}
    entry = {"install": {"error": None}, "extension": {"loaded": True}, "tests": files, "failures": failures,
             "reruns": reruns}
    assert tn.passes(entry) and not tn.passes(entry | {"reruns": {}})
    marker.unlink()
    _, _, no_rerun = tn.run_tests(Path(sys.executable), [test.name], tmp_path / "runs2", 120, rerun=False,
                                  root=tmp_path)
    assert no_rerun == {}


def test_the_reference_conformance_run_is_the_latest_full_run_of_ours_on_the_same_files(tmp_path):
    def write(name, date, files=("test/test_collectors.py",), **extra):
        outcomes = {f"{file}::test_c": name for file in files}
        (tmp_path / name).write_text(json.dumps({"date": date, "ours": {"passed": 1}, "selection": {"only": None},
                                                 "outcomes": {"ours": outcomes}} | extra))

    collectors = ["test/test_collectors.py"]
    assert tn.reference_conformance(collectors, tmp_path) == (None, {})
    write("a.json", "2026-01-01")
    write("b.json", "2026-01-03", repeats={"runs": 3})
    write("c.json", "2026-01-04", selection={"only": "x"})
    write("d.json", "2026-01-02")
    write("e.json", "2026-01-05", files=("test/test_distributed.py",))  # another file's tests only
    assert tn.reference_conformance(collectors, tmp_path) == ("d.json", {"test/test_collectors.py::test_c": "d.json"})
    write("f.json", "2026-01-06", files=("test/test_collectors.py", "test/test_distributed.py"))
    assert tn.reference_conformance(collectors, tmp_path)[0] == "f.json"
    assert tn.reference_conformance(["test/test_distributed.py"], tmp_path)[0] == "f.json"


RUN = {
    "benchmark": "torchrl_nightly", "date": "2026-01-02", "_file": "nightly/n.json", "machine": "2-core CPU",
    "command": "python benchmarks/torchrl_nightly.py --rl-root /src/rl --out /tmp/n.json",
    "rl": {"commit": "ae9719f17b15", "date": "2026-08-22"},
    "stacks": {
        "nightly": {
            "versions": {"torch": "2.15.0", "torchrl": "2026.10.27", "tensordict": "2026.10.26"},
            "install": {"error": None}, "extension": {"loaded": True},
            "tests": {"tests/test_a.py": {"passed": 5, "failed": 1, "skipped": 0, "crashed": None},
                      "tests/test_b.py": {"passed": 2, "failed": 0, "skipped": 1, "crashed": None}},
            "failures": {"tests/test_a.py::test_x": "AssertionError: assert 1 == 2"},
            "reruns": {"tests/test_a.py::test_x": "failed"},
            "conformance": {"commit": "ae9719f17b15", "ours": {"passed": 100, "failed": 7, "skipped": 34,
                                                              "crashed": []},
                            "reference": "ours_2026-12-06.json",
                            "pass_reference_not_here": ["test/test_collectors.py::TestX::test_y[a]"],
                            "first_errors": {"test/test_collectors.py::TestX::test_y[a]": "KeyError: `k`"}}},
        "stable": {
            "versions": {"torch": "2.15.0", "torchrl": "0.14.1", "tensordict": "0.14.3"},
            "install": {"error": None},
            "extension": {"loaded": False, "error": "ImportError: undefined symbol: _ZN3c10"},
            "tests": {"tests/test_a.py": {"passed": 0, "failed": 2, "skipped": 0, "crashed": None}},
            "failures": {}},
    },
}


def test_the_install_page_section_says_what_passes():
    text = tn.rst([RUN])
    assert text.startswith(".. list-table::")
    rows = {}
    for block in text.split("   * - ")[1:]:
        cells = [cell.strip() for cell in block.split("\n     - ")]
        rows[cells[0]] = cells[1:]
    assert rows["stack"][0].startswith("``torchrl-nightly``") and rows["stack"][1].startswith("this package's pins")
    assert rows["resolved"] == ["torch 2.15.0, torchrl 2026.10.27, tensordict 2026.10.26",
                                "torch 2.15.0, torchrl 0.14.1, tensordict 0.14.3"]
    verdict = rows["install, C++ extension, our tests"]
    assert verdict[0] == "**fails**"  # a case failed, and failed again
    assert verdict[1] == "C++ extension fails: ImportError: undefined symbol: _ZN3c10"
    assert rows["``tests/test_a.py``"] == ["5 passed, 1 failed, 0 skipped", "0 passed, 2 failed, 0 skipped"]
    assert rows["``tests/test_b.py``"] == ["2 passed, 0 failed, 1 skipped", "not run"]
    assert rows["TorchRL's collector tests, our class"][0] == "100 passed, 7 failed, 34 skipped"
    assert "* nightly: ``tests/test_a.py::test_x``: AssertionError: assert 1 == 2 (failed again)" in text
    assert "``ae9719f17``, committed 2026-08-22; 0 crashed" in text
    assert "1 case that passed there fails on the nightly:" in text
    assert "* ``TestX::test_y[a]``: KeyError: 'k'" in text  # no reST markup from an error
    assert ("* ``python benchmarks/torchrl_nightly.py --rl-root <pytorch/rl checkout> --out "
            "benchmarks/results/nightly/n.json``; measured 2026-01-02 on a 2-core CPU.") in text
    passing = json.loads(json.dumps(RUN))
    passing["stacks"]["nightly"]["reruns"]["tests/test_a.py::test_x"] = "passed"
    text = tn.rst([RUN, passing])
    assert "**passes** (1 failed case passed when run again)" in text and "(passed when run again)" in text
    assert "**passes**" not in tn.rst([passing, RUN])
    assert tn.rst([]).startswith("**not yet measured**")


def test_each_stack_comes_from_the_latest_file_that_ran_it():
    stable = {"benchmark": "torchrl_nightly", "date": "2026-01-03", "_file": "nightly/s.json", "machine": "2-core CPU",
              "command": "python benchmarks/torchrl_nightly.py --stacks stable --stable-torch 2.15.0 --venv /tmp/v "
                         "--out /tmp/s.json",
              "stacks": {"stable": {"versions": {"torch": "2.15.0", "torchrl": "0.14.1", "tensordict": "0.14.3"},
                                    "install": {"error": None}, "extension": {"loaded": True}, "failures": {},
                                    "tests": {"tests/test_a.py": {"passed": 6, "failed": 0, "skipped": 0,
                                                                  "crashed": None}}}}}
    text = tn.rst([RUN, stable])
    assert "2026.10.27" in text and "5 passed, 1 failed, 0 skipped" in text  # the nightly from the first file
    assert "C++ extension fails" not in text and "6 passed, 0 failed, 0 skipped" in text  # the stable from the second
    assert "2026-01-02, ``nightly/n.json``" in text and "2026-01-03, ``nightly/s.json``" in text
    assert ("* ``python benchmarks/torchrl_nightly.py --stacks stable --stable-torch 2.15.0 --out "
            "benchmarks/results/nightly/s.json``") in text and "/tmp/" not in text


def test_the_printed_line_has_each_stacks_verdict():
    line = tn.summary(RUN | {"wall_seconds": 9.0})
    assert line["stacks"]["nightly"]["tests"] == {"tests/test_a.py": [5, 1, 0], "tests/test_b.py": [2, 0, 1]}
    assert not line["stacks"]["nightly"]["passes"] and not line["stacks"]["stable"]["extension"]
    assert line["stacks"]["nightly"]["conformance_pass_reference_not_here"] == [
        "test/test_collectors.py::TestX::test_y[a]"]
    json.dumps(line)


def test_the_scripts_examples_hold():
    import doctest

    assert doctest.testmod(tn, optionflags=doctest.NORMALIZE_WHITESPACE).failed == 0


def test_main_writes_the_file_the_report_renders(tmp_path, monkeypatch, capsys):
    import report

    def run_stack(stack, requirements, others, venv, workdir, tests, args):  # what an install and a run give
        torchrl = "2026.10.27" if stack == "nightly" else "0.14.1"
        return {"requirements": requirements, "install": {"error": None, "freeze": [], "pip_check": []},
                "versions": {"torch": "2.15.0+cu132", "torchrl": torchrl, "tensordict": "0.14.3"},
                "extension": {"loaded": True, "error": None}, "failures": {}, "reruns": {},
                "tests": {test: {"passed": 4, "failed": 0, "skipped": 1, "seconds": 1.0, "crashed": None}
                          for test in tests}}

    monkeypatch.setattr(tn, "run_stack", run_stack)
    out = tmp_path / "nightly" / "n.json"
    assert tn.main(["--out", str(out)]) == 0
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert line["stacks"]["nightly"]["passes"] and line["stacks"]["stable"]["versions"]["torchrl"] == "0.14.1"
    data = json.loads(out.read_text())
    assert data["stacks"]["stable"]["requirements"][-1] == "torch==2.15.0"  # the torch the nightly resolved
    assert data["torch"] == "2.15.0+cu132" and data["unilab"]["commit"]
    text = report.DOCS_TABLES["nightly.rst"](report.load(tmp_path))
    assert text.count("**passes**") == 2 and "torch 2.15.0+cu132, torchrl 0.14.1" in text
    assert "``python benchmarks/torchrl_nightly.py --out benchmarks/results/nightly/n.json``" in text
