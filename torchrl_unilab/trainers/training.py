"""The learner side of the recipes that is not the algorithm: update-to-data pacing, schedules, signals.

* :class:`UTDController` holds gradient updates per collected frame at
  ``utd_ratio``: the learner waits for data when it is ahead, and the
  collector's workers are paused (``allow_frames``) when they are ahead.
* :class:`Every` fires when a frame count crosses a multiple of a period.
* :class:`GracefulStop` turns Ctrl-C and SIGTERM into a request the loop polls.

The gradient update itself (loss, backward, optimiser step, target update)
is written out in each recipe, ``recipes/sac.py`` and ``recipes/td3.py``.
"""

from __future__ import annotations

import math
import signal
import threading
import time

from tensordict import TensorDictBase
from torch import nn
from torchrl.data import ReplayBuffer

from torchrl_unilab.data.replay_buffer import buffer_lock
from torchrl_unilab.modules.normalization import ObservationNormalizer

__all__ = ["Every", "GracefulStop", "UTDController", "policy_lag", "trainable_parameters", "update_normalizer"]

def update_normalizer(normalizer: ObservationNormalizer, replay_buffer: ReplayBuffer) -> int:
    """``normalizer.update_from_buffer(replay_buffer)`` (its own key) under the buffer's write lock; returns rows read.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl_unilab import make_replay_buffer
        >>> rb = make_replay_buffer(10)
        >>> _ = rb.extend(TensorDict({"observation": torch.ones(4, 2)}, [4]))
        >>> update_normalizer(ObservationNormalizer(2), rb)
        4
    """
    with buffer_lock(replay_buffer):
        return normalizer.update_from_buffer(replay_buffer)


def policy_lag(batch: TensorDictBase, published_version: int) -> float:
    """Mean of ``published_version - batch["policy_version"]`` over rows not drawn at random.

    Rows written during the random phase carry version ``-1`` and are left out;
    ``nan`` when every row is random.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> batch = TensorDict({"policy_version": torch.tensor([3, 5, -1])}, [3])
        >>> policy_lag(batch, published_version=5)
        1.0
    """
    version = batch.get("policy_version")
    acted = version >= 0
    if not bool(acted.any()):
        return float("nan")
    return float(published_version - version[acted].double().mean())


