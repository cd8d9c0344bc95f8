"""The env of an :class:`~torchrl_unilab.OffPolicyCollector`, as seen from the training process.

The envs run in the worker processes. What this process can still answer is a
snapshot of the specs taken at construction (and anything, while an env
instance lives here: a thread worker's, or the construction probe's).
``collector.getattr_env(name)`` and ``collector.env.<name>`` (TorchRL's
single-process ``Collector`` attribute, which its trainers read) go through
:class:`EnvView`.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable
from typing import Any

from torchrl.envs import EnvBase

__all__ = ["EnvAttributeElsewhere", "EnvView"]

#: EnvBase attributes answered after the envs moved to the workers.
SPEC_ATTRS = tuple(
    f"{prefix}{kind}_spec{suffix}"
    for prefix in ("", "full_") for kind in ("observation", "action", "reward", "done", "state")
    for suffix in ("", "_unbatched")
) + ("batch_size", "specs", "action_keys", "reward_keys", "done_keys")


class EnvAttributeElsewhere(NotImplementedError, AttributeError):
    """An env attribute this process cannot read. An ``AttributeError`` too, so that ``hasattr(collector.env, name)``
    is ``False`` and ``getattr(collector.env, name, default)`` gives the default, as for a missing attribute."""


class EnvView:
    """Attribute reads of an env that may live elsewhere: the specs from a snapshot, the rest from a live env.

    Args:
        env: the env as given, probed once for its specs.
        live_env: returns an env instance of this process to read other attributes from, or ``None``.

    Examples:
        >>> from torchrl.envs import GymEnv
        >>> view = EnvView(GymEnv("Pendulum-v1"), live_env=lambda: None)
        >>> view.action_spec.shape, hasattr(view, "unwrapped_envs")
        (torch.Size([1]), False)
    """

    def __init__(self, env: EnvBase, live_env: Callable[[], EnvBase | None]) -> None:
        specs = {}
        for attr in SPEC_ATTRS:
            with contextlib.suppress(AttributeError, KeyError):
                value = getattr(env, attr)
                specs[attr] = value.clone() if hasattr(value, "clone") else copy.copy(value)
        self._specs, self._live_env = specs, live_env

    def get(self, attr: str) -> Any:
        """The attribute ``attr`` of the env; :class:`EnvAttributeElsewhere` if only a worker has it."""
        if attr in self._specs:
            return self._specs[attr]
        env = self._live_env()
        if env is None:
            raise EnvAttributeElsewhere(
                f"getattr_env({attr!r}): the envs live in the worker processes; specs and batch_size are "
                "available here, other attributes are not"
            )
        return getattr(env, attr)

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__") or attr in ("_specs", "_live_env"):  # dunders, and this view's own fields
            raise AttributeError(attr)
        return self.get(attr)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(batch_size={self.get('batch_size')})"
