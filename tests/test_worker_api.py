"""The seed-compatible function-level API, in real spawned processes."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import queue
import signal
import threading
import time

import pytest
import torch
from conftest import FUNCTION_API_ENV, collector_process, learner_side, wait_until
from torch import nn

from torchrl_unilab import BatchedGymEnv, SharedWeights, WorkerError, layout_of, make_replay_buffer
from torchrl_unilab.collectors.trace import TRACE_PHASES
from torchrl_unilab.worker import (
    CollectorProcess,
    _get_waiting_out_a_drop,
    init_offpolicy_storage,
    make_collector_actor,
    make_pack_slots,
    off_policy_collector_fn,
)

CTX = mp.get_context("spawn")
ENV = FUNCTION_API_ENV


def next_message(q, timeout: float = 60.0):
    return q.get(timeout=timeout)


def test_fills_buffer_and_follows_weight_publishes(no_leaks):
    with learner_side(20_000) as (rb, actor, weights):
        with collector_process(rb, actor, weights, num_envs=4, seed=0, env_steps_per_sync=16) as proc:
            deadline = time.monotonic() + 60
            while rb.write_count < 640 and time.monotonic() < deadline:
                proc.metrics()
                time.sleep(0.05)
            assert rb.write_count >= 640
            last = [m for m in nn.Module.modules(actor) if isinstance(m, nn.Linear)][-1]
            with torch.no_grad():
                last.weight.zero_()
                last.bias[:1] = 10.0  # loc: tanh(10) saturates -> action at the upper bound (2.0)
                last.bias[1:] = -10.0  # tiny scale
            weights.publish(actor)
            start = rb.write_count
            while rb.write_count < start + 640 and time.monotonic() < deadline:
                time.sleep(0.05)
            messages = proc.metrics()
        rows = rb[: rb.write_count]
        new = rows[rows["policy_version"] == 2]
        old = rows[rows["policy_version"] == 1]
        assert len(new) >= 500 and len(old) >= 500
        assert (new["action"] > 1.99).all(), "actions must follow the published weights"
        assert (old["action"] < 1.9).float().mean() > 0.5
        assert messages and {"total_steps", "buffer_size", "mean_return", "terminated_rate", "truncated_rate",
                             "timing", "dropped_messages"} <= set(messages[-1])


def run_lockstep(seed: int, rounds: int):
    """Collects ``rounds + 1`` lock-step chunks and returns the rows written."""
    ready, done = CTX.Queue(), CTX.Queue()
    with learner_side(100_000) as (rb, actor, weights), \
            collector_process(rb, actor, weights, num_envs=4, seed=seed, learning_starts=40, sync_collection=True,
                              collection_ready_queue=ready, trainer_done_queue=done, env_steps_per_sync=8):
        for _ in range(rounds):
            next_message(ready)
            done.put(True)
        next_message(ready)  # the collector is now blocked, waiting for the learner
        return rb[: rb.write_count]


def test_lockstep_is_bit_identical(no_leaks):
    a = run_lockstep(seed=3, rounds=6)
    b = run_lockstep(seed=3, rounds=6)
    assert len(a) == len(b) == 7 * 32
    for key in a.keys(include_nested=True, leaves_only=True):
        assert torch.equal(a[key], b[key]), key
    assert (a["policy_version"] == -1).sum() == 40
    c = run_lockstep(seed=4, rounds=6)
    assert not torch.equal(a["observation"], c["observation"])


def stopped_within(proc: CollectorProcess, seconds: float) -> bool:
    """Sets stop_event and waits for the function's own "stopped" message (not interpreter teardown)."""
    started = time.time()
    proc.stop_event.set()
    while time.time() - started < 10:
        message = proc.metrics_queue.get(timeout=10)
        if message["type"] == "stopped":
            return message["time"] - started < seconds
    return False


