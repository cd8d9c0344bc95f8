"""What TorchRL's own collector tests check of ``MultiAsyncCollector``, as our own tests.

TorchRL's ``test/test_collectors.py`` cannot be imported in CI, so each behaviour
it protects where ``OffPolicyCollector`` can differ from TorchRL's class has a test here: how a yielded
batch is laid out and which keys it holds, policies as TorchRL takes them (a
tensor-in module, ``policy_factory``), the weight-sync scheme as given,
``map_fn`` / ``get_distant_attr``, and ``MAX_IDLE_COUNT``. Real envs, real workers.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from conftest import linear_policy
from tensordict import TensorDict
from tensordict.nn import TensorDictModule
from torchrl.collectors import Collector
from torchrl.data import LazyTensorStorage, ReplayBuffer
from torchrl.envs import GymEnv
from torchrl.weight_update import MultiProcessWeightSyncScheme, SharedMemWeightSyncScheme

from torchrl_unilab import OffPolicyCollector, SeqlockWeightSyncScheme


def pendulum() -> GymEnv:
    return GymEnv("Pendulum-v1")


def keys(td) -> set:
    return {key for key in td.keys(True, True) if not (isinstance(key, str) and key.startswith("_"))}


# ------------------------------------------------------------------ batches
@pytest.mark.parametrize("source", ["gym_id", "unbatched_env"])
def test_a_batch_is_laid_out_as_torchrls_envs_first_and_time_last(source, no_leaks):
    """``[*env.batch_size, T]`` with the last dim named ``"time"``, as ``MultiAsyncCollector`` yields it. Ours were
    flat step-major rows: ``b.names[-1] == "time"`` failed, and anything reading time along the last dim was wrong."""
    kwargs = dict(num_envs=2) if source == "gym_id" else {}
    env = "Pendulum-v1" if source == "gym_id" else [pendulum]
    with OffPolicyCollector(env, linear_policy(3, 1), frames_per_batch=16, total_frames=32, max_frames_per_traj=200,
                            **kwargs) as collector:
        batch = collector.next()
    assert batch.shape == ((2, 8) if source == "gym_id" else (16,))
    assert batch.names[-1] == "time"
    steps = batch["step_count"].squeeze(-1)
    assert (steps[..., 1:] - steps[..., :-1] == 1).all(), "consecutive steps of one env along the last dim"
    assert (batch["next", "observation"][..., :-1, :] == batch["observation"][..., 1:, :]).all()


def test_a_batch_holds_the_keys_torchrls_does_and_its_options_add_theirs(no_leaks):
    """No keys of ours beyond TorchRL's (``policy_version``, ``step_count`` were in every batch); with
    ``track_policy_version`` the version is on both sides, as TorchRL's ``PolicyVersion`` writes it, and moves by one
    per ``update_policy_weights_()``; ``max_frames_per_traj`` adds ``step_count``, as TorchRL's ``StepCounter`` does."""
    policy = linear_policy(3, 1)
    stock = Collector(pendulum(), policy, frames_per_batch=8, total_frames=8)
    try:
        expected = keys(next(iter(stock)))
    finally:
        stock.shutdown()
    with OffPolicyCollector([pendulum], policy, frames_per_batch=8, total_frames=8) as collector:
        assert keys(collector.next()) == expected
    stock = Collector(pendulum(), policy, frames_per_batch=8, total_frames=8, max_frames_per_traj=50)
    try:
        expected_counted = keys(next(iter(stock)))
    finally:
        stock.shutdown()
    with OffPolicyCollector([pendulum], policy, frames_per_batch=8, total_frames=8,
                            max_frames_per_traj=50) as collector:
        assert keys(collector.next()) == expected_counted
    with OffPolicyCollector([pendulum], policy, frames_per_batch=8, total_frames=8 * 40,
                            track_policy_version=True) as collector:
        it = iter(collector)
        first = next(it)
        assert keys(first) == expected | {"policy_version", ("next", "policy_version")}
        version = int(first["policy_version"][0])
        assert (first["next", "policy_version"] == first["policy_version"]).all()
        assert (first["policy_version"] == version).all()
        collector.update_policy_weights_()
        assert any((batch["next", "policy_version"] == version + 1).all() for batch, _ in zip(it, range(20)))


