"""Checkpoints of a training run: everything needed to continue it where it stopped.

A checkpoint is a directory holding

* ``state.pt``: the loss module's ``state_dict`` (actor, critics, their
  targets, SAC's ``log_alpha``), the optimizer, the target updater, the
  observation normaliser (statistics and how far it has read the buffer), the
  RNG states and the run's counters. It holds only tensors and plain Python
  values and is read back with ``torch.load(weights_only=True)``.
* ``replay_buffer/``: TorchRL's ``ReplayBuffer.dumps`` (memory-mapped storage,
  JSON metadata). The pickled prefetch queue TorchRL adds is removed: the
  buffers here never prefetch, and ``loads`` then reads no pickle at all.

A new checkpoint is written next to the old one and swapped in by renaming,
so an interruption while saving leaves the previous checkpoint intact.
"""

from __future__ import annotations

import os
import random
import shutil
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torchrl.data import ReplayBuffer

from torchrl_unilab.normalization import ObservationNormalizer

__all__ = ["Checkpointer"]

_FORMAT = 1
_STATE = "state.pt"
_BUFFER = "replay_buffer"


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
                raise TypeError(f"modules[{name!r}] must have state_dict() and load_state_dict(), got {type(obj).__name__}")
        self.modules = dict(modules)
        self.normalizer = normalizer

    def exists(self) -> bool:
        """Whether a complete checkpoint is in :attr:`directory`."""
        return (self.directory / _STATE).is_file() and (self.directory / _BUFFER).is_dir()

    def save(self, replay_buffer: ReplayBuffer, *, counters: Mapping[str, Any]) -> None:
        """Writes a checkpoint; no process may write to ``replay_buffer`` meanwhile.

        ``counters`` holds the run's progress (frames, updates, ...) and other
        plain values (lists, dicts, numbers, strings) to hand back on :meth:`load`.
        """
        state = {
            "format": _FORMAT,
            "modules": {name: obj.state_dict() for name, obj in self.modules.items()},
            "rng": {"torch": torch.get_rng_state(), "python": random.getstate()},
            "counters": dict(counters),
        }
        if self.normalizer is not None:
            state["normalizer"] = {
                "state_dict": self.normalizer.state_dict(),
                "buffer_write_count": self.normalizer._buffer_write_count,  # noqa: SLF001
            }
        tmp = self.directory.with_name(self.directory.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        torch.save(state, tmp / _STATE)
        with warnings.catch_warnings():
            # TorchRL warns that it cannot compute the shift its trajectory save
            # hooks use: the writers are other processes. No such hook is registered.
            warnings.filterwarnings("ignore", message="last_cursor is None")
            replay_buffer.dumps(tmp / _BUFFER)
        # The prefetch queue is empty (no prefetching) and would be the only pickle to load.
        (tmp / _BUFFER / "prefetch.pkl").unlink(missing_ok=True)
        old = self.directory.with_name(self.directory.name + ".old")
        shutil.rmtree(old, ignore_errors=True)
        if self.directory.exists():
            self.directory.rename(old)
        tmp.rename(self.directory)
        shutil.rmtree(old, ignore_errors=True)

    def load(self, replay_buffer: ReplayBuffer | None = None) -> dict[str, Any]:
        """Restores modules, normaliser, RNG states and (if given) ``replay_buffer``; returns the counters.

        ``replay_buffer`` must be a fresh buffer of the saved capacity, loaded
        before any collector lays it out or writes to it.
        """
        if not self.exists():
            raise FileNotFoundError(
                f"no checkpoint in {str(self.directory)!r} (expected {_STATE} and {_BUFFER}/); "
                "resume= takes the run directory of a previous run"
            )
        state = torch.load(self.directory / _STATE, weights_only=True)
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
        if replay_buffer is not None:
            replay_buffer.loads(self.directory / _BUFFER)
        return state["counters"]


def _as_tuple(value: Any) -> Any:
    # random.setstate wants tuples all the way down.
    return tuple(_as_tuple(v) for v in value) if isinstance(value, (list, tuple)) else value

