"""``benchmarks/gpu_check.py``'s CPU dry run: every part runs, and a failing part leaves the others' figures.

A GPU machine is lent for minutes at a time; the script it runs first must not
meet its own bugs there. ``--device cpu --quick`` runs every part in tiny
sizes on the CPU, in the processes, timeouts and JSON the GPU run uses.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_check.py"
PARTS = ("machine", "learner_ups", "sample_ms", "publish_ms", "e2e_fps", "collector_scaling", "dropin_sac_cuda",
         "collector_lanes")


def _run(*args: str) -> dict:
    done = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--quick", *args],
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 1, f"stdout must hold the JSON line only, got {done.stdout[-2000:]!r}"
    return json.loads(lines[0])


def test_the_cpu_dry_run_gives_every_part_a_figure_and_no_part_errs(tmp_path, no_leaks):
    out = tmp_path / "quick.json"
    result = _run("--out", str(out))
    assert json.loads(out.read_text()) == result
    for part in PARTS:
        assert result[part], f"{part}: no figure and no error"
    # On CPU every part runs but the drop-in, which needs a pytorch/rl checkout and says so.
    assert {part: s["status"] for part, s in result["parts"].items()} == {
        **{part: "ok" for part in PARTS}, "dropin_sac_cuda": "skipped"}
    assert not any("error" in result[part] for part in PARTS)
    assert "--rl-root" in result["dropin_sac_cuda"]["skipped"]

    assert result["machine"]["cpu_count"] >= 1 and result["machine"]["torch"]
    for algo in ("sac", "td3"):
        for batch in ("batch_32", "batch_64"):
            figures = result["learner_ups"][algo][batch]
            assert figures["eager"]["ups"] > 0
            assert "skipped" in figures["compile"] and "skipped" in figures["compile_cudagraphs"]
        e2e = result["e2e_fps"][algo]
        assert e2e["frames_per_s"] > 0 and e2e["updates_per_s"] > 0 and e2e["window_s"] > 0
        assert e2e["num_workers"] == 1 and e2e["envs_per_worker"] == 2 and e2e["longest_stall_s"] >= 0
    for batch in ("batch_32", "batch_64"):
        assert 0 < result["sample_ms"][batch]["p50"] <= result["sample_ms"][batch]["p99"]
    assert 0 < result["publish_ms"]["batched"]["p50"] <= result["publish_ms"]["batched"]["p99"]
    for task in ("HalfCheetah-v5", "Go1JoystickFlatTerrain-v1"):  # --quick: Go1 with one worker only
        scaling = result["collector_scaling"][task]
        assert scaling["envpool_alone_1_thread"] > 0
        assert scaling["workers_1"]["steps_per_s"] > 0 and scaling["workers_1"]["ratio_to_linear"] == 1.0
    two = result["collector_scaling"]["HalfCheetah-v5"]["workers_2"]
    assert two["steps_per_s"] > 0 and two["ratio_to_linear"] > 0
    lanes = result["collector_lanes"]["CheetahRun-v1"]  # --quick: CheetahRun only (the GPU run adds Go1)
    assert lanes["ratio_offpolicy_over_envpool"] > 0 and lanes["ratio_lanes_2_over_envpool"] > 0


def test_a_failing_part_records_its_error_and_the_others_keep_their_figures(tmp_path, no_leaks):
    result = _run("--only", "dropin_sac_cuda,machine", "--rl-root", str(tmp_path / "no_checkout"))
    assert result["parts"]["dropin_sac_cuda"]["status"] == "failed"
    assert "ValueError" in result["dropin_sac_cuda"]["error"] and "--rl-root" in result["dropin_sac_cuda"]["error"]
    assert result["parts"]["machine"]["status"] == "ok" and result["machine"]["cpu_count"] >= 1
    assert set(result["parts"]) == {"dropin_sac_cuda", "machine"}
