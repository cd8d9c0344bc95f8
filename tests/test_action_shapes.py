"""Actions of another shape than the env's action spec: what the probe and the workers take and refuse.

TorchRL's collectors hand the policy's action to the env as it is: ``CountingEnv`` (spec ``(1,)``) adds a
scalar action to its count, and refuses an action of two elements. ``OffPolicyCollector`` takes an action with
as many elements per env as the spec's, reshaped to the spec's shape in the rows it writes, and refuses another
number of elements with a message naming both shapes.
"""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModuleBase
from torchrl.collectors import Collector
from torchrl.envs import GymEnv
from torchrl.testing.mocking_classes import CountingEnv, MultiKeyCountingEnv

from torchrl_unilab import OffPolicyCollector
from torchrl_unilab.collectors._worker import ActionEntry
from torchrl_unilab.data.replay_buffer import make_replay_buffer


class ConstantPolicy(TensorDictModuleBase):
    """Writes ``value`` as the action, of shape ``[*batch, *shape]``: ``shape=()`` is TorchRL's test
    ``CountingPolicy`` (a scalar per env whatever the spec)."""

    def __init__(self, value: float, shape: tuple = ()) -> None:
        super().__init__()
        self.in_keys, self.out_keys = [], ["action"]
        self.value, self.shape = value, shape

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        return tensordict.set("action", torch.full((*tensordict.shape, *self.shape), self.value))


def pendulum() -> GymEnv:
    return GymEnv("Pendulum-v1")


def two_counting_envs() -> CountingEnv:
    return CountingEnv(batch_size=[2])


def collect(make_env, policy, *, replay_buffer=None, frames: int = 40) -> TensorDictBase:
    """The first batch, or the replay buffer's rows after ``frames`` frames."""
    collector = OffPolicyCollector([make_env], policy, frames_per_batch=frames // 2, total_frames=frames,
                                   replay_buffer=replay_buffer)
    try:
        if replay_buffer is None:
            return collector.next().reshape(-1)
        for _ in collector:
            pass
        return replay_buffer[:]
    finally:
        collector.shutdown()


@pytest.mark.parametrize("into", ["batches", "replay_buffer"])
def test_a_scalar_action_for_a_spec_of_shape_1_is_stepped_and_stored_with_the_specs_shape(into, no_leaks):
    rb = make_replay_buffer(64) if into == "replay_buffer" else None
    rows = collect(CountingEnv, ConstantPolicy(1.0), replay_buffer=rb)
    assert CountingEnv().action_spec.shape == (1,)
    assert rows["action"].shape == (len(rows), 1) and (rows["action"] == 1).all()
    # the env took the action: each step counts one up
    assert (rows["next", "observation"] == rows["observation"] + 1).all()
    if rb is not None:
        assert len(rb) == 40


def test_a_gym_envs_scalar_action_is_reshaped_too(no_leaks):
    """Gymnasium's Pendulum reads ``action[0]``: a scalar reaches it as ``[value]``."""
    rows = collect(pendulum, ConstantPolicy(0.5))
    assert rows["action"].shape == (20, 1) and (rows["action"] == 0.5).all()
    assert torch.isfinite(rows["next", "reward"]).all()


def test_a_batched_envs_action_without_its_last_dimension_is_reshaped(no_leaks):
    rows = collect(two_counting_envs, ConstantPolicy(1.0))
    assert rows["action"].shape == (20, 1) and (rows["action"] == 1).all()
    assert (rows["next", "observation"] == rows["observation"] + 1).all()


def test_an_action_with_another_number_of_elements_is_refused_as_torchrls_env_refuses_it(no_leaks):
    policy = ConstantPolicy(1.0, shape=(2,))
    torchrl_collector = Collector(CountingEnv, policy, frames_per_batch=10, total_frames=10)
    with pytest.raises(RuntimeError, match="doesn't match the broadcast shape"):
        next(iter(torchrl_collector))
    torchrl_collector.shutdown()
    with pytest.raises(ValueError, match=r"policy's action shape \(2,\) differs from the env's action spec shape "
                                         r"\(1,\) \(key 'action'\).*any shape with as many elements"):
        OffPolicyCollector([CountingEnv], policy, frames_per_batch=10, total_frames=10)


def test_each_key_of_a_multi_key_action_is_reshaped_to_its_spec():
    env = MultiKeyCountingEnv(batch_size=[2])
    entry = ActionEntry(env)
    action = env.full_action_spec.rand()
    azione = ("nested_2", "azione")  # spec [2, 2, 1]
    flat = action.clone().set(azione, action.get(azione).reshape(2, 2))
    shaped = entry.conform(flat, 2)
    assert shaped.get(azione).shape == (2, 2, 1) and (shaped.get(azione) == action.get(azione)).all()
    assert entry.conform(action, 2) is action
    assert entry.conform(action.clone().set(azione, torch.zeros(2, 2, 2)), 2) is None
    assert entry.conform(action.exclude(azione), 2) is None
