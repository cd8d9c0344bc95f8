"""``benchmarks/torchrl_conformance.py``'s own logic, without a pytorch/rl checkout.

The benchmark runs TorchRL's ``test/test_collectors.py`` and the collector tests of
``test/test_distributed.py`` for an hour; these tests run its parts on small stand-ins
written here: the selection of tests and cases, the extraction from a git repository
(work tree and bare), the plugin's rebinding (in the pytest process, in a script a test
runs and in a process a test spawns), and a hung and a crashed pytest process.
"""

from __future__ import annotations

import subprocess
import textwrap
from pathlib import Path

import torchrl_conformance as tc  # noqa: E402

SYNTHETIC = '''
import functools
import pytest
from torchrl.collectors import Collector, MultiAsyncCollector, MultiSyncCollector


def helper():
    return MultiAsyncCollector


@pytest.mark.parametrize("cls", [functools.partial(MultiSyncCollector, cat_results="stack"), MultiAsyncCollector,
                                 Collector])
def test_by_decorator(cls):
    pass


def test_by_body():
    MultiAsyncCollector(create_env_fn=[])


@pytest.mark.parametrize("name", ["MultiSyncCollector", "MultiAsyncCollector"])
def test_by_string(name):
    pass


def test_other():
    """MultiAsyncCollector, named in a docstring only."""
    helper()


class TestGroup:
    def test_method(self):
        from torchrl.collectors import MultiAsyncCollector as MAC
        return MAC

    def test_unrelated(self):
        pass


@pytest.mark.parametrize("cls", [MultiAsyncCollector, MultiSyncCollector])
class TestWhole:
    def test_a(self, cls):
        pass


class Base:
    @pytest.mark.parametrize("collector_class", [MultiAsyncCollector, Collector])
    def test_inherited(self, collector_class):
        pass

    @pytest.mark.parametrize("collector_class", [MultiAsyncCollector])
    def test_overridden(self, collector_class):
        pass

    def test_unrelated_inherited(self):
        pass


class TestDerived(Base):
    def test_overridden(self):
        pass


class TestDerivedAgain(TestDerived):
    pass
'''


def test_selects_the_tests_that_name_the_class_and_where_it_comes_from():
    # test methods a Test class inherits from this module's classes count, under their own overrides
    assert tc.select_tests(SYNTHETIC) == {
        "test_by_decorator": "function", "test_by_body": "function", "test_by_string": "function",
        "TestGroup::test_method": "function", "TestWhole::test_a": "class decorator",
        "TestDerived::test_inherited": "function", "TestDerivedAgain::test_inherited": "function"}
    rebind, bound = tc.rebind_targets(SYNTHETIC)
    assert rebind == ["torchrl.collectors:MultiAsyncCollector"]
    assert bound == ["MultiAsyncCollector"]  # MAC is bound inside a function: nothing to check at module level


def test_multisync_variants_are_left_out_and_our_ids_read_as_torchrls():
    import functools

    from torchrl.collectors import Collector, MultiAsyncCollector, MultiSyncCollector

    assert tc.is_left_out({"a": 1, "cls": functools.partial(MultiSyncCollector, cat_results="stack")})
    assert tc.is_left_out({"cls": (MultiSyncCollector, 2)}) and tc.is_left_out({"name": "MultiSyncCollector"})
    assert not tc.is_left_out({"cls": MultiAsyncCollector}) and not tc.is_left_out({"cls": Collector})
    assert not tc.is_left_out({"name": "MultiSyncCollector is a string with more"})
    assert tc.canonical_nodeid("t.py::TestOffPolicyCollector::test[OffPolicyCollector-x]") == \
        "t.py::TestOffPolicyCollector::test[MultiAsyncCollector-x]"  # only the parametrization id


