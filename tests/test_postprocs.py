"""n-step rows (``collector.multi_step``): each row is the transition from its state to its window's end."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf
from tensordict import TensorDict
from torchrl.data.postprocs import MultiStep

from torchrl_unilab.data.postprocs import MultiStepWithDone
from torchrl_unilab.trainers.collection import make_collector, multi_step_postproc

ENVS, STEPS, GAMMA = 3, 12, 0.9


def episodes(seed: int = 0) -> TensorDict:
    """``[envs, steps]`` of a task that terminates and truncates, laid out as the collector hands a postproc."""
    g = torch.Generator().manual_seed(seed)
    terminated = torch.rand(ENVS, STEPS, 1, generator=g) < 0.15
    truncated = (torch.rand(ENVS, STEPS, 1, generator=g) < 0.1) & ~terminated
    observation = torch.randn(ENVS, STEPS, 2, generator=g)
    return TensorDict({"observation": observation, "next": {
        "observation": observation + 10.0, "reward": torch.randn(ENVS, STEPS, 1, generator=g),
        "terminated": terminated, "truncated": truncated, "done": terminated | truncated}}, [ENVS, STEPS])


def window_end(done: torch.Tensor, t: int, n_steps: int) -> int:
    """The last step of row t's window: n steps, or fewer at a done step or at the batch's end."""
    end = t
    while end < min(t + n_steps, STEPS) - 1 and not done[end]:
        end += 1
    return end


@pytest.mark.parametrize("n_steps", [1, 2, 3, 5])
def test_each_row_runs_to_its_window_end_with_that_steps_done_flags(n_steps):
    batch = episodes()
    out = MultiStepWithDone(gamma=GAMMA, n_steps=n_steps)(batch)
    for env in range(ENVS):
        done = batch["next", "done"][env, :, 0]
        for t in range(STEPS):
            end = window_end(done, t, n_steps)
            rewards = batch["next", "reward"][env, t:end + 1, 0]
            expected = sum(GAMMA ** i * r for i, r in enumerate(rewards.tolist()))
            assert out["next", "reward"][env, t, 0].item() == pytest.approx(expected, abs=1e-5)
            assert out["steps_to_next_obs"][env, t].item() == end - t + 1
            assert torch.equal(out["next", "observation"][env, t], batch["next", "observation"][env, end])
            for key in ("terminated", "truncated", "done"):
                assert out["next", key][env, t].item() == batch["next", key][env, end].item(), (key, env, t)
            assert out["observation"][env, t].equal(batch["observation"][env, t])


def test_torchrl_multistep_leaves_a_window_that_reaches_a_termination_bootstrapping():
    """Why the subclass exists: TorchRL 0.14's MultiStep keeps each row's own done flags. Should TorchRL gather
    them too, this test fails and MultiStepWithDone can go."""
    batch = episodes()
    theirs, ours = MultiStep(gamma=GAMMA, n_steps=3)(batch), MultiStepWithDone(gamma=GAMMA, n_steps=3)(batch)
    # rows whose window ends on a termination a step or more later
    ends_terminal = ours["next", "terminated"][..., 0] & ~batch["next", "terminated"][..., 0]
    assert ends_terminal.any()
    assert not theirs["next", "terminated"][..., 0][ends_terminal].any()
    for key in ("reward", "observation"):  # everything else is TorchRL's
        assert torch.equal(ours["next", key], theirs["next", key])
    assert torch.equal(ours["steps_to_next_obs"], theirs["steps_to_next_obs"])


def test_multi_step_config_is_checked_and_needs_the_local_backend():
    cfg = OmegaConf.create({"collector": {"multi_step": 3, "backend": "ray", "num_workers": 1, "total_frames": 64},
                            "optim": {"gamma": 0.99}, "env": {"name": "Pendulum-v1"}})
    assert multi_step_postproc(cfg).n_steps == 3
    with pytest.raises(ValueError, match=r"collector.multi_step=3 needs collector.backend=local"):
        make_collector(cfg, None, None)
    for bad in (-1, 2.5, True, "3"):
        cfg.collector.multi_step = bad
        with pytest.raises(ValueError, match=r"collector.multi_step must be an int >= 0 \(0 or 1: one-step"):
            multi_step_postproc(cfg)
    cfg.collector.multi_step = 1
    assert multi_step_postproc(cfg) is None