def test_the_buffer_rows_keep_the_collectors_bookkeeping(no_leaks):
    """Rows a worker writes into a buffer keep ``policy_version`` and ``step_count``: the sampler's age filter
    and the frame accounting read them. Only yielded batches follow TorchRL's key set."""
    rb = ReplayBuffer(storage=LazyTensorStorage(64), shared=True)
    with OffPolicyCollector([pendulum], linear_policy(3, 1), frames_per_batch=8, total_frames=16,
                            replay_buffer=rb, init_random_frames=8) as collector:
        list(collector)
    rows = rb[:]
    assert sorted(rows["policy_version"].reshape(-1).unique().tolist()) == [-1, 1]
    assert "step_count" in rows.keys()


def multi_key_env():
    from torchrl.testing.mocking_classes import MultiKeyCountingEnv

    return MultiKeyCountingEnv(batch_size=(4,))


@pytest.mark.parametrize("init_random_frames", [0, 8])
def test_an_env_with_several_action_keys_gets_each_of_them(init_random_frames, no_leaks):
    """TorchRL's multi-key envs (``env.action_keys`` of three entries, nested ones among them): the policy's
    actions, and random ones of the whole action spec, reach every key. Ours asked for ``env.action_key``
    (``action_key requested but more than one key present``)."""
    from torchrl.testing.mocking_classes import MultiKeyCountingEnvPolicy

    env = multi_key_env()
    policy = MultiKeyCountingEnvPolicy(env.input_spec["full_action_spec"], deterministic=True)
    with OffPolicyCollector([multi_key_env], policy, frames_per_batch=16, total_frames=32,
                            init_random_frames=init_random_frames) as collector:
        batches = list(collector)
    assert [batch.shape for batch in batches] == [torch.Size([4, 4])] * 2 and batches[0].names[-1] == "time"
    acted = batches[1]  # the policy's: it writes ones into every key
    assert (acted["nested_1", "action"] == 1).all() and (acted["nested_2", "azione"] == 1).all()
    assert acted["action"][..., 1].all()
    if init_random_frames:  # the first two steps of the 4 envs, drawn from the whole action spec
        assert not (batches[0]["nested_2", "azione"][:, :2] == 1).all()
        assert (batches[0]["nested_2", "azione"][:, 2:] == 1).all()


