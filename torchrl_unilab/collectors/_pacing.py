"""How far collection runs ahead of the learner: one pacing for the local and the Ray collector.

:class:`Pacing` answers ``start``, ``allow_frames``, ``pause``, ``wait_for_frames`` and ``frames_written`` for
:class:`~torchrl_unilab.OffPolicyCollector` and
:class:`~torchrl_unilab.collectors.ray_collector.RayOffPolicyCollector` alike, over a :class:`FrameSource`:
frames collected against an allowance. The local collector's source is its workers' shared-memory frame
accounting (:class:`WorkerFrames` over a :class:`~torchrl_unilab.collectors._control.FrameControl`); the Ray
collector's is the batches its nodes deliver to this process (:class:`DeliveredFrames`). Every argument means
the same on both.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import Protocol

from torchrl_unilab.collectors._batches import BatchHandover
from torchrl_unilab.collectors._control import FrameControl, check_wait

__all__ = ["DeliveredFrames", "FrameSource", "Pacing", "WorkerFrames"]


class FrameSource(Protocol):
    """Frames collected against an allowance, as :class:`Pacing` drives them."""

    @property
    def started(self) -> bool:
        """Whether collection has started (a pause before it holds nothing)."""

    @property
    def written(self) -> int:
        """Frames collected so far (``frames_written``)."""

    @property
    def total(self) -> int | float:
        """Frames to collect in all: ``total_frames`` less those a restored checkpoint counts."""

    @property
    def restored(self) -> int:
        """Frames a restored checkpoint counts that this collection does not write."""

    def reachable(self) -> int | float:
        """Frames that can be collected with nothing running in the background."""

    def begin(self) -> None:
        """Starts collection on first use."""

    def raise_if_failed(self) -> None:
        """Raises the error of what collects (a worker, a node), if one failed."""

    def require_buffer(self, what: str) -> None:
        """Raises ``RuntimeError`` naming ``what`` where there is no buffer to collect into in the background."""

    def collect_in_background(self) -> None:
        """Collects into the buffer in the background from now on, up to the allowance."""

    def allow(self, frames: int | float | None) -> None:
        """Sets the allowance: the frames that may be collected in all (``None``: no limit)."""

    def freeze(self) -> int | float:
        """Lets no new batch start; returns the allowance before."""

    def settled(self) -> bool:
        """Whether every batch started is collected."""

    def wait(self, predicate: Callable[[], bool], timeout: float | None) -> bool:
        """Blocks until ``predicate()`` holds, raising a failure meanwhile; False after ``timeout`` seconds."""

    def wait_for(self, frames: int, timeout: float | None) -> bool:
        """Blocks until ``frames`` frames are collected; False after ``timeout`` seconds."""


class Pacing:
    """``start``, ``allow_frames``, ``pause``, ``wait_for_frames`` and ``frames_written``, over a :class:`FrameSource`.

    Until :meth:`start` or :meth:`allow_frames`, collection follows iteration (:meth:`allow_ahead`); from then
    on it runs in the background up to the allowance.

    Examples:
        >>> frames = DeliveredFrames(total_frames=128, has_buffer=True, batches=lambda: iter(()))
        >>> pacing = Pacing(frames)
        >>> frames.add(64)
        >>> pacing.frames_written, pacing.wait_for_frames(64, timeout=0)
        (64, True)
        >>> pacing.wait_for_frames(256)
        Traceback (most recent call last):
        ...
        ValueError: wait_for_frames(256) can never return: total_frames is 128
    """

    def __init__(self, source: FrameSource) -> None:
        self._source = source
        self._background = False

    @property
    def background(self) -> bool:
        """Whether collection runs in the background (after :meth:`start` or :meth:`allow_frames`)."""
        return self._background

    def start(self) -> None:
        """Collects into the buffer in the background until ``total_frames``."""
        self._allow(None, "start()")

    def allow_frames(self, frames: int | None) -> None:
        """Caps the frames collected in all (``None``: up to ``total_frames``); collection runs in the background
        up to it. What reaches the cap waits (no data is dropped)."""
        self._allow(frames, "allow_frames()")

    def _allow(self, frames: int | None, what: str) -> None:
        source = self._source
        source.require_buffer(what)
        source.begin()
        source.raise_if_failed()
        self._background = True
        source.collect_in_background()
        source.allow(source.total if frames is None else min(frames, source.total))

    def allow_ahead(self, frames: int | float) -> None:
        """Iteration's allowance (``frames`` in all), unless collection runs in the background."""
        if not self._background:
            self._source.allow(frames)

    def wait_for_frames(self, frames: int, timeout: float | None = None) -> bool:
        """Blocks until ``frames`` frames are collected; False on timeout. Raises a collection error.

        A wait that could never end raises ``ValueError`` instead: ``frames`` above ``total_frames``, or above
        what can be collected while nothing collects in the background (call :meth:`start` or
        :meth:`allow_frames` first).
        """
        source = self._source
        total = source.total + source.restored
        check_wait(frames, total_frames=total, restored=source.restored, reachable=frames, background=True)
        source.begin()
        source.raise_if_failed()
        check_wait(frames, total_frames=total, restored=source.restored, reachable=source.reachable(),
                   background=self._background)
        return source.wait_for(frames, timeout)

    @contextlib.contextmanager
    def pause(self, timeout: float | None = 30.0, *, resume: bool = True) -> Iterator[None]:
        """Context manager: no new batch starts inside it, and the batches in flight are collected first.

        Args:
            timeout: seconds to wait for the batches in flight (``None``: as long as they take); past it,
                collection goes on as before and ``TimeoutError`` is raised.
            resume: on exit, collection goes on as allowed before; with ``False`` it stays paused until
                :meth:`start` or :meth:`allow_frames` (or, without them, the next batch iterated).
        """
        source = self._source
        if not source.started:
            yield
            return
        previous = source.freeze()
        if not source.wait(source.settled, timeout):
            source.allow(previous)
            raise TimeoutError(f"the batches in flight were not collected within {timeout} s; collection goes on")
        try:
            yield
        finally:
            if resume:
                source.allow(previous)

    @property
    def frames_written(self) -> int:
        """Frames collected so far."""
        return self._source.written


