"""A user's TorchRL env stack moved onto EnvPool: recognised, equivalent field by field, and run by the collector.

Real envs throughout: TorchRL's ``GymEnv`` / ``SerialEnv`` / ``ParallelEnv`` with the sota
transforms against :meth:`EnvStackPlan.make_env`, and real collector workers.
"""

from __future__ import annotations

import contextlib
import functools
import multiprocessing as mp
import re
import time

import gymnasium as gym
import pytest
import torch
from conftest import child_pids, linear_policy, sota_env, sota_transforms
from torchrl.data import LazyTensorStorage, ReplayBuffer
from torchrl.envs import (
    Compose,
    DoubleToFloat,
    EnvBase,
    EnvCreator,
    GymEnv,
    GymWrapper,
    ParallelEnv,
    RewardSum,
    SerialEnv,
    StepCounter,
    TransformedEnv,
    VecNorm,
)
from torchrl.envs.utils import check_env_specs

from torchrl_unilab import EnvPoolEnv, OffPolicyCollector, PrivilegedInfoTransform
from torchrl_unilab.envs.resolve import as_batched_env
from torchrl_unilab.envs.torchrl_stack import EnvStackPlan, choose_env_stack, recognise_env_stack

LIMIT = 5  # a short gymnasium time limit, so that episodes end within a few steps
SPECS = ("full_observation_spec", "full_action_spec", "full_reward_spec", "full_done_spec", "full_state_spec")


def cheetah(**kwargs):
    return GymEnv("HalfCheetah-v5", max_episode_steps=LIMIT, **kwargs)


def user_stack(container: str, num_envs: int = 2):
    """The shape of TorchRL's sota ``make_environment`` on HalfCheetah, with a 5-step time limit."""
    if container == "GymEnv":
        base = cheetah()
    elif container == "SerialEnv":
        base = SerialEnv(num_envs, EnvCreator(cheetah))
    else:
        base = ParallelEnv(num_envs, EnvCreator(cheetah))
    return TransformedEnv(base, sota_transforms(1000))


def leaves(td):
    return {key: (value.shape, value.dtype) for key, value in td.items(include_nested=True, leaves_only=True)}


def rollout(env, steps: int, actions: torch.Tensor):
    """``steps`` of ``step_and_maybe_reset`` with fixed actions: the transitions and the next roots."""
    td = env.reset()
    transitions, roots = [], []
    for t in range(steps):
        td["action"] = actions[t]
        transition, td = env.step_and_maybe_reset(td)
        transitions.append(transition.clone())
        roots.append(td.clone())
    return torch.stack(transitions), torch.stack(roots)


@pytest.mark.parametrize("container", ["GymEnv", "SerialEnv"])
def test_the_stack_on_envpool_presents_what_it_replaces(container, no_leaks):
    """Keys, specs (dtypes, shapes), batch size and step/reset/done semantics, field by field."""
    user = user_stack(container)
    plan = recognise_env_stack(user)
    assert isinstance(plan, EnvStackPlan), plan
    assert plan.describe() == ("GymEnv('HalfCheetah-v5')" if container == "GymEnv"
                               else "GymEnv('HalfCheetah-v5') x2 in SerialEnv")
    assert plan.max_episode_steps == LIMIT and plan.env_kwargs == {}
    fast = plan.make_env(seed=0)
    assert type(fast.base_env) is EnvPoolEnv and fast.base_env.obs_dtype == torch.float64
    # What the worker steps: a bare GymEnv is batched as one, as as_batched_env does with the original.
    user, fast = as_batched_env(user), as_batched_env(fast)
    assert fast.batch_size == user.batch_size == torch.Size([1 if container == "GymEnv" else 2])
    for name in SPECS:
        theirs, ours = getattr(user, name), getattr(fast, name)
        assert set(ours.keys(True, True)) == set(theirs.keys(True, True)), name
        for key in theirs.keys(True, True):
            assert ours[key] == theirs[key], (name, key)
    assert fast.full_observation_spec["observation"].dtype == torch.float32, "the user's DoubleToFloat ran"
    check_env_specs(fast, seed=0)

    steps = 2 * LIMIT + 2
    actions = torch.stack([fast.action_spec.rand() for _ in range(steps)])
    theirs, their_roots = rollout(user, steps, actions)
    ours, our_roots = rollout(fast, steps, actions)
    assert leaves(ours) == leaves(theirs) and leaves(our_roots) == leaves(their_roots)
    # The same episode ends: a time-limit end is truncated, never terminated.
    for key in [("next", k) for k in ("done", "terminated", "truncated", "step_count", "is_init")] + \
               ["done", "step_count", "is_init"]:
        assert torch.equal(ours[key], theirs[key]), key
    ends = ours["next", "truncated"].squeeze(-1)
    assert ends[LIMIT - 1].all() and ends[2 * LIMIT - 1].all() and int(ends.sum()) == 2 * fast.batch_size[0]
    assert not ours["next", "terminated"].any()
    for trans, roots in ((theirs, their_roots), (ours, our_roots)):
        # step_and_maybe_reset: the true final observation under "next", the reset one in the next root.
        final, reset = trans["next", "observation"][ends], roots["observation"][ends]
        assert not torch.isclose(final, reset).all(-1).any()
        assert (roots["step_count"][ends] == 0).all() and roots["is_init"][ends].all()
        assert (roots["episode_reward"][ends] == 0).all()
        # RewardSum accumulates the episode's rewards.
        running = trans["next", "reward"][: LIMIT].cumsum(0)
        assert torch.allclose(trans["next", "episode_reward"][: LIMIT], running, atol=1e-4)
    user.close()
    fast.close()


