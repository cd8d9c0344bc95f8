"""The benchmark scripts parse and answer ``--help``; ``learning.py``'s reuse of saved runs and its SB3 table.

The benchmarks themselves take minutes to hours and live outside the suite;
these tests keep them runnable (a merge once left ``learning.py`` unparseable,
unnoticed because nothing imported it) and check the logic that decides what
their tables say.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
import learning  # noqa: E402
import wallclock  # noqa: E402


@pytest.mark.parametrize("script", sorted(p.name for p in BENCHMARKS.glob("*.py")))
def test_every_benchmark_script_parses(script):
    ast.parse((BENCHMARKS / script).read_text(), filename=script)


def test_learning_help_lists_its_options():
    out = subprocess.run([sys.executable, str(BENCHMARKS / "learning.py"), "--help"],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    for option in ("--suite", "--seeds", "--algo", "--task", "--frames", "--reuse", "--set", "--reruns", "--minutes",
                   "--sb3-reference"):
        assert option in out


def test_the_benchmarks_examples_hold():
    import doctest

    import ab_rounds
    import common
    import dropin_speedup
    import report

    for module in (wallclock, ab_rounds, learning, common, dropin_speedup, report):
        assert doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE).failed == 0


def test_the_batch_size_sweep_gives_each_batch_size_on_one_and_two_threads():
    import learner_throughput
    import report

    out = learner_throughput.batch_size_sweep([32, 128], rows=2_000, blocks=1, block_updates=2)
    table = out["by_batch_size"]
    assert list(table) == ["32", "128"] and out["buffer_rows"] == 2_000
    for batch, row in table.items():
        for threads in ("1t", "2t"):
            # updates per second are rounded to 0.1 and rows per second to 1, each from the same unrounded rate
            assert row[f"rows_per_s_{threads}"] == pytest.approx(row[f"ups_{threads}"] * int(batch),
                                                                 abs=0.05 * int(batch) + 0.5)
        # each rate's rounding, and the gain's own (to 0.001: relatively more when two threads are slower)
        rounding = 0.05 / row["ups_1t"] + 0.05 / row["ups_2t"] + 0.0006 * row["ups_1t"] / row["ups_2t"] + 0.001
        assert row["two_threads_gain"] == pytest.approx(row["ups_2t"] / row["ups_1t"], rel=rounding)
        assert row["fraction_of_limit_1t"] > 0 and row["fraction_of_limit_2t"] > 0
        # the share is one sample's milliseconds against one update's, each measured on its own (how they compare
        # depends on the machine's load, so only the arithmetic is held here)
        assert row["sample_ms"] > 0
        assert row["sample_share_1t"] == pytest.approx(row["sample_ms"] * row["ups_1t"] / 1e3,
                                                       rel=0.05 / row["ups_1t"] + 1e-3, abs=1e-3)
    shown = report.learner_batch_table({"learning/batch.json": {**out, "_file": "learning/batch.json"}})
    assert f"{table['128']['ups_1t']} / {table['128']['ups_2t']}" in shown and "2,000 rows" in shown


def test_sampling_measures_the_buffer_and_batch_it_is_given():
    out = subprocess.run([sys.executable, str(BENCHMARKS / "sampling.py"), "--rows", "3000", "--batch-size", "64",
                          "--blocks", "1", "--block-samples", "2"], capture_output=True, text=True, timeout=300,
                         check=True).stdout
    figures = json.loads(out.strip().splitlines()[-1])
    assert (figures["rows"], figures["batch_size"]) == (3000, 64)
    assert figures["buffer_sampler_ms"] > 0 and figures["buffer_sampler_over_gather"] > 0


def test_the_wallclock_report_reads_each_run_at_whole_minutes_against_sb3(tmp_path):
    # seed s of "fast" returns 1000 * minute + s from its snapshots; "slow" half of that; SB3: 3000 at 100k, 20 min
    def snapshots(scale: float, seed: int) -> list[dict]:
        return [{"elapsed_s": 60.0 * m + 0.5, "frames": 1000 * m, "updates": 100 * m, "return": scale * 1000 * m + seed}
                for m in range(1, 13)]

    def run(scale: float, seed: int) -> dict:
        return {"snapshots": snapshots(scale, seed), "elapsed_s": 722.0, "frames": 12_000, "updates": 1200}

    sb3 = {seed: {"curve": [(100_000.0, 3000.0 + seed)], "elapsed_at": {100_000.0: 1200.0}, "elapsed_s": 1200.0,
                  "updates": 95_000} for seed in (0, 1, 2)}
    summary = learning.report_wallclock(tmp_path, {"fast": {s: run(1.0, s) for s in range(5)},
                                                   "slow": {s: run(0.5, s) for s in range(5)}}, sb3, None, 12.0)
    fast, slow = summary["configs"]["fast"], summary["configs"]["slow"]
    assert fast["mean_by_minute"][:3] == [1002.0, 2002.0, 3002.0]
    # SB3's mean 3001 is reached at minute 3 of its 20: 0.15; at minute 10 (half), 10002 / 3001
    assert fast["targets"]["time_share"] == 0.15 and fast["targets"]["time_share_met"]
    assert fast["targets"]["return_ratio_at_half"] == pytest.approx(10002 / 3001, abs=1e-3)
    assert fast["targets"]["return_ratio_met"]
    # 6 of 20 minutes: 0.3, the target's bound, is met
    assert slow["targets"]["minute_reached"] == 6 and slow["targets"]["time_share"] == wallclock.TIME_SHARE_TARGET
    assert slow["targets"]["time_share_met"]
    assert (tmp_path / "wallclock.png").stat().st_size > 0
    assert "| fast | 5 | 12.0 |" in (tmp_path / "wallclock.md").read_text()
    # SB3's runs behind the reference are kept per seed (JSON's keys are strings)
    assert json.loads((tmp_path / "wallclock.json").read_text())["sb3_runs"]["2"] == {
        "updates": 95_000, "frames": [100_000], "returns": [3002.0], "minutes": [20.0]}
    import report

    saved = {**json.loads((tmp_path / "wallclock.json").read_text()), "_file": "wallclock.json"}
    table = report.wallclock_table(saved)
    # 1200 updates in 12.0 min; SB3 95,000 in 20 min
    assert "Gradient updates per minute: ``fast`` 100, ``slow`` 100; SB3's SAC 4,750" in table
    # the columns hold half of SB3's minutes where the target is read (11 of 22), not 22, which no run reached
    table = report.wallclock_table({**saved, "reference": {**saved["reference"], "minutes": 22.0}})
    assert "- 11 min" in table and "- 22 min" not in table

    # TD3's report goes to files of its own, against SB3's TD3, beside SAC's
    td3 = learning.report_wallclock(tmp_path, {"fast": {s: run(1.0, s) for s in range(5)}}, sb3, None, 12.0, "td3")
    saved = json.loads((tmp_path / "wallclock_td3.json").read_text())
    assert td3["algo"] == saved["algo"] == "td3" and saved["configs"]["fast"]["mean_by_minute"][:1] == [1002.0]
    assert "SB3's TD3" in (tmp_path / "wallclock_td3.md").read_text()
    assert json.loads((tmp_path / "wallclock.json").read_text())["algo"] == "sac"


def _sb3_runs(frames: int, seeds: tuple[int, ...] = (0, 1)) -> dict[int, dict]:
    """SB3 runs evaluated every 10k frames up to ``frames``, one minute per 10k frames."""
    marks = [float(m) for m in range(10_000, frames + 1, 10_000)]
    return {seed: {"curve": [(m, m / 100 + seed) for m in marks], "elapsed_at": {m: 6 * m / 1000 for m in marks},
                   "elapsed_s": 6 * frames / 1000, "updates": frames, "frames": frames, "final_return": frames / 100}
            for seed in seeds}


def test_the_wallclock_report_without_sb3s_100k_return_says_so_instead_of_failing(tmp_path):
    # at a reduced --frames SB3's runs end before 100k frames, where the reference is read
    snapshots = [{"elapsed_s": 60.5, "frames": 2000, "updates": 500, "return": 40.0}]
    sides = {"defaults": {0: {"snapshots": snapshots, "elapsed_s": 61.0, "frames": 2000, "updates": 500}}}
    summary = learning.report_wallclock(tmp_path, sides, _sb3_runs(10_000), None, 1.0)
    assert summary["reference"] is None and summary["configs"]["defaults"]["targets"] is None
    assert summary["reference_missing"] == ("SB3's run of seed 0 ends at 10000 frames, before the 100000-frame mark "
                                            "the reference is taken at (a reduced --frames)")
    saved = json.loads((tmp_path / "wallclock.json").read_text())
    assert saved["reference"] is None and saved["reference_missing"] == summary["reference_missing"]
    assert saved["configs"]["defaults"]["mean_by_minute"] == [40.0]
    assert "No SB3 reference, no targets: SB3's run of seed 0 ends at 10000" in (tmp_path / "wallclock.md").read_text()
    # without SB3's runs or a saved reference, the same
    alone = learning.report_wallclock(tmp_path, sides, None, None, 1.0, "td3")
    assert alone["reference"] is None and "--algo sb3_td3" in alone["reference_missing"]
    assert "--sb3-reference" in alone["reference_missing"]
    # at full size the reference is SB3's, and the summary has no reason for a missing one
    full = learning.report_wallclock(tmp_path, sides, _sb3_runs(100_000), None, 1.0)
    assert full["reference"] == {"return": 1000.5, "minutes": 10.0, "seeds": 2, "source": "this suite's runs"}
    assert "reference_missing" not in full and full["configs"]["defaults"]["targets"]["sb3_return"] == 1000.5


def test_the_wallclock_suite_runs_at_a_reduced_size(tmp_path, monkeypatch):
    # README's wall-clock command with one seed, one minute and 10k frames: SB3's runs stop before 100k
    def fake_run(task, seed, run_dir):
        if task.algo.startswith("sb3_"):
            return _sb3_runs(task.frames, (seed,))[seed]
        snapshot = {"elapsed_s": 60.5, "frames": 3000, "updates": 700, "return": 12.0}
        return {**_result([(3000.0, 12.0)], 3000), "snapshots": [snapshot]}

    monkeypatch.setattr(learning, "run", fake_run)
    for algo in ("sac", "td3"):
        learning.main(["--suite", "wallclock", "--algo", algo, f"sb3_{algo}", "--task", "defaults", f"sb3_{algo}",
                       "--seeds", "0", "--minutes", "1", "--frames", "10000", "--out", str(tmp_path)])
        saved = json.loads((tmp_path / f"{'wallclock' if algo == 'sac' else 'wallclock_td3'}.json").read_text())
        assert saved["reference"] is None and "ends at 10000 frames" in saved["reference_missing"]
        assert saved["configs"]["defaults"]["mean_by_minute"] == [12.0]


def test_frames_too_few_for_an_sb3_evaluation_are_refused(tmp_path, capsys, monkeypatch):
    def no_training(task, seed, run_dir):
        raise AssertionError(f"{task.name} trained though --frames is refused")

    monkeypatch.setattr(learning, "run", no_training)
    with pytest.raises(SystemExit):
        learning.main(["--suite", "td3", "--frames", "5000", "--out", str(tmp_path)])
    assert "--frames must be at least 10000 for sb3_td3 (SB3's runs are evaluated every 10000 frames), got 5000" in (
        capsys.readouterr().err)


@pytest.mark.parametrize("suite, algo", [("sb3", "sac"), ("td3", "td3")])
def test_the_sb3_suites_write_their_results_file(suite, algo, tmp_path, monkeypatch):
    import report

    sb3 = _sb3_runs(30_000, (0, 1, 2))
    ours = {seed: {**run, "curve": [(f + 32, v + 50) for f, v in run["curve"]],
                   "elapsed_at": {f + 32: t / 2 for f, t in run["elapsed_at"].items()}, "elapsed_s": 90.0}
            for seed, run in _sb3_runs(30_000, (0, 1, 2)).items()}
    monkeypatch.setattr(learning, "run",
                        lambda task, seed, run_dir: (sb3 if task.algo.startswith("sb3_") else ours)[seed])
    learning.main(["--suite", suite, "--frames", "30000", "--seeds", "0", "1", "2", "--out", str(tmp_path)])
    saved = json.loads((tmp_path / f"{algo}_vs_sb3.json").read_text())
    assert (saved["benchmark"], saved["suite"], saved["algo"]) == ("learning", suite, algo) and saved["date"]
    assert saved["marks"] == [10_000, 20_000, 30_000] and saved["frames"] == 30_000
    assert saved["recipe"]["1"] == {"returns": [151, 251, 351], "minutes": 1.5}
    assert saved[f"sb3_{algo}"]["2"] == {"returns": [102, 202, 302], "minutes": 3.0}
    low, high = saved["interval_90"]["20000"]  # 3 seeds a side
    assert saved["difference"] == [50.0, 50.0, 50.0] and 48 <= low <= 50 <= high <= 52
    # SB3's 301 at 30k is the recipe's at 30k: 1.5 of SB3's 3 minutes
    assert saved["time_to_sb3_return"] == {"mark": 30_000, "sb3_return": 301.0, "sb3_min": 3.0,
                                           "recipe_frames": 30_000, "recipe_min": 1.5, "ratio": 0.5}
    assert saved["targets"]["passed"]
    # the docs' tables read it, as they read the file at benchmarks/results/learning/
    res = {f"learning/{algo}_vs_sb3.json": {**saved, "_file": f"learning/{algo}_vs_sb3.json"}}
    shown = (report.sac_tables if algo == "sac" else report.td3_tables)(res)
    assert f"{algo}_vs_sb3.json" in shown and ("recipe mean (3 seeds)" in shown if algo == "td3" else
                                               "**0.50** of SB3's wall-clock" in shown)


def test_sb3_references_are_told_apart_by_the_runs_they_hold(tmp_path):
    saved = BENCHMARKS / "results" / "learning"
    references = learning.sb3_references([saved / "td3_vs_sb3.json", saved / "sac_vs_sb3.json"])
    assert set(references) == {"sac", "td3"}
    assert references["td3"]["seeds"] == 10 and references["sac"]["seeds"] == 3
    assert "td3_vs_sb3.json" in references["td3"]["source"] and "sac_vs_sb3.json" in references["sac"]["source"]
    with pytest.raises(ValueError, match=r"--sb3-reference .*sac.json: holds no SB3 runs .* and no wallclock"):
        learning.sb3_references([saved.parent / "main_job" / "sac.json"])
    # a wallclock report's own reference (its suite's SB3 runs), for screening against the finals' SB3
    report = tmp_path / "wallclock.json"
    report.write_text(json.dumps({"suite": "wallclock", "algo": "sac", "date": "2026-12-05", "torch": "2.14.1",
                                  "reference": {"return": 4500.0, "minutes": 18.0, "seeds": 5,
                                                "source": "this suite's runs"}}))
    screened = learning.sb3_references([report])["sac"]
    assert (screened["return"], screened["minutes"], screened["seeds"]) == (4500.0, 18.0, 5)
    assert screened["source"] == f"{report} (2026-12-05, torch 2.14.1)"


def test_the_go1_report_finds_the_first_minute_each_critic_walks(tmp_path):
    # "fast" tracks 0.2 + 0.1 * minute and stays up from minute 4 on: it walks at minute 4 (0.6, 950 steps);
    # "slow" tracks as well but falls (500 steps) until minute 7
    def snapshots(up_from: int) -> list[dict]:
        return [{"elapsed_s": 60.0 * m + 0.5, "frames": 1000 * m, "updates": 10 * m, "return": float(m),
                 "reward_tracking_lin_vel": 0.2 + 0.1 * m, "reward_tracking_ang_vel": 0.5,
                 "episode_length": 950.0 if m >= up_from else 500.0} for m in range(1, 9)]

    sides = {label: {0: {"snapshots": snapshots(up_from), "elapsed_s": 482.0, "frames": 8000, "updates": 80}}
             for label, up_from in (("fast", 4), ("slow", 7))}
    summary = learning.report_go1(tmp_path, sides, 8.0)
    fast, slow = summary["critics"]["fast"], summary["critics"]["slow"]
    assert (fast["walks_at_minute"], slow["walks_at_minute"]) == (4, 7)
    assert fast["reward_tracking_lin_vel"][:2] == [0.3, 0.4] and fast["episode_length"][3] == 950.0
    assert "| fast | 1 | 8.0 | 8000 | 80 | 4 |" in (tmp_path / "go1_gpu.md").read_text()
    never = learning.report_go1(tmp_path, {"x": {0: {**sides["fast"][0], "snapshots": snapshots(99)}}}, 8.0)
    assert never["critics"]["x"]["walks_at_minute"] is None


def test_the_go1_gpu_suite_runs_on_cpu_with_both_critics(tmp_path):
    # the GPU machine's command, shrunk to one worker on this CPU for a few seconds a critic
    learning.main(["--suite", "go1_gpu", "--minutes", "0.3", "--out", str(tmp_path), "--set", "network.device=cpu",
                   "collector.num_workers=1", "collector.env_per_collector=4", "collector.frames_per_batch=64",
                   "collector.max_lead_frames=512", "collector.init_random_frames=64", "optim.batch_size=64",
                   "optim.utd_ratio=0.25", "replay_buffer.size=20000", "logger.num_eval_envs=2",
                   "logger.log_every=128"])
    summary = json.loads((tmp_path / "go1_gpu.json").read_text())
    assert set(summary["critics"]) == {"privileged", "symmetric"}
    for side in summary["critics"].values():
        assert side["updates"] > 0 and side["frames"] > 64
        assert 0 < side["reward_tracking_lin_vel"][0] <= 1 and 1 <= side["episode_length"][0] <= 1000
        assert side["walks_at_minute"] is None  # not in 18 s


def _result(curve: list[tuple[float, float]], frames: int = 100_000) -> dict:
    return {"final_return": curve[-1][1], "frames": frames, "updates": 1, "elapsed_s": 60.0,
            "curve": curve, "elapsed_at": {f: f / 1000 for f, _ in curve}}


def test_a_saved_run_is_reused_only_with_the_same_frames(tmp_path, monkeypatch):
    task = learning.SUITES["td3"][1]
    trained = []

    def fake_run(task, seed, run_dir):  # stands for hours of training
        trained.append((task.frames, seed))
        return _result([(10_000.0, float(seed)), (float(task.frames), 2.0 * seed)], task.frames)

    monkeypatch.setattr(learning, "run", fake_run)
    first = learning.run_or_reuse(task, 3, tmp_path / "run", reuse=True)  # nothing saved yet: trains
    saved = json.loads((tmp_path / "run" / "result.json").read_text())
    assert saved["seed"] == 3 and saved["frames"] == task.frames
    again = learning.run_or_reuse(task, 3, tmp_path / "run", reuse=True)
    assert trained == [(task.frames, 3)]
    assert again["curve"] == first["curve"] and again["elapsed_at"] == first["elapsed_at"]
    shorter = learning.dataclasses.replace(task, frames=40_000)
    learning.run_or_reuse(shorter, 3, tmp_path / "run", reuse=True)
    learning.run_or_reuse(task, 3, tmp_path / "run", reuse=False)
    assert trained == [(task.frames, 3), (40_000, 3), (task.frames, 3)]


def test_set_reaches_every_recipe_run_and_a_tasks_variants_are_compared(tmp_path, monkeypatch):
    seen = []

    def fake_run(task, seed, run_dir):
        seen.append(task)
        scalars = run_dir / "exp" / "scalars" / "eval"  # where a recipe logs its evaluations' episode lengths
        scalars.mkdir(parents=True)
        standing = 100 * (seed + 1) * (2 if task.label == "privileged" else 1)
        (scalars / "episode_length.csv").write_text(f"10048,1000\n20032,1000\n30016,{standing}\n40000,{standing}\n")
        # evaluated at the first log past each 10k mark, as the recipe does
        curve = [(m + 48.0, 2.0 * seed + m / 10_000) for m in range(10_000, task.frames + 1, 10_000)]
        curve = curve or [(float(task.frames), 0.5)]  # shorter than 10k frames: the recipe's final evaluation
        return {**_result(curve, task.frames), "run_dir": str(run_dir)}

    monkeypatch.setattr(learning, "run", fake_run)
    learning.main(["--suite", "robot", "--seeds", "0", "1", "--frames", "40000", "--out", str(tmp_path),
                   "--set", "optim.num_threads=1", "logger.eval_iter=5000", "--note", "two runs side by side"])
    assert len(seen) == 2 * len(learning.SUITES["robot"])
    for task in seen:  # after the suite's own overrides, so that hydra lets them win
        assert task.overrides[-2:] == ["optim.num_threads=1", "logger.eval_iter=5000"] and task.frames == 40_000
    go1 = "robot_td3_Go1JoystickFlatTerrain-v1"
    assert (tmp_path / f"{go1}_sides.png").stat().st_size > 0
    table = (tmp_path / f"{go1}_table.rst").read_text()
    for row in ("privileged, seed 0", "privileged, seed 1", "symmetric, seed 1", "**symmetric, mean of 2 seeds**"):
        assert f"* - {row}" in table
    assert "* - recipes/sac.py, seed 0" in (tmp_path / "robot_sac_CheetahRun-v1_table.rst").read_text()
    assert not (tmp_path / "robot_sac_CheetahRun-v1_sides.png").exists()  # one variant: nothing to compare
    # robot.json, the results file the docs' robot tables and plots are made from
    saved = json.loads((tmp_path / "robot.json").read_text())
    assert saved["marks"] == [10_000, 20_000, 30_000, 40_000] and saved["machine"].endswith("two runs side by side")
    cheetah, go1 = saved["tasks"]["CheetahRun-v1"], saved["tasks"]["Go1JoystickFlatTerrain-v1"]
    assert cheetah["reference"] == 300.0 and "reference" not in go1
    assert cheetah["runs"]["seed 1"] == {"returns": [3, 4, 5, 6], "minutes": 1}
    assert cheetah["means"] == {"recipes/sac.py": [2, 3, 4, 5]}
    assert go1["runs"]["symmetric, seed 1"]["returns"] == [3, 4, 5, 6]
    assert set(go1["means"]) == {"privileged", "symmetric"}
    # how long the robot stays up, from 30k frames on: a task with variants compares them
    assert go1["mean_episode_steps_30k_100k"] == {"privileged": 300, "symmetric": 150}
    assert "mean_episode_steps_30k_100k" not in cheetah
    import report
    shown = report.robot_tables({"robot/learning.json": {**saved, "_file": "robot/learning.json"}})
    assert "**symmetric, mean of 2**" in shown and "two runs side by side" in shown
    seen.clear()
    learning.main(["--suite", "robot", "--seeds", "0", "--task", "WalkerWalk", "--out", str(tmp_path / "one")])
    assert [(task.env, task.overrides[-1]) for task in seen] == [("WalkerWalk-v1", "replay_buffer.size=100000")]
    # shorter than the first 10k mark: no marks, the runs' frames
    learning.main(["--suite", "robot", "--seeds", "0", "--task", "CheetahRun", "--frames", "2000",
                   "--out", str(tmp_path / "short")])
    short = json.loads((tmp_path / "short" / "robot.json").read_text())
    assert (short["frames"], short["marks"], short["tasks"]["CheetahRun-v1"]["means"]) == (
        2000, [], {"recipes/sac.py": []})


def test_set_reaches_the_config_an_sb3_run_reads(tmp_path, monkeypatch):
    seen = []

    def fake_run(task, seed, run_dir):
        seen.append(learning.sb3_config(task, seed))
        return _result([(10_000.0, float(seed)), (float(task.frames), 10.0)], task.frames)

    monkeypatch.setattr(learning, "run", fake_run)
    learning.main(["--suite", "td3", "--algo", "sb3_td3", "--seeds", "4", "--out", str(tmp_path),
                   "--set", "optim.num_threads=1", "collector.init_random_frames=2000"])
    (cfg,) = seen  # SB3's torch threads and learning_starts: --set reaches SB3's runs, not only the recipe's
    assert (cfg.optim.num_threads, cfg.collector.init_random_frames, cfg.env.seed) == (1, 2000, 4)
    assert learning.sb3_config(learning.SUITES["td3"][1], 0).optim.num_threads == "auto"


@pytest.mark.parametrize("algo, old_suite", [("sac", "sb3"), ("td3", "td3")])
def test_a_task_runs_on_the_config_it_names(algo, old_suite):
    # the suites measured at one update per frame keep it (recipes/config/<algo>_utd1.yaml) ...
    (old,) = [t for t in learning.SUITES[old_suite] if t.algo == algo]
    assert learning.sb3_config(old, 0).optim.utd_ratio == 1.0
    # ... while the wallclock suite's "defaults" run the recipe's own
    (new,) = [t for t in learning.SUITES["wallclock"] if (t.algo, t.label) == (algo, "defaults")]
    assert learning.sb3_config(new, 0).optim.utd_ratio == learning.recipe_config(algo, []).optim.utd_ratio == 0.25


def test_an_interrupted_run_is_not_saved_for_reuse(tmp_path, monkeypatch):
    task = learning.SUITES["td3"][0]
    monkeypatch.setattr(learning, "run", lambda task, seed, run_dir: {
        **_result([(10_000.0, -3.0)], frames=11_456), "interrupted": True})
    assert learning.run_or_reuse(task, 2, tmp_path / "run", reuse=True)["interrupted"]
    assert not (tmp_path / "run" / "result.json").exists()


@pytest.mark.parametrize("ours_at_40k, ours_last, passed", [
    (2000.0, 3200.0, True),    # at or above SB3's mean at every mark from 30k on
    (1000.0, 3200.0, False),   # below at one mark from 30k on
    (2000.0, 3000.0, False),   # below at the last mark
])
def test_the_sb3_table_applies_issue_22s_targets(ours_at_40k, ours_last, passed):
    sb3 = {0: _result([(20_000.0, 900.0), (30_000.0, 1000.0), (40_000.0, 1500.0), (50_000.0, 3000.0)]),
           1: _result([(20_000.0, 1100.0), (30_000.0, 1200.0), (40_000.0, 1700.0), (50_000.0, 3200.0)])}
    # the recipe evaluates at the first log past each mark
    ours = {0: _result([(20_032.0, 0.0), (30_016.0, 1100.0), (40_000.0, ours_at_40k), (50_048.0, ours_last)])}
    table = learning.compare_with_sb3(ours, sb3)
    assert "| 40000 | %.0f | 1600 | %+.0f |  |" % (ours_at_40k, ours_at_40k - 1600) in table  # 1 seed: no interval
    assert table[-1].endswith("passed" if passed else "not passed")
    assert ("not passed" in table[-1]) is not passed
    band = f"SB3's band at 40000 frames: 1500 to 1700 (2 seeds); recipe: seed 0 {ours_at_40k:.0f} "
    assert band + ("(in or above)" if ours_at_40k >= 1500 else "(below)") in table


@pytest.mark.parametrize("ours_offset, holds_zero", [(1000.0, False), (0.0, True)])
def test_the_sb3_table_gives_each_difference_an_interval_over_seeds(ours_offset, holds_zero):
    sb3 = {seed: _result([(40_000.0, 1500.0 + 100 * seed)]) for seed in range(3)}
    ours = {seed: _result([(40_016.0, 1500.0 + ours_offset + 100 * seed)]) for seed in range(3)}
    row = next(line for line in learning.compare_with_sb3(ours, sb3) if line.startswith("| 40000 |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[3] == f"{ours_offset:+.0f}"
    low, high = (float(v) for v in cells[4].split(" to "))
    # resampling 3 seeds moves each mean by at most 100 (the seeds' range is 200)
    assert ours_offset - 200 <= low <= ours_offset <= high <= ours_offset + 200
    assert (low <= 0 <= high) is holds_zero


@pytest.mark.parametrize("seconds_per_frame, passed", [
    (0.0005, True),   # SB3's final return in half its wall-clock
    (0.0009, False),  # in 0.9 of it: not within 1/1.5
])
def test_the_sac_table_applies_issue_19s_targets(seconds_per_frame, passed):
    sb3 = {seed: _result([(40_000.0, 1000.0), (50_000.0, 2000.0), (60_000.0, 3000.0 + seed)]) for seed in (0, 1)}
    # the recipe reaches SB3's mean final return (3000.5) at 50k frames
    ours = {0: _result([(40_064.0, 900.0), (50_048.0, 3100.0), (60_032.0, 3400.0)])}
    ours[0]["elapsed_at"] = {f: f * seconds_per_frame for f, _ in ours[0]["curve"]}
    table = learning.compare_with_sb3(ours, sb3, **learning.SB3_TARGETS["sac"])
    sb3_minutes = 60.0 / 60  # its elapsed_at is one second per 1000 frames
    ours_minutes = 50_048 * seconds_per_frame / 60
    assert (f"SB3's mean return at 60000 frames, 3000, is reached by SB3 in {sb3_minutes:.1f} min, by the recipe's "
            f"mean curve at 50000 frames in {ours_minutes:.1f} min ({ours_minutes / sb3_minutes:.2f} of SB3's "
            "wall-clock)") in table
    assert table[-1].endswith("(>= SB3 from 50k on, SB3's return in <= 1/1.5 of its wall-clock): "
                              + ("passed" if passed else "not passed"))
    # below SB3 at a mark from 50k on fails whatever the wall-clock
    ours[0]["curve"][1] = (50_048.0, 1900.0)
    assert learning.compare_with_sb3(ours, sb3, **learning.SB3_TARGETS["sac"])[-1].endswith("not passed")


def test_the_sb3_plot_is_written(tmp_path):
    sides = {"recipe": {0: _result([(10_000.0, 1.0), (20_000.0, 5.0)]), 1: _result([(10_000.0, 2.0), (20_000.0, 3.0)])},
             "SB3": {0: _result([(10_000.0, 0.0), (20_000.0, 4.0)])}}
    learning.plot_sides(tmp_path / "plot.png", "title", sides)
    assert (tmp_path / "plot.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_docs_table_has_each_seed_and_the_mean_on_the_10k_grid():
    sides = {"recipe": {0: _result([(10_112.0, 1.0), (20_032.0, 5.0)]), 1: _result([(10_112.0, 3.0)])},
             "SB3": {0: _result([(10_000.0, 0.0), (20_000.0, 4.0)])}}
    lines = learning.rst_table(sides)
    assert lines[3:7] == ["   * - run", "     - 10k", "     - 20k", "     - min"]
    rows = "\n".join(lines).split("   * - ")[2:]
    assert rows == [
        "recipe, seed 0\n     - 1\n     - 5\n     - 1\n",
        "recipe, seed 1\n     - 3\n     - \n     - 1\n",
        "**recipe, mean of 2 seeds**\n     - 2\n     - 5\n     - 1\n",
        "SB3, seed 0\n     - 0\n     - 4\n     - 1",
    ]



def _two_seeds(at_30k: float, at_40k: float) -> dict[int, dict]:
    """Two seeds whose mean return is ``at_30k`` at 30k frames and ``at_40k`` at 40k."""
    return {seed: _result([(30_016.0, at_30k + d), (40_000.0, at_40k - d)], 40_000)
            for seed, d in ((0, 5.0), (1, -5.0))}


def _rows(lines: list[str]) -> dict[tuple[str, str], tuple[str, ...]]:
    cells = [tuple(c.strip() for c in line.strip("|").split("|")) for line in lines[2:]]
    return {row[:2]: row[2:] for row in cells}


def test_the_reruns_table_applies_the_targets_to_each_run_against_sb3_and_against_each_other():
    runs = {"first": _two_seeds(1000.0, 2000.0), "second": _two_seeds(900.0, 2100.0),
            "third": _two_seeds(1100.0, 1700.0)}
    lines = learning.compare_reruns(runs, _two_seeds(950.0, 1950.0), from_mark=30_000, last_within=0.1)
    assert lines[0] == "| run | against | below at (from 30k on) | last mark within 10% | targets |"
    assert _rows(lines) == {
        ("first", "SB3"): ("none", "yes", "passed"),
        ("first", "second"): ("40k", "yes", "not passed"),  # 2000 is within 10 % of 2100
        ("first", "third"): ("30k", "yes", "not passed"),
        ("second", "SB3"): ("30k", "yes", "not passed"),
        ("second", "first"): ("30k", "yes", "not passed"),
        ("second", "third"): ("30k", "yes", "not passed"),
        ("third", "SB3"): ("40k", "no", "not passed"),  # 1700 is 12.8 % below 1950
        ("third", "first"): ("40k", "no", "not passed"),
        ("third", "second"): ("40k", "no", "not passed"),
    }


def test_reruns_compares_this_run_with_the_runs_saved_under_other_outs(tmp_path, monkeypatch):
    sb3, ours, earlier = _two_seeds(950.0, 1950.0), _two_seeds(1000.0, 2000.0), _two_seeds(1100.0, 1700.0)
    monkeypatch.setattr(learning, "run", lambda task, seed, run_dir: (sb3 if task.algo == "sb3_td3" else ours)[seed])
    common = ["--suite", "td3", "--frames", "40000", "--seeds", "0", "1"]
    learning.main([*common, "--out", str(tmp_path / "now")])
    monkeypatch.setattr(learning, "run", lambda task, seed, run_dir: earlier[seed % 2])
    learning.main([*common, "--algo", "td3", "--out", str(tmp_path / "before")])
    learning.main([*common, "--out", str(tmp_path / "now"), "--reuse", "--reruns", str(tmp_path / "before")])
    now, before = str(tmp_path / "now"), str(tmp_path / "before")
    assert _rows((tmp_path / "now" / "td3_reruns.md").read_text().splitlines()) == {
        (now, "SB3"): ("none", "yes", "passed"), (now, before): ("30k", "yes", "not passed"),
        (before, "SB3"): ("40k", "no", "not passed"), (before, now): ("40k", "no", "not passed")}
    with pytest.raises(FileNotFoundError, match="no finished 40000-frame run of td3_HalfCheetah-v5 seed 2 in"):
        learning.main([*common, "2", "--out", str(tmp_path / "more"), "--reruns", str(tmp_path / "before")])


def test_ab_rounds_alternates_the_sides_and_compares_within_rounds(tmp_path):
    # Two checkouts whose benchmark reports its checkout's speed and logs the order the sides ran in.
    log = tmp_path / "order.log"
    for name, speed in (("a", 2.0), ("b", 3.0)):
        (tmp_path / name / "benchmarks").mkdir(parents=True)
        (tmp_path / name / "benchmarks" / "toy.py").write_text(
            "import json, sys\n"
            f"open({str(log)!r}, 'a').write({name!r})\n"
            f"print('noise'); print(json.dumps({{'speed': {speed} * float(sys.argv[1]), 'label': 'x'}}))\n")
    command = [sys.executable, str(BENCHMARKS / "ab_rounds.py"), "--a", f"{sys.executable}@{tmp_path / 'a'}",
               "--b", f"{sys.executable}@{tmp_path / 'b'}", "--benchmark", "toy", "--keys", "speed", "--rounds", "3",
               "--out", str(tmp_path / "out.json"), "--", "2"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert log.read_text() == "abbaab"
    assert (out["speed_a"], out["speed_b"], out["ratio_speed"]) == (4.0, 6.0, 1.5)
    assert out["ratios_speed"] == [1.5] * 3 and out["ratio_speed_interval"] == [1.5, 1.5]
    assert out["a"]["commit"] == "unknown" and json.loads((tmp_path / "out.json").read_text()) == out

    missing = subprocess.run(command[:8] + ["--keys", "nope", "--rounds", "1", "--", "2"], capture_output=True,
                             text=True, timeout=120)
    assert missing.returncode != 0 and "'nope' is not in toy.py's output" in missing.stderr
    absent = subprocess.run(command[:6] + ["--benchmark", "nothere", "--keys", "speed"], capture_output=True,
                            text=True, timeout=120)
    assert absent.returncode != 0 and "no benchmarks/nothere.py in side a's checkout" in absent.stderr


def test_the_main_job_runs_the_committed_recipe_from_a_fresh_clone_and_removes_it(tmp_path, no_leaks, monkeypatch):
    import tempfile

    import main_job
    from test_recipes import TINY

    (tmp_path / "tmp").mkdir()
    # the clone goes where this test alone looks (no_leaks, set up first, checks the real temp dir after the undo)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    clones = lambda: list((tmp_path / "tmp").iterdir())  # noqa: E731
    out = tmp_path / "main_job.json"
    summary = main_job.main(["--seeds", "3", "--out", str(out), "--set", *TINY])
    assert json.loads(out.read_text()) == summary
    assert (summary["task"], summary["frames"], summary["updates"]) == ("Pendulum-v1", 640, {"3": 640 - 256})
    assert summary["minutes"]["3"] > 0 and summary["stated_minutes"] == round(summary["mean_minutes"], 1)
    head = subprocess.run(["git", "-C", str(BENCHMARKS.parent), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True, check=True).stdout.strip()
    assert summary["commit"] == head  # what was committed, not the working tree
    # a recipe that fails is reported with its own error, and the clone goes all the same
    with pytest.raises(RuntimeError, match=r"exited with 1 and no final line(.|\n)*max_minutes must be"):
        main_job.main(["--seeds", "0", "--out", str(tmp_path / "bad.json"), "--set", *TINY, "max_minutes=0"])
    assert clones() == [] and not (tmp_path / "bad.json").exists()


STAND_IN_SAC = '''
import time

import hydra
import torch
import tqdm
from torchrl.record.loggers import get_logger


@hydra.main(version_base="1.3", config_path="", config_name="config")
def main(cfg):
    logger = get_logger(cfg.logger.backend, logger_name="sac_logging", experiment_name="exp")
    bar, frames = tqdm.tqdm(total=10**6), 0
    while True:
        time.sleep(0.2)
        frames += cfg.collector.frames_per_batch
        bar.update(cfg.collector.frames_per_batch)
        metrics = {"train/reward": torch.tensor([1.0, 3.0])}  # two episodes ended: a list in TorchRL's csv logger
        if frames % cfg.logger.eval_iter == 0:
            time.sleep(0.5)  # its evaluation rollout
            metrics |= {"eval/reward": frames / 1000, "time/eval": 0.5}
        logger.log_metrics(metrics, frames)


main()
'''


@pytest.fixture
def rl_checkout(tmp_path):
    """A pytorch/rl work tree whose ``sota-implementations/sac/sac.py`` logs as TorchRL's does, every 0.2 s."""
    sac = tmp_path / "rl" / "sota-implementations" / "sac"
    sac.mkdir(parents=True)
    (sac / "sac.py").write_text(STAND_IN_SAC)
    (sac / "config.yaml").write_text(
        "env: {name: HalfCheetah-v4, seed: 42}\ncollector: {frames_per_batch: 1000, init_random_frames: 2000}\n"
        "optim: {utd_ratio: 0.5}\nlogger: {backend: wandb, eval_iter: 25000}\nhydra: {job: {chdir: true}}\n")
    return tmp_path / "rl"


