"""``OffPolicyCollector``: batched MuJoCo workers filling a shared replay buffer."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import logging
import warnings
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import cloudpickle
import torch
from tensordict import TensorDictBase, is_non_tensor
from tensordict.nn import TensorDictModuleBase
from torch import nn
from torchrl.collectors import BaseCollector, MultiAsyncCollector
from torchrl.collectors.utils import split_trajectories
from torchrl.data import OfflineToOnlineReplayBuffer, ReplayBuffer
from torchrl.envs import EnvBase
from torchrl.envs.utils import ExplorationType
from torchrl.weight_update import WeightSyncScheme

from torchrl_unilab._torchrl_private import (
    CounterFields,
    collector_devices,
    has_receiver_schemes,
    idle_limit,
    init_collector_fields,
    normalize_worker_calls,
    read_compile_kwargs,
    set_weight_sync_schemes,
    set_weight_updater,
)
from torchrl_unilab.collectors._arguments import (
    CollectorSpec,
    check_arguments,
    frames_per_batch_of,
    round_total_frames,
)
from torchrl_unilab.collectors._batches import BatchHandover, to_storing_device, torchrl_layout
from torchrl_unilab.collectors._checkpoint import CollectorCounters, saved_policy_weights
from torchrl_unilab.collectors._control import FrameControl, num_batches, split_random_frames
from torchrl_unilab.collectors._env_view import EnvView
from torchrl_unilab.collectors._pacing import Pacing, WorkerFrames
from torchrl_unilab.collectors._policy import BuiltPolicy, PolicyFromFactory, PolicyRecipe, shaped_as
from torchrl_unilab.collectors._probe import probe_in_process, probe_step
from torchrl_unilab.collectors._processes import (
    RestartPolicy,
    WorkerError,
    WorkerPool,
    process_context,
    shut_down_at_exit,
)
from torchrl_unilab.collectors._varying_shapes import torchrl_collector_for
from torchrl_unilab.collectors._weights import WeightPublisher
from torchrl_unilab.collectors._worker import (
    NEXT_STEP_KEY,
    STEP_KEY,
    TRAJ_KEY,
    VERSION_KEY,
    WorkerConfig,
    WorkerInputs,
    apply_postproc,
    tensor_path,
    worker_main,
)
from torchrl_unilab.collectors._worker_view import WorkerView
from torchrl_unilab.collectors.metrics import CollectorMetrics
from torchrl_unilab.data.local_writer import LocalBufferWriter
from torchrl_unilab.data.replay_buffer import holds_row, prepare_storage
from torchrl_unilab.data.resolve import workers_buffer
from torchrl_unilab.envs.privileged import PrivilegedInfoTransform
from torchrl_unilab.envs.resolve import as_batched_env, resolve_envs
from torchrl_unilab.envs.specs import VaryingShapeError, varying_shape_keys
from torchrl_unilab.modules.normalization import ObservationNormalizer
from torchrl_unilab.weight_update.torchrl_schemes import (
    as_seqlock_scheme,
    as_weight_updater,
    bind_receiver_schemes,
    joins_receivers_on_error,
)
from torchrl_unilab.weight_update.weight_sync_scheme import SeqlockWeightSyncScheme

__all__ = ["OffPolicyCollector", "WorkerError"]

# A child of TorchRL's logger: its handler prints our one line beside TorchRL's own.
_log = logging.getLogger("torchrl.unilab")


class _OffPolicyCollectorMeta(type(MultiAsyncCollector)):
    """Builds an ``OffPolicyCollector``, or TorchRL's ``MultiAsyncCollector`` for an env whose entries vary in shape.

    As TorchRL's ``MultiCollector(sync=...)`` returns the subclass that fits, ``OffPolicyCollector(...)`` returns
    TorchRL's own collector, built from the same arguments, where its rows of fixed-shape shared tensors cannot hold
    the env's entries (``VaryingShapeError``, raised as the constructor looks at the env, before any worker
    starts). A subclass of ``OffPolicyCollector`` raises the error instead of becoming TorchRL's class.
    """

    def __call__(cls, *args: Any, **kwargs: Any) -> MultiAsyncCollector:
        try:
            return super().__call__(*args, **kwargs)
        except VaryingShapeError as err:
            if cls is not OffPolicyCollector:
                raise
            varying = err.keys
        collector = torchrl_collector_for(cls.__init__, args, kwargs, varying)
        warnings.warn(
            f"the env's entries {varying} vary in shape, which OffPolicyCollector's rows of fixed-shape shared "
            "tensors cannot hold: this is TorchRL's MultiAsyncCollector, built from the same arguments (each batch "
            "pickled through a pipe). Pad these entries to a fixed shape to collect with OffPolicyCollector",
            stacklevel=2)
        return collector

    @property
    def __signature__(cls) -> inspect.Signature:
        """The constructor's arguments, for ``inspect.signature`` and the docs (``__call__`` above takes any)."""
        init = inspect.signature(cls.__init__)
        return init.replace(parameters=list(init.parameters.values())[1:], return_annotation=inspect.Signature.empty)


