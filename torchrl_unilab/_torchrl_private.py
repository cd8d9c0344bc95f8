"""Every private name of TorchRL and tensordict that torchrl_unilab uses, in one place.

TorchRL keeps these names private, so a release may rename or remove them
without notice. Each function or entry here says why it is used and what
breaks if it changes; no other module of the package touches a private name
of TorchRL or tensordict (``tests/test_package_structure.py`` holds both: every
name in :data:`TORCHRL_PRIVATE` still exists in the installed TorchRL, and no
other module uses one). Private names of other libraries (torch, multiprocessing,
gymnasium, EnvPool) stay where they are used, each with its reason beside it.

:class:`~torchrl_unilab.OffPolicyCollector` subclasses TorchRL's
``MultiAsyncCollector`` without calling its ``__init__``, which would start
TorchRL's own worker processes; :data:`PARENT_FIELDS` lists the parent's fields
it sets in its place, and what of TorchRL's reads each.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase
from torchrl.collectors import MultiAsyncCollector, _constants as torchrl_constants
from torchrl.collectors.utils import _traj_ingest, _validate_traj_format
from torchrl.envs import Transform
from torchrl.envs.utils import _make_compatible_policy
from torchrl.weight_update.utils import _resolve_attr

__all__ = [
    "CounterFields",
    "PARENT_FIELDS",
    "TORCHRL_PRIVATE",
    "RayCollectorHooks",
    "SUBCLASS_HOOKS",
    "StepAndMaybeResetHook",
    "WritesEveryDoneKey",
    "attached_entities",
    "buffer_locks",
    "buffer_writer",
    "collector_devices",
    "env_step",
    "has_own_inverse",
    "has_post_step_mdp_hooks",
    "has_receiver_schemes",
    "idle_limit",
    "ingest_trajectories",
    "init_collector_fields",
    "initialize_ray_weight_sync",
    "lay_out_storage",
    "make_compatible_policy",
    "make_node_actor",
    "mark_written",
    "normalize_worker_calls",
    "post_step_mdp_hooks",
    "read_compile_kwargs",
    "replace_node_actor",
    "request_stop",
    "resolve_attr",
    "sac_alpha",
    "sac_version",
    "sampler_capacity",
    "send_weights_scheme",
    "set_buffer_batch_size",
    "set_buffer_transform",
    "set_last_cursor",
    "set_node_frames_per_batch",
    "set_online_buffer",
    "set_ray_rendezvous_timeout",
    "set_storage_length",
    "set_weight_sync_schemes",
    "set_weight_updater",
    "set_write_lock",
    "share_storage_counters",
    "share_writer_counters",
    "shared_mem_buffers",
    "soft_update_tensors",
    "step_mdp",
    "stop_requested",
    "storage_tensors",
    "transform_step",
    "unchecked_tensordict",
    "validate_traj_format",
    "writer_cursor",
    "writer_storage",
]

#: Each private name used, by its dotted path in TorchRL: why it is used, and what breaks if it changes.
TORCHRL_PRIVATE: dict[str, str] = {
    "torchrl.collectors.MultiAsyncCollector._get_devices":
        "the per-worker device tuples as TorchRL reads device/storing_device/env_device/policy_device; "
        "renamed: OffPolicyCollector's constructor raises AttributeError",
    "torchrl.collectors.MultiAsyncCollector._read_compile_kwargs":
        "compile_policy / cudagraph_policy read as TorchRL reads them (compiled_policy, ..._kwargs); "
        "renamed: the constructor raises AttributeError",
    "torchrl.collectors.MultiAsyncCollector._normalize_worker_calls":
        "map_fn's per-worker argument lists checked as TorchRL checks them; renamed: map_fn raises AttributeError",
    "torchrl.collectors.MultiAsyncCollector._weight_updater":
        "the weight_updater property's field, set without the setter (as_weight_updater registers it); "
        "renamed: weight_updater reads as unset",
    "torchrl.collectors.MultiAsyncCollector._weight_sync_schemes":
        "the schemes TorchRL's weight-update path reads (_extract_weights_if_needed); renamed: TorchRL's "
        "receiving path no longer finds our scheme",
    "torchrl.collectors.MultiAsyncCollector._profile_config":
        "the profile_config property's field; renamed: collector.profile_config raises AttributeError",
    "torchrl.collectors.MultiAsyncCollector._frames":
        "the frames BaseCollector.stats() reports; renamed: stats() loses its 'frames' and 'completed' entries",
    "torchrl.collectors.MultiAsyncCollector._iter":
        "the batches BaseCollector.stats() reports; renamed: stats() loses its 'batches' entry",
    "torchrl.collectors.MultiAsyncCollector._iterator":
        "the iterator next() keeps between calls; renamed: a stale one would be left on a reused collector",
    "torchrl.collectors.MultiAsyncCollector._receiver_schemes":
        "set by register_scheme_receiver; read to tell whether weights arrive from a parent collector; "
        "renamed: receive_weights() raises NotImplementedError even with schemes registered",
    "torchrl.collectors._constants._MAX_IDLE_COUNT":
        "the iterator's idle limit, as TorchRL's collectors compute it; renamed: importing this module fails",
    "torchrl.collectors._constants._TIMEOUT":
        "TorchRL's poll interval, the other factor of the idle limit; renamed: importing this module fails",
    "torchrl.collectors.utils._validate_traj_format":
        "traj_format checked and defaulted as TorchRL's collectors do; renamed: importing this module fails",
    "torchrl.collectors.utils._traj_ingest":
        "whole trajectories assembled from batches as TorchRL's collectors assemble them (trajs_per_write); "
        "renamed: importing this module fails",
    "torchrl.envs.utils._make_compatible_policy":
        "a plain nn.Module policy wrapped as TorchRL's collectors wrap it; renamed: importing this module fails",
    "torchrl.weight_update.utils._resolve_attr":
        "dotted paths resolved as TorchRL's map_fn / get_distant_attr resolve them; renamed: importing fails",
    "torchrl.collectors.distributed.RayCollector._async_iterator":
        "RayCollector.iterator's first-ready-first-served loop, replaced to report lost nodes as NodeError; "
        "renamed: RayOffPolicyCollector iterates with TorchRL's loop, and a lost node hangs or raises Ray's error",
    "torchrl.collectors.distributed.RayCollector._send_weights_scheme":
        "the per-scheme send that update_policy_weights_ calls, extended to replacement nodes; renamed: "
        "replacement nodes stop receiving weights",
    "torchrl.collectors.distributed.RayCollector._make_collector":
        "builds one node actor as RayCollector does, for a replacement node; renamed: node restarts fail",
    "torchrl.collectors.distributed.RayCollector._remote_collectors":
        "RayCollector's list of node actors, where a replacement takes the lost node's place; renamed: "
        "RayCollector's shutdown misses the replacement actors",
    "torchrl.collectors.distributed.RayCollector._stop_event":
        "RayCollector's stop flag, which its shutdown sets; renamed: collection does not stop on shutdown",
    "torchrl.collectors.distributed.RayCollector._frames_per_batch_corrected":
        "the frames each node batch holds, which RayCollector counts; renamed: node frame counts go wrong",
    "torchrl.collectors.distributed.RayCollector._lazy_initialize_weight_sync":
        "sets TorchRL's Ray weight-sync group up before the first publish; renamed: the constructor raises",
    "torchrl.weight_update._ray._DIST_TIMEOUT":
        "the Ray weight-sync rendezvous timeout, raised for nodes slow to start; renamed: the rendezvous "
        "keeps TorchRL's 60 s",
    # replay buffers
    "torchrl.data.ReplayBuffer._writer":
        "the writer as it stands (the public property sets the buffer up first); renamed: make_replay_buffer's "
        "layout checks see no writer, and holds_row always answers False",
    "torchrl.data.ReplayBuffer._write_lock":
        "the lock extend() and sample() take, replaced by CommitWriter's lock that the kernel releases when its "
        "holder dies; renamed: a SIGKILLed writer can leave TorchRL's lock held and the buffer blocked",
    "torchrl.data.ReplayBuffer._replay_lock":
        "the other lock sample() takes, held with the write lock by buffer_lock; renamed: buffer_lock raises "
        "AttributeError",
    "torchrl.data.ReplayBuffer._batch_size":
        "the default sample() batch size restored from a checkpoint; renamed: a resumed buffer samples with the "
        "batch size it was built with",
    "torchrl.data.ReplayBuffer._transform":
        "the transform a worker's view of the buffer applies (the public attribute is read-only); renamed: "
        "workers apply the PolicyAgeFilter meant for sampling only",
    "torchrl.data.OfflineToOnlineReplayBuffer._online_buffer":
        "the online part, replaced by a process-shared buffer (TorchRL gives no setter); renamed: the collector's "
        "workers write a buffer the learner never samples",
    "torchrl.data.TensorStorage._storage":
        "the TensorDict behind the storage, read for its keys and layout, shared and sliced; renamed: laying out, "
        "checking and checkpointing a buffer raise AttributeError",
    "torchrl.data.TensorStorage._init":
        "allocates the storage for a row without writing it; renamed: laying a buffer out ahead of the "
        "collector raises AttributeError",
    "torchrl.data.TensorStorage._len":
        "the storage's length, set by CommitWriter after a commit and by a checkpoint's restore; renamed: "
        "written rows stay invisible to sample()",
    "torchrl.data.TensorStorage._set_last_cursor":
        "the last written index, which write_count reads; renamed: CommitWriter raises AttributeError",
    "torchrl.data.TensorStorage._len_value":
        "the storage's shared length, replaced by a lock-free word in CommitWriter's file; renamed: TorchRL's "
        "mp.Value is used again and its lock can stay held by a killed writer",
    "torchrl.data.TensorStorage._mutation_revision_value":
        "the storage's shared revision, replaced as _len_value; renamed: as _len_value",
    "torchrl.data.TensorStorage._last_cursor_index_value":
        "the storage's shared last index, replaced as _len_value; renamed: as _len_value",
    "torchrl.data.TensorStorage._attached_entities_iter":
        "the buffers attached to a storage, where SharedPrioritizedSampler reads the write count; renamed: "
        "sample() raises AttributeError",
    "torchrl.data.RoundRobinWriter._cursor":
        "where the next row goes (the newest rows end there); renamed: CommitWriter and "
        "RunningNormalizer.update_from_buffer raise AttributeError",
    "torchrl.data.RoundRobinWriter._cursor_value":
        "the writer's shared cursor, replaced by a lock-free word in CommitWriter's file; renamed: TorchRL's "
        "mp.Value is used again, unseen by the other processes' CommitWriter",
    "torchrl.data.RoundRobinWriter._write_count_value":
        "the writer's shared write count, replaced as _cursor_value; renamed: as _cursor_value",
    "torchrl.data.RoundRobinWriter._storage":
        "the storage the writer writes into; renamed: CommitWriter raises AttributeError",
    "torchrl.data.RoundRobinWriter._bump_generation":
        "the per-row generations TorchRL's writers keep after a write; renamed: CommitWriter raises AttributeError",
    "torchrl.data.RoundRobinWriter._mark_update_entities":
        "tells a sampler of written rows after a write; renamed: CommitWriter raises AttributeError",
    "torchrl.data.PrioritizedSampler._max_capacity":
        "the rows the priority trees hold; renamed: SharedPrioritizedSampler raises AttributeError",
    # envs
    "tensordict.TensorDict._new_unsafe":
        "a TensorDict built without per-entry checks on the batched envs' hot path; renamed: the envs raise "
        "AttributeError",
    "torchrl.envs.EnvBase._complete_done":
        "skipped for envs that write every done key (WritesEveryDoneKey); renamed: TorchRL's completion runs "
        "again, correct but slower",
    "torchrl.envs.EnvBase._step_and_maybe_reset":
        "what step_and_maybe_reset calls, given a shorter path over EnvPool (StepAndMaybeResetHook); renamed: the "
        "short path is never taken, correct but slower",
    "torchrl.envs.EnvBase._step":
        "the base env's own step, called by the short path; renamed: the short path raises AttributeError",
    "torchrl.envs.EnvBase._step_mdp":
        "the env's cached step_mdp, called by the short path; renamed: the short path raises AttributeError",
    "torchrl.envs.TransformedEnv._post_step_mdp_hooks":
        "the transforms' post-step hooks, run by the short path; renamed: the short path raises AttributeError",
    "torchrl.envs.Transform._step":
        "a transform's step, applied by the short path; renamed: the short path raises AttributeError",
    "torchrl.envs.Transform._post_step_mdp_hooks":
        "tells whether a transform has a post-step hook; renamed: building the short path raises AttributeError",
    "torchrl.envs.Transform._inv_call":
        "tells whether a transform has an inverse; renamed: building the short path raises AttributeError",
    # objectives
    "torchrl.objectives.SACLoss._alpha":
        "the entropy coefficient as SACLoss computes it, for the tensor-level loss; renamed: it raises "
        "AttributeError",
    "torchrl.objectives.SACLoss._version":
        "SACLoss's formulation (1 with a value network); renamed: every SACLoss is taken as version 2 and a "
        "version-1 loss would get the tensor-level loss it does not match",
    "torchrl.objectives.SoftUpdate._sources":
        "the loss's parameters a target updater follows; renamed: ForeachSoftUpdate raises AttributeError",
    "torchrl.objectives.SoftUpdate._targets":
        "the target copies a target updater moves; renamed: ForeachSoftUpdate raises AttributeError",
    # weight sync
    "torchrl.weight_update.SharedMemWeightSyncScheme._shared_transport":
        "the transport holding the buffers the scheme was initialised with, mirrored on each publish; renamed: "
        "those buffers stop receiving weights",
    "torchrl.weight_update._shared.SharedMemTransport._unique_weights":
        "the buffers themselves; renamed: as _shared_transport",
}

#: TorchRL's methods a subclass defines by TorchRL's design (abstract in the base class, or the step its public method
#: calls for a subclass to fill in): defining them is subclassing TorchRL, not a use of its private names.
SUBCLASS_HOOKS: dict[str, tuple[str, ...]] = {
    "torchrl.envs.EnvBase": ("_step", "_reset", "_set_seed"),
    "torchrl.envs.Transform": ("_call", "_reset", "_step", "_apply_transform", "_inv_apply_transform", "_inv_call"),
    "torchrl.data.replay_buffers.Sampler": ("_empty",),
    "torchrl.weight_update.WeightSyncScheme": ("_init_on_sender_impl", "_init_on_receiver_impl"),
}

#: ``MultiAsyncCollector``'s fields that ``OffPolicyCollector`` sets itself in place of the parent's ``__init__``,
#: and what of TorchRL's reads each.
PARENT_FIELDS: dict[str, str] = {
    "closed": "BaseCollector's flag of a shut-down collector",
    "procs": "MultiCollector's worker processes",
    "num_workers": "stats(), map_fn and _get_devices",
    "requested_frames_per_batch": "frames_per_batch_worker and __len__",
    "total_frames": "BaseCollector.__len__",
    "storing_device": "TorchRL's device tuple (_get_devices)",
    "policy_device": "TorchRL's device tuple (_get_devices)",
    "env_device": "TorchRL's device tuple (_get_devices)",
    "worker_idx": "register_scheme_receiver (a property over _worker_idx)",
    "policy": "get_model, getattr_policy and TorchRL's weight extraction",
    "policy_factory": "TorchRL's weight-sync set-up",
    "replay_buffer": "BaseCollector.__iter__ (no batch assembly with a buffer)",
    "extend_buffer": "TorchRL's option, kept as given",
    "postproc": "TorchRL's option, kept as given",
    "split_trajs": "TorchRL's option, kept as given",
    "reset_at_each_iter": "_discards_in_flight_trajectories",
    "reset_when_done": "TorchRL's option, kept as given",
    "trajs_per_batch": "BaseCollector.__iter__ (trajectory assembly)",
    "trajs_per_write": "TorchRL's option, kept as given",
    "traj_format": "TorchRL's option, kept as given",
    "init_random_frames": "TorchRL's option, kept as given",
    "max_frames_per_traj": "TorchRL's option, kept as given",
    "update_at_each_batch": "TorchRL's option, kept as given",
    "exploration_type": "TorchRL's option, kept as given",
    "set_truncated": "TorchRL's option, kept as given",
    "num_sub_threads": "TorchRL's option, kept as given",
    "compiled_policy": "set by _read_compile_kwargs",
    "cudagraphed_policy": "set by _read_compile_kwargs",
    "_weight_updater": "the weight_updater property",
    "_weight_sync_schemes": "_extract_weights_if_needed",
    "_profile_config": "the profile_config property",
    "_iterator": "next()",
    "_frames": "TorchRL's own tests (a CounterFields view of frames_iterated)",
    "_iter": "TorchRL's own tests (a CounterFields view of batches_iterated)",
}


# ------------------------------------------------------------ MultiAsyncCollector
def init_collector_fields(collector: MultiAsyncCollector) -> None:
    """Sets the parent's private fields that ``MultiAsyncCollector.__init__`` would set (:data:`PARENT_FIELDS`):
    no weight updater, no profiling, no iterator for ``next()`` yet."""
    collector._weight_updater = None
    collector._profile_config = None
    collector._iterator = None


def set_weight_sync_schemes(collector: MultiAsyncCollector, schemes: Mapping[str, Any]) -> None:
    """The schemes TorchRL's weight-update path reads from the collector."""
    collector._weight_sync_schemes = dict(schemes)


