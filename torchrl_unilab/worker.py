"""The function-level API of the original design, over the collector's own worker loop.

``off_policy_collector_fn`` is the entry point of one collector subprocess that
the user's launcher starts (``multiprocessing``, spawn). It builds the batched
MuJoCo env and the actor, then runs the very worker loop that
:class:`~torchrl_unilab.OffPolicyCollector` runs in its workers,
with hooks for what the function-level API adds: lock-step collection, metrics
messages on a queue, collector-side batch packing and tracing.

Learner side::

    rb = make_replay_buffer(1_000_000)
    init_offpolicy_storage(rb, "HalfCheetah-v5")          # lay out the shared storage here
    actor = make_actor("sac", obs_dim, action_dim)        # same builder as the collector
    weights = SharedWeights.create(actor)                 # weight_sync_name=weights.name
    proc = CollectorProcess(stop_event=stop, env_name="HalfCheetah-v5", num_envs=16, replay_buffer=rb,
                            weight_sync_name=weights.name, weight_param_shapes=layout_of(actor))
    ...; weights.publish(actor); proc.raise_if_failed(); ...
    proc.stop()
"""

from __future__ import annotations

import contextlib
import inspect
import multiprocessing as mp
import os
import queue
import signal
import sys
import time
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDictBase
from torchrl.data import ReplayBuffer
from torchrl.envs import EnvBase, TransformedEnv
from torchrl.envs.utils import ExplorationType, RandomPolicy

from torchrl_unilab._torchrl_private import storage_tensors
from torchrl_unilab.collectors._control import FrameControl
from torchrl_unilab.collectors._probe import probe_row
from torchrl_unilab.collectors._processes import (
    WorkerPool,
    process_context,
    report_error,
    restore_stderr,
    shut_down_at_exit,
    worker_started,
)
from torchrl_unilab.collectors._worker import LoopHooks, WorkerConfig, WorkerLoop
from torchrl_unilab.collectors.metrics import PHASES, CollectorMetrics
from torchrl_unilab.collectors.trace import PhaseTimer
from torchrl_unilab.data.replay_buffer import buffer_lock, init_storage, storage_keys
from torchrl_unilab.envs.envpool_env import make_gym_id_env, select_engine
from torchrl_unilab.envs.privileged import (
    PrivilegedInfoTransform,
    as_privileged_transform,
    resolve_collector_actor_dims,
    resolve_offpolicy_actor_priv_info,
)
from torchrl_unilab.modules.exploration import (
    make_collector_policy,
    sample_offpolicy_actions,
)
from torchrl_unilab.modules.models import actor_algo, make_actor
from torchrl_unilab.weight_update.weight_sync import SharedWeights

__all__ = [
    "MAX_COLLECTORS",
    "SIM_BACKENDS",
    "CollectorProcess",
    "init_offpolicy_storage",
    "make_collector_actor",
    "make_pack_slots",
    "off_policy_collector_fn",
    "resolve_collector_actor_dims",
    "resolve_offpolicy_actor_priv_info",
    "sample_offpolicy_actions",
]

#: Accepted ``sim_backend`` values.
SIM_BACKENDS: tuple[str, ...] = ("mujoco",)

#: Where traces go when ``trace_enabled=True`` (override with ``TORCHRL_UNILAB_TRACE_DIR``).
_TRACE_DIR_ENV = "TORCHRL_UNILAB_TRACE_DIR"


def _make_env(env_name: str, num_envs: int, sim_backend: str, env_cfg_override: Mapping | None,
              privileged: PrivilegedInfoTransform | Mapping[str, Any] | None = None) -> EnvBase:
    if sim_backend not in SIM_BACKENDS:
        raise ValueError(f"sim_backend must be one of {SIM_BACKENDS}, got {sim_backend!r}")
    if env_cfg_override is not None and not isinstance(env_cfg_override, Mapping):
        raise TypeError(
            f"env_cfg_override must be a dict of env constructor kwargs, got {type(env_cfg_override).__name__}"
        )
    privileged = as_privileged_transform(privileged)
    # The collector's engine choice: EnvPool where it runs the task (MuJoCo Playground and Control Suite ids
    # only there), gymnasium where the privileged sources read gymnasium's simulator.
    engine = select_engine(env_name, "auto", env_cfg_override, privileged)
    env = make_gym_id_env(env_name, num_envs, env_kwargs=env_cfg_override, engine=engine)
    return env if privileged is None else TransformedEnv(env, privileged)


