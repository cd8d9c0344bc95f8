"""OffPolicyCollector end to end: real MuJoCo envs, real worker processes, real shared buffer."""

from __future__ import annotations

import functools
import os
import time

import pytest
import torch
from conftest import let_worker_write, linear_policy, publish_zero_weights, rows_after_publish, wait_until
from tensordict import TensorDictBase
from torchrl.collectors import MultiAsyncCollector

from torchrl_unilab import BatchedGymEnv, EnvPoolEnv, OffPolicyCollector, WorkerError, make_replay_buffer

HOPPER_OBS, HOPPER_ACT = 11, 3
#: The integrity tests run on both engines that step gymnasium ids, and on EnvPool with two
#: asynchronous lanes (the worker loop overlaps one lane's policy with the other's physics).
ENGINES = pytest.mark.parametrize("engine", ["envpool", "gymnasium", "envpool-lanes"])
ENV_CLASSES = {
    "envpool": EnvPoolEnv,
    "gymnasium": BatchedGymEnv,
    "envpool-lanes": functools.partial(EnvPoolEnv, lanes=2),
}


def by_trajectory(rows: TensorDictBase) -> dict[int, TensorDictBase]:
    """Rows grouped by trajectory id, each group sorted by step count."""
    ids = rows["collector", "traj_ids"]
    out = {}
    for traj in ids.unique().tolist():
        traj_rows = rows[ids == traj]
        order = traj_rows["step_count"].reshape(-1).argsort()
        out[traj] = traj_rows[order]
    return out


def check_integrity(rows: TensorDictBase, time_limit: int) -> dict[str, int]:
    """Asserts transition-level invariants; returns counts of the end kinds seen."""
    done, term, trunc = (rows["next", k].reshape(-1) for k in ("done", "terminated", "truncated"))
    assert torch.equal(done, term | trunc)
    assert not (term & trunc).any(), "a row is both terminated and truncated"
    assert torch.equal(rows["next", "step_count"], rows["step_count"] + 1)
    # Time-limit ends are truncations (the first episodes may be cut earlier by staggering).
    at_limit = rows["next", "step_count"].reshape(-1) >= time_limit
    assert trunc[at_limit].all() and not term[at_limit & ~trunc].any()
    assert (rows["next", "step_count"].reshape(-1)[trunc] <= time_limit).all()
    for traj, t in by_trajectory(rows).items():
        steps = t["step_count"].reshape(-1)
        assert torch.equal(steps, torch.arange(steps[0], steps[0] + len(steps))), f"gap in trajectory {traj}"
        assert torch.equal(t["next", "observation"][:-1], t["observation"][1:]), f"broken chain in trajectory {traj}"
        assert not t["next", "done"][:-1].any(), f"trajectory {traj} continues after done"
    return {"terminated": int(term.sum()), "truncated": int(trunc.sum())}


def hopper_collector(rb, **kwargs) -> OffPolicyCollector:
    defaults = dict(num_workers=2, num_envs=8, frames_per_batch=512, replay_buffer=rb, seed=0,
                    env_kwargs={"max_episode_steps": 60})
    defaults.update(kwargs)
    if defaults.get("engine") == "envpool-lanes":
        del defaults["engine"]
        env = functools.partial(EnvPoolEnv, "Hopper-v5", defaults.pop("num_envs"),
                                env_kwargs=defaults.pop("env_kwargs"), lanes=2)
        return OffPolicyCollector(env, linear_policy(HOPPER_OBS, HOPPER_ACT), **defaults)
    return OffPolicyCollector("Hopper-v5", linear_policy(HOPPER_OBS, HOPPER_ACT), **defaults)


def test_is_a_torchrl_multi_async_collector(no_leaks):
    with hopper_collector(make_replay_buffer(1024), num_workers=1, total_frames=512) as collector:
        assert isinstance(collector, MultiAsyncCollector)
        assert sum(1 for _ in collector) == 1