def test_stop_event_ends_blocked_lockstep_within_2s(no_leaks):
    ready, done = CTX.Queue(), CTX.Queue()
    with learner_side(1000) as (rb, actor, weights), \
            collector_process(rb, actor, weights, sync_collection=True, collection_ready_queue=ready,
                              trainer_done_queue=done) as proc:
        next_message(ready)  # blocked in lock-step now
        time.sleep(0.3)
        assert proc.process.is_alive() and rb.write_count == 2
        assert stopped_within(proc, 2.0)
        proc.process.join(10)
        assert proc.process.exitcode == 0


def test_stop_event_ends_free_running_within_2s(no_leaks):
    with learner_side(5000) as (rb, actor, weights), \
            collector_process(rb, actor, weights, metrics_queue=CTX.Queue(maxsize=100_000)) as proc:
        deadline = time.monotonic() + 60
        while rb.write_count < 100 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert stopped_within(proc, 2.0)


def expected_rows(rb, meta):
    generator = torch.Generator().manual_seed(meta["seed"])
    index = torch.randint(meta["buffer_size"], (meta["batch_size"],), generator=generator)
    return rb.storage.get(index)


def check_slot(slot, rows):
    for key in slot.keys(include_nested=True, leaves_only=True):
        assert torch.equal(slot[key], rows[key]), key


def test_packing_honours_seed_min_writes_and_wraparound(tmp_path, no_leaks):
    trace = tmp_path / "trace.json"
    requests, packed = CTX.Queue(), CTX.Queue()
    with learner_side(80) as (rb, actor, weights):  # 32 frames per write: wraps on the third write
        slots = make_pack_slots(rb, batch_size=16)
        ready, done, stop = CTX.Queue(), CTX.Queue(), CTX.Event()
        proc = CTX.Process(target=off_policy_collector_fn, daemon=True, kwargs=dict(
            stop_event=stop, env_name=ENV, num_envs=4, replay_buffer=rb, weight_sync_name=weights.name,
            weight_param_shapes=layout_of(actor), actor_hidden_dim=16, seed=0, sync_collection=True,
            collection_ready_queue=ready, trainer_done_queue=done, env_steps_per_sync=8, trace_enabled=str(trace),
            trace_thread_time=True,
            collector_pack_request_queue=requests, collector_pack_ready_queue=packed,
            collector_pack_shared_slots=slots))
        proc.start()
        try:
            next_message(ready)
            assert rb.write_count == 32
            # 1. a request for rows not written yet waits until the write count is reached
            requests.put({"batch_size": 16, "seed": 11, "min_writes": 100, "request_id": 0})
            meta = None
            while meta is None:
                done.put(True)
                next_message(ready)
                try:
                    slot_id, meta = packed.get_nowait()
                except queue.Empty:
                    continue
            assert meta["write_count"] >= 100 and slot_id == 0
            # 2. served while the collector is blocked: the buffer has wrapped (capacity 80)
            assert rb.write_count > 80 and len(rb) == 80
            requests.put((16, 12, 0, 1))
            slot_id, meta = packed.get(timeout=30)
            assert slot_id == 1 and meta["buffer_size"] == 80 and meta["write_count"] == rb.write_count
            check_slot(slots[1], expected_rows(rb, meta))
            requests.put((16, 12, 0, 2))  # the same seed selects the same rows, into slot 0 this time
            slot_id, meta2 = packed.get(timeout=30)
            assert slot_id == 0
            check_slot(slots[0], slots[1])
        finally:
            stop.set()
            proc.join(30)  # a loaded machine can take seconds to end a process; a hang never ends
    assert proc.exitcode == 0
    events = json.loads(trace.read_text())["traceEvents"]
    names = {e["name"] for e in events if e["ph"] == "X"}
    assert names == set(TRACE_PHASES)
    assert all("tdur" in e for e in events if e["ph"] == "X")