def make_collector_actor(
    algo_type: str,
    env: EnvBase,
    *,
    obs_dim: int | None = None,
    action_dim: int | None = None,
    actor_hidden_dim: int = 512,
    use_layer_norm: bool = True,
    actor_kwargs: Mapping[str, Any] | None = None,
):
    """Builds the actor exactly as the learner does (same builder, same dims).

    Returns the bare actor of :func:`~torchrl_unilab.modules.models.make_actor`; the
    learner publishes its weights, the collector wraps it with exploration.
    ``"sac_priv"`` / ``"td3_priv"`` actors read ``["observation", "privileged"]``:
    the env must carry a :class:`~torchrl_unilab.PrivilegedInfoTransform`, whose
    vector is the context :func:`resolve_offpolicy_actor_priv_info` resolves
    from ``info["privileged"]``, or observe ``"privileged"`` itself (a MuJoCo
    Playground robot's critic state); ``obs_dim`` stays the observation's width.

    Examples:
        >>> from torchrl_unilab import BatchedGymEnv, layout_of
        >>> env = BatchedGymEnv("Pendulum-v1", 2)
        >>> actor = make_collector_actor("td3", env, actor_hidden_dim=16)
        >>> [shape for _, shape, _ in layout_of(actor)][:2]
        [(16, 3), (16,)]
    """
    algo, reads_privileged = actor_algo(algo_type)
    obs_dim, action_dim = resolve_collector_actor_dims(env, obs_dim, action_dim)
    in_keys = ["observation"]
    if reads_privileged:
        spec = env.observation_spec.get("privileged", None)
        if spec is None:
            raise ValueError(f"algo_type={algo_type!r} needs the privileged context in the env: pass privileged= "
                             "(a PrivilegedInfoTransform or a dict of its arguments), or use a task that observes it "
                             "(a MuJoCo Playground robot such as 'Go1JoystickFlatTerrain-v1')")
        obs_dim += int(spec.shape[-1])
        in_keys.append("privileged")
    space = env.action_spec.space
    return make_actor(algo, obs_dim, action_dim, hidden_dim=actor_hidden_dim, use_layer_norm=use_layer_norm,
                      action_low=space.low[0], action_high=space.high[0], in_keys=in_keys,
                      **dict(actor_kwargs or {}))


def init_offpolicy_storage(
    replay_buffer: ReplayBuffer,
    env_name: str,
    *,
    num_envs: int = 1,
    sim_backend: str = "mujoco",
    env_cfg_override: Mapping[str, Any] | None = None,
    privileged: PrivilegedInfoTransform | Mapping[str, Any] | None = None,
) -> None:
    """Lays out the shared storage in the learner's process, before any collector starts.

    The layout is the env's real first row (with ``"privileged"`` when
    ``privileged`` is given, as the collectors must be).

    A storage first laid out inside a subprocess would be invisible to the
    learner's copy of the buffer, so the learner calls this once.

    Examples:
        >>> from torchrl_unilab import make_replay_buffer
        >>> rb = make_replay_buffer(100)
        >>> init_offpolicy_storage(rb, "Pendulum-v1")
        >>> "policy_version" in [str(k) for k in storage_keys(rb)]
        True
    """
    env = _make_env(env_name, num_envs, sim_backend, env_cfg_override, privileged)
    try:
        # the row is the env's transition plus the collector's keys; the policy only has to fit the action spec
        init_storage(replay_buffer, probe_row(env, RandomPolicy(env.action_spec), ExplorationType.RANDOM))
    finally:
        env.close()


