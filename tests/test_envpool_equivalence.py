"""EnvPool's MuJoCo tasks against gymnasium's, for every v5 task ``engine="auto"`` routes to EnvPool.

Three checks per task:

* one step from the same state: EnvPool's observation gives the state (up to the
  x/y position, which no task's dynamics depend on); gymnasium is set to it,
  both step with the same action, and observation, reward and termination must
  agree. Over 1,000 steps with episode ends;
* whole episodes with the same actions through :class:`EnvPoolEnv` and
  :class:`BatchedGymEnv`: observation and reward statistics, terminations and
  time-limit truncations;
* the reset distributions over 1,000 resets: mean and std per coordinate.
"""

from __future__ import annotations

import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
import torch

from torchrl_unilab import BatchedGymEnv, EnvPoolEnv
from torchrl_unilab.envs.envpool_env import envpool, envpool_task_ids

V5_TASKS = sorted(t for t in envpool_task_ids() if t.endswith("-v5"))
# Tasks whose solver warm start (absent from any observation) changes the next state slightly when
# contacts or joint limits are active: their one-step agreement is checked on most steps, not all.
CONTACT_RICH = {"Ant-v5", "Humanoid-v5", "HumanoidStandup-v5", "Reacher-v5"}
# Pusher's observation lacks the object's velocity, so its state cannot be set from it.
NO_STATE_FROM_OBS = {"Pusher-v5"}
# Observations clip velocities at +-10: a clipped entry no longer gives the state.
CLIPPED_VELOCITY = {"Hopper-v5": slice(5, 11), "Walker2d-v5": slice(8, 17), "InvertedDoublePendulum-v5": slice(5, 8)}


def test_every_gymnasium_mujoco_v5_task_is_routed():
    expected = {f"{t}-v5" for t in ("Ant", "HalfCheetah", "Hopper", "Humanoid", "HumanoidStandup", "InvertedPendulum",
                                     "InvertedDoublePendulum", "Pusher", "Reacher", "Swimmer", "Walker2d")}
    assert set(V5_TASKS) == expected


def state_from_obs(env_id: str, obs: np.ndarray, nq: int, nv: int) -> tuple[np.ndarray, np.ndarray]:
    """``(qpos, qvel)`` of gymnasium's default v5 observation; x (and y) set to 0."""
    task = env_id.split("-")[0]
    if task in ("HalfCheetah", "Hopper", "Walker2d"):
        return np.r_[0.0, obs[: nq - 1]], obs[nq - 1 : nq - 1 + nv]
    if task in ("Swimmer", "Ant", "Humanoid", "HumanoidStandup"):
        return np.r_[0.0, 0.0, obs[: nq - 2]], obs[nq - 2 : nq - 2 + nv]
    if task == "InvertedPendulum":
        return obs[:2], obs[2:4]
    if task == "InvertedDoublePendulum":
        return np.r_[obs[0], np.arctan2(obs[1:3], obs[3:5])], obs[5:8]
    if task == "Reacher":  # the target never moves: its velocity is 0
        return np.r_[np.arctan2(obs[2:4], obs[0:2]), obs[4:6]], np.r_[obs[6:8], 0.0, 0.0]
    raise AssertionError(f"no state recovery for {env_id}")


@pytest.mark.parametrize("env_id", sorted(set(V5_TASKS) - NO_STATE_FROM_OBS))
def test_one_step_from_the_same_state(env_id):
    pool = envpool.make_gymnasium(env_id, num_envs=1, seed=1, max_episode_steps=2**30)
    sim = gym.make(env_id).unwrapped
    sim.reset(seed=0)
    obs = pool.reset()[0][0]
    rng = np.random.default_rng(0)
    low, high = sim.action_space.low, sim.action_space.high
    clipped = CLIPPED_VELOCITY.get(env_id)
    close, compared, ends = 0, 0, 0
    for _ in range(1000):
        action = rng.uniform(low, high)
        if clipped is None or (np.abs(obs[clipped]) < 10 - 1e-9).all():
            sim.set_state(*state_from_obs(env_id, obs, sim.model.nq, sim.model.nv))
            sim_obs, sim_reward, sim_terminated, _, _ = sim.step(action)
            compared += 1
        else:
            sim_obs = None
        next_obs, reward, terminated, _, _ = pool.step(action[None])
        next_obs, reward, terminated = next_obs[0], reward[0], bool(terminated[0])
        if sim_obs is not None:
            assert terminated == sim_terminated
            # For contact-rich tasks the state part of the observation (nq - 2 + nv entries): derived
            # entries such as contact forces amplify the warm-start difference.
            n = len(sim_obs) if env_id not in CONTACT_RICH else sim.model.nq - 2 + sim.model.nv
            tol = dict(rtol=1e-5, atol=1e-6) if env_id not in CONTACT_RICH else dict(rtol=1e-3, atol=1e-3)
            ok = np.allclose(next_obs[:n], sim_obs[:n], **tol) and np.isclose(reward, sim_reward, **tol)
            assert ok or env_id in CONTACT_RICH, (
                f"{env_id}: max obs error {np.abs(next_obs - sim_obs).max():.2e}, reward {reward} vs {sim_reward}"
            )
            close += ok
        obs = next_obs
        if terminated:
            ends += 1
            obs = pool.reset(np.zeros(1, dtype=np.int32))[0][0]
    pool.close()
    assert compared >= 200
    # Every step agrees for the other tasks (asserted above); the contact-rich ones on most steps (Ant: 70%).
    assert close >= 0.6 * compared, f"{env_id}: {close} of {compared} steps agree"
    if env_id in ("Hopper-v5", "Walker2d-v5", "InvertedPendulum-v5", "InvertedDoublePendulum-v5", "Humanoid-v5"):
        assert ends > 0, "random actions end these tasks' episodes: the termination rule was not exercised"