def set_weight_updater(collector: MultiAsyncCollector, updater: Any) -> None:
    """The ``weight_updater`` property's value, set without its setter (the updater is registered already)."""
    collector._weight_updater = updater


def collector_devices(collector: MultiAsyncCollector, **devices: Any) -> tuple[Any, Any, Any]:
    """TorchRL's ``(storing_device, policy_device, env_device)`` per-worker tuples from the four device arguments."""
    return MultiAsyncCollector._get_devices(collector, **devices)


def read_compile_kwargs(collector: MultiAsyncCollector, compile_policy: Any, cudagraph_policy: Any) -> None:
    """Sets ``compiled_policy``, ``cudagraphed_policy`` and their ``_kwargs`` as TorchRL reads the arguments."""
    MultiAsyncCollector._read_compile_kwargs(collector, compile_policy, cudagraph_policy)


def normalize_worker_calls(collector: MultiAsyncCollector, list_of_args: list[tuple] | None,
                           list_of_kwargs: list[dict] | None) -> tuple[list[tuple], list[dict]]:
    """``map_fn``'s arguments, one entry per worker, checked as TorchRL checks them."""
    return MultiAsyncCollector._normalize_worker_calls(collector, list_of_args, list_of_kwargs)


def has_receiver_schemes(collector: MultiAsyncCollector) -> bool:
    """Whether ``register_scheme_receiver`` registered a scheme that brings weights from a parent collector."""
    return bool(getattr(collector, "_receiver_schemes", None))


