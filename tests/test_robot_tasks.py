"""MuJoCo Playground and DeepMind Control Suite tasks on EnvPool: layouts, specs, episode ends, collectors, critics.

Real EnvPool envs and real worker processes throughout. The Control Suite's own
Python tasks (dm_control 1.0.50) do not run beside our MuJoCo 4.0.0 (``suite.load``
fails on a missing ``MjModel`` field), so its semantics are held here to the
suite's documented ones: the observation order of each task's
``get_observation``, episodes that end only at the time limit (1,000 steps),
as ``truncated``.
"""

from __future__ import annotations

import multiprocessing as mp
import time

import pytest
import torch
from omegaconf import OmegaConf
from tensordict import TensorDict
from torchrl.data import Unbounded
from torchrl.envs.utils import check_env_specs

from torchrl_unilab import EnvPoolEnv, OffPolicyCollector, SharedWeights, layout_of, make_gym_id_env, make_replay_buffer
from torchrl_unilab.envs.envpool_env import select_engine
from torchrl_unilab.envs.task_families import observation_layout, task_family
from torchrl_unilab.modules.models import make_actor
from torchrl_unilab.objectives import tensor_loss
from torchrl_unilab.trainers.recipes_utils import critic_input, env_info, make_loss_module, make_networks
from torchrl_unilab.worker import CollectorProcess, init_offpolicy_storage, make_collector_actor

GO1, CHEETAH = "Go1JoystickFlatTerrain-v1", "CheetahRun-v1"


# ----------------------------------------------------------------- the table
@pytest.mark.parametrize(
    ("env_id", "family", "dims"),
    [
        (GO1, "playground", {"observation": 48, "privileged": 123}),
        ("G1JoystickFlatTerrain-v1", "playground", {"observation": 103, "privileged": 216}),
        ("T1JoystickFlatTerrain-v1", "playground", {"observation": 85, "privileged": 180}),
        ("BerkeleyHumanoidJoystickFlatTerrain-v1", "playground", {"observation": 52, "privileged": 114}),
        ("SpotFlatTerrainJoystick-v1", "playground", {"observation": 81, "privileged": 167}),
        ("LeapCubeReorient-v1", "playground", {"observation": 57, "privileged": 128}),
        ("Go1Getup-v1", "playground", {"observation": 42, "privileged": 91}),
        ("PandaPickCube-v1", "playground", {"observation": 66}),  # manipulation: no critic state
        (CHEETAH, "dm_control", {"observation": 17}),
        ("WalkerWalk-v1", "dm_control", {"observation": 24}),
        ("HumanoidRun-v1", "dm_control", {"observation": 67}),
        ("HalfCheetah-v5", "gymnasium", {"observation": 17}),
    ],
)
def test_layouts(env_id, family, dims):
    layout = observation_layout(env_id)
    assert (layout.family, layout.dims) == (family, dims)


@pytest.mark.parametrize(
    ("env_id", "order"),
    [  # dm_control/suite/<domain>.py, get_observation: the OrderedDict each task builds
        (CHEETAH, ["position", "velocity"]),
        ("WalkerWalk-v1", ["orientations", "height", "velocity"]),
        (
            "HumanoidRun-v1",
            ["joint_angles", "head_height", "extremities", "torso_vertical", "com_velocity", "velocity"],
        ),
        ("HumanoidRunPureState-v1", ["position", "velocity"]),
        ("FishSwim-v1", ["joint_angles", "upright", "target", "velocity"]),
        ("FingerSpin-v1", ["position", "velocity", "touch"]),
        ("FingerTurnEasy-v1", ["position", "velocity", "touch", "target_position", "dist_to_target"]),
        ("QuadrupedRun-v1", ["egocentric_state", "torso_velocity", "torso_upright", "imu", "force_torque"]),
    ],
)
def test_control_suite_parts_in_the_suite_order(env_id, order):
    slices = observation_layout(env_id).slices()
    assert list(slices) == order
    assert [s.start for s in slices.values()][1:] == [s.stop for s in slices.values()][:-1], "contiguous"


