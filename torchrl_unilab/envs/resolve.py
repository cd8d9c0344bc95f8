"""How a user's env argument becomes what each worker steps.

A collector's ``create_env_fn`` may be a gymnasium id, an ``EnvBase`` instance, a
factory (an ``EnvCreator``, a partial), or a list of those, with ``num_workers``
and ``create_env_kwargs`` as TorchRL's multi-process collectors take them. This
module turns it into one env source per worker (a factory run in the worker
process, or a live instance), decides through :mod:`torchrl_unilab.envs.torchrl_stack`
whether a TorchRL stack runs on EnvPool, and adds the collector's own transforms
(``StepCounter`` for ``max_frames_per_traj``, the privileged-information transform). :func:`seed_env` seeds
what a worker steps.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import cloudpickle
from torchrl.envs import AsyncEnvPool, EnvBase, ParallelEnv, SerialEnv, StepCounter, Transform, TransformedEnv

from torchrl_unilab._checks import check_int
from torchrl_unilab.envs.envpool_env import make_gym_id_env, select_engine
from torchrl_unilab.envs.torchrl_stack import choose_env_stack

__all__ = ["BatchOfOne", "GymIdOptions", "ResolvedEnvs", "as_batched_env", "resolve_envs", "seed_env"]

_log = logging.getLogger("torchrl.unilab")


@dataclasses.dataclass(frozen=True)
class GymIdOptions:
    """How a gymnasium, Playground or Control Suite id is built (:func:`~torchrl_unilab.make_gym_id_env`).

    Examples:
        >>> GymIdOptions(num_envs=4).engine
        'auto'
    """

    num_envs: int = 16
    env_kwargs: Mapping[str, Any] | None = None
    stagger_resets: bool = True
    engine: str = "auto"
    threads: int = 1


@dataclasses.dataclass
class ResolvedEnvs:
    """What :func:`resolve_envs` makes of a collector's env argument.

    Attributes:
        sources: one per worker: a factory (run in the worker process) or a live instance (run in a thread).
        num_workers: how many workers, checked (a list of envs sets it).
        engines: what steps each worker's envs (``"envpool"``, ``"gymnasium"``, ``"torchrl"``).
        given: the env instances the user gave; the collector closes them.
        probe: worker 0's env where a factory of it was called here already, else ``None``.
    """

    sources: list
    num_workers: int
    engines: list[str]
    given: list[EnvBase]
    probe: EnvBase | None

    def probe_env(self) -> EnvBase:
        """Worker 0's env, built here where :func:`resolve_envs` did not build it already."""
        if self.probe is not None:
            return self.probe
        first = self.sources[0]
        return first if isinstance(first, EnvBase) else first()


def resolve_envs(create_env_fn: Any, num_workers: int | None, gym_ids: GymIdOptions, create_env_kwargs: Any,
                 max_frames_per_traj: int | None, privileged: Transform | None) -> ResolvedEnvs:
    """One env source per worker: a factory (run in a process) or a live instance (run in a thread).

    ``gym_ids`` says how a gymnasium id in ``create_env_fn`` is built.

    Examples:
        >>> resolved = resolve_envs("Pendulum-v1", 2, GymIdOptions(num_envs=2), None, None, None)
        >>> resolved.num_workers, resolved.engines, resolved.probe is None
        (2, ['gymnasium', 'gymnasium'], True)
    """
    choices: dict[tuple, Any] = {}
    items = _one_item_per_worker(create_env_fn, num_workers, gym_ids, privileged, choices)
    num_workers = len(items)
    kwargs_list = _kwargs_per_worker(create_env_kwargs, num_workers)
    copies: dict[tuple, Any] = {}  # each factory pickled before its first call
    out, engines, probe = [], [], None
    try:  # an env built to be looked at is closed if a later item is refused
        for idx, (item, kwargs) in enumerate(zip(items, kwargs_list)):
            if isinstance(item, str):
                if kwargs:
                    raise ValueError("create_env_kwargs applies to env factories; for a gymnasium id use env_kwargs")
                source, engine = _gym_id_source(item, gym_ids, max_frames_per_traj, privileged)
                engines.append(engine)
                max_steps = None  # the id's env bounds its episodes itself (max_episode_steps)
            elif isinstance(item, EnvBase) or callable(item):
                if isinstance(item, EnvBase) and kwargs:
                    raise ValueError("create_env_kwargs cannot apply to an env instance; pass a factory instead")
                source = functools.partial(item, **kwargs) if kwargs else item
                # envs/ decides what runs the stack; a factory shared by workers is looked at (and copied) once.
                key = (id(item), repr(sorted(kwargs.items())))
                if key not in copies:
                    copies[key] = source if isinstance(source, EnvBase) else _FactoryCopy.of(source)
                unstarted = copies[key]
                if key not in choices:
                    choices[key] = choose_env_stack(source, gym_ids.engine, privileged)
                    built = choices[key].env  # a factory's env, looked at and kept as it is
                    if built is not None and idx == 0:
                        probe = built  # worker 0's probe: the factory is not called twice here
                    elif built is not None:
                        built.close(raise_if_closed=False)
                plan = choices[key].plan
                source = unstarted if plan is None else plan.factory(idx)
                engines.append(choices[key].engine)
                max_steps = max_frames_per_traj
            else:
                raise TypeError(
                    "create_env_fn must be a gymnasium id (str), an EnvBase, a callable returning an EnvBase "
                    f"(an EnvCreator, say), or a list of those; got {type(item).__name__}"
                )
            transforms = [StepCounter(max_steps=max_steps)] if max_steps else []
            transforms += [privileged] if privileged else []
            if transforms and isinstance(source, EnvBase):
                source = _with_transforms(lambda env=source: env, transforms)
            elif transforms:
                source = functools.partial(_with_transforms, source, transforms)
            if idx == 0 and probe is not None and transforms:
                probe = _with_transforms(lambda env=probe: env, transforms)
            out.append(source)
    except BaseException:
        for choice in choices.values():
            if choice.env is not None:
                choice.env.close(raise_if_closed=False)
        raise
    plans = [c.plan for c in choices.values() if c.plan is not None]
    if plans:
        moved = sum(engine == "envpool" for item, engine in zip(items, engines) if not isinstance(item, str))
        where = "" if moved == num_workers else f" in {moved} of {num_workers} workers"
        _log.info(f"OffPolicyCollector: {plans[0].describe()} runs on EnvPool{where}; pass engine='torchrl' to "
                  "keep your env stack")
    given = []
    for item in items:
        if isinstance(item, EnvBase) and all(item is not env for env in given):
            given.append(item)
    return ResolvedEnvs(out, num_workers, engines, given, probe)