def test_a_torchrl_script_runs_on_its_own_clock_less_its_evaluations(rl_checkout, tmp_path):
    task = learning.Task("torchrl_sac", "Pendulum-v1", 10**6, None, ["logger.eval_iter=2000"], minutes=0.1,
                         rl_root=rl_checkout)
    run_dir = tmp_path / "run"
    started = time.monotonic()
    result = learning.run_torchrl_script(task, 3, run_dir)
    took = time.monotonic() - started
    assert took < 30, "stopped at its budget of 6 s from its main loop, not at its exit"
    snapshots = result["snapshots"]
    frames = [p["frames"] for p in snapshots]
    assert len(frames) >= 2 and frames == list(range(2000, 2000 * len(frames) + 1, 2000))
    assert [p["return"] for p in snapshots] == [p["frames"] / 1000 for p in snapshots]
    # the budget is on the clock without evaluations: 6 s less ~0.5 s for each
    assert all(p["eval_s"] == 0.5 for p in snapshots)
    assert 0 < snapshots[0]["elapsed_s"] < snapshots[-1]["elapsed_s"] <= 6.0
    # 0.2 s a batch of 1000 frames: the k-th evaluation at 2k batches, plus k-1 earlier evaluations' 0.5 s
    k = len(snapshots)
    assert snapshots[-1]["elapsed_s"] < k * 2 * 0.2 + 1.5
    # half an update per frame once 2000 frames are in: 500 at 2000 frames, 1500 at 4000
    assert [p["updates"] for p in snapshots[:2]] == [500, 1500]
    assert result["command"].startswith("sota-implementations/sac/sac.py env.name=Pendulum-v1 env.seed=3 ")
    scalars = next(run_dir.glob("hydra/*/*/scalars"))
    # the episode returns of a batch go into TorchRL's csv logger as their mean
    assert {value for _, value in learning.scalar_rows(scalars / "train" / "reward.csv")} == {2.0}
    alive = subprocess.run(["pgrep", "-f", str(rl_checkout)], capture_output=True, text=True).stdout
    assert alive == "", "the script's process group is killed at the budget"


def test_a_torchrl_script_that_fails_is_reported_at_once_and_needs_a_checkout(rl_checkout, tmp_path):
    script = rl_checkout / "sota-implementations" / "sac" / "sac.py"
    script.write_text(script.read_text().replace("bar, frames =", "raise RuntimeError('broken'); bar, frames ="))
    task = learning.Task("torchrl_sac", "Pendulum-v1", 10**6, None, minutes=5.0, rl_root=rl_checkout)
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="sac.py in .*: failed"):
        learning.run_torchrl_script(task, 0, tmp_path / "run")
    assert time.monotonic() - started < 60
    assert "RuntimeError: broken" in (tmp_path / "run" / "script.log").read_text()
    with pytest.raises(ValueError, match="--rl-root must name a pytorch/rl checkout"):
        learning.run_torchrl_script(learning.dataclasses.replace(task, rl_root=None), 0, tmp_path / "other")
