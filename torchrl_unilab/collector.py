"""``OffPolicyCollector``: batched MuJoCo workers filling a shared replay buffer."""

from __future__ import annotations

import contextlib
import functools
import inspect
import multiprocessing as mp
import shutil
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import cloudpickle
import torch
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModuleBase, TensorDictSequential
from torch import nn
from torchrl.collectors import MultiAsyncCollector
from torchrl.data import ReplayBuffer
from torchrl.envs import EnvBase, TransformedEnv
from torchrl.envs.utils import ExplorationType

from torchrl_unilab._control import FrameControl
from torchrl_unilab._processes import WorkerError, WorkerPool
from torchrl_unilab._worker import WorkerConfig, probe_row, worker_main
from torchrl_unilab.envpool_env import make_gym_id_env, select_engine
from torchrl_unilab.exploration import make_exploration_policy
from torchrl_unilab.metrics import CollectorMetrics
from torchrl_unilab.normalization import ObservationNormalizer
from torchrl_unilab.privileged import PrivilegedInfoTransform
from torchrl_unilab.replay_buffer import init_storage, make_replay_buffer, owned_scratch_dir
from torchrl_unilab.weight_sync import SharedWeights

__all__ = ["OffPolicyCollector"]

_TORCHRL_PARAMS = inspect.signature(MultiAsyncCollector.__mro__[1].__init__).parameters


