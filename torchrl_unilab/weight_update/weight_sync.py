"""Learner-to-worker weight sync through named shared memory.

One block of shared memory holds a module's ``state_dict`` (parameters and
persistent buffers) behind a small header: a sequence counter and a version.
The writer bumps the sequence to an odd value, copies the tensors, bumps the
version and makes the sequence even again (a seqlock). A reader copies the
tensors and keeps the copy only if the sequence was even and unchanged around
the copy, so a reader never loads a half-written set of weights and the
writer never waits for readers.

What travels, and what stays with each worker (the rule TorchRL's own weight
sync follows, minus per-env state):

* every entry of the module's ``state_dict``: parameters and persistent buffers,
  of any dtype (float, integer, bool) and any size. A zero-element tensor (the
  device anchor of TorchRL's ``OrnsteinUhlenbeckProcessModule``) takes no bytes
  in the block; parameters shared or tied between submodules appear under each
  of their names and load into the one tensor they share. The annealing state of
  TorchRL's exploration modules (``AdditiveGaussianModule.sigma``,
  ``OrnsteinUhlenbeckProcessModule.eps``) is a persistent buffer, so the
  learner's ``step()`` reaches the workers with the weights, as with TorchRL's
  collectors.
* non-persistent buffers (such as the per-env noise scales of
  :class:`~torchrl_unilab.modules.exploration.PerEnvMixedNoise`) are not part of
  the ``state_dict`` and never travel: worker-side per-env state survives every
  sync. So does state carried in the TensorDict rather than the module (the OU
  process's running noise under its private ``"_ou_*"`` keys).
"""

from __future__ import annotations

import contextlib
import mmap
import os
import signal
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from multiprocessing import shared_memory
from typing import Any

import numpy as np
import torch
from torch import nn

from torchrl_unilab._residue import SHM_DIR, WEIGHTS_PREFIX, sweep_stale
from torchrl_unilab.weight_update._staging import HostStaging

__all__ = ["SharedWeights", "WeightLayout", "layout_of", "sweep_stale_blocks"]

_HEADER_BYTES = 64  # seq (int64), version (int64), padding to keep tensors aligned
_ALIGN = 64

#: ``(name, shape, dtype)`` for each tensor of a ``state_dict``, in order.
WeightLayout = list[tuple[str, tuple[int, ...], torch.dtype]]


def layout_of(state: nn.Module | Mapping[str, torch.Tensor]) -> WeightLayout:
    """Returns the ``(name, shape, dtype)`` layout of a module's ``state_dict``.

    Examples:
        >>> layout_of(torch.nn.Linear(3, 2))
        [('weight', (2, 3), torch.float32), ('bias', (2,), torch.float32)]
    """
    sd = state.state_dict() if isinstance(state, nn.Module) else state
    return [(k, tuple(v.shape), v.dtype) for k, v in sd.items()]


def _normalise_layout(layout: WeightLayout | Sequence[Sequence[int]]) -> WeightLayout:
    # The seed API passes bare shapes (float32 parameters, state_dict order).
    out: WeightLayout = []
    for i, entry in enumerate(layout):
        if len(entry) == 3 and isinstance(entry[0], str):
            out.append((entry[0], tuple(int(s) for s in entry[1]), entry[2]))
        else:
            out.append((f"param_{i}", tuple(int(s) for s in entry), torch.float32))
    return out


