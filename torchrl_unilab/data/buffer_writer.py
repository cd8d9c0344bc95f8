"""A replay-buffer writer and lock that survive the death of any process using them.

TorchRL's shared ``ReplayBuffer`` serialises writers with a
``multiprocessing.Lock``, counts with ``mp.Value`` objects that carry locks of
their own, and its :class:`~torchrl.data.RoundRobinWriter` moves the cursor,
``write_count`` and ``len()`` *before* copying the rows. A writer SIGKILLed
inside ``extend`` therefore deadlocks every later ``extend`` and ``sample``,
and, had the lock been released, would leave half-written rows visible.

Here:

* :class:`BufferLock` is an ``fcntl.flock`` on a file in the buffer's scratch
  directory: the kernel releases it when its holder dies, however it dies.
  Every acquisition is bounded in time, and a child process waiting for it
  notices that the process that made the buffer has died.
* :class:`CommitWriter` is a ``RoundRobinWriter`` that copies first and
  commits after: the cursor, the 64-bit write count and the storage's length
  move only once the rows are completely written. It marks the rows it is
  about to overwrite before copying; whoever next takes the lock and finds the
  mark left by a dead writer repairs those rows (see :meth:`CommitWriter.recover`).
* The counters live in a small memory-mapped file (:class:`SharedCounters`):
  plain 64-bit words, no locks of their own, shared by every process that
  attaches to the buffer.
"""

from __future__ import annotations

import errno
import fcntl
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tensordict import is_tensor_collection
from torchrl.data.replay_buffers.writers import RoundRobinWriter, Writer

from torchrl_unilab._residue import pid_alive
from torchrl_unilab._sync import FlockLock
from torchrl_unilab._torchrl_private import (
    mark_written,
    set_last_cursor,
    set_storage_length,
    share_storage_counters,
    share_writer_counters,
    writer_cursor,
    writer_storage,
)

__all__ = ["BufferLock", "CommitWriter", "SharedCounters", "SYNC_FILE"]

#: Name of the counters-and-lock file in a buffer's scratch directory.
SYNC_FILE = ".torchrl_unilab_sync"

# Word offsets in the sync file.
(_CURSOR, _WRITE_COUNT, _LEN, _REVISION, _LAST_CURSOR, _PENDING_START, _PENDING_N, _HOLDER, _OWNER, _NEXT_ID,
 _WAITING) = range(11)
_WORDS = 16
#: How long a process about to take the lock lets a waiting one go first.
_POLITE_S = 0.02


class SharedCounters:
    """Named 64-bit counters in a memory-mapped file, shared by every process that opens it.

    Aligned 8-byte loads and stores are single instructions on the platforms
    torch supports, so a reader never sees half of a value; read-modify-write
    sequences need :class:`BufferLock`. A process killed at any point leaves
    each word either old or new.

    Args:
        path: the file; created (mode 0600, zeroed) if it does not exist.

    Examples:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     counters = SharedCounters(f"{tmp}/sync")
        ...     counters[0] = 2**40
        ...     SharedCounters(f"{tmp}/sync")[0]
        1099511627776
    """

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = str(path)
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            pass
        else:
            try:
                os.ftruncate(fd, _WORDS * 8)
            finally:
                os.close(fd)
        self._words = np.memmap(self.path, dtype=np.int64, mode="r+", shape=(_WORDS,))

    def __getitem__(self, slot: int) -> int:
        return int(self._words[slot])

    def __setitem__(self, slot: int, value: int) -> None:
        self._words[slot] = value

    def __reduce__(self):
        return (SharedCounters, (self.path,))


class _Slot:
    """One counter with the interface of an ``mp.Value``, for TorchRL's storages and writers."""

    def __init__(self, counters: SharedCounters, slot: int) -> None:
        self.counters, self.slot = counters, slot

    @property
    def value(self) -> int:
        return self.counters[self.slot]

    @value.setter
    def value(self, value: int) -> None:
        self.counters[self.slot] = int(value)

    def get_lock(self):
        # Every mutation already happens under BufferLock; an mp.Value's own
        # lock is exactly what a SIGKILL would leave held forever.
        return _NO_LOCK

    def __reduce__(self):
        return (_Slot, (self.counters, self.slot))


class _NoLock:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc) -> None:
        return None


_NO_LOCK = _NoLock()


