"""The learner side of the recipes: the gradient update, batch sampling and update-to-data control.

* :class:`UpdateStep` runs one update of TorchRL's ``SACLoss`` or ``TD3Loss``:
  loss, one backward, one fused Adam step, the soft target update.
* :class:`BufferSampler` draws uniform batches from the shared replay buffer
  into tensors it reuses, without rebuilding a TensorDict per step.
* :class:`UTDController` holds gradient updates per collected frame at
  ``utd_ratio``: the learner waits for data when it is ahead, and the
  collector's workers are paused (``allow_frames``) when they are ahead.
"""

from __future__ import annotations

import math
import signal
import threading
import time
from collections.abc import Sequence

import torch
from tensordict import NestedKey, TensorDict, TensorDictBase
from torch import nn
from torchrl.data import ReplayBuffer
from torchrl.objectives import LossModule, TD3Loss
from torchrl.objectives.utils import TargetNetUpdater

from torchrl_unilab.data.replay_buffer import buffer_lock
from torchrl_unilab.modules.normalization import ObservationNormalizer
from torchrl_unilab.objectives._fast_loss import tensor_loss

__all__ = ["SAMPLE_KEYS", "BufferSampler", "Every", "GracefulStop", "UTDController", "UpdateStep", "policy_lag",
           "trainable_parameters", "update_normalizer"]

#: Keys :class:`BufferSampler` gathers by default: what the SAC and TD3 losses
#: read, and the policy version of each row (for :func:`policy_lag`).
SAMPLE_KEYS: tuple[NestedKey, ...] = (
    "observation",
    "action",
    ("next", "observation"),
    ("next", "reward"),
    ("next", "done"),
    ("next", "terminated"),
    "policy_version",
)


class UpdateStep:
    """One gradient update: ``loss_module(batch)``, backward, optimizer step, target update.

    All losses (actor, critics, entropy coefficient) are summed and
    back-propagated once; they touch disjoint parameters (TorchRL's losses
    detach the critic inside the actor loss), so a single optimizer over all
    parameters is exact and costs one fused Adam kernel per step instead of three.

    With a :class:`~torchrl.objectives.TD3Loss` and ``policy_delay=d``, the
    actor loss and the target update run on every ``d``-th update only; the
    other updates compute ``loss_module.value_loss`` alone, and the actor's
    parameters, having no gradient, are skipped by the optimizer.

    With ``fast_loss=True`` (the default) and networks from
    :mod:`torchrl_unilab.modules.models`, the losses are computed by a tensor-level
    equivalent of the loss module (same parameters, same random draws, equal
    values and gradients; about 1.6x the updates/s on CPU, see
    ``benchmarks/learner_throughput.py``); other networks or loss settings use
    the loss module itself (:attr:`uses_tensor_loss` says which).

    ``compile=True`` wraps loss and backward in :func:`torch.compile` (the
    first calls take tens of seconds on CPU; see ``benchmarks/README.md``).

    Args:
        loss_module: a TorchRL ``SACLoss`` or ``TD3Loss``.
        optimizer: optimises every trainable parameter of ``loss_module``
            (see :func:`torchrl_unilab.trainers.recipes_utils.make_optimizer`).
        target_updater: e.g. ``SoftUpdate(loss_module, eps=0.995)``.

    Keyword Args:
        policy_delay: update the actor (and targets) every ``policy_delay``
            updates; ``> 1`` only with ``TD3Loss``.
        fast_loss: use the tensor-level loss where the networks allow it.
        compile: compile loss and backward with :func:`torch.compile`.
        compile_mode: the ``mode`` passed to :func:`torch.compile`.

    Examples:
        >>> import torch
        >>> from torchrl.objectives import SACLoss, SoftUpdate
        >>> from torchrl_unilab.modules.models import make_actor, make_critic
        >>> from torchrl_unilab.trainers.training import UpdateStep
        >>> loss = SACLoss(make_actor("sac", 3, 1, hidden_dim=8), make_critic(3, 1, hidden_dim=8))
        >>> opt = torch.optim.Adam([p for p in loss.parameters() if p.requires_grad], lr=1e-3)
        >>> update = UpdateStep(loss, opt, SoftUpdate(loss, eps=0.99))
        >>> batch = TensorDict({"observation": torch.randn(4, 3), "action": torch.rand(4, 1),
        ...     ("next", "observation"): torch.randn(4, 3), ("next", "reward"): torch.randn(4, 1),
        ...     ("next", "done"): torch.zeros(4, 1, dtype=torch.bool),
        ...     ("next", "terminated"): torch.zeros(4, 1, dtype=torch.bool)}, [4])
        >>> sorted(update(batch).keys())
        ['alpha', 'entropy', 'loss_actor', 'loss_alpha', 'loss_qvalue']
        >>> update.updates, update.uses_tensor_loss
        (1, True)
    """

    def __init__(
        self,
        loss_module: LossModule,
        optimizer: torch.optim.Optimizer,
        target_updater: TargetNetUpdater,
        *,
        policy_delay: int = 1,
        fast_loss: bool = True,
        compile: bool = False,
        compile_mode: str | None = None,
    ) -> None:
        if isinstance(policy_delay, bool) or not isinstance(policy_delay, int) or policy_delay < 1:
            raise ValueError(f"policy_delay must be an int >= 1, got {policy_delay!r}")
        self.is_td3 = isinstance(loss_module, TD3Loss)
        if policy_delay > 1 and not self.is_td3:
            raise ValueError(
                f"policy_delay > 1 needs a TD3Loss, got policy_delay={policy_delay} with {type(loss_module).__name__}"
            )
        self.loss_module = loss_module
        self.optimizer = optimizer
        self.target_updater = target_updater
        self.policy_delay = policy_delay
        self.updates = 0
        self._tensor_loss = tensor_loss(loss_module) if fast_loss else None
        full, critic = self._full_loss, self._critic_loss
        if compile:
            full = torch.compile(full, mode=compile_mode)
            critic = torch.compile(critic, mode=compile_mode)
        self._full, self._critic = full, critic

    @property
    def uses_tensor_loss(self) -> bool:
        """Whether updates run the tensor-level loss (``fast_loss``) rather than the loss module."""
        return self._tensor_loss is not None

    def _full_loss(self, batch: TensorDictBase) -> TensorDictBase:
        if self._tensor_loss is not None:
            losses = self._tensor_loss(batch)
            _total(losses).backward()
            return TensorDict({key: value.detach() for key, value in losses.items()})
        losses = self.loss_module(batch)
        _total(losses).backward()
        return losses.detach()

    def _critic_loss(self, batch: TensorDictBase) -> TensorDictBase:
        if self._tensor_loss is not None:
            loss = self._tensor_loss(batch, update_actor=False)["loss_qvalue"]
        else:
            loss, _ = self.loss_module.value_loss(batch)
        loss.backward()
        return TensorDict({"loss_qvalue": loss.detach()})

    def __call__(self, batch: TensorDictBase) -> TensorDictBase:
        """Runs one update on ``batch``; returns the detached losses (and SAC's alpha, entropy)."""
        update_actor = self.updates % self.policy_delay == 0
        losses = self._full(batch) if update_actor else self._critic(batch)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if update_actor or not self.is_td3:
            self.target_updater.step()
        self.updates += 1
        return losses