def test_unknown_kwarg_and_bad_values():
    with pytest.raises(TypeError, match="unexpected keyword argument 'learnign_starts'"):
        off_policy_collector_fn(None, ENV, 2, None, "x", [], learnign_starts=5)
    with learner_side(100) as (rb, actor, weights):
        with pytest.raises(ValueError, match=r"sim_backend must be one of \('mujoco',\), got 'isaac'"):
            off_policy_collector_fn(None, ENV, 2, rb, weights.name, layout_of(actor), sim_backend="isaac")
        with pytest.raises(ValueError,
                           match=r"algo_type must be one of \('sac', 'td3', 'sac_priv', 'td3_priv'\), got 'ppo'"):
            off_policy_collector_fn(None, ENV, 2, rb, weights.name, layout_of(actor), algo_type="ppo")
        with pytest.raises(ValueError, match="storage is not laid out"):
            off_policy_collector_fn(None, ENV, 2, make_replay_buffer(10), weights.name, layout_of(actor))


def test_subprocess_crash_reaches_parent_with_traceback(no_leaks):
    with learner_side(100) as (rb, actor, weights), \
            collector_process(rb, actor, weights, env_name="NoSuchEnv-v1") as proc:
        proc.process.join(60)
        assert proc.process.exitcode not in (None, 0)
        with pytest.raises(WorkerError) as info:
            proc.metrics()
        assert "unknown gymnasium id 'NoSuchEnv-v1'" in str(info.value)
        assert "Traceback" in info.value.worker_traceback and "make_gym_env" in info.value.worker_traceback


def test_a_killed_collector_process_is_reported_by_its_signal(no_leaks):
    """CollectorProcess runs on the collector's worker pool: a SIGKILL is named, and nothing is left behind."""
    with learner_side(5000) as (rb, actor, weights), collector_process(rb, actor, weights) as proc:
        deadline = time.monotonic() + 120  # a first start can take a minute on a loaded 2-core machine
        while rb.write_count < 200 and time.monotonic() < deadline:
            proc.metrics()
            time.sleep(0.05)
        assert rb.write_count >= 200
        os.kill(proc.process.pid, signal.SIGKILL)
        # Not proc.process.join(): the pool's watcher thread polls the same Popen, and two threads reading a
        # forkserver child's exit status race for it (the loser reads EOF, which multiprocessing reports as 255).
        # Its sentinel turns readable once the status is there, and waiting on it reads nothing.
        assert mp.connection.wait([proc.process.sentinel], 30)
        with pytest.raises(WorkerError, match="process killed by SIGKILL without reporting an exception"):
            proc.metrics()


def test_metrics_queue_drops_oldest_when_full(no_leaks):
    q = CTX.Queue(maxsize=2)
    with learner_side(5000) as (rb, actor, weights):
        with collector_process(rb, actor, weights, metrics_queue=q) as proc:
            deadline = time.monotonic() + 60
            while rb.write_count < 400 and time.monotonic() < deadline:
                time.sleep(0.05)  # nobody reads the queue meanwhile
            messages = proc.metrics()
        assert 1 <= len(messages) <= 2
        assert messages[-1]["dropped_messages"] > 0
        assert messages[-1]["total_steps"] > 100


def test_reading_metrics_waits_out_the_worker_dropping_the_oldest():
    """While the worker holds the queue's read lock (to drop the oldest message), a reader still gets the messages."""
    q = CTX.Queue(maxsize=2)
    try:
        q.put({"type": "metrics", "n": 1})
        assert wait_until(lambda: not q.empty())
        q._rlock.acquire()  # noqa: SLF001 - the lock _put_dropping_oldest's get_nowait takes in the worker
        releaser = threading.Timer(0.1, q._rlock.release)  # noqa: SLF001
        releaser.start()
        with pytest.raises(queue.Empty):
            q.get_nowait()  # what the reader did: the queue looked empty
        assert _get_waiting_out_a_drop(q) == {"type": "metrics", "n": 1}
        releaser.join()
        started = time.monotonic()
        with pytest.raises(queue.Empty):
            _get_waiting_out_a_drop(q)  # a queue that is empty is not waited on
        assert time.monotonic() - started < 0.4
    finally:
        q.close()
        q.join_thread()


