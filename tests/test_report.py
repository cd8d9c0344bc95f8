"""The tables of README and the docs are generated from ``benchmarks/results/`` and are current.

``benchmarks/report.py`` writes README's headline table and the docs' result tables
from the results files. These tests regenerate them in memory and compare with the
files on disk, so a figure changed in a results file but not regenerated (or a
generated table edited by hand) fails here. Run ``python benchmarks/report.py`` to fix.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def load_report():
    spec = importlib.util.spec_from_file_location("report", ROOT / "benchmarks" / "report.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


report = load_report()


def test_generated_tables_are_current():
    stale = [str(p.relative_to(ROOT)) for p in report.stale()]
    assert not stale, f"stale against benchmarks/results/: {stale}; run python benchmarks/report.py"


def test_every_generated_docs_file_is_included_by_a_page():
    pages = "\n".join(p.read_text() for p in (ROOT / "docs").rglob("*.rst") if "generated" not in p.parts)
    unused = [name for name in report.DOCS_TABLES if name != "figures.rst" and f"generated/{name}" not in pages]
    assert not unused, f"generated tables no docs page includes: {unused}"


@pytest.fixture
def results_copy(tmp_path) -> Path:
    copy = tmp_path / "results"
    shutil.copytree(report.RESULTS, copy)
    return copy


def test_a_changed_figure_makes_its_tables_stale(results_copy):
    path = results_copy / "ray" / "ray_scaling.json"
    data = json.loads(path.read_text())
    data["by_frames_per_batch"]["512"]["ray_over_local"] = 0.93
    path.write_text(json.dumps(data))
    stale = {p.name for p in report.stale(results_copy)}
    assert stale == {"README.md", "ray.rst"}
    assert "**0.93** at 512 frames per batch" in report.outputs(results_copy)[report.README]


def test_a_hand_edited_table_is_stale(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(report.README.read_text().replace("| Faults survived |", "| Faults we survived |"))
    assert readme in report.stale(readme=readme)


def test_readme_headline_table():
    text = report.README.read_text()
    block = text.split("<!-- report:headline -->")[1].split("<!-- /report:headline -->")[0]
    rows = [line for line in block.strip().splitlines()[2:] if line.startswith("|")]
    assert 1 <= len(rows) <= 8
    for row in rows:
        measure, figure, command, date = [cell.strip() for cell in row.strip("|").split(" | ")]
        assert command.startswith("`python benchmarks/"), row
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}.*", date), row
        assert re.search(r"\d", figure), row
    # the commands' placeholders, each said once under the table
    notes = block.strip().splitlines()[-1]
    for placeholder in ("<pytorch/rl checkout>", "<dir>"):
        assert placeholder in " ".join(rows) and notes.count(f"`{placeholder}`") == 1


def test_rendered_commands_run_from_a_checkout(results_copy):
    """A command recorded with paths of the machine that measured renders with paths of a checkout: its --out the
    results file itself, a learning suite's run directory ``<dir>`` (said once on the page), ``--rl-root
    <pytorch/rl checkout>``; a comparison of two builds names its sides by commit or torch, not by directory."""
    ray = json.loads((results_copy / "ray" / "ray_scaling.json").read_text())
    ray["command"] = "python benchmarks/ray_scaling.py --rounds 3 --out /work/scratch/ray.json"
    (results_copy / "ray" / "ray_scaling.json").write_text(json.dumps(ray))
    robot = json.loads((results_copy / "robot" / "learning.json").read_text())
    robot["command"] = "python benchmarks/learning.py --suite robot --out /home/me/robot --reuse"
    (results_copy / "robot" / "learning.json").write_text(json.dumps(robot))
    out = {p.name: text for p, text in report.outputs(results_copy).items()}
    assert "``python benchmarks/ray_scaling.py --rounds 3 --out benchmarks/results/ray/ray_scaling.json``" in out[
        "ray.rst"]
    assert "``python benchmarks/learning.py --suite robot --out <dir> --reuse``" in out["robot_learning.rst"]
    assert out["robot_learning.rst"].count("``<dir>`` in a command") == 1
    ab = out["collector_spec_core.rst"]
    assert "--a python@<checkout at 84f3456> --b python@<checkout at fc20456>" in ab and "/tmp/" not in ab
    for name, text in out.items():
        assert not re.search(r"(?<![\w.<-])/(?:work|tmp|home|root)/", text), name


def test_figures_typed_in_by_hand_are_not_rendered(results_copy):
    """A results file whose ``source`` says its figures were typed in stays in the results, and its tables read
    'not yet measured' with the command that measures them; the same file written by the benchmark renders."""
    out = {p.name: text for p, text in report.outputs(results_copy).items()}
    typed = json.loads((results_copy / "learning" / "learner_throughput.json").read_text())
    assert typed["source"].startswith("typed in") and "learning/learner_throughput.json" not in report.load(
        results_copy)
    assert report.NOT_MEASURED in out["learner.rst"] and "--profile --e2e-rounds 2" in out["learner.rst"]
    for name in ("sac_vs_sb3.rst", "td3_vs_sb3.rst", "td3_seeds.rst"):
        assert report.NOT_MEASURED in out[name]
    assert "2.13" not in out["sota_dropin.rst"]  # the typed run's provenance left out; its scripts' rows came later
    del typed["source"]
    (results_copy / "learning" / "learner_throughput.json").write_text(json.dumps(typed))
    learner = report.outputs(results_copy)[report.GENERATED / "learner.rst"]
    assert report.NOT_MEASURED not in learner and "``recipe_ups_1t`` / ``_2t``" in learner


def test_topics_not_measured_yet_say_so(results_copy):
    shutil.rmtree(results_copy / "conformance", ignore_errors=True)
    shutil.rmtree(results_copy / "gpu", ignore_errors=True)
    out = {p.name: text for p, text in report.outputs(results_copy).items()}
    assert report.NOT_MEASURED in out["conformance.rst"] and report.NOT_MEASURED in out["gpu.rst"]

    (results_copy / "conformance").mkdir()
    (results_copy / "conformance" / "ours.json").write_text(json.dumps({
        "date": "2026-12-05", "commit": "ae9719f17b15", "torchrl": "0.14.1",
        "stock": {"passed": 90, "failed": 0, "skipped": 53, "crashed": []},
        "ours": {"passed": 88, "failed": 2, "skipped": 53, "crashed": []},
        "pass_stock_not_ours": ["a", "b"]}))
    table = report.outputs(results_copy)[report.GENERATED / "conformance.rst"]
    assert report.NOT_MEASURED not in table
    assert "     - 88\n     - 2\n     - 53\n     - 0\n     - 2\n" in table
    # a --repeat run of one case is not a row of the table: it says how often each side passed that case
    (results_copy / "conformance" / "repeat.json").write_text(json.dumps({
        "date": "2026-12-06T19:00:00+00:00", "commit": "ae9719f17b15", "torchrl": "0.14.1",
        "stock": {"passed": 2, "failed": 0, "skipped": 0, "crashed": []},
        "ours": {"passed": 2, "failed": 0, "skipped": 0, "crashed": []}, "pass_stock_not_ours": [],
        "repeats": {"runs": 10, "passed": {"stock": {"a": 9}, "ours": {"a": 10}}}}))
    repeated = report.outputs(results_copy)[report.GENERATED / "conformance.rst"]
    assert repeated.count("     - 88\n") == 1 and repeated.count("   * - ") == table.count("   * - ")
    assert ("* ``a``. Run 10 times on each side, alternating (2026-12-06): TorchRL's class passed it 9 times, ours 10\n"
            in repeated) and "* ``b``\n" in repeated
    # a run of another test file has a table of its own after it, with each test function's passes per side
    case = "test/test_distributed.py::TestRPCCollector::test_distributed_collector_updatepolicy"
    (results_copy / "conformance" / "distributed.json").write_text(json.dumps({
        "date": "2026-12-07T10:00:00+00:00", "commit": "ae9719f17b15", "torchrl": "0.14.1",
        "selection": {"files": {"test/test_distributed.py": {"functions": 1, "cases": 2}}},
        "stock": {"passed": 2, "failed": 0, "skipped": 0, "crashed": []},
        "ours": {"passed": 1, "failed": 1, "skipped": 0, "crashed": []}, "pass_stock_not_ours": [f"{case}[x]"],
        "outcomes": {"stock": {f"{case}[x]": "passed", f"{case}[y]": "passed"},
                     "ours": {f"{case}[x]": "failed", f"{case}[y]": "passed"}}}))
    both = report.outputs(results_copy)[report.GENERATED / "conformance.rst"]
    assert both.startswith(repeated) and "The tests of ``test/test_distributed.py`` that take the class" in both
    assert "``TestRPCCollector::test_distributed_collector_updatepolicy``\n     - 2 of 2\n     - 1 of 2\n" in both
    assert "* ``TestRPCCollector::test_distributed_collector_updatepolicy[x]``\n" in both


def test_gpu_results_fill_the_gpu_table(results_copy):
    (results_copy / "gpu").mkdir(exist_ok=True)
    (results_copy / "gpu" / "h100.json").write_text(json.dumps({
        "benchmark": "gpu_check", "date": "2026-12-05T10:00:00+00:00", "device": "cuda", "quick": False,
        "learner": {"eager_ups": 812.5, "gpu": "NVIDIA H100"}}))
    (results_copy / "gpu" / "dry_run.json").write_text(
        json.dumps({"benchmark": "gpu_check", "quick": True, "date": "2026-12-05", "learner": {"eager_ups": 1.0}})
    )
    table = report.outputs(results_copy)[report.GENERATED / "gpu.rst"]
    assert report.NOT_MEASURED not in table
    assert "``learner.eager_ups``\n     - 812.5" in table and "1.0" not in table and "h100.json" in table


def test_the_wallclock_plot_shows_the_finalists_and_the_old_defaults_until_they_are_run(results_copy):
    screen = json.loads((results_copy / "learning" / "wallclock_screen.json").read_text())
    final = {
        **screen,
        "command": "python benchmarks/learning.py --suite wallclock --seeds 0 1 2 3 4",
        "configs": {
            "defaults": {
                **screen["configs"]["defaults"],
                "seeds": 5,
                "interval_by_minute": [[1.0, 2.0]] * len(screen["configs"]["defaults"]["minute"]),
            }
        },
    }
    (results_copy / "learning" / "wallclock.json").write_text(json.dumps(final))
    (results_copy / "learning" / "wallclock_anchor.json").unlink(missing_ok=True)  # TorchRL's sac.py: its own test
    res = report.load(results_copy)
    curves = report.wallclock_curves(res)
    # the finalists with their band, and of the screens only one update per frame (utd1) and CrossQ, marked as one
    # seed
    assert list(curves) == ["defaults", "utd1, screening", "crossq256, screening"]
    assert curves["defaults"][0]["low"] == 1.0 and curves["utd1, screening"][0]["low"] is None
    tables = report.outputs(results_copy)[report.GENERATED / "wallclock.rst"]
    assert tables.index("**Finalists**") < tables.index("**Screening**")
    assert "``--config-name sac_utd1``" in tables and "wallclock_screen.json" in tables
    # a second screen, made on another machine with its own run of the defaults: its own table, after the first,
    # without SB3's targets (no SB3 run on its machine); its defaults are not drawn over the finalists' curve
    second = tables[tables.index("**Screening: batch size"):tables.index("**Screening: CrossQ")]
    assert tables.index("**Screening**") < tables.index("**Screening: batch size")
    assert "wallclock_screen_batch.json" in second and "``batch1024_lr6e-4``" in second and "SB3's SAC" not in second
    assert "defaults, screening" not in curves

    final["configs"]["utd1"] = screen["configs"]["utd1"]  # measured among the finalists: the screen's is not shown
    (results_copy / "learning" / "wallclock.json").write_text(json.dumps(final))
    assert list(report.wallclock_curves(report.load(results_copy))) == ["defaults", "utd1", "crossq256, screening"]


def test_the_td3_side_of_the_wallclock_suite_gets_its_own_table_and_plot_curves(results_copy):
    screen = json.loads((results_copy / "learning" / "wallclock_screen.json").read_text())
    td3 = {**screen, "algo": "td3", "configs": {label: screen["configs"][label] for label in ("defaults", "utd1")}}
    (results_copy / "learning" / "wallclock_td3_screen.json").write_text(json.dumps(td3))
    res = report.load(results_copy)
    # TD3's finalists with their band and the screen's old defaults; each plot draws its own algorithm's files
    td3_curves, sac_curves = report.wallclock_curves(res, "td3"), report.wallclock_curves(res)
    assert list(td3_curves) == ["defaults", "utd1, screening"]
    for curves, final in ((td3_curves, "wallclock_td3.json"), (sac_curves, "wallclock.json")):
        assert curves["defaults"][0]["mean"] == res[f"learning/{final}"]["configs"]["defaults"]["mean_by_minute"][0]
    assert td3_curves["defaults"][0]["mean"] != sac_curves["defaults"][0]["mean"]
    # without the finalists, every screened configuration is drawn
    del res["learning/wallclock_td3.json"]
    assert list(report.wallclock_curves(res, "td3", None)) == ["defaults, screening", "utd1, screening"]
    tables = report.outputs(results_copy)
    td3_table = tables[report.GENERATED / "wallclock_td3.rst"]
    assert "SB3's TD3" in td3_table and "SB3's SAC" not in td3_table and report.NOT_MEASURED not in td3_table
    assert "SB3's TD3" not in tables[report.GENERATED / "wallclock.rst"]
    # README's headline reports each recipe's finalists against its own SB3 reference
    rows = {row[0]: row[1] for row in report.headline_rows(report.load(results_copy))}
    assert "TD3: wall-clock to SB3's 100k return" in rows and "SAC: wall-clock to SB3's 100k return" in rows


def test_the_sac_wallclock_suite_states_torchrl_sac_py_beside_sb3(results_copy):
    screen = json.loads((results_copy / "learning" / "wallclock_screen.json").read_text())
    script = "sota-implementations/sac/sac.py"
    side = {**screen["configs"]["defaults"], "overrides": None, "seeds": 5,
            "targets": {**screen["configs"]["defaults"]["targets"], "minute_reached": None, "time_share": None}}
    command = "python benchmarks/learning.py --suite wallclock --algo torchrl_sac"
    anchor = {**screen, "algo": "torchrl_sac", "sb3_algo": "sac", "sb3_runs": {}, "note": None,
              "configs": {script: side}, "command": command}
    (results_copy / "learning" / "wallclock_anchor.json").write_text(json.dumps(anchor))
    res = report.load(results_copy)
    # its own table, after the recipe's, against SB3's SAC
    tables = report.outputs(results_copy)[report.GENERATED / "wallclock.rst"]
    table = tables[tables.index("**TorchRL's own"):]
    assert tables.index("**Finalists**") < tables.index("**TorchRL's own") and f"``{script}``" in table
    assert "SB3's SAC: mean return" in table and "TORCHRL" not in tables
    # its mean curve beside the recipe's, with its band
    curves = report.wallclock_curves(res)
    assert list(curves)[-1] == "TorchRL's sac.py" and curves["TorchRL's sac.py"][0]["mean"] == side["mean_by_minute"][0]
    # README's row: the recipe's minutes against SB3's and against the script's, which did not reach SB3's return
    rows = {row[0]: row for row in report.headline_rows(res)}
    _, figure, command, date = rows["SAC: wall-clock to SB3's 100k return"]
    budget = side["minute"][-1]
    ours = res["learning/wallclock.json"]["configs"]["defaults"]["targets"]["minute_reached"]
    assert f"TorchRL's sac.py does not reach it in {budget} min (5 seeds): **< {ours / budget:.2f}**" in figure
    assert command.endswith("; " + anchor["command"] + " --rl-root <pytorch/rl checkout>")  # a rerun needs it
    assert date.endswith(f"TorchRL's {anchor['date']}")
    # once it reaches SB3's return, the ratio of the two minutes
    side["targets"]["minute_reached"] = 2 * ours
    (results_copy / "learning" / "wallclock_anchor.json").write_text(json.dumps(anchor))
    figure = {row[0]: row[1] for row in report.headline_rows(report.load(results_copy))}[
        "SAC: wall-clock to SB3's 100k return"]
    assert f"**0.50** of TorchRL's sac.py's wall-clock ({ours} against {2 * ours} min, 5 seeds)" in figure