def test_the_short_step_path_gives_what_torchrl_generic_path_gives():
    """The stack's step_and_maybe_reset skips TorchRL's step wrapping: same entries, bit for bit."""
    plan = recognise_env_stack(user_stack("SerialEnv", num_envs=3))
    short, generic = plan.make_env(seed=0), plan.make_env(seed=0)
    assert short._short_path  # noqa: SLF001
    generic.step_and_maybe_reset = functools.partial(EnvBase._step_and_maybe_reset, generic)
    steps = 2 * LIMIT + 3
    actions = torch.stack([short.action_spec.rand() for _ in range(steps)])
    ours, our_roots = rollout(short, steps, actions)
    theirs, their_roots = rollout(generic, steps, actions)
    assert ours["next", "done"].any(), "episodes ended and were reset on the way"
    for mine, reference in ((ours, theirs), (our_roots, their_roots)):
        assert set(mine.keys(True, True)) == set(reference.keys(True, True))
        for key in reference.keys(True, True):
            assert torch.equal(mine[key], reference[key]), key
    short.close()
    generic.close()


def test_a_parallel_env_stack_is_recognised_without_starting_it(no_leaks):
    before = child_pids()
    user = user_stack("ParallelEnv")
    plan = recognise_env_stack(user)
    assert isinstance(plan, EnvStackPlan), plan
    assert plan.describe() == "GymEnv('HalfCheetah-v5') x2 in ParallelEnv"
    assert child_pids() == before, "looking at the ParallelEnv started no process"
    fast = plan.make_env(seed=0)
    for name in SPECS:  # the ParallelEnv's specs come from its metadata: readable unstarted
        theirs, ours = getattr(user, name), getattr(fast, name)
        assert {k: (s.shape, s.dtype) for k, s in ours.items(True, True)} == \
            {k: (s.shape, s.dtype) for k, s in theirs.items(True, True)}, name
    check_env_specs(fast, seed=0)
    fast.close()
    user.close(raise_if_closed=False)


def test_kwargs_and_layers_are_kept(no_leaks):
    inner = TransformedEnv(SerialEnv(2, lambda: GymEnv("Hopper-v5", ctrl_cost_weight=0.0)), StepCounter(3))
    plan = recognise_env_stack(TransformedEnv(inner, Compose(DoubleToFloat(), RewardSum()), auto_unwrap=False))
    assert isinstance(plan, EnvStackPlan), plan
    assert plan.env_kwargs == {"ctrl_cost_weight": 0.0} and plan.max_episode_steps == 1000
    assert [type(t).__name__ for t in plan.layers] == ["StepCounter", "Compose"]
    env = plan.make_env(seed=1)
    # the layers, innermost first, in one Compose (as TorchRL's auto-unwrapping does)
    assert [type(t).__name__ for t in env.transform] == ["StepCounter", "Compose"]
    assert type(env.base_env) is EnvPoolEnv and env.base_env.env_kwargs == {"ctrl_cost_weight": 0.0}
    transitions, _ = rollout(env, 4, torch.zeros(4, 2, 3))
    # StepCounter(3) of the inner layer truncates the episodes after 3 steps
    assert transitions["next", "truncated"].squeeze(-1)[:, 0].tolist() == [False, False, True, False]
    env.close()


