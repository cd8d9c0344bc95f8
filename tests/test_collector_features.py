"""Exploration, privileged information and observation normalisation inside real collector workers."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import linear_policy, wait_until
from tensordict import TensorDict
from torchrl.envs import GymEnv, TransformedEnv

from torchrl_unilab import (
    BatchedGymEnv,
    ObservationNormalizer,
    OffPolicyCollector,
    PrivilegedInfoTransform,
    make_replay_buffer,
)
from torchrl_unilab.envs.privileged import resolve_collector_actor_dims, resolve_offpolicy_actor_priv_info
from torchrl_unilab.modules.models import make_actor


def per_traj_std(rows, min_len: int) -> dict[int, torch.Tensor]:
    out = {}
    ids = rows["collector", "traj_ids"]
    for traj in ids.unique().tolist():
        actions = rows[ids == traj]["action"]
        if len(actions) >= min_len:
            out[traj] = actions.std()
    return out


def test_td3_per_env_noise_survives_weight_sync(no_leaks):
    actor = make_actor("td3", 17, 6, hidden_dim=16)
    with torch.no_grad():
        for p in actor.parameters():
            p.zero_()  # the deterministic action is 0, so each stored action is pure noise
    rb = make_replay_buffer(20_000)
    with OffPolicyCollector("HalfCheetah-v5", actor, algo="td3", td3_std_min=0.05, td3_std_max=0.5,
                            num_workers=1, num_envs=8, frames_per_batch=800, replay_buffer=rb, seed=0,
                            env_kwargs={"max_episode_steps": 600}, stagger_resets=False) as collector:
        collector.allow_frames(1600)
        assert collector.wait_for_frames(1600, timeout=60)
        collector.update_policy_weights_()  # same (zero) weights, new version
        collector.allow_frames(3200)
        assert collector.wait_for_frames(3200, timeout=60)
        rows = rb[:3200]
    # HalfCheetah's action half-range is 1: std estimates lie in [std_min, std_max].
    before = per_traj_std(rows[rows["policy_version"] == 1], 150)
    after = per_traj_std(rows[rows["policy_version"] == 2], 150)
    assert len(before) == 8 and set(before) == set(after), "the same 8 episodes span the sync"
    stds = torch.stack(list(before.values()))
    assert (stds > 0.04).all() and (stds < 0.55).all()
    assert stds.max() / stds.min() > 1.5, "each env draws its own std"
    ratios = torch.stack([after[t] / before[t] for t in before])
    assert ((ratios > 0.8) & (ratios < 1.25)).all(), f"stds changed across the weight sync: {ratios}"


def test_privileged_final_state_reaches_buffer(no_leaks):
    rb = make_replay_buffer(8192)
    with OffPolicyCollector("Hopper-v5", linear_policy(11, 3), num_workers=1, num_envs=4, frames_per_batch=400,
                            total_frames=2000, replay_buffer=rb, seed=1,
                            privileged=PrivilegedInfoTransform(mujoco=("qpos", "qvel"), info_keys=("x_velocity",)),
                            env_kwargs={"max_episode_steps": 40}) as collector:
        for _ in collector:
            pass
    rows = rb[:2000]
    priv, next_priv = rows["privileged"], rows["next", "privileged"]
    assert priv.shape == (2000, 13)
    # layout: [x_velocity (info), qpos (6), qvel (6)]. Hopper's observation is qpos[1:] followed
    # by qvel: the privileged qpos[1:6] must match it
    # on every row, including episode ends, where the final state (not the reset) is stored.
    done = rows["next", "done"].reshape(-1)
    assert done.sum() > 10
    torch.testing.assert_close(next_priv[:, 2:7], rows["next", "observation"][:, :5])
    torch.testing.assert_close(priv[:, 2:7], rows["observation"][:, :5])
    # gymnasium's info x_velocity is the finite difference of qpos[0] over the step (dt = 0.008 s)
    torch.testing.assert_close(next_priv[:, 0], (next_priv[:, 1] - priv[:, 1]) / 0.008, rtol=1e-3, atol=1e-3)


def test_privileged_critic_key_with_custom_env():
    class CriticObsEnv(BatchedGymEnv):
        """A custom env that writes its own critic observation."""

        def __init__(self):
            super().__init__("Pendulum-v1", 2, seed=0)
            from torchrl.data import Unbounded

            self.observation_spec["critic_obs"] = Unbounded(shape=(2, 2), dtype=torch.float32)

        def _reset(self, td=None, **kw):
            out = super()._reset(td, **kw)
            return out.set("critic_obs", out["observation"][:, :2] * 10)

        def _step(self, td):
            out = super()._step(td)
            return out.set("critic_obs", out["observation"][:, :2] * 10)

    env = TransformedEnv(CriticObsEnv(), PrivilegedInfoTransform(critic_key="critic_obs", out_key="priv"))
    td = env.rollout(3)
    torch.testing.assert_close(td["next", "priv"], td["next", "observation"][..., :2] * 10)
    transform = PrivilegedInfoTransform(mujoco=("qpos",))
    env = TransformedEnv(GymEnv("Pendulum-v1"), transform)  # noqa: F841 - the parent is held weakly
    with pytest.raises(TypeError, match="need a torchrl_unilab.BatchedGymEnv as base env, got GymEnv"):
        transform.dim  # noqa: B018


def test_privileged_bad_source():
    with pytest.raises(ValueError, match="at least one source"):
        PrivilegedInfoTransform()
    env = TransformedEnv(BatchedGymEnv("Hopper-v5", 1), PrivilegedInfoTransform(info_keys=("nope",)))
    with pytest.raises(ValueError, match="info_keys entry 'nope'.*accepted keys"):
        env.observation_spec  # noqa: B018


def test_obs_norm_stats_reach_workers_and_buffer_stays_raw(no_leaks):
    rb = make_replay_buffer(16_384)
    with OffPolicyCollector("Hopper-v5", linear_policy(11, 3), obs_norm=True, num_workers=2, num_envs=4,
                            frames_per_batch=256, replay_buffer=rb, seed=0) as collector:
        norm = collector.obs_norm
        assert isinstance(norm, ObservationNormalizer)
        collector.start()
        assert collector.wait_for_frames(2048, timeout=60)
        norm.update(rb[:2048]["observation"])  # the learner: the only writer of the statistics
        mean = norm.mean.clone()
        collector.update_policy_weights_()
        start = collector.frames_written
        assert collector.wait_for_frames(start + 2048, timeout=60)
        assert wait_until(lambda: collector.metrics()["policy_version"] == 2)
        rows = rb[: collector.frames_written]
        new = rows[rows["policy_version"] == 2]
        assert len(new) > 1000
        # raw observations in the buffer: Hopper's torso height is about 1.25
        assert ((rows["observation"][:, 0] > 0.5) & (rows["observation"][:, 0] < 2.0)).mean(dtype=torch.float) > 0.95
        # the workers' actions are the learner's policy (normaliser + actor) applied to those raw observations
        with torch.no_grad():
            expected = collector.policy(TensorDict({"observation": new["observation"]}, [len(new)]))["action"]
        torch.testing.assert_close(new["action"], expected, rtol=1e-5, atol=1e-5)
        old = rows[rows["policy_version"] == 1]
        norm_state = norm.state_dict()
        norm.load_state_dict({k: torch.zeros_like(v) if k == "mean" else v for k, v in norm_state.items()})
        with torch.no_grad():
            unnormalised = collector.policy(TensorDict({"observation": old["observation"]}, [len(old)]))["action"]
        assert not torch.allclose(new["action"], expected * 0) and torch.equal(norm.mean, torch.zeros_like(mean))
        assert unnormalised.shape == old["action"].shape


def test_seed_helpers():
    obs = np.zeros((4, 3))
    assert resolve_offpolicy_actor_priv_info(algo_type="td3", obs_np=obs, critic_np=None, info=None) is None
    ctx = resolve_offpolicy_actor_priv_info(algo_type="sac_priv", obs_np=obs, critic_np=None,
                                            info={"privileged": np.ones((4, 2))})
    assert ctx.shape == (4, 2) and ctx.dtype == np.float32
    # critic_np wins over info
    ctx = resolve_offpolicy_actor_priv_info(algo_type="sac_priv", obs_np=obs, critic_np=np.full((4, 5), 2.0),
                                            info={"privileged": np.ones((4, 2))})
    assert ctx.shape == (4, 5) and (ctx == 2).all()
    with pytest.raises(ValueError, match="needs privileged context"):
        resolve_offpolicy_actor_priv_info(algo_type="td3_priv", obs_np=obs, critic_np=None, info={})
    with pytest.raises(ValueError, match=r"algo_type must be one of \('sac', 'td3', 'sac_priv', 'td3_priv'\)"):
        resolve_offpolicy_actor_priv_info(algo_type="ppo", obs_np=obs, critic_np=None, info={})
    env = BatchedGymEnv("Hopper-v5", 2)
    assert resolve_collector_actor_dims(env) == (11, 3)
    assert resolve_collector_actor_dims(env, obs_dim=11) == (11, 3)
    with pytest.raises(ValueError, match="obs_dim=12 contradicts the env, whose obs_dim is 11"):
        resolve_collector_actor_dims(env, obs_dim=12)
    with pytest.raises(ValueError, match="action_dim is needed when env is None"):
        resolve_collector_actor_dims(None, obs_dim=3)
    env.close()


def test_collector_algo_argument_is_validated(no_leaks):
    with pytest.raises(ValueError, match="algo must be one of"):
        OffPolicyCollector("Pendulum-v1", make_actor("sac", 3, 1, hidden_dim=8), algo="ppo", num_envs=2,
                           frames_per_batch=2)
    with pytest.raises(TypeError, match="obs_norm must be"):
        OffPolicyCollector("Pendulum-v1", linear_policy(3, 1), obs_norm="yes", num_envs=2,
                           frames_per_batch=2)
