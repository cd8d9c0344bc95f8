"""TorchRL's device, compile and weight-updater arguments, as TorchRL's scripts and configs pass them.

Real worker processes and envs; the weight checks read the actions the workers wrote.
"""

from __future__ import annotations

import functools
import time

import pytest
import torch
from conftest import linear_policy, publish_zero_weights, rows_after_publish
from tensordict import TensorDict
from tensordict.nn import TensorDictModuleBase
from torchrl.collectors import MultiAsyncCollector
from torchrl.collectors.weight_update import RemoteModuleWeightUpdater, WeightUpdaterBase
from torchrl.envs import GymEnv, SerialEnv

from torchrl_unilab import OffPolicyCollector, make_replay_buffer

PENDULUM = dict(num_envs=2, frames_per_batch=64)


def compile_messages(records) -> list[str]:
    return [r.getMessage() for r in records if "compile_policy" in r.getMessage() or "cudagraph" in r.getMessage()]


@pytest.mark.parametrize("compile_policy", [True, {}, {"mode": "default"}, {"mode": "reduce-overhead", "warmup": 5}])
def test_compile_policy_is_read_as_torchrl_reads_it_and_said_once(compile_policy, unilab_log, no_leaks):
    """The values TorchRL's sota scripts and its own compiled-policy test pass; each collects a batch."""
    with OffPolicyCollector("Pendulum-v1", linear_policy(3, 1), total_frames=64, compile_policy=compile_policy,
                            cudagraph_policy={"warmup": 10}, **PENDULUM) as collector:
        assert collector.compiled_policy is True and collector.cudagraphed_policy is True
        expected = compile_policy if isinstance(compile_policy, dict) else {}
        assert collector.compiled_policy_kwargs == expected
        assert collector.cudagraphed_policy_kwargs == {"warmup": 10}
        batch = next(iter(collector))
    assert batch.numel() == 64 and torch.isfinite(batch["action"]).all()
    said = compile_messages(unilab_log)
    assert len(said) == 2, said
    assert "workers act on CPU" in said[0] and "uncompiled" in said[0]
    assert "CUDA graphs run on CUDA only" in said[1]


def test_compile_off_is_silent(unilab_log, no_leaks):
    with OffPolicyCollector("Pendulum-v1", linear_policy(3, 1), compile_policy=False, cudagraph_policy=None,
                            **PENDULUM) as collector:
        assert collector.compiled_policy is False and collector.cudagraphed_policy is False
    assert compile_messages(unilab_log) == []


@pytest.mark.parametrize(
    "devices",
    [dict(device="cpu"), dict(policy_device="cpu", env_device="cpu"), dict(storing_device=["cpu", "cpu"]),
     dict(device=None)],
)
def test_device_arguments_give_torchrl_per_worker_devices(devices):
    """The collector reports TorchRL's per-worker device tuples for the same arguments."""
    collector = OffPolicyCollector("Pendulum-v1", linear_policy(3, 1), num_workers=2, **devices, **PENDULUM)
    try:
        reference = MultiAsyncCollector._get_devices(
            collector, **{name: devices.get(name) for name in ("device", "storing_device", "policy_device",
                                                                 "env_device")})
        assert (collector.storing_device, collector.policy_device, collector.env_device) == reference
        assert len(collector.storing_device) == 2
    finally:
        collector.shutdown()


def test_a_yielded_batch_is_moved_to_the_storing_device(no_leaks):
    """Workers write CPU rows; the batch path moves each yielded batch, whole, to ``storing_device``.

    The meta device stands in for CUDA on a machine without one: the move is the same call.
    """
    with OffPolicyCollector("Pendulum-v1", linear_policy(3, 1), storing_device="meta", total_frames=128,
                            **PENDULUM) as collector:
        batches = list(collector)
    assert len(batches) == 2
    for batch in batches:
        assert batch.batch_size == torch.Size([2, 32])
        assert {leaf.device.type for leaf in batch.values(True, True)} == {"meta"}