@ENGINES
def test_integrity_and_ring_wraparound(engine, no_leaks):
    capacity = 12_288
    rb = make_replay_buffer(capacity)
    with hopper_collector(rb, total_frames=-1, engine=engine) as collector:
        # One worker alone can write all 10k frames before the other has started on a loaded 2-core machine:
        # the cap lets the first on one batch at a time until both have written.
        collector.allow_frames(0)
        assert wait_until(lambda: all(collector._pool.started), 180)  # noqa: SLF001
        assert let_worker_write(collector, 0, 0, 10_240) and let_worker_write(collector, 1, 0, 10_240)
        collector.allow_frames(10_240)
        assert collector.wait_for_frames(10_240, timeout=120)
        time.sleep(0.2)  # nothing beyond the allowance may be written
        metrics = collector.metrics()
        assert len(rb) == metrics["frames"] == collector.frames_written == rb.write_count == 10_240
        rows = rb[:]
        counts = check_integrity(rows, time_limit=60)
        assert counts["terminated"] > 0 and counts["truncated"] > 0
        assert counts["terminated"] + counts["truncated"] == metrics["episodes"]
        # trajectory ids are unique across the two workers
        ids = rows["collector", "traj_ids"]
        assert set((ids % 2).unique().tolist()) == {0, 1}

        collector.allow_frames(20_480)  # wraps the ring buffer
        assert collector.wait_for_frames(20_480, timeout=120)
        assert len(rb) == capacity and rb.write_count == 20_480
        check_integrity(rb[:], time_limit=60)


def slow_post_collect_hook(batch: TensorDictBase) -> None:
    time.sleep(0.2)


@pytest.mark.parametrize("with_buffer", [False, True], ids=["yielded", "buffer"])
def test_frames_count_every_batch_handed_over(with_buffer, no_leaks):
    # A worker hands a batch over (or writes it), runs the post-collect hook, adds its metrics, then counts it;
    # the consumer may read the counters in between (the metrics docs example once printed 1792 of 2048 frames
    # after the last batch). The slow hook widens that window to be sure to land in it.
    rb = make_replay_buffer(4096) if with_buffer else None
    with OffPolicyCollector("Pendulum-v1", linear_policy(3, 1), num_workers=2, num_envs=8, frames_per_batch=128,
                            total_frames=2048, seed=0, post_collect_hook=slow_post_collect_hook,
                            replay_buffer=rb) as collector:
        seen = 0
        for batch in collector:
            seen += 128 if with_buffer else batch.numel()
            metrics = collector.metrics()
            assert collector.frames_written >= seen and metrics["frames"] >= seen
            if with_buffer:  # what the consumer waited for is in the per-worker metrics too
                assert sum(worker["frames"] for worker in metrics["workers"]) >= seen
        metrics = collector.metrics()
        assert seen == collector.frames_written == metrics["frames"] == 2048
        if with_buffer:
            assert len(rb) == sum(worker["frames"] for worker in metrics["workers"]) == 2048


@ENGINES
def test_episode_end_keeps_final_observation(engine):
    env = ENV_CLASSES[engine]("Hopper-v5", num_envs=2, seed=3, env_kwargs={"max_episode_steps": 5},
                              stagger_resets=False)
    td = env.reset()
    initial = td["observation"].clone()
    for _ in range(4):
        td["action"] = env.action_spec.zero()
        transition, td = env.step_and_maybe_reset(td)
    assert not transition["next", "done"].any()
    before = td["observation"].clone()
    td["action"] = env.action_spec.zero()
    transition, td = env.step_and_maybe_reset(td)
    assert transition["next", "truncated"].all() and not transition["next", "terminated"].any()
    # the stored next observation is the true final one, the new root observation is the reset one
    assert not torch.allclose(transition["next", "observation"], td["observation"])
    assert torch.equal(transition["observation"], before)
    # reset noise is 5e-3 per coordinate, far below what 5 steps move the hopper
    assert (td["observation"] - initial).abs().max() < 0.02
    assert (transition["next", "observation"] - initial).abs().max() > 0.05
    env.close()