class CounterFields:
    """``MultiAsyncCollector``'s ``_frames`` and ``_iter``, read-only, from the public counts of the collector that
    mixes this in: ``frames_iterated`` and ``batches_iterated``.

    TorchRL's class sets both in its ``__init__`` and counts with them; its own tests read them
    (``test_collector_reloading`` compares them across ``state_dict``/``load_state_dict``), and
    ``BaseCollector.stats()`` reports them as ``frames`` and ``batches``. The collector keeps its counts in its own
    object, so these are views of it, never written.
    """

    @property
    def _frames(self) -> int:
        return self.frames_iterated

    @property
    def _iter(self) -> int:
        return self.batches_iterated - 1


def idle_limit() -> float | None:
    """Seconds an iterator waits for a batch before it raises, as TorchRL's collectors do: ``MAX_IDLE_COUNT``
    (read by TorchRL when it is imported) times TorchRL's poll interval; ``None`` (no limit) by default.

    Examples:
        >>> idle_limit() is None or idle_limit() > 0
        True
    """
    limit = torchrl_constants._MAX_IDLE_COUNT * torchrl_constants._TIMEOUT
    return None if limit >= torch.iinfo(torch.int64).max else limit


def validate_traj_format(traj_format: str | None, trajs_per_batch: int | None, *, has_replay_buffer: bool) -> Any:
    """``traj_format`` checked and defaulted as TorchRL's collectors do."""
    return _validate_traj_format(traj_format, trajs_per_batch, has_replay_buffer=has_replay_buffer)