class WorkerFrames:
    """The local collector's :class:`FrameSource`: its workers' shared-memory :class:`FrameControl`.

    Workers claim whole batches against the control's allowance. Frames count as written once in the replay
    buffer: written by the workers, or, for a buffer this process writes, by the batch hand-over
    (:class:`~torchrl_unilab.collectors._batches.BatchHandover`), whose feed thread collects in the
    background.

    Args:
        control: the frame accounting the workers share (:meth:`reset` replaces it before they start).
        handover: the batches the workers hand to this process.
        has_buffer: whether collection goes into a replay buffer.
        total: frames to collect in all, and restored: the frames a checkpoint counts: callables, as a restored
            checkpoint changes them.
        begin: starts the workers on first use; started: whether they started.
        raise_if_failed: raises a worker's failure; report_failure: the same, once a dead worker has had a
            moment to be reported (after a wait, the other workers may have finished the batch first).
    """

    def __init__(self, control: FrameControl, *, handover: BatchHandover, has_buffer: bool,
                 total: Callable[[], int | float], restored: Callable[[], int], begin: Callable[[], None],
                 started: Callable[[], bool], raise_if_failed: Callable[[], None],
                 report_failure: Callable[[], None]) -> None:
        self.control = control
        self._handover, self._has_buffer = handover, has_buffer
        self._total, self._restored, self._begin, self._started = total, restored, begin, started
        self._raise_if_failed, self._report_failure = raise_if_failed, report_failure

    def reset(self, control: FrameControl) -> None:
        """The frame accounting the workers start with (a restored checkpoint changes their shares)."""
        self.control = control

    @property
    def started(self) -> bool:
        return self._started()

    @property
    def total(self) -> int | float:
        return self._total()

    @property
    def restored(self) -> int:
        return self._restored()

    @property
    def buffered(self) -> int:
        """Frames in the replay buffer (or held there as unfinished trajectories) from these workers."""
        return self._handover.fed if self._handover.writes_locally else self.control.written

    @property
    def written(self) -> int:
        if not self._has_buffer:
            # A worker counts a batch after handing it over (and after its post-collect hook), so the consumer
            # can hold one the counter does not show yet; what was yielded is collected.
            return max(self.control.written, self._handover.handed_over)
        return self.buffered

    def reachable(self) -> int | float:
        return self.control.allowed

    def begin(self) -> None:
        self._begin()

    def raise_if_failed(self) -> None:
        self._raise_if_failed()

    def require_buffer(self, what: str) -> None:
        if not self._has_buffer:
            raise RuntimeError(
                f"{what} lets workers collect in the background into a replay buffer; this collector has none "
                "(replay_buffer=None), so iterate over it instead"
            )

    def collect_in_background(self) -> None:
        self._handover.start_feed()

    def allow(self, frames: int | float | None) -> None:
        self.control.allow(frames)

    def freeze(self) -> int | float:
        return self.control.freeze()

    def settled(self) -> bool:
        # with a feed thread, also once what the workers handed over is in the local buffer
        control = self.control
        return control.written >= control.claimed and (not self._handover.feeding
                                                        or self._handover.fed >= control.written)

    def wait(self, predicate: Callable[[], bool], timeout: float | None) -> bool:
        reached = self.control.wait(predicate, timeout=timeout, on_poll=self._raise_if_failed)
        self._report_failure()
        return reached

    def wait_for(self, frames: int, timeout: float | None) -> bool:
        self._handover.start_feed()  # a buffer this process writes needs its writer while this waits
        return self.wait(lambda: self.buffered >= frames, timeout)