@ENGINES
def test_init_random_frames_exact_and_seeded(engine, no_leaks):
    def random_rows(seed):
        rb = make_replay_buffer(8192)
        with hopper_collector(rb, init_random_frames=1001, total_frames=4096, seed=seed, engine=engine) as collector:
            for _ in collector:
                pass
        rows = rb[:]
        random = rows[rows["policy_version"] == -1]
        return rows, random

    rows_a, random_a = random_rows(seed=7)
    assert len(random_a) == 1001, "init_random_frames must be exact across workers"
    assert (rows_a["policy_version"] != -1).sum() == 4096 - 1001
    _, random_b = random_rows(seed=7)
    key = lambda td: (td["collector", "traj_ids"] * 100_000 + td["step_count"].reshape(-1)).argsort()  # noqa: E731
    a, b = random_a[key(random_a)], random_b[key(random_b)]
    assert torch.equal(a["action"], b["action"]) and torch.equal(a["next", "observation"], b["next", "observation"])
    # every env (2 workers x 8 envs) starts from its own seed
    first = rows_a[rows_a["step_count"].reshape(-1) == 0]
    starts = first[first["collector", "traj_ids"] < 16]["observation"]
    assert len(starts) == 16 and len(torch.unique(starts, dim=0)) == 16
    if engine == "envpool":  # the random actions come from the worker's torch seed, whatever steps the envs
        _, random_c = random_rows(seed=8)
        assert not torch.equal(random_c[key(random_c)]["action"], a["action"])


def test_random_actions_do_not_replay_the_draws_of_the_callers_seed(no_leaks):
    """A script seeds torch with the collector's seed and builds its networks: the workers' random actions
    must not be those draws again (they would be the actor's first-layer weights, scaled)."""
    seed, frames = 5, 256
    torch.manual_seed(seed)  # as the recipes and TorchRL's sota scripts do, then build the actor
    layer = torch.nn.Linear(HOPPER_OBS, 128)
    rb = make_replay_buffer(frames)
    with hopper_collector(rb, num_workers=1, num_envs=1, frames_per_batch=64, total_frames=frames,
                          init_random_frames=frames, seed=seed) as collector:
        for _ in collector:
            pass
    actions = rb[:]["action"].reshape(-1)  # one env: rows in step order, 3 action dims each
    assert len(actions) == frames * HOPPER_ACT and bool(actions.abs().le(1).all())
    bound = HOPPER_OBS ** -0.5  # nn.Linear draws its weight uniformly in [-bound, bound]
    weights = layer.weight.detach().reshape(-1)[: len(actions)] / bound
    torch.manual_seed(seed)
    stream = torch.rand(len(actions)) * 2 - 1  # what an action spec's rand() gives on that stream
    for draws in (weights, stream):
        correlation = torch.corrcoef(torch.stack([actions, draws]))[0, 1]
        assert correlation.abs() < 0.2, (
            f"the workers' random actions follow the caller's seeded draws ({correlation:.3f})")


def test_weight_sync_changes_worker_actions(no_leaks):
    rb = make_replay_buffer(65_536)
    policy = linear_policy(HOPPER_OBS, HOPPER_ACT)
    with OffPolicyCollector("Hopper-v5", policy, num_workers=2, num_envs=8, frames_per_batch=256,
                            replay_buffer=rb, seed=0) as collector:
        collector.start()
        assert collector.wait_for_frames(2048, timeout=60)
        publish_zero_weights(collector, policy)
        assert collector.policy_version == 2
        rows = rows_after_publish(collector, rb, 4096, timeout=60, version=2)
    old, new = rows[rows["policy_version"] == 1], rows[rows["policy_version"] == 2]
    assert len(old) > 0 and len(new) >= 4096 - 2 * 256
    assert (old["action"].abs() > 0).any(dim=-1).all()
    assert torch.equal(new["action"], torch.zeros_like(new["action"])), "workers must act with the zeroed weights"


class ExplodingEnv(BatchedGymEnv):
    """Hopper that raises on its N-th batched step."""

    def __init__(self, fail_at: int, **kwargs):
        super().__init__("Hopper-v5", 4, **kwargs)
        self.fail_at, self.calls = fail_at, 0

    def step_and_maybe_reset(self, tensordict):
        self.calls += 1
        if self.calls == self.fail_at:
            raise RuntimeError(f"simulator exploded at step {self.calls}")
        return super().step_and_maybe_reset(tensordict)


def make_exploding_env():
    return ExplodingEnv(fail_at=200 if os.environ.get("TUL_FAIL_WORKER", "1") else 10**9)