class OffPolicyCollector(MultiAsyncCollector):
    """TorchRL's asynchronous multi-process collector, rebuilt for off-policy training.

    Each of ``num_workers`` processes steps ``num_envs`` environments as one
    batch, picks actions with ``policy`` under ``exploration_type`` (uniformly at
    random for the first ``init_random_frames`` frames), and writes flat
    transitions straight into ``replay_buffer``, a TorchRL ``ReplayBuffer``
    over a shared ``LazyMemmapStorage``. The learner samples from the buffer
    while collection goes on, and :meth:`update_policy_weights_` publishes new
    weights to every worker through shared memory.

    Each stored row holds ``"observation"``, ``"action"``, ``("next", "observation")``,
    ``("next", "reward")``, ``("next", "terminated")``, ``("next", "truncated")``,
    ``("next", "done")``, ``("collector", "traj_ids")`` (unique across workers),
    ``"step_count"`` / ``("next", "step_count")`` and ``"policy_version"`` (``-1``
    for uniformly random actions).

    Args:
        create_env_fn: a gymnasium id (``"HalfCheetah-v5"``), run on the engine
            ``engine`` selects; or a callable returning a
            batched TorchRL ``EnvBase`` with batch size ``[num_envs]``; or a list
            of such callables, one per worker.
        policy: a ``TensorDictModule`` reading ``"observation"`` and writing
            ``"action"`` for the whole batch. Its ``state_dict`` is what weight
            sync sends to the workers.

    Keyword Args:
        num_workers: worker processes (``>= 1``). Default 1.
        num_envs: environments per worker, stepped as one batch (``>= 1``).
            Ignored (taken from the env) when ``create_env_fn`` is a callable.
        frames_per_batch: frames each worker writes per batch; a multiple of ``num_envs``.
        total_frames: total frames to collect, ``-1`` for no limit.
        replay_buffer: from :func:`~torchrl_unilab.make_replay_buffer`. ``None``
            makes one of ``buffer_capacity`` rows in a temporary directory that
            :meth:`shutdown` removes.
        init_random_frames: frames (counted exactly, over all workers) whose
            actions are uniform over the action spec. Each worker takes an equal
            share, so the random phase is reproducible under a fixed seed.
        seed: env ``j`` of worker ``i`` gets seed ``seed + i * num_envs + j``.
        exploration_type: ``ExplorationType`` the policy runs under. Default ``RANDOM``.
        buffer_capacity: rows of the buffer made when ``replay_buffer`` is ``None``.
        env_kwargs: keyword arguments for ``gymnasium.make`` (gymnasium ids only).
        stagger_resets: stagger the first episode ends of a batch (gymnasium ids
            only; see :class:`~torchrl_unilab.BatchedGymEnv`). Default ``True``.
        engine: what steps a gymnasium id: ``"auto"`` (default) runs gymnasium's MuJoCo tasks on
            :class:`~torchrl_unilab.EnvPoolEnv` (EnvPool's C++ implementation) where EnvPool has the
            task and its options, and everything else on :class:`~torchrl_unilab.BatchedGymEnv`;
            ``"envpool"`` or ``"gymnasium"`` insist on one (see :func:`~torchrl_unilab.select_engine`).
        threads_per_worker: EnvPool threads per worker (EnvPool engine only). Default 1.
        metrics_window: finished episodes kept per worker for :meth:`metrics`.
        algo: ``"sac"`` or ``"td3"`` to wrap ``policy`` (then the bare actor from
            :func:`~torchrl_unilab.models.make_actor`) with its exploration module
            (:func:`~torchrl_unilab.exploration.make_exploration_policy`); ``None``
            uses ``policy`` as given.
        td3_noise, td3_std_min, td3_std_max, td3_std: TD3 exploration options
            (``"mixed"`` per-env stds in ``[td3_std_min, td3_std_max]``, or
            ``"constant"`` ``td3_std``), used when ``algo="td3"``.
        privileged: a :class:`~torchrl_unilab.PrivilegedInfoTransform` (or a dict
            of its arguments) appended to every worker's env; its ``out_key`` is
            stored in the buffer.
        obs_norm: ``True`` or an :class:`~torchrl_unilab.normalization.ObservationNormalizer`
            put in front of the policy, so workers normalise the actor's input
            while the buffer keeps raw observations. The learner is the single
            writer of its statistics (available as :attr:`obs_norm`); they reach
            the workers with :meth:`update_policy_weights_`.
        **torchrl_kwargs: other ``MultiAsyncCollector`` parameters are accepted
            at their default values only.

    Examples:
        >>> import torch
        >>> from tensordict.nn import TensorDictModule
        >>> from torchrl_unilab import OffPolicyCollector, make_replay_buffer
        >>> policy = TensorDictModule(torch.nn.Linear(3, 1), in_keys=["observation"], out_keys=["action"])
        >>> rb = make_replay_buffer(capacity=10_000, batch_size=64)
        >>> with OffPolicyCollector("Pendulum-v1", policy, num_workers=1, num_envs=4,
        ...                         frames_per_batch=64, total_frames=256, replay_buffer=rb,
        ...                         init_random_frames=64, seed=0) as collector:
        ...     for _ in collector:
        ...         pass
        >>> len(rb)
        256
        >>> sample = rb.sample()
        >>> sample["next", "observation"].shape
        torch.Size([64, 3])
    """

    def __init__(
        self,
        create_env_fn: str | Callable[[], EnvBase] | Sequence[Callable[[], EnvBase]],
        policy: TensorDictModuleBase | nn.Module | None = None,
        *,
        num_workers: int | None = None,
        num_envs: int = 16,
        frames_per_batch: int,
        total_frames: int = -1,
        replay_buffer: ReplayBuffer | None = None,
        init_random_frames: int | None = 0,
        seed: int | None = None,
        exploration_type: ExplorationType = ExplorationType.RANDOM,
        buffer_capacity: int = 1_000_000,
        env_kwargs: Mapping[str, Any] | None = None,
        stagger_resets: bool = True,
        engine: str = "auto",
        threads_per_worker: int = 1,
        metrics_window: int = 100,
        algo: str | None = None,
        td3_noise: str = "mixed",
        td3_std_min: float = 0.001,
        td3_std_max: float = 0.4,
        td3_std: float = 0.1,
        privileged: PrivilegedInfoTransform | Mapping[str, Any] | None = None,
        obs_norm: bool | ObservationNormalizer | None = None,
        **torchrl_kwargs: Any,
    ) -> None:
        # MultiCollector.__init__ starts TorchRL's own worker loop; this class
        # replaces that loop, so it sets up its state here instead.
        self.closed = True
        self._shutdown_complete = False
        self._pool: WorkerPool | None = None
        self._weights: SharedWeights | None = None
        self._owned_dir: str | None = None
        _check_torchrl_kwargs(torchrl_kwargs)
        if policy is None:
            raise TypeError("policy must be a TensorDictModule reading 'observation' and writing 'action', got None")
        self.num_workers = _check_int("num_workers", 1 if num_workers is None else num_workers, 1)
        init_random_frames = _check_int("init_random_frames", 0 if init_random_frames is None else init_random_frames, 0)
        if isinstance(privileged, Mapping):
            privileged = PrivilegedInfoTransform(**privileged)
        if privileged is not None and not isinstance(privileged, PrivilegedInfoTransform):
            raise TypeError(
                "privileged must be a PrivilegedInfoTransform or a dict of its keyword arguments, "
                f"got {type(privileged).__name__}"
            )
        env_fns = self._env_factories(create_env_fn, num_envs, env_kwargs, stagger_resets, privileged,
                                      engine, threads_per_worker)
        probe = env_fns[0]()
        try:
            if probe.batch_dims != 1:
                raise ValueError(
                    f"create_env_fn must return a batched env with batch_size [num_envs], got {tuple(probe.batch_size)}"
                )
            self.num_envs = probe.batch_size[0]
            self.frames_per_batch = _check_int("frames_per_batch", frames_per_batch, 1)
            if frames_per_batch % self.num_envs:
                raise ValueError(
                    f"frames_per_batch must be a multiple of num_envs={self.num_envs}, got {frames_per_batch}"
                )
            policy, self.obs_norm = _assemble_policy(
                policy, probe, algo, obs_norm,
                dict(td3_noise=td3_noise, td3_std_min=td3_std_min, td3_std_max=td3_std_max, td3_std=td3_std),
            )
            row = probe_row(probe, policy, exploration_type)
        finally:
            probe.close()
        self.requested_frames_per_batch = self.frames_per_batch
        self.total_frames = _round_total_frames(total_frames, self.frames_per_batch)
        self.init_random_frames = init_random_frames
        self.exploration_type = exploration_type
        self.policy = policy
        self.seed = seed
        self.replay_buffer = self._buffer(replay_buffer, buffer_capacity)
        init_storage(self.replay_buffer, row)
        self.storing_device = self.env_device = self.policy_device = [torch.device("cpu")] * self.num_workers
        self.postproc = None
        self.split_trajs = False
        self.update_at_each_batch = False
        self._frames = 0
        self._iter = -1
        self._running_free = False

        ctx = mp.get_context("spawn")
        share, rem = divmod(init_random_frames, self.num_workers)
        config = WorkerConfig(
            num_workers=self.num_workers,
            frames_per_batch=self.frames_per_batch,
            num_envs=self.num_envs,
            random_frames=[share + (i < rem) for i in range(self.num_workers)],
            seed=seed,
            exploration_type=exploration_type,
            row_keys=list(row.keys(include_nested=True, leaves_only=True)),
        )
        self._weights = SharedWeights.create(policy)
        self._metrics = CollectorMetrics(self.num_workers, metrics_window)
        self._control = FrameControl(ctx)
        self._pool = WorkerPool(
            ctx,
            target=_worker_entry,
            args=(config, [cloudpickle.dumps(fn) for fn in env_fns], cloudpickle.dumps(policy), self.replay_buffer,
                  self._weights, self._metrics, self._control),
            num_workers=self.num_workers,
        )
        self.procs = self._pool.procs
        self._pool.start()
        self.closed = False

    # ------------------------------------------------------------ set-up bits
    def _env_factories(self, create_env_fn, num_envs, env_kwargs, stagger_resets,
                       privileged, engine, threads_per_worker) -> list[Callable[[], EnvBase]]:
        if isinstance(create_env_fn, str):
            _check_int("num_envs", num_envs, 1)
            fn = functools.partial(make_gym_id_env, create_env_fn, num_envs, env_kwargs=env_kwargs,
                                   stagger_resets=stagger_resets, threads=_check_int("threads_per_worker",
                                                                                     threads_per_worker, 1),
                                   engine=select_engine(create_env_fn, engine, env_kwargs, privileged))
            fns = [fn] * self.num_workers
        elif isinstance(create_env_fn, Sequence):
            if len(create_env_fn) != self.num_workers or not all(callable(f) for f in create_env_fn):
                raise ValueError(
                    f"create_env_fn as a list must hold num_workers={self.num_workers} callables, got {len(create_env_fn)}"
                )
            fns = list(create_env_fn)
        elif callable(create_env_fn):
            fns = [create_env_fn] * self.num_workers
        else:
            raise TypeError(
            "create_env_fn must be a gymnasium id (str), a callable returning a batched EnvBase, or a list of "
                f"such callables, got {type(create_env_fn).__name__}"
            )
        if privileged is None:
            return fns
        return [functools.partial(_with_transform, fn, privileged) for fn in fns]

    def _buffer(self, replay_buffer: ReplayBuffer | None, buffer_capacity: int) -> ReplayBuffer:
        if replay_buffer is None:
            replay_buffer = make_replay_buffer(_check_int("buffer_capacity", buffer_capacity, 1))
            self._owned_dir = owned_scratch_dir(replay_buffer)
        if not isinstance(replay_buffer, ReplayBuffer):
            raise TypeError(f"replay_buffer must be a torchrl ReplayBuffer, got {type(replay_buffer).__name__}")
        capacity = replay_buffer.storage.max_size
        if capacity < self.frames_per_batch:
            raise ValueError(
                f"replay_buffer capacity {capacity} is below one batch (frames_per_batch={self.frames_per_batch}); "
                "use a capacity >= frames_per_batch"
            )
        if not getattr(replay_buffer, "shared", False):
            raise ValueError("replay_buffer must be shared between processes; build it with make_replay_buffer()")
        return replay_buffer

    # -------------------------------------------------------------- iteration
    def iterator(self) -> Iterator[None]:
        """Yields ``None`` each time a worker has written ``frames_per_batch`` frames.

        As with TorchRL collectors that own a replay buffer, the data is in the
        buffer, not in the yielded value. Workers run at most one batch ahead
        of the consumer, unless :meth:`start` lets them run free.
        """
        fpb = self.frames_per_batch
        self._allow_ahead()
        while self._frames < self.total_frames:
            target = self._frames + fpb
            self._wait(lambda: self._control.written >= target)
            self._frames = target
            self._iter += 1
            self._allow_ahead()
            yield None

    def _allow_ahead(self) -> None:
        if not self._running_free:
            self._control.allow(_cap(min(self.total_frames, self._frames + self.num_workers * self.frames_per_batch)))

    def _wait(self, predicate: Callable[[], bool], timeout: float | None = None) -> bool:
        return self._control.wait(predicate, timeout=timeout, on_poll=self._raise_if_failed)

    def _raise_if_failed(self) -> None:
        if self._pool is not None:
            self._pool.raise_if_failed()

    def start(self) -> None:
        """Lets every worker collect in the background until ``total_frames``."""
        self._raise_if_failed()
        self._running_free = True
        self._control.allow(_cap(self.total_frames))

    def allow_frames(self, frames: int | None) -> None:
        """Caps the total frames workers may write (``None``: up to ``total_frames``).

        Workers that reach the cap wait (they are paused, no data is dropped);
        learners use this to bound how far collection runs ahead of training.
        """
        self._raise_if_failed()
        self._running_free = True
        self._control.allow(_cap(self.total_frames if frames is None else min(frames, self.total_frames)))

    @contextlib.contextmanager
    def pause(self) -> Iterator[None]:
        """Context manager: no new batch starts inside it, and batches in flight are written first."""
        previous = self._control.freeze()
        self._wait(lambda: self._control.written >= self._control.claimed)
        try:
            yield
        finally:
            self._control.allow(previous)

    def wait_for_frames(self, frames: int, timeout: float | None = None) -> bool:
        """Blocks until ``frames`` frames are written; False on timeout. Raises a worker's error."""
        return self._wait(lambda: self._control.written >= frames, timeout)

    @property
    def frames_written(self) -> int:
        """Frames written into the replay buffer by all workers so far."""
        return self._control.written

    # ------------------------------------------------------------ weights etc.
    def update_policy_weights_(
        self,
        policy_or_weights: TensorDictBase | nn.Module | Mapping[str, torch.Tensor] | None = None,
        *,
        worker_ids: int | list[int] | None = None,
        **kwargs: Any,
    ) -> None:
        """Publishes new weights; every worker loads them before its next step.

        Args:
            policy_or_weights: the module, a ``state_dict``, or a TensorDict of
                weights (``TensorDict.from_module``) to publish. ``None`` publishes
                the ``policy`` given to the constructor, which the learner
                typically trains in place.
            worker_ids: accepted for TorchRL compatibility; all workers share
                one copy of the weights, so it must be ``None``.
        """
        if worker_ids is not None:
            raise ValueError("worker_ids must be None: all workers read one shared copy of the weights")
        if kwargs:
            raise TypeError(f"update_policy_weights_() got unexpected keyword arguments {sorted(kwargs)}")
        self._raise_if_failed()
        source = self.policy if policy_or_weights is None else policy_or_weights
        if isinstance(source, TensorDictBase):
            flat = source.flatten_keys(".")
            source = {name: flat.get(name) for name, _, _ in self._weights.layout}
        self._weights.publish(source)

    @property
    def policy_version(self) -> int:
        """Version of the latest published weights (1 = the initial policy)."""
        return self._weights.version

    def get_policy_version(self) -> int:
        """Same as :attr:`policy_version`."""
        return self.policy_version

    def metrics(self) -> dict[str, Any]:
        """Collection figures, readable at any time from the main process.

        Returns a dict with ``frames`` (written), ``fps``, ``random_frames``,
        ``episodes``, ``terminated``, ``truncated``, ``mean_return`` and
        ``mean_length`` over the recent-episode windows, ``time`` (seconds per
        worker phase: env step, policy, buffer write, weight sync),
        ``policy_version`` (the oldest any worker acts with), ``published_version``
        (the latest published), ``buffer_size`` and ``workers`` (the same figures
        per worker, with their episode windows).
        Raises :class:`~torchrl_unilab.WorkerError` if a worker failed.
        """
        self._raise_if_failed()
        out = self._metrics.summary()
        out["frames"] = self._control.written
        out["buffer_size"] = len(self.replay_buffer)
        out["published_version"] = self.policy_version
        return out

    def set_seed(self, seed: int, static_seed: bool = False) -> int:
        """Not supported after construction: pass ``seed=`` to the constructor instead."""
        raise RuntimeError("OffPolicyCollector seeds its workers at construction; pass seed= to the constructor")

    def state_dict(self) -> dict[str, Any]:
        """Frame counters, for checkpoints."""
        return {"frames": self._frames, "frames_written": self._control.written, "policy_version": self.policy_version}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restores the consumer-side frame counter saved by :meth:`state_dict`."""
        self._frames = int(state_dict.get("frames", 0))

    def reset(self, reset_idx: Sequence[bool] | None = None) -> None:
        """Not supported: workers reset their envs as episodes end."""
        raise RuntimeError("OffPolicyCollector workers reset their envs themselves as episodes end")

    # ---------------------------------------------------------------- closing
    def shutdown(self, timeout: float | None = None, close_env: bool = True, raise_on_error: bool = True) -> None:
        """Stops every worker within ``timeout`` seconds (default 4) and frees shared resources.

        Rows already written stay in the replay buffer. A buffer the collector
        made itself (``replay_buffer=None``) has its directory removed. A worker
        error not yet raised is raised here when ``raise_on_error`` is true.
        """
        if getattr(self, "_shutdown_complete", True):
            return
        self._shutdown_complete = True
        self.closed = True
        if self._pool is not None:
            self._pool.stop(timeout=4.0 if timeout is None else timeout)
        if self._weights is not None:
            self._weights.close()
        if self._owned_dir is not None:
            shutil.rmtree(self._owned_dir, ignore_errors=True)
        if raise_on_error:
            self._raise_if_failed()

    def __enter__(self) -> OffPolicyCollector:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.shutdown(raise_on_error=exc_type is None)

    def __del__(self) -> None:
        try:
            self.shutdown(raise_on_error=False)
        except Exception:  # noqa: BLE001 - interpreter teardown may have freed modules
            pass

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(num_workers={self.num_workers}, num_envs={self.num_envs}, "
            f"frames_per_batch={self.frames_per_batch}, total_frames={self.total_frames}, "
            f"frames_written={self._control.written if not self.closed else 'closed'})"
        )


def _with_transform(env_fn: Callable[[], EnvBase], transform: PrivilegedInfoTransform) -> EnvBase:
    return TransformedEnv(env_fn(), transform.clone())


def _assemble_policy(policy, env: EnvBase, algo: str | None, obs_norm, exploration: dict[str, Any]):
    """Wraps the actor with its exploration module and an observation normaliser, as asked."""
    if algo is not None:
        policy = make_exploration_policy(policy, algo, env.action_spec_unbatched, **exploration)
    normalizer = None
    if obs_norm is True:
        normalizer = ObservationNormalizer(env.observation_spec["observation"].shape[-1])
    elif isinstance(obs_norm, ObservationNormalizer):
        normalizer = obs_norm
    elif obs_norm not in (None, False):
        raise TypeError(f"obs_norm must be True, False, None or an ObservationNormalizer, got {obs_norm!r}")
    if normalizer is not None:
        policy = TensorDictSequential(normalizer, policy)
    return policy, normalizer


def _worker_entry(idx, config, env_fn_bytes, policy_bytes, *args):
    worker_main(idx, config, env_fn_bytes[idx], policy_bytes, *args)


def _cap(frames: int | float) -> int | None:
    return None if frames == float("inf") else int(frames)


def _check_int(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return value


def _round_total_frames(total_frames: int | None, frames_per_batch: int) -> int | float:
    if total_frames is None or total_frames < 0:
        return float("inf")
    _check_int("total_frames", total_frames, 1)
    return -(-total_frames // frames_per_batch) * frames_per_batch


def _check_torchrl_kwargs(kwargs: Mapping[str, Any]) -> None:
    for name, value in kwargs.items():
        param = _TORCHRL_PARAMS.get(name)
        if param is None:
            raise TypeError(f"OffPolicyCollector() got an unexpected keyword argument {name!r}")
        if value != param.default and not (name in ("device", "storing_device", "env_device", "policy_device")
                                           and str(value) == "cpu"):
            raise ValueError(
                f"OffPolicyCollector supports the MultiAsyncCollector parameter {name!r} only at its default "
                f"({param.default!r}), got {value!r}"
            )


__all__ += ["WorkerError"]
