"""Collection across Ray nodes: real Ray (a local cluster), real worker processes, real envs.

One Ray cluster serves the whole module (``ray.init(num_cpus=2)``): Ray takes
seconds to start on a busy 2-core machine. Each "node" is a Ray actor running a
:class:`~torchrl_unilab.collectors.ray_collector.RayNodeCollector`; on one machine they
stand in for collector machines. Faults are real: an env that raises inside a
worker, and ``ray.kill`` of a node's actor.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import pytest
import torch
from conftest import needs_extra

ray = needs_extra("ray", "ray")

import cloudpickle  # noqa: E402
import conftest  # noqa: E402
from conftest import (  # noqa: E402
    RaiseAfter,
    linear_policy,
    shm_entries,
    start_after_waits_that_could_never_end,
    wait_until,
)
from torchrl.data import LazyTensorStorage, ReplayBuffer, RoundRobinWriter  # noqa: E402
from torchrl.envs import GymEnv, Transform, TransformedEnv  # noqa: E402

from torchrl_unilab import BatchedGymEnv, OffPolicyCollector, make_replay_buffer  # noqa: E402
from torchrl_unilab._residue import (  # noqa: E402
    SCRATCH_PREFIX,
    SHM_DIR,
    WEIGHTS_PREFIX,
    left_by,
    multiprocessing_helpers,
    running,
    sweep_stale,
)
from torchrl_unilab.collectors.ray_collector import NodeError, RayOffPolicyCollector  # noqa: E402
from torchrl_unilab.weight_update.weight_sync import sweep_stale_blocks  # noqa: E402

# Ray actors unpickle this module's env factories (and conftest's fault transform) without importing them.
for _module in (sys.modules[__name__], conftest):
    ray.cloudpickle.register_pickle_by_value(_module)
    cloudpickle.register_pickle_by_value(_module)

NODE = {"num_cpus": 1}  # two nodes fill the 2-CPU test cluster


@pytest.fixture(scope="module", autouse=True)
def ray_cluster():
    ray.init(num_cpus=2, include_dashboard=False)
    yield
    ray.shutdown()


@pytest.fixture(autouse=True)
def no_shm_residue():
    """Nodes, their workers and the learner leave nothing in /dev/shm (every entry counts under CI)."""
    before = shm_entries()
    yield
    assert wait_until(lambda: not shm_entries() - before, timeout=10), sorted(shm_entries() - before)


def _proc_table() -> dict[int, tuple[int, str]]:
    """``{pid: (parent pid, state)}`` of every live process, from /proc."""
    table = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                table[int(entry)] = (int(fields[1]), fields[0])
    return table


def descendants(pid: int) -> list[int]:
    table, out, frontier = _proc_table(), [], [pid]
    while frontier:
        parent = frontier.pop()
        children = [p for p, (ppid, _) in table.items() if ppid == parent]
        out += children
        frontier += children
    return out


def cmdline(pid: int) -> str:
    with contextlib.suppress(OSError), open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read().replace(b"\0", b" ").decode(errors="replace")
    return ""


def actor_pid(host: str) -> int:
    """The node actor's process id in its ``node_hosts`` entry (``"host (pid N)"``)."""
    return int(host.rsplit("(pid ", 1)[1].rstrip(")"))


def node_processes(collector: RayOffPolicyCollector) -> list[int]:
    """PIDs of every node actor and of its worker processes."""
    actors = [actor_pid(host) for host in collector.node_hosts]
    return actors + [child for pid in actors for child in descendants(pid)]


def gone(pids: list[int]) -> bool:
    """Every one of ``pids`` has exited (a zombie awaiting its reaper counts as exited)."""
    return not any(running(pid) for pid in pids)