class BufferLock(FlockLock):
    """A process-shared lock the kernel releases when its holder dies: ``flock`` on the sync file.

    Used as ``replay_buffer._write_lock``, the lock TorchRL's ``extend`` and
    ``sample`` take. Within a process, a thread lock orders threads first
    (``flock`` does not exclude threads that share a file descriptor). After a
    fork or in a spawned child, the file is opened anew, so each process holds
    its own lock.

    ``flock`` is not fair: a process that releases and re-takes the lock in a
    tight loop (a learner sampling all the time) would starve the others. A
    process that fails to get the lock therefore posts its pid in a shared
    word, and the others, before taking the lock, give it a few milliseconds
    to go first.

    Waiting is bounded: past ``timeout`` seconds :meth:`acquire` raises
    ``TimeoutError`` naming the process holding the lock. While waiting, a
    child process checks that the process that made the buffer (its owner) is
    alive and raises ``RuntimeError`` when it is not, so a worker never
    outlives its learner waiting for a lock.

    Args:
        counters: the buffer's :class:`SharedCounters` (the locked file).

    Keyword Args:
        timeout: seconds an acquisition may wait.
        on_acquire: called after each acquisition, with the lock held (the
            writer's recovery check).

    Examples:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     lock = BufferLock(SharedCounters(f"{tmp}/sync"), timeout=1.0)
        ...     with lock:
        ...         lock.held
        True
    """

    def __init__(
        self,
        counters: SharedCounters,
        *,
        timeout: float = 60.0,
        on_acquire: Callable[[], None] | None = None,
    ) -> None:
        if not timeout > 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout!r}")
        self.counters = counters
        self.timeout = float(timeout)
        self.on_acquire = on_acquire
        if counters[_OWNER] == 0:
            counters[_OWNER] = os.getpid()
        super().__init__()

    def _path(self) -> str:
        return self.counters.path

    def acquire(self, timeout: float | None = None) -> None:
        """Takes the lock, waiting at most ``timeout`` (default :attr:`timeout`) seconds."""
        self._ensure_open()
        timeout = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        if not self._thread_lock.acquire(timeout=timeout):
            raise TimeoutError(f"another thread held the replay buffer's lock for more than {timeout:g}s")
        try:
            self._flock(deadline, timeout)
            self.held = True
            self.counters[_HOLDER] = os.getpid()
            if self.on_acquire is not None:
                self.on_acquire()
        except BaseException:
            if self.held:
                self.release()
            else:
                self._thread_lock.release()
            raise

    def _let_waiter_first(self, me: int) -> None:
        waiting = self.counters[_WAITING]
        if waiting in (0, me):
            return
        if not pid_alive(waiting):
            self.counters[_WAITING] = 0
            return
        give_up = time.monotonic() + _POLITE_S
        while self.counters[_WAITING] == waiting and time.monotonic() < give_up:
            time.sleep(1e-4)

    def _flock(self, deadline: float, timeout: float) -> None:
        delay = 5e-5
        me = os.getpid()
        owner = self.counters[_OWNER]
        self._let_waiter_first(me)
        while True:
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                self._stop_waiting(me)
                return
            except OSError as err:
                if err.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
            self.counters[_WAITING] = me
            if owner != me and not pid_alive(owner):
                self._stop_waiting(me)
                raise RuntimeError(
                    f"the process that made this replay buffer (pid {owner}) has exited; stopping instead of "
                    "waiting for its lock"
                )
            if time.monotonic() > deadline:
                self._stop_waiting(me)
                raise TimeoutError(
                    f"waited {timeout:g}s for the replay buffer's lock ({self.counters.path}), held by pid "
                    f"{self.counters[_HOLDER]}; a live process is stuck inside extend() or sample() "
                    "(stopped with SIGSTOP, or swapping?). Raise make_replay_buffer(lock_timeout=...) if "
                    "single writes really take that long."
                )
            time.sleep(delay)
            delay = min(delay * 2, 5e-4)

    def _stop_waiting(self, me: int) -> None:
        if self.counters[_WAITING] == me:
            self.counters[_WAITING] = 0

    def __getstate__(self) -> dict[str, Any]:
        return {"counters": self.counters, "timeout": self.timeout, "on_acquire": self.on_acquire}