def _one_item_per_worker(create_env_fn: Any, num_workers: int | None, gym_ids: GymIdOptions,
                         privileged: Transform | None, choices: dict[tuple, Any]) -> list:
    """``create_env_fn`` as one item per worker: a list as given, one item repeated ``num_workers`` times.

    An env instance shared by several workers is copied into each, as TorchRL's collectors pickle it, unless
    its stack is rebuilt on EnvPool (``choices`` keeps that decision for :func:`resolve_envs`).
    """
    if isinstance(create_env_fn, Sequence) and not isinstance(create_env_fn, str):
        items = list(create_env_fn)
        if not items:
            raise ValueError("create_env_fn as a list must not be empty")
        if num_workers is not None and num_workers != len(items):
            raise ValueError(f"num_workers={num_workers} does not match the {len(items)} envs in create_env_fn")
        return items
    num_workers = check_int("num_workers", 1 if num_workers is None else num_workers, 1)
    if isinstance(create_env_fn, EnvBase) and num_workers > 1:
        # An instance takes no create_env_kwargs: its key is that of empty ones.
        choice = choices[(id(create_env_fn), "[]")] = choose_env_stack(create_env_fn, gym_ids.engine, privileged)
        if choice.plan is None:  # a stack rebuilt on EnvPool needs no copy: each worker builds its own
            create_env_fn = EnvCopy(create_env_fn, num_workers)
    return [create_env_fn] * num_workers


def _kwargs_per_worker(create_env_kwargs: Any, num_workers: int) -> list[dict]:
    """TorchRL's ``create_env_kwargs``: one dict for every worker, or a list of one dict per worker."""
    if isinstance(create_env_kwargs, Mapping) or create_env_kwargs is None:
        return [dict(create_env_kwargs or {})] * num_workers
    kwargs_list = [dict(k) for k in create_env_kwargs]
    if len(kwargs_list) != num_workers:
        raise ValueError(f"create_env_kwargs holds {len(kwargs_list)} dicts for {num_workers} workers")
    return kwargs_list


def _gym_id_source(env_id: str, gym_ids: GymIdOptions, max_frames_per_traj: int | None,
                   privileged: Transform | None) -> tuple[Callable[[], EnvBase], str]:
    """A worker's factory of the gymnasium id ``env_id`` as ``gym_ids`` says to build it, and its engine."""
    options = dataclasses.asdict(gym_ids)
    check_int("num_envs", options["num_envs"], 1)
    if max_frames_per_traj:
        options["env_kwargs"] = {**(options["env_kwargs"] or {}), "max_episode_steps": max_frames_per_traj}
    options["engine"] = select_engine(env_id, options["engine"], options["env_kwargs"], privileged)
    return functools.partial(make_gym_id_env, env_id, options.pop("num_envs"), **options), options["engine"]


class _FactoryCopy:
    """An env factory as it was before this process first called it, for the workers to call.

    Looking at the env (the probe) calls the factory here. A factory that holds
    an env instance, as the partials of TorchRL's trainer configs do
    (``TransformedEnv`` over a ``ParallelEnv`` built by hydra), starts that
    instance then, and pickled afterwards it would carry live processes and
    their shared memory (``cannot pickle 'mmap.mmap' object``). Pickled first,
    each worker gets its own unstarted copy, as TorchRL's multi-process
    collectors give it.
    """

    def __init__(self, payload: bytes) -> None:
        self._payload = payload

    @classmethod
    def of(cls, factory: Callable[[], EnvBase]) -> Callable[[], EnvBase]:
        """The factory pickled now, or the factory itself if it cannot be (start() then says why)."""
        try:
            return cls(cloudpickle.dumps(factory))
        except Exception:  # noqa: BLE001 - an unpicklable factory fails with its own error at start()
            return factory

    def __call__(self) -> EnvBase:
        return cloudpickle.loads(self._payload)()


