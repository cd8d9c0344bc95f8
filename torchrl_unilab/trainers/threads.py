"""The learner's torch threads: a fixed count, or the cores that collection leaves idle (``optim.num_threads: auto``).

At one update per frame on a CPU machine the learner is the bottleneck: its
workers write their batch in well under a core and then wait at the frame cap
(:class:`~torchrl_unilab.trainers.training.UTDController`). Their time outside
that wait, summed over workers, is the number of cores collection uses; the
rest can run the learner's matrix products.

:func:`flush_denormals` is the other per-thread setting of the learner: it makes
the CPU treat denormal floats as zero, which a long run's optimizer state
otherwise fills with.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch

from torchrl_unilab.collectors.metrics import PHASES

__all__ = ["AUTO", "LearnerThreads", "collection_busy_seconds", "cpu_seconds", "flush_denormals", "machine_cores"]

#: The setting that makes the thread count follow the workers.
AUTO = "auto"

#: Worker phases that occupy a core; ``wait`` is the time at the frame cap.
BUSY_PHASES = tuple(p for p in PHASES if p != "wait")


def machine_cores() -> int:
    """The cores this process may run on (its CPU affinity; ``os.cpu_count()`` where that is not known).

    Examples:
        >>> machine_cores() >= 1
        True
    """
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def cpu_seconds() -> tuple[float, float] | None:
    """CPU seconds so far: of this process's cores, busy with anything, and of this process alone.

    Two readings a wall-clock interval apart give the cores that everything
    else on the machine took meanwhile (other jobs, other trainings, this
    learner's own workers): the first difference less the second, divided by
    the interval. The machine's figure sums ``/proc/stat``'s busy times (user,
    nice, system, irq, softirq, and steal, which a VM's host took) over the
    CPUs of this process's affinity; ``None`` where ``/proc/stat`` cannot be read.

    Examples:
        >>> machine, own = cpu_seconds()
        >>> machine >= own > 0
        True
    """
    try:
        allowed = {f"cpu{i}" for i in os.sched_getaffinity(0)}
        with open("/proc/stat") as stat:
            lines = [line.split() for line in stat if line.startswith("cpu")]
    except (AttributeError, OSError):
        return None
    # user nice system idle iowait irq softirq steal: everything but idle and iowait is busy
    ticks = sum(sum(int(v) for i, v in enumerate(f[1:9]) if i not in (3, 4)) for f in lines if f[0] in allowed)
    return ticks / os.sysconf("SC_CLK_TCK"), time.process_time()


def collection_busy_seconds(metrics: Mapping[str, Any]) -> float:
    """Seconds the workers have spent outside their wait at the frame cap, summed over workers and phases.

    Two readings of an :class:`~torchrl_unilab.OffPolicyCollector`'s ``metrics()`` a
    wall-clock interval apart give the cores collection used in between: the
    difference divided by the interval.

    Examples:
        >>> collection_busy_seconds({"time": {"env_step": 3.0, "policy": 1.0, "wait": 50.0}})
        4.0
    """
    phases = metrics["time"]
    return float(sum(phases.get(p, 0.0) for p in BUSY_PHASES))


def flush_denormals(enabled: bool = True) -> bool:
    """Makes this process's torch CPU threads treat denormal floats as zero (``torch.set_flush_denormal``).

    A ReLU unit that stops firing gets zero gradients, and Adam's moments of its
    weights then decay through the denormal range (below 1.2e-38), where x86 CPUs
    compute many times slower; so late in a training run a share of the updates'
    arithmetic runs on denormals. Flushed, they are read and written as zero, and
    values that small change no loss. ``benchmarks/learner_throughput.py
    --checkpoint DIR`` measures the update from a trained run's state with and
    without flushing (and the fraction of Adam's moments that are denormal).

    The flag is per thread, and torch's intra-op threads copy it from the main
    thread when they start: call this before the first parallel torch op of the
    process (the recipes call it first in ``main``). Returns whether every
    intra-op thread flushes, checked on a tensor of denormals large enough to be
    split over all of them (``False`` also where the CPU cannot flush, or with
    ``enabled=False``).

    Examples:
        >>> tiny = torch.from_numpy(np.ones(3, np.int32).view(np.float32))  # 1.4e-45, a denormal
        >>> _ = flush_denormals()
        >>> (tiny * 1.0).tolist()  # read as zero
        [0.0, 0.0, 0.0]
        >>> _ = torch.set_flush_denormal(False)  # torch's default again
    """
    if not torch.set_flush_denormal(bool(enabled)) or not enabled:
        return False
    # 1.4e-45 from its bits, so that no torch op (and no thread) touches it before the check
    pieces = max(torch.get_num_threads(), 1)
    denormal = torch.from_numpy(np.ones(4 * 32_768 * pieces, np.int32).view(np.float32))
    return not bool((denormal * 1.0).any())


class LearnerThreads:
    """Sets ``torch.set_num_threads`` for the learner: ``setting`` threads, or with ``"auto"`` the idle cores.

    A fixed count is set once, here. With ``"auto"`` the learner starts on one
    thread, and :meth:`step`, called between two updates, reads the
    collector's phase timers at the first update and then every ``interval_s``
    seconds: the cores collection
    used over that interval (:func:`collection_busy_seconds`), or, where more,
    the cores that every process but the learner's took (:func:`cpu_seconds`:
    other jobs, a second training), leave ``free = cores - used`` for the
    learner. The thread count moves by one,
    up when ``free >= threads + 1 - up_slack``, down when
    ``free < threads - down_slack``; the gap between the two thresholds
    keeps a count that sits near one of them from flipping back and forth.
    So at a high update-to-data ratio, where the workers wait at the cap,
    the learner takes the idle cores, and when collection is the bottleneck
    (a low ratio, many workers) it gives them back.

    Why the whole machine: a learner that saw only its own workers would take
    cores that another job (a second ``auto`` training beside it) uses too, and
    oversubscribed threads run far slower than one thread each.

    Where ``read_metrics`` returns ``None`` (the recipes' Ray collector, whose
    node actors answer only between their batches), ``"auto"`` stays at one thread.

    ``benchmarks/learner_throughput.py`` measures the update on one and two threads, and the
    SAC recipe end to end with ``optim.num_threads=auto`` against ``1``.

    Args:
        setting: a thread count (an int >= 1) or ``"auto"``.
        read_metrics: returns the collector's ``metrics()`` (its ``"time"`` entry is read), or ``None``
            when there is nothing to read; no callable holds ``"auto"`` at one thread.

    Keyword Args:
        cores: the cores to share (default: :func:`machine_cores`).
        interval_s: seconds between two readings.
        up_slack, down_slack: the thresholds' margins, in cores.
        clock: the time source (seconds), for tests.
        read_cpu: returns the CPU seconds of the machine and of this process (:func:`cpu_seconds`);
            ``None`` counts collection only (with a scripted ``clock``, for tests).

    Examples:
        >>> readings = iter([{"time": {"env_step": 0.0, "wait": 0.0}}, {"time": {"env_step": 0.5, "wait": 9.5}}])
        >>> now = iter([0.0, 10.0])
        >>> threads = LearnerThreads("auto", lambda: next(readings), cores=2, clock=lambda: next(now), read_cpu=None)
        >>> threads.step()  # the first reading: workers not yet measured, one thread
        1
        >>> threads.step()  # the workers used 0.05 of a core over 10 s: the learner takes the second one
        2
        >>> torch.set_num_threads(1)
    """

    def __init__(
        self,
        setting: int | str,
        read_metrics: Callable[[], Mapping[str, Any] | None] | None = None,
        *,
        cores: int | None = None,
        interval_s: float = 5.0,
        up_slack: float = 0.25,
        down_slack: float = 0.5,
        clock: Callable[[], float] = time.monotonic,
        read_cpu: Callable[[], tuple[float, float] | None] | None = cpu_seconds,
    ) -> None:
        self.auto = setting == AUTO
        if not self.auto and (isinstance(setting, bool) or not isinstance(setting, int) or setting < 1):
            raise ValueError(f"optim.num_threads must be a thread count >= 1 or {AUTO!r}, got {setting!r}")
        self.cores = machine_cores() if cores is None else int(cores)
        self.interval_s, self.up_slack, self.down_slack = float(interval_s), float(up_slack), float(down_slack)
        self._read = read_metrics if self.auto else None
        self._clock = clock
        self.threads = 1 if self.auto else int(setting)
        self.changes = 0
        """how many times ``"auto"`` changed the count"""
        self.collection_cores = float("nan")
        """the cores collection used over the last interval (``nan`` before the first)"""
        self.other_cores = float("nan")
        """the cores every process but the learner's took over the last interval, its workers included
        (``nan`` before the first, or without ``read_cpu``)"""
        torch.set_num_threads(self.threads)
        self._read_cpu = read_cpu if self.auto else None
        # time, collection's busy seconds, and the CPU seconds of the machine and of the learner, at the last reading
        self._last: tuple[float, float, tuple[float, float] | None] | None = None

    def step(self) -> int:
        """Between two updates: with ``"auto"``, every ``interval_s`` seconds, moves the thread count by one
        towards the idle cores. Returns the thread count."""
        if self._read is None:
            return self.threads
        now = self._clock()
        if self._last is not None and now - self._last[0] < self.interval_s:
            return self.threads
        metrics = self._read()
        if metrics is None:
            return self.threads
        busy = collection_busy_seconds(metrics)
        cpu = self._read_cpu() if self._read_cpu is not None else None
        last, self._last = self._last, (now, busy, cpu)
        if last is None:  # the first reading, at the first update
            return self.threads
        interval = max(now - last[0], 1e-9)
        # A replaced worker's row may restart its timers: a negative difference reads as no use.
        self.collection_cores = used = max(busy - last[1], 0.0) / interval
        if cpu is not None and last[2] is not None:
            self.other_cores = max((cpu[0] - last[2][0]) - (cpu[1] - last[2][1]), 0.0) / interval
            used = max(used, self.other_cores)
        free = self.cores - used
        target = self.threads
        if self.threads < self.cores and free >= self.threads + 1 - self.up_slack:
            target = self.threads + 1
        elif self.threads > 1 and free < self.threads - self.down_slack:
            target = self.threads - 1
        if target != self.threads:
            self.threads, self.changes = target, self.changes + 1
            torch.set_num_threads(target)
        return self.threads
