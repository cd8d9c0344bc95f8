"""Pacing of :class:`~torchrl_unilab.OffPolicyCollector`: how far the workers may collect ahead of the learner.

Every call here moves one knob, the allowance of the collector's
:class:`~torchrl_unilab.collectors._control.FrameControl`: iteration allows one
batch per worker ahead of the consumer (just the next batch in lockstep),
:meth:`PacingAPI.start` allows everything, :meth:`PacingAPI.allow_frames` a cap,
and :meth:`PacingAPI.pause` nothing new. A buffer the workers cannot write is
fed by a thread of this process meanwhile.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator

from torchrl_unilab.collectors._batches import FeedThread
from torchrl_unilab.collectors._control import check_wait

__all__ = ["PacingAPI"]


class PacingAPI:
    """Mixin of :class:`~torchrl_unilab.OffPolicyCollector`: ``start``, ``allow_frames``, ``pause`` and the waits.

    It reads the collector's fields (``_control``, ``_pool``, ``_local``, ``_feed``, ...) and is not meant to
    be used alone.

    Examples:
        >>> from torchrl_unilab import OffPolicyCollector, make_replay_buffer
        >>> rb = make_replay_buffer(1_000)
        >>> with OffPolicyCollector("Pendulum-v1", num_envs=2, frames_per_batch=32, replay_buffer=rb) as collector:
        ...     collector.allow_frames(64)
        ...     collector.wait_for_frames(64, timeout=120), len(rb) >= 64
        (True, True)
    """

    def _start_feed(self) -> None:
        """A local buffer is fed by a thread of this process while collection runs in the background."""
        if self._local is not None and self._feed is None:
            self._feed = FeedThread(functools.partial(self._take_batch, raise_failures=False), self._write_local)

    @property
    def _workers_write(self) -> bool:
        """Whether the workers write into ``replay_buffer`` themselves (the fast path)."""
        return self.replay_buffer is not None and self._local is None

    @property
    def _buffer_frames(self) -> int:
        """Frames in ``replay_buffer`` (or held there as unfinished trajectories) from these workers."""
        return self._fed if self._local is not None else self._control.written

    def _allow_ahead(self) -> None:
        """Lets the workers collect up to one batch each past what was consumed (just the next batch in lockstep)."""
        if not self._in_background:
            batches = 1 if self._lockstep else self.num_workers
            ahead = min(self.total_frames, self._consumed_frames + batches * self.frames_per_batch)
            self._control.allow(ahead - self._restored)

    def _wait(self, predicate: Callable[[], bool], timeout: float | None = None) -> bool:
        reached = self._control.wait(predicate, timeout=timeout, on_poll=self._raise_if_failed)
        if self._pool is not None:
            # The other workers can write the last frames before the watcher has named one that died on the
            # way (one worker alone can write the rest); its report gets a moment to arrive.
            self._pool.raise_if_failed(wait_for_report=1.0)
        return reached

    def start(self) -> None:
        """Lets every worker collect into ``replay_buffer`` in the background until ``total_frames``."""
        self._require_buffer("start()")
        self._ensure_started()
        self._raise_if_failed()
        self._in_background = True
        self._start_feed()
        self._control.allow(self._total_to_write)

    def allow_frames(self, frames: int | None) -> None:
        """Caps the total frames workers may write (``None``: up to ``total_frames``).

        Workers that reach the cap wait (they are paused, no data is dropped);
        learners use this to bound how far collection runs ahead of training.
        """
        self._require_buffer("allow_frames()")
        self._ensure_started()
        self._raise_if_failed()
        self._in_background = True
        self._start_feed()
        self._control.allow(self._total_to_write if frames is None else min(frames, self._total_to_write))

    def _require_buffer(self, what: str) -> None:
        if self.replay_buffer is None:
            raise RuntimeError(
                f"{what} lets workers collect in the background into a replay buffer; this collector has none "
                "(replay_buffer=None), so iterate over it instead"
            )

    @contextlib.contextmanager
    def pause(self) -> Iterator[None]:
        """Context manager: no new batch starts inside it, and batches in flight are written first."""
        if not self._started:
            yield
            return
        previous = self._control.freeze()
        # with a feed thread, also until what the workers handed over is in the local buffer
        self._wait(lambda: self._control.written >= self._control.claimed
                   and (self._feed is None or self._fed >= self._control.written))
        try:
            yield
        finally:
            self._control.allow(previous)

    def wait_for_frames(self, frames: int, timeout: float | None = None) -> bool:
        """Blocks until ``frames`` frames are written; False on timeout. Raises a worker's error.

        Starts the workers if they have not started. A wait that could never end
        raises ``ValueError`` instead: ``frames`` above ``total_frames``, or above
        what the workers are allowed to collect (call :meth:`start` or
        :meth:`allow_frames` first).
        """
        check_wait(frames, total_frames=self.total_frames, restored=self._restored, reachable=frames,
                   background=True)
        self._ensure_started()
        check_wait(frames, total_frames=self.total_frames, restored=self._restored,
                   reachable=self._control.allowed, background=self._in_background)
        self._start_feed()  # a local buffer needs a writer while this waits
        return self._wait(lambda: self._buffer_frames >= frames, timeout)

    @property
    def frames_written(self) -> int:
        """Frames collected by all workers so far (written into the buffer or handed over)."""
        if self.replay_buffer is None:
            # A worker counts a batch after handing it over (and after its post-collect hook), so the consumer
            # can hold one the counter does not show yet; what was yielded is collected.
            return max(self._control.written, self._handed_over)
        return self._buffer_frames