def test_seeds(no_leaks):
    plan = recognise_env_stack(user_stack("SerialEnv", num_envs=3))

    def first_obs(seed=None, set_seed=None):
        env = plan.make_env(seed=seed)
        if set_seed is not None:
            env.set_seed(set_seed)
        obs = env.reset()["observation"]
        env.close()
        return obs

    obs = first_obs(seed=3)
    assert torch.equal(obs, first_obs(seed=3)), "reproducible"
    assert not torch.equal(obs[0], obs[1]), "envs of a batch get different seeds"
    assert not torch.equal(obs, first_obs(seed=4))
    assert torch.equal(first_obs(set_seed=3), obs), "set_seed(s) seeds env j with s + j, as seed=s"
    # A collector's workers: worker i's env j gets seed + i * num_envs + j
    assert plan.factory(1).args == (None,)
    # the seed a user gave the stack carries over
    seeded = user_stack("SerialEnv", num_envs=3)
    seeded.set_seed(11)
    plan = recognise_env_stack(seeded)
    assert plan.seed == 11 and plan.factory(1).args == (14,)
    seeded.close()
    bare = cheetah()
    assert recognise_env_stack(bare).seed is None, "gymnasium's own entropy seed is not a user's seed"
    bare.set_seed(5)
    assert recognise_env_stack(bare).seed == 5


class TiltedCheetah(gym.Wrapper):
    """A custom gymnasium wrapper: not something EnvPool reproduces."""

    def step(self, action):
        return self.env.step(action * 0.5)


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (lambda: GymEnv("Pendulum-v1"), "MuJoCo v5 tasks only"),
        (lambda: GymEnv("HalfCheetah-v4"), "MuJoCo v5 tasks only"),
        (lambda: GymEnv("HalfCheetah-v5", frame_skip=2), "frame_skip=2"),
        (lambda: GymEnv("HalfCheetah-v5", categorical_action_encoding=True), "categorical_action_encoding=True"),
        (lambda: GymEnv("HalfCheetah-v5", render_mode="rgb_array"), r"options \['render_mode'\]"),
        (lambda: GymWrapper(TiltedCheetah(gym.make("HalfCheetah-v5"))), "base env is a GymWrapper"),
        (lambda: TransformedEnv(GymEnv("HalfCheetah-v5"), VecNorm(in_keys=["observation"])), r"\['VecNorm'\]"),
        (lambda: SerialEnv(2, lambda: TransformedEnv(GymEnv("HalfCheetah-v5"), RewardSum())), "not a bare GymEnv"),
        (lambda: SerialEnv(2, [lambda: GymEnv("HalfCheetah-v5"), lambda: GymEnv("Hopper-v5")]), "sub-envs differ"),
        (lambda: EnvPoolEnv("HalfCheetah-v5", 2), "base env is a EnvPoolEnv"),
    ],
    ids=["Pendulum", "v4", "frame_skip", "categorical", "render_mode", "custom", "VecNorm", "sub-env transform",
         "mixed ids", "EnvPoolEnv"],
)
def test_other_stacks_run_as_given(make, reason):
    env = make()
    found = recognise_env_stack(env)
    assert isinstance(found, str)
    assert re.search(reason, found), found
    choice = choose_env_stack(lambda: env)
    assert choice.plan is None and choice.reason == found
    assert choice.engine == ("envpool" if isinstance(env, EnvPoolEnv) else "torchrl")
    insisting = contextlib.nullcontext() if isinstance(env, EnvPoolEnv) else \
        pytest.raises(ValueError, match="engine='envpool' cannot run this env stack")
    with insisting:
        choose_env_stack(env, engine="envpool")
    env.close(raise_if_closed=False)


def test_privileged_simulator_state_keeps_the_stack():
    stack = TransformedEnv(GymEnv("Hopper-v5"), DoubleToFloat())
    assert choose_env_stack(stack, privileged=PrivilegedInfoTransform(mujoco=("qpos",))).engine == "torchrl"
    assert choose_env_stack(stack, privileged=PrivilegedInfoTransform(critic_key="observation")).engine == "envpool"
    assert choose_env_stack(stack, engine="torchrl").engine == "torchrl"


# --------------------------------------------------------------------------------------------- the collector
def sota_env_factory(num_envs: int = 2):
    return sota_env(cheetah, num_envs, max_steps=1000)


def sota_collector(engine: str) -> OffPolicyCollector:
    return OffPolicyCollector(functools.partial(sota_env_factory, 2), linear_policy(17, 6), frames_per_batch=20,
                              total_frames=40, engine=engine, seed=0)