# ------------------------------------------------------------------ policies as TorchRL takes them
class TensorIn(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(3, 1)

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return self.linear(observation)


class TakesSomethingElse(torch.nn.Module):
    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        return pixels


def test_a_tensor_in_module_is_wrapped_as_torchrl_does_and_syncs(no_leaks):
    """A plain ``nn.Module`` whose ``forward`` takes the observation by name: TorchRL wraps it in a
    ``TensorDictModule``; ours called it with a TensorDict (``Multiple dispatch failed for 'torch.nn.linear'``)."""
    policy = TensorIn()
    with OffPolicyCollector([pendulum, pendulum], policy, frames_per_batch=16, total_frames=16 * 30) as collector:
        it = iter(collector)
        assert (next(it)["action"] != 0).any()
        with torch.no_grad():
            for param in policy.parameters():
                param.zero_()
        collector.update_policy_weights_()
        assert any((batch["action"] == 0).all() for batch, _ in zip(it, range(20)))


def test_a_module_that_cannot_be_wrapped_is_refused_as_torchrl_refuses_it():
    with pytest.raises(TypeError, match="Failed to wrap the policy. If the policy needs to be trusted"):
        OffPolicyCollector([pendulum], TakesSomethingElse(), frames_per_batch=8, total_frames=8)


class Biased(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.bias = torch.nn.Parameter(torch.zeros(1))

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return observation[..., :1] * 0 + self.bias


class Unpicklable(Biased):
    def __reduce__(self):
        raise RuntimeError("Unpicklable cannot be pickled")


class PidRecordingFactory:
    """Builds the worker's policy and appends the pid of the process that called it to a file."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __call__(self) -> TensorDictModule:
        with open(self.path, "a") as out:
            out.write(f"{os.getpid()}\n")
        return TensorDictModule(Biased(), in_keys=["observation"], out_keys=["action"])


def test_a_policy_factory_builds_in_the_workers_and_the_parents_policy_is_never_pickled(tmp_path, no_leaks):
    """``policy`` (here one that cannot be pickled) is the source of weights in this process; ``policy_factory``
    builds what each worker runs. Ours called the factory here and pickled the result (``cannot be pickled``)."""
    factory = PidRecordingFactory(tmp_path / "pids")
    policy = TensorDictModule(Unpicklable(), in_keys=["observation"], out_keys=["action"])
    with OffPolicyCollector([pendulum, pendulum], policy, policy_factory=factory, frames_per_batch=16,
                            total_frames=16 * 40) as collector:
        it = iter(collector)
        assert (next(it)["action"] == 0).all()
        with torch.no_grad():
            policy.module.bias.add_(1.0)
        collector.update_policy_weights_()
        assert any((batch["action"] == 1).all() for batch, _ in zip(it, range(30))), "weights reach the workers"
    pids = [int(line) for line in (tmp_path / "pids").read_text().split()]
    assert len(pids) == 2 and len(set(pids)) == 2 and os.getpid() not in pids


def test_a_policy_factory_alone_builds_in_the_workers_and_once_here_for_the_weights(tmp_path, no_leaks):
    """Without ``policy``, each worker builds its policy, the rows are laid out from one step in a spawned process of
    its own, and one more instance, built here, is what the weights are published from."""
    factory = PidRecordingFactory(tmp_path / "pids")
    with OffPolicyCollector([pendulum, pendulum], policy_factory=factory, frames_per_batch=16,
                            total_frames=32) as collector:
        batches = list(collector)
    assert len(batches) == 2 and all((batch["action"] == 0).all() for batch in batches)
    pids = [int(line) for line in (tmp_path / "pids").read_text().split()]
    assert len(pids) == 4 and len(set(pids)) == 4 and pids.count(os.getpid()) == 1


class BiasHereOnly:
    """A policy factory whose policy's bias is ``here`` in the process that made the factory, 0 elsewhere."""

    def __init__(self, here: float, lazy: bool = False) -> None:
        self.pid, self.here, self.lazy = os.getpid(), here, lazy

    def __call__(self) -> TensorDictModule:
        net = torch.nn.LazyLinear(1) if self.lazy else Biased()
        if not self.lazy:
            with torch.no_grad():
                net.bias.fill_(self.here if os.getpid() == self.pid else 0.0)
        return TensorDictModule(net, in_keys=["observation"], out_keys=["action"])


def actions_become(batches, value: float, within: int = 30) -> bool:
    """Whether a batch whose actions all equal ``value`` comes within ``within`` batches."""
    return any(torch.allclose(batch["action"], torch.full_like(batch["action"], value))
               for batch, _ in zip(batches, range(within)))


def test_a_policy_factory_alone_takes_weights_and_its_workers_act_with_them(no_leaks):
    """``update_policy_weights_`` of a collector given only ``policy_factory`` reaches the workers' factory-built
    policies: weights, a module, and ``None`` (what was published last). Until the first update each worker acts with
    its own factory call's weights, as TorchRL's workers do, not with the instance built here (bias 1)."""
    factory = BiasHereOnly(here=1.0)
    with OffPolicyCollector([pendulum, pendulum], policy_factory=factory, frames_per_batch=16,
                            total_frames=-1) as collector:
        batches = iter(collector)
        assert all((next(batches)["action"] == 0).all() for _ in range(4)), "the workers' own weights until an update"
        collector.update_policy_weights_(TensorDict({"module": {"bias": torch.tensor([1.5])}}, []))
        assert actions_become(batches, 1.5), "published weights reach the workers"
        learner = BiasHereOnly(here=-1.0)()  # built in this process: bias -1
        collector.update_policy_weights_(learner)
        assert actions_become(batches, -1.0), "a module's weights reach the workers"
        collector.update_policy_weights_()  # the weights published last, not the instance's own (1)
        assert actions_become(batches, -1.0) and collector.policy_version == 4
        assert not any((next(batches)["action"] == 1.0).any() for _ in range(4))


def test_a_policy_factory_with_a_policy_starts_from_the_policys_weights(no_leaks):
    """With ``policy`` given too, the workers' factory-built policies start from its weights, as a pickled one does."""
    policy = TensorDictModule(Biased(), in_keys=["observation"], out_keys=["action"])
    with torch.no_grad():
        policy.module.bias.fill_(0.5)
    with OffPolicyCollector([pendulum], policy, policy_factory=BiasHereOnly(here=1.0), frames_per_batch=16,
                            total_frames=32) as collector:
        assert all((batch["action"] == 0.5).all() for batch in collector)


def test_a_policy_factory_alone_with_lazy_layers_takes_weights(no_leaks):
    """Lazy layers get their shapes at a step; the instance built here takes them from the probe's policy, so that
    the weights have a layout before any worker steps."""
    with OffPolicyCollector([pendulum], policy_factory=BiasHereOnly(0.0, lazy=True), frames_per_batch=16,
                            total_frames=-1) as collector:
        batches = iter(collector)
        next(batches)
        collector.update_policy_weights_({"module.weight": torch.zeros(1, 3), "module.bias": torch.full((1,), 0.5)})
        assert actions_become(batches, 0.5)


# ------------------------------------------------------------------ schemes, remote helpers, idle limit
@pytest.mark.parametrize("given", [None, MultiProcessWeightSyncScheme, SharedMemWeightSyncScheme])
def test_weight_sync_schemes_holds_the_scheme_as_given(given, no_leaks):
    """TorchRL's own tests (and users' code) look the scheme up: it is the object given, and by default a
    ``SharedMemWeightSyncScheme`` (ours is one). It held our adapter, so ``isinstance`` checks failed."""
    scheme = given() if given is not None else None
    collector = OffPolicyCollector([pendulum], linear_policy(3, 1), frames_per_batch=8, total_frames=8,
                                   **({"weight_sync_schemes": {"policy": scheme}} if given else {}))
    try:
        held = collector._weight_sync_schemes["policy"]  # noqa: SLF001 - the attribute TorchRL's tests read
        if given is None:
            assert isinstance(held, SeqlockWeightSyncScheme) and isinstance(held, SharedMemWeightSyncScheme)
        else:
            assert held is scheme
        assert collector.next().numel() == 8
    finally:
        collector.shutdown()


def test_map_fn_and_get_distant_attr_answer_for_each_worker(no_leaks):
    rb = ReplayBuffer(storage=LazyTensorStorage(256), shared=True)
    with OffPolicyCollector([pendulum, pendulum], linear_policy(3, 1), frames_per_batch=16, total_frames=32,
                            replay_buffer=rb) as collector:
        assert collector.get_distant_attr("worker_idx") == [0, 1]
        assert collector.map_fn("get_distant_attr", list_of_args=[("worker_idx",), ("worker_idx",)]) == [0, 1]
        with pytest.raises(ValueError, match="Expected 2 argument entries"):
            collector.map_fn("get_distant_attr", list_of_args=[("worker_idx",)])
        list(collector)
        assert collector.map_fn("replay_buffer.__len__") == [len(rb)] * 2 == [32] * 2
        assert collector.get_distant_attr("replay_buffer.write_count") == [rb.write_count] * 2
        with pytest.raises(AttributeError, match="'env' lives only in the worker process"):
            collector.get_distant_attr("env.batch_size")


SLOW_ENV_SCRIPT = textwrap.dedent("""
    import os, sys, time
    os.environ["MAX_IDLE_COUNT"] = sys.argv[1]
    import torch
    from torchrl.data import Composite, Unbounded
    from torchrl.envs import EnvBase
    from torchrl.envs.utils import RandomPolicy
    from torchrl_unilab import OffPolicyCollector

    class Slow(EnvBase):
        def __init__(self):
            super().__init__()
            self.action_spec = Composite(action=Unbounded((1,)))
            self.reward_spec = Composite(reward=Unbounded((1,)))
            self.done_spec = Composite(done=Unbounded((1,), dtype=torch.bool))
            self.observation_spec = Composite(observation=Unbounded((1,)))
            self.steps = 0

        def _reset(self, tensordict, **kwargs):
            return self.full_observation_spec.zero().update(self.full_done_spec.zero())

        def _step(self, tensordict, **kwargs):
            self.steps += 1
            if self.steps > 1:  # the collector's probe steps once in this process
                time.sleep(1.5)
            return self.full_observation_spec.zero().update(self.full_done_spec.zero()).update(
                self.full_reward_spec.zero())

        def _set_seed(self, seed):
            pass

    if __name__ == "__main__":
        collector = OffPolicyCollector([Slow], RandomPolicy(Slow().action_spec), frames_per_batch=2, total_frames=4)
        try:
            next(iter(collector))
        finally:
            collector.shutdown()
""")


@pytest.mark.parametrize("max_idle_count", [1, 10])
def test_max_idle_count_bounds_the_wait_for_a_batch_as_torchrls_does(max_idle_count, tmp_path):
    """TorchRL raises when no batch arrives within ``MAX_IDLE_COUNT`` seconds; ours waited for ever."""
    script = tmp_path / "slow.py"
    script.write_text(SLOW_ENV_SCRIPT)
    out = subprocess.run([sys.executable, str(script), str(max_idle_count)], capture_output=True, text=True,
                         timeout=120)
    if max_idle_count == 1:
        assert out.returncode == 1 and "Failed to gather all collector output within 1.0 seconds" in out.stderr, \
            out.stderr[-2000:]
    else:
        assert out.returncode == 0, out.stderr[-2000:]


# ------------------------------------------------------------------ the documented differences
def heterogeneous_env():
    from torchrl.envs import InitTracker, TransformedEnv
    from torchrl.testing.mocking_classes import HeterogeneousCountingEnv

    return TransformedEnv(HeterogeneousCountingEnv(max_steps=3, batch_size=(4,)), InitTracker())


def dynamic_env():
    from torchrl.testing.mocking_classes import EnvWithDynamicSpec

    return EnvWithDynamicSpec()


def first_batches(collector, n: int = 2) -> list:
    batches = []
    try:
        for batch in collector:
            batches.append(batch)
            if len(batches) == n:
                return batches
    finally:
        collector.shutdown()
    return batches


@pytest.mark.parametrize("make_env", [heterogeneous_env, dynamic_env])
def test_an_env_with_entries_of_varying_shape_is_collected_by_torchrl_collector(make_env, no_leaks):
    """Rows of fixed-shape shared tensors cannot hold lazy-stacked or growing entries: ``OffPolicyCollector(...)``
    returns TorchRL's ``MultiAsyncCollector`` from the same arguments, with a warning naming the entries, and it
    yields what TorchRL's class yields."""
    from tensordict import LazyStackedTensorDict, assert_allclose_td
    from torchrl.collectors import MultiAsyncCollector
    from torchrl.envs.utils import RandomPolicy
    from torchrl.testing.mocking_classes import HeterogeneousCountingEnvPolicy

    if make_env is heterogeneous_env:
        policy = HeterogeneousCountingEnvPolicy(make_env().full_action_spec)
    else:
        policy = RandomPolicy(make_env().action_spec)
    with pytest.warns(UserWarning, match=r"entries \[.*('observation'|'lazy').*\] vary in shape"):
        # num_envs, one of ours, at its default: accepted
        ours = OffPolicyCollector([make_env], policy, frames_per_batch=8, total_frames=16, num_envs=16)
    assert type(ours) is MultiAsyncCollector
    got = first_batches(ours)
    want = first_batches(MultiAsyncCollector([make_env], policy, frames_per_batch=8, total_frames=16))
    assert len(got) == len(want) == 2
    for ours_batch, torchrl_batch in zip(got, want):
        assert ours_batch.names[-1] == "time"
        if make_env is heterogeneous_env:  # CountingEnv's entries count steps: the same on both
            assert isinstance(ours_batch.get("lazy"), LazyStackedTensorDict)
            assert_allclose_td(ours_batch, torchrl_batch)
        else:
            assert isinstance(ours_batch, LazyStackedTensorDict)


def test_an_env_of_varying_shape_names_arguments_torchrl_collector_has_no_use_for(no_leaks):
    """Our own arguments given at other than their defaults cannot reach TorchRL's collector: they are named with the
    entries that sent the env there, and nothing is left running. A subclass of ours raises the shape error itself."""
    from torchrl_unilab.envs.specs import VaryingShapeError

    with pytest.raises(ValueError, match=r"varying size \(-1\) at \['observation'\].* none of \['algo', 'obs_norm'\]"):
        OffPolicyCollector([dynamic_env], frames_per_batch=8, total_frames=16, algo="sac", obs_norm=True,
                           engine="auto")

    class Mine(OffPolicyCollector):
        pass

    with pytest.raises(VaryingShapeError, match=r"pad these entries to a fixed shape"):
        Mine([dynamic_env], frames_per_batch=8, total_frames=16)


def test_the_class_signature_is_the_constructors():
    """The metaclass that hands varying shapes to TorchRL takes any arguments; ``inspect.signature`` (Hydra's
    readers, the docs, an IDE) still sees the constructor's."""
    import inspect

    parameters = inspect.signature(OffPolicyCollector).parameters
    assert list(parameters)[:2] == ["create_env_fn", "policy"]
    assert parameters["frames_per_batch"].kind is inspect.Parameter.KEYWORD_ONLY
    assert parameters["num_envs"].default == 16


def test_non_tensor_entries_are_left_out_with_a_warning(no_leaks):
    from tensordict import NonTensorData
    from torchrl.data import NonTensor
    from torchrl.envs import StepCounter, Transform

    class AddText(Transform):
        def _call(self, next_tensordict):
            return next_tensordict.set("text", NonTensorData("a string"))

        def _reset(self, tensordict, tensordict_reset):
            return tensordict_reset.set("text", NonTensorData("reset!"))

        def transform_observation_spec(self, observation_spec):
            observation_spec["text"] = NonTensor(shape=())
            return observation_spec

    env = pendulum().append_transform(StepCounter()).append_transform(AddText())
    with pytest.warns(UserWarning, match=r"non-tensor entries \[.*'text'.*\]; OffPolicyCollector's rows live in"):
        collector = OffPolicyCollector(env, frames_per_batch=8, total_frames=8)
    with collector:
        batch = collector.next()
    assert "text" not in batch.keys() and batch.numel() == 8
