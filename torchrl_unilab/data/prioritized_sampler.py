"""Prioritized replay for a buffer that worker processes write into.

TorchRL's :class:`~torchrl.data.PrioritizedSampler` keeps its sum-tree in the
process that owns it and learns of new rows only through that process's own
``extend`` (``Sampler.extend`` and the writer's ``mark_update``). The
:class:`~torchrl_unilab.OffPolicyCollector`'s workers write rows into the shared
storage from their own processes, so the learner's tree never hears of them:
they would never be sampled. :class:`SharedPrioritizedSampler` catches up on
each ``sample``, which the buffer calls under its write lock: the rows written
since the last sample (the buffer's ``write_count`` moved on) get the maximum
priority, as an in-process ``extend`` would give them. This is what TorchRL's
own ``TensorDictPrioritizedReplayBuffer(sync=False)`` does, on the plain
``ReplayBuffer`` that :func:`~torchrl_unilab.make_replay_buffer` builds.

The priorities live in TorchRL's C++ segment trees (``torchrl._torchrl``). A
TorchRL build made against another torch cannot load them (torchrl 0.14.1
against torch 2.13: ``undefined symbol``); this package requires the torch
that torchrl 0.14.1 is built for (2.14), and the sampler says so if the
extension is missing.
"""

from __future__ import annotations

import json
from multiprocessing.context import get_spawning_popen
from pathlib import Path
from typing import Any

import torch
import torchrl
from torchrl.data import ReplayBuffer
from torchrl.data.replay_buffers.samplers import PrioritizedSampler, RandomSampler, prioritized as _torchrl_prioritized
from torchrl.data.replay_buffers.storages import Storage

from torchrl_unilab._torchrl_private import attached_entities, sampler_capacity

__all__ = ["SharedPrioritizedSampler"]

_CATCH_UP_FILE = "shared_sampler.json"


def _extension_loaded() -> bool:
    return _torchrl_prioritized.SumSegmentTreeFp32 is not None


class SharedPrioritizedSampler(PrioritizedSampler):
    """TorchRL's :class:`~torchrl.data.PrioritizedSampler`, for a buffer that other processes write into.

    Sampling, priorities, importance weights and ``update_priority`` are
    TorchRL's. Two things are added (see the module docstring):

    * each :meth:`sample` first gives the rows written since the previous one
      (by any process) the maximum priority, reading the buffer's
      ``write_count`` under the buffer's lock;
    * a copy sent to a spawned worker process is a
      :class:`~torchrl.data.RandomSampler`: workers only write, and TorchRL's
      sampler refuses to be pickled for them.

    Args:
        max_capacity: the buffer's capacity.
        alpha: priority exponent (0: uniform).
        beta: importance-sampling exponent.

    Keyword Args:
        eps: added to every priority.

    Examples:
        >>> from tensordict import TensorDict
        >>> from torchrl_unilab import make_replay_buffer
        >>> rb = make_replay_buffer(8, sampler=SharedPrioritizedSampler(8, alpha=1.0, beta=0.5))
        >>> _ = rb.extend(TensorDict({"observation": torch.arange(4.0)[:, None]}, [4]))
        >>> rb.update_priority(torch.arange(4), torch.tensor([1e-6, 1e-6, 1e-6, 1.0]))
        >>> batch, info = rb.sample(64, return_info=True)
        >>> bool((info["index"] == 3).float().mean() > 0.9)
        True
    """

    def __init__(self, max_capacity: int, alpha: float, beta: float, *, eps: float = 1e-8) -> None:
        if isinstance(max_capacity, bool) or not isinstance(max_capacity, int) or max_capacity < 1:
            raise ValueError(f"max_capacity must be an int >= 1, got {max_capacity!r}")
        if not _extension_loaded():
            raise ImportError(
                "SharedPrioritizedSampler keeps its priorities in TorchRL's C++ segment trees, and torchrl._torchrl "
                f"did not load: torchrl {torchrl.__version__} is built for torch 2.14, "
                f"this is torch {torch.__version__}. "
                "Install the torch this package pins (pip install -e .) or use a uniform sampler."
            )
        self._caught_up = 0
        super().__init__(max_capacity, alpha, beta, eps)

    def _empty(self) -> None:
        super()._empty()
        self._caught_up = 0

    @staticmethod
    def _write_count(storage: Storage) -> int | None:
        # The storage knows the buffers it belongs to (TorchRL attaches them); the write count is the buffer's.
        for entity in attached_entities(storage):
            if isinstance(entity, ReplayBuffer):
                return int(entity.write_count)
        return None

    def catch_up(self, write_count: int, storage: Storage | None = None) -> int:
        """Gives the rows written since the last call the maximum priority; returns how many.

        :meth:`sample` calls it; call it yourself only for a storage that no
        buffer is attached to. A ``write_count`` below the last one (the
        buffer was emptied) starts the priorities over.
        """
        if write_count < self._caught_up:
            self._empty()
        new = write_count - self._caught_up
        if new <= 0:
            return 0
        capacity = sampler_capacity(self)
        if new >= capacity:
            index = torch.arange(capacity)
        else:
            index = torch.arange(self._caught_up, write_count).remainder_(capacity)
        PrioritizedSampler.mark_update(self, index, storage=storage)
        self._caught_up = write_count
        return int(index.numel())

    def mark_update(self, index: int | torch.Tensor, *, storage: Storage | None = None) -> None:
        # A write in this process: these rows, and any written before them by other processes, get the
        # maximum priority now, and not once more at the next sample (it may follow an update_priority).
        write_count = None if storage is None else self._write_count(storage)
        if write_count is None:
            super().mark_update(index, storage=storage)
        else:
            self.catch_up(write_count, storage)

    def sample(self, storage: Storage, batch_size: int) -> tuple[torch.Tensor, dict]:
        write_count = self._write_count(storage)
        if write_count is not None:
            self.catch_up(write_count, storage)
        return super().sample(storage, batch_size)

    def __reduce_ex__(self, protocol: Any) -> Any:
        if get_spawning_popen() is not None:
            return RandomSampler, ()
        return super().__reduce_ex__(protocol)

    def dumps(self, path: str | Path) -> None:
        super().dumps(path)
        with open(Path(path) / _CATCH_UP_FILE, "w") as file:
            json.dump({"caught_up": self._caught_up}, file)

    def loads(self, path: str | Path) -> None:
        super().loads(path)
        with open(Path(path) / _CATCH_UP_FILE) as file:
            self._caught_up = int(json.load(file)["caught_up"])

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "_caught_up": self._caught_up}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        self._caught_up = int(state_dict.get("_caught_up", 0))