class DeliveredFrames:
    """The Ray collector's :class:`FrameSource`: the batches its nodes deliver to this process.

    The collector's iterator :meth:`add`-s each batch it delivers. In the background a thread iterates
    ``batches`` one batch at a time, each started only while the allowance has room (holding meanwhile and
    calling ``while_held`` every ``interval`` seconds), until the iterator ends or ``stop()`` holds. A failure
    of that thread is raised to every waiter, and again by each later call.

    Args:
        total_frames: the most frames ever delivered (``float("inf")``: no limit).
        has_buffer: whether delivered batches go into a replay buffer (a local one, or a Ray one the nodes write).
        batches: iterates the collector, delivering one batch a step.

    Keyword Args:
        while_held: called while the background thread holds; stop: ends the background thread.
        name: the background thread's name.

    Examples:
        >>> frames = DeliveredFrames(total_frames=128, has_buffer=True, batches=lambda: iter(()))
        >>> frames.allow(64)
        >>> frames.add(64)
        >>> frames.written, frames.wait_for(64, timeout=0), frames.wait_for(128, timeout=0.01)
        (64, True, False)
    """

    def __init__(self, *, total_frames: int | float, has_buffer: bool, batches: Callable[[], Iterator],
                 while_held: Callable[[], None] = lambda: None, stop: Callable[[], bool] = lambda: False,
                 name: str = "torchrl_unilab-delivery", interval: float = 0.5) -> None:
        self._cond = threading.Condition()
        self._written = 0
        self._allowed: float = 0
        self._busy = False  # the background thread has a batch in flight
        self._error: BaseException | None = None
        self._total, self._has_buffer = total_frames, has_buffer
        self._batches, self._while_held, self._stop, self._name = batches, while_held, stop, name
        self._interval = interval
        self._thread: threading.Thread | None = None

    started = True
    restored = 0

    @property
    def written(self) -> int:
        return self._written

    @property
    def total(self) -> int | float:
        return self._total

    @property
    def collecting(self) -> bool:
        """Whether the background thread was started."""
        return self._thread is not None

    def reachable(self) -> int:
        return self._written

    def begin(self) -> None:
        pass  # the nodes collect from their start

    def require_buffer(self, what: str) -> None:
        if not self._has_buffer:
            raise RuntimeError("background collection needs replay_buffer= (a local ReplayBuffer or a RayReplayBuffer)")

    def collect_in_background(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
            self._thread.start()

    def _run(self) -> None:
        try:
            batches = self._batches()
            while not self._stop():
                if not self._claim():
                    return
                try:
                    if next(batches, StopIteration) is StopIteration:
                        return
                finally:
                    with self._cond:
                        self._busy = False
                        self._cond.notify_all()
        except BaseException as err:  # noqa: BLE001 - handed to the learner's thread
            self.fail(err)

    def _claim(self) -> bool:
        """Holds while the allowance is reached, until ``stop()``; then marks a batch in flight."""
        with self._cond:
            while self._written >= self._allowed and not self._stop():
                self._cond.wait(self._interval)
                self._while_held()
            if self._stop():
                return False
            self._busy = True
            return True

    def join(self, timeout: float) -> None:
        """Waits up to ``timeout`` seconds for the background thread to end (once ``stop()`` holds)."""
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=timeout)

    def allow(self, frames: int | float | None) -> None:
        with self._cond:
            self._allowed = float("inf") if frames is None else frames
            self._cond.notify_all()

    def freeze(self) -> int | float:
        with self._cond:
            previous, self._allowed = self._allowed, self._written
            return previous

    def settled(self) -> bool:
        return not self._busy

    def add(self, frames: int) -> None:
        """Counts a delivered batch."""
        with self._cond:
            self._written += frames
            self._cond.notify_all()

    def fail(self, error: BaseException) -> None:
        """Hands the background thread's failure to the waiters."""
        with self._cond:
            self._error = error
            self._cond.notify_all()

    def raise_if_failed(self) -> None:
        """Raises the failure given to :meth:`fail`, on every call: a later wait would otherwise block for good."""
        if self._error is not None:
            raise self._error

    def wait(self, predicate: Callable[[], bool], timeout: float | None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while not predicate():
                self.raise_if_failed()
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cond.wait(0.1 if left is None else min(left, 0.1))
        self.raise_if_failed()
        return True

    def wait_for(self, frames: int, timeout: float | None) -> bool:
        return self.wait(lambda: self._written >= frames, timeout)