def test_routing_and_errors():
    assert select_engine(GO1) == select_engine(CHEETAH) == "envpool"
    assert task_family("MuJoCoPlayground/Go1Getup-v1").name == "playground"
    with pytest.raises(ValueError, match="engine='gymnasium' cannot run 'CheetahRun-v1': it is a DeepMind Control"):
        select_engine(CHEETAH, "gymnasium")
    with pytest.raises(ValueError, match=r"env_kwargs \['healthy_reward'\] are not options of EnvPool's Go1.*"
                                         r"accepted: \[.*'kp'"):
        select_engine(GO1, "auto", {"healthy_reward": 1.0})
    with pytest.raises(ValueError, match="'Pendulum-v1' is not an id of EnvPool's"):
        observation_layout("Pendulum-v1")


# ---------------------------------------------------------------- real envs
def rollout(env, steps: int, action=None, seed: int = 0):
    """``steps`` of ``step_and_maybe_reset`` with ``action`` (default uniform); the transitions and roots."""
    generator = torch.Generator().manual_seed(seed)
    td, transitions, roots = env.reset(), [], []
    for _ in range(steps):
        shape = env.action_spec.shape
        td["action"] = action.expand(shape) if action is not None else 2 * torch.rand(shape, generator=generator) - 1
        transition, td = env.step_and_maybe_reset(td)
        transitions.append(transition)
        roots.append(td)
    return transitions, roots


@pytest.mark.parametrize("env_id", [GO1, CHEETAH])
def test_specs_dtypes_and_bounds(env_id):
    env = EnvPoolEnv(env_id, 3, seed=0)
    check_env_specs(env)
    obs = env.observation_spec
    assert set(obs.keys()) == set(observation_layout(env_id).keys)
    assert all(spec.dtype == torch.float32 for spec in obs.values())
    assert env.reward_spec.dtype == torch.float32 and env.action_spec.dtype == torch.float32
    assert env.action_spec.space.low.eq(-1).all() and env.action_spec.space.high.eq(1).all()
    # EnvPool's Control Suite specs declare (DBL_MIN, DBL_MAX) bounds; the observations are unbounded
    assert all(isinstance(spec, Unbounded) for spec in obs.values())
    env.close()


def test_playground_privileged_state_final_observation_and_truncation():
    """Go1: the critic state travels with the actor's; a time-limit end is truncated with its true final state."""
    zero = torch.zeros(12)
    short = EnvPoolEnv(GO1, 2, seed=3, max_episode_steps=5, stagger_resets=False)
    long = EnvPoolEnv(GO1, 2, seed=3, stagger_resets=False)  # the same envs, not cut at 5 steps
    assert long.max_episode_steps == 1000  # Playground's episode_length, EnvPool's registered limit
    cut, roots = rollout(short, 6, zero)
    full, _ = rollout(long, 5, zero)
    for key in ("observation", "privileged"):
        # the final state of the cut episode is the state the uncut one reaches: not a reset
        assert torch.equal(cut[4]["next", key], full[4]["next", key])
        assert not torch.equal(roots[4][key], cut[4]["next", key]), "the root holds the reset state"
        assert torch.equal(cut[5][key], roots[4][key])  # the next step starts from the reset state
    assert cut[4]["next", "truncated"].all() and not cut[4]["next", "terminated"].any()
    assert not any(t["next", "done"].any() for t in cut[:4])
    # Playground's Go1 critic state starts with the actor's state (noise included), then the clean simulator state
    assert cut[0]["privileged"].shape == (2, 123)
    assert torch.equal(cut[0]["privileged"][:, :48], cut[0]["observation"]) and cut[0]["privileged"][:, 48:].any()
    short.close()
    long.close()


def test_playground_falls_terminate():
    """Random torques tip Go1 over: Playground's fall check ends the episode as terminated, never truncated too."""
    env = EnvPoolEnv(GO1, 4, seed=0, max_episode_steps=200, stagger_resets=False)
    transitions, roots = rollout(env, 60)
    terminated = torch.stack([t["next", "terminated"] for t in transitions])
    truncated = torch.stack([t["next", "truncated"] for t in transitions])
    assert terminated.any() and not truncated.any()
    step, i = (int(x) for x in terminated[..., 0].nonzero()[0])
    # the fallen robot's final state stays in the transition; its env restarted in place
    assert not torch.equal(transitions[step]["next", "observation"][i], roots[step]["observation"][i])
    env.close()


