"""The files the benchmarks write with ``--out`` are the ones ``benchmarks/report.py`` reads.

Each benchmark's ``main()`` runs here with its measurements replaced by synthetic figures shaped as the
real ones return them (nothing is measured, no process or Ray session starts); the file it writes goes
through the report's table functions, and the synthetic figures must come out in the rendered text.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
import collector_throughput  # noqa: E402
import dropin_speedup  # noqa: E402
import faults  # noqa: E402
import ray_scaling  # noqa: E402
import report  # noqa: E402

# what faults.py's cases return (their dicts' shapes, from the functions' return statements)
CYCLES = {"cycles": 7, "residue": {"shm": 3, "fds": 1, "threads": 4, "children": 5, "tmp": 2}}
BUFFER_KILLS = {"kills": 123, "kills_mid_write": 45, "samples": 6789, "longest_sample_s": 0.0421, "torn_rows": 0}
WORKER_KILLS = {"kills": 31, "longest_error_latency_s": 1.234, "longest_sample_s": 0.8765, "torn_rows": 0}
LEARNER_KILL = {"workers": 2, "all_workers_gone": True, "workers_gone_s": 0.17, "residue_before_next_start": 2,
                "residue_after_next_start": 0}
RECIPE_SIGTERM = {"exit_code": 0, "exit_s": 3.21, "frames_at_stop": 1536, "checkpoint_saved": True, "residue": 0,
                  "resumed_buffer_equals_checkpoint": True}


def soak_run(**figures) -> dict:
    """One run's ``faults._summary``, with ``figures`` in place of the defaults."""
    return {"final_return": 0.0, "frames": 0, "updates": 0, "minutes": 0.0, "frames_lost": 0, "frames_short": 0,
            "torn_rows_in_buffer": 0, "longest_learner_stall_s": 0.0, "residue": 0, "processes_left": 0, **figures}


RECIPE_SOAK = {
    "backend": "local", "frames": 66560, "load_1min_start": 1.5,
    "killed": {**soak_run(final_return=3959.4, frames=66560, minutes=27.5, frames_lost=7,
                          longest_learner_stall_s=0.42), "kills": 51, "worker_restarts": 50,
               "longest_replacement_s": 0.9},
    "undisturbed": soak_run(final_return=4646.6, frames=66560, minutes=22.25, longest_learner_stall_s=0.15),
    "load_1min_end": 4.25,
}
RAY_SOAK = {
    "backend": "ray", "frames": 24576, "load_1min_start": 4.0,
    "killed": {**soak_run(final_return=413.2, frames=24576, minutes=7.9, torn_rows_in_buffer=6,
                          longest_learner_stall_s=1.03, residue=2, processes_left=1),
               "kills": 5, "node_restarts": 4, "longest_replacement_s": 3.1},
    "load_1min_end": 3.5,
}


