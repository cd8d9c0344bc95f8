"""The SAC and TD3 recipes end to end: real worker processes, real MuJoCo/classic-control envs.

Each test calls a recipe's ``main`` in-process with a Hydra config composed
from ``recipes/config`` plus overrides (tiny networks and budgets); the
Ctrl-C test runs ``python recipes/sac.py`` in a subprocess and interrupts it.
"""

from __future__ import annotations

import contextlib
import csv
import importlib.util
import math
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir

from torchrl_unilab import make_replay_buffer
from torchrl_unilab._residue import worker_processes
from torchrl_unilab.collectors._worker import RANDOM_VERSION
from torchrl_unilab.trainers.checkpoint import load_buffer

ROOT = Path(__file__).resolve().parents[1]
RECIPES = ROOT / "recipes"

# A few hundred frames of Pendulum with small networks: seconds per run. One update per frame, so that a run's
# updates are its frames past init_random_frames.
TINY = [
    "env.name=Pendulum-v1",
    "optim.utd_ratio=1.0",
    "network.hidden_sizes=[32,32]",
    "optim.batch_size=64",
    "collector.env_per_collector=4",
    "collector.frames_per_batch=64",
    "collector.init_random_frames=256",
    "collector.max_lead_frames=256",
    "collector.total_frames=640",
    "collector.sync_every=16",
    "replay_buffer.size=20000",
    "logger.num_eval_envs=2",
    "logger.log_every=128",
    "logger.eval_iter=320",
    "logger.checkpoint_every=320",
    "logger.progress_bar=false",
]