class EnvCopy:
    """A factory of copies of an env instance that has not started, one per worker process.

    TorchRL's multi-process collectors take one ``EnvBase`` with ``num_workers=N``
    and give each worker a pickled copy of it; this does the same. An instance
    that has started worker processes of its own (a ``ParallelEnv`` after
    ``reset``/``set_seed``/``rollout``) cannot be copied, and raises a
    ``ValueError`` that says what to pass instead.

    Args:
        env: the instance to copy.
        num_workers: the number of workers asked for (named in errors).

    Examples:
        >>> from torchrl.envs import GymEnv
        >>> make = EnvCopy(GymEnv("Pendulum-v1"), num_workers=2)
        >>> first, second = make(), make()
        >>> first is not second, first.batch_size
        (True, torch.Size([]))
    """

    def __init__(self, env: EnvBase, num_workers: int) -> None:
        started = _started_batched_env(env)
        advice = (f"pass a factory (a callable or EnvCreator building the env) or a list of num_workers={num_workers} "
                  "env instances, or create the env without starting it")
        if started is not None:
            raise ValueError(
                f"create_env_fn is an env instance whose {type(started).__name__} has already started its worker "
                f"processes, so it cannot be copied into num_workers={num_workers} workers; {advice}"
            )
        try:
            self._bytes = cloudpickle.dumps(env)
        except Exception as err:  # noqa: BLE001 - any pickling failure means the same to the user
            raise ValueError(
                f"create_env_fn is an env instance that cannot be copied into num_workers={num_workers} workers "
                f"({type(err).__name__}: {err}); {advice}"
            ) from err

    def __call__(self) -> EnvBase:
        return cloudpickle.loads(self._bytes)


def _started_batched_env(env: EnvBase) -> EnvBase | None:
    """The ``ParallelEnv`` inside ``env`` (through ``TransformedEnv`` layers) whose processes run, if any."""
    while isinstance(env, TransformedEnv):
        env = env.base_env
    if isinstance(env, ParallelEnv) and not env.is_closed:
        return env
    return None


def _with_transforms(env_fn: Callable[[], EnvBase], transforms: list) -> EnvBase:
    env = env_fn()
    for transform in transforms:
        env = TransformedEnv(env, transform.clone())
    return env


class BatchOfOne(SerialEnv):
    """An unbatched env stepped with a batch dimension of one (what :func:`as_batched_env` makes of it).

    The worker loop steps every env as a batch; for this one it calls the policy on
    the row without its batch dimension, as TorchRL's collectors call the policy of
    an unbatched env (a ``RandomPolicy`` or a spec-shaped module built from the
    env's own spec writes unbatched values).
    """


def as_batched_env(env: EnvBase) -> EnvBase:
    """``env`` with one batch dimension: an unbatched env becomes a :class:`BatchOfOne`.

    Examples:
        >>> from torchrl.envs import GymEnv
        >>> env = as_batched_env(GymEnv("Pendulum-v1"))
        >>> env.batch_size, type(env).__name__
        (torch.Size([1]), 'BatchOfOne')
    """
    if env.batch_dims == 1:
        return env
    if env.batch_dims == 0:
        return BatchOfOne(1, lambda: env)
    raise ValueError(f"the env must have at most one batch dimension, got batch_size {tuple(env.batch_size)}")


def seed_env(env: EnvBase, seed: int) -> int:
    """Seeds ``env`` with TorchRL's ``set_seed`` and returns the next free seed.

    TorchRL's ``AsyncEnvPool`` (an env that waits, its sub-envs stepped at the same time by threads) does not
    implement ``set_seed``; a threaded pool, under any ``TransformedEnv`` layers, has its sub-envs seeded one after
    another as a ``SerialEnv``'s are.

    Examples:
        >>> from torchrl.envs import AsyncEnvPool, GymEnv
        >>> pool = AsyncEnvPool([lambda: GymEnv("Pendulum-v1")] * 2, backend="threading")
        >>> seed_env(pool, 7) > 7
        True
        >>> pool.close()
    """
    try:
        return env.set_seed(seed)
    except NotImplementedError:
        base = env
        while isinstance(base, TransformedEnv):
            base = base.base_env
        sub_envs = getattr(base, "envs", None) if isinstance(base, AsyncEnvPool) else None
        if sub_envs is None:
            raise NotImplementedError(
                f"{type(base).__name__} does not implement set_seed, and the collector seeds each worker's env "
                "(seed=...): pass seed=None to leave it unseeded, or, for TorchRL's AsyncEnvPool, "
                "backend='threading', whose sub-envs are seeded one by one") from None
        for sub_env in sub_envs:
            seed = sub_env.set_seed(seed)
        return seed