def test_counts_and_comparison_of_outcomes():
    events = [
        {"event": "start", "nodeid": "t[OffPolicyCollector]"},
        {"event": "report", "nodeid": "t[OffPolicyCollector]", "when": "setup", "outcome": "passed", "error": None},
        {"event": "report", "nodeid": "t[OffPolicyCollector]", "when": "call", "outcome": "failed", "error": "E: x"},
        {"event": "report", "nodeid": "t[OffPolicyCollector]", "when": "teardown", "outcome": "passed",
         "error": None},
        {"event": "report", "nodeid": "s", "when": "setup", "outcome": "skipped", "error": "no cuda"},
        {"event": "report", "nodeid": "s", "when": "teardown", "outcome": "passed", "error": None},
    ]
    outcomes, errors = tc.outcomes_from_events(events, ["t[MultiAsyncCollector]", "s", "never"], None)
    assert outcomes == {"t[MultiAsyncCollector]": "failed", "s": "skipped", "never": "failed"}
    assert errors == {"t[MultiAsyncCollector]": "E: x", "s": "no cuda", "never": "not run: no outcome reported"}
    assert tc.counts(outcomes) == {"passed": 0, "failed": 2, "skipped": 1}
    # A failed comparison keeps pytest's explanation of what differs; another error only its exception line.
    assert tc._first_error("AssertionError: assert {'a', 'b'} == {'a'}\n  \n  Extra items in the left set:\n"
                           "  'b'\n  Full diff:\n  more") == \
        "AssertionError: assert {'a', 'b'} == {'a'} | Extra items in the left set: | 'b'"
    assert tc._first_error("KeyError: 'traj_pool'\nnot shown") == "KeyError: 'traj_pool'"
    assert tc.compare({"t[MultiAsyncCollector]": "passed", "s": "skipped"}, outcomes) == (
        ["t[MultiAsyncCollector]"], [])


def _git(*args: str, cwd: Path | None = None) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=cwd, check=True,
                          capture_output=True, text=True).stdout.strip()


def test_takes_the_test_file_what_it_imports_and_pytest_ini_from_a_work_tree_or_a_bare_repository(tmp_path):
    tree = tmp_path / "rl"
    (tree / "test" / "pkg").mkdir(parents=True)
    files = {
        "pytest.ini": "[pytest]\nmarkers =\n    slow\n",
        "test/test_collectors.py": "import os\nfrom mocks import Env\nimport pkg\n",
        "test/test_distributed.py": "from dist_mocks import Env\n",
        "test/dist_mocks.py": "",
        "test/conftest.py": "import pytest\n",
        "test/mocks.py": "from _deeper import X\n",
        "test/_deeper.py": "X = 1\n",
        "test/pkg/__init__.py": "",
        "test/test_unrelated.py": "",
        "torchrl/__init__.py": "",
    }
    for path, text in files.items():
        (tree / path).parent.mkdir(parents=True, exist_ok=True)
        (tree / path).write_text(text)
    _git("init", "-q", str(tree))
    _git("add", ".", cwd=tree)
    _git("commit", "-q", "-m", "stand-in", cwd=tree)
    commit = _git("rev-parse", "HEAD", cwd=tree)
    _git("clone", "-q", "--bare", str(tree), str(tmp_path / "rl.git"))
    for i, source in enumerate([tree, tmp_path / "rl.git"]):
        work = tmp_path / f"work{i}"
        work.mkdir()
        root, got = tc.open_tests(source, work)
        assert got == commit
        taken = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
        assert taken == ["pytest.ini", "test/_deeper.py", "test/conftest.py", "test/dist_mocks.py", "test/mocks.py",
                         "test/pkg/__init__.py", "test/test_collectors.py", "test/test_distributed.py"], source
    try:
        tc.open_tests(tmp_path / "work0", tmp_path / "work9")
    except ValueError as err:
        assert "--rl-root must be a pytorch/rl work tree" in str(err)
    else:
        raise AssertionError("a folder without test/test_collectors.py was accepted")


def _checkout(tmp_path: Path, test_file: str) -> Path:
    root = tmp_path / "rl"
    (root / "test").mkdir(parents=True)
    (root / "test" / "test_collectors.py").write_text(textwrap.dedent(test_file))
    (root / "pytest.ini").write_text("[pytest]\naddopts = -ra --tb=native\nxfail_strict = True\n")
    return root


