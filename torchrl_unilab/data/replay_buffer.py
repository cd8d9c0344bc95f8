"""A TorchRL replay buffer over a process-shared ``LazyMemmapStorage``.

Worker processes of :class:`~torchrl_unilab.OffPolicyCollector` write into the
buffer and the learner samples from it. Its write cursor, its 64-bit write count
and its length live in a memory-mapped file in the scratch directory, and one
process-wide lock that the kernel releases when its holder dies serialises each
``extend`` against the others and against ``sample``. Rows become visible only
after they are completely written, so a sampled row is never half written, even
when a writer is SIGKILLed in the middle of a write (see
:mod:`torchrl_unilab.data.buffer_writer`).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import weakref
from collections.abc import Mapping
from pathlib import Path

import torch
from tensordict import NestedKey, TensorDictBase, unravel_key
from torchrl.data import LazyMemmapStorage, ReplayBuffer
from torchrl.data.replay_buffers.samplers import RandomSampler, Sampler
from torchrl.data.replay_buffers.writers import TensorDictMaxValueWriter, TensorDictRoundRobinWriter

from torchrl_unilab._residue import SCRATCH_PREFIX, sweep_stale
from torchrl_unilab._torchrl_private import (
    buffer_locks,
    buffer_writer,
    lay_out_storage,
    set_write_lock,
    storage_tensors,
)
from torchrl_unilab.data.buffer_writer import CommitWriter

__all__ = ["buffer_lock", "holds_row", "make_replay_buffer", "init_storage", "prepare_storage", "storage_keys",
           "owned_scratch_dir", "writer_keys"]

_OWNED_DIR_ATTR = "_torchrl_unilab_owned_dir"
#: Set on a buffer laid out ahead of the collector from something else than its rows: names that thing.
LAYOUT_SOURCE_ATTR = "_torchrl_unilab_layout_source"


def make_replay_buffer(
    capacity: int,
    *,
    scratch_dir: str | os.PathLike | None = None,
    batch_size: int | None = None,
    sampler: Sampler | None = None,
    lock_timeout: float = 60.0,
) -> ReplayBuffer:
    """Builds a ``ReplayBuffer`` over a shared ``LazyMemmapStorage``.

    Args:
        capacity: number of transitions (rows) the ring buffer holds, ``>= 1``.

    Keyword Args:
        scratch_dir: where the memory-mapped files go. It must be empty or not
            exist yet (a stale storage is never overwritten). ``None`` creates a
            temporary directory that is removed when the buffer is garbage
            collected or the interpreter exits; directories that earlier,
            killed processes left there are removed first.
        batch_size: default ``sample()`` size.
        sampler: a TorchRL sampler; uniform ``RandomSampler`` by default.
        lock_timeout: seconds any ``extend``/``sample`` may wait for the
            buffer's lock before raising ``TimeoutError`` (a dead holder
            releases it at once; only a live, stuck one can hold it that long).

    Examples:
        >>> rb = make_replay_buffer(capacity=1000, batch_size=32)
        >>> rb.storage.max_size
        1000
    """
    if not isinstance(capacity, int) or capacity < 1:
        raise ValueError(f"capacity must be an int >= 1, got {capacity!r}")
    if isinstance(lock_timeout, bool) or not isinstance(lock_timeout, (int, float)) or not lock_timeout > 0:
        raise ValueError(f"lock_timeout must be a number of seconds > 0, got {lock_timeout!r}")
    owned = None
    if scratch_dir is None:
        sweep_stale(tempfile.gettempdir(), SCRATCH_PREFIX)
        owned = tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{os.getpid()}_")
        path = Path(owned)
    else:
        path = Path(scratch_dir)
        if path.exists() and any(path.iterdir()):
            raise FileExistsError(
                f"scratch_dir {str(path)!r} is not empty; LazyMemmapStorage would collide with the files there. "
                "Pass a new or empty directory, or scratch_dir=None for a temporary one."
            )
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    storage = LazyMemmapStorage(capacity, scratch_dir=str(path))
    writer = CommitWriter(path, lock_timeout=float(lock_timeout))
    rb = ReplayBuffer(storage=storage, sampler=sampler or RandomSampler(), writer=writer, batch_size=batch_size,
                      shared=True)
    # The lock TorchRL's extend() and sample() take; its multiprocessing.Lock stays held forever
    # once a holder is killed, the writer's lock does not.
    set_write_lock(rb, writer.lock)
    if owned is not None:
        setattr(rb, _OWNED_DIR_ATTR, owned)
        weakref.finalize(rb, shutil.rmtree, owned, True)
    return rb


def owned_scratch_dir(replay_buffer: ReplayBuffer) -> str | None:
    """The temporary directory :func:`make_replay_buffer` created for ``replay_buffer``, if any.

    Examples:
        >>> owned_scratch_dir(make_replay_buffer(10)) is not None
        True
    """
    return getattr(replay_buffer, _OWNED_DIR_ATTR, None)


def storage_keys(replay_buffer: ReplayBuffer) -> list | None:
    """The leaf keys of an initialised storage, or ``None`` before initialisation.

    Examples:
        >>> storage_keys(make_replay_buffer(10)) is None
        True
    """
    storage = replay_buffer.storage
    if not getattr(storage, "initialized", False):
        return None
    return sorted(storage_tensors(storage).keys(include_nested=True, leaves_only=True), key=str)


#: Writers that stamp each row they store with its storage index under ``"index"``
#: (``TensorDictReplayBuffer`` and its prioritized subclass build the first).
_INDEXING_WRITERS = (TensorDictRoundRobinWriter, TensorDictMaxValueWriter)


def writer_keys(replay_buffer: ReplayBuffer) -> dict[str, torch.Tensor]:
    """The entries ``replay_buffer``'s own writer adds to every row it stores, with a zero value of each.

    ``TensorDictReplayBuffer`` (and ``TensorDictPrioritizedReplayBuffer``) write
    through a ``TensorDictRoundRobinWriter``, which sets ``"index"`` (the row's
    storage index, int64) on the data before storing it. Rows a collector hands
    to that buffer's ``extend`` get it there, as any data does; a storage laid out
    ahead of the workers must have room for it.

    Examples:
        >>> from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
        >>> writer_keys(TensorDictReplayBuffer(storage=LazyTensorStorage(10)))
        {'index': tensor(0)}
        >>> writer_keys(make_replay_buffer(10))
        {}
    """
    if isinstance(buffer_writer(replay_buffer), _INDEXING_WRITERS):
        return {"index": torch.zeros((), dtype=torch.long)}
    return {}


def prepare_storage(replay_buffer: ReplayBuffer | None, row: TensorDictBase, frames_per_batch: int,
                    local: bool = False) -> list:
    """Lays out (or checks) the storage a collector's workers write; returns the keys each row holds.

    An empty buffer is laid out from ``row`` (:func:`init_storage`) and shared; a
    buffer this process extends (``local``) is laid out by its first ``extend``,
    as TorchRL does. A buffer laid out by the user (TorchRL's own
    pre-initialisation, or an ``OfflineToOnlineReplayBuffer``'s online part laid out
    like its offline dataset, :mod:`~torchrl_unilab.data.resolve`) gets the keys it
    has: a key it needs that the rows lack is an error, not a zero, unless the
    buffer's own writer fills it in (``TensorDictReplayBuffer``'s ``"index"``,
    :func:`writer_keys`), and so is a key whose shape or dtype differs from the rows'.

    Examples:
        >>> from tensordict import TensorDict
        >>> row = TensorDict({"observation": torch.zeros(3)}, [])
        >>> prepare_storage(make_replay_buffer(8), row, frames_per_batch=4)
        ['observation']
        >>> prepare_storage(make_replay_buffer(2), row, frames_per_batch=4)
        Traceback (most recent call last):
        ...
        ValueError: replay_buffer capacity 2 is below one batch (frames_per_batch=4); use a capacity >= frames_per_batch
        >>> laid_out = make_replay_buffer(8)
        >>> init_storage(laid_out, TensorDict({"observation": torch.zeros(4)}, []))
        >>> prepare_storage(laid_out, row, frames_per_batch=4)
        Traceback (most recent call last):
        ...
        ValueError: replay_buffer's storage holds 'observation' as torch.float32 of shape [4] per row; ...
    """
    all_keys = list(row.keys(include_nested=True, leaves_only=True))
    if replay_buffer is None:
        return all_keys
    if not isinstance(replay_buffer, ReplayBuffer):
        raise TypeError(f"replay_buffer must be a torchrl ReplayBuffer, got {type(replay_buffer).__name__}")
    capacity = replay_buffer.storage.max_size
    if capacity < frames_per_batch:
        raise ValueError(
            f"replay_buffer capacity {capacity} is below one batch (frames_per_batch={frames_per_batch}); "
            "use a capacity >= frames_per_batch"
        )
    have = storage_keys(replay_buffer)
    if have is None and local:
        return all_keys
    if have is None:
        init_storage(replay_buffer, row)
        tensors = storage_tensors(replay_buffer.storage)
        if not tensors.is_shared() and not tensors.is_memmap():
            tensors.share_memory_()
        return all_keys
    names = {str(k): k for k in all_keys}
    filled = set(writer_keys(replay_buffer))
    have = [k for k in have if str(k) not in filled]
    missing = sorted(str(k) for k in have if str(k) not in names)
    source = getattr(replay_buffer, LAYOUT_SOURCE_ATTR, None)
    if missing and source is not None:
        raise ValueError(
            f"replay_buffer's storage is laid out from {source}, whose keys the collector's rows do not all have: "
            f"{missing}; the rows have {sorted(names)}. Leave those keys out of it (a TorchRL ExcludeTransform "
            "appended to it), or make it from the same env and policy"
        )
    if missing:
        raise ValueError(
            f"replay_buffer's storage is laid out with keys the collector's rows do not have: {missing}; "
            f"the rows have {sorted(names)}. Lay the storage out from the same env and policy, or pass an "
            "empty buffer and let the collector lay it out"
        )
    laid_out = storage_tensors(replay_buffer.storage)
    dims = getattr(replay_buffer.storage, "ndim", 1) or 1
    for key in have:
        stored, value = laid_out.get(key), row.get(names[str(key)])
        want, got = (list(stored.shape[dims:]), stored.dtype), (list(value.shape), value.dtype)
        if want != got:
            raise ValueError(
                f"replay_buffer's storage holds {key!r} as {want[1]} of shape {want[0]} per row"
                + (f" (laid out from {source})" if source else "")
                + f"; the collector's rows hold {got[1]} of shape {got[0]}. Use a buffer laid out from the same "
                "env, converted to the env's dtypes (TorchRL's DoubleToFloat transform for float64 datasets)"
            )
    return [names[str(k)] for k in have]


def init_storage(replay_buffer: ReplayBuffer, row: TensorDictBase) -> None:
    """Lays out ``replay_buffer``'s storage from one flat transition ``row``.

    TorchRL's multi-process collectors crash on the first ``extend`` into a
    lazy storage that no process has laid out, and a worker's keys that the
    layout lacks are dropped without a word. Laying the storage out in the
    parent, from a row with every key the workers will write, avoids both. A
    storage that is already laid out must hold exactly those keys.

    Args:
        replay_buffer: a buffer over a ``LazyMemmapStorage``.
        row: a TensorDict with empty batch size holding one transition.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> rb = make_replay_buffer(10)
        >>> init_storage(rb, TensorDict({"observation": torch.zeros(3)}, []))
        >>> storage_keys(rb)
        ['observation']
    """
    if row.batch_dims != 0:
        raise ValueError(f"row must be a single transition (batch_size []), got batch_size {tuple(row.batch_size)}")
    storage = replay_buffer.storage
    extra = writer_keys(replay_buffer)
    if extra:
        row = row.clone(False).update(extra)
    want = sorted(row.keys(include_nested=True, leaves_only=True), key=str)
    have = storage_keys(replay_buffer)
    if have is None:
        lay_out_storage(storage, row)
        return
    if have != want:
        missing = sorted(set(map(str, want)) - set(map(str, have)))
        extra = sorted(set(map(str, have)) - set(map(str, want)))
        raise ValueError(
            "replay_buffer's storage is already laid out with other keys than the collector writes "
            f"(missing: {missing}, unexpected: {extra}); pass a fresh buffer from make_replay_buffer()"
        )


class buffer_lock:  # noqa: N801 - used like a function: ``with buffer_lock(rb):``
    """The locks every writer of a shared buffer holds during ``extend``, taken in ``extend``'s order.

    Rows become visible only once written, but a write into a full ring
    buffer overwrites visible rows in place, so readers that go around
    ``sample()`` must hold the write lock to never see half-written rows. For
    buffers of :func:`~torchrl_unilab.make_replay_buffer` it is a
    :class:`~torchrl_unilab.data.buffer_writer.BufferLock`: released by the kernel
    if its holder dies, and every wait is bounded.

    TorchRL's ``extend`` takes the buffer's ``_replay_lock`` and then its
    ``_write_lock``, and ``len(rb)`` takes ``_replay_lock``; so this takes
    both, in that order. Taking only the write lock and then calling
    ``len(rb)`` deadlocked against a thread of the same process extending
    the buffer (the Ray learner's receive thread). Reusable, not reentrant.

    Examples:
        >>> from torchrl_unilab import make_replay_buffer
        >>> rb = make_replay_buffer(10)
        >>> with buffer_lock(rb):
        ...     len(rb)
        0
    """

    def __init__(self, replay_buffer: ReplayBuffer) -> None:
        self._locks = buffer_locks(replay_buffer)

    def __enter__(self) -> buffer_lock:
        replay_lock, write_lock = self._locks
        replay_lock.acquire()
        try:
            write_lock.acquire()
        except BaseException:
            replay_lock.release()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        replay_lock, write_lock = self._locks
        try:
            write_lock.release()
        finally:
            replay_lock.release()


def holds_row(replay_buffer: ReplayBuffer, values: Mapping[NestedKey, int]) -> bool:
    """Whether a buffer of :func:`make_replay_buffer` holds a row with these values (one element per row each).

    Looked up under :class:`buffer_lock`, whose acquisition first repairs the
    slots a dead writer left half-written. The collector asks it of a dead
    worker's last batch (its first row's trajectory id and step count): rows
    committed before the worker counted them are counted, not lost. Other
    buffers answer ``False``: a TorchRL ``mp.Lock`` that a killed writer held is
    never released, so theirs is not taken.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> rb = make_replay_buffer(10)
        >>> _ = rb.extend(TensorDict({"step_count": torch.arange(4)}, [4]))
        >>> holds_row(rb, {"step_count": 2}), holds_row(rb, {"step_count": 7}), holds_row(rb, {"other": 2})
        (True, False, False)
    """
    if not isinstance(buffer_writer(replay_buffer), CommitWriter):
        return False
    keys = storage_keys(replay_buffer)
    if keys is None:
        return False
    if any(unravel_key(key) not in keys for key in values):
        return False
    storage = replay_buffer.storage
    with buffer_lock(replay_buffer):
        rows = len(storage)
        found = torch.ones(rows, dtype=torch.bool)
        for key, value in values.items():
            found &= storage_tensors(storage).get(key)[:rows].reshape(-1) == value  # noqa: SLF001
        return bool(found.any())
