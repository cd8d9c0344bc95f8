"""How ``OffPolicyCollector`` reads its arguments: TorchRL's parameters it takes, and the checks of its own.

Every argument is checked once, in the constructor, with an error that names
the argument, what was given and what is accepted (:func:`check_arguments`, which
gives the frozen :class:`CollectorSpec` the set-up steps read). ``MultiAsyncCollector``'s
parameters that this collector takes only at some values are listed in
``_RESTRICTED`` with the reason, which the error gives.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torchrl.collectors import MultiAsyncCollector
from torchrl.data import OfflineToOnlineReplayBuffer, ReplayBuffer
from torchrl.envs.utils import ExplorationType

from torchrl_unilab._checks import check_int
from torchrl_unilab._torchrl_private import validate_traj_format
from torchrl_unilab.collectors._processes import process_context
from torchrl_unilab.collectors._worker import NONFINITE_MODES
from torchrl_unilab.data.local_writer import local_write_reason
from torchrl_unilab.data.resolve import resolve_replay_buffer
from torchrl_unilab.envs.privileged import PrivilegedInfoTransform, as_privileged_transform
from torchrl_unilab.envs.resolve import GymIdOptions
from torchrl_unilab.envs.torchrl_stack import check_engine

_TORCHRL_PARAMS = inspect.signature(MultiAsyncCollector.__mro__[1].__init__).parameters

#: ``MultiAsyncCollector`` parameters this collector takes only at some values: name -> (accepted values, why).
_RESTRICTED = {
    "reset_at_each_iter": ((False,), "workers keep their episodes running across batches; bound episodes "
                                      "with max_frames_per_traj"),
    "reset_when_done": ((True,), "off-policy transitions need episodes that reset when done"),
    "collector_class": ((None,), "OffPolicyCollector runs its own worker loop"),
    "preemptive_threshold": ((None,), "preemption applies to synchronous collectors; this one is asynchronous"),
    "num_threads": ((None,), "the learner's thread count is yours to set with torch.set_num_threads; workers "
                             "take num_sub_threads"),
    "compact_obs": ((False,), "rows store observation and next observation in full"),
    "auto_register_policy_transforms": ((None, False), "the policy is used as given"),
    # TorchRL's single-process ``Collector`` (its trainer configs' ``collector: sync``) takes these too.
    "backend": ((None, "direct", "process"), "workers are local processes; for a Ray cluster use "
                                             "torchrl_unilab.RayOffPolicyCollector"),
    "backend_options": ((None,), "workers are local processes"),
    "sync": ((None, False), "this collector is asynchronous: each batch comes from whichever worker has one"),
    "track_traj_ids": ((True,), "rows always carry ('collector', 'traj_ids')"),
    "return_same_td": ((False,), "each batch is a new TensorDict"),
    "interruptor": ((None,), "preemption applies to synchronous collectors; this one is asynchronous"),
}
#: Parameters of TorchRL's ``Collector`` that ``MultiAsyncCollector`` does not have, with their defaults.
_COLLECTOR_PARAMS = {"backend": None, "backend_options": None, "sync": None, "track_traj_ids": True,
                     "return_same_td": False, "interruptor": None}
#: Accepted at any value (the constructor's docstring says what each does here).
_ACCEPTED = ("set_truncated", "use_buffers", "cat_results", "no_cuda_sync", "trust_policy", "worker_idx",
             "compile_policy", "cudagraph_policy", "weight_updater", "weight_recv_schemes")
#: TorchRL's device arguments. Workers act and store on CPU whatever they name; what the user sees follows them.
DEVICE_PARAMS = ("device", "storing_device", "env_device", "policy_device")


def exploration_type_of(value: ExplorationType | str) -> ExplorationType:
    if isinstance(value, ExplorationType):
        return value
    names = [member.name for member in ExplorationType]
    if isinstance(value, str) and value.upper() in names:
        return ExplorationType[value.upper()]
    raise ValueError(f"exploration_type must be an ExplorationType or one of {names}, got {value!r}")


def check_device(name: str, value: Any) -> None:
    """Checks one of TorchRL's device arguments: a device, a device name, ``None``, or a list of them (one per worker).

    A device this machine cannot use raises torch's own error, as TorchRL's collectors do at their first copy to
    it, with the argument's name in front.

    Examples:
        >>> check_device("storing_device", "cpu")
        >>> check_device("device", "gpu0")
        Traceback (most recent call last):
        ...
        ValueError: device must be a torch device or None (or a list, one per worker), got 'gpu0'
    """
    values = value if isinstance(value, (list, tuple)) else [value]
    for each in values:
        if each is None:
            continue
        try:
            device = torch.device(each)
        except (RuntimeError, TypeError):
            raise ValueError(f"{name} must be a torch device or None (or a list, one per worker), "
                             f"got {value!r}") from None
        if device.type != "cpu":
            try:
                torch.empty(0, device=device)
            except (RuntimeError, AssertionError) as err:
                raise type(err)(f"{name}={value!r}: {err}") from err


def frames_per_batch_of(value: int | Sequence[int], num_workers: int) -> int:
    """Frames per batch. A sequence holds one value per worker, as TorchRL's multi-process collectors take it;
    ``MultiAsyncCollector`` then makes each batch (one worker's) their sum, and so does this collector."""
    if isinstance(value, Sequence) and not isinstance(value, str):
        values = list(value)
        if len(values) != num_workers or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1
                                                 for v in values):
            raise ValueError(f"frames_per_batch must be an int >= 1 or a list of num_workers={num_workers} of them "
                             f"(one per worker), got {value!r}")
        return sum(values)
    return check_int("frames_per_batch", value, 1)