def make_pack_slots(replay_buffer: ReplayBuffer, batch_size: int, num_slots: int = 2) -> list[TensorDictBase]:
    """Allocates the shared slots that collector-side batch packing fills.

    Each slot is a TensorDict of ``batch_size`` rows with the storage's keys,
    in shared memory, passed to ``off_policy_collector_fn`` as
    ``collector_pack_shared_slots``.

    Examples:
        >>> from torchrl_unilab import make_replay_buffer
        >>> rb = make_replay_buffer(100)
        >>> init_offpolicy_storage(rb, "Pendulum-v1")
        >>> slots = make_pack_slots(rb, batch_size=8)
        >>> len(slots), slots[0].batch_size
        (2, torch.Size([8]))
    """
    if storage_keys(replay_buffer) is None:
        raise ValueError("replay_buffer's storage is not laid out yet; call init_offpolicy_storage() first")
    row = storage_tensors(replay_buffer.storage)[0]
    return [row.expand(batch_size).clone().share_memory_() for _ in range(num_slots)]


def _put_dropping_oldest(message_queue, message: dict, *, attempts: int) -> bool:
    """Puts ``message`` without blocking, dropping the oldest messages to make room; True if none was dropped."""
    for attempt in range(attempts + 1):
        try:
            message_queue.put_nowait(message)
            return attempt == 0
        except queue.Full:
            with contextlib.suppress(queue.Empty):
                message_queue.get_nowait()
            if attempt:
                time.sleep(0.01)  # messages still in our feeder thread reach the pipe meanwhile
    return False


def _get_waiting_out_a_drop(message_queue, *, patience: float = 0.5) -> dict:
    """``get_nowait`` that does not take the worker's drop (:func:`_put_dropping_oldest`) for an empty queue.

    ``multiprocessing.Queue.get_nowait`` raises ``Empty`` while another process
    holds the queue's read lock, which the worker takes to drop the oldest
    message: a reader would then see no message although the queue holds two
    (``test_metrics_queue_drops_oldest_when_full``). While the
    pipe holds data, this retries for up to ``patience`` seconds, which is
    also the most a call waits when a worker was killed holding that lock.
    """
    deadline = time.monotonic() + patience
    while True:
        try:
            return message_queue.get_nowait()
        except queue.Empty:
            if message_queue.empty() or time.monotonic() > deadline:
                raise
            time.sleep(0.001)


