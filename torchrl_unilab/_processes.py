"""Worker process lifecycle: start, watch, stop, and carry errors to the parent."""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import queue
import threading
import time
from collections.abc import Callable, Sequence

__all__ = ["WorkerError", "WorkerPool"]


class WorkerError(RuntimeError):
    """An exception raised inside a collector worker, re-raised in the main process.

    Attributes:
        worker_idx: index of the worker that failed.
        worker_traceback: the formatted traceback from the worker process.

    Examples:
        >>> err = WorkerError(1, "ValueError: boom", "Traceback ...")
        >>> err.worker_idx
        1
    """

    def __init__(self, worker_idx: int, message: str, worker_traceback: str) -> None:
        self.worker_idx = worker_idx
        self.worker_traceback = worker_traceback
        super().__init__(f"collector worker {worker_idx} failed: {message}\n\nWorker traceback:\n{worker_traceback}")


class WorkerPool:
    """Starts worker processes, watches them from a thread, and stops them all.

    The watcher notices a worker's reported exception (or an unexplained exit)
    within ``poll_interval`` seconds, stops the other workers and keeps the
    error; :meth:`raise_if_failed` re-raises it as :class:`WorkerError`.

    Args:
        ctx: multiprocessing context (``spawn``).
        target: the worker entry point; called as ``target(idx, *args, stop_event, error_queue)``.
        args: per-worker positional arguments after the index.
        num_workers: how many processes to start.

    Examples:
        >>> import multiprocessing as mp
        >>> pool = WorkerPool(mp.get_context("spawn"), target=print, args=(), num_workers=0)
        >>> pool.start(); pool.stop(); pool.alive()
        0
    """

    def __init__(self, ctx: mp.context.BaseContext, target: Callable, args: Sequence, num_workers: int,
                 poll_interval: float = 0.05, name: str = "OffPolicyCollector") -> None:
        self.ctx = ctx
        self.stop_event = ctx.Event()
        self.error_queue = ctx.Queue()
        self.poll_interval = poll_interval
        self.procs = [
            ctx.Process(target=target, args=(i, *args, self.stop_event, self.error_queue),
                        name=f"{name}-worker-{i}", daemon=True)
            for i in range(num_workers)
        ]
        self.error: WorkerError | None = None
        self._stopping = False
        self._watcher: threading.Thread | None = None

    def start(self) -> None:
        """Starts every worker and the watcher thread."""
        for proc in self.procs:
            proc.start()
        self._watcher = threading.Thread(target=self._watch, name="collector-watcher", daemon=True)
        self._watcher.start()

    def _watch(self) -> None:
        while not self._stopping:
            try:
                idx, message, tb = self.error_queue.get(timeout=self.poll_interval)
                self._fail(WorkerError(idx, message, tb))
                return
            except queue.Empty:
                pass
            except (EOFError, OSError, ValueError):
                return
            for idx, proc in enumerate(self.procs):
                if proc.exitcode not in (None, 0) and not self._stopping:
                    # Give the worker's own report a moment to arrive; it is more useful.
                    with contextlib.suppress(queue.Empty, EOFError, OSError, ValueError):
                        idx, message, tb = self.error_queue.get(timeout=0.5)
                        self._fail(WorkerError(idx, message, tb))
                        return
                    self._fail(WorkerError(idx, f"process exited with code {proc.exitcode}", "(no traceback)"))
                    return

    def _fail(self, error: WorkerError) -> None:
        if self.error is None:
            self.error = error
        self.stop_event.set()

    def raise_if_failed(self) -> None:
        """Re-raises the first worker error, if any."""
        if self.error is not None:
            raise self.error

    def alive(self) -> int:
        """How many worker processes are still running."""
        return sum(p.is_alive() for p in self.procs)

    def stop(self, timeout: float = 4.0) -> None:
        """Asks workers to stop, then terminates and kills stragglers within ``timeout`` seconds."""
        self._stopping = True
        self.stop_event.set()
        deadline = time.monotonic() + timeout
        for proc in self.procs:
            if proc.pid is not None:
                proc.join(max(0.0, deadline - time.monotonic() - 0.3 * timeout))
        for proc in self.procs:
            if proc.is_alive():
                proc.terminate()
        for proc in self.procs:
            if proc.pid is not None:
                proc.join(max(0.05, deadline - time.monotonic()))
            if proc.is_alive():
                proc.kill()
                proc.join(1.0)
        if self._watcher is not None:
            self._watcher.join(1.0)
        # Pick up an error reported while we were stopping (e.g. during a pause).
        with contextlib.suppress(queue.Empty, EOFError, OSError, ValueError):
            while self.error is None:
                idx, message, tb = self.error_queue.get_nowait()
                self.error = WorkerError(idx, message, tb)
        self.error_queue.close()
        self.error_queue.join_thread()