def test_the_plugin_rebinds_the_class_in_the_test_module_and_in_the_scripts_it_runs(tmp_path):
    root = _checkout(tmp_path, '''
        import functools, subprocess, sys
        import pytest
        import torchrl.collectors
        from torchrl.collectors import MultiAsyncCollector, MultiSyncCollector
        from torchrl_unilab import OffPolicyCollector

        @pytest.mark.parametrize("cls", [MultiAsyncCollector, MultiSyncCollector, "MultiSyncCollector",
                                         functools.partial(MultiSyncCollector, cat_results="stack")])
        def test_rebound(cls):
            assert cls is MultiAsyncCollector is torchrl.collectors.MultiAsyncCollector is OffPolicyCollector

        def test_in_a_script():
            code = "from torchrl.collectors import MultiAsyncCollector as M; print(M.__module__, M.__name__)"
            out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
            assert out.split() == ["torchrl_unilab.collectors.offpolicy_collector", "OffPolicyCollector"]

        def test_fails():
            assert 1 == 2, "the first error line"
    ''')
    source = (root / tc.TEST_FILE).read_text()
    rebind, verify = tc.rebind_targets(source)
    events, crash, _, _ = tc.run_pytest(root, [tc.TEST_FILE], "ours", tmp_path / "run", 240, rebind=rebind,
                                        verify=verify)
    assert crash is None
    collected = next(e for e in events if e["event"] == "collected")
    assert [n.split("::")[1] for n in collected["kept"]] == [
        "test_rebound[OffPolicyCollector]", "test_in_a_script", "test_fails"]
    assert len(collected["dropped"]) == 3
    assert [(e["name"], e["ours"]) for e in events if e["event"] == "bound"] == [("MultiAsyncCollector", True)]
    outcomes, errors = tc.outcomes_from_events(events, [], crash)
    assert outcomes == {"test/test_collectors.py::test_rebound[MultiAsyncCollector]": "passed",
                        "test/test_collectors.py::test_in_a_script": "passed",
                        "test/test_collectors.py::test_fails": "failed"}, errors
    assert errors["test/test_collectors.py::test_fails"].startswith("AssertionError: the first error line")


def test_the_distributed_tests_run_beside_and_a_process_a_test_spawns_sees_the_class_its_test_module_holds(
        tmp_path, capsys):
    """As ``test_distributed.py``'s bodies do, the test runs in a spawned process that imports the test module
    again and compares the class it was given with the module's ``MultiAsyncCollector``."""
    import json

    root = _checkout(tmp_path, """
        from torchrl.collectors import MultiAsyncCollector

        def test_in_collectors():
            assert MultiAsyncCollector is not None
    """)
    (root / "test" / "test_distributed.py").write_text(textwrap.dedent("""
        import pytest
        from torch import multiprocessing as mp
        from torchrl.collectors import Collector, MultiAsyncCollector, MultiSyncCollector

        class Base:
            @classmethod
            def _body(cls, queue, collector_class):
                queue.put((collector_class is MultiAsyncCollector, MultiAsyncCollector.__name__))

            @pytest.mark.parametrize("collector_class", [MultiSyncCollector, MultiAsyncCollector, Collector])
            def test_distributed_collector_class(self, collector_class):
                queue = mp.get_context("spawn").Queue(1)
                proc = mp.get_context("spawn").Process(target=self._body, args=(queue, collector_class))
                proc.start()
                same, name = queue.get(timeout=120)
                proc.join(30)
                assert same == (collector_class is MultiAsyncCollector), (collector_class, name)

        class TestNode(Base):
            pass
    """))
    assert tc.main(["--rl-root", str(root), "--side", "both", "--out", str(tmp_path / "out.json")]) == 0
    saved = json.loads((tmp_path / "out.json").read_text())
    node = "test/test_distributed.py::TestNode::test_distributed_collector_class"
    assert saved["selection"]["files"] == {"test/test_collectors.py": {"functions": 1, "cases": 1},
                                           "test/test_distributed.py": {"functions": 1, "cases": 2}}
    assert saved["selection"]["multisync_cases_left_out"] == 1
    expected = {"test/test_collectors.py::test_in_collectors": "passed", f"{node}[MultiAsyncCollector]": "passed",
                f"{node}[Collector]": "passed"}
    assert saved["outcomes"] == {"stock": expected, "ours": expected}, saved["errors"]


