"""What ``map_fn`` and ``get_distant_attr`` reach in an :class:`~torchrl_unilab.OffPolicyCollector`'s workers.

TorchRL's multi-process collectors send these calls down a pipe to each
worker's inner ``Collector``. Our workers run a batched loop with no command
channel, so the calls are answered here, in the parent, from what the worker
shares with it: its index, the replay buffer (the same shared storage), and
the policy as last published. Anything that lives only in the worker process
(its envs, its per-env noise) raises an ``AttributeError`` that says so.
"""

from __future__ import annotations

from typing import Any

from torchrl_unilab._torchrl_private import resolve_attr

__all__ = ["WorkerView"]


class WorkerView:
    """One worker as ``map_fn`` / ``get_distant_attr`` see it.

    Args:
        worker_idx: the worker's index.
        replay_buffer: the buffer the workers write (``None`` without one).
        policy: the policy the workers act with, as last published.

    Examples:
        >>> view = WorkerView(1, replay_buffer=None, policy=None)
        >>> view.get_distant_attr("worker_idx")
        1
        >>> view.get_distant_attr("env")
        Traceback (most recent call last):
        ...
        AttributeError: OffPolicyCollector answers get_distant_attr / map_fn in this process, ...
    """

    #: The attributes a view answers for.
    SHARED = ("worker_idx", "replay_buffer", "policy")

    def __init__(self, worker_idx: int, replay_buffer: Any, policy: Any) -> None:
        self.worker_idx = worker_idx
        self.replay_buffer = replay_buffer
        self.policy = policy

    def get_distant_attr(self, attr: str) -> Any:
        """The attribute at the dotted path ``attr`` (e.g. ``"replay_buffer.write_count"``)."""
        head = attr.split(".", 1)[0].split("[", 1)[0]
        if head not in (*self.SHARED, "get_distant_attr"):
            raise AttributeError(
                "OffPolicyCollector answers get_distant_attr / map_fn in this process, from what the workers share "
                f"with it: {', '.join(self.SHARED)}; {head!r} lives only in the worker process. Use getattr_env() "
                "for the env's specs, or metrics() / stats('per_worker') for per-worker figures"
            )
        return resolve_attr(self, attr)