def round_total_frames(total_frames: int | None, frames_per_batch: int) -> int | float:
    if total_frames is None or total_frames < 0:
        return float("inf")
    check_int("total_frames", total_frames, 1)
    return -(-total_frames // frames_per_batch) * frames_per_batch


def check_torchrl_kwargs(kwargs: Mapping[str, Any]) -> None:
    for name, value in kwargs.items():
        if name not in _TORCHRL_PARAMS and name not in _COLLECTOR_PARAMS:
            raise TypeError(f"OffPolicyCollector() got an unexpected keyword argument {name!r}")
        if name in _ACCEPTED:
            continue
        default = _COLLECTOR_PARAMS[name] if name in _COLLECTOR_PARAMS else _TORCHRL_PARAMS[name].default
        accepted, why = _RESTRICTED.get(name, ((default,), "not supported"))
        if not any(value is a or (type(value) is type(a) and value == a) for a in accepted):
            raise ValueError(
                f"OffPolicyCollector takes the TorchRL collector parameter {name!r} only as one of "
                f"{list(accepted)}, got {value!r}: {why}"
            )


@dataclasses.dataclass(frozen=True)
class CollectorSpec:
    """``OffPolicyCollector``'s own arguments, checked: what its set-up steps read.

    Attributes:
        num_workers: as given (``num_collectors`` too), ``None`` to take it from the envs.
        total_frames: ``-1`` or an int ``>= 1``, before rounding to whole batches.
        init_random_frames: ``0`` for TorchRL's "none" (``None`` or below 0).
        max_frames_per_traj: ``None`` for TorchRL's "no limit" (``None``, or 0 or below).
        replay_buffer: the buffer the rows go into (:func:`~torchrl_unilab.data.resolve.resolve_replay_buffer`: an
            ``OfflineToOnlineReplayBuffer``'s online part), or ``None``.
        local_write_reason: why this process extends ``replay_buffer`` rather than the workers, or ``None``.
        gym_ids: how a gymnasium id in ``create_env_fn`` is built.
        devices: TorchRL's four device arguments, by name, as given (each checked).
    """

    num_workers: int | None
    total_frames: int
    init_random_frames: int
    exploration_type: ExplorationType
    max_frames_per_traj: int | None
    nonfinite: str
    max_worker_restarts: int
    start_method: str
    metrics_window: int
    num_sub_threads: int
    trajs_per_batch: int | None
    trajs_per_write: int | None
    traj_format: str | None
    replay_buffer: ReplayBuffer | None
    local_write_reason: str | None
    privileged: PrivilegedInfoTransform | None
    gym_ids: GymIdOptions
    split_trajs: bool
    set_truncated: bool
    trust_policy: bool
    devices: Mapping[str, Any]


#: what a Ray collector does when a node's actor is lost for good
ON_NODE_FAILURE = ("raise", "continue")


def check_ray_arguments(*, num_nodes: int, num_workers: int, num_envs: int, init_random_frames: int,
                        max_node_restarts: int, on_node_failure: str) -> None:
    """The checks of :class:`~torchrl_unilab.collectors.ray_collector.RayOffPolicyCollector`'s own arguments.

    Examples:
        >>> check_ray_arguments(num_nodes=2, num_workers=1, num_envs=4, init_random_frames=0, max_node_restarts=0,
        ...                     on_node_failure="drop")
        Traceback (most recent call last):
        ...
        ValueError: on_node_failure must be one of ('raise', 'continue'), got 'drop'
    """
    for name, value, minimum in (("num_nodes", num_nodes, 1), ("num_workers", num_workers, 1),
                                 ("num_envs", num_envs, 1), ("init_random_frames", init_random_frames, 0),
                                 ("max_node_restarts", max_node_restarts, 0)):
        check_int(name, value, minimum)
    if on_node_failure not in ON_NODE_FAILURE:
        raise ValueError(f"on_node_failure must be one of {ON_NODE_FAILURE}, got {on_node_failure!r}")


def check_arguments(
    *, torchrl_kwargs: Mapping[str, Any], devices: Mapping[str, Any],
    replay_buffer: ReplayBuffer | OfflineToOnlineReplayBuffer | None,
    num_workers: int | None, num_collectors: int | None, total_frames: int | None, init_random_frames: int | None,
    exploration_type: ExplorationType | str, max_frames_per_traj: int | None, nonfinite: str,
    max_worker_restarts: int, start_method: str, metrics_window: int, num_sub_threads: int,
    trajs_per_batch: int | None, trajs_per_write: int | None, traj_format: str | None,
    privileged: PrivilegedInfoTransform | Mapping[str, Any] | None, split_trajs: bool | None, num_envs: int,
    env_kwargs: Mapping[str, Any] | None, stagger_resets: bool, engine: str, threads_per_worker: int,
) -> CollectorSpec:
    """Checks ``OffPolicyCollector``'s arguments, each once, before any work; raises an error naming the first bad one.

    Examples:
        >>> spec = check_arguments(
        ...     torchrl_kwargs={}, devices={}, replay_buffer=None, num_workers=None, num_collectors=2,
        ...     total_frames=-1, init_random_frames=-1, exploration_type="random", max_frames_per_traj=-1,
        ...     nonfinite="raise", max_worker_restarts=0, start_method="forkserver", metrics_window=100,
        ...     num_sub_threads=1, trajs_per_batch=None, trajs_per_write=None, traj_format=None, privileged=None,
        ...     split_trajs=None, num_envs=4, env_kwargs=None, stagger_resets=True, engine="auto",
        ...     threads_per_worker=1)
        >>> spec.num_workers, spec.init_random_frames, spec.max_frames_per_traj, spec.exploration_type.name
        (2, 0, None, 'RANDOM')
    """
    check_torchrl_kwargs(torchrl_kwargs)
    for name in DEVICE_PARAMS:
        check_device(name, devices.get(name))
    if nonfinite not in NONFINITE_MODES:
        raise ValueError(f"nonfinite must be one of {NONFINITE_MODES}, got {nonfinite!r}")
    if num_collectors is not None:  # TorchRL's Collector(backend="process") names the workers so
        if num_workers is not None and num_workers != num_collectors:
            raise ValueError(f"num_collectors={num_collectors} and num_workers={num_workers} disagree; pass one")
        num_workers = num_collectors
    process_context(start_method)  # refuses an unknown method here, before any work
    if max_frames_per_traj is not None:
        max_frames_per_traj = check_int("max_frames_per_traj", max_frames_per_traj, -(2**62))
        # TorchRL reads 0 or less as "no limit" (REDQ's helpers pass -1).
        max_frames_per_traj = max_frames_per_traj if max_frames_per_traj > 0 else None
    if total_frames is not None and total_frames < 0 and total_frames != -1:
        raise ValueError(f"total_frames must be -1 (no limit) or an int >= 1, got {total_frames!r}")
    if init_random_frames is None or (isinstance(init_random_frames, int) and init_random_frames < 0):
        init_random_frames = 0  # TorchRL reads None and values below 0 as none (its examples pass -1)
    trajs_per_batch = None if trajs_per_batch is None else check_int("trajs_per_batch", trajs_per_batch, 1)
    replay_buffer = resolve_replay_buffer(replay_buffer)
    if split_trajs and replay_buffer is not None:
        raise ValueError(
            "split_trajs=True splits the batches this collector yields; with a replay_buffer, workers write "
            "flat transitions and iteration yields None. Pass split_trajs=False, or no replay_buffer"
        )
    return CollectorSpec(
        num_workers=num_workers,
        total_frames=-1 if total_frames is None else total_frames,
        init_random_frames=check_int("init_random_frames", init_random_frames, 0),
        exploration_type=exploration_type_of(exploration_type),
        max_frames_per_traj=max_frames_per_traj,
        nonfinite=nonfinite,
        max_worker_restarts=check_int("max_worker_restarts", max_worker_restarts, 0),
        start_method=start_method,
        metrics_window=check_int("metrics_window", metrics_window, 1),
        num_sub_threads=check_int("num_sub_threads", num_sub_threads, 1),
        trajs_per_batch=trajs_per_batch,
        trajs_per_write=None if trajs_per_write is None else check_int("trajs_per_write", trajs_per_write, 1),
        traj_format=validate_traj_format(traj_format, trajs_per_batch, has_replay_buffer=replay_buffer is not None),
        replay_buffer=replay_buffer,
        local_write_reason=local_write_reason(replay_buffer, trajs_per_batch),
        privileged=as_privileged_transform(privileged),
        gym_ids=GymIdOptions(num_envs=num_envs, env_kwargs=env_kwargs, stagger_resets=stagger_resets,
                             engine=check_engine(engine),
                             threads=check_int("threads_per_worker", threads_per_worker, 1)),
        split_trajs=bool(split_trajs),
        set_truncated=bool(torchrl_kwargs.get("set_truncated")),
        trust_policy=bool(torchrl_kwargs.get("trust_policy")),
        devices={name: devices.get(name) for name in DEVICE_PARAMS},
    )
