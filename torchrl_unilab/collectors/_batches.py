"""Batches handed from workers to the parent when there is no replay buffer.

Each worker owns two slots of a shared-memory TensorDict laid out from the
env's first row. A worker fills a free slot with a whole batch and stamps it
with the time; the parent takes the oldest filled slot, copies it out and frees
it. Two slots per worker let a worker collect its next batch while the parent
reads the last one; a worker whose slots are both full waits, which is the
backpressure ``MultiAsyncCollector``'s queue gives. The parent remembers the
first row of the last batch it took from each worker, so that a dead worker's
batch can be found either in its slots or among those handed over
(:meth:`BatchSlots.holds`). Plain shared tensors and
polling keep this free of semaphores and queues that a killed process could
leave locked.

A replay buffer that this process writes (not shared between processes) is fed
from the same slots: by the iterating loop, or, once collection runs in the
background (``start()``), by a :class:`FeedThread`. :class:`BatchHandover` holds
the slots, that writer and its thread for the collector.

A batch that TorchRL's ``storing_device`` puts elsewhere than on the CPU is moved there once, whole, as it is
yielded (:func:`to_storing_device`).
"""

from __future__ import annotations

import inspect
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from tensordict import TensorDictBase
from tensordict.utils import NestedKey

__all__ = ["BatchHandover", "BatchSlots", "FeedThread", "SlotWriter", "to_storing_device", "torchrl_layout"]

_FREE, _FILLED = 0, 1


def torchrl_layout(rows: TensorDictBase, num_envs: int, env_batch_size: torch.Size) -> TensorDictBase:
    """A worker's step-major rows laid out as TorchRL's collectors yield a batch: the env's batch dims, then time.

    Workers write rows flat, step ``t`` of env ``e`` at ``t * num_envs + e``, which is what a
    replay buffer takes. A ``MultiAsyncCollector`` yields ``[*env.batch_size, T]`` with the last
    dimension named ``"time"`` (``[T]`` for an unbatched env), and scripts and postprocs
    (``MultiStep``, ``split_trajectories``) index it so.

    Examples:
        >>> from tensordict import TensorDict
        >>> rows = TensorDict({"t": torch.arange(3).repeat_interleave(2)}, [6])  # 3 steps of 2 envs
        >>> batch = torchrl_layout(rows, 2, torch.Size([2]))
        >>> batch["t"].tolist(), batch.names
        ([[0, 1, 2], [0, 1, 2]], [None, 'time'])
        >>> torchrl_layout(rows[::2], 1, torch.Size([])).names
        ['time']
    """
    out = rows.reshape(-1, num_envs).transpose(0, 1)
    if env_batch_size.numel() == num_envs and tuple(env_batch_size) != tuple(out.batch_size[:1]):
        out = out.reshape(*env_batch_size, -1)  # an env with several batch dims
    out.names = [None] * (out.batch_dims - 1) + ["time"]
    return out


def to_storing_device(batch: TensorDictBase, device: torch.device | None) -> TensorDictBase:
    """``batch`` on TorchRL's ``storing_device``: as it is on the CPU (or ``None``), else moved there in one copy.

    The batch is a new TensorDict that nothing else reads, so a CUDA copy is issued from pinned memory without
    blocking; work queued after it on the same stream sees the data.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> batch = TensorDict({"observation": torch.zeros(4, 3)}, batch_size=[4])
        >>> to_storing_device(batch, torch.device("cpu")) is batch
        True
        >>> to_storing_device(batch, torch.device("meta"))["observation"].device
        device(type='meta')
    """
    if device is None or device.type == "cpu":
        return batch
    if device.type == "cuda":
        return batch.pin_memory().to(device, non_blocking=True)
    return batch.to(device)


