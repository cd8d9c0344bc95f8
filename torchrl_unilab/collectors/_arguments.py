"""How ``OffPolicyCollector`` reads its arguments: TorchRL's parameters it takes, and the checks of its own.

Every argument is checked once, in the constructor, with an error that names
the argument, what was given and what is accepted. ``MultiAsyncCollector``'s
parameters that this collector takes only at some values are listed in
``_RESTRICTED`` with the reason, which the error gives.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torchrl.collectors import MultiAsyncCollector
from torchrl.envs.utils import ExplorationType

from torchrl_unilab._checks import check_int

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