@pytest.mark.skipif(torch.cuda.is_available(), reason="the error of a machine without CUDA")
@pytest.mark.parametrize("name", ["device", "storing_device", "policy_device", "env_device"])
def test_a_cuda_device_without_cuda_gets_torchs_error_with_the_argument(name):
    with pytest.raises(Exception) as raised:
        torch.empty(0, device="cuda:0")
    with pytest.raises(type(raised.value), match=rf"^{name}='cuda:0': ") as ours:
        OffPolicyCollector("Pendulum-v1", linear_policy(3, 1), **{name: "cuda:0"}, **PENDULUM)
    assert str(raised.value) in str(ours.value)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_batches_come_on_the_storing_device_and_a_cuda_policy_is_published(no_leaks):
    policy = linear_policy(3, 1).to("cuda:0")
    rb = make_replay_buffer(4096)
    with OffPolicyCollector("Pendulum-v1", policy, device="cuda:0", total_frames=128, **PENDULUM) as collector:
        assert collector.storing_device[0] == torch.device("cuda:0")
        batch = next(iter(collector))
        assert batch["action"].device == torch.device("cuda:0")
    with OffPolicyCollector("Pendulum-v1", policy, device="cuda:0", replay_buffer=rb, **PENDULUM) as collector:
        with torch.no_grad():
            for p in policy.parameters():
                p.zero_()
        collector.update_policy_weights_()
        collector.start()
        assert collector.wait_for_frames(256, timeout=120)
        rows = rb[: collector.frames_written]
    new = rows[rows["policy_version"] == 2]
    assert len(new) > 0 and torch.equal(new["action"], torch.zeros_like(new["action"]))


class RecordingUpdater(WeightUpdaterBase):
    """A TorchRL weight updater that records what the collector hands it."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[object, object]] = []

    def _get_server_weights(self):
        return None

    def _sync_weights_with_worker(self, *, worker_id=None, server_weights=None):
        self.calls.append((worker_id, server_weights))

    def _maybe_map_weights(self, server_weights):
        return server_weights

    def all_worker_ids(self):
        return [0]

    def __call__(self, policy_or_weights=None, worker_ids=None):
        self.calls.append(("call", policy_or_weights))


@pytest.mark.parametrize("given", ["instance", "factory"])
def test_a_torchrl_weight_updater_is_registered_called_and_the_workers_get_the_weights(given, unilab_log, no_leaks):
    """TorchRL's configs pass a factory (a partial) or an instance; update_policy_weights_() calls it, then
    the workers act with the published weights."""
    updater = RecordingUpdater()
    policy = linear_policy(3, 1)
    rb = make_replay_buffer(8192)
    value = updater if given == "instance" else (lambda: updater)
    with OffPolicyCollector("Pendulum-v1", policy, replay_buffer=rb, weight_updater=value, **PENDULUM) as collector:
        assert collector.weight_updater is updater and updater.collector is collector
        collector.start()
        assert collector.wait_for_frames(128, timeout=120)
        publish_zero_weights(collector, policy)
        assert updater.calls == [("call", None)]
        rows = rows_after_publish(collector, rb, 256, timeout=120)
    new = rows[rows["policy_version"] == 2]
    assert len(new) >= 128 and torch.equal(new["action"], torch.zeros_like(new["action"]))
    said = [r.getMessage() for r in unilab_log if "weight_updater is RecordingUpdater" in r.getMessage()]
    assert len(said) == 1, said


def test_torchrl_remote_module_updater_from_a_partial_keeps_its_contract(no_leaks):
    """RemoteModuleWeightUpdater, built from a partial as hydra builds it, refuses a publish without weights,
    as with TorchRL's collector, and passes given weights on."""
    policy = linear_policy(3, 1)
    with OffPolicyCollector("Pendulum-v1", policy, total_frames=128,
                            weight_updater=functools.partial(RemoteModuleWeightUpdater), **PENDULUM) as collector:
        assert isinstance(collector.weight_updater, RemoteModuleWeightUpdater)
        next(iter(collector))
        with pytest.raises((RuntimeError, TypeError)):  # what the updater raises for no weights
            collector.update_policy_weights_()
        assert collector.policy_version == 1
        collector.update_policy_weights_(TensorDict.from_module(policy))
        assert collector.policy_version == 2


def test_a_weight_updater_that_is_not_one_names_the_argument():
    with pytest.raises(ValueError, match="weight_updater must be a torchrl.collectors.WeightUpdaterBase.*got object"):
        OffPolicyCollector("Pendulum-v1", linear_policy(3, 1), weight_updater=object(), **PENDULUM)


