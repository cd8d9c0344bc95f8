"""Every private name of TorchRL and tensordict that torchrl_unilab uses, in one place.

TorchRL keeps these names private, so a release may rename or remove them
without notice. Each function or entry here says why it is used and what
breaks if it changes; no other module of the package touches a private name
of TorchRL or tensordict (``tests/test_package_structure.py`` holds both: every
name in :data:`TORCHRL_PRIVATE` still exists in the installed TorchRL, and no
other module uses one).

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
from tensordict import TensorDictBase
from torchrl.collectors import BaseCollector, MultiAsyncCollector, _constants as torchrl_constants
from torchrl.collectors.utils import _traj_ingest, _validate_traj_format
from torchrl.envs.utils import _make_compatible_policy
from torchrl.weight_update.utils import _resolve_attr

__all__ = [
    "CounterFields",
    "PARENT_FIELDS",
    "TORCHRL_PRIVATE",
    "RayCollectorHooks",
    "SUBCLASS_HOOKS",
    "collector_devices",
    "collector_stats",
    "has_receiver_schemes",
    "idle_limit",
    "ingest_trajectories",
    "initialize_ray_weight_sync",
    "make_compatible_policy",
    "make_node_actor",
    "normalize_worker_calls",
    "read_compile_kwargs",
    "replace_node_actor",
    "request_stop",
    "resolve_attr",
    "send_weights_scheme",
    "init_collector_fields",
    "set_node_frames_per_batch",
    "set_ray_rendezvous_timeout",
    "set_weight_sync_schemes",
    "set_weight_updater",
    "stop_requested",
    "validate_traj_format",
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


class _CountedView:
    """The collector, with the frames and batches its own counters hold under the names BaseCollector reads."""

    def __init__(self, collector: Any, frames: int, iteration: int) -> None:
        self._frames, self._iter, self._collector = frames, iteration, collector

    def __getattr__(self, name: str) -> Any:
        return getattr(self._collector, name)


def collector_stats(collector: MultiAsyncCollector, *, frames: int, iteration: int) -> dict[str, Any]:
    """``BaseCollector.stats()``'s entries (``frames``, ``batches``, ``total_frames``, ...). TorchRL reads the
    frames and batches from its private ``_frames`` and ``_iter`` fields; the collector passes its own counts."""
    return BaseCollector.stats(_CountedView(collector, frames, iteration))


class CounterFields:
    """``MultiAsyncCollector``'s ``_frames`` and ``_iter``, read-only, from the public counts of the collector that
    mixes this in: ``frames_iterated`` and ``batches_iterated``.

    TorchRL's class sets both in its ``__init__`` and counts with them; its own tests read them
    (``test_collector_reloading`` compares them across ``state_dict``/``load_state_dict``). The collector keeps its
    counts in its own object, so these are views of it, never written.
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