class CommitWriter(RoundRobinWriter):
    """A round-robin writer whose rows become visible only once completely written.

    ``extend`` marks the slots it will overwrite, copies the rows, then moves
    the cursor, the write count (64 bits, unlike TorchRL's ``mp.Value("i")``,
    which wraps after 2**31 rows) and the storage's length, and clears the
    mark. A writer killed before the commit leaves the buffer as it was, except
    for the marked slots: in a full ring buffer these held visible rows that
    are now partly overwritten. :meth:`recover`, which :class:`BufferLock` runs
    on every acquisition, finds the mark and overwrites each such slot with a
    copy of another complete row, so ``sample()`` never returns a torn row; the
    next ``extend`` writes over the same slots.

    Its :attr:`lock` must also be the buffer's write lock, which TorchRL keeps
    private (:func:`~torchrl_unilab.make_replay_buffer` sets it).

    Args:
        directory: where the counters-and-lock file goes (the storage's scratch directory).

    Keyword Args:
        lock_timeout: seconds any ``extend``/``sample`` may wait for the lock.

    Examples:
        >>> import tempfile, torch
        >>> from torchrl.data import LazyTensorStorage, ReplayBuffer
        >>> from torchrl_unilab._torchrl_private import set_write_lock
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     writer = CommitWriter(tmp)
        ...     rb = ReplayBuffer(storage=LazyTensorStorage(4), writer=writer)
        ...     set_write_lock(rb, writer.lock)
        ...     _ = rb.extend(torch.arange(6))
        ...     rb.write_count, len(rb), sorted(rb[:].tolist())
        (6, 4, [2, 3, 4, 5])
    """

    def __init__(self, directory: str | os.PathLike, *, lock_timeout: float = 60.0) -> None:
        super().__init__()
        self.counters = SharedCounters(Path(directory) / SYNC_FILE)
        if self.counters[_WRITE_COUNT] == 0:
            self.counters[_LAST_CURSOR] = -1  # TorchRL's "nothing written yet"
        share_writer_counters(self, cursor=_Slot(self.counters, _CURSOR),
                              write_count=_Slot(self.counters, _WRITE_COUNT))
        self.lock = BufferLock(self.counters, timeout=lock_timeout, on_acquire=self.recover)

    def register_storage(self, storage) -> None:
        if getattr(storage, "ndim", 1) != 1:
            raise ValueError(f"CommitWriter needs a one-dimensional storage, got ndim={storage.ndim}")
        super().register_storage(storage)
        # TorchRL's own counters on the storage are mp.Values with locks that a
        # SIGKILL can leave held; these words have none.
        share_storage_counters(storage, length=_Slot(self.counters, _LEN),
                               revision=_Slot(self.counters, _REVISION),
                               last_cursor=_Slot(self.counters, _LAST_CURSOR))

    @property
    def write_count(self) -> int:
        """Rows written since the buffer was made (64 bits)."""
        return self.counters[_WRITE_COUNT]

    def add(self, data: Any) -> int:
        index = writer_cursor(self)
        self._write(torch.tensor([index]), data, single=True)
        return index

    def extend(self, data: Any) -> torch.Tensor:
        if is_tensor_collection(data) or isinstance(data, torch.Tensor) or isinstance(data, list):
            n = len(data)
        else:
            raise TypeError(f"CommitWriter writes tensors and TensorDicts, got {type(data).__name__}")
        if n == 0:
            raise RuntimeError("extend() needs at least one row, got an empty batch")
        max_size = writer_storage(self).max_size
        skipped = max(n - max_size, 0)
        if skipped:
            # Only the last max_size rows would survive; writing the others twice into one slot is undefined.
            data = data[skipped:]
        index = (torch.arange(n - skipped) + writer_cursor(self) + skipped) % max_size
        self._write(index, data, written=n)
        return index

    def _write(self, index: torch.Tensor, data: Any, *, written: int | None = None, single: bool = False) -> None:
        counters = self.counters
        rows = index.numel()
        counters[_PENDING_START] = int(index[0])
        counters[_PENDING_N] = rows  # from here until the commit, these slots may be torn
        storage = writer_storage(self)
        storage.set(int(index[0]) if single else index, data, set_cursor=False)
        # Commit: the storage's length, the cursor, the count.
        set_last_cursor(storage, int(index[-1]))
        set_storage_length(storage, min(len(storage) + rows, storage.max_size))
        counters[_CURSOR] = (int(index[-1]) + 1) % storage.max_size
        counters[_WRITE_COUNT] = counters[_WRITE_COUNT] + (written or rows)
        counters[_PENDING_N] = 0
        mark_written(self, index, data)

    def write_at(self, index, data):  # noqa: ANN001
        raise NotImplementedError("CommitWriter does not support consuming buffers (write_at)")

    def recover(self) -> int:
        """Repairs the slots a dead writer left half-written; returns how many visible slots it repaired.

        Called with the lock held. Slots past ``len()`` are invisible and left
        for the next ``extend``. Visible ones (a full ring buffer, or a write
        that wrapped around) are overwritten with copies of other complete rows;
        if every visible row was being overwritten, the buffer is emptied.
        """
        counters = self.counters
        pending = counters[_PENDING_N]
        if pending == 0:
            return 0
        storage = writer_storage(self)
        if storage is None:
            return 0
        max_size = storage.max_size
        size = len(storage)
        torn = torch.unique((torch.arange(pending) + counters[_PENDING_START]) % max_size)
        torn = torn[torn < size]
        if torn.numel():
            complete = torch.ones(size, dtype=torch.bool)
            complete[torn] = False
            sources = complete.nonzero().squeeze(-1)
            if sources.numel() == 0:
                set_storage_length(storage, 0)
                counters[_CURSOR] = 0
            else:
                fill = sources[torch.arange(torn.numel()) % sources.numel()]
                storage.set(torn, storage.get(fill), set_cursor=False)
        counters[_PENDING_N] = 0
        return int(torn.numel())

    def next_id(self) -> int:
        """Returns a number unique among all processes attached to this buffer (0, 1, 2, ...).

        Examples:
            >>> import tempfile
            >>> with tempfile.TemporaryDirectory() as tmp:
            ...     writer = CommitWriter(tmp)
            ...     writer.next_id(), writer.next_id()
            (0, 1)
        """
        with self.lock:
            value = self.counters[_NEXT_ID]
            self.counters[_NEXT_ID] = value + 1
        return value

    def __getstate__(self) -> dict[str, Any]:
        # Writer.__getstate__, not RoundRobinWriter's: that one swaps the counters for fresh mp.Values.
        return Writer.__getstate__(self)

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
