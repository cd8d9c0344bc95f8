"""``benchmarks/peer_collectors.py``: its arguments, its summary of the rounds, and a run at the tiniest size.

The pixel workloads read TorchRL's ``benchmarks/bench_collectors.py`` from a pytorch/rl checkout: the environment
variable ``RL_ROOT`` names one (a work tree or a bare git repository), as for ``tests/test_sota_dropin.py``;
without it that test skips.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import peer_collectors
import pytest

TINY = ["--envs", "2", "--workers", "2", "--rounds", "1", "--seconds", "1", "--frames-per-batch", "32",
        "--timeout", "280"]


def rl_checkout() -> Path:
    root = os.environ.get("RL_ROOT")
    if not root:
        pytest.skip("no pytorch/rl checkout: set RL_ROOT to one holding benchmarks/bench_collectors.py")
    return Path(root)


def test_the_pixel_workloads_need_a_checkout_and_the_envs_split_among_the_workers(capsys):
    with pytest.raises(SystemExit):
        peer_collectors.main(["--workloads", "pixels"])
    assert "--rl-root (a pytorch/rl checkout holding benchmarks/bench_collectors.py)" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        peer_collectors.main(["--workloads", "state", "--envs", "3", "--workers", "2"])
    assert "--envs must be a multiple of --workers, got 3 and 2" in capsys.readouterr().err
    with pytest.raises(ValueError, match="--rl-root must be a pytorch/rl work tree"):
        peer_collectors.main(["--rl-root", "/nonexistent", "--workloads", "pixels"])


def test_the_summary_compares_the_sides_within_rounds_and_keeps_the_rounds_a_side_missed():
    def run(fps: float, **extra) -> dict:
        return {"fps": fps, "load_1min": 1.5, "bytes_per_transition": 100, **extra}

    runs = {"ours": [run(800.0, engine="torchrl"), None, run(900.0), run(1000.0, engine="torchrl")],
            "theirs": [run(400.0), run(500.0), run(450.0), run(500.0, server={"avg_batch_size": 3.0})]}
    args = peer_collectors.argparse.Namespace(step_latency_ms=1.0)
    out = peer_collectors.summary(peer_collectors.WORKLOADS["pixels"], runs, args)
    assert out["ours"]["fps_rounds"] == [800.0, None, 900.0, 1000.0] and out["ours"]["fps"] == 900.0
    assert out["ratio_rounds"] == [2.0, 2.0, 2.0] and out["ratio"] == 2.0 and out["ratio_interval"] == [2.0, 2.0]
    assert out["target"] == 2.0 and out["target_met"] is True
    # what each side reported of its own work comes from its last run
    assert out["ours"]["engine"] == "torchrl" and out["theirs"]["server"] == {"avg_batch_size": 3.0}
    assert out["ours"]["load_1min_rounds"] == [1.5, None, 1.5, 1.5]
    assert (out["step_latency_ms"], out["policy_delay_ms"]) == (1.0, 0.0)
    two = peer_collectors.summary(peer_collectors.WORKLOADS["state"], {s: r[:2] for s, r in runs.items()}, args)
    assert two["ratio_interval"] is None and two["target_met"] is False and "policy_delay_ms" not in two


def test_the_results_file_renders_on_the_collector_page_and_in_readmes_headline(tmp_path, monkeypatch):
    import report

    def synthetic_rounds(workload, args, env, logs):
        ours = {"fps": 8765.4, "load_1min": 2.25, "paused_other_side_cores": 0.031, "bytes_per_transition": 247,
                "stored_keys": ["action"], "breakdown_us_per_frame": {"env_step": 61.2, "policy": 17.7,
                                                                      "buffer_write": 9.1}}
        theirs = {"fps": 700.0, "load_1min": 3.5, "paused_other_side_cores": 0.042, "bytes_per_transition": 234,
                  "stored_keys": ["action"], "server": {"avg_batch_size": 12.3, "p50_forward_ms": 4.56}}
        return {"ours": [ours, ours, None], "theirs": [theirs, theirs, theirs]}, [{"workload": workload,
                                                                               "side": "ours", "problem": "hang"}]

    monkeypatch.setattr(peer_collectors, "workload_rounds", synthetic_rounds)
    path = tmp_path / "peer.json"
    peer_collectors.main(["--workloads", "state", "--rounds", "3", "--out", str(path)])
    data = {**json.loads(path.read_text()), "_file": report.PEER_FILE}
    assert data["problems"] == [{"workload": "state", "side": "ours", "problem": "hang"}]
    table = report.peer_table({report.PEER_FILE: data})
    for figure in ("8,765 (rounds: 8,765, 8,765, -)", "700 (rounds: 700, 700, 700)", "**12.52**", ">= 10: met",
                   "247 / 234", "env step 61, policy 18, buffer write 9", "12.3 requests a call, 4.6 ms",
                   "load average 2.2 to 3.5", "at most 0.04 of a core"):
        assert figure in table, figure
    row = report.with_peer({report.PEER_FILE: data}, ("m", "**3.9x** (1 against 2 steps/s)", "python a", "d1"))
    assert row[1].startswith("**3.9x** (1 against 2 steps/s) against `Collector`, same run; **12.5x**")
    assert "(8,765 against 700 frames/s, load average 2 to 4 on 2 cores)" in row[1]
    assert row[2].startswith("python a; python benchmarks/peer_")
    assert report.with_peer({}, ("m", "f", "c", "d")) == ("m", "f", "c", "d")


def check_both_sides_wrote(out: dict, workload: str) -> None:
    data = out["workloads"][workload]
    assert out["problems"] == [], out["problems"]
    for side in ("ours", "theirs"):
        assert data[side]["fps"] > 0, (side, data[side])
        assert data[side]["bytes_per_transition"] > 0 and "action" in data[side]["stored_keys"]
    assert data["ratio"] > 0 and len(data["ratio_rounds"]) == 1
    assert {"target", "target_met", "ratio_interval", "buffer_rows"} <= set(data)
    assert {"benchmark", "date", "command", "machine", "torch", "load_average_start_end", "configurations"} <= set(out)


@pytest.mark.timeout(900)
def test_a_tiny_run_of_the_state_workload_writes_frames_on_both_sides(tmp_path):
    path = tmp_path / "peer.json"
    assert peer_collectors.main(["--workloads", "state", *TINY, "--out", str(path)]) == 0
    out = json.loads(path.read_text())
    check_both_sides_wrote(out, "state")
    assert out["workloads"]["state"]["ours"]["engine"] == "envpool"
    assert out["workloads"]["state"]["theirs"]["server_backend"] == "process"


@pytest.mark.timeout(900)
def test_a_tiny_run_of_torchrls_pixel_workload_stores_its_uint8_frames_on_both_sides(tmp_path):
    checkout = rl_checkout()
    path = tmp_path / "peer.json"
    assert peer_collectors.main(["--rl-root", str(checkout), "--workloads", "pixels_delay", *TINY,
                                 "--out", str(path)]) == 0
    out = json.loads(path.read_text())
    check_both_sides_wrote(out, "pixels_delay")
    assert out["workloads"]["pixels_delay"]["policy_delay_ms"] == 20.0 and out["rl_commit"]
    for side in ("ours", "theirs"):
        # a 3x84x84 uint8 frame and the next one: at least 2 x 21,168 bytes a stored transition
        assert out["workloads"]["pixels_delay"][side]["bytes_per_transition"] >= 2 * 3 * 84 * 84