def test_update_policy_weights_takes_torchrl_model_id_for_the_policy_only(no_leaks):
    policy = linear_policy(3, 1)
    with OffPolicyCollector("Pendulum-v1", policy, total_frames=64, **PENDULUM) as collector:
        collector.update_policy_weights_(model_id="policy")
        assert collector.policy_version == 2
        with pytest.raises(ValueError, match="model_id must be None or 'policy'.*got 'value'"):
            collector.update_policy_weights_(model_id="value")


def test_load_state_dict_takes_torchrls_strict_flag(no_leaks):
    """TorchRL's RayCollector restores its nodes with load_state_dict(state, strict=False)."""
    policy = linear_policy(3, 1)
    with OffPolicyCollector("Pendulum-v1", policy, total_frames=128, **PENDULUM) as collector:
        next(iter(collector))
        state = collector.state_dict()
    weights = dict(state["worker0"]["policy_state_dict"])
    weights.pop("module.0.bias")
    fresh = linear_policy(3, 1, seed=1)
    with OffPolicyCollector("Pendulum-v1", fresh, total_frames=128, **PENDULUM) as collector:
        with pytest.raises(KeyError, match=r"its names not given: \['module.0.bias'\]"):
            collector.load_state_dict({**state, "worker0": {"policy_state_dict": weights}})
        collector.load_state_dict({**state, "worker0": {"policy_state_dict": weights}}, strict=False)
        assert torch.equal(fresh.module[0].weight, policy.module[0].weight)


#: (start, end) of each call of a RecordingPolicy copy in this process: a thread worker's copy appends here
POLICY_CALLS: list[tuple[float, float]] = []


class RecordingPolicy(TensorDictModuleBase):
    """A policy module the tensor path does not know: the worker calls it under tensordict's exploration type."""

    in_keys, out_keys = ["observation"], ["action"]

    def forward(self, td):
        start = time.monotonic()
        td.set("action", torch.zeros(*td.batch_size, 1))
        POLICY_CALLS.append((start, time.monotonic()))
        return td


@pytest.mark.parametrize("policy", ["module", "tensor path", "module on worker 1"])
def test_an_env_instance_acts_through_a_module_only_while_the_consumer_waits(policy, no_leaks):
    """tensordict's exploration type is process-wide, and compiled losses guard on it (TorchRL's crossq.py and
    discrete_sac.py with compile.compile=true): a thread-stepped env instance whose policy goes through TensorDict
    modules acts only inside next(), one batch at a time, as TorchRL's Collector; on the tensor path, which reads
    no such setting, it still collects the next batch while the consumer trains. One worker on the module path
    (an unbatched env, stepped as a batch of one) is enough to step them all in lockstep."""
    POLICY_CALLS.clear()
    env = SerialEnv(2, functools.partial(GymEnv, "Pendulum-v1"))
    actor = RecordingPolicy() if policy == "module" else linear_policy(3, 1)
    if policy == "module on worker 1":
        env = [SerialEnv(1, functools.partial(GymEnv, "Pendulum-v1")), GymEnv("Pendulum-v1")]
    collector = OffPolicyCollector(env, actor, frames_per_batch=32, total_frames=32 * 4)
    training = []  # (start, end, frames collected past those consumed at the end) of each update
    try:
        for consumed, batch in enumerate(collector, 1):
            assert batch.numel() == 32
            start = time.monotonic()
            time.sleep(0.5)  # the learner's update
            training.append((start, time.monotonic(), collector.metrics()["frames"] - 32 * consumed))
    finally:
        collector.shutdown()
    if policy == "module":
        calls = [(a, b) for a, b in POLICY_CALLS if a > training[0][0]]  # the probe's call comes before any
        assert len(calls) >= 3 * 16  # the three batches after the first, 2 envs a call
        assert not [c for c in calls for t in training if c[1] > t[0] and c[0] < t[1]]
        assert all(ahead == 0 for _, _, ahead in training)
    if policy == "module on worker 1":
        assert all(ahead == 0 for _, _, ahead in training)
    if policy == "tensor path":
        assert any(ahead > 0 for _, _, ahead in training[:-1])