def test_control_suite_episodes_end_at_the_time_limit_only():
    """CheetahRun: no termination (the suite's cheetah has none), truncated at 1,000 steps (10 s at 0.01 s)."""
    env = EnvPoolEnv(CHEETAH, 2, seed=0, stagger_resets=False)
    assert env.max_episode_steps == 1000
    transitions, roots = rollout(env, 1001)
    done = torch.stack([t["next", "done"][:, 0] for t in transitions])
    assert not torch.stack([t["next", "terminated"] for t in transitions]).any()
    assert done.nonzero()[:, 0].unique().tolist() == [999]
    assert transitions[999]["next", "truncated"].all()
    final, reset = transitions[999]["next", "observation"], roots[999]["observation"]
    position = env.observation_slices["position"]
    # the final state is a running cheetah's; the reset one is the suite's initial pose, qpos near 0
    assert not torch.equal(final, reset) and reset[:, position].abs().max() < 1.0
    assert transitions[999]["next", "reward"].dtype == torch.float32
    env.close()


# ------------------------------------------------------- workers and critics
def test_collector_writes_privileged_rows(no_leaks):
    actor = make_actor("td3", 48, 12, hidden_dim=16, use_layer_norm=False)
    rb = make_replay_buffer(capacity=512, batch_size=8)
    with OffPolicyCollector(GO1, actor, algo="td3", num_envs=4, frames_per_batch=64, total_frames=128,
                            replay_buffer=rb, init_random_frames=64, seed=0) as collector:
        for _ in collector:
            pass
        assert collector.metrics()["engine"] == "envpool"
    rows = rb.storage[: len(rb)]
    assert len(rb) == 128
    for key in ("privileged", ("next", "privileged")):
        assert rows[key].shape == (128, 123) and rows[key].dtype == torch.float32
    assert rows["observation"].shape == (128, 48)
    assert (rows["policy_version"] >= 0).any(), "rows of the actor, not only random ones"
    del collector, rb, rows


def test_function_api_td3_priv_on_a_playground_robot(no_leaks):
    """algo_type='td3_priv' with a Playground id: the workers' actor reads the task's own critic state."""
    rb = make_replay_buffer(2048)
    init_offpolicy_storage(rb, GO1)
    env = make_gym_id_env(GO1, 1)
    actor = make_collector_actor("td3_priv", env, actor_hidden_dim=16, use_layer_norm=False)
    env.close()
    assert list(actor.in_keys) == ["observation", "privileged"]
    weights = SharedWeights.create(actor)
    try:
        with CollectorProcess(stop_event=mp.get_context("spawn").Event(), env_name=GO1, num_envs=4, replay_buffer=rb,
                              weight_sync_name=weights.name, weight_param_shapes=layout_of(actor),
                              algo_type="td3_priv", actor_hidden_dim=16, use_layer_norm=False, seed=0) as proc:
            deadline = time.monotonic() + 60
            while rb.write_count < 64 and time.monotonic() < deadline:
                proc.raise_if_failed()
                time.sleep(0.05)
        rows = rb.storage[: min(len(rb), 64)]
        assert len(rows) == 64 and rows["privileged"].abs().sum() > 0
    finally:
        weights.close()