def ray_line(fpb: int, local: float, ray: float, per_round: list[float], buffer_ratio: float, receive_us: float,
             wire_bytes: float) -> dict:
    """One JSON line of ``ray_scaling.measure`` (every key it returns)."""
    return {"benchmark": "ray_scaling", "env": "HalfCheetah-v5", "num_envs_per_worker": 8, "frames_per_batch": fpb,
            "workers_total": 2, "rounds": 3, "local_fps": local, "ray_fps": ray, "ray_buffer_fps": local * buffer_ratio,
            "ray_over_local": sorted(per_round)[len(per_round) // 2], "ray_buffer_over_local": buffer_ratio,
            "ray_over_local_per_round": per_round, "bytes_per_frame": 199.0, "serialized_bytes_per_frame": wire_bytes,
            "receive_us_per_frame": receive_us, "receive_us_per_frame_17d": 20.0, "receive_us_per_frame_1000d": 90.0,
            "bytes_per_frame_1000d": 8100.0, "sample_ms_local": 0.3, "sample_ms_ray_buffer": 2.0,
            "load_avg_1m": 1.75, "machine": "x86_64 2 cpus"}


RAY_LINES = {64: ray_line(64, 8900.4, 4485.3, [0.462, 0.504, 0.551], 0.5149, 80.4, 257.2),
             512: ray_line(512, 10091.6, 7983.4, [0.791, 0.843, 0.796], 0.6712, 12.4, 206.3)}


def must_not_run(name: str) -> Callable:
    def fail(*args, **kwargs):
        raise AssertionError(f"{name} ran: the option check should have stopped main() first")
    return fail


def run_main(module, monkeypatch, *argv: str) -> None:
    monkeypatch.setattr(sys, "argv", [f"benchmarks/{module.__name__}.py", *argv])
    module.main()


def replace_faults_cases(monkeypatch) -> None:
    """faults.py's cases return the synthetic figures above."""
    for name, figures in {"cycles": CYCLES, "buffer_kills": BUFFER_KILLS, "worker_kills": WORKER_KILLS,
                          "learner_kill": LEARNER_KILL, "recipe_sigterm": RECIPE_SIGTERM}.items():
        monkeypatch.setattr(faults, name, lambda *args, _figures=figures, **kwargs: _figures)
    soaks = {"local": RECIPE_SOAK, "ray": RAY_SOAK}
    monkeypatch.setattr(faults, "recipe_soak", lambda minutes, *, backend="local", **kwargs: soaks[backend])


def written(path: Path, name: str) -> dict:
    """A results file as ``report.outputs`` hands it to the table functions."""
    return {**json.loads(path.read_text()), "_file": name}


def test_faults_out_files_render_in_the_faults_tables(monkeypatch, tmp_path):
    replace_faults_cases(monkeypatch)
    run_main(faults, monkeypatch, "--buffer-kills", "9", "--out", str(tmp_path / "faults.json"))
    run_main(faults, monkeypatch, "--soak-minutes", "1", "--ray-soak-minutes", "1",
             "--out", str(tmp_path / "soak.json"))
    kills, soak = written(tmp_path / "faults.json", "faults/faults.json"), written(tmp_path / "soak.json",
                                                                                    "faults/soak.json")
    assert kills["command"] == f"python benchmarks/faults.py --buffer-kills 9 --out {tmp_path / 'faults.json'}"
    assert soak["command"].startswith("python benchmarks/faults.py --soak-minutes 1 --ray-soak-minutes 1 --out")
    assert kills["benchmark"] == soak["benchmark"] == "faults" and kills["torch"] == faults.torch.__version__
    assert kills["machine"].startswith(f"{os.cpu_count()}-core ")
    assert soak["machine"].endswith("load average 1.5 at the start, 3.5 at the end")  # the local soak's, then Ray's

    text = report.fault_tables({"faults/faults.json": kills, "faults/soak.json": soak})
    for figure in [
        "123 SIGKILLs of a process writing 4,000-row batches into a full buffer (45 inside a write)",
        "longest ``sample()`` 0.0421 s (limit 5 s); torn rows 0 in 6,789 samples",
        "31 SIGKILLs of an ``OffPolicyCollector`` worker",
        "hangs 0; ``WorkerError`` within 1.234 s; longest ``sample()`` 0.8765 s; torn rows 0",
        "7 create / collect / shutdown cycles",
        "residue: 3 ``/dev/shm`` blocks, 1 file descriptors, 4 threads, 5 child processes, 2 temp dirs",
        "workers gone 0.17 s later",
        "exit 0 after 3.21 s with a checkpoint",
        "local, 2 workers, 66,560 frames, 27.5 min (undisturbed 22.25)",
        "- 51 / 50\n", "- 7\n", "0.42 s (undisturbed 0.15)", "3,959 (undisturbed 4,647)", "none, no process left",
        "Ray, 2 nodes, 24,576 frames, 7.9 min", "- 5 / 4\n", "- 6\n", "1.03 s", "- 413\n",
        "2 temp dirs or /dev/shm blocks, 1 processes left",
        # the commands as they run from a checkout: their --out the results files, not this test's directory
        "``python benchmarks/faults.py --buffer-kills 9 --out benchmarks/results/faults/faults.json``",
        "``python benchmarks/faults.py --soak-minutes 1 --ray-soak-minutes 1 --out "
        "benchmarks/results/faults/soak.json``",
        "Data: ``benchmarks/results/faults/soak.json``",
    ]:
        assert figure in text, figure
    assert kills["learner_kill"]["residue_removed_by_next_collector"] is True
    assert kills["recipe_sigterm"]["resume_buffer_exact"] is True


def test_soak_json_writes_soak_json_from_soaks_run_apart(monkeypatch, tmp_path):
    # a full soak's output, then a Ray soak run again on its own: the second's Ray figures win
    first, second = tmp_path / "soak.log", tmp_path / "ray.log"
    first.write_text("a recipe's log line\n" + json.dumps({"recipe_soak": RECIPE_SOAK}) + "\n"
                     + json.dumps({"recipe_soak": RECIPE_SOAK, "ray_soak": {**RAY_SOAK, "frames": 1}}) + "\n")
    second.write_text("[INFO] ray started\n" + json.dumps({"ray_soak": RAY_SOAK}) + "\n[1, 2]\n")
    monkeypatch.setattr(faults, "recipe_soak", must_not_run("recipe_soak"))
    run_main(faults, monkeypatch, "--soak-json", str(first), str(second), "--out", str(tmp_path / "soak.json"))
    soak = written(tmp_path / "soak.json", "faults/soak.json")
    assert soak["machine"].endswith("load average 1.5 at the start, 3.5 at the end; the soaks from 2 runs, one "
                                    "after the other")
    assert soak["ray_soak"]["frames"] == 24576 and soak["recipe_soak"]["kills"] == 51
    text = report.fault_tables({"faults/faults.json": {**json.loads((BENCHMARKS / "results" / "faults" / "faults.json")
                                                                    .read_text()), "_file": "faults/faults.json"},
                                "faults/soak.json": soak})
    assert "Ray, 2 nodes, 24,576 frames, 7.9 min" in text and "- 51 / 50\n" in text
    local_only = tmp_path / "local.log"
    local_only.write_text(json.dumps({"recipe_soak": RECIPE_SOAK}) + "\n")
    with pytest.raises(SystemExit) as stopped:  # no Ray soak in this log
        run_main(faults, monkeypatch, "--soak-json", str(local_only), "--out", str(tmp_path / "x.json"))
    assert stopped.value.code == 2 and not (tmp_path / "x.json").exists()


def test_a_failed_fault_case_reads_as_failed_in_the_table(monkeypatch, tmp_path):
    replace_faults_cases(monkeypatch)
    monkeypatch.setattr(faults, "learner_kill", lambda *a, **k: {**LEARNER_KILL, "residue_after_next_start": 2})
    monkeypatch.setattr(faults, "recipe_sigterm", lambda *a, **k: {
        **RECIPE_SIGTERM, "checkpoint_saved": False, "residue": 1, "resumed_buffer_equals_checkpoint": False})
    run_main(faults, monkeypatch, "--out", str(tmp_path / "faults.json"))
    text = report.fault_tables({"faults/faults.json": written(tmp_path / "faults.json", "faults/faults.json"),
                                "faults/soak.json": {**json.loads((BENCHMARKS / "results" / "faults" / "soak.json")
                                                                  .read_text()), "_file": "faults/soak.json"}})
    assert "its leftovers **not removed** when the next collector starts" in text
    assert ("exit 0 after 3.21 s **without a checkpoint**, **residue 1**; ``resume=`` **does not restore the "
            "buffer**") in text


def test_faults_out_needs_what_its_file_holds(monkeypatch, tmp_path):
    for name in ("cycles", "recipe_soak"):
        monkeypatch.setattr(faults, name, must_not_run(name))
    for argv in (["--skip-recipe"], ["--soak-minutes", "1"], ["--ray-soak-minutes", "1"]):
        with pytest.raises(SystemExit) as stopped:
            run_main(faults, monkeypatch, *argv, "--out", str(tmp_path / "x.json"))
        assert stopped.value.code == 2, argv
    assert not (tmp_path / "x.json").exists()


def test_ray_scaling_out_file_renders_in_the_ray_table(monkeypatch, tmp_path):
    monkeypatch.setattr(ray_scaling, "measure", lambda fpb, rounds, frames, n: RAY_LINES[fpb])
    run_main(ray_scaling, monkeypatch, "--rounds", "3", "--frames-per-batch", "64", "512",
             "--out", str(tmp_path / "ray.json"))
    data = written(tmp_path / "ray.json", "ray/ray_scaling.json")
    assert data["command"] == f"python benchmarks/ray_scaling.py --rounds 3 --frames-per-batch 64 512 " \
                              f"--out {tmp_path / 'ray.json'}"
    assert list(data["by_frames_per_batch"]) == ["64", "512"]
    assert data["by_frames_per_batch"]["512"]["ray_rounds"] == [0.79, 0.84]
    assert data["tensor_bytes_per_frame"] == 199 and data["task"] == "HalfCheetah-v5"
    assert data["workers"] == "2 workers x 8 envs local, against 2 Ray nodes x 1 worker x 8 envs"
    assert data["machine"].endswith("1.75 after 64 frames per batch, 1.75 after 512 frames per batch")

    text = report.ray_table({"ray/ray_scaling.json": data})
    header, *rows = [row.strip().split("\n     - ") for row in text.split("\n\n")[1].split("   * - ")[1:]]
    assert "Ray / local (target 0.8)" in header
    assert rows == [["64", "8,900", "4,485", "**0.50** (rounds 0.46-0.55)", "0.51", "80", "257"],
                    ["512", "10,092", "7,983", "**0.80** (rounds 0.79-0.84)", "0.67", "12", "206"]]
    assert "Data: ``benchmarks/results/ray/ray_scaling.json``" in text


def test_ray_scaling_out_needs_the_headline_batch_size(monkeypatch, tmp_path):
    monkeypatch.setattr(ray_scaling, "measure", must_not_run("measure"))
    with pytest.raises(SystemExit) as stopped:
        run_main(ray_scaling, monkeypatch, "--frames-per-batch", "64", "--out", str(tmp_path / "ray.json"))
    assert stopped.value.code == 2


def test_the_files_collector_and_dropin_benchmarks_write_are_what_the_report_reads():
    keys = collector_throughput.RATE_KEYS
    line = {"rounds": 1, "seconds_per_round": 0.5, "load_average_start_end": [0.5, 1.0],
            **{key: 1000.0 * (i + 1) for i, key in enumerate(keys)},
            **{f"ratio_{key}_over_raw": float(i + 1) for i, key in enumerate(keys[1:], 1)},
            "ratio_envpool_16_over_raw_per_round": [6.5, 7.5], "ratio_2w_over_1w": 1.57,
            "breakdown_us_per_step": {"offpolicy_envpool_16": {"env_step": 50.0, "policy": 20.0, "other": 3.0}},
            "actor_us_per_env": {16: {"after_physics": 39.2, "warm": 34.1}}}
    collector = collector_throughput.results_file(line)
    assert collector["ratio_over_raw"]["offpolicy_envpool_16"] == 7 and collector["actor_us_per_env"] == {
        "16_envs_warm": 34, "16_envs_after_physics": 39}
    table = report.collector_tables({"collector/halfcheetah.json": {**collector, "_file": "halfcheetah.json"}})
    assert "7,000" in table and "(rounds 6.50 to 7.50)" in table and "(1.57 x 1 worker)" in table
    # the phases in the collector's order (env step, policy, buffer write, weight sync, pack, other), a missing one 0
    assert "- 50.0\n     - 20.0\n     - 0.0\n     - 0.0\n     - 0.0\n     - 3.0\n" in table

    sides = ("p1_torchrl", "p1_offpolicy", "p2_torchrl", "p2_offpolicy", "fast_path")
    rates = {"p1_torchrl": [100.0, 200.0], "p1_offpolicy": [300.0, 800.0], "p2_torchrl": [100.0, None],
             "p2_offpolicy": [450.0, 500.0], "fast_path": [600.0, 700.0]}
    result = {"workers": 2, "envs_per_worker": 4, "rounds": 2, "load_average_start_end": [1.0, 2.0],
              "engines": {}, "problems": [{"round": 1, "config": "p2_torchrl", "problem": "hang at run"}],
              **{f"{side}_fps": max(v for v in rates[side] if v) for side in sides}}
    dropin = dropin_speedup.results_file(result, rates)
    assert dropin["ratio_pattern1"] == 3.5 and dropin["ratio_rounds"]["pattern1"] == [3.0, 4.0]
    assert dropin["ratio_pattern2"] == 4.5 and dropin["ratio_fast_path"] == 6.0  # the hung round left out
    table = report.dropin_tables({"dropin/dropin_speedup.json": {**dropin, "_file": "dropin_speedup.json"}})
    assert "**3.50** (target 3; rounds 3.00 to 4.00)" in table and "**6.00**" in table
