"""A user's TorchRL env stack, recognised and moved onto EnvPool.

TorchRL's scripts build their envs as ``TransformedEnv(GymEnv(id), transforms)``,
or with the ``GymEnv`` instances inside a ``SerialEnv``/``ParallelEnv``. Each
``GymEnv`` is a Python gymnasium env, and ``SerialEnv`` adds its own per-step
cost on top. :func:`recognise_env_stack` finds out whether such a stack is a
gymnasium MuJoCo task EnvPool runs with the same dynamics (the v5 tasks that
``tests/test_envpool_equivalence.py`` holds to gymnasium), with options EnvPool
accepts and transforms that can be copied; if so, :meth:`EnvStackPlan.make_env`
builds the same stack over one batched :class:`~torchrl_unilab.EnvPoolEnv`:
same keys, specs and dtypes as the ``GymEnv``/``SerialEnv`` it replaces
(float64 observations, time-limit ends as ``truncated``), and the user's own
transforms, cloned, on top.

What this gains, on HalfCheetah-v5 with TorchRL's sota transforms (``InitTracker``,
``StepCounter``, ``DoubleToFloat``, ``RewardSum``) and 4 envs, in CPU time per
``step_and_maybe_reset`` on the 2-core development machine at a load average of 1.6
to 2.5 (minimum and median of 7 blocks of 300 steps): 1,850 and 2,760 us for the
``SerialEnv`` of ``GymEnv`` stack, 870 and 1,080 us for the same stack on EnvPool, of
which 650 and 730 us are EnvPool's own step (physics). The transforms run as
TorchRL runs them; the step skips only TorchRL's generic step wrapping (see
:class:`_StackOnEnvPool`). ``benchmarks/dropin_speedup.py`` measures whole collectors.

The collector asks :func:`choose_env_stack` which engine runs a worker's env:
``"envpool"`` (this substitution) or ``"torchrl"`` (the stack as given).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import torch
from tensordict import TensorDictBase
from torchrl.envs import (
    CatTensors,
    ClipTransform,
    Compose,
    DoubleToFloat,
    DTypeCastTransform,
    EnvBase,
    EnvCreator,
    ExcludeTransform,
    FiniteTensorDictCheck,
    GymEnv,
    InitTracker,
    ObservationNorm,
    ParallelEnv,
    RenameTransform,
    RewardClipping,
    RewardScaling,
    RewardSum,
    SelectTransform,
    SerialEnv,
    SignTransform,
    SqueezeTransform,
    StepCounter,
    TensorDictPrimer,
    Transform,
    TransformedEnv,
    UnsqueezeTransform,
)

from torchrl_unilab._torchrl_private import (
    StepAndMaybeResetHook,
    env_step,
    has_own_inverse,
    has_post_step_mdp_hooks,
    post_step_mdp_hooks,
    step_mdp,
    transform_step,
)
from torchrl_unilab.envs.batched_env import BatchedGymEnv
from torchrl_unilab.envs.envpool_env import ENGINES, EnvPoolEnv, envpool_task_ids, select_engine

__all__ = [
    "COLLECTOR_ENGINES",
    "STACK_TRANSFORMS",
    "EnvStackChoice",
    "EnvStackPlan",
    "check_engine",
    "choose_env_stack",
    "recognise_env_stack",
    "stack_task_ids",
]

#: Accepted values of the collector's ``engine=``: those of gymnasium ids, and ``"torchrl"``
#: (run a TorchRL env stack exactly as given).
COLLECTOR_ENGINES = (*ENGINES, "torchrl")

#: TorchRL transforms a recognised stack may hold (exact types, also inside a ``Compose``): each
#: is a function of the TensorDict it sees and its own settings, so a clone on top of EnvPool
#: behaves as the original does on top of ``GymEnv``. Transforms with running statistics
#: (``VecNorm``) or state shared between processes (``TrajCounter``) are not among them.
STACK_TRANSFORMS = frozenset({
    CatTensors, ClipTransform, DoubleToFloat, DTypeCastTransform, ExcludeTransform, FiniteTensorDictCheck,
    InitTracker, ObservationNorm, RenameTransform, RewardClipping, RewardScaling, RewardSum, SelectTransform,
    SignTransform, SqueezeTransform, StepCounter, TensorDictPrimer, UnsqueezeTransform,
})

# GymEnv constructor entries that are not gymnasium.make options (GymEnv sets the checker itself).
_GYMENV_OWN = frozenset({"env_name", "disable_env_checker"})
# gymnasium wrappers gymnasium.make puts around a registered MuJoCo task: none changes its outputs
# (the time limit is read from TimeLimit and applied by EnvPoolEnv).
_MAKE_WRAPPERS = (gym.wrappers.TimeLimit, gym.wrappers.OrderEnforcing, gym.wrappers.PassiveEnvChecker)
# GymEnv attributes and the value each has in a plain GymEnv(id): another value changes what it presents.
_PLAIN_GYMENV = {"frame_skip": 1, "wrapper_frame_skip": 1, "from_pixels": False,
                 "_categorical_action_encoding": False, "_convert_actions_to_numpy": True,
                 "_torchrl_native_autoreset_requested": False, "_allow_done_after_reset": False}
_SPECS = ("full_observation_spec", "full_action_spec", "full_reward_spec", "full_done_spec", "full_state_spec")
# EnvPool's seeds are 31-bit; gymnasium's own entropy seeds (an unseeded env's) are 128-bit.
_SEED_LIMIT = 2**31


def stack_task_ids() -> frozenset[str]:
    """The gymnasium ids a recognised stack may run: EnvPool's MuJoCo v5 tasks, which the equivalence tests cover.

    Examples:
        >>> "HalfCheetah-v5" in stack_task_ids()
        True
        >>> "HalfCheetah-v4" in stack_task_ids()
        False
    """
    return frozenset(t for t in envpool_task_ids() if t.endswith("-v5"))


@dataclasses.dataclass
class EnvStackPlan:
    """A recognised env stack: the gymnasium task, how many envs, and the transforms on top.

    Built by :func:`recognise_env_stack`; :meth:`make_env` builds the stack on EnvPool.

    Attributes:
        env_id: the gymnasium MuJoCo id, e.g. ``"HalfCheetah-v5"``.
        num_envs: envs in the batch (1 for a bare ``GymEnv``, which the collector batches as one).
        env_kwargs: the ``gymnasium.make`` options the ``GymEnv`` was given (EnvPool accepts them all).
        max_episode_steps: the time limit of the ``GymEnv``'s ``TimeLimit`` wrapper.
        container: ``"GymEnv"`` (bare), ``"SerialEnv"`` or ``"ParallelEnv"``.
        layers: the transform of each ``TransformedEnv`` layer, innermost first (clones).
        seed: the seed the stack was given (``ParallelEnv.set_seed`` or gymnasium's own
            record of ``reset(seed=...)``) if any; env ``j`` of the new stack gets ``seed + j``.

    Examples:
        >>> from torchrl.envs import GymEnv, StepCounter, TransformedEnv
        >>> plan = recognise_env_stack(TransformedEnv(GymEnv("Hopper-v5"), StepCounter(100)))
        >>> plan.describe()
        "GymEnv('Hopper-v5')"
        >>> env = plan.make_env(seed=0)
        >>> env.batch_size, type(env.base_env).__name__
        (torch.Size([1]), 'EnvPoolEnv')
        >>> env.close()
    """

    env_id: str
    num_envs: int
    env_kwargs: dict[str, Any]
    max_episode_steps: int
    container: str
    layers: list[Transform]
    seed: int | None = None

    def describe(self) -> str:
        """What runs, in a few words: ``"GymEnv('HalfCheetah-v5') x4 in SerialEnv"``."""
        options = "".join(f", {k}={v!r}" for k, v in sorted(self.env_kwargs.items()))
        gym_env = f"GymEnv({self.env_id!r}{options})"
        return gym_env if self.container == "GymEnv" else f"{gym_env} x{self.num_envs} in {self.container}"

    def make_base(self, seed: int | None = None) -> EnvPoolEnv:
        """The batched EnvPool env that stands for the ``GymEnv``/``SerialEnv``/``ParallelEnv`` (no transforms)."""
        return EnvPoolEnv(
            self.env_id, self.num_envs, seed=seed, env_kwargs=self.env_kwargs,
            max_episode_steps=self.max_episode_steps, stagger_resets=False, obs_dtype=torch.float64,
            truncated_when_terminated=True,
        )

    def make_env(self, seed: int | None = None) -> EnvBase:
        """The stack on EnvPool: :meth:`make_base` under a ``TransformedEnv`` of clones of the transform layers.

        Several layers become one ``Compose`` (innermost first), as TorchRL's auto-unwrapping
        of nested ``TransformedEnv`` does. The ``TransformedEnv`` takes a shorter path through
        ``step_and_maybe_reset`` than TorchRL's generic one, with the same results.

        Args:
            seed: env ``j`` is seeded ``seed + j``; ``None`` takes :attr:`seed`.
        """
        base = self.make_base(self.seed if seed is None else seed)
        if not self.layers:
            return base
        # Nested layers are one Compose, as TorchRL's own auto-unwrapping of TransformedEnv does.
        clones = [transform.clone() for transform in self.layers]
        return _StackOnEnvPool(base, clones[0] if len(clones) == 1 else Compose(*clones))

    def factory(self, worker_idx: int = 0) -> Callable[[], EnvBase]:
        """A picklable factory of the stack for worker ``worker_idx`` of a collector.

        With a :attr:`seed`, env ``j`` of worker ``i`` is seeded ``seed + i * num_envs + j``, as the
        collector's own ``seed=`` does (which, when given, the worker sets over it).
        """
        seed = None if self.seed is None else self.seed + worker_idx * self.num_envs
        return functools.partial(self.make_env, seed)


@dataclasses.dataclass
class EnvStackChoice:
    """What runs a worker's env: ``engine`` ``"envpool"`` with a ``plan``, else the stack as given.

    A stack run as given is ``"torchrl"``, or the engine of this package's env at its
    bottom (``"envpool"`` for an :class:`~torchrl_unilab.EnvPoolEnv`, ``"gymnasium"``
    for a :class:`~torchrl_unilab.BatchedGymEnv`); ``reason`` says why it was not moved.

    ``env`` is the env a factory built to be looked at (``None`` for an instance); it is
    closed when the plan replaces it, and otherwise left to the caller.

    Examples:
        >>> from torchrl.envs import GymEnv
        >>> choose_env_stack(lambda: GymEnv("Pendulum-v1")).engine
        'torchrl'
    """

    engine: str
    plan: EnvStackPlan | None = None
    env: EnvBase | None = None
    reason: str | None = None


def check_engine(engine: str) -> str:
    """``engine`` if it is one of :data:`COLLECTOR_ENGINES`, else a ``ValueError`` naming them.

    Examples:
        >>> check_engine("torchrl")
        'torchrl'
    """
    if engine not in COLLECTOR_ENGINES:
        raise ValueError(f"engine must be one of {COLLECTOR_ENGINES}, got {engine!r}")
    return engine


def choose_env_stack(source: EnvBase | Callable[[], EnvBase], engine: str = "auto",
                     privileged: Any = None) -> EnvStackChoice:
    """Picks the engine of a worker's env given as an ``EnvBase`` or a factory.

    ``engine="auto"`` moves a recognised stack (:func:`recognise_env_stack`) onto
    EnvPool and runs any other as given; ``"envpool"`` insists, and says why it
    cannot when it cannot; ``"torchrl"`` and ``"gymnasium"`` run the stack as
    given. A factory is called once here to look at what it builds. A
    :class:`~torchrl_unilab.PrivilegedInfoTransform` reading simulator state keeps
    the stack as given (see :func:`~torchrl_unilab.select_engine`).

    Examples:
        >>> from torchrl.envs import GymEnv, SerialEnv
        >>> choice = choose_env_stack(lambda: SerialEnv(2, lambda: GymEnv("HalfCheetah-v5")))
        >>> choice.engine, choice.plan.describe()
        ('envpool', "GymEnv('HalfCheetah-v5') x2 in SerialEnv")
        >>> choose_env_stack(lambda: GymEnv("HalfCheetah-v5"), engine="torchrl").engine
        'torchrl'
    """
    check_engine(engine)
    if engine in ("torchrl", "gymnasium"):
        return EnvStackChoice("torchrl")
    env = source if isinstance(source, EnvBase) else source()
    if not isinstance(env, EnvBase):
        raise TypeError(f"create_env_fn must return a TorchRL EnvBase, got {type(env).__name__}")
    built = None if env is source else env
    found = recognise_env_stack(env)
    if isinstance(found, EnvStackPlan) and select_engine(found.env_id, "auto", None, privileged) != "envpool":
        found = ("the PrivilegedInfoTransform reads gymnasium's info dicts or MuJoCo data (info_keys=, mujoco=, "
                 "mujoco_fn=), which EnvPool does not expose")
    if isinstance(found, str):
        # An env of this package runs as given, on its own engine.
        own = {EnvPoolEnv: "envpool", BatchedGymEnv: "gymnasium"}.get(type(_innermost(env)), "torchrl")
        if engine == "envpool" and own != "envpool":
            if built is not None:
                built.close(raise_if_closed=False)
            raise ValueError(f"engine='envpool' cannot run this env stack: {found}. Use engine='auto' or 'torchrl'.")
        return EnvStackChoice(own, env=built, reason=found)
    if built is not None:
        built.close(raise_if_closed=False)
    return EnvStackChoice("envpool", plan=found)


def recognise_env_stack(env: EnvBase) -> EnvStackPlan | str:
    """The :class:`EnvStackPlan` of ``env`` if it can run on EnvPool as it is, else a sentence saying why not.

    Recognised: ``TransformedEnv`` layers (any number, of the transforms in
    :data:`STACK_TRANSFORMS`) over either a bare ``GymEnv`` or a ``SerialEnv``/
    ``ParallelEnv`` whose sub-envs are all the same bare ``GymEnv``, on CPU. The
    ``GymEnv`` must be a gymnasium MuJoCo v5 id (:func:`stack_task_ids`) built with
    ``gymnasium.make`` options EnvPool accepts (``max_episode_steps``, the task's
    own options such as ``ctrl_cost_weight``) and none of ``GymEnv``'s own
    (``from_pixels``, ``frame_skip``, ``categorical_action_encoding``, an info-dict
    reader, ...). Finally, EnvPool's specs must equal the stack's.

    Nothing is started: a ``ParallelEnv``'s processes are not, and a sub-env is
    built here (and closed) only when none is running to be looked at.

    Examples:
        >>> from torchrl.envs import Compose, DoubleToFloat, GymEnv, InitTracker, SerialEnv, TransformedEnv
        >>> stack = TransformedEnv(SerialEnv(4, lambda: GymEnv("HalfCheetah-v5")),
        ...                        Compose(InitTracker(), DoubleToFloat()))
        >>> recognise_env_stack(stack).describe()
        "GymEnv('HalfCheetah-v5') x4 in SerialEnv"
        >>> recognise_env_stack(GymEnv("Pendulum-v1"))
        "GymEnv('Pendulum-v1'): EnvPool runs the gymnasium MuJoCo v5 tasks only"
        >>> recognise_env_stack(GymEnv("HalfCheetah-v5", frame_skip=2))
        "GymEnv('HalfCheetah-v5'): frame_skip=2 (a plain GymEnv has 1)"
    """
    layers = []
    while type(env) is TransformedEnv:
        unknown = [type(t).__name__ for t in _flat_transforms(env.transform) if type(t) not in STACK_TRANSFORMS]
        if unknown:
            return (f"transforms {unknown} are not among those a stack on EnvPool copies "
                    f"({sorted(t.__name__ for t in STACK_TRANSFORMS)})")
        if not _on_cpu(env.__dict__.get("_device")):
            return f"a TransformedEnv on device {env.device}"
        layers.append(env.transform)
        env = env.base_env
    layers.reverse()
    if type(env) is GymEnv:
        container, gym_envs, num_envs, seed = "GymEnv", [env], 1, None
    elif type(env) in (SerialEnv, ParallelEnv):
        container, state = type(env).__name__, vars(env)  # vars: a ParallelEnv starts on a missing attribute
        num_envs, seed = state["num_workers"], (state.get("_seeds") or [None])[0]
        if not _on_cpu(state.get("_device")):
            return f"a {container} on device {state['_device']}"
        gym_envs = _sub_envs(env)
        if isinstance(gym_envs, str):
            return gym_envs
    else:
        return f"the base env is a {type(env).__name__}, not a GymEnv, SerialEnv or ParallelEnv"
    tasks = [_gym_task(e) for e in gym_envs]
    for task in tasks:
        if isinstance(task, str):
            return task
    if any(task != tasks[0] for task in tasks):
        return f"the {container}'s sub-envs differ: {sorted({repr(t) for t in tasks})}"
    env_id, env_kwargs, limit = tasks[0]
    if seed is None:
        seed = _gymnasium_seed(gym_envs[0])
    plan = EnvStackPlan(env_id, num_envs, env_kwargs, limit, container, [t.clone() for t in layers],
                        seed if seed is not None and 0 <= seed < _SEED_LIMIT else None)
    mismatch = _spec_mismatch(gym_envs[0], plan.make_base())
    return f"{plan.describe()}: EnvPool's {mismatch}" if mismatch else plan


class _StackOnEnvPool(StepAndMaybeResetHook, TransformedEnv):
    """TorchRL's ``TransformedEnv`` with a shorter :meth:`step_and_maybe_reset` over an :class:`EnvPoolEnv`.

    ``EnvBase.step_and_maybe_reset`` of a ``TransformedEnv`` runs ``step``, whose wrapping
    (shape assertion, partial-step and preset-``"next"`` handling, ``transform.inv`` with its
    dispatch and copy, ``_step_proc_data``, two properties that walk the transforms) costs
    about a third of a step without physics: skipping it takes the sota stack of 4 envs from
    about 310 to about 220 us of CPU time per step without physics. With none of what that
    wrapping serves in play (no ``"_step"``, no preset ``"next"``, no transform with an inverse,
    reward shapes as declared, type checks off), this runs the same calls without it:
    ``transform._step`` on a shallow copy of the root (as ``inv`` makes), ``step_mdp``, the
    post-step hooks and ``maybe_reset``. ``tests/test_env_stack.py`` holds it to the generic
    path, entry by entry. Anything else takes the generic path.
    """

    @functools.cached_property
    def _short_path(self) -> bool:
        flat = _flat_transforms(self.transform)
        return (not self.run_type_checks and all(_no_inverse(t) for t in flat)
                and all(self.full_reward_spec[k].shape == self.base_env.full_reward_spec[k].shape
                        for k in self.reward_keys if k in self.base_env.reward_keys))

    @functools.cached_property
    def _has_post_hooks(self) -> bool:
        return any(has_post_step_mdp_hooks(t) for t in _flat_transforms(self.transform))

    @functools.cached_property
    def _layout(self) -> tuple[torch.device, torch.Size]:
        # Both properties walk the transforms on every read; an EnvPoolEnv stack stays on its CPU batch.
        return self.device, self.batch_size

    def short_step_and_maybe_reset(
        self, tensordict: TensorDictBase
    ) -> tuple[TensorDictBase, TensorDictBase] | None:
        """``step_and_maybe_reset`` without ``step``'s wrapping; ``None`` where TorchRL's generic path must run."""
        if not self._short_path or "_step" in tensordict.keys() or "next" in tensordict.keys() \
                or (tensordict.device, tensordict.batch_size) != self._layout:
            return None
        tensordict_in = tensordict.clone(False)  # what transform.inv hands on when no transform inverts
        next_tensordict = transform_step(self.transform, tensordict_in, env_step(self.base_env, tensordict_in))
        tensordict.set("next", next_tensordict)
        tensordict_ = step_mdp(self, tensordict)
        if self._has_post_hooks:
            tensordict, tensordict_ = post_step_mdp_hooks(self, tensordict, tensordict_)
        return tensordict, self.maybe_reset(tensordict_)


def _no_inverse(transform: Transform) -> bool:
    """Whether ``transform.inv`` hands the root on unchanged (once the transform knows its parent's specs)."""
    keys = transform.in_keys_inv
    if not has_own_inverse(transform):
        return not keys
    # DoubleToFloat & co. cast every float entry back while their keys are unresolved (None), none once
    # resolved to an empty list (the action is not float64).
    return isinstance(transform, DTypeCastTransform) and keys is not None and not keys


def _innermost(env: EnvBase) -> EnvBase:
    while isinstance(env, TransformedEnv):
        env = env.base_env
    return env


def _flat_transforms(transform: Transform) -> list[Transform]:
    if type(transform) is Compose:
        return [t for inner in transform.transforms for t in _flat_transforms(inner)]
    return [transform]


def _on_cpu(device: Any) -> bool:
    return device is None or torch.device(device).type == "cpu"


def _sub_envs(env: EnvBase) -> list[EnvBase] | str:
    """The sub-envs of a ``SerialEnv``/``ParallelEnv`` to look at: the running ones, else one built per factory."""
    state = vars(env)
    if state.get("_envs"):
        return list(state["_envs"])
    distinct = {}
    for fn, kwargs in zip(state["create_env_fn"], state["create_env_kwargs"]):
        distinct.setdefault((id(fn), repr(sorted(kwargs.items()))), (fn, kwargs))
    subs = []
    for fn, kwargs in distinct.values():
        if isinstance(fn, EnvCreator) and fn.env_type is not GymEnv:
            name = fn.env_type.__name__
        else:
            sub = fn(**kwargs)
            sub.close(raise_if_closed=False)  # its specs and options stay readable
            name = type(sub).__name__
            subs.append(sub)
        if name != "GymEnv":
            return f"the {type(env).__name__}'s sub-envs are {name}, not a bare GymEnv"
    return subs


def _gym_task(env: EnvBase) -> tuple[str, dict[str, Any], int] | str:
    """``(env_id, gymnasium.make options, time limit)`` of a plain ``GymEnv`` EnvPool runs, else why not."""
    if type(env) is not GymEnv:
        return f"a sub-env is a {type(env).__name__}, not a bare GymEnv"
    state = vars(env)
    options = dict(state["_constructor_kwargs"])
    env_id = options["env_name"]
    where = f"GymEnv({env_id!r})"
    if env_id not in stack_task_ids():
        return f"{where}: EnvPool runs the gymnasium MuJoCo v5 tasks only"
    for name, plain in _PLAIN_GYMENV.items():
        if state.get(name, plain) != plain:
            return f"{where}: {name.lstrip('_')}={state[name]!r} (a plain GymEnv has {plain!r})"
    if state.get("_info_dict_reader"):
        return f"{where}: it has an info-dict reader, whose keys EnvPool does not produce"
    if not _on_cpu(state.get("_device")) or env.batch_size != torch.Size([]):
        return f"{where}: device {env.device}, batch size {tuple(env.batch_size)}"
    env_kwargs = {k: v for k, v in options.items() if k not in _GYMENV_OWN}
    if select_engine(env_id, "auto", env_kwargs) != "envpool":
        return f"{where}: options {sorted(env_kwargs)} are not all EnvPool's"
    wrapper, limit = state["_env"], None
    while isinstance(wrapper, gym.Wrapper):
        if not isinstance(wrapper, _MAKE_WRAPPERS):
            return f"{where}: the gymnasium wrapper {type(wrapper).__name__}"
        if isinstance(wrapper, gym.wrappers.TimeLimit):
            limit = wrapper._max_episode_steps  # noqa: SLF001 - gymnasium keeps no public copy
        wrapper = wrapper.env
    if not type(wrapper).__module__.startswith("gymnasium.envs.mujoco."):
        return f"{where}: {env_id!r} is registered to {type(wrapper).__module__}, not gymnasium's MuJoCo task"
    if not limit:
        return f"{where}: it has no time limit"
    env_kwargs.pop("max_episode_steps", None)
    return env_id, env_kwargs, int(limit)


def _gymnasium_seed(env: GymEnv) -> int | None:
    """The seed gymnasium recorded for ``reset(seed=...)`` (``GymEnv.set_seed``), if one was given."""
    return getattr(vars(env)["_env"].unwrapped, "_np_random_seed", None)


def _spec_mismatch(gym_env: EnvBase, base: EnvPoolEnv) -> str | None:
    """The first spec of ``gym_env`` (unbatched) that ``base``'s first env does not present, else ``None``."""
    for name in _SPECS:
        ours, theirs = getattr(base, name), getattr(gym_env, name)
        ours_keys, their_keys = set(ours.keys(True, True)), set(theirs.keys(True, True))
        if ours_keys != their_keys:
            return f"{name} has keys {sorted(map(str, ours_keys))}, the stack's {sorted(map(str, their_keys))}"
        for key in ours_keys:
            if ours[key][0] != theirs[key]:
                return f"{name}[{key!r}] is {ours[key][0]}, the stack's {theirs[key]}"
    return None