def _rollout(env, actions: torch.Tensor) -> dict[str, torch.Tensor]:
    td = env.reset()
    rows = []
    for action in actions:
        td["action"] = action
        transition, td = env.step_and_maybe_reset(td)
        rows.append(transition)
    env.close()
    return torch.stack(rows).reshape(-1)


@pytest.mark.parametrize("env_id", V5_TASKS)
def test_same_actions_same_statistics(env_id):
    """1,024 steps (8 envs x 128) per engine with a 64-step limit, the same uniformly random actions."""
    limit = 64
    kwargs = dict(num_envs=8, seed=0, env_kwargs={"max_episode_steps": limit}, stagger_resets=False)
    ours, theirs = EnvPoolEnv(env_id, **kwargs), BatchedGymEnv(env_id, **kwargs)
    generator = torch.Generator().manual_seed(0)
    low, high = theirs.action_spec.space.low, theirs.action_spec.space.high
    actions = low + (high - low) * torch.rand((128, *theirs.action_spec.shape), generator=generator)
    a, b = _rollout(ours, actions), _rollout(theirs, actions)
    for key in ("observation", ("next", "reward")):
        x, y = a[key].double(), b[key].double()
        spread = torch.cat([x, y]).std(0)
        varies = spread > 1e-6  # e.g. contact forces of bodies that never touch anything are always 0
        assert torch.equal(x[:, ~varies], y[:, ~varies]), f"{env_id}: {key} constant entries differ"
        # 1,024 correlated steps of chaotic systems: per-entry differences of a fraction of the spread are
        # sampling noise, a wrong reward weight or observation entry is not. The bounds leave headroom over the
        # gaps of two engines with the same dynamics; single entries of sparse contact forces vary far more, so
        # only medians count there.
        mean_gap = ((x.mean(0) - y.mean(0)).abs() / spread)[varies]
        std_ratio = (x.std(0) / y.std(0))[varies]
        assert mean_gap.median() < 0.1 and mean_gap.max() < 0.8, f"{env_id}: {key} mean gaps {mean_gap}"
        assert (std_ratio.median() - 1).abs() < 0.15, f"{env_id}: {key} std ratios {std_ratio}"
    for rows in (a, b):
        assert not (rows["next", "terminated"] & rows["next", "truncated"]).any()
    n_term = [int(r["next", "terminated"].sum()) for r in (a, b)]
    n_trunc = [int(r["next", "truncated"].sum()) for r in (a, b)]
    assert abs(n_term[0] - n_term[1]) <= max(3, n_term[1] // 4), f"{env_id}: terminations {n_term}"
    if n_term == [0, 0]:  # every env reaches the limit twice in 128 steps
        assert n_trunc == [16, 16], f"{env_id}: truncations {n_trunc}"
    else:
        assert abs(n_trunc[0] - n_trunc[1]) <= 3, f"{env_id}: truncations {n_trunc}"


@pytest.mark.parametrize("env_id", V5_TASKS)
def test_reset_distribution(env_id):
    pool = envpool.make_gymnasium(env_id, num_envs=20, seed=0)
    ids = np.arange(20, dtype=np.int32)
    ours = np.concatenate([pool.reset(ids)[0] for _ in range(50)])
    pool.close()
    sim = gym.make(env_id)
    theirs = np.stack([sim.reset(seed=0 if i == 0 else None)[0] for i in range(1000)])
    sim.close()
    assert ours.shape == theirs.shape == (1000, theirs.shape[1])
    assert len(np.unique(ours, axis=0)) == 1000, "every EnvPool reset must draw fresh noise"
    std = np.maximum(ours.std(0), theirs.std(0))
    # Means agree within 5 standard errors of their difference; stds within 15%.
    assert (np.abs(ours.mean(0) - theirs.mean(0)) <= 5 * std * np.sqrt(2 / 1000) + 1e-9).all()
    assert (np.abs(ours.std(0) - theirs.std(0)) <= 0.15 * std + 1e-9).all()


def test_only_gymnasiums_settotalmass_deprecation_is_silenced():
    # Under `-W always` every warning shows: HalfCheetah-v5's 'settotalmass' deprecation must not, another
    # MuJoCo warning (passed through the handler batched_env installs) must.
    code = (
        "import mujoco, torchrl_unilab.envs.batched_env, gymnasium as gym\n"
        "gym.make('HalfCheetah-v5').reset(seed=0)\n"
        "mujoco.get_mju_user_warning()('Nan, Inf or huge value in QACC at DOF 0')\n"
    )
    result = subprocess.run([sys.executable, "-W", "always", "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "settotalmass" not in result.stdout + result.stderr
    assert "RuntimeWarning: MuJoCo: Nan, Inf or huge value in QACC" in result.stderr