def ingest_trajectories(batch: TensorDictBase, partial: Any, complete: Any) -> None:
    """Adds a batch's steps to the trajectories under assembly, as TorchRL's collectors do."""
    _traj_ingest(batch, partial, complete)


def make_compatible_policy(policy: Any, observation_spec: Any, env: Any) -> Any:
    """A policy wrapped as TorchRL's collectors wrap one (a plain module becomes a ``TensorDictModule``)."""
    return _make_compatible_policy(policy, observation_spec, env=env)


def resolve_attr(obj: Any, attr: str) -> Any:
    """The attribute at the dotted path ``attr`` of ``obj``, resolved as TorchRL's ``map_fn`` resolves it."""
    return _resolve_attr(obj, attr)


# ------------------------------------------------------------------ RayCollector
class RayCollectorHooks:
    """``RayCollector``'s private hooks, routed to public methods of the subclass that mixes this in first.

    ``RayCollector.iterator`` calls ``_async_iterator``, and ``update_policy_weights_`` calls
    ``_send_weights_scheme``; the subclass defines ``node_batches()`` and ``send_weights_to_nodes(...)``.
    """

    def _async_iterator(self) -> Iterator[TensorDictBase | None]:
        return self.node_batches()

    def _send_weights_scheme(self, *, model_id: str, scheme: Any, processed_weights: Any, worker_ids: Any) -> None:
        self.send_weights_to_nodes(model_id=model_id, scheme=scheme, processed_weights=processed_weights,
                                   worker_ids=worker_ids)


