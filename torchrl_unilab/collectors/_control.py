"""Frame accounting shared by the collector's parent and its workers.

Workers claim whole batches of frames against an allowance the parent sets.
The allowance is the single knob behind ``start()`` (allow everything),
iteration (allow one batch per worker ahead of the consumer), ``pause()``
(allow nothing new) and update-to-data throttling (allow up to a bound).

Each worker owns a fixed share of ``init_random_frames`` (so that a seeded run
is reproducible), and the frames it needs for that share are reserved for it:
no other worker may claim them, however late it starts. Without that, a fast
worker could claim every batch up to ``total_frames`` before a slow one started,
and the slow worker's random frames would never be collected.

Each worker's claim in flight and what it wrote (frames, random frames) are
kept per worker too, so that a dead worker's lost batch can be handed back
(:meth:`FrameControl.release`): the frames it claimed and never wrote are
claimed again by whoever collects next, and its replacement is owed exactly the
random frames it had not written.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from torchrl_unilab._sync import ProcessLock

__all__ = ["FrameControl"]

_ALLOWED, _CLAIMED, _WRITTEN, _TOTAL = range(4)
_IN_FLIGHT, _W_WRITTEN, _W_RANDOM, _P_SET, _P_TRAJ, _P_STEP, _P_RANDOM = range(7)
_UNLIMITED = 2**62


def split_random_frames(random_frames: int, num_workers: int, frames_per_batch: int) -> list[int]:
    """Each worker's share of ``random_frames``: whole batches round-robin, the remainder to the next worker.

    Whole batches keep the reserved batches (``ceil(share / frames_per_batch)`` per
    worker) summing to ``ceil(random_frames / frames_per_batch)``, so reservations
    never exceed a ``total_frames`` that is at least ``random_frames``.

    Examples:
        >>> split_random_frames(1001, 2, 256)
        [512, 489]
        >>> split_random_frames(100, 3, 64)
        [64, 36, 0]
    """
    batches, remainder = divmod(random_frames, frames_per_batch)
    shares = [frames_per_batch * (batches // num_workers + (i < batches % num_workers)) for i in range(num_workers)]
    shares[batches % num_workers] += remainder
    return shares


class FrameControl:
    """Shared counters: frames allowed, claimed by workers, and written.

    The counters sit under a :class:`~torchrl_unilab._sync.ProcessLock`,
    which the kernel releases if a worker is killed while it holds it.

    Args:
        random_frames: each worker's share of the random frames (see
            :func:`split_random_frames`); the batches they need are reserved.
        frames_per_batch: frames per claim.
        total_frames: the most frames ever allowed (``None``: no limit).

    Examples:
        >>> control = FrameControl()
        >>> control.allow(100)
        >>> control.claim(64), control.claim(64)
        (True, False)
        >>> control.written_(64); control.written
        64

        A worker dies holding a claim: :meth:`release` hands it back.

        >>> control = FrameControl([64, 0], frames_per_batch=64)
        >>> control.allow(128)
        >>> control.claim(64, worker_idx=0), control.claim(64, worker_idx=1)
        (True, True)
        >>> control.written_(64, worker_idx=1)
        >>> control.release(0, random_frames=64), control.claimed, control.random_written(0)
        (64, 64, 0)
    """

    def __init__(self, random_frames: list[int] | None = None, frames_per_batch: int = 1,
                 total_frames: int | None = None) -> None:
        self._lock = ProcessLock()
        self._state = torch.zeros(4, dtype=torch.int64).share_memory_()
        self._state[_TOTAL] = _UNLIMITED if total_frames is None else int(total_frames)
        reserved = [-(-share // frames_per_batch) * frames_per_batch for share in random_frames or [0]]
        self._reserved = torch.tensor(reserved, dtype=torch.int64).share_memory_()
        self.frames_per_batch = frames_per_batch
        # Per worker: frames claimed and not yet written, frames written, random frames written; then the
        # batch it is writing into the buffer and has not counted yet (a flag, its first row's ids, random frames).
        self._workers = torch.zeros(len(reserved), 7, dtype=torch.int64).share_memory_()

    @property
    def allowed(self) -> int:
        """Total frames workers may claim; ``2**62`` stands for no limit."""
        return int(self._state[_ALLOWED])

    @property
    def claimed(self) -> int:
        """Frames claimed so far (written or being collected)."""
        return int(self._state[_CLAIMED])

    @property
    def written(self) -> int:
        """Frames written into the replay buffer so far."""
        return int(self._state[_WRITTEN])

    def allow(self, frames: int | None) -> None:
        """Sets the allowance (``None`` for no limit). It may go down, never below ``claimed``."""
        with self._lock:
            value = _UNLIMITED if frames is None else int(frames)
            self._state[_ALLOWED] = max(value, int(self._state[_CLAIMED]))

    def freeze(self) -> int:
        """Stops new claims and returns the previous allowance."""
        with self._lock:
            previous = int(self._state[_ALLOWED])
            self._state[_ALLOWED] = self._state[_CLAIMED]
            return previous

    def claim(self, frames: int, worker_idx: int = 0) -> bool:
        """Worker side: claims ``frames`` if the allowance has room and no other worker's reservation is taken."""
        with self._lock:
            claimed = int(self._state[_CLAIMED])
            if claimed + frames > self._state[_ALLOWED]:
                return False
            others = int(self._reserved.sum()) - int(self._reserved[worker_idx])
            if claimed + frames + others > self._state[_TOTAL]:
                return False
            self._state[_CLAIMED] += frames
            self._reserved[worker_idx] = max(0, int(self._reserved[worker_idx]) - frames)
            self._workers[worker_idx, _IN_FLIGHT] += frames
            return True

    def written_(self, frames: int, worker_idx: int = 0, random_frames: int = 0) -> None:
        """Worker side: records ``frames`` written into the buffer, ``random_frames`` of them with random actions."""
        with self._lock:
            self._state[_WRITTEN] += frames
            row = self._workers[worker_idx]
            row[_IN_FLIGHT] = max(0, int(row[_IN_FLIGHT]) - frames)
            row[_W_WRITTEN] += frames
            row[_W_RANDOM] += random_frames
            row[_P_SET] = 0

    def writing_(self, worker_idx: int, first_row: tuple[int, int], random_frames: int) -> None:
        """Worker side, just before a buffer write: the batch's first row (trajectory id, step count).

        A worker killed after its rows were committed and before :meth:`written_`
        counted them leaves this record: the parent looks the row up in the
        buffer (:meth:`pending_write`) and counts the batch if it is there.
        """
        row = self._workers[worker_idx]
        row[_P_TRAJ], row[_P_STEP], row[_P_RANDOM] = first_row[0], first_row[1], random_frames
        row[_P_SET] = 1  # last: a record is whole once flagged

    def pending_write(self, worker_idx: int) -> tuple[int, int, int] | None:
        """Parent side, once worker ``worker_idx`` is dead: ``(trajectory id, step count, random frames)`` of the
        batch it had started writing into the buffer and not counted, or None."""
        row = self._workers[worker_idx]
        if not int(row[_P_SET]):
            return None
        return int(row[_P_TRAJ]), int(row[_P_STEP]), int(row[_P_RANDOM])

    def worker_written(self, worker_idx: int) -> int:
        """Frames worker ``worker_idx`` wrote so far (over all its restarts)."""
        return int(self._workers[worker_idx, _W_WRITTEN])

    def random_written(self, worker_idx: int) -> int:
        """Random frames worker ``worker_idx`` wrote so far (over all its restarts)."""
        return int(self._workers[worker_idx, _W_RANDOM])

    def release(self, worker_idx: int, random_frames: int) -> int:
        """Parent side, once worker ``worker_idx`` is dead: hands its unwritten claim back; returns those frames.

        The frames it claimed and never wrote are no longer claimed, so the
        frame count stays exact and ``total_frames`` is still reached with frames
        really written; the batches its replacement needs for the
        ``random_frames`` it is owed are reserved for it again.
        """
        with self._lock:
            lost = int(self._workers[worker_idx, _IN_FLIGHT])
            self._workers[worker_idx, _IN_FLIGHT] = 0
            self._workers[worker_idx, _P_SET] = 0
            self._state[_CLAIMED] -= lost
            self._reserved[worker_idx] = -(-random_frames // self.frames_per_batch) * self.frames_per_batch
            return lost

    def wait(self, predicate: Callable[[], bool], *, timeout: float | None, on_poll: Callable[[], None]) -> bool:
        """Polls ``predicate`` until it holds; ``on_poll`` may raise to abort. Returns False on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = 1e-4
        while not predicate():
            on_poll()
            if deadline is not None and time.monotonic() > deadline:
                return False
            time.sleep(delay)
            delay = min(delay * 2, 0.01)
        return True