def test_worker_error_surfaces_quickly_and_keeps_data(no_leaks):
    rb = make_replay_buffer(65_536, batch_size=32)
    fns = [lambda: ExplodingEnv(fail_at=10**9), lambda: ExplodingEnv(fail_at=300)]
    collector = OffPolicyCollector(fns, linear_policy(HOPPER_OBS, HOPPER_ACT), num_workers=2,
                                   frames_per_batch=64, replay_buffer=rb, seed=0)
    try:
        collector.start()
        failed_at = None
        with pytest.raises(WorkerError) as info:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                written_before = collector.frames_written
                if failed_at is None and collector._pool.stop_event.is_set():  # noqa: SLF001
                    failed_at = time.monotonic()
                collector.metrics()
                time.sleep(0.01)
        raised_at = time.monotonic()
        err = info.value
        assert err.worker_idx == 1
        assert "simulator exploded at step 300" in str(err) and "step_and_maybe_reset" in err.worker_traceback
        # generous bounds: they catch a hang, not a slow machine (a loaded 2-core runner takes seconds to exit)
        assert failed_at is None or raised_at - failed_at < 15
        assert wait_until(lambda: collector._pool.alive() == 0, timeout=20), "other workers must be stopped"  # noqa: SLF001
        # rows already written stay intact and can still be sampled
        assert len(rb) >= written_before > 0
        check_integrity(rb[: len(rb)], time_limit=1000)
        assert rb.sample().batch_size == torch.Size([32])
    finally:
        collector.shutdown(raise_on_error=False)


def test_shutdown_is_fast_and_clean(no_leaks):
    rb = make_replay_buffer(4096)
    collector = hopper_collector(rb, total_frames=-1)
    collector.start()
    assert collector.wait_for_frames(1024, timeout=60)
    started = time.monotonic()
    collector.shutdown()
    assert time.monotonic() - started < 5
    assert all(not p.is_alive() for p in collector.procs)
    assert len(rb) >= 1024  # rows already written stay


def test_user_scratch_dir_is_kept(tmp_path, no_leaks):
    rb = make_replay_buffer(2048, scratch_dir=tmp_path / "rb")
    with hopper_collector(rb, num_workers=1, total_frames=512) as collector:
        for _ in collector:
            pass
    assert (tmp_path / "rb").is_dir() and len(rb) == 512
    with pytest.raises(FileExistsError, match="scratch_dir"):
        make_replay_buffer(2048, scratch_dir=tmp_path / "rb")


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (dict(create_env_fn="NoSuchEnv-v0"), ValueError, "unknown gymnasium id 'NoSuchEnv-v0'"),
        (dict(create_env_fn="Hoper-v5"), ValueError, "Hopper-v5"),
        (dict(num_envs=0), ValueError, "num_envs must be an int >= 1, got 0"),
        (dict(frames_per_batch=0), ValueError, "frames_per_batch must be an int >= 1, got 0"),
        (dict(total_frames=-5), ValueError, r"total_frames must be -1 \(no limit\) or an int >= 1, got -5"),
        (dict(metrics_window=0), ValueError, "metrics_window must be an int >= 1, got 0"),
        (dict(nonfinite="ignore"), ValueError, r"nonfinite must be one of \('raise', 'drop', 'reset'\), got 'ignore'"),
        (dict(max_worker_restarts=-1), ValueError, "max_worker_restarts must be an int >= 0, got -1"),
        (dict(start_method="fork"), ValueError, r"start_method must be one of \('forkserver', 'spawn'\), got 'fork'"),
        (dict(device="tpu:x"), ValueError, "device must be a torch device or None"),
        (dict(init_random_frames=1.5), ValueError, "init_random_frames must be an int >= 0, got 1.5"),
        (dict(frames_per_batch=[256, 0]), ValueError, r"list of num_workers=1 of them \(one per worker\)"),
        (dict(replay_buffer="capacity-too-small"), ValueError, "capacity 256 is below one batch"),
        (dict(policy=linear_policy(HOPPER_OBS, 2)), ValueError, r"action shape \(8, 2\) differs .* \(8, 3\)"),
        (dict(num_workers=0), ValueError, "num_workers must be an int >= 1, got 0"),
        (dict(create_env_fn=42), TypeError, "create_env_fn must be a gymnasium id"),
        (dict(no_such_option=True), TypeError, "unexpected keyword argument 'no_such_option'"),
        (dict(split_trajs=True, replay_buffer="big"), ValueError, "split_trajs=True splits the batches"),
        (dict(collector_class=MultiAsyncCollector), ValueError, "'collector_class' only as one of"),
        (dict(reset_at_each_iter=True), ValueError, "max_frames_per_traj"),
    ],
)
def test_bad_arguments(kwargs, error, match, no_leaks):
    args = dict(create_env_fn="Hopper-v5", policy=linear_policy(HOPPER_OBS, HOPPER_ACT), num_envs=8,
                frames_per_batch=512, replay_buffer=None)
    if kwargs.get("replay_buffer") == "capacity-too-small":
        kwargs = {"replay_buffer": make_replay_buffer(256)}
    elif kwargs.get("replay_buffer") == "big":
        kwargs = {**kwargs, "replay_buffer": make_replay_buffer(4096)}
    args.update(kwargs)
    with pytest.raises(error, match=match):
        OffPolicyCollector(args.pop("create_env_fn"), args.pop("policy"), **args)