def send_weights_scheme(collector: Any, *, model_id: str, scheme: Any, processed_weights: Any,
                        worker_ids: Any) -> None:
    """``RayCollector``'s own send of one scheme's weights to the nodes in ``worker_ids``."""
    from torchrl.collectors.distributed import RayCollector

    RayCollector._send_weights_scheme(collector, model_id=model_id, scheme=scheme,
                                      processed_weights=processed_weights, worker_ids=worker_ids)


def make_node_actor(collector: Any, remote: Callable, *, env_maker: Any, policy: Any,
                    other_params: Mapping[str, Any]) -> Any:
    """A node actor built as ``RayCollector`` builds one."""
    return collector._make_collector(remote, env_maker=env_maker, policy=policy, other_params=other_params)


def replace_node_actor(collector: Any, idx: int, actor: Any) -> None:
    """Puts ``actor`` in node ``idx``'s place in ``RayCollector``'s list, which its shutdown stops."""
    collector._remote_collectors[idx] = actor


def stop_requested(collector: Any) -> bool:
    """Whether ``RayCollector``'s stop flag is set (its shutdown sets it)."""
    return collector._stop_event.is_set()


def request_stop(collector: Any) -> None:
    """Sets ``RayCollector``'s stop flag."""
    collector._stop_event.set()