@pytest.mark.parametrize("algo", ["td3_priv", "sac_priv"])
def test_privileged_actor_reads_the_privileged_context_in_real_workers(algo, no_leaks):
    """sac_priv / td3_priv end to end: the workers' actor acts on the privileged vector the env transform writes."""
    from torchrl.envs import TransformedEnv

    from torchrl_unilab import PrivilegedInfoTransform
    from torchrl_unilab.modules.exploration import make_exploration_policy, sample_offpolicy_actions

    env_name, privileged = "InvertedPendulum-v5", {"mujoco": ("qvel",)}  # cart and pole velocities
    rb = make_replay_buffer(20_000)
    init_offpolicy_storage(rb, env_name, privileged=privileged)
    env = TransformedEnv(BatchedGymEnv(env_name, 1), PrivilegedInfoTransform(**privileged))
    actor = make_collector_actor(algo, env, actor_hidden_dim=8, use_layer_norm=False)
    obs_dim = env.observation_spec["observation"].shape[-1]
    env.close()
    # Route one input through: the first output (td3: the action; sac: the mean) is 100 * qvel[0] before the tanh.
    linears = [m for m in actor.modules() if isinstance(m, nn.Linear)]
    with torch.no_grad():
        for layer in linears:
            layer.weight.zero_()
            layer.bias.zero_()
        linears[0].weight[0, obs_dim] = 1.0  # relu(+v)
        linears[0].weight[1, obs_dim] = -1.0  # relu(-v)
        linears[1].weight[0, 0] = linears[1].weight[1, 1] = 1.0
        linears[2].weight[0, 0], linears[2].weight[0, 1] = 100.0, -100.0
        if algo == "sac_priv":
            linears[2].bias[1] = -20.0  # a tiny scale: the sample is the mean
    weights = SharedWeights.create(actor)
    try:
        with CollectorProcess(env_name=env_name, num_envs=4, replay_buffer=rb, weight_sync_name=weights.name,
                              weight_param_shapes=layout_of(actor), algo_type=algo, actor_hidden_dim=8,
                              use_layer_norm=False, privileged=privileged, seed=0) as proc:
            deadline = time.monotonic() + 90
            while rb.write_count < 400 and time.monotonic() < deadline:
                proc.metrics()
                time.sleep(0.05)
        rows = rb[: rb.write_count]
        assert len(rows) >= 400 and rows["privileged"].shape[-1] == 2
        velocity = rows["privileged"][:, 0]
        moving = velocity.abs() > 0.05
        assert moving.sum() > 50
        # the action's sign follows the privileged cart velocity. TD3's exploration noise (a std per env up to 0.4
        # of the half-range) flips it only 2.5 stds out, where the action is 0.9999 of the bound: under 1 % of rows
        agree = (torch.sign(rows["action"][moving, 0]) == torch.sign(velocity[moving])).double().mean()
        assert agree >= (0.95 if algo == "td3_priv" else 1.0), f"{agree:.3f} of the moving rows act on the velocity"
    finally:
        weights.close()
    # the learner-side sampler takes the same context
    policy = make_exploration_policy(actor, algo.removesuffix("_priv"), actor.spec)
    action = sample_offpolicy_actions(policy, algo, torch.zeros(3, obs_dim), torch.zeros(3),
                                      priv_info_torch=torch.tensor([[1.0, 0.0], [-1.0, 0.0], [1.0, 0.0]]))
    assert torch.equal(torch.sign(action[:, 0]), torch.tensor([1.0, -1.0, 1.0]))
    with pytest.raises(ValueError, match="needs priv_info_torch"):
        sample_offpolicy_actions(policy, algo, torch.zeros(3, obs_dim), torch.zeros(3))
