"""TorchRL's ``MultiAsyncCollector`` from ``OffPolicyCollector``'s arguments, for an env whose entries vary in shape.

``OffPolicyCollector``'s rows are fixed-shape tensors in shared memory, laid out from the env's specs before any
worker starts (:mod:`torchrl_unilab.envs.specs`). TorchRL's collector pickles each batch through a pipe instead,
so it collects from sub-envs whose entries differ in shape and from entries that grow; for such an env,
``OffPolicyCollector(...)`` returns one, as TorchRL's ``MultiCollector(sync=...)`` returns the subclass that fits.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from torchrl.collectors import MultiAsyncCollector, MultiCollector

from torchrl_unilab.collectors._arguments import exploration_type_of

__all__ = ["torchrl_collector_for"]

#: Arguments of ours that reach TorchRL's collector otherwise than by name: ``num_collectors`` as ``num_workers``,
#: the seed through ``set_seed``, and TorchRL's own keyword arguments (``torchrl_kwargs``) as they are.
_MAPPED = ("num_collectors", "seed", "torchrl_kwargs")


def torchrl_collector_for(init: Callable[..., None], args: Sequence[Any], kwargs: Mapping[str, Any],
                          varying: Sequence[str]) -> MultiAsyncCollector:
    """TorchRL's ``MultiAsyncCollector`` from the arguments ``args`` / ``kwargs`` given to ``init``.

    ``init`` is ``OffPolicyCollector.__init__``, whose signature names the arguments.

    TorchRL's arguments pass as given (``torchrl_kwargs`` too), ``num_collectors`` as ``num_workers``, and a
    ``seed`` goes to ``set_seed``. One of ours that TorchRL's collector has no use for raises if given other than
    at its default, naming it with the ``varying`` keys that sent the env here.

    Examples:
        >>> from torchrl.testing.mocking_classes import EnvWithDynamicSpec
        >>> def init(self, create_env_fn, policy=None, *, frames_per_batch, total_frames=-1, algo=None): ...
        >>> collector = torchrl_collector_for(init, [[EnvWithDynamicSpec]], dict(frames_per_batch=20, total_frames=20),
        ...                                   ["observation"])
        >>> type(collector).__name__, collector.num_workers
        ('MultiAsyncCollector', 1)
        >>> collector.shutdown()
    """
    signature = inspect.signature(init)
    given = signature.bind(None, *args, **kwargs).arguments
    given.pop(next(iter(signature.parameters)))  # self
    torchrl_params = inspect.signature(MultiCollector.__init__).parameters
    unused = sorted(name for name, value in given.items()
                    if name not in torchrl_params and name not in _MAPPED
                    and not _is_default(value, signature.parameters[name].default))
    if unused:
        raise ValueError(
            f"the env's specs have dimensions of varying size (-1) at {list(varying)}, so OffPolicyCollector hands "
            f"it to TorchRL's MultiAsyncCollector, which takes none of {unused}: leave them at their defaults, or "
            "pad these entries to a fixed shape to collect with OffPolicyCollector's workers"
        )
    torchrl_kwargs = {name: value for name, value in given.items() if name in torchrl_params}
    torchrl_kwargs.update(given.get("torchrl_kwargs") or {})
    if torchrl_kwargs.get("num_workers") is None:
        single = not isinstance(torchrl_kwargs["create_env_fn"], Sequence)
        torchrl_kwargs["num_workers"] = given.get("num_collectors") or (1 if single else None)
    if "exploration_type" in torchrl_kwargs:
        torchrl_kwargs["exploration_type"] = exploration_type_of(torchrl_kwargs["exploration_type"])
    collector = MultiAsyncCollector(**torchrl_kwargs)
    if given.get("seed") is not None:
        collector.set_seed(given["seed"])
    return collector


def _is_default(value: Any, default: Any) -> bool:
    if value is default:
        return True
    try:
        return bool(value == default)
    except Exception:  # noqa: BLE001 - a value that cannot be compared with the default is not it
        return False
