"""The consumer-side counters of :class:`~torchrl_unilab.OffPolicyCollector`, and their checkpoint.

:class:`CollectorCounters` counts what iteration consumed and what a restored checkpoint counts, and writes
them in TorchRL's collector ``state_dict`` shape (``"worker<i>"``, ``"frames"``, ``"iter"``, ``"traj_pool"``);
env states stay in the workers, so a resumed run starts new episodes.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from torchrl_unilab.collectors._control import STREAM_TRAJ_BITS

__all__ = ["CollectorCounters", "saved_policy_weights"]


class CollectorCounters:
    """What iteration consumed, what a restored checkpoint counts, and the workers' first seed stream.

    Args:
        total_frames: the collector's ``total_frames``.
        num_workers: its workers (trajectory ids are interleaved over them).

    Examples:
        >>> counters = CollectorCounters(total_frames=256, num_workers=2)
        >>> counters.count_batch(64)
        >>> state = counters.state_dict(workers=[(32, 1), (32, 1)], weights=None, frames_written=64,
        ...                             policy_version=1, restarts=0)
        >>> state["frames"], state["iter"], state["worker1"]
        (64, 0, {'frames': 32, 'policy_version': 1})
        >>> resumed = CollectorCounters(total_frames=256, num_workers=2)
        >>> resumed.load_state_dict(state, started=False)
        >>> resumed.frames, resumed.restored, resumed.to_write, resumed.stream_base
        (64, 64, 192, 1)
    """

    def __init__(self, total_frames: int | float, num_workers: int) -> None:
        self.total_frames, self.num_workers = total_frames, num_workers
        self.frames = 0  # counted by iteration, the restored ones included: TorchRL's "frames"
        self.iteration = -1  # TorchRL's "iter"
        self.restored = 0  # frames counted that these workers did not write (a restored checkpoint's)
        self.stream_base = 0  # the workers' first seed stream (trajectory ids); a restored checkpoint moves it on

    @property
    def to_write(self) -> int | float:
        """``total_frames`` less the restored frames: what these workers write."""
        return self.total_frames - self.restored

    def count_batch(self, frames: int) -> None:
        """Counts a batch iteration consumed."""
        self.frames += frames
        self.iteration += 1

    def first_free_traj_id(self, restarts: int) -> int:
        """An id above every trajectory id this run's workers may hand out, after ``restarts`` restarts of a worker
        (see ``_worker.WorkerLoop``). Worker ``i`` on seed stream ``s`` numbers its trajectories
        ``(s * 2**32 + k) * num_workers + i``."""
        return ((self.stream_base + restarts + 1) << STREAM_TRAJ_BITS) * self.num_workers

    def state_dict(self, *, workers: Sequence[tuple[int, int]], weights: Mapping[str, torch.Tensor] | None,
                   frames_written: int, policy_version: int, restarts: int) -> OrderedDict:
        """The counters in TorchRL's collector shape.

        Args:
            workers: each worker's frames collected and the policy version it acts with.
            weights: the policy's weights (``"policy_state_dict"`` of every worker, as in TorchRL), or ``None``.
            frames_written: the frames collected; policy_version: the version published last.
            restarts: the most restarts of any worker (``"traj_pool"`` is the first trajectory id none hands out).
        """
        state = OrderedDict()
        for idx, (frames, version) in enumerate(workers):
            state[f"worker{idx}"] = {"frames": frames, "policy_version": version}
            if weights:
                state[f"worker{idx}"]["policy_state_dict"] = OrderedDict(weights)
        state.update(frames=self.frames, iter=self.iteration, frames_written=frames_written,
                     policy_version=policy_version)
        state["traj_pool"] = {"traj_id": torch.tensor(self.first_free_traj_id(restarts), dtype=torch.int64)}
        return state

    def load_state_dict(self, state_dict: Mapping[str, Any], *, started: bool) -> None:
        """Restores the counters: iteration goes on from the saved ``frames``, which count against
        ``total_frames``; before the workers start, their trajectory ids move past the saved ``"traj_pool"``."""
        frames = int(state_dict.get("frames", 0))
        self.restored += frames - self.frames
        self.frames = frames
        self.iteration = int(state_dict.get("iter", -1))
        traj_pool = state_dict.get("traj_pool")
        if traj_pool is not None and not started:
            # The first seed stream whose trajectory ids all lie at or above the saved first free id.
            block = self.num_workers << STREAM_TRAJ_BITS
            self.stream_base = max(self.stream_base, -(-int(traj_pool["traj_id"]) // block))


def saved_policy_weights(state_dict: Mapping[str, Any]) -> Mapping[str, torch.Tensor] | None:
    """The first ``"policy_state_dict"`` of a worker entry in ``state_dict``, or ``None``.

    Examples:
        >>> saved_policy_weights({"worker0": {"frames": 3}, "worker1": {"policy_state_dict": {"w": 1}}})
        {'w': 1}
    """
    saved = [entry.get("policy_state_dict") for key, entry in state_dict.items()
             if key.startswith("worker") and isinstance(entry, Mapping)]
    return next((entry for entry in saved if entry), None)
