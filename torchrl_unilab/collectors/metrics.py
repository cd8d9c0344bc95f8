"""Collector metrics in shared memory, readable by the main process at any time.

Each worker owns one row of counters and one window of recent episodes; it is
the only writer of its row, the main process only reads. A read can mix two
consecutive updates of a row, which is harmless for monitoring figures.
"""

from __future__ import annotations

import time
from typing import Any

import torch

__all__ = ["CollectorMetrics", "PHASES"]

#: Worker phases timed by the collector, in seconds spent in each.
PHASES = ("env_step", "policy", "buffer_write", "weight_sync", "pack", "wait")

_COUNTERS = (
    "frames",
    "random_frames",
    "nonfinite_dropped",
    "nonfinite_resets",
    "episodes",
    "terminated",
    "truncated",
    "policy_version",
    "start_time",
    "last_time",
    *(f"time_{p}" for p in PHASES),
)
_IDX = {name: i for i, name in enumerate(_COUNTERS)}


class CollectorMetrics:
    """Per-worker counters, phase timers and rolling episode windows.

    Args:
        num_workers: number of rows (one per worker).
        window: how many recent finished episodes each worker keeps.

    Examples:
        >>> m = CollectorMetrics(num_workers=2, window=4)
        >>> m.add(0, frames=16, time_env_step=0.01)
        >>> m.record_episodes(0, returns=[1.5], lengths=[10], terminated=[False])
        >>> m.summary()["frames"], m.summary()["episodes"], m.summary()["truncated"]
        (16, 1, 1)
    """

    def __init__(self, num_workers: int, window: int = 100) -> None:
        self.num_workers = num_workers
        self.window = window
        self.counters = torch.zeros(num_workers, len(_COUNTERS), dtype=torch.float64).share_memory_()
        self.returns = torch.zeros(num_workers, window, dtype=torch.float64).share_memory_()
        self.lengths = torch.zeros(num_workers, window, dtype=torch.float64).share_memory_()

    # ----------------------------------------------------------- worker side
    def start(self, worker: int) -> None:
        """Marks the start of a worker's collection (for frames per second); a replacement keeps the first start."""
        now = time.time()
        if not self.counters[worker, _IDX["start_time"]]:
            self.counters[worker, _IDX["start_time"]] = now
        self.counters[worker, _IDX["last_time"]] = now

    def add(self, worker: int, **increments: float) -> None:
        """Adds to named counters, e.g. ``frames=`` or ``time_env_step=``."""
        row = self.counters[worker]
        for name, value in increments.items():
            row[_IDX[name]] += value
        row[_IDX["last_time"]] = time.time()

    def set(self, worker: int, **values: float) -> None:
        """Sets named counters, e.g. ``policy_version=``."""
        for name, value in values.items():
            self.counters[worker, _IDX[name]] = value

    def record_episodes(self, worker: int, returns, lengths, terminated) -> None:
        """Appends finished episodes to the worker's rolling window."""
        row = self.counters[worker]
        for ret, length, term in zip(returns, lengths, terminated):
            slot = int(row[_IDX["episodes"]]) % self.window
            self.returns[worker, slot] = float(ret)
            self.lengths[worker, slot] = float(length)
            row[_IDX["episodes"]] += 1
            row[_IDX["terminated" if term else "truncated"]] += 1

    # ------------------------------------------------------------- main side
    def worker(self, worker: int) -> dict[str, Any]:
        """One worker's figures."""
        row = self.counters[worker].clone()
        n = min(int(row[_IDX["episodes"]]), self.window)
        elapsed = max(float(row[_IDX["last_time"]] - row[_IDX["start_time"]]), 1e-9)
        out: dict[str, Any] = {name: float(row[i]) for i, name in enumerate(_COUNTERS)}
        for key in ("frames", "random_frames", "nonfinite_dropped", "nonfinite_resets", "episodes", "terminated",
                    "truncated", "policy_version"):
            out[key] = int(out[key])
        out["fps"] = out["frames"] / elapsed if out["frames"] else 0.0
        out["episode_returns"] = self.returns[worker, :n].tolist()
        out["episode_lengths"] = [int(x) for x in self.lengths[worker, :n].tolist()]
        return out

    def summary(self) -> dict[str, Any]:
        """Totals over workers plus a ``"workers"`` list of per-worker figures.

        ``fps`` is the sum of the workers' rates; ``mean_return`` and
        ``mean_length`` average each worker's rolling window (``nan`` if no
        episode finished yet); ``time`` maps each phase to its total seconds.
        """
        workers = [self.worker(i) for i in range(self.num_workers)]
        returns = [r for w in workers for r in w["episode_returns"]]
        lengths = [x for w in workers for x in w["episode_lengths"]]
        out: dict[str, Any] = {
            key: sum(w[key] for w in workers)
            for key in ("frames", "random_frames", "nonfinite_dropped", "nonfinite_resets", "episodes", "terminated",
                        "truncated", "fps")
        }
        out["policy_version"] = min(w["policy_version"] for w in workers)
        out["mean_return"] = sum(returns) / len(returns) if returns else float("nan")
        out["mean_length"] = sum(lengths) / len(lengths) if lengths else float("nan")
        out["time"] = {p: sum(w[f"time_{p}"] for w in workers) for p in PHASES}
        out["workers"] = workers
        return out