def _post_error(message_queue, err: BaseException) -> None:
    # The last message must get through whatever the queue holds: metrics messages give way to it.
    message = {"type": "error", "error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()}
    with contextlib.suppress(Exception):
        _put_dropping_oldest(message_queue, message, attempts=500)


class _MetricsReporter:
    """Puts periodic metrics dicts on a queue without ever blocking the collector."""

    def __init__(self, metrics_queue, metrics: CollectorMetrics, replay_buffer, every_writes: int,
                 index: int = 0) -> None:
        self.queue = metrics_queue
        self.metrics = metrics
        self.index = index
        self.rb = replay_buffer
        self.every = max(1, every_writes)
        self.writes = 0
        self.dropped = 0

    def put(self, message: dict) -> None:
        if not _put_dropping_oldest(self.queue, message, attempts=1):
            self.dropped += 1

    def __call__(self) -> None:
        self.writes += 1
        if self.writes % self.every:
            return
        w = self.metrics.worker(self.index)
        episodes = max(w["episodes"], 1)
        returns, lengths = w["episode_returns"], w["episode_lengths"]
        self.put({
            "type": "metrics",
            "total_steps": w["frames"],
            "buffer_size": len(self.rb),
            "mean_return": sum(returns) / len(returns) if returns else float("nan"),
            "mean_length": sum(lengths) / len(lengths) if lengths else float("nan"),
            "terminated_rate": w["terminated"] / episodes,
            "truncated_rate": w["truncated"] / episodes,
            "timing": {p: w[f"time_{p}"] for p in PHASES},
            "fps": w["fps"],
            "policy_version": w["policy_version"],
            "dropped_messages": self.dropped,
        })


class _Packer:
    """Collector-side batch packing into two shared slots (double buffering)."""

    def __init__(self, request_queue, ready_queue, slots: Sequence[TensorDictBase], replay_buffer, timer) -> None:
        if ready_queue is None or not slots:
            raise ValueError(
                "collector_pack_request_queue needs collector_pack_ready_queue and collector_pack_shared_slots "
                "(see make_pack_slots)"
            )
        self.requests, self.ready, self.slots = request_queue, ready_queue, list(slots)
        self.rb, self.timer = replay_buffer, timer
        self.pending: list[dict] = []

    def __call__(self) -> None:
        with contextlib.suppress(queue.Empty):
            while True:
                self.pending.append(_as_request(self.requests.get_nowait()))
        while self.pending and self.rb.write_count >= self.pending[0]["min_writes"]:
            self.pack(self.pending.pop(0))

    def pack(self, request: dict) -> None:
        with self.timer("pack"):
            batch_size = request["batch_size"]
            slot_id = request["request_id"] % len(self.slots)
            slot = self.slots[slot_id]
            if slot.batch_size[0] != batch_size:
                raise ValueError(f"pack request for {batch_size} rows, but the slots hold {slot.batch_size[0]}")
            generator = torch.Generator().manual_seed(int(request["seed"]))
            # The writer lock keeps other writers out while rows are copied; rows
            # this process wrote are complete already, so no torn row is packed.
            with buffer_lock(self.rb):
                size = len(self.rb)
                index = torch.randint(size, (batch_size,), generator=generator)
                slot.update_(self.rb.storage.get(index).select(*slot.keys(True, True)))
                write_count = self.rb.write_count
        self.ready.put((slot_id, {"request_id": request["request_id"], "seed": request["seed"],
                                  "batch_size": batch_size, "write_count": write_count, "buffer_size": size}))


def _as_request(raw: Any) -> dict:
    if isinstance(raw, Mapping):
        request = dict(raw)
    else:
        batch_size, seed, min_writes, *rest = raw
        request = {"batch_size": batch_size, "seed": seed, "min_writes": min_writes,
                   "request_id": rest[0] if rest else 0}
    request.setdefault("request_id", 0)
    request.setdefault("min_writes", 0)
    return request


class _LockStep:
    """Lock-step as a frame allowance, the collector's own pacing: each learner token allows one more batch.

    After every write a token goes on ``ready_queue``; the loop then waits for
    its allowance, and each token read from ``done_queue`` meanwhile raises it
    by one batch. ``service`` (batch packing) runs while it waits.
    """

    def __init__(self, ready_queue, done_queue, frames_per_batch: int, num_collectors: int, service) -> None:
        if ready_queue is None or done_queue is None:
            raise ValueError("sync_collection=True needs collection_ready_queue and trainer_done_queue")
        self.ready, self.done, self.service = ready_queue, done_queue, service
        self.frames_per_batch = frames_per_batch
        self.control = FrameControl([0] * num_collectors, frames_per_batch)
        self.control.allow(frames_per_batch)  # the first batch

    def batch_written(self) -> None:
        self.ready.put(True)

    def while_waiting(self) -> None:
        if self.service is not None:
            self.service()  # the learner may ask for a packed batch while we wait
        with contextlib.suppress(queue.Empty):
            self.done.get_nowait()
            self.control.allow(self.control.allowed + self.frames_per_batch)


def _trace_path(trace_enabled: bool | str | os.PathLike) -> Path | None:
    if trace_enabled is False or trace_enabled is None:
        return None
    if trace_enabled is True:
        return Path(os.environ.get(_TRACE_DIR_ENV, ".")) / f"offpolicy_collector_trace_{os.getpid()}.json"
    return Path(trace_enabled)


def off_policy_collector_fn(
    stop_event,
    env_name: str,
    num_envs: int,
    replay_buffer: ReplayBuffer,
    weight_sync_name: str,
    weight_param_shapes,
    algo_type: str = "sac",
    actor_hidden_dim: int = 512,
    use_layer_norm: bool = True,
    learning_starts: int = 0,
    metrics_queue=None,
    weight_sync_lock=None,
    sync_collection: bool = False,
    collection_ready_queue=None,
    trainer_done_queue=None,
    env_steps_per_sync: int = 1,
    obs_normalization: bool = False,
    shared_obs_normalizer_stats: SharedWeights | None = None,
    sim_backend: str = "mujoco",
    env_cfg_override: Mapping[str, Any] | None = None,
    obs_dim: int | None = None,
    action_dim: int | None = None,
    actor_kwargs: Mapping[str, Any] | None = None,
    seed: int | None = None,
    trace_enabled: bool | str | os.PathLike = False,
    trace_thread_time: bool = False,
    collector_pack_request_queue=None,
    collector_pack_ready_queue=None,
    collector_pack_shared_slots: Sequence[TensorDictBase] | None = None,
    collector_index: int | None = None,
    num_collectors: int | None = None,
    privileged: PrivilegedInfoTransform | Mapping[str, Any] | None = None,
    **kwargs: Any,
) -> None:
    """Entry point of an off-policy collector subprocess (the original design's signature).

    Runs until ``stop_event`` is set, writing flat transitions into
    ``replay_buffer`` with the same loop as :class:`~torchrl_unilab.OffPolicyCollector`.

    Args:
        stop_event: ends the loop promptly, also while waiting in lock-step mode.
        env_name: a task id; ``sim_backend="mujoco"`` (the only backend) runs it on the
            engine :func:`~torchrl_unilab.select_engine` picks, as the collector does:
            EnvPool's :class:`~torchrl_unilab.EnvPoolEnv` where it implements the task
            (gymnasium's MuJoCo v5 tasks, MuJoCo Playground's, e.g.
            ``"Go1JoystickFlatTerrain-v1"``, the Control Suite's, e.g. ``"CheetahRun-v1"``),
            else :class:`~torchrl_unilab.BatchedGymEnv`. ``env_cfg_override``: its
            constructor kwargs.
        num_envs: envs stepped as one batch.
        replay_buffer: from :func:`~torchrl_unilab.make_replay_buffer`, laid out by
            :func:`init_offpolicy_storage` in the learner's process.
        weight_sync_name, weight_param_shapes, weight_sync_lock: the learner's
            :class:`~torchrl_unilab.SharedWeights` (name, layout or bare shapes, lock).
            The actor reloads whenever the published version advances.
        algo_type, actor_hidden_dim, use_layer_norm, actor_kwargs, obs_dim, action_dim:
            build the actor with :func:`make_collector_actor`, identical to the learner's.
        learning_starts: frames of uniformly random actions first.
        metrics_queue: receives ``{"type": "metrics", ...}`` dicts (``total_steps``,
            ``buffer_size``, ``mean_return``, ``mean_length``, ``terminated_rate``,
            ``truncated_rate``, ``timing`` (seconds per phase), ``fps``,
            ``policy_version``, ``dropped_messages``) after every write,
            never blocking: when full, the oldest message is dropped and counted.
            A clean end puts ``{"type": "stopped", "time": ...}``, a crash
            ``{"type": "error", "error": ..., "traceback": ...}``.
        sync_collection, collection_ready_queue, trainer_done_queue, env_steps_per_sync:
            lock-step mode: run ``env_steps_per_sync`` batched steps, put a token on
            ``collection_ready_queue``, wait for one on ``trainer_done_queue``.
        obs_normalization, shared_obs_normalizer_stats: normalise the actor's input
            with an :class:`~torchrl_unilab.ObservationNormalizer` whose statistics the
            learner publishes through ``shared_obs_normalizer_stats`` (a ``SharedWeights``
            created from the normaliser). The buffer keeps raw observations.
        seed: seeds envs (``seed + collector_index * num_envs + j``) and torch (a hash of ``seed`` and
            ``collector_index``, never ``seed`` itself: the caller's own ``torch.manual_seed(seed)`` draws its
            networks' weights): lock-step runs are bit-identical.
        collector_index, num_collectors: several collectors writing into one buffer
            must differ in their trajectory ids and seeds. Collector ``i`` of ``n``
            gives its trajectories the ids ``i, i + n, i + 2n, ...``. Without
            ``collector_index``, each collector takes the next number of a counter
            kept in the buffer (unique, but in start order: pass it for seeds that
            repeat); without ``num_collectors``, ids are spaced by
            ``MAX_COLLECTORS`` (1024).
        trace_enabled, trace_thread_time: write a Chrome/Perfetto trace (``True``: to
            ``$TORCHRL_UNILAB_TRACE_DIR`` or the working directory; or a file path).
        collector_pack_request_queue, collector_pack_ready_queue, collector_pack_shared_slots:
            collector-side batch packing: a request ``{"batch_size", "seed", "min_writes",
            "request_id"}`` (or a tuple in that order) is served once the buffer's write
            count reaches ``min_writes``: the rows a ``torch.Generator`` seeded with
            ``seed`` picks are copied into slot ``request_id % len(slots)`` and
            ``(slot_id, metadata)`` is posted on the ready queue.
        privileged: a :class:`~torchrl_unilab.PrivilegedInfoTransform` (or a dict of its
            arguments) on the env, writing ``"privileged"`` into every row; needed by
            ``algo_type="sac_priv"`` / ``"td3_priv"``, whose actor reads it, unless the task
            observes it itself (a MuJoCo Playground robot's ``privileged_state``). Lay the
            storage out with the same ``privileged``.
        **kwargs: none accepted; an unknown keyword raises ``TypeError``.

    Examples:
        >>> off_policy_collector_fn(None, "Pendulum-v1", 2, None, "x", [], typo_arg=1)
        Traceback (most recent call last):
        ...
        TypeError: off_policy_collector_fn() got an unexpected keyword argument 'typo_arg'
    """
    if kwargs:
        raise TypeError(f"off_policy_collector_fn() got an unexpected keyword argument {sorted(kwargs)[0]!r}")
    loop = None
    if mp.parent_process() is not None:
        # In a collector subprocess, stop_event (not a terminal's Ctrl-C) ends the loop,
        # so the process never dies in the middle of a buffer write.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        algo, _ = actor_algo(algo_type)
        if isinstance(learning_starts, bool) or not isinstance(learning_starts, int) or learning_starts < 0:
            raise ValueError(f"learning_starts must be an int >= 0, got {learning_starts!r}")
        if not isinstance(env_steps_per_sync, int) or env_steps_per_sync < 1:
            raise ValueError(f"env_steps_per_sync must be an int >= 1, got {env_steps_per_sync!r}")
        if storage_keys(replay_buffer) is None:
            raise ValueError("replay_buffer's storage is not laid out; call init_offpolicy_storage(replay_buffer, "
                             "env_name) in the learner's process before starting the collector")
        index, stride = _collector_slot(replay_buffer, collector_index, num_collectors)
        env = _make_env(env_name, num_envs, sim_backend, env_cfg_override, privileged)
        actor = make_collector_actor(algo_type, env, obs_dim=obs_dim, action_dim=action_dim,
                                     actor_hidden_dim=actor_hidden_dim, use_layer_norm=use_layer_norm,
                                     actor_kwargs=actor_kwargs)
        if obs_normalization and shared_obs_normalizer_stats is None:
            raise ValueError("obs_normalization=True needs shared_obs_normalizer_stats (a SharedWeights "
                             "created from the learner's ObservationNormalizer)")
        policy, normalizer = make_collector_policy(
            actor, algo, env.action_spec_unbatched, obs_norm=bool(obs_normalization),
            obs_dim=resolve_collector_actor_dims(env, obs_dim, action_dim)[0])
        timer = PhaseTimer(_trace_path(trace_enabled), thread_time=trace_thread_time,
                           process_name=f"off_policy_collector {env_name}")
        hooks = LoopHooks(timer=timer)
        if normalizer is not None:
            # the seed's contract: its statistics have their own block, apart from the actor's weights
            hooks.extra_syncs.append((shared_obs_normalizer_stats, normalizer))
        weights = SharedWeights.attach(weight_sync_name, weight_param_shapes, lock=weight_sync_lock)
        metrics = CollectorMetrics(index + 1)
        reporter = (_MetricsReporter(metrics_queue, metrics, replay_buffer, 1, index)
                    if metrics_queue is not None else None)
        if collector_pack_request_queue is not None:
            hooks.between_steps = _Packer(collector_pack_request_queue, collector_pack_ready_queue,
                                          collector_pack_shared_slots or [], replay_buffer, timer)
        lockstep = (_LockStep(collection_ready_queue, trainer_done_queue, num_envs * env_steps_per_sync, stride,
                              hooks.between_steps) if sync_collection else None)

        def after_write() -> bool:
            if reporter is not None:
                reporter()
            if lockstep is not None:
                lockstep.batch_written()
            return True

        hooks.after_write = after_write
        if lockstep is not None:
            hooks.while_waiting = lockstep.while_waiting
        config = WorkerConfig(
            num_workers=stride,  # the trajectory-id stride
            frames_per_batch=num_envs * env_steps_per_sync,
            num_envs=num_envs,
            random_frames=[learning_starts] * stride,
            seed=seed,
            exploration_type=ExplorationType.RANDOM,
            row_keys=storage_keys(replay_buffer),
        )
        loop = WorkerLoop(index, config, env, policy, replay_buffer, weights, metrics,
                          lockstep.control if lockstep is not None else None, stop_event, hooks, sync_module=actor)
        loop.run()
        loop.close()
        loop = None
        if reporter is not None:
            # A last message tells the learner the loop ended cleanly, and when.
            reporter.put({"type": "stopped", "total_steps": metrics.worker(index)["frames"], "time": time.time()})
    except BaseException as err:
        if metrics_queue is not None:
            _post_error(metrics_queue, err)
        raise
    finally:
        if loop is not None:
            loop.close()


#: Trajectory-id stride when ``num_collectors`` is not given: at most this many collectors per buffer.
MAX_COLLECTORS = 1024


def _collector_slot(replay_buffer, collector_index: int | None, num_collectors: int | None) -> tuple[int, int]:
    if num_collectors is not None and (isinstance(num_collectors, bool) or not isinstance(num_collectors, int)
                                       or num_collectors < 1):
        raise ValueError(f"num_collectors must be an int >= 1 or None, got {num_collectors!r}")
    stride = MAX_COLLECTORS if num_collectors is None else num_collectors
    if collector_index is None:
        next_id = getattr(replay_buffer.writer, "next_id", None)
        if next_id is None:
            raise ValueError("collector_index=None takes a number from the buffer's counter, which only buffers "
                             "from make_replay_buffer() keep; pass collector_index")
        collector_index = next_id()
    if isinstance(collector_index, bool) or not isinstance(collector_index, int) or not 0 <= collector_index < stride:
        raise ValueError(f"collector_index must be an int in [0, {stride}) (num_collectors={num_collectors}), "
                         f"got {collector_index!r}")
    return collector_index, stride


def _collector_process_main(idx: int, fn_kwargs: dict, stop_event, error_pipe, started, stderr_fd) -> None:
    """:class:`CollectorProcess`'s entry point, called as :class:`~torchrl_unilab.collectors._processes.WorkerPool`
    calls the collector's workers: the same start-up marks, stderr capture and error report."""
    worker_started(started, idx)
    restore_stderr(stderr_fd)
    code = 0
    try:
        off_policy_collector_fn(stop_event, **fn_kwargs)
    except BaseException as err:  # noqa: BLE001 - everything must reach the parent
        report_error(error_pipe, idx, err)
        code = 1
    error_pipe.close()
    sys.exit(code)  # a normal exit: the metrics queue's feeder thread flushes what it holds


class CollectorProcess:
    """Launches ``off_policy_collector_fn`` in a worker process, watches it, re-raises its errors.

    All keyword arguments go to :func:`off_policy_collector_fn`; ``stop_event`` and
    ``metrics_queue`` are created when not given. ``ctx`` is the multiprocessing
    context; by default the process is forked from the fork server, as
    :class:`~torchrl_unilab.OffPolicyCollector`'s workers are (``start_method``). The process is started and
    watched by the collector's own worker pool, so an error reaches the learner
    as it does from :class:`~torchrl_unilab.OffPolicyCollector`'s workers: a
    :class:`~torchrl_unilab.WorkerError` with the subprocess's traceback, or
    the signal that killed it and what it printed to stderr.
    :meth:`metrics` drains the queue's metrics messages and raises that error.

    Examples:
        >>> CollectorProcess(env_name="Pendulum-v1", num_envs=2, replay_buffer=None, weight_sync_name="x",
        ...                  weight_param_shapes=[], typo=1)
        Traceback (most recent call last):
        ...
        TypeError: off_policy_collector_fn() got an unexpected keyword argument 'typo'
    """

    def __init__(self, *, ctx: mp.context.BaseContext | None = None, **fn_kwargs: Any) -> None:
        accepted = set(inspect.signature(off_policy_collector_fn).parameters) - {"kwargs"}
        unknown = sorted(set(fn_kwargs) - accepted)
        if unknown:
            raise TypeError(f"off_policy_collector_fn() got an unexpected keyword argument {unknown[0]!r}")
        self.ctx = ctx or process_context()
        stop_event = fn_kwargs.pop("stop_event", None)
        fn_kwargs.setdefault("metrics_queue", self.ctx.Queue(maxsize=64))
        self.metrics_queue = fn_kwargs["metrics_queue"]
        self._pool = WorkerPool(self.ctx, target=_collector_process_main, args=(fn_kwargs,), num_workers=1,
                                name="off_policy_collector", stop_event=stop_event)
        self.stop_event = self._pool.stop_event
        self.process = self._pool.procs[0]
        self._pool.start()
        shut_down_at_exit(self)
        self.latest: dict | None = None

    def metrics(self) -> list[dict]:
        """Returns the metrics messages received since the last call; raises on a worker error."""
        out, failed = [], False
        with contextlib.suppress(queue.Empty, EOFError, OSError):
            while True:
                message = _get_waiting_out_a_drop(self.metrics_queue)
                if message.get("type") == "error":
                    failed = True  # the same report comes through the pool, which also names a kill
                    continue
                out.append(message)
        if out:
            self.latest = out[-1]
        if failed:  # it is on its way out; waited for on its sentinel, as the pool's watcher reads its status
            mp.connection.wait([self.process.sentinel], 5.0)
        self.raise_if_failed()
        return out

    def raise_if_failed(self) -> None:
        """Raises :class:`~torchrl_unilab.WorkerError` if the process died with an error."""
        self._pool.raise_if_failed(wait_for_report=5.0)  # a report the exited process left is read first

    def stop(self, timeout: float = 4.0) -> None:
        """Sets ``stop_event`` and joins the process (terminating, then killing it past ``timeout``)."""
        self._pool.stop(timeout)

    def shutdown(self, timeout: float | None = 4.0, raise_on_error: bool = False) -> None:
        """:meth:`stop` under the collectors' name (the interpreter's exit calls it); raises a worker error if asked."""
        self.stop(4.0 if timeout is None else timeout)
        if raise_on_error:
            self._pool.raise_if_failed()

    def __enter__(self) -> CollectorProcess:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