def set_node_frames_per_batch(collector: Any, frames: int) -> None:
    """The frames of each node's batch, in ``frames_per_batch`` and in the copy ``RayCollector`` counts with."""
    collector.frames_per_batch = collector._frames_per_batch_corrected = frames


def initialize_ray_weight_sync(collector: Any) -> None:
    """Sets ``RayCollector``'s weight-sync group up now rather than at the first publish."""
    collector._lazy_initialize_weight_sync()


def set_ray_rendezvous_timeout(seconds: float) -> None:
    """How long TorchRL's ``RayWeightSyncScheme`` waits for its gloo rendezvous (TorchRL's own default: 60 s)."""
    import torchrl.weight_update._ray as torchrl_ray

    if getattr(torchrl_ray, "_DIST_TIMEOUT", None) is not None:
        torchrl_ray._DIST_TIMEOUT = datetime.timedelta(seconds=seconds)


# --------------------------------------------------------------- replay buffers
def buffer_writer(replay_buffer: Any) -> Any:
    """The buffer's writer as it stands, without the lazy set-up the public ``writer`` property runs; ``None``
    for an object with no writer.

    Examples:
        >>> from torchrl.data import LazyTensorStorage, ReplayBuffer
        >>> type(buffer_writer(ReplayBuffer(storage=LazyTensorStorage(4)))).__name__, buffer_writer(object())
        ('RoundRobinWriter', None)
    """
    return getattr(replay_buffer, "_writer", None)


def set_write_lock(replay_buffer: Any, lock: Any) -> None:
    """The lock the buffer's ``extend`` and ``sample`` take (TorchRL makes a ``multiprocessing.Lock``)."""
    replay_buffer._write_lock = lock


def buffer_locks(replay_buffer: Any) -> tuple[Any, Any]:
    """The buffer's ``(replay lock, write lock)``, as its ``sample`` and ``extend`` take them.

    Examples:
        >>> import threading
        >>> from torchrl.data import LazyTensorStorage, ReplayBuffer
        >>> rb = ReplayBuffer(storage=LazyTensorStorage(4))
        >>> lock = threading.RLock()
        >>> set_write_lock(rb, lock)
        >>> buffer_locks(rb)[1] is lock
        True
    """
    return replay_buffer._replay_lock, replay_buffer._write_lock


def set_buffer_batch_size(replay_buffer: Any, batch_size: int | None) -> None:
    """The batch size ``sample()`` draws when given none, set without the checks of the constructor.

    Examples:
        >>> import torch
        >>> from torchrl.data import LazyTensorStorage, ReplayBuffer
        >>> rb = ReplayBuffer(storage=LazyTensorStorage(4))
        >>> _ = rb.extend(torch.arange(4))
        >>> set_buffer_batch_size(rb, 3)
        >>> rb.sample().shape
        torch.Size([3])
    """
    replay_buffer._batch_size = batch_size