def load_recipe(name: str):
    spec = importlib.util.spec_from_file_location(f"recipe_{name}", RECIPES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_recipe(name: str, run_dir: Path, *overrides: str) -> dict:
    with initialize_config_dir(config_dir=str(RECIPES / "config"), version_base="1.3"):
        cfg = compose(config_name=name, overrides=[*TINY, f"logger.log_dir={run_dir}", *overrides])
    return load_recipe(name).main(cfg)


def scalars(run_dir: Path, key: str) -> list[tuple[int, float]]:
    """The ``(step, value)`` rows the CSV logger wrote for ``key``."""
    (exp,) = [p for p in run_dir.iterdir() if (p / "scalars").is_dir()]
    with open(exp / "scalars" / f"{key}.csv") as f:
        return [(int(step), float(value)) for step, value in csv.reader(f)]


def saved_counters(run_dir: Path) -> dict:
    return torch.load(run_dir / "checkpoint" / "state.pt", weights_only=True)["counters"]


def check_run(run_dir: Path, summary: dict, *, frames: int, updates: int) -> None:
    """The run wrote its log, its plot and a checkpoint with its counters."""
    assert summary["frames"] == frames and summary["updates"] == updates and not summary["interrupted"]
    assert (run_dir / "learning_curve.png").stat().st_size > 0
    assert (run_dir / "checkpoint" / "replay_buffer").is_dir()
    assert not (run_dir / "checkpoint" / "replay_buffer" / "prefetch.pkl").exists(), "no pickle in the checkpoint"
    counters = saved_counters(run_dir)
    assert (counters["frames"], counters["updates"]) == (frames, updates)
    steps = [step for step, _ in scalars(run_dir, "eval/return")]
    assert steps == sorted(steps) and len(steps) == len(set(steps)) and steps[-1] == frames
    for key in ("train/loss_qvalue", "train/loss_actor", "utd/achieved", "learner/updates_per_s",
                "collector/frames_per_s", "learner/policy_lag"):
        assert scalars(run_dir, key), f"{key} was not logged"


def test_td3_runs_end_to_end_and_resumes(tmp_path, no_leaks):
    run_dir = tmp_path / "run"
    first = run_recipe("td3", run_dir, "collector.total_frames=512", "logger.eval_iter=192")
    check_run(run_dir, first, frames=512, updates=512 - 256)  # utd_ratio=1 once init_random_frames are in
    # optim.policy_update_delay=2: Adam stepped the critics on each of the 256 updates, the actor on every other one
    optimizer = torch.load(run_dir / "checkpoint" / "state.pt", weights_only=True)["modules"]["optimizer"]
    assert sorted({int(state["step"]) for state in optimizer["state"].values()}) == [128, 256]
    evals = [step for step, _ in scalars(run_dir, "eval/return")]

    # resume=<dir> continues the counters and the same log files where the run stopped
    second = run_recipe("td3", run_dir, f"resume={run_dir}", "collector.total_frames=704")
    check_run(run_dir, second, frames=704, updates=704 - 256)
    assert second["run_dir"] == first["run_dir"]
    resumed = [step for step, _ in scalars(run_dir, "eval/return")]
    assert resumed[: len(evals)] == evals and min(resumed[len(evals):]) > 512


def test_crossq_trains_its_temperature_with_a_batch_renormalised_critic_and_no_targets(tmp_path, no_leaks):
    """recipes/crossq.py on TorchRL's CrossQLoss: the critics step on every update, the actor and alpha on every
    policy_update_delay-th one, and alpha moves from alpha_init (TorchRL's sota script never steps it)."""
    run_dir = tmp_path / "run"
    summary = run_recipe("crossq", run_dir, "network.critic_hidden_sizes=[32,32]", "collector.total_frames=512",
                         "logger.eval_iter=192")
    check_run(run_dir, summary, frames=512, updates=512 - 256)
    state = torch.load(run_dir / "checkpoint" / "state.pt", weights_only=True)["modules"]
    # Updates 0, 3, ..., 255 of 256 step the actor and alpha: 86 of them
    assert sorted({int(s["step"]) for s in state["optimizer"]["state"].values()}) == [86, 256]
    assert float(state["loss"]["log_alpha"]) < 0  # alpha_init=1: log_alpha starts at 0
    assert not [key for key in state["loss"] if "target_" in key and "entropy" not in key]
    assert "target_updater" not in state
    assert [key for key in state["loss"] if key.endswith("running_mean")]  # the critic's BatchRenorm1d
    assert all(alpha < 1.0 for _, alpha in scalars(run_dir, "train/alpha"))  # logged after each actor step


def test_crossq_refuses_prioritized_replay_by_name(tmp_path):
    with pytest.raises(ValueError, match=r"replay_buffer.prb=true .* CrossQLoss \(crossq\) reads none"):
        run_recipe("crossq", tmp_path / "run", "replay_buffer.prb=true")


@contextlib.contextmanager
def running_sac(tmp_path: Path, run_dir: Path) -> Iterator[subprocess.Popen]:
    """``recipes/sac.py`` in a session of its own, yielded once it has logged; killed on the way out if still
    running."""
    cmd = [sys.executable, str(RECIPES / "sac.py"), *TINY, f"logger.log_dir={run_dir}",
           "collector.total_frames=100000", "logger.checkpoint_every=0"]
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        logged = run_dir / "Pendulum-v1_SAC" / "scalars" / "utd" / "achieved.csv"
        while not (logged.exists() and logged.stat().st_size > 0):
            assert proc.poll() is None, proc.stdout.read()
            assert time.monotonic() < deadline, "the recipe logged nothing within 120 s"
            time.sleep(0.2)
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()


def test_sac_ctrl_c_saves_a_checkpoint_and_the_run_resumes(tmp_path, no_leaks):
    run_dir = tmp_path / "run"
    with running_sac(tmp_path, run_dir) as proc:
        # The whole process group, as a terminal's Ctrl-C signals it (workers included).
        os.killpg(proc.pid, signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    assert "Interrupted: checkpoint saved" in out, out
    stopped = saved_counters(run_dir)
    assert 256 < stopped["frames"] < 100_000 and stopped["updates"] > 0
    # resuming an interrupted run: test_faults.py's SIGTERM test, from the same kind of checkpoint


def test_lockstep_runs_are_reproducible(tmp_path, no_leaks):
    overrides = ["collector.lockstep=true", "env.seed=3", "logger.eval_iter=64", "logger.log_every=64",
                 "collector.total_frames=448", "logger.checkpoint_every=0"]
    run_recipe("sac", tmp_path / "a", *overrides)
    run_recipe("sac", tmp_path / "b", *overrides)
    for key in ("eval/return", "train/episode_return", "train/loss_qvalue", "train/alpha"):
        a, b = scalars(tmp_path / "a", key), scalars(tmp_path / "b", key)
        assert len(a) >= 3 and a == b, f"{key} differs between two lock-step runs with the same seed"


def test_lockstep_collects_each_chunk_with_the_weights_of_the_last_update(tmp_path, no_leaks):
    """Lock-step publishes before each chunk, whatever ``collector.sync_every``: every chunk a new policy version."""
    run_dir = tmp_path / "run"
    run_recipe("td3", run_dir, "collector.lockstep=true", "collector.env_per_collector=1",
               "collector.frames_per_batch=16", "collector.sync_every=1000", "collector.total_frames=384")
    rb = make_replay_buffer(20_000, scratch_dir=tmp_path / "loaded")  # the size of TINY's buffer
    load_buffer(rb, run_dir / "checkpoint" / "replay_buffer")
    versions = rb.storage[: len(rb)]["policy_version"].reshape(-1)
    assert len(versions) == 384 and bool((versions[:256] == RANDOM_VERSION).all())
    chunks = versions[256:].reshape(-1, 16)  # 8 chunks of 16 frames, each collected after 16 more updates
    assert bool((chunks == chunks[:, :1]).all()), "a chunk mixes policy versions"
    assert chunks[:, 0].tolist() == list(range(int(chunks[0, 0]), int(chunks[0, 0]) + 8)), chunks[:, 0].tolist()


def test_lockstep_needs_one_worker(tmp_path):
    with pytest.raises(ValueError, match="collector.lockstep=true needs collector.num_workers=1"):
        run_recipe("sac", tmp_path, "collector.lockstep=true", "collector.num_workers=2")


def test_sac_learns_pendulum_at_the_configured_utd(tmp_path, no_leaks):
    """SAC on Pendulum-v1, fixed seed: eval return reaches -400 within 10k frames; UTD held within 10%."""
    utd, starts = 0.5, 1000
    summary = run_recipe(
        "sac", tmp_path, "env.seed=1", "collector.total_frames=10000", f"collector.init_random_frames={starts}",
        "network.hidden_sizes=[64,64]", "optim.batch_size=128", f"optim.utd_ratio={utd}", "optim.lr=1e-3",
        "logger.num_eval_envs=5", "logger.eval_iter=1000", "logger.checkpoint_every=0", "logger.log_every=1000",
        "collector.max_lead_frames=512",
    )
    returns = [value for _, value in scalars(tmp_path, "eval/return")]
    assert max(returns) >= -400, f"eval returns {returns}"

    # Update-to-data control: the learner is the slower side here, so the collector is throttled
    # and each log window holds the configured ratio (up to one 64-frame batch per 1000 frames).
    assert summary["updates"] == int(utd * (10_000 - starts))
    assert abs(summary["utd_achieved"] - utd) <= 0.01 * utd
    # past the first full log window after learning started (it still holds the warm-up)
    logged = [(frames, value) for frames, value in scalars(tmp_path, "utd/achieved") if frames >= starts + 2000]
    assert len(logged) >= 6
    for frames, value in logged:
        assert abs(value - utd) <= 0.1 * utd, f"achieved UTD {value:.3f} at {frames} frames, configured {utd}"


def test_sac_trains_with_prioritized_replay_and_resumes_its_priorities(tmp_path, no_leaks):
    """replay_buffer.prb=true: rows the workers write get priorities, the TD errors move them, a resume restores
    them."""
    run_dir = tmp_path / "run"
    prb = ["replay_buffer.prb=true", "replay_buffer.size=4096", "collector.total_frames=1024"]
    first = run_recipe("sac", run_dir, *prb)
    check_run(run_dir, first, frames=1024, updates=1024 - 256)
    sampler_dir = run_dir / "checkpoint" / "replay_buffer" / "sampler"
    tree = torch.from_file(str(sampler_dir / "sumtree.memmap"), size=4096, dtype=torch.float64)
    # Every row written by the worker process has a priority; the updates spread them apart.
    assert bool((tree[:1024] > 0).all()) and bool((tree[1024:] == 0).all())
    assert tree[:1024].std() > 0.1 * tree[:1024].mean()

    second = run_recipe("sac", run_dir, f"resume={run_dir}", *prb[:2], "collector.total_frames=1216")
    check_run(run_dir, second, frames=1216, updates=1216 - 256)


def test_sac_trains_on_the_n_step_rows_its_workers_write(tmp_path, no_leaks):
    """collector.multi_step=3: each worker sums 3 rewards per row along each env's steps in a batch (fewer at an
    episode's end and at the batch's), and the learner samples the rows' steps_to_next_obs with them."""
    run_dir = tmp_path / "run"
    summary = run_recipe("sac", run_dir, "collector.multi_step=3")
    check_run(run_dir, summary, frames=640, updates=640 - 256)
    rb = make_replay_buffer(20_000, scratch_dir=tmp_path / "loaded")  # the size of TINY's buffer
    load_buffer(rb, run_dir / "checkpoint" / "replay_buffer")
    rows = rb.storage[: len(rb)]
    steps = rows["steps_to_next_obs"].reshape(-1)
    # 4 envs x 16 steps per batch: the last 2 of each env's 16 are cut short by the batch's end
    assert sorted(steps.unique().tolist()) == [1, 2, 3] and int((steps == 3).sum()) >= 640 * 13 // 16
    one = steps == 1  # one reward: the row's own
    assert torch.equal(rows["next", "reward"].reshape(-1)[one], rows["next", "original_reward"].reshape(-1)[one])
    assert not torch.allclose(rows["next", "reward"].reshape(-1)[~one],
                              rows["next", "original_reward"].reshape(-1)[~one])


def _kill_a_worker_once_the_run_logs(run_dir: Path, frames: int, stop: threading.Event, killed: list) -> None:
    """SIGKILLs the first worker process of this test's recipe once the run has logged ``frames`` frames.

    Not by the clock: the whole run can take about 3 s, so a worker killed 3 s after its start may be killed
    after the run's last log line, or not at all.
    """
    while not stop.is_set() and not killed:
        with contextlib.suppress(Exception):  # no log yet, or a line half written
            if scalars(run_dir, "collector/worker_restarts")[-1][0] >= frames:
                for pid in worker_processes(os.getpid()):
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
                    return
        time.sleep(0.02)


def test_sac_survives_a_killed_worker_logs_the_restart_and_resumes(tmp_path, no_leaks):
    run_dir = tmp_path / "run"
    stop, killed = threading.Event(), []
    # A quarter into the run: learning has started, and the worker may be at most max_lead_frames ahead, so
    # the learner has to wait for its replacement.
    killer = threading.Thread(target=_kill_a_worker_once_the_run_logs, args=(run_dir, 512, stop, killed), daemon=True)
    killer.start()
    try:
        summary = run_recipe("sac", run_dir, "collector.total_frames=2048", "collector.max_worker_restarts=2",
                             "logger.log_every=64")
    finally:
        stop.set()
        killer.join(5)
    assert killed, "no worker was killed"
    assert summary["worker_restarts"] == 1
    # the learner waited for the replacement of its only worker: a stall, outside the warm-up's wait
    assert 0 < summary["longest_stall_s"] < summary["elapsed_s"]
    assert scalars(run_dir, "learner/longest_stall_s")[-1][1] <= summary["longest_stall_s"]  # logged as it grows
    check_run(run_dir, summary, frames=2048, updates=2048 - 256)
    assert scalars(run_dir, "collector/worker_restarts")[-1][1] == 1.0
    resumed = run_recipe("sac", run_dir, f"resume={run_dir}", "collector.total_frames=2240")
    check_run(run_dir, resumed, frames=2240, updates=2240 - 256)


def test_td3_trains_with_prioritized_replay(tmp_path, no_leaks):
    """replay_buffer.prb=true with TD3: the loss module steps the critics, then the actor; TD errors move priorities."""
    run_dir = tmp_path / "run"
    summary = run_recipe("td3", run_dir, "replay_buffer.prb=true", "replay_buffer.size=1024",
                         "collector.total_frames=512", "logger.eval_iter=512")
    check_run(run_dir, summary, frames=512, updates=512 - 256)
    sampler_dir = run_dir / "checkpoint" / "replay_buffer" / "sampler"
    tree = torch.from_file(str(sampler_dir / "sumtree.memmap"), size=1024, dtype=torch.float64)
    assert bool((tree[:512] > 0).all()) and tree[:512].std() > 0.1 * tree[:512].mean()


@pytest.mark.parametrize("engine", ["gymnasium", "envpool"])
def test_collector_engine_picks_what_steps_the_envs(engine, no_leaks):
    """``collector.engine`` reaches the collector: HalfCheetah-v5 runs on the engine asked for."""
    from torchrl_unilab import make_replay_buffer as buffer_of
    from torchrl_unilab.trainers.collection import make_collector
    from torchrl_unilab.trainers.recipes_utils import env_info, make_networks

    with initialize_config_dir(config_dir=str(RECIPES / "config"), version_base="1.3"):
        cfg = compose(config_name="td3", overrides=[*TINY, "env.name=HalfCheetah-v5", f"collector.engine={engine}"])
    nets = make_networks(cfg, "td3", env_info(cfg))
    collector = make_collector(cfg, nets.policy, buffer_of(1024))
    try:
        collector.allow_frames(64)
        assert collector.wait_for_frames(64, timeout=120)
        assert collector.metrics()["engine"] == engine
    finally:
        collector.shutdown()


def test_learner_threads_auto_are_logged_and_a_bad_count_fails_before_any_worker_starts(tmp_path, no_leaks):
    run_recipe("sac", tmp_path / "auto", "optim.num_threads=auto")
    threads = [value for _, value in scalars(tmp_path / "auto", "learner/threads")]
    assert threads and set(threads) <= {float(n) for n in range(1, os.cpu_count() + 1)}
    with pytest.raises(ValueError, match="optim.num_threads must be a thread count >= 1 or 'auto', got 0"):
        run_recipe("td3", tmp_path / "bad", "optim.num_threads=0")
    assert not worker_processes(os.getpid())


def test_the_recipes_flush_denormals_unless_told_not_to(tmp_path, no_leaks):
    denormal = torch.from_numpy(np.ones(8, np.int32).view(np.float32))  # 1.4e-45; small: the main thread alone
    run_recipe("sac", tmp_path / "off", "optim.flush_denormal=false")
    assert bool((denormal * 1.0).all())
    run_recipe("td3", tmp_path / "on")
    assert not bool((denormal * 1.0).any())  # conftest's torch_state sets torch's default back


def test_the_recipes_say_their_matmul_dtype_and_train_in_bf16(tmp_path, unilab_log, no_leaks):
    summary = run_recipe("td3", tmp_path / "bf16", "optim.matmul_dtype=bf16")
    check_run(tmp_path / "bf16", summary, frames=summary["frames"], updates=summary["updates"])
    said = [r.getMessage() for r in unilab_log if "matmuls" in r.getMessage()]
    assert said == ["learner: the networks' matmuls in bfloat16 (optim.matmul_dtype=bf16); losses and weights in "
                    "float32"]
    losses = [value for _, value in scalars(tmp_path / "bf16", "train/loss_qvalue")]
    assert losses and all(math.isfinite(value) for value in losses)


def test_max_minutes_ends_the_run_and_its_snapshots_hold_the_policy_it_evaluated(tmp_path, no_leaks):
    import wallclock

    run_dir = tmp_path / "run"
    # total_frames is never reached: the wall-clock budget (9 s) ends the run
    summary = run_recipe("sac", run_dir, "collector.total_frames=10000000", "max_minutes=0.15",
                         "logger.snapshot_every_s=2", "logger.eval_iter=0")
    assert summary["out_of_time"] and not summary["interrupted"]
    assert 9.0 <= summary["elapsed_s"] and summary["frames"] < 10_000_000
    saved = sorted((run_dir / "snapshots").glob("*.pt"))
    snapshots = [torch.load(path, weights_only=True) for path in saved]
    # every 2 s once the updates begin (the workers' start and the random frames come first), and where it ended
    assert len(snapshots) >= 2
    assert snapshots[0]["updates"] < snapshots[-1]["updates"]
    for key in ("elapsed_s", "frames", "updates"):
        values = [snapshot[key] for snapshot in snapshots]
        assert values == sorted(values), key
    periodic = [int(snapshot["elapsed_s"] // 2) for snapshot in snapshots[:-1]]
    assert len(periodic) == len(set(periodic)), "one snapshot per 2 s"
    assert (snapshots[-1]["frames"], snapshots[-1]["updates"]) == (summary["frames"], summary["updates"])
    # the last snapshot, evaluated afterwards, is the policy the run's final evaluation ran
    with initialize_config_dir(config_dir=str(RECIPES / "config"), version_base="1.3"):
        cfg = compose(config_name="sac", overrides=[*TINY, f"logger.log_dir={run_dir}"])
    points = wallclock.evaluate_snapshots(run_dir, cfg, "sac")
    assert [point["frames"] for point in points] == [snapshot["frames"] for snapshot in snapshots]
    assert points[-1]["return"] == pytest.approx(summary["final_return"])


@pytest.mark.parametrize("algo, envs, frames, noise", [("sac", 4, 40_000, set()),
                                                       ("td3", 1, 40_000, {"collector.td3_noise"})])
def test_utd1_is_the_defaults_at_one_update_per_frame(algo, envs, frames, noise):
    # python recipes/<algo>.py --config-name <algo>_utd1: SB3's schedule
    with initialize_config_dir(config_dir=str(RECIPES / "config"), version_base="1.3"):
        defaults, utd1 = compose(config_name=algo), compose(config_name=f"{algo}_utd1")

    def leaves(cfg, prefix=""):
        return {k: v for key, value in cfg.items()
                for k, v in (leaves(value, f"{prefix}{key}.") if hasattr(value, "items") else
                             {f"{prefix}{key}": value}).items()}

    changed = {key for key, value in leaves(utd1).items() if leaves(defaults)[key] != value}
    assert (utd1.optim.utd_ratio, utd1.collector.env_per_collector, utd1.collector.total_frames) == (1.0, envs, frames)
    assert changed <= {"collector.total_frames", "collector.frames_per_batch", "collector.env_per_collector",
                       "collector.max_lead_frames", "replay_buffer.size", "optim.utd_ratio", "logger.eval_iter",
                       "logger.checkpoint_every", *noise}
    assert defaults.optim.utd_ratio == 0.25 and defaults.collector.env_per_collector == 16


def test_max_minutes_must_be_positive(tmp_path):
    with pytest.raises(ValueError, match=r"max_minutes must be a number of minutes > 0, or null \(no limit\), got 0"):
        run_recipe("sac", tmp_path / "run", "max_minutes=0")
