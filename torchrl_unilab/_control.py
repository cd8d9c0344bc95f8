"""Frame accounting shared by the collector's parent and its workers.

Workers claim whole batches of frames against an allowance the parent sets.
The allowance is the single knob behind ``start()`` (allow everything),
iteration (allow one batch per worker ahead of the consumer), ``pause()``
(allow nothing new) and update-to-data throttling (allow up to a bound).
"""

from __future__ import annotations

import multiprocessing as mp
import time
from collections.abc import Callable

import torch

__all__ = ["FrameControl"]

_ALLOWED, _CLAIMED, _WRITTEN = range(3)
_UNLIMITED = 2**62


class FrameControl:
    """Shared counters: frames allowed, claimed by workers, and written.

    Args:
        ctx: the multiprocessing context the workers are started with.

    Examples:
        >>> import multiprocessing as mp
        >>> control = FrameControl(mp.get_context("spawn"))
        >>> control.allow(100)
        >>> control.claim(64), control.claim(64)
        (True, False)
        >>> control.written_(64); control.written
        64
    """

    def __init__(self, ctx: mp.context.BaseContext) -> None:
        self._lock = ctx.Lock()
        self._state = torch.zeros(3, dtype=torch.int64).share_memory_()

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

    def claim(self, frames: int) -> bool:
        """Worker side: reserves ``frames`` if the allowance has room."""
        with self._lock:
            if self._state[_CLAIMED] + frames > self._state[_ALLOWED]:
                return False
            self._state[_CLAIMED] += frames
            return True

    def written_(self, frames: int) -> None:
        """Worker side: records ``frames`` written into the buffer."""
        with self._lock:
            self._state[_WRITTEN] += frames

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