def set_buffer_transform(replay_buffer: Any, transform: Any) -> None:
    """The transform the buffer applies; TorchRL's ``transform`` attribute is read-only."""
    replay_buffer._transform = transform


def set_online_buffer(replay_buffer: Any, online: Any) -> None:
    """The online part of an ``OfflineToOnlineReplayBuffer``, which TorchRL gives no setter; its ``sample``,
    ``extend`` and ``online_buffer`` all read it."""
    replay_buffer._online_buffer = online


def storage_tensors(storage: Any) -> TensorDictBase:
    """The TensorDict behind a TorchRL tensor storage (memory-mapped for a ``LazyMemmapStorage``).

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import LazyTensorStorage
        >>> storage = LazyTensorStorage(4)
        >>> storage.set(torch.arange(2), TensorDict({"x": torch.ones(2)}, [2]))
        >>> storage_tensors(storage).shape
        torch.Size([4])
    """
    return storage._storage


def lay_out_storage(storage: Any, row: TensorDictBase) -> None:
    """Allocates the storage's tensors for rows shaped like ``row``, writing none.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import LazyTensorStorage
        >>> storage = LazyTensorStorage(4)
        >>> lay_out_storage(storage, TensorDict({"x": torch.zeros(3)}, []))
        >>> storage.initialized, len(storage), storage_tensors(storage)["x"].shape
        (True, 0, torch.Size([4, 3]))
    """
    storage._init(row)


def set_storage_length(storage: Any, length: int) -> None:
    """The storage's length (its rows that ``sample`` may draw), set without writing a row."""
    storage._len = length


def set_last_cursor(storage: Any, index: int) -> None:
    """The index of the row written last, which the storage keeps for ``ReplayBuffer``'s ``write_count``."""
    storage._set_last_cursor(index)


def share_storage_counters(storage: Any, *, length: Any, revision: Any, last_cursor: Any) -> None:
    """Puts the storage's length, mutation revision and last written index in the given values (each with a
    ``value`` attribute), in place of the ``multiprocessing.Value`` each TorchRL makes for a shared storage."""
    storage._len_value = length
    storage._mutation_revision_value = revision
    storage._last_cursor_index_value = last_cursor


def attached_entities(storage: Any) -> Iterator[Any]:
    """The objects (buffers, samplers, writers) TorchRL attached to the storage."""
    return storage._attached_entities_iter()


def share_writer_counters(writer: Any, *, cursor: Any, write_count: Any) -> None:
    """Puts a round-robin writer's cursor and write count in the given values (each with a ``value``
    attribute), in place of the ``multiprocessing.Value`` each TorchRL makes for a shared writer."""
    writer._cursor_value = cursor
    writer._write_count_value = write_count


def writer_cursor(writer: Any) -> int:
    """Where a round-robin writer writes its next row.

    Examples:
        >>> import torch
        >>> from torchrl.data import LazyTensorStorage, ReplayBuffer
        >>> rb = ReplayBuffer(storage=LazyTensorStorage(4))
        >>> _ = rb.extend(torch.arange(6))
        >>> writer_cursor(rb.writer)
        2
    """
    return writer._cursor


def writer_storage(writer: Any) -> Any:
    """The storage a writer writes into (``None`` before one is registered)."""
    return writer._storage


def mark_written(writer: Any, index: torch.Tensor, data: Any) -> None:
    """What a round-robin writer does after writing ``data`` at ``index``: bumps the rows' generations (when the
    buffer tracks them) and tells the storage's other entities (a sampler's priorities) of the update."""
    writer._bump_generation(index, data)
    writer._mark_update_entities(index)


def sampler_capacity(sampler: Any) -> int:
    """The rows a ``PrioritizedSampler``'s priority trees hold.

    Examples:
        >>> from torchrl.data import PrioritizedSampler
        >>> sampler_capacity(PrioritizedSampler(8, alpha=0.6, beta=0.4))
        8
    """
    return sampler._max_capacity


# ------------------------------------------------------------------------- envs
def unchecked_tensordict(source: dict[str, Any], *, batch_size: Any, device: Any = None) -> TensorDict:
    """A ``TensorDict`` built without checking its entries' shapes and devices (the caller guarantees them).

    Examples:
        >>> import torch
        >>> unchecked_tensordict({"x": torch.zeros(2, 3)}, batch_size=[2])["x"].shape
        torch.Size([2, 3])
    """
    return TensorDict._new_unsafe(source, batch_size=batch_size, device=device)