@pytest.mark.parametrize("make_env", [lambda kw: BatchedGymEnv("Pendulum-v1", **kw),
                                      lambda kw: EnvPoolEnv("InvertedPendulum-v5", **kw)], ids=["gymnasium", "envpool"])
def test_staggering_cuts_only_the_first_episode(make_env):
    # InvertedPendulum stays upright for 8 steps of zero action: only time limits end its episodes
    env = make_env(dict(num_envs=4, seed=0, env_kwargs={"max_episode_steps": 8}))
    td = env.reset()
    ends = {i: [] for i in range(4)}
    for t in range(1, 25):
        td["action"] = env.action_spec.zero()
        transition, td = env.step_and_maybe_reset(td)
        for i in transition["next", "truncated"].reshape(-1).nonzero().reshape(-1).tolist():
            ends[i].append(t)
    env.close()
    # first episodes end after 2, 4, 6, 8 steps; every later one runs the full 8
    assert ends == {0: [2, 10, 18], 1: [4, 12, 20], 2: [6, 14, 22], 3: [8, 16, 24]}


ORPHAN_SCRIPT = """
import os, torch
from tensordict.nn import TensorDictModule
from torchrl_unilab import OffPolicyCollector, make_replay_buffer
if __name__ == "__main__":
    policy = TensorDictModule(torch.nn.Linear(3, 1), in_keys=["observation"], out_keys=["action"])
    c = OffPolicyCollector("Pendulum-v1", policy, num_envs=2, frames_per_batch=64,
                           replay_buffer=make_replay_buffer(1000))
    c.start()
    c.wait_for_frames(128, timeout=60)
    print("worker pid", c.procs[0].pid, flush=True)
    os._exit(0)  # the parent dies without shutdown()
"""


def test_workers_exit_when_the_parent_dies(tmp_path):
    import subprocess
    import sys

    script = tmp_path / "orphan.py"
    script.write_text(ORPHAN_SCRIPT)
    # The dying parent cannot remove its buffer directory: keep it inside tmp_path.
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                         env=env)
    assert "worker pid " in out.stdout, out.stdout + out.stderr[-3000:]
    worker_pid = int(out.stdout.split("worker pid ")[1].split()[0])

    def gone() -> bool:
        try:
            os.kill(worker_pid, 0)
        except ProcessLookupError:
            return True
        with open(f"/proc/{worker_pid}/stat") as f:  # a zombie awaiting its reaper counts as gone
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"

    assert wait_until(gone, timeout=5), "an orphaned worker kept running"
    # The killed parent's multiprocessing directory (its fork server's socket) stays, and the next start sweeps it.
    assert [p.name for p in tmp_path.glob("tul_mp_*")], "the killed parent left no directory to sweep"
    sweep = ("from torchrl_unilab.collectors._processes import WorkerPool, process_context\n"
             "pool = WorkerPool(process_context(), target=print, args=(), num_workers=0); pool.start(); pool.stop()")
    subprocess.run([sys.executable, "-c", sweep], check=True, timeout=120, env=env)
    assert not list(tmp_path.glob("tul_mp_*")), "neither swept nor removed at exit"
