"""Collection across machines: one :class:`~torchrl_unilab.OffPolicyCollector` per Ray node.

TorchRL's ``RayCollector`` drives the nodes.

Ray does the cluster work (placement, transport, actor lifecycle) and TorchRL's
``RayCollector`` the coordination; this module only adapts our collector to
both. :class:`RayNodeCollector` is the ``collector_class`` each Ray actor runs:
its worker processes, batched envs and shared-memory weights stay on its
machine. :class:`RayOffPolicyCollector` is the learner-side ``RayCollector``
that adds what off-policy training needs: exact random frames and distinct
seeds over all nodes, globally unique trajectory ids, two-level weight sync
(TorchRL's ``RayWeightSyncScheme`` to the nodes, our seqlock to their workers),
failures that name the node, and the ``allow_frames`` / ``wait_for_frames``
pacing the recipes' :class:`~torchrl_unilab.trainers.training.UTDController` drives.

Ray is an optional dependency (``pip install -e ".[ray]"``): importing this
module works without it, building a collector does not.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import socket
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModuleBase, TensorDictSequential
from torchrl.collectors.distributed import RayCollector
from torchrl.data import ReplayBuffer
from torchrl.envs.utils import ExplorationType
from torchrl.weight_update import RayWeightSyncScheme, WeightSyncScheme

from torchrl_unilab._residue import pid_alive
from torchrl_unilab._torchrl_private import (
    RayCollectorHooks,
    initialize_ray_weight_sync,
    make_node_actor,
    replace_node_actor,
    request_stop,
    send_weights_scheme,
    set_node_frames_per_batch,
    set_ray_rendezvous_timeout,
    stop_requested,
)
from torchrl_unilab.collectors._arguments import check_ray_arguments
from torchrl_unilab.collectors._control import (
    node_traj_ids,
    num_batches,
    split_random_frames,
    stream_seed,
)
from torchrl_unilab.collectors._pacing import DeliveredFrames, Pacing
from torchrl_unilab.collectors._processes import WorkerError, _remove_fork_server_dir, sweep_stale_fork_server_dirs
from torchrl_unilab.collectors._worker import TRAJ_KEY, VERSION_KEY
from torchrl_unilab.collectors.offpolicy_collector import OffPolicyCollector
from torchrl_unilab.data.replay_buffer import init_storage
from torchrl_unilab.modules.normalization import ObservationNormalizer
from torchrl_unilab.weight_update.weight_sync import sweep_stale_blocks
from torchrl_unilab.weight_update.weight_sync_scheme import _flat_weights

__all__ = ["NodeError", "RayNodeCollector", "RayOffPolicyCollector"]


# RayCollector passes these MultiAsyncCollector arguments to every remote
# collector, at its own defaults; a node only takes them at those values.
# (max_frames_per_traj and trust_policy go on to OffPolicyCollector, which honours them.)
_RAY_PASSED_DEFAULTS = {
    "reset_at_each_iter": False, "split_trajs": False,
    "device": None, "storing_device": None, "env_device": None, "policy_device": None,
}


_log = logging.getLogger("torchrl.unilab")

#: How long TorchRL's Ray weight-sync rendezvous waits for every node (its own default is 60 s).
WEIGHT_SYNC_RENDEZVOUS_S = 300


class _RayNodeWeightSyncScheme(RayWeightSyncScheme):
    """TorchRL's ``RayWeightSyncScheme``, whose shutdown leaves Ray down when it finds it down.

    The learner's scheme kills its rendezvous actor on ``shutdown`` (which its ``__del__`` calls too). Once Ray is
    shut down that actor is gone with it, and ``ray.kill`` would start a new local runtime to kill it (Ray starts
    one on any call when none is up), so the kill is skipped then. :class:`RayOffPolicyCollector` syncs its nodes
    with this scheme.

    Example:
        >>> import ray
        >>> scheme = _RayNodeWeightSyncScheme()
        >>> scheme.shutdown()
        >>> ray.is_initialized()
        False
    """

    def shutdown(self) -> None:
        if _ray_is_up():
            super().shutdown()
        else:
            WeightSyncScheme.shutdown(self)


def _ray():
    try:
        import ray
    except ImportError as err:  # pragma: no cover - exercised by the no-Ray import test
        raise ImportError('Ray is not installed; install the extra with: pip install -e ".[ray]"') from err
    _wait_longer_for_the_rendezvous()
    return ray


def _ray_is_up() -> bool:
    """Whether a Ray runtime is up in this process, asked without importing Ray (nor starting it)."""
    ray = sys.modules.get("ray")
    return ray is not None and ray.is_initialized()


def _wait_longer_for_the_rendezvous() -> None:
    # TorchRL's RayWeightSyncScheme waits a module-level 60 s for its gloo rendezvous, on the learner
    # and on each node. A node whose workers are still starting on a loaded machine can miss it
    # (DistStoreError: wait timeout after 60000ms); the learner and every node call this, so both
    # sides wait longer.
    set_ray_rendezvous_timeout(WEIGHT_SYNC_RENDEZVOUS_S)


class NodeError(WorkerError):
    """A collector node failed: a worker on it raised, or its Ray actor was lost.

    Attributes:
        node_idx: index of the node (the Ray actor) in :class:`RayOffPolicyCollector`.
        node_host: host name and process id of the node's actor.
        worker_idx: index of the worker on that node, ``None`` when the whole node was lost.
        worker_traceback: the remote traceback (or Ray's account of the actor's death).

    Examples:
        >>> err = NodeError(1, "host-b (pid 42)", "ValueError: boom", "Traceback ...", worker_idx=0)
        >>> err.node_idx, err.worker_idx
        (1, 0)
        >>> print(str(err).splitlines()[0])
        collector node 1 on host-b (pid 42), worker 0 failed: ValueError: boom
    """

    def __init__(self, node_idx: int, node_host: str, message: str, remote_traceback: str, *,
                 worker_idx: int | None = None) -> None:
        self.node_idx = node_idx
        self.node_host = node_host
        where = f"collector node {node_idx} on {node_host}" + ("" if worker_idx is None else f", worker {worker_idx}")
        RuntimeError.__init__(self, f"{where} failed: {message}\n\nRemote traceback:\n{remote_traceback}")
        self.worker_idx = worker_idx
        self.worker_traceback = remote_traceback
        self._message = message

    def __reduce__(self):
        # Ray pickles a node's exception to the learner; the base class would replay only str(self)
        return _rebuild_node_error, (self.node_idx, self.node_host, self._message, self.worker_traceback,
                                     self.worker_idx)


def _rebuild_node_error(node_idx, node_host, message, remote_traceback, worker_idx) -> NodeError:
    return NodeError(node_idx, node_host, message, remote_traceback, worker_idx=worker_idx)


class RayNodeCollector(OffPolicyCollector):
    """The :class:`~torchrl_unilab.OffPolicyCollector` one Ray actor runs: a ``RayCollector`` ``collector_class``.

    It takes the arguments ``RayCollector`` hands every remote collector (a list
    of env makers, one per worker, ``worker_idx`` and TorchRL's defaults) and
    yields each batch of ``frames_per_batch`` transitions with trajectory ids
    made unique over all nodes (``local_id * num_nodes + node``). Given a
    ``RayReplayBuffer`` client as ``replay_buffer`` (``RayCollector`` passes one
    when its own ``replay_buffer`` is a ``RayReplayBuffer``), it writes each batch
    there and yields ``None``. Weights arriving through TorchRL's
    ``RayWeightSyncScheme`` land in ``policy`` as given and are published to the
    node's workers through shared memory, so ``policy_version`` counts the
    learner's publishes on every node.

    Args:
        create_env_fn: what :class:`~torchrl_unilab.OffPolicyCollector` takes,
            or ``RayCollector``'s list of the same env maker once per worker.
        policy: the policy module; the learner's weights are loaded into it by name.

    Keyword Args:
        worker_idx: this node's index (``RayCollector`` sets it).
        num_nodes: how many nodes collect, for globally unique trajectory ids.
        replay_buffer: ``None``, or a ``RayReplayBuffer`` client to write into.
        node_stream: 0 for a first node; ``k`` for the ``k``-th actor started in this node's
            place, whose trajectory ids then come from a block of their own.
        version_offset: added to the rows' ``policy_version`` (random rows keep ``-1``): a
            replacement started at the learner's version ``v + 1`` counts on from there.
        **kwargs: :class:`~torchrl_unilab.OffPolicyCollector` keyword arguments.

    Examples:
        >>> import torch
        >>> from tensordict.nn import TensorDictModule
        >>> policy = TensorDictModule(torch.nn.Linear(3, 1), in_keys=["observation"], out_keys=["action"])
        >>> node = RayNodeCollector(["Pendulum-v1"], policy, worker_idx=1, num_nodes=2, num_workers=1,
        ...                         num_envs=2, frames_per_batch=32, init_random_frames=32, seed=0)
        >>> batch = node.next()
        >>> batch.shape, bool((batch["collector", "traj_ids"] % 2 == 1).all())
        (torch.Size([32]), True)
        >>> node.shutdown()
    """

    def __init__(
        self,
        create_env_fn: Any,
        policy: TensorDictModuleBase | None = None,
        *,
        worker_idx: int | None = 0,
        num_nodes: int = 1,
        replay_buffer: Any = None,
        node_stream: int = 0,
        version_offset: int = 0,
        frames_per_batch: int,
        num_workers: int | None = None,
        **kwargs: Any,
    ) -> None:
        for name, default in _RAY_PASSED_DEFAULTS.items():
            value = kwargs.pop(name, default)
            if value != default and not (name.endswith("device") and str(value) == "cpu"):
                raise ValueError(f"RayNodeCollector supports {name!r} only at {default!r}, got {value!r}")
        if isinstance(create_env_fn, list) and create_env_fn and all(isinstance(f, str) for f in create_env_fn):
            create_env_fn = create_env_fn[0]  # RayCollector repeats the gymnasium id once per worker
        _wait_longer_for_the_rendezvous()
        self.num_nodes = int(num_nodes)
        self.node_stream, self.version_offset = int(node_stream), int(version_offset)
        self.node_host = f"{socket.gethostname()} (pid {os.getpid()})"
        self._remote_buffer = replay_buffer
        super().__init__(create_env_fn, policy, num_workers=num_workers, frames_per_batch=frames_per_batch,
                         replay_buffer=None, **kwargs)
        self.worker_idx = 0 if worker_idx is None else int(worker_idx)

    #: The driver (RayOffPolicyCollector) reads the rows' policy versions and trajectory ids.
    _yields_torchrl_batches = False
    _says_how_weights_arrive = False

    def iterator(self) -> Iterator[TensorDictBase | None]:
        """Yields each batch of ``frames_per_batch`` transitions (``None`` once written to a ``RayReplayBuffer``)."""
        error = None
        try:
            for batch in super().iterator():
                batch[TRAJ_KEY] = node_traj_ids(batch[TRAJ_KEY], self.node_stream, self.num_nodes, self.worker_idx)
                if self.version_offset:
                    version = batch[VERSION_KEY]
                    batch[VERSION_KEY] = torch.where(version > 0, version + self.version_offset, version)
                if self._remote_buffer is None:
                    yield batch
                else:
                    self._remote_buffer.extend(batch)
                    yield None
        except WorkerError as err:
            error = NodeError(self.worker_idx, self.node_host, str(err).splitlines()[0], err.worker_traceback,
                              worker_idx=err.worker_idx)
        if error is not None:
            raise error  # outside the handler: Ray pickles the context too, and WorkerError does not unpickle

    def shutdown(self, timeout: float | None = None, close_env: bool = True, raise_on_error: bool = False) -> None:
        """Stops the node's workers. A worker's error is not raised again here: :meth:`next` already sent it
        to the learner as a :class:`NodeError` (TorchRL's ``__iter__`` shuts down on the way out of an error).
        Inside its actor, which ``RayCollector.shutdown`` kills next (no exit handler runs), the fork
        server's directory goes now; a node built in the learner's process keeps its process's."""
        super().shutdown(timeout=timeout, close_env=close_env, raise_on_error=raise_on_error)
        ray = _ray()
        if ray.is_initialized() and ray.get_runtime_context().get_actor_id() is not None:
            _remove_fork_server_dir()

    def load_learner_weights(self, weights: Mapping[str, Any], version: int) -> None:
        """A replacement node's weight update (it is outside the learner's weight-sync group): publishes
        ``weights`` to its workers, its rows then counting ``version``, the learner's."""
        self.update_policy_weights_(weights)
        self.version_offset = version - self.policy_version

    def layout_row(self) -> TensorDictBase:
        """One zero row with every key and dtype this node writes, to lay out the learner's buffer."""
        return self.fake_tensordict()[0]

    def host(self) -> str:
        """Host name and actor process id of this node, for error messages."""
        return self.node_host

    def batch_frames(self) -> int:
        """Frames of each batch this node sends: ``frames_per_batch`` rounded up to a multiple of its env batch."""
        return self.frames_per_batch

    def node_metrics(self) -> dict[str, Any]:
        """:meth:`~torchrl_unilab.OffPolicyCollector.metrics` plus the node's host and frames read so far."""
        out = self.metrics()
        out["host"] = self.node_host
        out["frames_yielded"] = self.frames_iterated
        return out


class RayOffPolicyCollector(RayCollectorHooks, RayCollector):
    """TorchRL's ``RayCollector`` with one :class:`RayNodeCollector` per node, for off-policy training.

    Each of ``num_nodes`` Ray actors runs a :class:`RayNodeCollector` with
    ``num_workers`` processes of ``num_envs`` envs. Where the data goes depends
    on ``replay_buffer``:

    * ``None``: iterating yields each node's batches, first ready first served,
      as ``RayCollector`` does; the learner ``extend``-s its own buffer.
    * a local TorchRL ``ReplayBuffer`` (e.g. :func:`~torchrl_unilab.make_replay_buffer`):
      the collector extends it as batches arrive and yields ``None``; with
      :meth:`start` / :meth:`allow_frames` a thread does so in the background,
      so this class paces like :class:`~torchrl_unilab.OffPolicyCollector`.
    * a ``RayReplayBuffer``: nodes write straight into it, and the learner
      receives nothing but a frame count.

    Args:
        create_env_fn: a gymnasium id or a callable returning a batched env, as
            :class:`~torchrl_unilab.OffPolicyCollector` takes.
        policy: the policy module; :meth:`update_policy_weights_` sends its
            weights with TorchRL's ``RayWeightSyncScheme``.

    Keyword Args:
        num_nodes: Ray actors (collector nodes), ``>= 1``.
        num_workers: worker processes per node. num_envs: envs per worker.
        frames_per_batch: frames of one batch (one worker's write, one ``ray.get``).
            The learner's cost is per batch, so use a few hundred: smaller batches lose
            more of the local collector's rate to the per-batch cost
            (``python benchmarks/ray_scaling.py --frames-per-batch N`` measures it).
        total_frames: frames to collect over all nodes, ``-1`` for no limit.
        init_random_frames: uniformly random frames over all nodes and workers,
            split exactly (node ``i`` takes ``n // num_nodes`` plus one if ``i < n % num_nodes``).
        seed: node ``i`` is seeded ``seed + i * num_workers * num_envs * (max_worker_restarts + 1)``
            (``collector_kwargs``' ``max_worker_restarts``), so every env of every node, and of each
            replacement worker, gets its own seed.
        replay_buffer: see above.
        on_node_failure: ``"raise"`` (default) raises :class:`NodeError` when a
            node's worker fails or its actor is lost; ``"continue"`` warns on a
            lost node and goes on with the others (a worker error still raises).
            Applies once a node has no restarts left.
        max_node_restarts: how many times each node's lost actor is replaced by a new one
            (default 0: none). Ray's own actor restart (``max_restarts``) would run the
            constructor again with the same seed and random frames; a new actor is started
            instead, on the node's next seed stream, owed the random frames the node had not
            delivered, with the learner's current weights and version (later publishes reach
            it through a Ray call, as it is no part of the weight-sync group). Batches the
            learner received stay; the batch the lost node was collecting is lost. Counted in
            ``metrics()["node_restarts"]``; each replacement is logged once. Worker restarts on
            a node are ``collector_kwargs={"max_worker_restarts": N}``.
        collector_kwargs: other :class:`~torchrl_unilab.OffPolicyCollector` keyword arguments for every node.
            ``obs_norm`` must be the learner's
            :class:`~torchrl_unilab.ObservationNormalizer`: the nodes get the
            policy as ``TensorDictSequential(obs_norm, policy)``, so the
            statistics the learner updates travel with the weights.
        remote_configs: ``ray.remote`` options of each node actor (default
            ``{"num_cpus": 1, "scheduling_strategy": "SPREAD"}``).
        ray_init_config: ``ray.init`` keyword arguments when Ray is not started
            yet (``{"address": "auto"}`` joins a cluster made with ``ray start``).

    Examples:
        >>> import ray, torch
        >>> from tensordict.nn import TensorDictModule
        >>> _ = ray.init(num_cpus=2, include_dashboard=False, ignore_reinit_error=True)
        >>> policy = TensorDictModule(torch.nn.Linear(3, 1), in_keys=["observation"], out_keys=["action"])
        >>> collector = RayOffPolicyCollector("Pendulum-v1", policy, num_nodes=1, num_workers=1, num_envs=2,
        ...                                   frames_per_batch=32, total_frames=128, init_random_frames=64, seed=0)
        >>> batches = list(collector)
        >>> len(batches), int(sum((b["policy_version"] == -1).sum() for b in batches))
        (4, 64)
        >>> collector.shutdown()
        >>> ray.shutdown()
    """

    def __init__(
        self,
        create_env_fn: str | Callable[[], Any],
        policy: TensorDictModuleBase,
        *,
        num_nodes: int = 2,
        num_workers: int = 1,
        num_envs: int = 16,
        frames_per_batch: int,
        total_frames: int = -1,
        init_random_frames: int = 0,
        seed: int | None = None,
        replay_buffer: ReplayBuffer | None = None,
        on_node_failure: str = "raise",
        max_node_restarts: int = 0,
        exploration_type: ExplorationType = ExplorationType.RANDOM,
        collector_kwargs: Mapping[str, Any] | None = None,
        remote_configs: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None,
        ray_init_config: Mapping[str, Any] | None = None,
    ) -> None:
        ray = _ray()
        check_ray_arguments(num_nodes=num_nodes, num_workers=num_workers, num_envs=num_envs,
                            init_random_frames=init_random_frames, max_node_restarts=max_node_restarts,
                            on_node_failure=on_node_failure)
        kwargs = dict(collector_kwargs or {})
        # RayCollector sets every node's max_frames_per_traj from its own argument, over collector_kwargs'.
        max_frames_per_traj = kwargs.pop("max_frames_per_traj", None)
        self.obs_norm = kwargs.pop("obs_norm", None)
        if self.obs_norm is not None and self.obs_norm is not False:
            if not isinstance(self.obs_norm, ObservationNormalizer):
                raise TypeError(
                    "collector_kwargs['obs_norm'] must be the learner's ObservationNormalizer (or None) with "
                    f"RayOffPolicyCollector, got {self.obs_norm!r}: the learner updates its statistics"
                )
            # The nodes receive the policy with the normaliser inside, so its
            # statistics travel with every update_policy_weights_().
            policy = TensorDictSequential(self.obs_norm, policy)
        else:
            self.obs_norm = None
        self.on_node_failure = on_node_failure
        self._local_buffer = None
        if replay_buffer is not None and getattr(replay_buffer, "service_backend", None) != "ray":
            self._local_buffer, replay_buffer = replay_buffer, None
        # Frame by frame: each node then shares its part among its workers in whole batches of its own.
        self._node_random_frames = split_random_frames(init_random_frames, num_nodes, 1)
        self.seed, self.num_nodes, self.max_node_restarts = seed, num_nodes, max_node_restarts
        # Each node's seed streams take blocks of seeds wide enough for its workers' own restarts.
        self._seed_block = num_workers * num_envs * (int(kwargs.get("max_worker_restarts", 0)) + 1)
        self._node_seeds = [stream_seed(seed, i, 0, num_nodes, self._seed_block) for i in range(num_nodes)]
        self.node_restarts = [0] * num_nodes
        self._node_delivered = [[0, 0] for _ in range(num_nodes)]  # frames and random frames received per node
        self._replaced: set[int] = set()
        self._starting_nodes: set[int] = set()  # replacements that have not delivered a batch yet
        # Calls to replacements the learner does not wait for -> (node, actor): its host name, its weights.
        self._host_calls: dict[Any, tuple[int, Any]] = {}
        self._weight_calls: dict[Any, tuple[int, Any]] = {}
        self._calls_lock = threading.Lock()  # the learner's thread and the collection thread both take answers
        self._metrics_calls: dict[int, tuple[Any, Any]] = {}  # node -> (actor, its node_metrics call in flight)
        self._node_figures: dict[int, dict[str, Any]] = {}  # node -> its last answer
        kwargs.update(num_workers=num_workers, num_envs=num_envs, num_nodes=num_nodes)
        self._lost: dict[int, str] = {}
        self._pending: dict[Any, int] = {}  # the next() call in flight on each node -> node index
        self._fetched: dict[Any, TensorDictBase | None] = {}  # finished calls, in arrival order
        # liveness calls to nodes whose batch waits in _fetched -> (node index, the actor pinged)
        self._pings: dict[Any, tuple[int, Any]] = {}
        # The batches delivered here, and the pacing over them (start, allow_frames, pause, wait_for_frames).
        self._delivered = DeliveredFrames(
            total_frames=total_frames if total_frames >= 0 else float("inf"),
            has_buffer=self._local_buffer is not None or replay_buffer is not None, batches=self.iterator,
            while_held=self._watch_nodes, stop=functools.partial(stop_requested, self), name="RayOffPolicyCollector")
        self._pacing = Pacing(self._delivered)
        self.published_version = 1
        self.receive_s = 0.0
        try:
            super().__init__(
                [create_env_fn] * num_nodes if isinstance(create_env_fn, str) else create_env_fn,
                policy,
                frames_per_batch=frames_per_batch,
                total_frames=total_frames if total_frames >= 0 else float("inf"),  # RayCollector stops at -1
                init_random_frames=0,  # split exactly over the nodes in add_collectors
                max_frames_per_traj=-1 if max_frames_per_traj is None else max_frames_per_traj,
                exploration_type=exploration_type,
                collector_class=RayNodeCollector,
                collector_kwargs=kwargs,
                num_workers_per_collector=num_workers,
                num_collectors=num_nodes,
                sync=False,
                replay_buffer=replay_buffer,
                remote_configs=dict(remote_configs or {"num_cpus": 1, "scheduling_strategy": "SPREAD"})
                if not isinstance(remote_configs, Sequence) else list(remote_configs),
                ray_init_config=dict(ray_init_config) if ray_init_config is not None else None,
                weight_sync_schemes={"policy": _RayNodeWeightSyncScheme()},
            )
        except BaseException:
            # TorchRL's own cleanup of a half-built RayCollector: kills the node actors started so far and gives
            # back its Ray runtime lease, so a runtime the collector started for itself goes with it.
            super().__del__()
            raise
        try:
            self._connect_nodes(ray)
        except BaseException:
            # The nodes run and the lease is held: stopped and given back as shutdown does.
            self.shutdown(raise_on_error=False)
            raise

    def _connect_nodes(self, ray: Any) -> None:
        """Learns each node's host, batch size and row layout, and joins the nodes' weight-sync group."""
        self.node_hosts = ray.get([c.host.remote() for c in self.remote_collectors])
        self._nodes = list(self.remote_collectors)  # RayCollector's list shrinks on shutdown; indices stay
        # A node rounds frames_per_batch up to a multiple of its env batch, as TorchRL does; count what it sends.
        set_node_frames_per_batch(self, ray.get(self._nodes[0].batch_frames.remote()))
        if self._local_buffer is not None:
            init_storage(self._local_buffer, ray.get(self._nodes[0].layout_row.remote()))
        initialize_ray_weight_sync(self)

    # ------------------------------------------------------------ construction
    def add_collectors(self, create_env_fn, num_envs, policy, collector_kwargs, remote_configs) -> None:
        """RayCollector's hook, with each node's exact share of random frames and its own seed."""
        collector_kwargs = [
            dict(kw, init_random_frames=frames, seed=seed)
            for kw, frames, seed in zip(collector_kwargs, self._node_random_frames, self._node_seeds)
        ]
        # What a replacement actor is made from (_replace_node).
        self._spawn = (list(create_env_fn), num_envs, policy, collector_kwargs, list(remote_configs))
        super().add_collectors(create_env_fn, num_envs, policy, collector_kwargs, remote_configs)

    def _replace_node(self, idx: int, err: Exception) -> None:
        """Starts a new actor in lost node ``idx``'s place: next seed stream, random frames owed, current weights.

        Not Ray's ``max_restarts``: that reruns the constructor with the same seed and random frames.
        The policy is pickled as it is now, so the new actor acts with the learner's current weights.
        """
        self.node_restarts[idx] += 1
        stream = self.node_restarts[idx]
        env_fns, num_envs, policy, kwargs, configs = self._spawn
        frames, random_frames = self._node_delivered[idx]
        for future, out in self._fetched.items():  # finished before it was lost: delivered next, so not owed
            if self._pending.get(future) == idx:
                frames += self.frames_per_batch
                random_frames += 0 if out is None else int((out[VERSION_KEY] == -1).sum())
        owed = max(0, self._node_random_frames[idx] - (random_frames if self._local_buffer is not None
                                                         or self.replay_buffer is None else frames))
        seed = stream_seed(self.seed, idx, stream, self.num_nodes, self._seed_block)
        params = dict(kwargs[idx], worker_idx=idx, seed=seed, init_random_frames=owed, node_stream=stream,
                      version_offset=self.published_version - 1)
        actor = make_node_actor(self, self.collector_class.as_remote(configs[idx]).remote,
                                env_maker=[env_fns[idx]] * num_envs,
                                policy=policy[idx] if isinstance(policy, Sequence) else policy, other_params=params)
        self._nodes[idx] = actor
        replace_node_actor(self, idx, actor)
        self._replaced.add(idx)
        self._starting_nodes.add(idx)
        if idx not in self._pending.values():  # a batch it finished may still wait to be delivered
            self._pending[actor.next.remote()] = idx
        _log.warning(f"RayOffPolicyCollector: collector node {idx} on {self.node_hosts[idx]} was lost "
                     f"({str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__}); started a "
                     f"new actor in its place (restart {stream} of at most {self.max_node_restarts})")
        self.node_hosts[idx] = f"replacement {stream} of node {idx} (starting)"

    def __len__(self) -> int:
        return num_batches(self.total_frames, self.frames_per_batch)

    def __bool__(self) -> bool:
        return True

    # --------------------------------------------------------------- iteration
    def iterator(self) -> Iterator[TensorDictBase | None]:
        """Yields batches as nodes deliver them; extends the local ``replay_buffer`` instead when one was given."""
        for out in super().iterator():
            if self._local_buffer is not None and out is not None:
                start = time.perf_counter()
                self._local_buffer.extend(out)
                self.receive_s += time.perf_counter() - start
                out = None
            self._delivered.add(self.frames_per_batch)
            yield out

    def node_batches(self) -> Iterator[TensorDictBase | None]:
        """``RayCollector``'s first-ready-first-served loop over the nodes' batches, as :meth:`iterator` runs it,
        with node failures reported as :class:`NodeError`."""
        ray = _ray()
        self._pending = {c.next.remote(): i for i, c in enumerate(self._nodes) if i not in self._lost}
        while self.collected_frames < self.total_frames and not stop_requested(self):
            if not self._pending:
                raise NodeError(-1, "all nodes", "every collector node was lost", "\n".join(self._lost.values()))
            if not self._fetched:
                self._fetch(ray.wait(list(self._pending), timeout=1.0)[0][:1])
            if not self._fetched:
                continue
            future, out = next(iter(self._fetched.items()))
            del self._fetched[future]
            idx = self._pending.pop(future)
            self._count_delivered(idx, out)
            # ask again before yielding: every live node keeps a call in flight, whose failure shows at once
            if idx not in self._lost:
                self._pending[self._nodes[idx].next.remote()] = idx
            self.collected_frames += self.frames_per_batch
            yield out
        if self._pending:
            ray.wait(list(self._pending), num_returns=len(self._pending), timeout=10.0)
        if not self._delivered.collecting:
            self.shutdown()

    def _count_delivered(self, idx: int, out: TensorDictBase | None) -> None:
        delivered = self._node_delivered[idx]
        delivered[0] += self.frames_per_batch
        if out is not None:
            delivered[1] += int((out[VERSION_KEY] == -1).sum())
        if idx in self._starting_nodes:  # it has started; named once it answers, not waited for here
            self._starting_nodes.discard(idx)
            with self._calls_lock:
                self._host_calls[self._nodes[idx].host.remote()] = (idx, self._nodes[idx])
        self._reap_calls()

    def _reap_calls(self) -> None:
        """Takes the answers of the replacements' calls that are done, without waiting for the others.

        Called where batches are collected (each delivery, and while the learner holds collection back).

        Waiting for them would stall the learner (for a host name, or a publish) for as long as a replacement
        takes to start and work through its queue of calls. A lost node's call fails; the collection thread
        replaces or reports that node, as it does any lost node.
        """
        with self._calls_lock:
            calls = list(self._host_calls) + list(self._weight_calls)
            if not calls:
                return
            ray = _ray()
            for ref in ray.wait(calls, num_returns=len(calls), timeout=0)[0]:
                is_host = ref in self._host_calls
                idx, actor = self._host_calls.pop(ref) if is_host else self._weight_calls.pop(ref)
                try:
                    answer = ray.get(ref)
                except ray.exceptions.RayActorError:
                    continue
                if is_host and self._nodes[idx] is actor:
                    self.node_hosts[idx] = answer

    def _fetch(self, futures: list) -> None:
        """Gets finished batches into ``_fetched``; a lost node's future is dropped (or raises)."""
        ray = _ray()
        for future in futures:
            idx = self._pending[future]
            start = time.perf_counter()
            try:
                self._fetched[future] = ray.get(future)
            except ray.exceptions.RayActorError as err:
                del self._pending[future]
                self._node_lost(idx, err)
            except ray.exceptions.RayTaskError as err:
                raise _node_error(idx, self.node_hosts[idx], err) from None
            self.receive_s += time.perf_counter() - start

    def _watch_nodes(self) -> None:
        """While the learner holds collection back: fetch what nodes finished, so a lost node shows at once.

        A node whose batch already waits here has no ``next()`` in flight to fail,
        so it is pinged instead (a cheap call; the actor is idle).
        """
        ray = _ray()
        self._reap_calls()
        waiting = [f for f in self._pending if f not in self._fetched]
        if waiting:
            self._fetch(ray.wait(waiting, num_returns=len(waiting), timeout=0)[0])
        idle = {self._pending[f] for f in self._fetched if f in self._pending} - set(self._lost)
        for idx in idle - {idx for idx, _ in self._pings.values()}:
            self._pings[self._nodes[idx].host.remote()] = (idx, self._nodes[idx])
        if not self._pings:
            return
        for ref in ray.wait(list(self._pings), num_returns=len(self._pings), timeout=0)[0]:
            idx, actor = self._pings.pop(ref)
            try:
                ray.get(ref)
            except ray.exceptions.RayActorError as err:
                # a ping to an actor already replaced (its batch call saw the loss first) is stale: replacing
                # again would throw away the healthy replacement and spend a restart
                if self._nodes[idx] is actor:
                    self._node_lost(idx, err)  # its fetched batch is still delivered; it is not asked again

    def _node_lost(self, idx: int, err: Exception) -> None:
        if self.node_restarts[idx] < self.max_node_restarts and not stop_requested(self):
            self._replace_node(idx, err)
            return
        self._lost[idx] = f"node {idx} on {self.node_hosts[idx]}: {err}"
        if self.on_node_failure == "raise":
            raise NodeError(idx, self.node_hosts[idx], "its Ray actor was lost", str(err)) from None
        warnings.warn(f"collector node {idx} on {self.node_hosts[idx]} was lost; going on with "
                      f"{len(self._nodes) - len(self._lost)} node(s): {str(err).splitlines()[0]}", stacklevel=3)

    def _starting(self, idx: int) -> bool:
        """Whether node ``idx`` is a replacement that has not delivered a batch yet (its actor may still start)."""
        return idx in self._starting_nodes

    @property
    def lost_nodes(self) -> list[int]:
        """Indices of the nodes lost so far (with ``on_node_failure="continue"``)."""
        return sorted(self._lost)

    # ------------------------------------------------- background pacing (UTD)
    # The same pacing as OffPolicyCollector's (collectors/_pacing.py), over the batches delivered here: a thread
    # of this process takes each node's batch once the allowance has room.
    def start(self) -> None:
        """Collects in a background thread until ``total_frames``; needs a ``replay_buffer``."""
        self._pacing.start()

    def allow_frames(self, frames: int | None) -> None:
        """Caps the frames delivered to the buffer (``None``: up to ``total_frames``); collects in a background
        thread up to it. Nodes keep at most one batch each in flight beyond the cap."""
        self._pacing.allow_frames(frames)

    def _raise_if_failed(self) -> None:
        self._delivered.raise_if_failed()

    def wait_for_frames(self, frames: int, timeout: float | None = None) -> bool:
        """Blocks until ``frames`` frames reached the buffer; False on timeout. Raises a node's error.

        A wait that could never end raises ``ValueError``, as :class:`~torchrl_unilab.OffPolicyCollector`'s:
        ``frames`` above ``total_frames``, or above the frames delivered when nothing collects in the background
        (call :meth:`start` or :meth:`allow_frames` first).
        """
        return self._pacing.wait_for_frames(frames, timeout)

    @property
    def frames_written(self) -> int:
        """Frames delivered so far (extended into the local buffer, or written by the nodes to the Ray buffer)."""
        return self._pacing.frames_written

    def pause(self, timeout: float | None = 30.0, *, resume: bool = True) -> contextlib.AbstractContextManager:
        """Context manager: no batch is delivered inside it, the one in flight delivered first (nodes hold
        their next batch meanwhile); ``timeout`` and ``resume`` as :meth:`OffPolicyCollector.pause
        <torchrl_unilab.OffPolicyCollector.pause>`."""
        return self._pacing.pause(timeout, resume=resume)

    # ----------------------------------------------------------------- weights
    def update_policy_weights_(self, policy_or_weights: Any = None, *, worker_ids: Any = None, **kwargs: Any) -> None:
        """Sends new weights to every live node (TorchRL's ``RayWeightSyncScheme``).

        Each node publishes them to its workers.
        """
        self._raise_if_failed()
        super().update_policy_weights_(policy_or_weights, worker_ids=worker_ids, **kwargs)
        self.published_version += 1

    def send_weights_to_nodes(self, *, model_id: str, scheme: Any, processed_weights: Any, worker_ids: Any) -> None:
        """Sends one scheme's weights to the nodes, as ``RayCollector`` does, and to replacement nodes by a Ray call."""
        ray = _ray()
        nodes = list(self._nodes)  # the actors this publish calls
        if worker_ids is None and (self._lost or self._replaced):
            worker_ids = [i for i in range(len(self._nodes)) if i not in self._lost and i not in self._replaced]
        if self._replaced:
            # Replacements are no part of the weight-sync group made at the start: a Ray call brings them the
            # weights, and the version they publish to their workers is the learner's.
            # Not waited for (the learner would stall while one still starts, or behind a started one's queue):
            # Ray runs an actor's calls in order, so the node loads them before its next batch.
            # The collection thread takes their answers (_reap_calls).
            weights = ray.put(_cpu_weights(self.policy if processed_weights is None else processed_weights))
            for i in sorted(self._replaced - set(self._lost)):
                call = self._nodes[i].load_learner_weights.remote(weights, self.published_version + 1)
                with self._calls_lock:
                    self._weight_calls[call] = (i, self._nodes[i])
        try:
            if worker_ids is None or worker_ids:  # none left in the group when every node was replaced
                send_weights_scheme(self, model_id=model_id, scheme=scheme, processed_weights=processed_weights,
                                    worker_ids=worker_ids)
        except ray.exceptions.RayActorError:
            if not _any_lost(ray, [node for i, node in enumerate(nodes) if i not in self._lost]):
                raise
            # A node died: the collection thread, which holds a call in flight to (or pings) every node, replaces
            # it (or reports it) as it does any lost node, with an actor built from the current policy. Not here
            # as well: one death would be handled twice. A live node that missed these weights gets the next ones.

    @property
    def policy_version(self) -> int:
        """Version of the latest weights sent (1 = the initial policy), as rows' ``policy_version`` counts it."""
        return self.published_version

    def get_policy_version(self) -> int:
        """Same as :attr:`policy_version`."""
        return self.published_version

    # ----------------------------------------------------------------- figures
    def metrics(self) -> dict[str, Any]:
        """Figures of every live node (``nodes``), summed ``frames`` and the mean of their ``mean_return``.

        A node's figures are its last answer: one busy with a batch answers after it, so this waits at most
        1 s (10 s before every node has answered once) and uses the previous answer of a node still busy. A
        replacement node that has not delivered a batch yet is not asked (its actor may still be starting);
        it is listed in ``starting_nodes``.
        """
        self._raise_if_failed()
        ray = _ray()
        # A replacement still starting would hold this call until its constructor ends: a learner stall.
        live = [i for i in range(len(self._nodes)) if i not in self._lost and not self._starting(i)]
        for i in live:  # at most one call in flight per actor: a busy node answers after its batch
            if self._metrics_calls.get(i, (None,))[0] is not self._nodes[i]:
                self._metrics_calls[i] = (self._nodes[i], self._nodes[i].node_metrics.remote())
        calls = {self._metrics_calls[i][1]: i for i in live}
        # A node killed a moment ago may not be known lost yet, and its call would wait for Ray's timeout, with
        # the learner stalled here. So wait briefly, and use each node's last answer.
        wait_s = 10.0 if any(i not in self._node_figures for i in live) else 1.0
        ready, _ = ray.wait(list(calls), num_returns=len(calls), timeout=wait_s)
        for ref in ready:
            idx = calls[ref]
            del self._metrics_calls[idx]
            with contextlib.suppress(ray.exceptions.RayActorError):  # a lost node: the collection thread's
                self._node_figures[idx] = ray.get(ref)
        nodes = {i: self._node_figures[i] for i in live if i in self._node_figures}
        returns = [m["mean_return"] for m in nodes.values() if m.get("mean_return") == m.get("mean_return")]
        lengths = [m["mean_length"] for m in nodes.values() if m.get("mean_length") == m.get("mean_length")]
        return {
            "frames": self._delivered.written,
            "node_frames": sum(m["frames"] for m in nodes.values()),
            "mean_return": sum(returns) / len(returns) if returns else float("nan"),
            "mean_length": sum(lengths) / len(lengths) if lengths else float("nan"),
            "published_version": self.published_version,
            "lost_nodes": self.lost_nodes,
            "node_restarts": sum(self.node_restarts),
            "worker_restarts": sum(int(m.get("worker_restarts", 0)) for m in nodes.values()),
            "node_restarts_per_node": list(self.node_restarts),
            "starting_nodes": [i for i in range(len(self._nodes)) if i not in self._lost and self._starting(i)],
            "receive_s": self.receive_s,
            "nodes": nodes,
        }

    # ---------------------------------------------------------------- shutdown
    def shutdown(self, timeout: float | None = None, shutdown_ray: bool = False, close_env: bool = True,
                 raise_on_error: bool = True) -> None:
        """Stops every node's workers, then its actor (``RayCollector.shutdown``).

        Each node first shuts its workers down itself, so no process outlives
        its actor; a node that does not answer within ``timeout`` seconds
        (default 10) is killed with its actor. A node error not yet raised is
        raised here when ``raise_on_error`` is true.
        """
        if getattr(self, "_shut", False):
            return
        self._shut = True
        ray = _ray()
        request_stop(self)
        self._delivered.join(timeout=5.0)
        live = [i for i in range(len(getattr(self, "_nodes", []))) if i not in self._lost]
        refs = {self._nodes[i].shutdown.remote(raise_on_error=False): i for i in live}
        unfinished = []
        if refs:
            unfinished = ray.wait(list(refs), num_returns=len(refs), timeout=10.0 if timeout is None else timeout)[1]
        super().shutdown(timeout=timeout, shutdown_ray=shutdown_ray)
        # A node still busy with a batch is killed before it cleans up (its shutdown queues behind the batch);
        # what it leaves on this machine (weights block, fork-server directory) goes once its process is gone.
        _sweep_after(self.node_hosts[refs[ref]] for ref in unfinished)
        if raise_on_error:
            self._raise_if_failed()

    def __del__(self) -> None:
        # RayCollector.__del__ kills the node actors with ray.kill, and any Ray call starts a new local runtime
        # when none is up (Ray's auto-init). Actors do not outlive their runtime: once Ray is shut down there is
        # nothing left to kill, and a collector collected then must not start Ray again.
        if _ray_is_up():
            super().__del__()

    def __enter__(self) -> RayOffPolicyCollector:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.shutdown(raise_on_error=exc_type is None)


def _sweep_after(node_hosts: Iterator[str], timeout: float = 5.0) -> None:
    """Removes what killed node actors of this machine left in /dev/shm and the temporary directory.

    ``node_hosts`` are :meth:`RayNodeCollector.host` answers (``"host (pid N)"``); nodes on other machines
    are left to their own next start, which sweeps the entries of dead processes.
    """
    here = socket.gethostname()
    pids = [int(host.rsplit("(pid ", 1)[1].rstrip(")")) for host in node_hosts
            if host.startswith(f"{here} (pid ") and host.endswith(")")]
    if not pids:
        return
    deadline = time.monotonic() + timeout
    while any(pid_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    sweep_stale_blocks()
    sweep_stale_fork_server_dirs()


def _cpu_weights(weights: Any) -> dict[str, torch.Tensor]:
    """A module's ``state_dict``, a ``state_dict`` or a TensorDict of weights as ``{dotted name: CPU tensor}``.

    Examples:
        >>> sorted(_cpu_weights(torch.nn.Linear(2, 1)))
        ['bias', 'weight']
    """
    return {key: value.detach().cpu() for key, value in _flat_weights(weights).items()}


def _any_lost(ray, actors: list, timeout: float = 5.0) -> bool:
    """Whether one of ``actors`` is lost: its answer fails, or some answer is still missing after ``timeout``.

    All are asked at once and a failed answer ends the wait: a lost actor's call fails at once, while a
    live one busy with a batch answers only after it.
    """
    pending = [actor.host.remote() for actor in actors]
    deadline = time.monotonic() + timeout
    while pending:
        left = deadline - time.monotonic()
        if left <= 0:
            return True
        ready, pending = ray.wait(pending, timeout=left)
        for ref in ready:
            try:
                ray.get(ref)
            except Exception:  # noqa: BLE001 - any failure to answer counts as lost
                return True
    return False


def _node_error(idx: int, host: str, err: Exception) -> NodeError:
    """A :class:`NodeError` from Ray's ``RayTaskError``, keeping the node's own account when it raised one."""
    cause = getattr(err, "cause", None)
    if isinstance(cause, NodeError):
        return NodeError(idx, cause.node_host, cause._message, cause.worker_traceback, worker_idx=cause.worker_idx)
    text = str(err)
    return NodeError(idx, host, text.strip().splitlines()[-1] if text.strip() else type(err).__name__, text)
