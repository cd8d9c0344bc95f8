"""Per-phase timing of the worker loop, optionally written as a Chrome/Perfetto trace.

:class:`PhaseTimer` accumulates the seconds a worker spends in each phase
(weight check, actor inference, env step, buffer write, pack, wait) for the
collector's metrics. Given a path, it also records one trace slice per phase
and writes a Chrome trace-event JSON file that https://ui.perfetto.dev (or
``chrome://tracing``) opens directly.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["PhaseTimer", "TRACE_PHASES"]

#: Slice names the worker loop records, in loop order.
TRACE_PHASES = ("weight check", "actor inference", "env step", "buffer write", "pack", "wait")


class PhaseTimer:
    """Times named phases; with ``trace_path`` also records Chrome trace slices.

    Args:
        trace_path: where :meth:`save` writes the trace JSON; ``None`` records no slices.
        thread_time: also record the thread's CPU time of each slice (``tts``/``tdur``),
            which tells computing from waiting.
        process_name: the process label shown in the trace viewer.
        max_events: slices kept in memory (the oldest are dropped beyond it).

    Examples:
        >>> import json, tempfile, os
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     timer = PhaseTimer(os.path.join(tmp, "trace.json"), thread_time=True)
        ...     with timer("env step"):
        ...         pass
        ...     timer.save()
        ...     [e["name"] for e in json.loads(timer.trace_path.read_text())["traceEvents"] if e["ph"] == "X"]
        ['env step']
        >>> timer.totals["env step"] >= 0
        True
    """

    def __init__(self, trace_path: str | os.PathLike | None = None, *, thread_time: bool = False,
                 process_name: str = "collector", max_events: int = 1_000_000) -> None:
        self.trace_path = Path(trace_path) if trace_path is not None else None
        self.thread_time = thread_time
        self.totals: dict[str, float] = defaultdict(float)
        self._events: list[dict] = []
        self._max_events = max_events
        self._pid = os.getpid()
        self._tid = threading.get_native_id()
        self._meta = [
            {"name": "process_name", "ph": "M", "pid": self._pid, "args": {"name": process_name}},
            {"name": "thread_name", "ph": "M", "pid": self._pid, "tid": self._tid, "args": {"name": "worker loop"}},
        ]

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        """Times the ``with`` block as phase ``name``."""
        start = time.perf_counter()
        cpu_start = time.thread_time() if self.thread_time else 0.0
        try:
            yield
        finally:
            elapsed = time.perf_counter() - start
            self.totals[name] += elapsed
            if self.trace_path is not None and len(self._events) < self._max_events:
                event = {"name": name, "ph": "X", "pid": self._pid, "tid": self._tid,
                         "ts": start * 1e6, "dur": elapsed * 1e6}
                if self.thread_time:
                    event["tts"] = cpu_start * 1e6
                    event["tdur"] = (time.thread_time() - cpu_start) * 1e6
                self._events.append(event)

    def take_totals(self) -> dict[str, float]:
        """Returns the accumulated seconds per phase and resets them."""
        totals, self.totals = dict(self.totals), defaultdict(float)
        return totals

    def save(self) -> None:
        """Writes the trace JSON (no-op without ``trace_path``)."""
        if self.trace_path is None:
            return
        self.trace_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.trace_path.with_suffix(".tmp")
        with open(tmp, "w") as f:
            json.dump({"traceEvents": self._meta + self._events, "displayTimeUnit": "ms"}, f)
        os.replace(tmp, self.trace_path)