def _offsets(layout: WeightLayout) -> tuple[list[int], int]:
    offsets, pos = [], _HEADER_BYTES
    for _, shape, dtype in layout:
        offsets.append(pos)
        nbytes = int(np.prod(shape, dtype=np.int64)) * torch.empty((), dtype=dtype).element_size()
        pos += -(-nbytes // _ALIGN) * _ALIGN
    return offsets, max(pos, _HEADER_BYTES + _ALIGN)


def _view(buffer: memoryview, shape: tuple[int, ...], dtype: torch.dtype, offset: int) -> torch.Tensor:
    count = int(np.prod(shape, dtype=np.int64))
    if count == 0:
        # torch.frombuffer refuses a count of 0; such a tensor holds nothing to share.
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(buffer, dtype=dtype, count=count, offset=offset).view(shape)


def _own_mapping(shm: shared_memory.SharedMemory) -> mmap.mmap:
    """A mapping of ``shm``'s block that only its views keep alive; ``shm``'s own mapping is closed at once.

    Every tensor and array of a :class:`SharedWeights` is a view of this mapping,
    and each view holds a buffer export of it: the mapping cannot be unmapped
    while one view is alive (``mmap.close`` refuses, and it is freed only with the
    last view). Views of ``shm.buf`` instead dangle once ``SharedMemory.close``
    runs, which its ``__del__`` does whenever the garbage collector gets to it,
    possibly before the finaliser of a scheme that still reads the version: a
    segfault, not an exception.
    """
    mapping = mmap.mmap(shm._fd, shm.size)  # noqa: SLF001 - SharedMemory gives no public file descriptor
    shm.close()  # its name still unlinks the block
    return mapping


def sweep_stale_blocks() -> list[str]:
    """Removes the weight blocks that dead processes left in ``/dev/shm``; returns their names."""
    return sweep_stale(SHM_DIR, WEIGHTS_PREFIX)


class SharedWeights:
    """A module's weights and a version counter in named shared memory.

    The learner creates the block with :meth:`create` and calls :meth:`publish`
    after updates; each worker :meth:`attach`-es by name and calls
    :meth:`load_into` between steps, which copies the weights only when the
    version has advanced. The creator owns the block and removes it with
    :meth:`unlink` (also done by :meth:`close` on the owner).

    Args:
        shm: the shared-memory block.
        layout: ``(name, shape, dtype)`` for each tensor, in ``state_dict`` order.
        owner: whether this handle unlinks the block on :meth:`close`.
        lock: optional lock (e.g. ``multiprocessing.Lock``) that :meth:`publish`
            holds while writing; readers never need it.

    Examples:
        >>> actor = torch.nn.Linear(3, 2)
        >>> weights = SharedWeights.create(actor)
        >>> worker_copy = torch.nn.Linear(3, 2)
        >>> reader = SharedWeights.attach(weights.name, layout_of(actor))
        >>> reader.load_into(worker_copy)  # first load: version 1
        1
        >>> torch.equal(worker_copy.weight, actor.weight)
        True
        >>> reader.load_into(worker_copy) is None  # nothing new
        True
        >>> reader.close(); weights.close()
    """

    def __init__(
        self,
        shm: shared_memory.SharedMemory,
        layout: WeightLayout,
        *,
        owner: bool,
        lock: Any | None = None,
    ) -> None:
        self._shm = shm
        self.layout = layout
        self.owner = owner
        self.lock = lock
        self.loaded_version = 0
        self._staging: HostStaging | None = None
        offsets, size = _offsets(layout)
        if shm.size < size:
            raise ValueError(
                f"shared memory {shm.name!r} holds {shm.size} bytes but the layout needs {size}; "
                "weight_param_shapes must match the learner's actor"
            )
        self._offsets, self._size = offsets, size
        self._closed_version: int | None = None
        self._mapping = _own_mapping(shm)
        memory = memoryview(self._mapping)
        self._header = np.ndarray((2,), dtype=np.int64, buffer=memory)
        self._views = [_view(memory, shape, dtype, off) for (_, shape, dtype), off in zip(layout, offsets)]
        # Every tensor of the block at once (padding included): the writer copies the staged weights in one go.
        self._region = torch.frombuffer(memory, dtype=torch.uint8, count=size - _HEADER_BYTES, offset=_HEADER_BYTES)

    # ----------------------------------------------------------- construction
    @classmethod
    def create(
        cls,
        module: nn.Module | Mapping[str, torch.Tensor],
        *,
        name: str | None = None,
        lock: Any | None = None,
    ) -> SharedWeights:
        """Allocates the block for ``module`` and publishes its current weights as version 1.

        Blocks that killed processes left in ``/dev/shm`` are removed first.
        """
        layout = layout_of(module)
        _, size = _offsets(layout)
        if name is None:
            sweep_stale_blocks()
            name = f"{WEIGHTS_PREFIX}{os.getpid()}_{uuid.uuid4().hex[:8]}"
        shm = shared_memory.SharedMemory(name=name, create=True, size=size)
        try:
            self = cls(shm, layout, owner=True, lock=lock)
            self._header[:] = 0
            self.publish(module)
        except BaseException:
            # Nobody else knows the block's name yet: remove it rather than leave it in /dev/shm.
            with contextlib.suppress(BufferError):  # views into it may still be alive
                shm.close()
            cls.unlink(shm)
            raise
        return self

    @classmethod
    def attach(
        cls,
        name: str,
        layout: WeightLayout | Sequence[Sequence[int]],
        *,
        lock: Any | None = None,
    ) -> SharedWeights:
        """Opens an existing block by name; ``layout`` may be bare shapes (float32)."""
        try:
            shm = shared_memory.SharedMemory(name=name, create=False)
        except FileNotFoundError:
            raise FileNotFoundError(
                f"weight_sync_name {name!r} names no shared memory block; create it with SharedWeights.create(actor)"
            ) from None
        return cls(shm, _normalise_layout(layout), owner=False, lock=lock)

    @property
    def name(self) -> str:
        """The shared-memory name to hand to workers."""
        return self._shm.name

    @property
    def version(self) -> int:
        """The latest published version (0 before the first publish); after :meth:`close`, the last one seen."""
        if self._header is None:
            return self._closed_version
        return int(self._header[1])

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called: this handle reads and writes nothing any more."""
        return self._header is None

    def _check_open(self, what: str) -> None:
        if self._header is None:
            raise RuntimeError(f"{what}: this SharedWeights handle is closed (the collector was shut down)")

    # --------------------------------------------------------------- transfer
    def _tensors(self, source: nn.Module | Mapping[str, torch.Tensor] | Sequence[torch.Tensor]) -> list[torch.Tensor]:
        if isinstance(source, nn.Module):
            source = source.state_dict()
        if isinstance(source, Mapping):
            values = list(source.values())
        else:
            values = list(source)
        if len(values) != len(self.layout):
            raise ValueError(f"expected {len(self.layout)} tensors (the published layout), got {len(values)}")
        for value, (key, shape, _) in zip(values, self.layout):
            if not isinstance(value, torch.Tensor):
                raise TypeError(f"weight {key!r} must be a torch.Tensor, got {type(value).__name__}")
            if tuple(value.shape) != shape:
                raise ValueError(f"weight {key!r} has shape {tuple(value.shape)}, the layout says {shape}")
        return values

    def publish(self, source: nn.Module | Mapping[str, torch.Tensor] | Sequence[torch.Tensor], *,
                new_version: bool = True) -> int:
        """Copies ``source``'s weights into the block and returns the new version.

        ``new_version=False`` replaces the weights of the current version instead
        (for weights no reader has loaded yet: a collector's policy as it is when
        its workers start, which may differ from what it was at construction).

        ``source`` may live on any device. Its tensors are first staged in host
        memory, in one buffer laid out as the block: CUDA tensors with one batched ``non_blocking``
        device-to-host copy into pinned memory and one synchronisation, instead
        of one blocking ``.cpu()`` per tensor. The seqlock write that follows is
        one ``memcpy`` of the staged bytes into the block.

        Exception-safe: ``source`` is checked (types, shapes) and staged before
        the block is touched, so a bad value or a failing copy leaves the
        published weights and version as they were. The copy into the block
        cannot fail, and SIGINT/SIGTERM arriving during it are handled right
        after it, so readers never find the sequence odd for good, nor a mix of
        old and new weights.

        Examples:
            >>> weights = SharedWeights.create(torch.nn.Linear(2, 1))
            >>> weights.publish({"weight": torch.ones(1, 2), "bias": torch.zeros(1)})
            2
            >>> reader = SharedWeights.attach(weights.name, weights.layout)
            >>> reader.read()[1][0].tolist()
            [[1.0, 1.0]]
            >>> reader.close(); weights.close()
        """
        self._check_open("publish()")
        values = self._tensors(source)
        if self._staging is None:
            offsets = [offset - _HEADER_BYTES for offset in self._offsets]
            self._staging = HostStaging(self.layout, offsets=offsets, nbytes=self._size - _HEADER_BYTES)
        # No ``torch.no_grad()`` here: a signal landing between its enter and
        # exit left the caller's thread with gradients off for good. Detached
        # values into plain tensors record no graph anyway.
        self._staging.fill(values)
        staged = self._staging.flat
        with self.lock if self.lock is not None else contextlib.nullcontext(), _signals_deferred():
            self._header[0] += 1  # odd: write in progress
            copied = False
            try:
                self._region.copy_(staged)
                copied = True
            finally:
                # Whatever happened, the block ends holding the whole staged set (under a new version unless told).
                if not copied:
                    self._region.copy_(staged)
                self._header[1] += int(new_version)
                self._header[0] += 1  # even: consistent again
            return int(self._header[1])

    def read(self, *, since_version: int = 0, timeout: float = 5.0) -> tuple[int, list[torch.Tensor]] | None:
        """Returns ``(version, tensors)`` if a version newer than ``since_version`` exists, else ``None``."""
        self._check_open("read()")
        deadline = time.monotonic() + timeout
        while True:
            seq = int(self._header[0])
            version = int(self._header[1])
            if version <= since_version:
                return None
            if seq % 2 == 0:
                copies = [v.clone() for v in self._views]
                if int(self._header[0]) == seq:
                    return version, copies
            if time.monotonic() > deadline:
                raise TimeoutError(f"could not read a consistent set of weights from {self.name!r} within {timeout}s")
            time.sleep(0)

    def keep_initial(self) -> None:
        """Counts the block's initial weights (version 1) as loaded: :meth:`load_into` then loads only later
        publishes, and a module that starts from weights of its own keeps them until then.

        Examples:
            >>> weights = SharedWeights.create(torch.nn.Linear(2, 1))
            >>> reader = SharedWeights.attach(weights.name, weights.layout)
            >>> reader.keep_initial()
            >>> reader.load_into(torch.nn.Linear(2, 1)) is None, reader.loaded_version
            (True, 1)
            >>> reader.close(); weights.close()
        """
        self.loaded_version = max(self.loaded_version, 1)

    def load_into(self, module: nn.Module, *, since_version: int | None = None) -> int | None:
        """Loads a newer version into ``module``; returns it, or ``None`` if nothing is newer.

        ``since_version`` defaults to the version this handle loaded last.
        """
        if since_version is None:
            since_version = self.loaded_version
        got = self.read(since_version=since_version)
        if got is None:
            return None
        version, tensors = got
        if not self.layout:
            # A policy without weights (TorchRL's RandomPolicy): only the version travels.
            self.loaded_version = version
            return version
        keys = list(module.state_dict().keys())
        if len(keys) != len(tensors):
            raise ValueError(
                f"module has {len(keys)} state_dict entries but the shared weights hold {len(tensors)}; "
                "build the worker's actor with the same builder and dims as the learner's"
            )
        module.load_state_dict(dict(zip(keys, tensors)), strict=True)
        self.loaded_version = version
        return version

    # --------------------------------------------------------------- lifetime
    def close(self) -> None:
        """Releases this handle; the owner also removes the block. Safe to call again, and from finalisers.

        The views go first, then the mapping: a view still held elsewhere keeps
        the block mapped until it is freed, so nothing can read unmapped memory.
        """
        if self._shm is None:
            return
        self._closed_version = int(self._header[1])  # still mapped: this handle's views hold the mapping
        self._views = []
        self._region = None
        self._header = None
        shm, self._shm = self._shm, None
        mapping, self._mapping = self._mapping, None
        with contextlib.suppress(BufferError):  # a view held elsewhere: unmapped when it is freed
            mapping.close()
        if self.owner:
            self.unlink(shm)

    @staticmethod
    def unlink(shm: shared_memory.SharedMemory) -> None:
        """Removes the block from ``/dev/shm``."""
        with contextlib.suppress(FileNotFoundError):
            shm.unlink()

    def __getstate__(self) -> dict:
        # Hand workers a name to attach to, never a second owner.
        return {"name": self.name, "layout": self.layout, "lock": self.lock}

    def __setstate__(self, state: dict) -> None:
        other = SharedWeights.attach(state["name"], state["layout"], lock=state["lock"])
        self.__dict__.update(other.__dict__)
        other._shm = other._mapping = None


_DEFERRED_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def _signals_deferred():
    """Holds SIGINT and SIGTERM until the block ends, then delivers them to their usual handlers.

    Python runs signal handlers in the main thread only, between bytecodes; so
    outside the main thread nothing can interrupt the block, and inside it the
    handlers are swapped for one that only records the signal.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []
    previous = {signum: signal.signal(signum, lambda signum, frame: received.append(signum))
                for signum in _DEFERRED_SIGNALS}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)
        for signum in dict.fromkeys(received):
            signal.raise_signal(signum)