def _total(losses: TensorDictBase | dict[str, torch.Tensor]) -> torch.Tensor:
    return sum(value for key, value in losses.items() if key.startswith("loss_"))


class BufferSampler:
    """Uniform batches of ``keys`` from a shared replay buffer, gathered into reused tensors.

    ``replay_buffer.sample()`` takes about 1.5 ms per batch of 256 on a small
    CPU: the sampler, the storage and the TensorDict machinery. This sampler
    draws ``torch.randint(len(buffer), (batch_size,))`` -- the distribution of
    TorchRL's ``RandomSampler`` -- and copies those rows of the storage
    straight into tensors allocated once (about 0.2 ms), holding the buffer's
    process-shared write lock so that no row is read half-written. The
    returned TensorDict and its tensors are the same objects on every call:
    use each batch before drawing the next.

    Args:
        replay_buffer: a buffer from :func:`torchrl_unilab.make_replay_buffer`,
            with its storage laid out (by the collector or by ``extend``).
        batch_size: rows per batch.

    Keyword Args:
        keys: the keys to gather; missing keys raise ``KeyError``.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl_unilab import make_replay_buffer
        >>> rb = make_replay_buffer(100)
        >>> _ = rb.extend(TensorDict({"observation": torch.arange(10.0)[:, None]}, [10]))
        >>> sampler = BufferSampler(rb, 4, keys=["observation"])
        >>> batch = sampler()
        >>> batch["observation"].shape, bool((batch["observation"] < 10).all())
        (torch.Size([4, 1]), True)
    """

    def __init__(
        self, replay_buffer: ReplayBuffer, batch_size: int, *, keys: Sequence[NestedKey] = SAMPLE_KEYS
    ) -> None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
        storage = replay_buffer.storage
        if not getattr(storage, "initialized", False):
            raise ValueError("replay_buffer's storage is not laid out yet; create the collector (or extend) first")
        self.replay_buffer = replay_buffer
        self.batch_size = batch_size
        data = storage._storage  # noqa: SLF001 - the memory-mapped TensorDict behind the storage
        self._sources = []
        out = TensorDict(batch_size=[batch_size])
        for key in keys:
            leaf = data.get(key)  # KeyError names the missing key
            leaf = leaf.as_tensor() if hasattr(leaf, "as_tensor") else leaf
            self._sources.append(leaf)
            out.set(key, torch.empty((batch_size, *leaf.shape[1:]), dtype=leaf.dtype))
        self._keys = list(keys)
        self._targets = [out.get(key) for key in keys]
        self._batch = out
        self._index = torch.empty(batch_size, dtype=torch.int64)
        self._lock = buffer_lock(replay_buffer)

    def __call__(self) -> TensorDictBase:
        """Draws one batch (the same TensorDict object each call, refilled)."""
        with self._lock:
            size = len(self.replay_buffer)  # buffer_lock holds the _replay_lock this takes
            if size == 0:
                raise RuntimeError("the replay buffer is empty; wait for frames before sampling")
            torch.randint(size, (self.batch_size,), out=self._index)
            for source, target in zip(self._sources, self._targets):
                torch.index_select(source, 0, self._index, out=target)
        # Put the tensors back: the caller may have replaced entries in place
        # (observation normalisation does) since the previous batch.
        batch = self._batch
        for key, target in zip(self._keys, self._targets):
            batch.set(key, target)
        return batch


def update_normalizer(normalizer: ObservationNormalizer, replay_buffer: ReplayBuffer) -> int:
    """``normalizer.update_from_buffer(replay_buffer)`` under the buffer's write lock; returns rows read.

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