def test_collector_iterating_batches_runs_the_stack_on_envpool(unilab_log, no_leaks):
    with sota_collector("auto") as collector:
        batches = list(collector)
        metrics = collector.metrics()
    assert metrics["engine"] == "envpool" and metrics["workers"][0]["engine"] == "envpool"
    assert [r.getMessage() for r in unilab_log] == [
        "OffPolicyCollector: GymEnv('HalfCheetah-v5') x2 in SerialEnv runs on EnvPool; pass engine='torchrl' to "
        "keep your env stack"]
    assert [b.shape for b in batches] == [torch.Size([2, 10])] * 2, "[envs, time], as the SerialEnv's own"
    rows = torch.cat([batch.reshape(-1) for batch in batches])
    with sota_collector("torchrl") as kept:  # never started: its rows' layout comes from your own stack
        kept_rows = kept.fake_tensordict()[0].expand(40).exclude("policy_version")
        assert leaves(rows) == leaves(kept_rows), "the same keys and dtypes"
    assert rows["next", "truncated"].sum() == 8, "2 envs x 20 steps: a time-limit end every 5 steps"
    assert not rows["next", "terminated"].any()
    ep = rows[rows["collector", "traj_ids"] == rows["collector", "traj_ids"][0]]
    assert torch.allclose(ep["next", "episode_reward"][-1], ep["next", "reward"].sum(), atol=1e-4)


def test_engine_torchrl_keeps_the_stack(unilab_log, no_leaks):
    factory = functools.partial(sota_env_factory, 2)
    with OffPolicyCollector(factory, linear_policy(17, 6), frames_per_batch=20, engine="torchrl") as collector:
        # the worker runs (a copy of) your factory: a stack of TorchRL's, not one rebuilt on EnvPool
        worker_env = collector._worker_envs[0]()  # noqa: SLF001
        try:
            assert type(worker_env) is type(factory()) and "EnvPool" not in repr(worker_env)
        finally:
            worker_env.close(raise_if_closed=False)
        assert collector.metrics()["engine"] == "torchrl"
    assert unilab_log == []


def test_collector_with_a_live_stack_fills_a_torchrl_buffer(unilab_log, no_leaks):
    """sac-async.py's pattern with the stack passed as an instance: a worker process builds it on EnvPool."""
    train_env = sota_env_factory(2)
    train_env.set_seed(0)
    rb = ReplayBuffer(storage=LazyTensorStorage(1000), shared=True)
    collector = OffPolicyCollector(train_env, linear_policy(17, 6), frames_per_batch=20, total_frames=-1,
                                   replay_buffer=rb)
    try:
        assert collector._worker_envs[0] is not train_env, "not stepped by a thread over the instance"  # noqa: SLF001
        collector.start()
        deadline = time.monotonic() + 120
        while rb.write_count < 100:
            assert time.monotonic() < deadline
            collector.metrics()
            time.sleep(0.05)
        assert collector.metrics()["engine"] == "envpool"
        rows = rb[:100]
        assert rows["observation"].dtype == torch.float32 and rows["episode_reward"].dtype == torch.float32
        assert rows["next", "truncated"].any() and not rows["next", "terminated"].any()
    finally:
        collector.shutdown()
    assert train_env.is_closed, "the collector closes the env it was given, as TorchRL's do"
    assert [r.getMessage().split(" runs on")[0] for r in unilab_log] == [
        "OffPolicyCollector: GymEnv('HalfCheetah-v5') x2 in SerialEnv"]


def test_engine_values_are_checked():
    with pytest.raises(ValueError, match=r"engine must be one of \('auto', 'envpool', 'gymnasium', 'torchrl'\)"):
        OffPolicyCollector(sota_env_factory, linear_policy(17, 6), frames_per_batch=2, engine="fast")
    with pytest.raises(ValueError, match="engine='torchrl' runs a TorchRL env stack as given"):
        OffPolicyCollector("HalfCheetah-v5", linear_policy(17, 6), frames_per_batch=2, engine="torchrl")
    with pytest.raises(ValueError, match="cannot run this env stack.*frame_skip=2"):
        OffPolicyCollector(lambda: GymEnv("HalfCheetah-v5", frame_skip=2), linear_policy(17, 6),
                           frames_per_batch=2, engine="envpool")
    assert mp.active_children() == []


def test_a_factory_is_called_once_here(unilab_log, no_leaks):
    """Looking at a factory's env is the probe the collector needs anyway: no second call."""
    calls = []

    def counted(make):
        calls.append(make)
        return make()

    def pendulum():
        return TransformedEnv(GymEnv("Pendulum-v1"), DoubleToFloat())

    with OffPolicyCollector(functools.partial(counted, pendulum), linear_policy(3, 1),
                            frames_per_batch=2, max_frames_per_traj=50) as collector:
        assert len(calls) == 1 and collector.metrics()["engine"] == "torchrl"
        # the env as given, unbatched, as TorchRL's collectors answer (workers step it with a batch of one)
        assert collector.getattr_env("observation_spec")["observation"].shape == torch.Size([3])
    with OffPolicyCollector(functools.partial(counted, sota_env_factory), linear_policy(17, 6), frames_per_batch=2) \
            as collector:
        assert len(calls) == 2 and collector.metrics()["engine"] == "envpool"
    assert len(unilab_log) == 1