class OffPolicyCollector(CounterFields, MultiAsyncCollector, metaclass=_OffPolicyCollectorMeta):
    """TorchRL's asynchronous multi-process collector, rebuilt for off-policy training.

    Each of ``num_workers`` workers steps a batch of environments, picks actions with ``policy`` under
    ``exploration_type`` (uniformly at random for the first ``init_random_frames`` frames), and either writes flat
    transitions straight into ``replay_buffer`` or, without one, hands each batch of ``frames_per_batch``
    transitions to the iterating process, as ``MultiAsyncCollector`` does. :meth:`update_policy_weights_` publishes
    new weights to every worker through shared memory
    (:class:`~torchrl_unilab.weight_update.weight_sync_scheme.SeqlockWeightSyncScheme`). Workers start on first
    use (iteration, :meth:`start`, :meth:`allow_frames`, :meth:`wait_for_frames`), so :meth:`set_seed` may come
    after construction, as in TorchRL's scripts.

    A yielded batch is laid out as ``MultiAsyncCollector``'s: ``[*env.batch_size, T]``, its last dimension named
    ``"time"``, with the env's keys, the policy's and ``("collector", "traj_ids")`` (unique across workers), plus
    ``"policy_version"`` / ``"step_count"`` where TorchRL's options add them. Rows written into a replay buffer are
    flat and always carry ``"step_count"``, ``("next", "step_count")`` and ``"policy_version"`` (``-1`` for uniformly
    random actions), which the sampler and the frame accounting read.

    The user guide's :doc:`/guide/collector` and :doc:`/guide/dropin_parameters` give every argument in full.

    Args:
        create_env_fn: a gymnasium id (``"HalfCheetah-v5"``, ``"module:Env-vN"``) or a MuJoCo Playground or Control
            Suite id (EnvPool only; :mod:`~torchrl_unilab.envs.task_families`), run ``num_envs`` per worker on the
            engine ``engine`` selects; a callable (or ``EnvCreator``) returning a TorchRL ``EnvBase``, run in each
            worker process; a live ``EnvBase``, stepped by a thread of this process; or a list, one per worker.
        policy: a ``TensorDictModule`` reading the env's observations and writing ``"action"`` for the whole batch.
            ``None`` with no ``policy_factory``: TorchRL's ``RandomPolicy``.

    Keyword Args:
        num_workers: workers (``>= 1``); inferred from a list ``create_env_fn``. Default 1. Also ``num_collectors``.
        num_envs: environments per worker for a gymnasium id; otherwise taken from the env.
        frames_per_batch: frames per worker batch, rounded up to the env's batch size as TorchRL does; a list holds
            one value per worker, and a batch then holds their sum, as with ``MultiAsyncCollector``.
        total_frames: total frames to collect, ``-1`` for no limit.
        replay_buffer: a TorchRL ``ReplayBuffer``; iteration then yields ``None`` per batch. Workers write into a
            shared one themselves (:func:`~torchrl_unilab.make_replay_buffer`, or TorchRL's
            ``ReplayBuffer(storage=LazyTensorStorage|LazyMemmapStorage, shared=True)``); any other buffer is
            extended by this process (:mod:`~torchrl_unilab.data.local_writer`), with one log line that says so.
            An ``OfflineToOnlineReplayBuffer`` is written through its online part, which is then ``replay_buffer``
            here (:mod:`~torchrl_unilab.data.resolve`).
        init_random_frames: frames, exact over all workers, whose actions are uniform over the action spec; each
            worker owns a fixed share, so a seeded run is reproducible. ``None`` or below 0: none.
        seed: env ``j`` of worker ``i`` gets seed ``seed + i * num_envs + j`` (or :meth:`set_seed` later).
        exploration_type: the ``ExplorationType`` the policy runs under, or its name. Default ``RANDOM``.
        env_kwargs, stagger_resets: ``gymnasium.make``'s keyword arguments, and staggered first episode ends
            (gymnasium ids only).
        engine: ``"auto"`` (default) runs gymnasium's MuJoCo tasks, and TorchRL env stacks that
            :func:`~torchrl_unilab.envs.torchrl_stack.recognise_env_stack` recognises, on EnvPool's C++
            implementation where it can; ``"torchrl"`` runs env stacks as given; ``"envpool"`` or ``"gymnasium"``
            insist on one engine. ``metrics()["engine"]`` says what runs.
        threads_per_worker: EnvPool threads per worker (EnvPool engine only). Default 1.
        metrics_window: finished episodes kept per worker for :meth:`metrics` (``>= 1``).
        algo, td3_noise, td3_std_min, td3_std_max, td3_std: ``"sac"`` or ``"td3"`` wraps ``policy`` (the bare actor
            of :func:`~torchrl_unilab.modules.models.make_actor`) with its exploration module; TD3's noise options.
        privileged: a :class:`~torchrl_unilab.PrivilegedInfoTransform` (or a dict of its arguments) appended to every
            worker's env.
        obs_norm: ``True`` or an :class:`~torchrl_unilab.modules.normalization.ObservationNormalizer` in front of the
            policy; the learner is the single writer of its statistics.
        nonfinite: a NaN or infinite value from an env: ``"raise"`` (default; names the env, step and key),
            ``"drop"`` the transition, or ``"reset"`` its env too (counted in :meth:`metrics`).
        max_worker_restarts: how many times each worker process is replaced after it dies. ``0`` (default): the
            first failure raises :class:`~torchrl_unilab.WorkerError`. A replacement continues the seed stream,
            loads the current weights and is owed the random frames not yet written; the batch in flight is lost,
            and not counted. Thread-stepped env instances are not restarted.
        start_method: ``"forkserver"`` (default; workers fork from a server that imported torch and TorchRL once)
            or ``"spawn"``.
        policy_factory: TorchRL's argument: builds the policy each worker acts with (never pickled); ``policy``, if
            also given, is the source of the weights each publish sends. Given alone, it is also called once here,
            for the policy the weights are published from (:attr:`policy`, which holds the weights published last),
            and once in a spawned process, for the rows' layout; each worker then acts with its own factory call's
            weights until the first :meth:`update_policy_weights_`, as TorchRL's workers do, which takes weights (or
            a module) named as the factory's policy (``None``: :attr:`policy`, the weights published last).
        postproc: applied to each batch, laid out as TorchRL's: in the worker before a buffer write, or here.
        create_env_kwargs, max_frames_per_traj, update_at_each_batch, track_policy_version, split_trajs: TorchRL's
            options, honoured as TorchRL's collectors honour them.
        trajs_per_batch, trajs_per_write, traj_format: whole trajectories per batch or per buffer write, as TorchRL.
        extend_buffer, num_sub_threads, init_fn, pre_collect_hook, post_collect_hook: TorchRL's options, honoured.
        weight_sync_schemes: ``{"policy": SeqlockWeightSyncScheme()}`` (the default); TorchRL's own schemes are
            kept to their contract on the same transport (:mod:`~torchrl_unilab.weight_update.torchrl_schemes`).
        device, storing_device, env_device, policy_device: TorchRL's devices, or a list (one per worker). Workers
            act and store on CPU; a yielded batch goes to the storing device, and a CUDA policy's weights are
            published to the shared CPU block.
        **torchrl_kwargs: the other parameters of ``MultiAsyncCollector`` and TorchRL's ``Collector``: accepted
            where they make sense here (``compile_policy``, ``cudagraph_policy``, ``weight_updater``,
            ``weight_recv_schemes``, ``set_truncated``, ...), otherwise only at their defaults; any other
            value raises a ``ValueError`` that says why and what to use instead.

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
        >>> with OffPolicyCollector("Pendulum-v1", policy, num_envs=4, frames_per_batch=64,
        ...                         total_frames=128) as collector:
        ...     batches = [batch for batch in collector]
        >>> [batch.shape for batch in batches], batches[0].names  # [envs, time], as TorchRL's collectors
        ([torch.Size([4, 16]), torch.Size([4, 16])], [None, 'time'])
    """

    #: Yield batches as TorchRL's collectors do (``[*env.batch_size, T]``, TorchRL's keys); a subclass that
    #: forwards the workers' flat rows with their bookkeeping (the Ray node collector) turns it off.
    _yields_torchrl_batches = True
    #: Say in the log how TorchRL's receiving schemes reach the workers; the Ray node collector, whose driver
    #: says it for every node, does not.
    _says_how_weights_arrive = True

    @joins_receivers_on_error  # a node of DistributedSyncCollector that fails here leaves its driver an error
    def __init__(
        self,
        create_env_fn: str | EnvBase | Callable[[], EnvBase] | Sequence[str | EnvBase | Callable[[], EnvBase]],
        policy: TensorDictModuleBase | nn.Module | None = None,
        *,
        num_workers: int | None = None,
        num_collectors: int | None = None,
        num_envs: int = 16,
        frames_per_batch: int | Sequence[int],
        total_frames: int | None = -1,
        replay_buffer: ReplayBuffer | OfflineToOnlineReplayBuffer | None = None,
        init_random_frames: int | None = 0,
        seed: int | None = None,
        exploration_type: ExplorationType | str = ExplorationType.RANDOM,
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
        nonfinite: str = "raise",
        max_worker_restarts: int = 0,
        start_method: str = "forkserver",
        policy_factory: Callable[[], TensorDictModuleBase] | None = None,
        create_env_kwargs: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None,
        max_frames_per_traj: int | None = None,
        postproc: Callable[[TensorDictBase], TensorDictBase] | None = None,
        update_at_each_batch: bool = False,
        extend_buffer: bool = True,
        weight_sync_schemes: Mapping[str, WeightSyncScheme] | None = None,
        track_policy_version: bool = False,
        split_trajs: bool | None = None,
        trajs_per_batch: int | None = None,
        trajs_per_write: int | None = None,
        traj_format: str | None = None,
        num_sub_threads: int = 1,
        init_fn: Callable[[], None] | None = None,
        pre_collect_hook: Callable[[], None] | None = None,
        post_collect_hook: Callable[[TensorDictBase], None] | None = None,
        device: Any = None,
        storing_device: Any = None,
        env_device: Any = None,
        policy_device: Any = None,
        **torchrl_kwargs: Any,
    ) -> None:
        # MultiCollector.__init__ would start TorchRL's own worker loop; this class
        # replaces that loop, so it sets the parent's fields here instead
        # (torchrl_unilab._torchrl_private.PARENT_FIELDS lists them).
        # TorchRL's base collector's own fields: the hooks, and in newer TorchRL the progress counters that its
        # trajectory assembly (BaseCollector.__iter__ with trajs_per_batch) records into.
        BaseCollector.__init__(self, pre_collect_hook=pre_collect_hook, post_collect_hook=post_collect_hook)
        self.closed = True
        self._shut_down = False
        self._pool: WorkerPool | None = None
        self._weights: WeightPublisher | None = None
        self._handover: BatchHandover | None = None
        self._probe_env: EnvBase | None = None
        self._probe_given: EnvBase | None = None
        self._given_envs: list[EnvBase] = []
        spec = check_arguments(
            torchrl_kwargs=torchrl_kwargs, replay_buffer=replay_buffer, num_workers=num_workers,
            devices=dict(device=device, storing_device=storing_device, env_device=env_device,
                         policy_device=policy_device),
            num_collectors=num_collectors, total_frames=total_frames, init_random_frames=init_random_frames,
            exploration_type=exploration_type, max_frames_per_traj=max_frames_per_traj, nonfinite=nonfinite,
            max_worker_restarts=max_worker_restarts, start_method=start_method, metrics_window=metrics_window,
            num_sub_threads=num_sub_threads, trajs_per_batch=trajs_per_batch, trajs_per_write=trajs_per_write,
            traj_format=traj_format, privileged=privileged, split_trajs=split_trajs, num_envs=num_envs,
            env_kwargs=env_kwargs, stagger_resets=stagger_resets, engine=engine,
            threads_per_worker=threads_per_worker)
        self._setup_spec(spec)
        self._setup_envs(create_env_fn, spec, create_env_kwargs)
        self._setup_batch_size(frames_per_batch, spec)
        recipe = PolicyRecipe(algo, spec.trust_policy, obs_norm, dict(td3_noise=td3_noise, td3_std_min=td3_std_min,
                                                                      td3_std_max=td3_std_max, td3_std=td3_std))
        factory_only = policy is None and policy_factory is not None
        built = self._setup_policy(policy, policy_factory, recipe, factory_only)
        row = self._setup_probe(built.acting, spec, postproc if replay_buffer is not None else None, factory_only)
        self._setup_storage(spec.replay_buffer, row, spec)
        self._setup_torchrl_options(
            spec, extend_buffer=extend_buffer, postproc=postproc, update_at_each_batch=update_at_each_batch,
            track_policy_version=track_policy_version, init_fn=init_fn, pre_collect_hook=pre_collect_hook,
            post_collect_hook=post_collect_hook, seed=seed, torchrl_kwargs=torchrl_kwargs)
        self._setup_weight_sync(weight_sync_schemes, torchrl_kwargs, built, factory_only)
        self._metrics = CollectorMetrics(self.num_workers, self.metrics_window)
        self._setup_pacing()
        self.frames_lost = 0
        self.closed = False
        shut_down_at_exit(self)

    # ------------------------------------------------------------ set-up steps
    def _setup_spec(self, spec: CollectorSpec) -> None:
        """The checked arguments this collector keeps as attributes, as TorchRL's collectors name them."""
        self.max_worker_restarts, self.start_method = spec.max_worker_restarts, spec.start_method
        self.metrics_window, self.num_sub_threads = spec.metrics_window, spec.num_sub_threads
        self.exploration_type, self.nonfinite = spec.exploration_type, spec.nonfinite
        self.max_frames_per_traj = spec.max_frames_per_traj or 0
        self.split_trajs = spec.split_trajs
        self.set_truncated = spec.set_truncated
        self.trajs_per_write, self.traj_format = spec.trajs_per_write, spec.traj_format
        self.reset_at_each_iter = False
        self.reset_when_done = True

    def _setup_envs(self, create_env_fn: Any, spec: CollectorSpec, create_env_kwargs: Any) -> None:
        """Resolves the env argument into one source per worker, and builds worker 0's env here to look at."""
        envs = resolve_envs(create_env_fn, spec.num_workers, spec.gym_ids, create_env_kwargs,
                            spec.max_frames_per_traj, spec.privileged)
        self._worker_envs, self.num_workers, self._engines, self._given_envs = (
            envs.sources, envs.num_workers, envs.engines, envs.given)
        probe = envs.probe_env()
        # getattr_env answers for the env as given (an unbatched env's specs have no batch dimension, as with
        # TorchRL's collectors); the workers step it with one.
        self._probe_given = probe
        self._env_view = EnvView(probe, self._live_env)
        self._env_batch_size = probe.batch_size
        self._given_step_count = STEP_KEY in probe.observation_spec.keys()
        self._probe_env = as_batched_env(probe)
        self.num_envs = self._probe_env.batch_size[0]
        varying = varying_shape_keys(probe)
        if varying:  # before any policy is built: OffPolicyCollector(...) gives such an env to TorchRL's collector
            self._close_probe()
            raise VaryingShapeError(varying)

    def _setup_batch_size(self, frames_per_batch: int | Sequence[int], spec: CollectorSpec) -> None:
        """Frames per batch, rounded up to the env's batch size as TorchRL rounds it; the frame totals."""
        frames_per_batch = frames_per_batch_of(frames_per_batch, self.num_workers)
        if frames_per_batch % self.num_envs:
            rounded = -(-frames_per_batch // self.num_envs) * self.num_envs
            warnings.warn(
                f"frames_per_batch ({frames_per_batch}) is not a multiple of the env's batch size "
                f"({self.num_envs}); it has been updated to {rounded}", stacklevel=3,
            )
            frames_per_batch = rounded
        self.frames_per_batch = self.requested_frames_per_batch = frames_per_batch
        self.total_frames = round_total_frames(spec.total_frames, self.frames_per_batch)
        self.init_random_frames = min(spec.init_random_frames, self.total_frames)
        self._counters = CollectorCounters(self.total_frames, self.num_workers)

    def _setup_policy(self, policy: Any, policy_factory: Callable | None, recipe: PolicyRecipe,
                      factory_only: bool) -> BuiltPolicy:
        """The policy the workers act with, built from what was given as TorchRL's collectors build it
        (``factory_only``: a ``policy_factory`` given without ``policy``)."""
        # As TorchRL's collectors: a policy_factory builds the policy each worker acts with. Given alone, it is also
        # called here once, for the policy the weights are published from (the seqlock block is laid out from it, as
        # the policy each worker builds), and once in a spawned process of its own, for the row a worker will write
        # (probe_in_process).
        self._worker_policy = (None if policy_factory is None
                               else PolicyFromFactory(policy_factory, recipe, keeps_own_weights=factory_only))
        self.policy_factory = policy_factory
        source = policy_factory() if factory_only else policy
        built = recipe.build(source, self._probe_given, self._probe_env)
        self.obs_norm = built.obs_norm
        self.policy = built.acting
        return built

    def _setup_probe(self, acting: nn.Module, spec: CollectorSpec, postproc: Callable | None,
                     factory_only: bool) -> TensorDictBase:
        """One step with the policy before any worker starts: the row every worker writes (``_probe``)."""
        with contextlib.ExitStack() as on_error:
            on_error.callback(self._close_probe)
            if factory_only:
                row, self._policy_row, stepped = probe_in_process(self._worker_envs[0], self._worker_policy,
                                                                  spec.exploration_type, spec.set_truncated)
                shaped_as(acting, stepped)  # lazy layers, which only a step shapes, as the probe's policy has them
            else:
                row, self._policy_row = probe_step(self._probe_env, acting, spec.exploration_type,
                                                   set_truncated=spec.set_truncated)
            if postproc is not None and spec.local_write_reason is None:
                # Workers apply postproc before their buffer writes; yielded batches get it here instead.
                row = postproc(row.unsqueeze(0))[0]
            on_error.pop_all()
        non_tensor = sorted(str(key) for key in row.keys(True) if is_non_tensor(row.get(key)))
        if non_tensor:  # a documented difference in what rows hold (docs/guide/torchrl_scripts.rst)
            warnings.warn(
                f"the env writes non-tensor entries {non_tensor}; OffPolicyCollector's rows live in shared tensors "
                "and leave them out (TorchRL's collectors pickle them). Encode them as tensors to keep them",
                stacklevel=3)
        self._row = row
        return row

    def _setup_storage(self, replay_buffer: ReplayBuffer | None, row: TensorDictBase, spec: CollectorSpec) -> None:
        """Lays the buffer's storage out from the probe's row; a buffer the workers cannot write gets a writer here."""
        self.replay_buffer = replay_buffer
        written_here = spec.local_write_reason
        self._row_keys = prepare_storage(replay_buffer, row, self.frames_per_batch, local=written_here is not None)
        local = None
        if written_here is not None:
            local = LocalBufferWriter(replay_buffer, self.num_envs, trajs=spec.trajs_per_batch is not None,
                                      trajs_per_write=spec.trajs_per_write)
            _log.info(f"OffPolicyCollector: {written_here}")
        # The batches the workers hand over; a local buffer's writer, with the thread that feeds it while
        # collection runs in the background.
        self._handover = BatchHandover(local, take=functools.partial(self._take_batch, raise_failures=False))
        # As TorchRL's multi-process collectors: with a replay buffer, whole trajectories go into it and iteration
        # yields None per batch; without one, BaseCollector.__iter__ assembles trajectories to yield.
        self.trajs_per_batch = spec.trajs_per_batch if replay_buffer is None else None

    def _setup_torchrl_options(self, spec: CollectorSpec, *, extend_buffer: bool, postproc: Callable | None,
                               update_at_each_batch: bool, track_policy_version: bool, init_fn: Callable | None,
                               pre_collect_hook: Callable | None, post_collect_hook: Callable | None,
                               seed: int | None, torchrl_kwargs: Mapping[str, Any]) -> None:
        """TorchRL's options this collector honours as they are, and the parent's fields TorchRL's methods read."""
        self.seed = seed
        self.extend_buffer = extend_buffer
        self.postproc = postproc
        self.update_at_each_batch = update_at_each_batch
        self.track_policy_version = track_policy_version
        # Rows carry these for the buffer's bookkeeping; a yielded batch has them only where TorchRL's own
        # options would write them (track_policy_version; max_frames_per_traj's StepCounter).
        counts_steps = bool(self.max_frames_per_traj) or self._given_step_count
        self._rows_only_keys = [key for key, kept in ((VERSION_KEY, track_policy_version), (STEP_KEY, counts_steps),
                                                      (NEXT_STEP_KEY, counts_steps)) if not kept]
        self.init_fn = init_fn
        # TorchRL's per-worker device tuples. Workers act and store on CPU whatever these name; a yielded batch
        # goes to the storing device (_batches.to_storing_device).
        devices = collector_devices(self, **spec.devices)
        self.storing_device, self.policy_device, self.env_device = devices
        self.worker_idx = torchrl_kwargs.get("worker_idx")
        init_collector_fields(self)
        self._lockstep = False  # whether workers step only while the consumer waits (set as they start)
        self._started = False

    def _setup_weight_sync(self, weight_sync_schemes: Mapping[str, WeightSyncScheme] | None,
                           torchrl_kwargs: Mapping[str, Any], built: BuiltPolicy, factory_only: bool) -> None:
        """The workers' weights (ours, or TorchRL's scheme on our block), and TorchRL's other weight paths."""
        # A policy built here from policy_factory is no learner's: it holds what was published last instead.
        self._weights = WeightPublisher(self._setup_scheme(weight_sync_schemes), policy=built.acting,
                                        given=built.given, on_copy=built.on_copy, holds_published=factory_only)
        # As TorchRL's collectors: the schemes as given (ours by default); an adapter of TorchRL's runs on our block.
        set_weight_sync_schemes(self, {"policy": self._weights.scheme})
        self._setup_compile(torchrl_kwargs.get("compile_policy"), torchrl_kwargs.get("cudagraph_policy"))
        set_weight_updater(self, as_weight_updater(torchrl_kwargs.get("weight_updater"), self))
        if torchrl_kwargs.get("weight_recv_schemes") is not None:
            # As MultiCollector: receivers are registered at construction, and connect before collection.
            self.register_scheme_receiver(torchrl_kwargs["weight_recv_schemes"])

    def _setup_pacing(self) -> None:
        """The workers' frame accounting and the pacing over it (``start``, ``allow_frames``, ``pause``, ...)."""
        counters = self._counters
        self._worker_frames = WorkerFrames(
            self._frame_control(), handover=self._handover, has_buffer=self.replay_buffer is not None,
            total=lambda: counters.to_write, restored=lambda: counters.restored, begin=self._ensure_started,
            started=lambda: self._started, raise_if_failed=self._raise_if_failed,
            report_failure=self._report_failure)
        self._pacing = Pacing(self._worker_frames)

    def _frame_control(self) -> FrameControl:
        """Shares the random frames still to collect among the workers, and the frame accounting over them.

        Frames restored by :meth:`load_state_dict` count against ``init_random_frames`` and
        ``total_frames``, as they do in TorchRL's collectors.
        """
        random_frames = max(0, self.init_random_frames - self._counters.restored)
        self._random_shares = split_random_frames(random_frames, self.num_workers, self.frames_per_batch)
        return FrameControl(self._random_shares, self.frames_per_batch, self._counters.to_write)

    def _setup_scheme(self, schemes: Mapping[str, Any] | None) -> SeqlockWeightSyncScheme:
        schemes = dict(schemes or {})
        unknown = sorted(set(schemes) - {"policy"})
        if unknown:
            raise ValueError(f"weight_sync_schemes syncs the 'policy' model only, got keys {unknown}")
        # TorchRL's own schemes are kept to their contract on our transport (weight_update.torchrl_schemes).
        scheme = as_seqlock_scheme(schemes.get("policy"))
        scheme.init_on_sender(model_id="policy", context=self, model=self.policy)
        return scheme

    def _setup_compile(self, compile_policy: Any, cudagraph_policy: Any) -> None:
        """TorchRL's ``compile_policy`` / ``cudagraph_policy``, read as TorchRL reads them, said once in the log.

        Workers act on CPU, with the policy uncompiled: through the tensor path where it reads the policy's
        layers, else with the module itself. CUDA graphs need a CUDA policy, so they have no use here.
        """
        read_compile_kwargs(self, compile_policy, cudagraph_policy)
        if self.compiled_policy:
            path = ("a tensor path that runs the policy's layers" if self._acts_on_tensor_path()
                    else "the policy module, eagerly")
            _log.info(f"OffPolicyCollector: compile_policy={compile_policy!r} is accepted; workers act on CPU "
                      f"through {path}, uncompiled")
        if self.cudagraphed_policy:
            _log.info(f"OffPolicyCollector: cudagraph_policy={cudagraph_policy!r} is accepted and has no use: "
                      "workers act on CPU, and CUDA graphs run on CUDA only")

    def _acts_on_tensor_path(self, env: EnvBase | None = None) -> bool:
        """Whether a worker stepping ``env`` (worker 0's by default) acts through the tensor path, not the policy
        module (``_worker.tensor_path``)."""
        policy = self.policy if self._worker_policy is None else self._worker_policy
        return tensor_path(policy, self._probe_env if env is None else env, self.exploration_type) is not None

    # ----------------------------------------------------------------- workers
    @property
    def _workers_write(self) -> bool:
        """Whether the workers write into ``replay_buffer`` themselves (the fast path)."""
        return self.replay_buffer is not None and not self._handover.writes_locally

    def _ensure_started(self) -> None:
        """Starts the workers on first use: iteration, start(), allow_frames() or wait_for_frames()."""
        if self._started:
            return
        if self.closed:
            raise RuntimeError("the collector is shut down")
        self._started = True
        config = WorkerConfig(
            num_workers=self.num_workers,
            frames_per_batch=self.frames_per_batch,
            num_envs=self.num_envs,
            random_frames=self._random_shares,
            seed=self.seed,
            exploration_type=self.exploration_type,
            row_keys=self._row_keys,
            nonfinite=self.nonfinite,
            policy_row=self._policy_row,
            set_truncated=self.set_truncated,
            num_threads=self.num_sub_threads,
            streams=[self._counters.stream_base] * self.num_workers,
        )
        in_thread = [isinstance(env, EnvBase) for env in self._worker_envs]
        # tensordict's exploration type is one setting for the whole process. A policy module reads and sets it as
        # it acts (set_exploration_type, a ProbabilisticActor's get_dist_params), and the learner's losses read it
        # while its torch.compile guards on it. A worker thread acting through the module therefore steps only
        # while the iterating thread waits for its batch, one batch at a time, as TorchRL's Collector steps.
        self._lockstep = any(not self._acts_on_tensor_path(env) for env in self._worker_envs
                             if isinstance(env, EnvBase))
        if not all(in_thread):
            self._close_probe()  # the processes build their own envs
        sources = [env if isinstance(env, EnvBase) else cloudpickle.dumps(env) for env in self._worker_envs]
        worker_policy = self.policy if self._worker_policy is None else self._worker_policy
        extras = dict(init_fn=self.init_fn, pre_collect_hook=self.pre_collect_hook,
                      post_collect_hook=self.post_collect_hook,
                      postproc=self.postproc if self._workers_write else None)
        sink = workers_buffer(self.replay_buffer) if self._workers_write else None
        if sink is None:
            sink = self._handover.open(self._row.select(*self._row_keys), self.num_workers, self.frames_per_batch)
        inputs = WorkerInputs(config, sources, cloudpickle.dumps(worker_policy), cloudpickle.dumps(extras), sink,
                              self._weights.shared, self._metrics, self._worker_frames.control)
        self._pool = WorkerPool(
            process_context(self.start_method),
            target=worker_main,
            args=(inputs,),
            num_workers=self.num_workers,
            in_thread=in_thread,
            restart=RestartPolicy(self.max_worker_restarts,
                                  prepare=functools.partial(self._replacement_args, inputs)),
        )
        self.procs = self._pool.procs
        # Workers start from the policy as it is now, as TorchRL's do (a policy loaded or changed in place after
        # construction): under the same version, since no worker has read the block yet.
        self._weights.publish(new_version=False)
        self._pool.start()

    def _replacement_args(self, inputs: WorkerInputs, worker_idx: int, restarts: int) -> tuple[WorkerInputs]:
        """What a dead worker's replacement starts with; settles the dead one's frame accounting first.

        Called by the pool once the dead process is gone: its claimed, unwritten
        batch is handed back (lost, not counted), and the replacement gets the
        next seed stream and the random frames the worker has not written yet.
        A batch it had written into the buffer, or into its slots for iteration,
        and not yet counted is counted.
        """
        def handed_over(traj: int, step: int) -> bool:
            first_row = {TRAJ_KEY: traj, STEP_KEY: step}
            if self._workers_write:
                return holds_row(self.replay_buffer, first_row)
            return self._handover.holds(worker_idx, first_row)

        lost, owed = self._worker_frames.control.settle(worker_idx, self._random_shares[worker_idx], handed_over)
        self.frames_lost += lost
        config = inputs.cfg
        random_frames, streams = list(config.random_frames), list(config.streams or [0] * self.num_workers)
        random_frames[worker_idx], streams[worker_idx] = owed, self._counters.stream_base + restarts
        return (dataclasses.replace(inputs, cfg=dataclasses.replace(config, random_frames=random_frames,
                                                                    streams=streams)),)

    def _close_probe(self) -> None:
        probe, self._probe_env, self._probe_given = self._probe_env, None, None
        if probe is not None and not isinstance(self._worker_envs[0], EnvBase):
            with contextlib.suppress(Exception):
                probe.close(raise_if_closed=False)

    def _raise_if_failed(self) -> None:
        if self._pool is not None:
            self._pool.raise_if_failed()
        handover = getattr(self, "_handover", None)
        if handover is not None:
            handover.raise_if_failed()

    def _report_failure(self) -> None:
        """Raises a worker's failure once it has had a moment to be reported: after a wait, the other workers can
        have written the last frames before the watcher named one that died on the way."""
        if self._pool is not None:
            self._pool.raise_if_failed(wait_for_report=1.0)

    # -------------------------------------------------------------- iteration
    def iterator(self) -> Iterator[TensorDictBase | None]:
        """Yields each batch of ``frames_per_batch`` transitions, or ``None`` with a ``replay_buffer``.

        With a replay buffer, as with TorchRL collectors that own one, the data
        is in the buffer, not in the yielded value. Workers run at most one batch
        ahead of the consumer, unless :meth:`start` lets them run free.
        """
        if self.update_at_each_batch:  # as TorchRL's iterator: the first batch too acts with the weights as they are
            self.update_policy_weights_()
        self._ensure_started()
        fpb = self.frames_per_batch
        limit = idle_limit()
        counters, frames, handover = self._counters, self._worker_frames, self._handover
        while counters.frames < self.total_frames:
            self._allow_ahead()
            if self.replay_buffer is None:
                out = self._take_batch(limit, yielded=self._yields_torchrl_batches)
                arrived = out is not None
            elif handover.writes_locally and not handover.feeding:
                batch, out = self._take_batch(limit), None
                arrived = batch is not None
                if arrived:
                    self._write_local(batch)
            else:  # the workers, or the feed thread after start(), write the buffer
                target = counters.frames - counters.restored + fpb
                arrived, out = frames.wait(lambda: frames.buffered >= target, limit), None
            if not arrived:
                raise RuntimeError(  # TorchRL's MultiAsyncCollector's words
                    f"Failed to gather all collector output within {limit} seconds. "
                    "Increase the MAX_IDLE_COUNT environment variable to bypass this error.")
            counters.count_batch(fpb)
            if self.update_at_each_batch:
                self.update_policy_weights_()
            if not self._lockstep:  # the workers collect the next batches while the consumer uses this one
                self._allow_ahead()
            yield out

    def _allow_ahead(self) -> None:
        """Lets the workers collect up to one batch each past what was consumed (just the next batch in lockstep)."""
        batches = 1 if self._lockstep else self.num_workers
        ahead = min(self.total_frames, self._counters.frames + batches * self.frames_per_batch)
        self._pacing.allow_ahead(ahead - self._counters.restored)

    def _take_batch(self, timeout: float | None = None, yielded: bool = False,
                    raise_failures: bool = True) -> TensorDictBase | None:
        """The oldest batch a worker handed over, made ready to write, or to yield as TorchRL's collectors do
        (``yielded``); ``None`` after ``timeout`` seconds.

        The feed thread leaves a failed worker to the user's thread to raise (``raise_failures=False``).
        """
        out = self._handover.take(timeout, on_poll=self._raise_if_failed if raise_failures else _no_op,
                                  exclude=self._rows_only_keys if yielded else ())
        if out is None:
            return None
        if yielded:
            if self.track_policy_version:  # TorchRL's PolicyVersion transform writes it on both sides
                out.set(("next", VERSION_KEY), out.get(VERSION_KEY))
        if yielded:
            out = to_storing_device(out, self.storing_device[0])
        if self.split_trajs:
            # A batch is step-major over the worker's envs; a stable sort by trajectory id makes each
            # trajectory one run of consecutive steps, which is what split_trajectories expects.
            out = split_trajectories(out[torch.argsort(out.get(TRAJ_KEY), stable=True)], prefix="collector")
            if self.postproc is not None:
                out = self.postproc(out)
        elif yielded and len(out) == self.frames_per_batch:
            out = torchrl_layout(out, self.num_envs, self._env_batch_size)
            if self.postproc is not None:
                out = self.postproc(out)
        elif self.postproc is not None and len(out) == self.frames_per_batch:
            # TorchRL's layout for it, envs first and time last (MultiStep), then flat again
            out = apply_postproc(self.postproc, out.reshape(-1, self.num_envs))
        elif self.postproc is not None:  # rows dropped (nonfinite="drop"): no whole [envs, steps] grid is left
            out = self.postproc(out)
        return out

    def _write_local(self, batch: TensorDictBase) -> None:
        # batches, as the workers count them (nonfinite="drop" drops rows)
        self._handover.write_local(batch, self.frames_per_batch)

    def __len__(self) -> int:
        return num_batches(self.total_frames, self.frames_per_batch)

    def __bool__(self) -> bool:
        # Without it, bool() would call __len__, which raises for a collector with no frame limit. Ray tests an
        # actor's truth when it stores a task error: a node would lose its remote traceback.
        return True

    @property
    def frames_iterated(self) -> int:
        """Frames iteration has counted: those yielded, and those a restored checkpoint counts."""
        return self._counters.frames

    @property
    def batches_iterated(self) -> int:
        """Batches iteration has counted (a restored checkpoint's included)."""
        return self._counters.iteration + 1

    # ------------------------------------------------------------------ pacing
    def start(self) -> None:
        """Lets every worker collect into ``replay_buffer`` in the background until ``total_frames``."""
        self._pacing.start()

    def allow_frames(self, frames: int | None) -> None:
        """Caps the total frames workers may write (``None``: up to ``total_frames``).

        Workers that reach the cap wait (they are paused, no data is dropped);
        learners use this to bound how far collection runs ahead of training.

        Examples:
            >>> from torchrl_unilab import OffPolicyCollector, make_replay_buffer
            >>> rb = make_replay_buffer(1_000)
            >>> with OffPolicyCollector("Pendulum-v1", num_envs=2, frames_per_batch=32, replay_buffer=rb) as c:
            ...     c.allow_frames(64)
            ...     c.wait_for_frames(64, timeout=120), len(rb) >= 64
            (True, True)
        """
        self._pacing.allow_frames(frames)

    def pause(self, timeout: float | None = 30.0, *, resume: bool = True) -> contextlib.AbstractContextManager:
        """Context manager: no new batch starts inside it, and batches in flight are written first.

        Args:
            timeout: seconds to wait for the batches in flight (``None``: as long as they take); past it,
                collection goes on and ``TimeoutError`` is raised, as TorchRL's ``RayCollector.pause``.
            resume: on exit, collection goes on as before; ``False`` keeps it paused until :meth:`start` or
                :meth:`allow_frames` (or the next batch iterated).
        """
        return self._pacing.pause(timeout, resume=resume)

    def wait_for_frames(self, frames: int, timeout: float | None = None) -> bool:
        """Blocks until ``frames`` frames are written; False on timeout. Raises a worker's error.

        Starts the workers if they have not started. A wait that could never end
        raises ``ValueError`` instead: ``frames`` above ``total_frames``, or above
        what the workers are allowed to collect (call :meth:`start` or
        :meth:`allow_frames` first).
        """
        return self._pacing.wait_for_frames(frames, timeout)

    @property
    def frames_written(self) -> int:
        """Frames collected by all workers so far (written into the buffer or handed over)."""
        return self._pacing.frames_written

    # ----------------------------------------------------------------- weights
    def update_policy_weights_(
        self,
        policy_or_weights: TensorDictBase | nn.Module | Mapping[str, torch.Tensor] | None = None,
        *,
        worker_ids: int | list[int] | None = None,
        model_id: str | None = None,
        **kwargs: Any,
    ) -> None:
        """Publishes new weights; every worker loads them before its next step.

        Args:
            policy_or_weights: a module, a ``state_dict`` or a TensorDict of weights
                (``TensorDict.from_module(actor)``), for the policy given to the
                constructor or any of its submodules: names are resolved under
                whatever the collector wrapped around it (``algo=``, ``obs_norm=``),
                and the rest (normaliser statistics) is published as it is now.
                ``None`` publishes the ``policy`` given to the constructor, which
                the learner typically trains in place (when it lives on a GPU, the
                workers act on a CPU copy, and this publishes the original); for a
                ``policy_factory`` given alone, the weights published last (the first
                time, those of the policy the factory built here). CUDA tensors reach
                the shared CPU block with one batched copy.
            worker_ids: accepted for TorchRL compatibility; all workers share one
                copy of the weights, so it must be ``None``.
            model_id: ``None`` or ``"policy"``, the one model the workers run. TorchRL's receiving
                schemes pass it once they have received weights.

        A ``weight_updater`` given to the constructor is called first, as TorchRL's
        collectors call it; the weights then go to the workers as above.

        Examples:
            >>> from tensordict.nn import TensorDictModule
            >>> from torchrl_unilab import OffPolicyCollector
            >>> policy = TensorDictModule(torch.nn.Linear(3, 1), ["observation"], ["action"])
            >>> with OffPolicyCollector("Pendulum-v1", policy, num_envs=2, frames_per_batch=32) as collector:
            ...     collector.update_policy_weights_()
            ...     collector.policy_version
            2
        """
        if "policy_weights" in kwargs:
            policy_or_weights = kwargs.pop("policy_weights")
        if kwargs:
            raise TypeError(f"update_policy_weights_() got unexpected keyword arguments {sorted(kwargs)}")
        if model_id not in (None, "policy"):
            raise ValueError(f"model_id must be None or 'policy' (the model the workers run), got {model_id!r}")
        self._raise_if_failed()
        if self.weight_updater is not None:
            self.weight_updater(policy_or_weights=policy_or_weights, worker_ids=worker_ids)
        self._weights.publish(policy_or_weights, worker_ids=worker_ids)

    def register_scheme_receiver(self, weight_recv_schemes: Mapping[str, WeightSyncScheme], *,
                                 synchronize_weights: bool = True) -> None:
        """Takes weights from a parent collector through TorchRL's receiving schemes, as TorchRL's collectors do.

        TorchRL's Ray, RPC and distributed collectors call this on the collector
        they run on a node. Each scheme applies the weights it receives to the
        policy given to the constructor, then calls :meth:`update_policy_weights_`,
        which publishes them to the workers
        (:func:`~torchrl_unilab.weight_update.torchrl_schemes.bind_receiver_schemes`).
        """
        bind_receiver_schemes(self, weight_recv_schemes, self._weights.given, log=self._says_how_weights_arrive)
        MultiAsyncCollector.register_scheme_receiver(self, weight_recv_schemes,
                                                     synchronize_weights=synchronize_weights)

    def receive_weights(self, *args: Any, **kwargs: Any) -> None:
        """Receives weights through the schemes :meth:`register_scheme_receiver` registered, as TorchRL does.

        Without such a scheme this collector is the sender of its workers' weights, and this raises
        ``NotImplementedError``.
        """
        if not has_receiver_schemes(self):
            raise NotImplementedError("OffPolicyCollector receives weights only through the schemes given as "
                               "weight_recv_schemes or to register_scheme_receiver(); call update_policy_weights_() "
                               "to publish the learner's weights")
        MultiAsyncCollector.receive_weights(self, *args, **kwargs)

    @property
    def policy_version(self) -> int:
        """Version of the latest published weights (1 = the initial policy)."""
        return self._weights.version

    def get_policy_version(self) -> int:
        """Same as :attr:`policy_version`."""
        return self.policy_version

    def increment_version(self) -> None:
        """Publishes the constructor's policy again, as a new version (versions count publishes here)."""
        self.update_policy_weights_()

    def get_cached_weights(self, model_id: str) -> TensorDictBase:
        """The weights last published for ``model_id`` (``"policy"``), as a TensorDict."""
        self.get_model(model_id)
        return self._weights.cached_weights()

    # ------------------------------------------------------------ checkpoint
    def set_seed(self, seed: int, static_seed: bool = False) -> int:
        """Seeds the workers' envs; call it before collection starts. Returns the next free seed.

        Env ``j`` of worker ``i`` gets ``seed + i * num_envs + j``, so the next
        free seed is ``seed + num_workers * num_envs``.
        """
        if static_seed:
            raise ValueError("static_seed=True is not supported: every env of every worker gets its own seed")
        if self._started:
            raise RuntimeError(
                "set_seed() must be called before collection starts (the first iteration, start(), "
                "allow_frames() or wait_for_frames()); pass seed= to the constructor, or call it earlier"
            )
        self.seed = int(seed)
        return self.seed + self.num_workers * self.num_envs

    def state_dict(self) -> OrderedDict:
        """Counters in TorchRL's collector shape (``"worker<i>"``, ``"frames"``, ``"iter"``), for checkpoints.

        Per worker: frames collected, the policy version it acts with and, as in
        TorchRL's collectors, ``"policy_state_dict"`` under the names of the policy
        given to the constructor (none for a policy without weights): a CPU
        policy's own weights, which TorchRL's workers share, and for a policy on
        a GPU the weights published last. The workers act with the version
        published last (``"policy_version"``). Env states stay in the workers; a
        resumed run starts new episodes.
        ``"traj_pool"`` is TorchRL's ``{"traj_id": ...}``: here the first trajectory id
        no worker of this run hands out, so that a run resumed from it numbers its
        trajectories after those already in a saved buffer.

        Examples:
            >>> from torchrl_unilab import OffPolicyCollector
            >>> with OffPolicyCollector("Pendulum-v1", num_envs=2, frames_per_batch=32, total_frames=64) as c:
            ...     for _ in c:
            ...         pass
            ...     state = c.state_dict()
            >>> state["frames"], sorted(key for key in state if key.startswith("worker"))
            (64, ['worker0'])
        """
        control = self._worker_frames.control
        workers = [(control.worker_written(idx), worker["policy_version"])
                   for idx, worker in enumerate(self._metrics.summary()["workers"])]
        return self._counters.state_dict(
            workers=workers, weights=self._weights.saved_weights(), frames_written=self.frames_written,
            policy_version=self.policy_version, restarts=max(self._pool.restarts) if self._pool is not None else 0)

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True) -> None:
        """Restores the consumer-side counters saved by :meth:`state_dict`, to continue a run.

        As with TorchRL's collectors, iteration goes on from the restored
        ``frames`` to ``total_frames``, and the restored frames count against
        ``init_random_frames`` (loaded before collection starts; once workers
        run, the random frames they were given stay). The workers start new
        episodes. A ``"policy_state_dict"`` (of the first worker that has one)
        is loaded into the collector's policy and published: every worker acts
        with it from its next step; ``strict`` as in ``nn.Module.load_state_dict``
        (TorchRL's ``RayCollector`` passes ``strict=False``).
        """
        weights = saved_policy_weights(state_dict)
        if weights is not None:
            self._weights.restore(weights, strict=strict)
        self._counters.load_state_dict(state_dict, started=self._started)
        if not self._started:
            self._worker_frames.reset(self._frame_control())

    # --------------------------------------------- answered in this process
    # TorchRL's multi-process collectors forward these calls to their workers over a command pipe. Ours run a
    # batched loop with no command channel, so each answer comes from what this process holds or shares with the
    # workers: the env's specs probed at construction, the replay buffer, the policy as published, the hooks
    # handed to the workers when they start.
    def metrics(self) -> dict[str, Any]:
        """Collection figures, readable at any time from the main process.

        Returns a dict with ``frames`` (collected), ``fps``, ``random_frames``,
        ``nonfinite_dropped``, ``episodes``, ``terminated``, ``truncated``,
        ``mean_return`` and ``mean_length`` over the recent-episode windows,
        ``time`` (seconds per worker phase), ``policy_version`` (the oldest any
        worker acts with), ``published_version``, ``buffer_size`` (``None``
        without a replay buffer), ``engine`` (what steps the envs: ``"envpool"``,
        ``"gymnasium"``, ``"torchrl"`` for an env stack run as given, or ``"mixed"``)
        and ``workers`` (the same figures per worker, with each one's ``engine``).
        With ``max_worker_restarts``: ``worker_restarts`` (in all), ``frames_lost``
        (claimed by workers that died before writing them; not in ``frames``), and per
        worker ``restarts`` and ``last_error`` (the last failure's message and traceback,
        ``None`` if none).
        Raises :class:`~torchrl_unilab.WorkerError` if a worker failed for good.
        """
        self._raise_if_failed()
        out = self._metrics.summary()
        out["frames"] = self.frames_written
        out["buffer_size"] = len(self.replay_buffer) if self.replay_buffer is not None else None
        out["published_version"] = self.policy_version
        out["engine"] = self._engines[0] if len(set(self._engines)) == 1 else "mixed"
        pool, control = self._pool, self._worker_frames.control
        out["worker_restarts"] = sum(pool.restarts) if pool is not None else 0
        out["frames_lost"] = self.frames_lost
        for idx, (worker, engine) in enumerate(zip(out["workers"], self._engines)):
            # From the frame accounting, exact across restarts: a batch of a worker killed after its rows were in
            # and before it added them to its metrics row is counted by the parent (FrameControl.settle) only.
            worker["frames"] = control.worker_written(idx)
            worker["random_frames"] = control.random_written(idx)
            worker["engine"] = engine
            worker["restarts"] = pool.restarts[idx] if pool is not None else 0
            last = pool.last_failure(idx) if pool is not None else None
            worker["last_error"] = None if last is None else f"{last}"
        out["random_frames"] = sum(worker["random_frames"] for worker in out["workers"])
        return out

    def stats(self, workers: str = "aggregate") -> dict[str, int | float | bool]:
        """TorchRL's progress snapshot, from :meth:`metrics`.

        Args:
            workers: ``"aggregate"`` (default), ``"per_worker"`` (entries named
                ``"worker_<idx>/<metric>"``) or ``"both"``.
        """
        if workers not in ("aggregate", "per_worker", "both"):
            raise ValueError(f"workers must be one of 'aggregate', 'per_worker' or 'both', got {workers!r}")
        metrics = self.metrics()
        out: dict[str, int | float | bool] = {}
        if workers in ("aggregate", "both"):
            out.update(BaseCollector.stats(self))  # frames and batches through CounterFields
            out.update(frames_written=metrics["frames"], fps=metrics["fps"], episodes=metrics["episodes"],
                       random_frames=metrics["random_frames"])
        out["workers"] = self.num_workers
        out["workers_alive"] = self._pool.alive() if self._pool is not None else 0
        if workers in ("per_worker", "both"):
            for idx, worker in enumerate(metrics["workers"]):
                for key, value in worker.items():
                    if isinstance(value, (int, float, bool)):
                        out[f"worker_{idx}/{key}"] = value
        return out

    def get_model(self, model_id: str) -> nn.Module:
        """The model synced under ``model_id``; only ``"policy"`` exists."""
        if model_id != "policy":
            raise KeyError(f"model_id must be 'policy', got {model_id!r}")
        return self.policy

    def reset(self, reset_idx: Sequence[bool] | None = None) -> None:
        """Not supported: workers reset their envs as episodes end; bound episodes with ``max_frames_per_traj``."""
        raise NotImplementedError(
            "OffPolicyCollector workers reset their envs themselves as episodes end; bound episode length "
            "with max_frames_per_traj"
        )

    def getattr_policy(self, attr: str) -> Any:
        """An attribute of the policy the workers run (this process holds the same module)."""
        return getattr(self.policy, attr)

    def getattr_env(self, attr: str) -> Any:
        """An attribute of the env: specs and batch size always, anything while an env lives in this process.

        The specs are a snapshot of the env probed at construction; other
        attributes live in the worker processes (an env instance stepped by a
        thread of this process answers them all).

        Examples:
            >>> from torchrl_unilab import OffPolicyCollector
            >>> with OffPolicyCollector("Pendulum-v1", num_envs=4, frames_per_batch=64) as collector:
            ...     collector.getattr_env("batch_size"), collector.get_model("policy") is collector.policy
            (torch.Size([4]), True)
        """
        return self._env_view.get(attr)

    def _live_env(self) -> EnvBase | None:
        if self._probe_given is not None:
            return self._probe_given
        return self._worker_envs[0] if isinstance(self._worker_envs[0], EnvBase) else None

    @property
    def env(self) -> Any:
        """The env, as TorchRL's single-process ``Collector`` exposes it (its trainers read ``collector.env``).

        The envs run in the workers, so this is a view whose attributes are
        :meth:`getattr_env`'s: the specs and batch size always (TorchRL's TD3
        trainer reads ``collector.env.action_spec`` to bound its loss), anything
        else while an env lives in this process.

        Examples:
            >>> from torchrl_unilab import OffPolicyCollector
            >>> with OffPolicyCollector("Pendulum-v1", num_envs=4, frames_per_batch=64) as collector:
            ...     collector.env.action_spec_unbatched.shape
            torch.Size([1])
        """
        return self._env_view

    def getattr_rb(self, attr: str) -> Any:
        """An attribute of the replay buffer."""
        if self.replay_buffer is None:
            raise RuntimeError("this collector has no replay_buffer")
        return getattr(self.replay_buffer, attr)

    def fake_tensordict(self) -> TensorDictBase:
        """One batch of zeroed rows with every key a worker writes (for laying out a storage)."""
        return self._row.select(*self._row_keys).expand(self.num_envs).clone().zero_()

    def map_fn(self, method_name: str, list_of_args: list[tuple] | None = None,
               list_of_kwargs: list[dict] | None = None) -> list[Any]:
        """Calls the method at the dotted path ``method_name`` for each worker, one entry of arguments each.

        As with TorchRL's collectors, e.g. ``map_fn("replay_buffer.__len__")``. It is answered in
        this process from what each worker shares with it (its ``worker_idx``, the
        ``replay_buffer``, the ``policy`` as published):
        our workers run a batched loop with no command channel.

        Examples:
            >>> from torchrl.envs.utils import RandomPolicy
            >>> from torchrl.testing.mocking_classes import ContinuousActionVecMockEnv
            >>> from torchrl_unilab import OffPolicyCollector
            >>> collector = OffPolicyCollector([ContinuousActionVecMockEnv] * 2,
            ...                                RandomPolicy(ContinuousActionVecMockEnv().action_spec),
            ...                                frames_per_batch=16, total_frames=32)
            >>> collector.map_fn("get_distant_attr", list_of_args=[("worker_idx",), ("worker_idx",)])
            [0, 1]
            >>> collector.shutdown()
        """
        list_of_args, list_of_kwargs = normalize_worker_calls(self, list_of_args, list_of_kwargs)
        return [view.get_distant_attr(method_name)(*args, **kwargs)
                for view, args, kwargs in zip(self._worker_views(), list_of_args, list_of_kwargs)]

    def get_distant_attr(self, attr: str) -> list[Any]:
        """The attribute at the dotted path ``attr`` for each worker, e.g. ``"replay_buffer.write_count"``
        (see :meth:`map_fn`)."""
        return [view.get_distant_attr(attr) for view in self._worker_views()]

    def _worker_views(self) -> list[WorkerView]:
        self._raise_if_failed()
        return [WorkerView(idx, self.replay_buffer, self._weights.given) for idx in range(self.num_workers)]

    def enable_profile(self, **kwargs: Any) -> None:
        """Not supported: use the worker trace and per-phase timings instead."""
        raise NotImplementedError(
            "OffPolicyCollector workers are profiled with their phase timers: metrics()['time'] gives seconds per "
            "phase, and torchrl_unilab.worker.off_policy_collector_fn(trace_enabled=True) writes a Perfetto trace"
        )

    def disable_profile(self) -> None:
        """Not supported: see :meth:`enable_profile`."""
        self.enable_profile()

    def _set_pre_collect_hook(self, hook: Callable[[], None] | None) -> None:
        self._check_not_started("pre_collect_hook")
        BaseCollector.pre_collect_hook.fset(self, hook)

    def _set_post_collect_hook(self, hook: Callable[[TensorDictBase], None] | None) -> None:
        self._check_not_started("post_collect_hook")
        BaseCollector.post_collect_hook.fset(self, hook)

    # TorchRL's properties; each worker calls the hook before a batch (pre) or with each batch once written (post),
    # so a hook is set before collection starts.
    pre_collect_hook = BaseCollector.pre_collect_hook.setter(_set_pre_collect_hook)
    post_collect_hook = BaseCollector.post_collect_hook.setter(_set_post_collect_hook)

    def _check_not_started(self, what: str) -> None:
        if getattr(self, "_started", False):
            raise RuntimeError(f"{what} must be set before collection starts: workers take it when they start")

    # ---------------------------------------------------------------- closing
    def shutdown(self, timeout: float | None = None, close_env: bool = True, raise_on_error: bool = True) -> None:
        """Stops every worker within ``timeout`` seconds (default 4) and frees shared resources.

        Rows already written stay in the replay buffer. A worker error not yet
        raised is raised here when ``raise_on_error`` is true.
        """
        if getattr(self, "_shut_down", True):
            return
        self._shut_down = True
        self.closed = True
        if self._handover is not None:
            self._handover.stop()  # first: it writes no batch once the workers are gone
        if self._pool is not None:
            self._pool.stop(timeout=4.0 if timeout is None else timeout)
        if self._weights is not None:
            self._weights.shutdown()
        self._close_probe()
        if close_env:
            for env in self._given_envs:
                if isinstance(env, EnvBase):
                    with contextlib.suppress(Exception):
                        env.close(raise_if_closed=False)
        if raise_on_error:
            self._raise_if_failed()

    def async_shutdown(self, timeout: float | None = None, close_env: bool = True) -> None:
        """Same as :meth:`shutdown` (it returns once the workers are gone)."""
        self.shutdown(timeout=timeout, close_env=close_env)

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
        # Also for a collector whose constructor raised half-way: Ray's repr() of such an actor, while it
        # stores the error, raised AttributeError and the learner got "actor died unexpectedly" instead.
        fields = {name: getattr(self, name, "?") for name in ("num_workers", "num_envs", "frames_per_batch",
                                                              "total_frames")}
        frames = getattr(self, "_worker_frames", None)
        written = frames.control.written if frames is not None and not self.closed else "closed"
        return f"{type(self).__name__}({', '.join(f'{k}={v}' for k, v in fields.items())}, frames_written={written})"


def _no_op() -> None:
    pass
