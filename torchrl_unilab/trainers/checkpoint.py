"""Checkpoints of a training run: everything needed to continue it where it stopped.

A checkpoint is a directory holding

* ``state.pt``: the loss module's ``state_dict`` (actor, critics, their
  targets, SAC's ``log_alpha``), the optimizer, the target updater, the
  observation normaliser (statistics and how far it has read the buffer), the
  RNG states and the run's counters. It holds only CPU tensors and plain
  Python values and is read back with ``torch.load(weights_only=True,
  map_location="cpu")``; ``load_state_dict`` then copies each tensor to the
  device of the module it goes into. A run trained on a GPU resumes on a
  CPU-only machine and the other way round (the CUDA RNG states are restored
  only where the same number of GPUs is present).
* ``replay_buffer/``: TorchRL's ``ReplayBuffer.dumps`` (memory-mapped storage,
  JSON metadata). The pickled prefetch queue TorchRL adds is removed: the
  buffers here never prefetch.
* ``complete``: written last, once everything above is on disk.

Loading reads no pickle: TorchRL's ``ReplayBuffer.loads`` would unpickle a
``prefetch.pkl`` (and ``TensorDict.load_memmap`` pickled fields) found in the
directory, which runs whatever code the file holds. :meth:`Checkpointer.load`
refuses any such file and reads the buffer itself, with ``allow_pickle=False``.

A new checkpoint is written to ``<dir>.tmp``, fsynced, and swapped in by two
renames (``<dir>`` to ``<dir>.old``, ``<dir>.tmp`` to ``<dir>``). A kill at
any point leaves a complete checkpoint under one of the three names, and
:meth:`Checkpointer.load` (and the next save) takes it from there.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDict
from torchrl.data import ReplayBuffer
from torchrl.data.replay_buffers.samplers import RandomSampler

from torchrl_unilab._torchrl_private import lay_out_storage, set_buffer_batch_size, set_storage_length, storage_tensors
from torchrl_unilab.data.prioritized_sampler import SharedPrioritizedSampler
from torchrl_unilab.modules.normalization import ObservationNormalizer

__all__ = ["Checkpointer", "cpu_state", "load_buffer"]

_FORMAT = 1
_STATE = "state.pt"
_BUFFER = "replay_buffer"
_COMPLETE = "complete"
#: File names that hold pickles (torch.save without weights_only, pickle.dump).
_PICKLE_SUFFIXES = (".pkl", ".pickle", ".t", ".pth")


class Checkpointer:
    """Saves and restores a run's learner state and replay buffer in ``directory``.

    Args:
        directory: the checkpoint directory (created on first save).

    Keyword Args:
        modules: named objects with ``state_dict``/``load_state_dict`` (the
            loss module, the optimizer, the target updater, ...).
        normalizer: the observation normaliser, if any; its read position in
            the buffer is saved with its statistics.

    Examples:
        >>> import tempfile, torch
        >>> from tensordict import TensorDict
        >>> from torchrl_unilab import make_replay_buffer
        >>> net = torch.nn.Linear(2, 1)
        >>> rb = make_replay_buffer(16)
        >>> _ = rb.extend(TensorDict({"observation": torch.ones(3, 2)}, [3]))
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     ckpt = Checkpointer(f"{tmp}/checkpoint", modules={"net": net})
        ...     ckpt.save(rb, counters={"frames": 3, "updates": 1})
        ...     restored = make_replay_buffer(16)
        ...     counters = Checkpointer(f"{tmp}/checkpoint", modules={"net": net}).load(restored)
        >>> counters["frames"], len(restored)
        (3, 3)
    """

    def __init__(
        self,
        directory: str | os.PathLike,
        *,
        modules: Mapping[str, Any],
        normalizer: ObservationNormalizer | None = None,
    ) -> None:
        self.directory = Path(directory)
        for name, obj in modules.items():
            if not (hasattr(obj, "state_dict") and hasattr(obj, "load_state_dict")):
                raise TypeError(
                    f"modules[{name!r}] must have state_dict() and load_state_dict(), got {type(obj).__name__}"
                )
        self.modules = dict(modules)
        self.normalizer = normalizer

    def exists(self) -> bool:
        """Whether a complete checkpoint is in :attr:`directory` (or can be recovered next to it)."""
        return any(_complete(path) for path in (self.directory, self._tmp, self._old))

    @property
    def _tmp(self) -> Path:
        return self.directory.with_name(self.directory.name + ".tmp")

    @property
    def _old(self) -> Path:
        return self.directory.with_name(self.directory.name + ".old")

    def _recover(self) -> None:
        # A save killed between its two renames leaves no directory but a complete .tmp (newer) or .old.
        if _complete(self.directory):
            return
        for candidate in (self._tmp, self._old):
            if _complete(candidate):
                if self.directory.exists():
                    shutil.rmtree(self.directory)
                candidate.rename(self.directory)
                _fsync_dir(self.directory.parent)
                return

    def save(self, replay_buffer: ReplayBuffer, *, counters: Mapping[str, Any]) -> None:
        """Writes a checkpoint; no process may write to ``replay_buffer`` meanwhile.

        ``counters`` holds the run's progress (frames, updates, ...) and other
        plain values (lists, dicts, numbers, strings) to hand back on :meth:`load`.
        """
        rng: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            rng["cuda"] = torch.cuda.get_rng_state_all()  # CPU byte tensors, one per GPU
        state = {
            "format": _FORMAT,
            "modules": {name: obj.state_dict() for name, obj in self.modules.items()},
            "rng": rng,
            "counters": dict(counters),
        }
        if self.normalizer is not None:
            state["normalizer"] = {
                "state_dict": self.normalizer.state_dict(),
                "buffer_write_count": self.normalizer._buffer_write_count,  # noqa: SLF001
            }
        state = cpu_state(state)  # device-independent: resumable on a machine without the training GPU
        self._recover()  # never delete the only complete checkpoint below
        tmp, old = self._tmp, self._old
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        torch.save(state, tmp / _STATE)
        with warnings.catch_warnings():
            # TorchRL warns that it cannot compute the shift its trajectory save
            # hooks use: the writers are other processes. No such hook is registered.
            warnings.filterwarnings("ignore", message="last_cursor is None")
            replay_buffer.dumps(tmp / _BUFFER)
        # The prefetch queue is empty (no prefetching) and would be the only pickle in the checkpoint.
        (tmp / _BUFFER / "prefetch.pkl").unlink(missing_ok=True)
        _fsync_tree(tmp)
        (tmp / _COMPLETE).write_text(json.dumps({"format": _FORMAT}))
        _fsync_tree(tmp)
        shutil.rmtree(old, ignore_errors=True)
        if self.directory.exists():
            self.directory.rename(old)
            _fsync_dir(self.directory.parent)
        tmp.rename(self.directory)
        _fsync_dir(self.directory.parent)
        shutil.rmtree(old, ignore_errors=True)

    def load(self, replay_buffer: ReplayBuffer | None = None) -> dict[str, Any]:
        """Restores modules, normaliser, RNG states and (if given) ``replay_buffer``; returns the counters.

        ``replay_buffer`` must be a fresh buffer of the saved capacity, loaded
        before any collector lays it out or writes to it. A checkpoint holding
        a pickle file is refused with ``ValueError`` before anything is read.
        """
        self._recover()
        if not _complete(self.directory):
            raise FileNotFoundError(
                f"no complete checkpoint in {str(self.directory)!r} (expected {_STATE}, {_BUFFER}/ and "
                f"{_COMPLETE}, or a complete .tmp/.old beside it); "
                "resume= takes the run directory of a previous run"
            )
        _refuse_pickles(self.directory)
        state = torch.load(self.directory / _STATE, weights_only=True, map_location="cpu")
        if state.get("format") != _FORMAT:
            raise ValueError(f"checkpoint format {state.get('format')!r} is not supported (expected {_FORMAT})")
        missing = sorted(set(self.modules) - set(state["modules"]))
        if missing:
            raise KeyError(f"checkpoint {str(self.directory)!r} has no state for {missing}")
        for name, obj in self.modules.items():
            obj.load_state_dict(state["modules"][name])
        if self.normalizer is not None:
            saved = state.get("normalizer")
            if saved is None:
                raise KeyError("the checkpoint has no observation-normaliser state; was network.obs_norm off?")
            self.normalizer.load_state_dict(saved["state_dict"])
            self.normalizer._buffer_write_count = int(saved["buffer_write_count"])  # noqa: SLF001
        torch.set_rng_state(state["rng"]["torch"])
        random.setstate(_as_tuple(state["rng"]["python"]))
        cuda_rng = state["rng"].get("cuda")
        if cuda_rng is not None and torch.cuda.is_available() and len(cuda_rng) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda_rng)
        if replay_buffer is not None:
            load_buffer(replay_buffer, self.directory / _BUFFER)
        return state["counters"]


def cpu_state(value: Any) -> Any:
    """``value`` with every tensor in it (nested in dicts, lists and tuples) detached and on the CPU.

    What :meth:`Checkpointer.save` writes, so that a checkpoint does not name
    the device it was trained on. The containers keep their types
    (``OrderedDict`` included); CPU tensors are kept as they are.

    Examples:
        >>> from collections import OrderedDict
        >>> state = cpu_state({"net": OrderedDict(w=torch.ones(2, requires_grad=True)), "steps": [torch.tensor(3), 4]})
        >>> type(state["net"]).__name__, state["net"]["w"].requires_grad, state["steps"]
        ('OrderedDict', False, [tensor(3), 4])
    """
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, dict):
        out = type(value)() if type(value) is not dict else {}
        for key, item in value.items():
            out[key] = cpu_state(item)
        if hasattr(value, "_metadata"):  # state_dict() OrderedDicts carry per-module version metadata
            out._metadata = value._metadata  # noqa: SLF001
        return out
    if isinstance(value, (list, tuple)):
        items = [cpu_state(item) for item in value]
        return type(value)(items) if type(value) in (list, tuple) else type(value)(*items)
    return value


def load_buffer(replay_buffer: ReplayBuffer, path: str | os.PathLike) -> None:
    """Loads what ``ReplayBuffer.dumps`` wrote into ``replay_buffer``, without reading any pickle.

    Reads the storage with ``TensorDict.load_memmap(allow_pickle=False)`` and
    the writer's and buffer's JSON metadata; a pickle file anywhere under
    ``path`` (TorchRL's ``prefetch.pkl``, a ``transform.t``) raises ``ValueError``.
    The buffer must use a ``RandomSampler`` (it has no state) or a
    :class:`~torchrl_unilab.data.prioritized_sampler.SharedPrioritizedSampler`
    (its priorities come back from TorchRL's JSON and memory-mapped trees), and
    a storage of the saved capacity.

    Examples:
        >>> import tempfile, torch
        >>> from tensordict import TensorDict
        >>> from torchrl_unilab import make_replay_buffer
        >>> rb = make_replay_buffer(8)
        >>> _ = rb.extend(TensorDict({"observation": torch.arange(3.0)[:, None]}, [3]))
        >>> restored = make_replay_buffer(8)
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     rb.dumps(tmp)
        ...     refused = False
        ...     try:
        ...         load_buffer(restored, tmp)  # TorchRL's dumps leaves a prefetch.pkl
        ...     except ValueError:
        ...         refused = True
        ...     os.remove(f"{tmp}/prefetch.pkl")
        ...     load_buffer(restored, tmp)
        >>> refused, len(restored), restored.write_count
        (True, 3, 3)
    """
    path = Path(path)
    _refuse_pickles(path)
    sampler = replay_buffer.sampler
    if not isinstance(sampler, (RandomSampler, SharedPrioritizedSampler)):
        raise TypeError(
            "load_buffer restores buffers with a RandomSampler or a SharedPrioritizedSampler, "
            f"got {type(sampler).__name__}"
        )
    with open(path / "storage" / "storage_metadata.json") as file:
        meta = json.load(file)
    if meta.get("is_pytree"):
        raise ValueError(f"{path / 'storage'} holds a pytree storage; only TensorDict storages are supported")
    data = TensorDict.load_memmap(path / "storage", allow_pickle=False)
    storage = replay_buffer.storage
    if data.shape[0] != storage.max_size:
        raise ValueError(
            f"the checkpoint's buffer holds {data.shape[0]} rows of capacity, the replay_buffer given has "
            f"{storage.max_size}; pass a buffer of the saved capacity"
        )
    if not storage.initialized:
        lay_out_storage(storage, data[0])
    storage_tensors(storage).update_(data)
    set_storage_length(storage, int(meta["len"]))
    replay_buffer.writer.loads(path / "writer")  # JSON (and, when tracked, a memmap of generations)
    if isinstance(sampler, SharedPrioritizedSampler):
        if not (path / "sampler" / "sampler_metadata.json").exists():
            raise ValueError(f"{path} was saved without prioritized replay; resume with replay_buffer.prb=false")
        sampler.loads(path / "sampler")  # JSON and memory-mapped priority trees
    if (path / "rng_state").exists():
        rng_state = TensorDict.load_memmap(path / "rng_state", allow_pickle=False)
        rng = torch.Generator(device=rng_state.device)
        rng.set_state(rng_state["rng_state"])
        replay_buffer.set_rng(rng)
    with open(path / "buffer_metadata.json") as file:
        set_buffer_batch_size(replay_buffer, json.load(file)["batch_size"])


def _refuse_pickles(path: Path) -> None:
    for root, _, files in os.walk(path):
        for name in files:
            if name.endswith(_PICKLE_SUFFIXES):
                raise ValueError(
                    f"{Path(root) / name} is a pickle file; loading a checkpoint reads no pickle, since "
                    "unpickling runs whatever code the file holds. This project never writes one there: "
                    "remove it if you trust its origin, or discard the checkpoint."
                )


def _complete(path: Path) -> bool:
    return (path / _STATE).is_file() and (path / _BUFFER).is_dir() and (path / _COMPLETE).is_file()


def _fsync_tree(path: Path) -> None:
    # Data first, then the directories that name it: a crash then never exposes a name without its data.
    for root, _, files in os.walk(path, topdown=False):
        for name in files:
            fd = os.open(Path(root) / name, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _fsync_dir(Path(root))


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _as_tuple(value: Any) -> Any:
    # random.setstate wants tuples all the way down.
    return tuple(_as_tuple(v) for v in value) if isinstance(value, (list, tuple)) else value