def test_a_hung_function_is_killed_with_its_group_and_a_crash_is_blamed_on_its_case(tmp_path):
    root = _checkout(tmp_path, '''
        import os, signal, subprocess, sys, time
        def test_fast():
            pass
        def test_hangs():
            child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
            open(os.environ["CHILD_PID_FILE"], "w").write(str(child.pid))
            time.sleep(600)
        def test_segfaults():
            os.kill(os.getpid(), signal.SIGSEGV)
    ''')
    pid_file = tmp_path / "child.pid"
    import os

    os.environ["CHILD_PID_FILE"] = str(pid_file)
    try:
        hung = tc.run_function(root, f"{tc.TEST_FILE}::test_hangs", "stock", [f"{tc.TEST_FILE}::test_hangs"],
                               tmp_path, 12.0)
    finally:
        del os.environ["CHILD_PID_FILE"]
    assert hung.crashed is not None and hung.crashed.startswith("hung: no exit within 12 s (in ")
    assert hung.outcomes == {f"{tc.TEST_FILE}::test_hangs": "failed"}
    stat = Path(f"/proc/{pid_file.read_text()}/stat")
    assert not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] == "Z"  # its child went with the group
    died = tc.run_function(root, f"{tc.TEST_FILE}::test_segfaults", "stock", [f"{tc.TEST_FILE}::test_segfaults"],
                           tmp_path, 60.0)
    assert died.crashed == f"died: SIGSEGV in {tc.TEST_FILE}::test_segfaults"
    assert died.errors == {f"{tc.TEST_FILE}::test_segfaults": died.crashed}


def test_saved_stock_results_of_another_checkout_are_refused(tmp_path, capsys):
    import json

    import pytest

    root = _checkout(tmp_path, "def test_a():\n    pass\n")
    saved = tmp_path / "stock.json"
    saved.write_text(json.dumps({"commit": "0" * 40, "torchrl": "0.0.1", "stock": {"crashed": []},
                                 "outcomes": {"stock": {}}}))
    with pytest.raises(SystemExit):
        tc.main(["--rl-root", str(root), "--side", "ours", "--stock-results", str(saved)])
    assert f"is of commit {'0' * 40} with torchrl 0.0.1; this run is of unknown" in capsys.readouterr().err
    saved.write_text("{}")
    with pytest.raises(SystemExit):
        tc.main(["--rl-root", str(root), "--side", "ours", "--stock-results", str(saved)])
    assert "--stock-results must be a file written by --out of a stock run" in capsys.readouterr().err


def test_a_repeated_run_counts_each_sides_passes_of_a_case_that_passes_only_sometimes(tmp_path, capsys):
    import json
    import os

    import pytest

    # the test fails on its second run only: stock, ours, stock, ours
    root = _checkout(tmp_path, """
        import os
        from pathlib import Path

        from torchrl.collectors import MultiAsyncCollector

        def test_sometimes():
            assert MultiAsyncCollector is not None  # what makes it one of the selected tests
            counter = Path(os.environ["RUN_COUNTER"])
            runs = int(counter.read_text() or 0) + 1 if counter.exists() else 1
            counter.write_text(str(runs))
            assert runs != 2, "the second run fails"
    """)
    with pytest.raises(SystemExit):
        tc.main(["--rl-root", str(root), "--repeat", "0"])
    assert "--repeat must be >= 1, got 0" in capsys.readouterr().err
    os.environ["RUN_COUNTER"] = str(tmp_path / "runs")
    try:
        tc.main(["--rl-root", str(root), "--repeat", "2", "--out", str(tmp_path / "out.json")])
    finally:
        del os.environ["RUN_COUNTER"]
    saved = json.loads((tmp_path / "out.json").read_text())
    case = f"{tc.TEST_FILE}::test_sometimes"
    assert saved["repeats"] == {"runs": 2, "passed": {"stock": {case: 2}, "ours": {case: 1}}}
    assert saved["outcomes"] == {"stock": {case: "passed"}, "ours": {case: "passed"}}  # the last run's