class Every:
    """Fires once each time a counter crosses a multiple of ``period`` (``period <= 0``: never).

    Not :class:`torchrl.record.loggers.monitoring.Every`: that one is a
    schedule a ``LoggerMonitor`` applies to the counters of a watched object's
    ``stats()``, polled by the monitor. The recipes decide in their own loop,
    after each update, whether logging, evaluation or a checkpoint is due; the
    frame count jumps by whole batches there, so a multiple is rarely hit
    exactly, and a resumed run starts past 0.

    Args:
        period: the interval, e.g. in frames.

    Keyword Args:
        start: the counter value already reached (a resumed run starts past 0).

    Examples:
        >>> every = Every(1000)
        >>> [every(frames) for frames in (500, 1000, 1200, 2500)]
        [False, True, False, True]
    """

    def __init__(self, period: int, *, start: int = 0) -> None:
        self.period = int(period)
        self.next = (start // self.period + 1) * self.period if self.period > 0 else math.inf

    def __call__(self, value: int) -> bool:
        if value < self.next:
            return False
        self.next = (value // self.period + 1) * self.period
        return True


class UTDController:
    """Holds gradient updates per collected frame at ``utd_ratio``, on average, by pacing both sides.

    With ``F`` frames written in the run and ``N`` updates done, the learner may
    run update ``N + 1`` once ``F >= learning_starts + (N + 1) / utd_ratio``:

    * learner ahead: :meth:`wait` blocks (``collector.wait_for_frames``) until
      the collector has written those frames;
    * collector ahead: after each update, :meth:`step` caps collection at
      ``learning_starts + N / utd_ratio + max_lead_frames`` frames
      (``collector.allow_frames``); workers that reach the cap pause, no data
      is dropped.

    So ``N`` trails ``utd_ratio * (F - learning_starts)`` by at most
    ``utd_ratio * max_lead_frames`` updates (plus one batch per worker in
    flight), and the run ends with ``N = utd_ratio * (total_frames - learning_starts)``.

    Lock-step (``lockstep=True``): workers stay paused while the learner
    trains; when the learner has used up the data, :meth:`wait` lets the
    collector write one more ``frames_per_batch`` chunk (more while it is below
    ``learning_starts``) and waits for it. With one worker and a seeded torch
    RNG, runs are then reproducible update by update.

    Args:
        collector: an :class:`~torchrl_unilab.OffPolicyCollector` that has not
            been started (``start()``) or iterated.
        utd_ratio: gradient updates per collected frame (``> 0``).

    Keyword Args:
        learning_starts: frames collected before the first update (the run's
            count, ``>= 0``).
        total_frames: the run's frame budget.
        max_lead_frames: how far, in frames, collection may run ahead of the
            learner; at least ``frames_per_batch + ceil(1 / utd_ratio)`` so that
            a waiting learner always lets a worker claim a batch.
        lockstep: alternate collection and training (see above).
        frames_offset: frames collected before this collector (a resumed run).
        updates: updates done before this collector (a resumed run).

    Examples:
        >>> from types import SimpleNamespace
        >>> collector = SimpleNamespace(frames_per_batch=64, frames_written=0, allow_frames=lambda n: None)
        >>> utd = UTDController(collector, 0.5, learning_starts=1000, total_frames=3000, max_lead_frames=512)
        >>> utd.total_updates, utd.updates_available()
        (1000, 0)
        >>> collector.frames_written = 1400
        >>> utd.updates_available()
        200
    """

    def __init__(
        self,
        collector,
        utd_ratio: float,
        *,
        learning_starts: int,
        total_frames: int,
        max_lead_frames: int,
        lockstep: bool = False,
        frames_offset: int = 0,
        updates: int = 0,
    ) -> None:
        if isinstance(utd_ratio, bool) or not isinstance(utd_ratio, (int, float)) or not utd_ratio > 0:
            raise ValueError(f"optim.utd_ratio must be a number > 0, got {utd_ratio!r}")
        if learning_starts < 0:
            raise ValueError(f"learning_starts must be >= 0, got {learning_starts}")
        fpb = collector.frames_per_batch
        minimum = fpb + math.ceil(1 / utd_ratio)
        if not lockstep and max_lead_frames < minimum:
            raise ValueError(
                f"collector.max_lead_frames must be >= frames_per_batch + ceil(1 / utd_ratio) = {minimum} "
                f"(frames_per_batch={fpb}, utd_ratio={utd_ratio}), got {max_lead_frames}"
            )
        self.collector = collector
        self.utd_ratio = float(utd_ratio)
        self.learning_starts = int(learning_starts)
        self.total_frames = int(total_frames)
        self.max_lead_frames = int(max_lead_frames)
        self.lockstep = lockstep
        self.frames_offset = int(frames_offset)
        self.updates = int(updates)
        self.total_updates = self._updates_for(self.total_frames)
        self.waited_s = 0.0
        self._window = (max(self.frames, self.learning_starts), self.updates)
        if not lockstep:
            self._throttle()

    def _updates_for(self, frames: int) -> int:
        # The small epsilon keeps e.g. 0.1 * 30 from rounding down to 2.
        return max(0, math.floor(self.utd_ratio * (frames - self.learning_starts) + 1e-9))

    def _frames_for(self, updates: int) -> int:
        return self.learning_starts + math.ceil(updates / self.utd_ratio - 1e-9)

    @property
    def frames(self) -> int:
        """Frames written in the run so far (resumed runs included)."""
        return self.frames_offset + self.collector.frames_written

    @property
    def done(self) -> bool:
        """Whether the run's updates are all done."""
        return self.updates >= self.total_updates

    def updates_available(self) -> int:
        """Updates the learner may run now without waiting for data."""
        return min(self._updates_for(self.frames), self.total_updates) - self.updates

    def achieved(self) -> float:
        """Updates per frame since learning started (``nan`` before).

        While the collector leads, this trails ``utd_ratio`` by up to
        ``max_lead_frames / (frames - learning_starts)``; at the end of a run it is exact.
        """
        frames = self.frames - self.learning_starts
        return self.updates / frames if frames > 0 else float("nan")

    def window(self) -> float:
        """Updates per frame since the previous call, counting frames past ``learning_starts`` only.

        The rate the controller holds: in steady state it equals ``utd_ratio``
        up to one collector batch per window (``nan`` if no frame arrived).
        """
        frames, updates = max(self.frames, self.learning_starts), self.updates
        last_frames, last_updates = self._window
        self._window = (frames, updates)
        return (updates - last_updates) / (frames - last_frames) if frames > last_frames else float("nan")

    def wait(self) -> None:
        """Returns once update ``updates + 1`` has its data; in lock-step, collects the next chunk first."""
        if self.updates_available() > 0:
            return
        need = self._frames_for(self.updates + 1) - self.frames_offset
        if self.lockstep:
            written = self.collector.frames_written
            chunk = self.collector.frames_per_batch
            need = written + max(chunk, -(-(need - written) // chunk) * chunk)
            self.collector.allow_frames(need)
        started = time.perf_counter()
        self.collector.wait_for_frames(need)
        self.waited_s += time.perf_counter() - started

    def step(self) -> None:
        """Counts one update done and, unless in lock-step, moves the collector's cap."""
        self.updates += 1
        if not self.lockstep:
            self._throttle()

    def _throttle(self) -> None:
        cap = self._frames_for(self.updates) + self.max_lead_frames - self.frames_offset
        self.collector.allow_frames(max(cap, 0))


def trainable_parameters(module: nn.Module) -> list[nn.Parameter]:
    """The parameters of ``module`` that require gradients, each once.

    Examples:
        >>> import torch
        >>> layer = torch.nn.Linear(2, 1)
        >>> _ = layer.bias.requires_grad_(False)
        >>> len(trainable_parameters(layer))
        1
    """
    seen, out = set(), []
    for param in module.parameters():
        if param.requires_grad and id(param) not in seen:
            seen.add(id(param))
            out.append(param)
    return out


class GracefulStop:
    """Turns the first Ctrl-C or SIGTERM into a request the training loop polls; a second one interrupts.

    TorchRL's losses catch exceptions raised inside their modules and may turn
    a ``KeyboardInterrupt`` into another error, so the recipes do not let
    SIGINT raise in the middle of an update: inside this context, SIGINT only
    sets :attr:`requested`, and the loop ends after the current update, saves
    a checkpoint and shuts the collector down. SIGTERM, which ``timeout``,
    Slurm preemption and container stops send, is handled the same way, so a
    preempted run also ends with a checkpoint and without residue. A second
    signal raises ``KeyboardInterrupt`` as usual. Outside the main thread it
    does nothing.

    Examples:
        >>> import os, signal
        >>> with GracefulStop() as stop:
        ...     os.kill(os.getpid(), signal.SIGTERM)
        ...     stop.requested, stop.signal_name
        (True, 'SIGTERM')
    """

    #: The signals handled.
    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.requested = False
        self.signal_name: str | None = None
        self._previous: dict = {}

    def _handle(self, signum, frame) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        self.signal_name = signal.Signals(signum).name

    def __enter__(self) -> GracefulStop:
        if threading.current_thread() is threading.main_thread():
            self._previous = {signum: signal.signal(signum, self._handle) for signum in self.SIGNALS}
        return self

    def __exit__(self, *exc) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)
        self._previous = {}