def test_two_nodes_fill_the_learner_buffer_and_a_publish_reaches_them():
    """2 nodes x 1 worker: whole transitions, ids unique over nodes, exact random frames, weights by Ray."""
    rb = make_replay_buffer(100_000)
    random_frames, frames = 96, 1024
    collector = RayOffPolicyCollector(
        "Pendulum-v1", linear_policy(3, 1), num_nodes=2, num_workers=1, num_envs=4, frames_per_batch=32,
        init_random_frames=random_frames, seed=0, replay_buffer=rb, remote_configs=NODE,
    )
    pids = node_processes(collector)
    assert len(pids) >= 4, "each node runs its own worker process"
    try:
        # first ready, first served: a node that started late may deliver late, so collect until both delivered
        def rows_per_node() -> list[int]:
            node = rb[: len(rb)]["collector", "traj_ids"] % 2  # trajectory id % num_nodes = node
            return [int((node == k).sum()) for k in range(2)]

        deadline = time.monotonic() + 180  # a node's worker may take long to start on a loaded machine
        while True:
            collector.allow_frames(frames)
            assert collector.wait_for_frames(frames, timeout=120)
            if min(rows_per_node()) >= 64 or time.monotonic() > deadline:
                break
            frames = min(frames + 256, rb.storage.max_size - 1024)
        assert min(rows_per_node()) >= 64, (rows_per_node(), collector.metrics()["nodes"])
        data = rb[: len(rb)]
        traj = data["collector", "traj_ids"]
        # exact random frames over all nodes and workers: each node's first 48 rows (its share) and no more
        random_rows = data["policy_version"] == -1
        assert [int(random_rows[traj % 2 == k].sum()) for k in range(2)] == [random_frames // 2] * 2
        # every trajectory is one chain of whole transitions: consecutive steps, obs' -> obs
        for tid in traj.unique().tolist():
            rows = data[traj == tid]
            order = rows["step_count"].squeeze(-1).argsort()
            rows = rows[order]
            steps = rows["step_count"].squeeze(-1)
            assert torch.equal(steps, torch.arange(int(steps[0]), int(steps[0]) + len(steps))), \
                f"trajectory {tid} has repeated or missing steps: two nodes would share an id"
            assert torch.equal(rows["next", "observation"][:-1], rows["observation"][1:])

        # a publish reaches the remote workers through Ray, then the node's shared memory
        policy = collector.policy
        with torch.no_grad():
            for p in policy.parameters():
                p.zero_()
            policy.module[0].bias.fill_(0.5)
        collector.update_policy_weights_()
        assert collector.policy_version == 2
        target = collector.frames_written + 512
        collector.allow_frames(target)
        assert collector.wait_for_frames(target, timeout=120)
        data = rb[: len(rb)]
        new = data["policy_version"] == 2
        assert new.any(), "no row collected with the published weights"
        assert torch.allclose(data["action"][new], torch.tanh(torch.tensor(0.5)))
        old = data["policy_version"] == 1
        assert not torch.allclose(data["action"][old], torch.tanh(torch.tensor(0.5)))
        assert int(data["policy_version"].max()) == 2
    finally:
        collector.shutdown()
    # no node actor and no worker process outlives the shutdown, nor their fork servers' directories
    assert wait_until(lambda: gone(pids), timeout=15), [p for p in pids if not gone([p])]
    left = [e for e in os.listdir(tempfile.gettempdir()) if any(e.startswith(f"tul_mp_{pid}_") for pid in pids)]
    assert not left, f"the node actors' fork server directories outlived a clean shutdown: {left}"


def pendulum() -> GymEnv:
    return GymEnv("Pendulum-v1")


def node_pids(collector) -> list[int]:
    """The processes of TorchRL's RayCollector's node actors."""
    return [pid for actor in collector.remote_collectors
            for pid in [ray.get(actor.__ray_call__.remote(lambda self: os.getpid()))]]


def test_torchrl_ray_collector_runs_our_class_and_updates_its_weights():
    """TorchRL's own RayCollector with collector_class=OffPolicyCollector: each node builds our collector, receives
    the learner's weights through TorchRL's RayWeightSyncScheme (register_scheme_receiver), and publishes them to
    its workers."""
    from torchrl.collectors.distributed import RayCollector

    before = shm_entries()
    policy = linear_policy(3, 1)
    collector = RayCollector([pendulum], policy, collector_class=OffPolicyCollector,
                             collector_kwargs={"num_envs": 1}, num_collectors=1, frames_per_batch=64,
                             total_frames=64 * 20, remote_configs=NODE)
    try:
        batches = iter(collector)
        first = next(batches)
        assert first.numel() == 64 and torch.isfinite(first["action"]).all()
        assert not torch.allclose(first["action"], torch.tanh(torch.tensor(0.5)))
        with torch.no_grad():
            for p in policy.parameters():
                p.zero_()
            policy.module[0].bias.fill_(0.5)
        collector.update_policy_weights_()
        # batches already collected with the old weights may still arrive; one with the new ones follows
        assert any(torch.allclose(next(batches)["action"], torch.tanh(torch.tensor(0.5))) for _ in range(6))
        pids = node_pids(collector)
    finally:
        collector.shutdown()
    # RayCollector ends its nodes with ray.kill: a node's weight block, named after its pid, is what is left, and
    # the next block created on the machine (or sweep_stale_blocks) removes it
    assert wait_until(lambda: gone(pids), timeout=15)
    left = shm_entries() - before
    assert left <= {entry for pid in pids for entry in left_by(pid)["shm"]}, left
    sweep_stale_blocks()
    assert not [entry for pid in pids for entry in left_by(pid)["shm"]]


def test_a_node_built_in_the_learners_process_keeps_its_fork_server():
    """Only a node inside its Ray actor removes the fork server's directory at shutdown: here, collectors
    built after it still start their workers (removed, every later start failed with FileNotFoundError)."""
    from torchrl_unilab.collectors.ray_collector import RayNodeCollector

    for _ in range(2):
        node = RayNodeCollector(["Pendulum-v1"], linear_policy(3, 1), worker_idx=0, num_nodes=1, num_workers=1,
                                num_envs=2, frames_per_batch=32, init_random_frames=32, seed=0)
        try:
            assert node.next().shape == torch.Size([32])
        finally:
            node.shutdown()


def test_observation_statistics_travel_to_the_nodes_with_the_weights():
    """obs_norm: the learner's normaliser statistics reach the remote workers; the buffer keeps raw observations."""
    from torchrl_unilab import ObservationNormalizer

    rb = make_replay_buffer(20_000)
    normalizer = ObservationNormalizer(3)
    policy = linear_policy(3, 1)
    with torch.no_grad():  # action = tanh(normalised cos(theta))
        policy.module[0].weight.copy_(torch.tensor([[1.0, 0.0, 0.0]]))
        policy.module[0].bias.zero_()
    collector = RayOffPolicyCollector(
        "Pendulum-v1", policy, num_nodes=1, num_workers=1, num_envs=4, frames_per_batch=32, seed=0,
        replay_buffer=rb, remote_configs=NODE, collector_kwargs={"obs_norm": normalizer},
    )
    pids = node_processes(collector)
    try:
        collector.allow_frames(256)
        assert collector.wait_for_frames(256, timeout=120)
        with torch.no_grad():  # a mean of 10 sends every normalised cos(theta) to about -10: tanh saturates at -1
            normalizer.mean.copy_(torch.tensor([10.0, 0.0, 0.0], dtype=torch.float64))
            normalizer.count.fill_(100.0)
        collector.update_policy_weights_()
        target = collector.frames_written + 512
        collector.allow_frames(target)
        assert collector.wait_for_frames(target, timeout=120)
        data = rb[: len(rb)]
        new, old = data["policy_version"] == 2, data["policy_version"] == 1
        assert new.any() and old.any()
        assert (data["action"][new] < -0.99).all(), "the nodes did not normalise with the published statistics"
        assert (data["action"][old] > -0.8).all()  # tanh(cos(theta)) before the publish
        assert data["observation"][:, 0].abs().max() <= 1.0  # stored raw: cos(theta), not normalised
    finally:
        collector.shutdown()
    assert wait_until(lambda: gone(pids), timeout=15), [p for p in pids if not gone([p])]
    with pytest.raises(TypeError, match=r"collector_kwargs\['obs_norm'\] must be the learner's ObservationNormalizer"):
        RayOffPolicyCollector("Pendulum-v1", policy, num_nodes=1, frames_per_batch=32,
                              collector_kwargs={"obs_norm": True})


def test_nodes_write_to_a_ray_replay_buffer_and_lost_nodes_are_reported():
    """RayReplayBuffer path; a killed node is reported within 10 s: warned under "continue", raised under "raise"."""
    # compilable: TorchRL's default counters are mp.Value-s, whose named semaphores outlive the buffer's actor,
    # which rrb.shutdown() kills
    rrb = ReplayBuffer(storage=functools.partial(LazyTensorStorage, 10_000, compilable=True),
                       writer=functools.partial(RoundRobinWriter, compilable=True), batch_size=64,
                       service_backend="ray", service_backend_options={"remote_config": {"num_cpus": 0}})
    collector = RayOffPolicyCollector(
        "Pendulum-v1", linear_policy(3, 1), num_nodes=2, num_workers=1, num_envs=4, frames_per_batch=32,
        init_random_frames=64, seed=1, replay_buffer=rrb, on_node_failure="continue", remote_configs=NODE,
    )
    pids = node_processes(collector)
    try:
        collector.allow_frames(256)
        assert collector.wait_for_frames(256, timeout=120)
        assert len(rrb) >= 256 and rrb.sample()["observation"].shape == (64, 3)

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            # by now each node's next batch has been fetched while the learner holds back, so neither has a
            # call in flight whose failure would show: the loss must be found all the same
            time.sleep(1.5)
            ray.kill(collector.remote_collectors[0])
            start = time.monotonic()
            assert wait_until(lambda: collector.lost_nodes == [0], timeout=10), "lost node not reported within 10 s"
            assert time.monotonic() - start < 10
        assert any("collector node 0" in str(w.message) and "was lost" in str(w.message) for w in caught)
        # the other node goes on, and still receives weights
        collector.update_policy_weights_()
        target = collector.frames_written + 256
        collector.allow_frames(target)
        assert collector.wait_for_frames(target, timeout=60)

        collector.on_node_failure = "raise"
        ray.kill(collector.remote_collectors[1])
        start = time.monotonic()
        collector.allow_frames(None)
        with pytest.raises(NodeError, match="collector node 1 on .* failed: its Ray actor was lost"):
            collector.wait_for_frames(10**9, timeout=10)
        assert time.monotonic() - start < 10
    finally:
        collector.shutdown(raise_on_error=False)
        rrb.shutdown()
    # a killed actor cannot remove its scratch buffer directory nor its weight block; the next collector
    # to start sweeps them (by their dead creator's pid), as the test does here
    reap_killed_nodes(pids)


def reap_killed_nodes(pids: list[int]) -> None:
    """The killed node actors' processes are gone; what they could not remove is swept, as the next collector does."""
    assert wait_until(lambda: gone(pids), timeout=15), "a lost node's processes outlived it"
    sweep_stale(tempfile.gettempdir(), SCRATCH_PREFIX)
    sweep_stale(SHM_DIR, WEIGHTS_PREFIX)


@pytest.mark.timeout(600)  # its own waits (a cold cluster, a replacement node's start) add up past the suite's 300 s
def test_a_killed_node_actor_is_replaced_and_training_goes_on():
    """max_node_restarts=1: ray.kill of the node's actor just before a publish starts a new one.

    The publish returns (rather than raise Ray's ActorDiedError, which would end the recipe), the learner
    keeps what it received, the replacement acts with the published weights and receives the next publish,
    and the loss after the last restart is raised.
    """
    rb = make_replay_buffer(20_000)
    collector = RayOffPolicyCollector(
        "Pendulum-v1", linear_policy(3, 1), num_nodes=1, num_workers=1, num_envs=4, frames_per_batch=32,
        init_random_frames=64, seed=0, replay_buffer=rb, remote_configs=NODE, max_node_restarts=1,
    )
    first, first_host = node_processes(collector), collector.node_hosts[0]
    second: list[int] = []

    def publish(bias: float) -> None:
        with torch.no_grad():
            for param in collector.policy.parameters():
                param.zero_()
            collector.policy.module[0].bias.fill_(bias)
        collector.update_policy_weights_()

    try:
        collector.allow_frames(256)
        assert collector.wait_for_frames(256, timeout=120)
        received = rb[: len(rb)].clone()
        ray.kill(collector.remote_collectors[0])
        publish(0.5)
        target = collector.frames_written + 256
        collector.allow_frames(target)
        assert collector.wait_for_frames(target, timeout=180)
        metrics = collector.metrics()
        assert metrics["node_restarts"] == 1 and metrics["lost_nodes"] == []
        # named by its own answer, which the learner does not wait for
        assert wait_until(lambda: "pid" in collector.node_hosts[0], timeout=30), collector.node_hosts
        assert collector.node_hosts[0] != first_host
        assert wait_until(lambda: gone(first), timeout=15), "the lost node's processes outlived it"
        second = node_processes(collector)
        assert not set(second) & set(first)
        data = rb[: len(rb)]
        assert (data[: len(received)] == received).all(), "the learner lost batches it had received"
        replacement = data["collector", "traj_ids"] >= (1 << 44)
        assert replacement.any(), "no rows from the replacement"
        # the random frames were all owed and collected already; the replacement is built from the policy
        # as it is now: it acts with the weights published while it was lost
        assert int((data["policy_version"] == -1).sum()) == 64
        assert torch.allclose(data["action"][replacement], torch.tanh(torch.tensor(0.5)))

        # a publish reaches the replacement through Ray, with the learner's version: the weights given, not
        # collector.policy's (the replacement acted with those, under the new version)
        given = linear_policy(3, 1)
        with torch.no_grad():
            given.module[0].weight.zero_()
            given.module[0].bias.fill_(-0.5)
        collector.update_policy_weights_(given)
        target = collector.frames_written + 256
        collector.allow_frames(target)
        assert collector.wait_for_frames(target, timeout=120)
        data = rb[: len(rb)]
        new = data["policy_version"] == collector.policy_version
        assert new.any() and torch.allclose(data["action"][new], torch.tanh(torch.tensor(-0.5)))

        # no restart left: the next loss is raised
        ray.kill(collector.remote_collectors[0])
        collector.allow_frames(None)
        with pytest.raises(NodeError, match="collector node 0 on .* failed: its Ray actor was lost"):
            collector.wait_for_frames(10**9, timeout=30)
    finally:
        collector.shutdown(raise_on_error=False)
    reap_killed_nodes(first + second)


@pytest.mark.timeout(600)
def test_a_replacement_is_not_owed_the_random_frames_of_a_batch_its_node_finished():
    """A node lost while its finished batch waits for the learner: that batch is delivered, so its random frames
    are not owed to the replacement again (they were: 320 random rows for init_random_frames=256)."""
    rb = make_replay_buffer(400_000)  # node 0 collects on while the replacement starts: nothing is overwritten
    collector = RayOffPolicyCollector(
        "Pendulum-v1", linear_policy(3, 1), num_nodes=2, num_workers=1, num_envs=4, frames_per_batch=64,
        init_random_frames=256, seed=0, replay_buffer=rb, remote_configs=NODE, max_node_restarts=1,
    )
    first = node_processes(collector)
    try:
        collector.allow_frames(1)  # one batch, then hold: the nodes' next batches wait in the learner
        assert collector.wait_for_frames(64, timeout=120)
        assert wait_until(lambda: len(collector._fetched) == 2, timeout=60)  # noqa: SLF001
        waiting = {collector._pending[f] for f in collector._fetched}  # noqa: SLF001
        assert waiting == {0, 1}
        ray.kill(collector.remote_collectors[1])
        assert wait_until(lambda: collector.node_restarts[1] == 1, timeout=60)
        collector.allow_frames(None)

        def replacement_rows() -> int:  # its trajectory ids come from a block of their own
            return int((rb[: len(rb)]["collector", "traj_ids"] >= (2 << 44)).sum())

        assert wait_until(lambda: replacement_rows() >= 128, timeout=180)
        collector.allow_frames(0)
        data = rb[: len(rb)]
        random = data["policy_version"] == -1
        node = data["collector", "traj_ids"] % 2
        assert [int((random & (node == i)).sum()) for i in (0, 1)] == [128, 128]
    finally:
        collector.shutdown(raise_on_error=False)
    reap_killed_nodes(first)


@pytest.mark.timeout(600)
def test_a_node_lost_to_its_batch_call_and_its_ping_is_replaced_once():
    """A node idle with a finished batch is pinged. SIGKILLed (as the soak kills it: Ray learns of the death a
    moment later), its loss shows to a ping sent meanwhile and to the batch call the learner makes once it takes
    that batch; when the batch call sees it first, the stale ping must not replace the replacement (a node
    replaced twice for one kill)."""
    rb = make_replay_buffer(400_000)
    collector = RayOffPolicyCollector(
        "Pendulum-v1", linear_policy(3, 1), num_nodes=2, num_workers=1, num_envs=4, frames_per_batch=64,
        init_random_frames=0, seed=0, replay_buffer=rb, remote_configs=NODE, max_node_restarts=3,
    )
    first = node_processes(collector)
    try:
        collector.allow_frames(1)  # one batch, then hold: both nodes' next batches wait, and the nodes are pinged
        assert collector.wait_for_frames(64, timeout=120)
        # both nodes have a finished batch waiting, so each is pinged in turn (an idle node's ping is in flight
        # every other pass, so the two need not be in flight at once): the second node's start-up (its worker's
        # torch import) can take minutes on a loaded machine
        pinged: set[int] = set()

        def both_nodes_pinged() -> bool:
            pinged.update(idx for idx, _ in list(collector._pings.values()))  # noqa: SLF001
            return pinged == {0, 1} and "pid" in collector.node_hosts[1]

        assert wait_until(both_nodes_pinged, timeout=180)
        lost = collector.remote_collectors[1]
        # the collection thread checks its nodes under its pacing lock: the order of the two failures is the test's
        with collector._delivered._cond:  # noqa: SLF001
            pings = collector._pings  # noqa: SLF001
            ray.get(list(pings), timeout=60)  # both nodes are alive: they answer what is in flight
            pings.clear()  # taken here, so no ping is left in flight when node 1 is killed
            assert collector.node_restarts == [0, 0]
            os.kill(actor_pid(collector.node_hosts[1]), signal.SIGKILL)
            collector._watch_nodes()  # noqa: SLF001  pings both nodes; node 1's answer is not in yet
            batch_call = lost.next.remote()  # what the learner asks a node for after taking its batch
            collector._pending[batch_call] = 1  # noqa: SLF001
            collector._fetch([batch_call])  # noqa: SLF001  the batch call sees the loss first: replaced
            assert collector.node_restarts == [0, 1]
            ray.wait(list(collector._pings), num_returns=len(collector._pings), timeout=60)  # noqa: SLF001
            collector._watch_nodes()  # noqa: SLF001  then the ping's failure is read
            assert collector.node_restarts == [0, 1], "a stale ping replaced the replacement"
        collector.allow_frames(None)

        def replacement_rows() -> int:  # its trajectory ids come from a block of their own
            return int((rb[: len(rb)]["collector", "traj_ids"] >= (2 << 44)).sum())

        assert wait_until(lambda: replacement_rows() >= 128, timeout=180)
        assert collector.node_restarts == [0, 1] and collector.metrics()["lost_nodes"] == []
    finally:
        collector.shutdown(raise_on_error=False)
    reap_killed_nodes(first)


def crashing_env():
    return TransformedEnv(BatchedGymEnv("Pendulum-v1", 2), RaiseAfter(40, "boom from the env on the remote node"))


def test_a_remote_worker_crash_reaches_the_learner_with_its_traceback():
    collector = RayOffPolicyCollector(
        crashing_env, linear_policy(3, 1), num_nodes=1, num_workers=1, num_envs=2, frames_per_batch=16,
        total_frames=10_000, seed=0, remote_configs=NODE,
    )
    pids = node_processes(collector)
    try:
        with pytest.raises(NodeError) as info:
            for _ in collector:
                pass
    finally:
        collector.shutdown(raise_on_error=False)
    err = info.value
    assert (err.node_idx, err.worker_idx) == (0, 0)
    text = str(err)
    assert text.startswith(f"collector node 0 on {collector.node_hosts[0]}, worker 0 failed:")
    assert "boom from the env on the remote node" in text
    assert "Remote traceback" in text and "in _step" in text, text
    assert wait_until(lambda: gone(pids), timeout=15)


def test_node_batches_trajectory_limits_and_waits_that_could_never_end():
    """frames_per_batch rounded up by the nodes is what the learner counts (it counted 32 for 33-row batches);
    max_frames_per_traj and trust_policy in collector_kwargs reach the nodes (the first was dropped, the second
    refused); a wait that could never end raises at once, as the local collector's (it ran to its timeout)."""
    rb = make_replay_buffer(4096)
    collector = RayOffPolicyCollector(
        "Pendulum-v1", linear_policy(3, 1), num_nodes=1, num_workers=1, num_envs=3, frames_per_batch=32,
        total_frames=99, seed=0, replay_buffer=rb, remote_configs=NODE,
        collector_kwargs={"max_frames_per_traj": 10, "trust_policy": True},
    )
    try:
        assert collector.frames_per_batch == 33 and len(collector) == 3
        start_after_waits_that_could_never_end(collector, 99, timeout=120)
        assert collector.frames_written == len(rb) == 99
        data = rb[:]
        assert int(data["step_count"].max()) < 10, "episodes are cut at 10 steps"
    finally:
        collector.shutdown()


def test_a_node_error_stays_raised_and_a_bad_node_argument_is_named():
    """A node's error is raised by every later call, as a local worker's, though the collection thread has
    ended. A node that cannot be built names the argument (its half-built actor's repr() answers too)."""
    with pytest.raises(Exception, match="nonfinite must be one of"):
        RayOffPolicyCollector("Pendulum-v1", linear_policy(3, 1), num_nodes=1, num_workers=1, num_envs=2,
                              frames_per_batch=16, remote_configs=NODE, collector_kwargs={"nonfinite": "bogus"})
    collector = RayOffPolicyCollector(
        crashing_env, linear_policy(3, 1), num_nodes=1, num_workers=1, num_envs=2, frames_per_batch=16,
        total_frames=10_000, seed=0, replay_buffer=make_replay_buffer(4096), remote_configs=NODE,
    )
    try:
        collector.start()
        for _ in range(2):
            with pytest.raises(NodeError, match="boom from the env on the remote node"):
                collector.wait_for_frames(10_000, timeout=120)
        with pytest.raises(NodeError, match="boom from the env on the remote node"):
            collector.shutdown(raise_on_error=True)
    finally:
        collector.shutdown(raise_on_error=False)


class SlowSteps(Transform):
    """Each step takes 0.1 s: a node is mid-batch when the learner shuts down."""

    def _step(self, tensordict, next_tensordict):
        time.sleep(0.1)
        return next_tensordict


def slow_env():
    return TransformedEnv(BatchedGymEnv("Pendulum-v1", 2), SlowSteps())


def test_a_node_killed_mid_batch_at_shutdown_leaves_nothing_behind():
    """shutdown(timeout=1) while a node collects a 3 s batch: its actor is killed before it cleans up, and
    its weight block and fork-server directory stayed in /dev/shm and /tmp until the next collector started."""
    collector = RayOffPolicyCollector(slow_env, linear_policy(3, 1), num_nodes=1, num_workers=1, num_envs=2,
                                      frames_per_batch=64, seed=0, remote_configs=NODE)
    pid = actor_pid(collector.node_hosts[0])
    mine = f"tul_mp_{pid}_"
    next(iter(collector))  # the node now collects its next batch
    assert any(e.startswith(mine) for e in os.listdir(tempfile.gettempdir()))
    collector.shutdown(timeout=1)
    assert not any(e.startswith(mine) for e in os.listdir(tempfile.gettempdir()))
    assert not left_by(pid)["shm"]


def test_sac_recipe_runs_with_the_ray_backend(tmp_path):
    from test_recipes import run_recipe, scalars

    summary = run_recipe(
        "sac", tmp_path, "collector.backend=ray", "collector.num_nodes=2", "collector.num_workers=1",
        "collector.env_per_collector=4", "collector.total_frames=2048", "collector.sync_every=64",
    )
    assert summary["frames"] == 2048 and not summary["interrupted"]
    versions = [value for _, value in scalars(tmp_path, "learner/policy_lag")]
    assert versions, "the learner logged the policy lag of the rows it trained on"
    assert (tmp_path / "checkpoint" / "replay_buffer").is_dir()


OUTLIVING_RAY = """
import gc, os, sys, tempfile, time
import ray
from conftest import linear_policy
from torchrl_unilab import make_replay_buffer
from torchrl_unilab._residue import SCRATCH_PREFIX, SHM_DIR, WEIGHTS_PREFIX, running, sweep_stale
from torchrl_unilab.collectors.ray_collector import RayOffPolicyCollector

if __name__ == "__main__":
    config = dict(num_cpus=2, include_dashboard=False)
    node = dict(num_nodes=1, num_workers=1, num_envs=2, frames_per_batch=16, remote_configs={"num_cpus": 1})
    try:
        RayOffPolicyCollector("Pendulum-v1", linear_policy(3, 1), collector_kwargs={"nonfinite": "bogus"},
                              ray_init_config=config, **node)
    except Exception as err:
        print("refused:", "nonfinite must be one of" in str(err))
    print("up after a failed construction:", ray.is_initialized())
    gc.collect()
    print("up after collecting it:", ray.is_initialized())
    ray.init(**config)
    collector = RayOffPolicyCollector("Pendulum-v1", linear_policy(3, 1), replay_buffer=make_replay_buffer(256), **node)
    actor = int(collector.node_hosts[0].rsplit("(pid ", 1)[1].rstrip(")"))
    ray.shutdown()
    del collector
    gc.collect()
    print("up after collecting a collector that outlived Ray:", ray.is_initialized())
    # ray.shutdown() killed the node's actor: what it named after itself goes as the next start would sweep it.
    deadline = time.monotonic() + 60
    while running(actor) and time.monotonic() < deadline:
        time.sleep(0.1)
    sweep_stale(SHM_DIR, WEIGHTS_PREFIX)
    sweep_stale(tempfile.gettempdir(), SCRATCH_PREFIX)
"""


def test_a_collector_never_starts_ray_again_after_a_failed_construction_or_a_ray_shutdown(tmp_path):
    """A construction that fails after its nodes started stops them and gives back TorchRL's Ray runtime lease,
    so the runtime it started for itself goes too; a collector collected after ``ray.shutdown()`` leaves Ray
    down (``RayCollector.__del__``'s ``ray.kill`` would start a new runtime: Ray's auto-init). In a process of
    its own: this module's cluster stays up."""
    script = tmp_path / "outliving_ray.py"
    script.write_text(OUTLIVING_RAY)
    tests = Path(__file__).resolve().parent
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": f"{tests.parent}{os.pathsep}{tests}"})
    assert out.returncode == 0, out.stderr[-3000:]
    assert [line for line in out.stdout.splitlines() if line.startswith(("refused:", "up after"))] == [
        "refused: True",
        "up after a failed construction: False",
        "up after collecting it: False",
        "up after collecting a collector that outlived Ray: False",
    ], out.stdout + out.stderr[-3000:]


def test_the_core_package_imports_without_ray():
    code = (
        "import sys; sys.modules['ray'] = None\n"
        "import torchrl_unilab, torchrl_unilab.collectors.ray_collector as rc\n"
        "try:\n"
        "    rc.RayOffPolicyCollector('Pendulum-v1', None, frames_per_batch=8)\n"
        "except ImportError as err:\n"
        "    print(err)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    assert out.returncode == 0, out.stderr
    assert 'pip install -e ".[ray]"' in out.stdout


def test_no_ray_process_is_left_after_ray_shutdown():
    """Last in the module: the cluster this module started goes away with ``ray.shutdown()``."""
    # raylet, gcs_server, ray:: workers; node workers are checked by the tests above. Not this process's fork
    # server: Ray put its paths on sys.path, which the server's command line carries.
    ray_procs = {pid: cmdline(pid)[:100] for pid in set(descendants(os.getpid())) - multiprocessing_helpers()
                 if "ray" in cmdline(pid)}
    assert ray_procs, "ray.init started its processes as our children"
    ray.shutdown()
    assert wait_until(lambda: gone(list(ray_procs)), timeout=60), \
        {pid: cmd for pid, cmd in ray_procs.items() if not gone([pid])}


@pytest.mark.parametrize("kwargs, message", [
    (dict(num_nodes=0), "num_nodes must be an int >= 1, got 0"),
    (dict(max_node_restarts=-1), "max_node_restarts must be an int >= 0, got -1"),
    (dict(on_node_failure="drop"), r"on_node_failure must be one of \('raise', 'continue'\), got 'drop'"),
])
def test_a_bad_argument_is_named_before_any_node_starts(kwargs, message):
    with pytest.raises(ValueError, match=message):
        RayOffPolicyCollector("Pendulum-v1", linear_policy(3, 1), frames_per_batch=32, **kwargs)
