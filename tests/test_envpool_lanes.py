"""EnvPoolEnv's asynchronous lanes: the same transitions as one synchronous batch, and clear misuse errors."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict
from torchrl.data import Bounded

from torchrl_unilab import EnvPoolEnv
from torchrl_unilab.collectors._worker import LanePolicyState
from torchrl_unilab.modules.exploration import PerEnvMixedNoise


def lane_step(env: EnvPoolEnv, td):
    """All lanes sent, then received in reverse order; the results put back in env order."""
    for lane, envs in enumerate(env.lane_slices):
        env.send_lane(lane, td[envs])
    got = {lane: env.recv_lane(lane) for lane in reversed(range(env.lanes))}
    parts = [got[lane] for lane in range(env.lanes)]
    return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])


@pytest.mark.parametrize("lanes", [2, 4])
def test_lanes_step_exactly_like_one_batch(lanes):
    torch.manual_seed(0)
    kwargs = dict(seed=3, env_kwargs={"max_episode_steps": 20})
    one, laned = EnvPoolEnv("Hopper-v5", 8, **kwargs), EnvPoolEnv("Hopper-v5", 8, lanes=lanes, **kwargs)
    td_one, td_laned = one.reset(), laned.reset()
    assert torch.equal(td_one["observation"], td_laned["observation"])  # env j keeps seed + j
    ends = 0
    for i in range(120):
        action = one.action_spec.rand()
        td_one["action"], td_laned["action"] = action, action.clone()
        x_one, td_one = one.step_and_maybe_reset(td_one)
        # Alternate the synchronous step (all lanes at once) with the asynchronous one, in reverse order.
        x_laned, td_laned = laned.step_and_maybe_reset(td_laned) if i % 2 else lane_step(laned, td_laned)
        assert (x_one == x_laned).all(), f"step {i}"
        assert torch.equal(td_one["observation"], td_laned["observation"]), f"step {i}"
        ends += int(x_one["next", "done"].sum())
    assert ends > 8  # staggered time limits and falls: many resets happened inside lanes
    one.close()
    laned.close()


def test_lane_misuse_errors():
    with pytest.raises(ValueError, match=r"lanes must be an int >= 1 that divides num_envs=8, got 3"):
        EnvPoolEnv("Hopper-v5", 8, lanes=3)
    with pytest.raises(ValueError, match="lanes must be"):
        EnvPoolEnv("Hopper-v5", 8, lanes=0)
    env = EnvPoolEnv("Hopper-v5", 4, lanes=2, seed=0)
    td = env.reset()
    td["action"] = env.action_spec.zero()
    with pytest.raises(RuntimeError, match=r"lane 1 has no step in flight: call send_lane\(1, td\) first"):
        env.recv_lane(1)
    env.send_lane(0, td[:2])
    with pytest.raises(RuntimeError, match=r"lane 0 already has a step in flight"):
        env.send_lane(0, td[:2])
    with pytest.raises(RuntimeError, match=r"lane 0 has a step in flight: call recv_lane\(0\) before resetting it"):
        env.reset()
    transition, root = env.recv_lane(0)
    assert transition.batch_size == root.batch_size == torch.Size([2])
    env.close()


def test_each_lane_keeps_its_own_per_env_noise():
    noise = PerEnvMixedNoise(Bounded(-1.0, 1.0, shape=(2,)), std_min=0.0, std_max=1.0)
    state = LanePolicyState(noise, lanes=2)

    def call(lane, is_init):
        td = TensorDict({"action": torch.zeros(3, 2), "is_init": torch.full((3, 1), is_init)}, batch_size=[3])
        with state.policy_state(lane):
            noise(td)
        return noise.stds

    first0, first1 = call(0, True), call(1, True)
    assert not torch.equal(first0, first1)
    # Mid-episode rows keep their std, each lane its own.
    assert torch.equal(call(0, False), first0) and torch.equal(call(1, False), first1)
    assert "_stds" not in noise.state_dict()
