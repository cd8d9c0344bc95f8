"""Process-shared signals that a SIGKILLed worker cannot leave held.

multiprocessing's ``Event`` and ``Lock`` are process-shared semaphores: a
worker killed while it holds one (inside ``Event.is_set()``, which takes the
event's lock on every call) keeps it forever, and the parent's next
``Event.set()`` or ``Lock.acquire()`` blocks for good: one worker SIGKILLed at
that moment would hang the collector's shutdown in ``stop_event.set()``
(``benchmarks/faults.py`` kills workers until such a moment comes). The two
classes here replace them where workers and the parent meet:

* :class:`StopFlag`: a byte of shared memory, so there is no lock to hold;
* :class:`ProcessLock`: ``flock`` on a memory file, which the kernel releases
  when its holder dies.
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
from typing import Any

import torch

__all__ = ["FlockLock", "ProcessLock", "StopFlag"]


class StopFlag:
    """An ``Event``-like stop flag in shared memory, read and written without a lock.

    Examples:
        >>> flag = StopFlag()
        >>> flag.is_set(), flag.wait(0.01)
        (False, False)
        >>> flag.set(); flag.is_set()
        True
    """

    def __init__(self) -> None:
        self._flag = torch.zeros(1, dtype=torch.uint8).share_memory_()

    def set(self) -> None:
        self._flag[0] = 1

    def clear(self) -> None:
        self._flag[0] = 0

    def is_set(self) -> bool:
        return bool(self._flag[0])

    def wait(self, timeout: float | None = None) -> bool:
        """Polls until the flag is set; returns whether it is (``False`` after ``timeout`` seconds)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = 1e-4
        while not self.is_set():
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(delay)
            delay = min(delay * 2, 0.01)
        return True


class FlockLock:
    """``flock`` on a file each process opens once, plus a thread lock: the kernel releases it when its holder dies.

    ``flock`` excludes open file descriptions, so each process opens its own
    (lazily, at its first acquisition, also after a fork); a thread lock
    excludes the threads of one process, which share that description.
    Subclasses say which file (:meth:`_path`) and how to acquire; the
    descriptor, the locks and their pickling are handled here.
    """

    def __init__(self) -> None:
        self._reset_process_state()

    def _reset_process_state(self) -> None:
        self._pid: int | None = None
        self._fd = -1
        self._thread_lock = threading.Lock()
        self._open_guard = threading.Lock()
        self.held = False

    def _path(self) -> str:
        raise NotImplementedError

    def _ensure_open(self) -> None:
        pid = os.getpid()
        if self._pid == pid:
            return
        # Two threads' first acquisitions must not each open a descriptor and make a thread lock of their own.
        with self._open_guard:
            if self._pid == pid:
                return
            if self._pid is not None:
                # A forked child shares the parent's open file description, and with it the parent's flock;
                # the parent's thread lock may be held by a thread the child does not have.
                self._thread_lock = threading.Lock()
            self._fd = os.open(self._path(), os.O_RDWR | os.O_CLOEXEC)
            self.held = False
            self._pid = pid

    def release(self) -> None:
        """Releases the lock."""
        self.held = False
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        self._thread_lock.release()

    def __enter__(self) -> FlockLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def acquire(self) -> None:
        raise NotImplementedError

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._reset_process_state()

    def __del__(self) -> None:
        if getattr(self, "_fd", -1) >= 0 and getattr(self, "_pid", None) == os.getpid():
            os.close(self._fd)
            self._fd = -1


class ProcessLock(FlockLock):
    """A lock for a process and the processes it spawns, released by the kernel when its holder dies.

    The creator holds an anonymous memory file (``memfd``); a spawned process
    opens its own description of it through ``/proc/<creator>/fd/<fd>``.
    Nothing is left on disk or in ``/dev/shm``: the file goes with its last
    descriptor.

    Examples:
        >>> lock = ProcessLock()
        >>> with lock:
        ...     lock.held
        True
        >>> lock.held
        False
    """

    def __init__(self) -> None:
        super().__init__()
        self._owner = os.getpid()
        self._owner_fd = os.memfd_create("torchrl_unilab_lock", os.MFD_CLOEXEC)
        self._pid, self._fd = self._owner, self._owner_fd

    def _path(self) -> str:
        return f"/proc/{self._owner}/fd/{self._owner_fd}"

    def acquire(self) -> None:
        """Takes the lock, waiting as long as a live process holds it."""
        self._ensure_open()
        self._thread_lock.acquire()
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX)
        except BaseException:
            self._thread_lock.release()
            raise
        self.held = True

    def __getstate__(self) -> dict[str, Any]:
        return {"_owner": self._owner, "_owner_fd": self._owner_fd}