class BatchSlots:
    """Per-worker double buffers in shared memory.

    Args:
        row: one transition (batch size ``[]``) with every key a worker writes.
        num_workers: number of workers.
        frames_per_batch: rows per batch.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> slots = BatchSlots(TensorDict({"x": torch.zeros(2)}, []), num_workers=1, frames_per_batch=3)
        >>> SlotWriter(slots, 0, lambda: False).extend(TensorDict({"x": torch.ones(3, 2)}, [3]))
        >>> slots.take(timeout=1.0, on_poll=lambda: None)["x"].sum().item()
        6.0
        >>> slots.holds(0, {"x": 1}), slots.holds(0, {"x": 2})
        (True, False)
    """

    def __init__(self, row: TensorDictBase, num_workers: int, frames_per_batch: int, slots_per_worker: int = 2) -> None:
        self.data = row.expand(num_workers, slots_per_worker, frames_per_batch).clone().share_memory_()
        # state, number of rows, fill time (ns), per slot
        self.meta = torch.zeros(num_workers, slots_per_worker, 3, dtype=torch.int64).share_memory_()
        # Parent side: the first row of the last batch taken from each worker. Not sent to workers: pickled with a
        # replacement's arguments, the caller's batch went to shared memory, and one replaced by take() meanwhile
        # was freed with its descriptor still to be sent (the fork server: "Bad file descriptor", 7 of 13 runs).
        self.last_taken: list[TensorDictBase | None] = [None] * num_workers

    def __getstate__(self) -> dict:
        return {**self.__dict__, "last_taken": [None] * len(self.last_taken)}

    def take(self, timeout: float | None, on_poll: Callable[[], None],
             exclude: Sequence[NestedKey] = ()) -> TensorDictBase | None:
        """Returns a copy of the oldest filled batch, without the keys ``exclude``, and frees its slot; ``None`` on
        timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = 1e-4
        while True:
            filled = self.meta[..., 0] == _FILLED
            if filled.any():
                stamps = torch.where(filled, self.meta[..., 2], torch.iinfo(torch.int64).max)
                worker, slot = divmod(int(stamps.argmin()), stamps.shape[1])
                rows = int(self.meta[worker, slot, 1])
                view = self.data[worker, slot, :rows]
                # before the slot is free (holds() looks at the slots first); a copy, since the caller may change
                # its batch in place (a 12-key row: 40 us per batch, 17 for a view)
                self.last_taken[worker] = view[0].clone()
                out = (view.exclude(*exclude) if exclude else view).clone()  # only the keys handed over
                self.meta[worker, slot, 0] = _FREE
                return out
            on_poll()
            if deadline is not None and time.monotonic() > deadline:
                return None
            time.sleep(delay)
            delay = min(delay * 2, 0.005)

    def holds(self, worker_idx: int, values: Mapping[NestedKey, int]) -> bool:
        """Parent side: whether worker ``worker_idx``'s batch whose first row has these values was handed over
        whole (a filled slot, or the last batch taken from it).

        For a dead worker's last batch, like
        :func:`~torchrl_unilab.data.replay_buffer.holds_row` for a buffer: a
        slot is filled only once its rows are all in, so one it died
        copying into is not found.
        """
        def first_row_is(row: TensorDictBase) -> bool:
            return all(int(row.get(key).reshape(-1)[0]) == value for key, value in values.items())

        meta = self.meta[worker_idx]
        for slot in range(meta.shape[0]):
            if int(meta[slot, 0]) == _FILLED and first_row_is(self.data[worker_idx, slot, 0]):
                return True
        last = self.last_taken[worker_idx]
        return last is not None and first_row_is(last)


class SlotWriter:
    """Worker side of :class:`BatchSlots`: ``extend(batch)`` like a replay buffer.

    Args:
        slots: the shared slots.
        worker_idx: whose slots to fill.
        should_stop: polled while both slots are full; a true value drops the batch.
    """

    def __init__(self, slots: BatchSlots, worker_idx: int, should_stop: Callable[[], bool]) -> None:
        self.slots = slots
        self.idx = worker_idx
        self.should_stop = should_stop

    def extend(self, batch: TensorDictBase) -> None:
        """Copies ``batch`` (at most ``frames_per_batch`` rows) into a free slot, waiting for one."""
        meta = self.slots.meta[self.idx]
        delay = 1e-4
        while not bool((meta[:, 0] == _FREE).any()):
            if self.should_stop():
                return
            time.sleep(delay)
            delay = min(delay * 2, 0.005)
        slot = int((meta[:, 0] == _FREE).nonzero()[0])
        rows = batch.shape[0]
        self.slots.data[self.idx, slot, :rows].update_(batch)
        meta[slot, 1] = rows
        meta[slot, 2] = time.monotonic_ns()
        meta[slot, 0] = _FILLED  # last: the parent reads the slot only once this is set


class FeedThread:
    """A thread of the parent that moves each batch handed over into a writer until stopped.

    Args:
        take: returns the next batch, or ``None`` when none came within the given seconds.
        write: consumes one batch (a :class:`~torchrl_unilab.data.local_writer.LocalBufferWriter`'s ``write``).

    An error from either ends the thread and is kept in :attr:`error`, for the
    collector to raise in the user's thread. Bound methods are held weakly, so
    that a collector dropped without ``shutdown()`` is still collected (and its
    finaliser stops this thread).

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> slots = BatchSlots(TensorDict({"x": torch.zeros(())}, []), num_workers=1, frames_per_batch=2)
        >>> seen = []
        >>> feed = FeedThread(lambda timeout: slots.take(timeout, on_poll=lambda: None), seen.append)
        >>> SlotWriter(slots, 0, lambda: False).extend(TensorDict({"x": torch.ones(2)}, [2]))
        >>> while not seen:
        ...     time.sleep(0.01)
        >>> feed.stop(); seen[0]["x"].tolist(), feed.error
        ([1.0, 1.0], None)
    """

    def __init__(self, take: Callable[[float], TensorDictBase | None], write: Callable[[TensorDictBase], None]) -> None:
        self._take, self._write = _weak(take), _weak(write)
        self._stop = threading.Event()
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="torchrl_unilab-feed", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                take, write = self._take(), self._write()
                if take is None or write is None:
                    return  # their owner is gone
                batch = take(0.05)
                if batch is not None:
                    write(batch)
                del take, write, batch  # no strong reference to the owner between batches
        except BaseException as err:  # noqa: BLE001 - raised in the user's thread by the collector
            self.error = err

    @property
    def alive(self) -> bool:
        """Whether the thread still feeds."""
        return self._thread.is_alive()

    def stop(self, timeout: float = 10.0) -> None:
        """Stops the thread once the batch it is writing is in (it takes no new one)."""
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout)


class BatchHandover:
    """Batches the workers hand to this process, and the buffer this process writes with them.

    Without a replay buffer the workers write whole batches into :class:`BatchSlots` (:meth:`open` lays them
    out) and this process takes them (:meth:`take`). A replay buffer the workers cannot write is written here
    (:meth:`write_local`): by the iterating loop, or once collection runs in the background by a
    :class:`FeedThread` (:meth:`start_feed`) that takes each batch with ``take`` and writes it.

    Args:
        local: the writer of a buffer this process writes, or ``None``.
        take: what the feed thread takes each batch with (a timeout in seconds; ``None`` if none came).

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> handover = BatchHandover(None, take=lambda timeout: None)
        >>> slots = handover.open(TensorDict({"x": torch.zeros(())}, []), num_workers=1, frames_per_batch=2)
        >>> SlotWriter(slots, 0, lambda: False).extend(TensorDict({"x": torch.ones(2)}, [2]))
        >>> handover.take(1.0, on_poll=lambda: None)["x"].tolist(), handover.handed_over
        ([1.0, 1.0], 2)
    """

    def __init__(self, local: Any, *, take: Callable[[float], TensorDictBase | None]) -> None:
        self._local = local
        self._take_for_feed = take
        self._slots: BatchSlots | None = None
        self._feed: FeedThread | None = None
        self._frames_per_batch = 0
        self.fed = 0  # frames of the batches written into the local buffer
        self.handed_over = 0  # frames of the batches taken from the slots

    @property
    def writes_locally(self) -> bool:
        """Whether this process writes the replay buffer (the workers cannot)."""
        return self._local is not None

    @property
    def feeding(self) -> bool:
        """Whether the feed thread writes the local buffer in the background."""
        return self._feed is not None

    def open(self, row: TensorDictBase, num_workers: int, frames_per_batch: int) -> BatchSlots:
        """Lays the slots out from one row, for ``num_workers`` workers' batches of ``frames_per_batch`` rows."""
        self._slots = BatchSlots(row, num_workers, frames_per_batch)
        self._frames_per_batch = frames_per_batch
        return self._slots

    def take(self, timeout: float | None, on_poll: Callable[[], None],
             exclude: Sequence[NestedKey] = ()) -> TensorDictBase | None:
        """The oldest batch a worker handed over, less the ``exclude`` keys; ``None`` after ``timeout`` s."""
        out = self._slots.take(timeout=timeout, on_poll=on_poll, exclude=exclude)
        if out is not None:
            self.handed_over += self._frames_per_batch
        return out

    def holds(self, worker_idx: int, first_row: Mapping[NestedKey, int]) -> bool:
        """Whether worker ``worker_idx``'s batch that starts with ``first_row`` was handed over
        (:meth:`BatchSlots.holds`)."""
        return self._slots.holds(worker_idx, first_row)

    def write_local(self, batch: TensorDictBase, frames: int) -> None:
        """Writes a batch of ``frames`` frames (as the workers count them) into the local buffer."""
        self._local.write(batch)
        self.fed += frames

    def start_feed(self) -> None:
        """Starts the feed thread, for a buffer this process writes, if it is not running."""
        if self._local is not None and self._feed is None:
            self._feed = FeedThread(self._take_for_feed, self._write_fed)

    def _write_fed(self, batch: TensorDictBase) -> None:
        self.write_local(batch, self._frames_per_batch)

    def raise_if_failed(self) -> None:
        """Raises the feed thread's error, if it failed."""
        if self._feed is not None and self._feed.error is not None:
            raise self._feed.error

    def stop(self) -> None:
        """Stops the feed thread once the batch it writes is in."""
        if self._feed is not None:
            self._feed.stop()


def _weak(fn: Callable) -> Callable[[], Callable | None]:
    """A weak reference to a bound method; a plain callable is held as it is."""
    if inspect.ismethod(fn):
        return weakref.WeakMethod(fn)
    return lambda: fn
