"""EnvPoolEnv on its own: routing, seeding, options, and EnvPool's next-step reset kept out of the transitions."""

from __future__ import annotations

import pytest
import torch

from torchrl_unilab import BatchedGymEnv, EnvPoolEnv, PrivilegedInfoTransform, make_gym_id_env, select_engine


@pytest.mark.parametrize(
    ("env_id", "engine", "kwargs", "expected"),
    [
        ("HalfCheetah-v5", "auto", {}, "envpool"),
        ("Hopper-v5", "auto", {"max_episode_steps": 60, "ctrl_cost_weight": 0.0}, "envpool"),
        ("Hopper-v5", "auto", {"healthy_z_range": (0.5, 2.0)}, "gymnasium"),
        ("Pendulum-v1", "auto", {}, "gymnasium"),
        ("HalfCheetah-v5", "gymnasium", {}, "gymnasium"),
    ],
)
def test_select_engine(env_id, engine, kwargs, expected):
    assert select_engine(env_id, engine, kwargs) == expected


def test_privileged_simulator_sources_keep_gymnasium():
    info = PrivilegedInfoTransform(info_keys=("x_velocity",))
    assert select_engine("Hopper-v5", "auto", None, info) == "gymnasium"
    assert select_engine("Hopper-v5", "auto", None, PrivilegedInfoTransform(critic_key="critic")) == "envpool"
    with pytest.raises(ValueError, match="EnvPool does not expose"):
        select_engine("Hopper-v5", "envpool", None, PrivilegedInfoTransform(mujoco=("qpos",)))


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (("Hopper-v5", "fast"), r"engine must be one of \('auto', 'envpool', 'gymnasium'\), got 'fast'"),
        (("Pendulum-v1", "envpool"), "EnvPool does not implement 'Pendulum-v1'"),
        (("Hopper-v5", "envpool", {"render_mode": "human"}), r"env_kwargs \['render_mode'\] are not options"),
    ],
)
def test_select_engine_errors(args, match):
    with pytest.raises(ValueError, match=match):
        select_engine(*args)


def test_bad_threads():
    with pytest.raises(ValueError, match="threads must be an int >= 1, got 0"):
        EnvPoolEnv("Hopper-v5", 2, threads=0)


def test_make_gym_id_env_routes():
    assert isinstance(make_gym_id_env("Hopper-v5", 2), EnvPoolEnv)
    assert isinstance(make_gym_id_env("Hopper-v5", 2, engine="gymnasium"), BatchedGymEnv)


def test_seeds_are_per_env_and_reproducible():
    def first_obs(seed, num_envs=4):
        env = EnvPoolEnv("Hopper-v5", num_envs)
        env.set_seed(seed)
        obs = env.reset()["observation"]
        env.close()
        return obs

    a, b = first_obs(7), first_obs(7)
    assert torch.equal(a, b)
    assert len(torch.unique(a, dim=0)) == 4
    # env j is seeded seed + j: env 1 of seed 7 is env 0 of seed 8
    assert torch.equal(a[1:], first_obs(8, num_envs=3))
    unseeded = [EnvPoolEnv("Hopper-v5", 1).reset()["observation"] for _ in range(2)]
    assert not torch.equal(*unseeded), "without a seed every pool draws fresh entropy"


def test_env_kwargs_reach_envpool():
    env = EnvPoolEnv("Hopper-v5", 8, seed=0, env_kwargs={"reset_noise_scale": 0.0})
    obs = env.reset()["observation"]
    assert torch.equal(obs, obs[:1].expand_as(obs)), "no reset noise: every env starts from the same state"
    env.close()


def test_next_step_reset_never_reaches_a_transition():
    """After a termination EnvPool would ignore the next action; here every transition's action acts."""
    env = EnvPoolEnv("InvertedPendulum-v5", 4, seed=0, stagger_resets=False)
    td = env.reset()
    generator = torch.Generator().manual_seed(0)
    ends = 0
    for _ in range(300):
        td["action"] = 3 * (2 * torch.rand((4, 1), generator=generator) - 1)
        before = td["observation"].clone()
        transition, td = env.step_and_maybe_reset(td)
        assert torch.equal(transition["observation"], before)
        done = transition["next", "done"].reshape(-1)
        ends += int(done.sum())
        # velocities (entries 2, 3) of the next observation move away from the reset's ~0:
        # a step taken with the action, not a reset that ignored it
        moved = (transition["next", "observation"][:, 2:] - before[:, 2:]).abs().amax(-1)
        assert (moved > 1e-3).all()
        # reset envs restart near the upright rest state; the others continue from their final state
        assert (td["observation"][done].abs() <= 0.011).all()
        assert torch.equal(td["observation"][~done], transition["next", "observation"][~done])
        assert not (transition["next", "terminated"] & transition["next", "truncated"]).any()
    assert ends >= 8
    env.close()


@pytest.mark.parametrize("lanes", [1, 2])
def test_step_info_is_each_envs_own_last_step(lanes):
    # HalfCheetah's reward is its run term plus its control term: each env's info must add up to its own reward,
    # also across lanes and on the step an env's episode ends and it is reset.
    env = EnvPoolEnv("HalfCheetah-v5", 4, seed=0, lanes=lanes, max_episode_steps=3)
    with pytest.raises(RuntimeError, match="must be reset"):
        env.step_info("reward_run")
    td = env.reset()
    with pytest.raises(RuntimeError, match="step the env first"):
        env.step_info("reward_run")
    with pytest.raises(ValueError, match=r"name must be one of HalfCheetah-v5's info entries \['reward_run'"):
        env.step_info("reward_nope")
    assert set(env.info_names) == {"reward_run", "reward_ctrl", "x_position", "x_velocity"}
    for step in range(4):
        td["action"] = torch.arange(24.0).reshape(4, 6) / 24 * (step + 1) / 4  # a different cost per env
        transition, td = env.step_and_maybe_reset(td)
        terms = env.step_info("reward_run") + env.step_info("reward_ctrl")
        assert torch.allclose(torch.as_tensor(terms, dtype=torch.float32), transition["next", "reward"][:, 0],
                              atol=1e-5)
        assert len(set(env.step_info("reward_ctrl").tolist())) == 4, "each env's own control cost"
    env.close()


def test_eval_runner_reports_info_terms_of_envpool_tasks_only():
    from tensordict.nn import TensorDictModule

    from torchrl_unilab.trainers.evaluation import EvalRunner

    with pytest.raises(ValueError, match="info_keys needs a task EnvPool runs .* 'Pendulum-v1' runs on BatchedGymEnv"):
        EvalRunner("Pendulum-v1", 2, info_keys=["reward_run"])
    still = TensorDictModule(lambda obs: torch.zeros(len(obs), 6), in_keys=["observation"], out_keys=["action"])
    evaluator = EvalRunner("HalfCheetah-v5", 2, seed=0, info_keys=["reward_ctrl", "reward_run"])
    result = evaluator(still)
    # no action, no control cost; the run term per step is the return over the 1000 steps
    assert result["eval/reward_ctrl"] == 0.0
    assert result["eval/reward_run"] == pytest.approx(result["eval/return"] / 1000, rel=1e-5)
    evaluator.close()
    evaluator = EvalRunner("HalfCheetah-v5", 2, info_keys=["nope"])
    with pytest.raises(ValueError, match=r"info_keys \['nope'\] are not info entries of HalfCheetah-v5"):
        evaluator(still)
    evaluator.close()