@pytest.mark.parametrize("algo", ["sac", "td3"])
@pytest.mark.parametrize("fast", [False, True])
def test_asymmetric_critic_gradients_reach_only_its_inputs(algo, fast):
    """network.critic_input=privileged: the critic reads ["privileged", "action"], the actor "observation"."""
    cfg = OmegaConf.create({
        "env": {"name": GO1},
        "network": {"hidden_sizes": [16], "use_layer_norm": False, "obs_norm": True, "critic_input": "privileged"},
        "optim": {"gamma": 0.99, "loss_function": "l2", "alpha_init": 1.0, "target_update_polyak": 0.995,
                  "policy_noise": 0.2, "noise_clip": 0.5},
    })
    nets = make_networks(cfg, algo, env_info(cfg))
    assert list(nets.critic.in_keys) == ["privileged", "action"] and nets.critic_key == "privileged"
    assert nets.critic_normalizer.in_keys == ["privileged"] and nets.normalizer.in_keys == ["observation"]
    assert {"privileged", ("next", "privileged")} <= set(nets.sample_keys)
    loss_module, _ = make_loss_module(cfg, algo, nets)
    n = 32
    batch = {"observation": torch.randn(n, 48), "privileged": torch.randn(n, 123),
             "action": torch.rand(n, 12) * 2 - 1}
    for key in ("observation", "privileged"):
        batch[key].requires_grad_(True)
    td = TensorDict({**batch, "next": {"observation": torch.randn(n, 48), "privileged": torch.randn(n, 123),
                                       "reward": torch.randn(n, 1), "done": torch.zeros(n, 1, dtype=torch.bool),
                                       "terminated": torch.zeros(n, 1, dtype=torch.bool)}}, [n])
    loss_fn = tensor_loss(loss_module) if fast else loss_module
    assert loss_fn is not None
    losses = loss_fn(td)
    losses["loss_qvalue"].backward()
    assert batch["privileged"].grad.abs().sum() > 0
    assert batch["observation"].grad is None or not batch["observation"].grad.any(), \
        "the critic's loss reached the actor's observation"
    actor_grads = [p.grad for p in nets.actor.parameters() if p.grad is not None and p.grad.any()]
    assert not actor_grads, "the critic's loss reached the actor's weights"
    # the normaliser covers both inputs
    nets.critic_normalizer.update(torch.full((4, 123), 5.0))
    nets.normalizer.update(torch.full((4, 48), -3.0))
    normalized = nets.normalize(td.detach().clone())
    assert not torch.allclose(normalized["privileged"], td["privileged"].detach())
    assert torch.allclose(normalized["privileged"], nets.critic_normalizer.normalize(td["privileged"].detach()))
    assert torch.allclose(normalized["next", "privileged"], nets.critic_normalizer.normalize(td["next", "privileged"]))
    assert torch.allclose(normalized["observation"], nets.normalizer.normalize(td["observation"].detach()))


def test_critic_input_errors():
    cfg = OmegaConf.create({"env": {"name": CHEETAH}, "network": {"critic_input": "state"}})
    with pytest.raises(ValueError, match=r"network.critic_input must be one of \('observation', 'privileged'\), "
                                         "got 'state'"):
        critic_input(cfg)
    cfg.network.critic_input = "privileged"
    with pytest.raises(ValueError, match="CheetahRun-v1 has none"):
        critic_input(cfg, env_info(cfg))


# ------------------------------------------------------------------ recipes
ROBOT_TINY = ["network.hidden_sizes=[16]", "optim.batch_size=32", "collector.total_frames=256",
              "collector.init_random_frames=128", "collector.max_lead_frames=128", "logger.eval_iter=256",
              "logger.log_every=128", "logger.num_eval_envs=1", "logger.checkpoint_every=0", "env.max_episode_steps=50"]


@pytest.mark.parametrize(
    ("recipe", "overrides"),
    [  # the commands docs/guide/robot_tasks.rst gives, with a tiny budget
        ("sac", ["env.name=CheetahRun-v1"]),
        ("td3", ["env.name=Go1JoystickFlatTerrain-v1", "network.critic_input=privileged", "network.obs_norm=true"]),
    ],
)
def test_recipes_on_robot_tasks(recipe, overrides, tmp_path, no_leaks):
    from test_recipes import run_recipe

    summary = run_recipe(recipe, tmp_path, *ROBOT_TINY, *overrides)
    assert summary["frames"] == 256 and summary["updates"] == 128 and not summary["interrupted"]
    modules = torch.load(tmp_path / "checkpoint" / "state.pt", weights_only=True)["modules"]
    first_critic_layer = [v for k, v in modules["loss"].items() if k.startswith("qvalue_network_params")
                          and k.endswith("weight")][0]
    if "network.critic_input=privileged" in overrides:
        assert first_critic_layer.shape[-1] == 123 + 12  # privileged state and action, no observation
        # the critic's normaliser followed the buffer's privileged rows
        assert modules["critic_normalizer"]["count"] >= 128
    else:
        assert first_critic_layer.shape[-1] == 17 + 6 and "critic_normalizer" not in modules