class WritesEveryDoneKey:
    """Mixin for an ``EnvBase`` whose ``_step`` and ``_reset`` write every done key with the spec's shape.

    TorchRL's ``EnvBase._complete_done`` fills in the done keys an env leaves out, and a ``TransformedEnv``
    calls it on every step; for such an env it would only look each key up again, so this skips it.
    """

    @classmethod
    def _complete_done(cls, done_spec: Any, data: TensorDictBase) -> TensorDictBase:
        return data


class StepAndMaybeResetHook:
    """Mixin for a ``TransformedEnv`` (listed before it) with its own path through ``step_and_maybe_reset``.

    ``EnvBase.step_and_maybe_reset`` calls ``_step_and_maybe_reset``; this routes it to the subclass's public
    ``short_step_and_maybe_reset(tensordict)``, and to TorchRL's own where that returns ``None``.
    """

    def _step_and_maybe_reset(self, tensordict: TensorDictBase) -> tuple[TensorDictBase, TensorDictBase]:
        out = self.short_step_and_maybe_reset(tensordict)
        return super()._step_and_maybe_reset(tensordict) if out is None else out


def env_step(env: Any, tensordict: TensorDictBase) -> TensorDictBase:
    """The env's own ``_step``: the ``"next"`` TensorDict, without ``step``'s checks and wrapping."""
    return env._step(tensordict)


def transform_step(transform: Any, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
    """The transform's ``_step``, as ``TransformedEnv._step`` applies it to the base env's ``"next"``."""
    return transform._step(tensordict, next_tensordict)


def step_mdp(env: Any, tensordict: TensorDictBase) -> TensorDictBase:
    """The next root TensorDict, as the env's ``step_and_maybe_reset`` makes it (the env's cached ``step_mdp``)."""
    return env._step_mdp(tensordict)


def post_step_mdp_hooks(env: Any, tensordict: TensorDictBase,
                        next_root: TensorDictBase) -> tuple[TensorDictBase, TensorDictBase]:
    """The transforms' hooks that ``step_and_maybe_reset`` runs after ``step_mdp``."""
    return env._post_step_mdp_hooks(tensordict, next_root)


def has_post_step_mdp_hooks(transform: Any) -> bool:
    """Whether the transform's class defines its own post-``step_mdp`` hook (``Transform``'s does nothing).

    Examples:
        >>> from torchrl.envs import StepCounter
        >>> has_post_step_mdp_hooks(StepCounter())
        False
    """
    return type(transform)._post_step_mdp_hooks is not Transform._post_step_mdp_hooks


def has_own_inverse(transform: Any) -> bool:
    """Whether the transform's class defines its own inverse call (``Transform``'s applies ``in_keys_inv``).

    Examples:
        >>> from torchrl.envs import DoubleToFloat, StepCounter
        >>> has_own_inverse(StepCounter()), has_own_inverse(DoubleToFloat())
        (False, True)
    """
    return type(transform)._inv_call is not Transform._inv_call


# ------------------------------------------------------------------- objectives
def sac_alpha(loss: Any) -> torch.Tensor:
    """``SACLoss``'s entropy coefficient: ``log_alpha`` clamped as the loss clamps it, ``exp()``, without grad."""
    return loss._alpha


def sac_version(loss: Any) -> int:
    """``SACLoss``'s formulation: 1 with a value network, 2 without (2 for a loss that records none).

    Examples:
        >>> from torchrl.objectives import SACLoss
        >>> from torchrl_unilab.modules.models import make_actor, make_critic
        >>> sac_version(SACLoss(make_actor("sac", 3, 1, hidden_dim=8), make_critic(3, 1, hidden_dim=8)))
        2
    """
    return getattr(loss, "_version", 2)


def soft_update_tensors(updater: Any) -> tuple[TensorDictBase, TensorDictBase]:
    """A target updater's ``(sources, targets)``: the loss's parameters and their target copies."""
    return updater._sources, updater._targets


# ------------------------------------------------------------------ weight sync
def shared_mem_buffers(scheme: Any) -> list[TensorDictBase]:
    """The buffers a ``SharedMemWeightSyncScheme`` was initialised with (none for another scheme)."""
    transport = getattr(scheme, "_shared_transport", None)
    buffers = getattr(transport, "_unique_weights", None)
    return list(buffers) if buffers else []
