"""Writing the collector's batches into a replay buffer from the collecting process.

The fast path has the workers write straight into a process-shared buffer
(:func:`~torchrl_unilab.make_replay_buffer`). Some buffers are written here
instead, by :class:`LocalBufferWriter`, as each batch is handed over:

* a buffer that is not shared between processes (a plain
  ``ReplayBuffer(storage=LazyTensorStorage(...))``): its storage, sampler and
  transforms live in this process only, and stay correct when only this process
  writes;
* a storage with ``ndim >= 2``: it gets each batch as TorchRL's collectors lay it
  out, ``[envs, steps]``, and stores one row per step across the envs;
* ``trajs_per_batch``: whole trajectories only, each written flat once its last
  step is done, as TorchRL's collectors write them (its own ``_traj_ingest``
  groups the steps).
"""

from __future__ import annotations

import torch
from tensordict import TensorDictBase
from torchrl.data import ReplayBuffer

from torchrl_unilab._torchrl_private import ingest_trajectories

__all__ = ["LocalBufferWriter", "local_write_reason", "storage_ndim"]


def storage_ndim(replay_buffer: ReplayBuffer) -> int:
    """The number of batch dimensions ``replay_buffer``'s storage keeps (``ndim``; 1 for most storages).

    Examples:
        >>> from torchrl.data import LazyTensorStorage, ReplayBuffer
        >>> storage_ndim(ReplayBuffer(storage=LazyTensorStorage(10, ndim=2)))
        2
    """
    return int(getattr(replay_buffer.storage, "ndim", 1) or 1)


def local_write_reason(replay_buffer: ReplayBuffer | None, trajs_per_batch: int | None = None) -> str | None:
    """Why the collecting process, not the workers, must extend ``replay_buffer`` (the collector logs it);
    ``None`` when the workers write into it themselves (the fast path) or there is no buffer.

    Examples:
        >>> from torchrl.data import LazyTensorStorage, ReplayBuffer
        >>> local_write_reason(ReplayBuffer(storage=LazyTensorStorage(10), shared=True)) is None
        True
        >>> local_write_reason(ReplayBuffer(storage=LazyTensorStorage(10))).split(",")[0]
        'replay_buffer is not shared between processes'
    """
    if not isinstance(replay_buffer, ReplayBuffer):
        return None  # none, or not a buffer (the collector says so)
    fast = ("for the fast path, where the workers write into the buffer themselves, pass make_replay_buffer(...) "
            "or ReplayBuffer(..., shared=True) over an ndim=1 storage")
    if trajs_per_batch is not None:
        return ("trajs_per_batch: this process assembles whole trajectories from the workers' batches and extends "
                "replay_buffer with each one once its last step is done")
    if storage_ndim(replay_buffer) > 1:
        return (f"replay_buffer's storage has ndim={storage_ndim(replay_buffer)}, so this process extends it with "
                f"each batch laid out [envs, steps]; {fast}")
    if not getattr(replay_buffer, "shared", False):
        return f"replay_buffer is not shared between processes, so this process extends it with each batch; {fast}"
    return None


class LocalBufferWriter:
    """Extends ``replay_buffer`` with each flat batch a worker hands over.

    Args:
        replay_buffer: the buffer to extend (from this process only).
        num_envs: envs per worker: a flat batch is ``steps * num_envs`` rows, step-major.
        trajs: write whole trajectories only (``trajs_per_batch``); the steps of
            episodes still running are held here until their last step is done.
        trajs_per_write: with ``trajs``, trajectories per ``extend`` call (``None``:
            all those completed by one batch, in one call).

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import LazyTensorStorage, ReplayBuffer
        >>> rb = ReplayBuffer(storage=LazyTensorStorage(100))
        >>> writer = LocalBufferWriter(rb, num_envs=2, trajs=True)
        >>> done = torch.tensor([False, False, True, False]).unsqueeze(-1)  # env 0 ends its episode at step 1
        >>> batch = TensorDict({("collector", "traj_ids"): torch.tensor([0, 1, 0, 1]),
        ...                     ("next", "done"): done}, [4])
        >>> writer.write(batch)
        >>> len(rb), writer.held
        (2, 2)
    """

    def __init__(self, replay_buffer: ReplayBuffer, num_envs: int, trajs: bool = False,
                 trajs_per_write: int | None = None) -> None:
        self.replay_buffer = replay_buffer
        self.num_envs = num_envs
        self.trajs = trajs
        self.trajs_per_write = trajs_per_write
        self._partial: dict[int, list[TensorDictBase]] = {}
        self._complete: list[TensorDictBase] = []

    @property
    def held(self) -> int:
        """Frames of trajectories not done yet, held until their last step (``trajs`` only)."""
        return sum(chunk.shape[0] for chunks in self._partial.values() for chunk in chunks)

    def write(self, batch: TensorDictBase) -> None:
        """Extends the buffer with ``batch`` (flat rows, step-major over the envs)."""
        if self.trajs:
            ingest_trajectories(batch, self._partial, self._complete)
            step = self.trajs_per_write or max(len(self._complete), 1)
            while self._complete:
                trajs, self._complete = self._complete[:step], self._complete[step:]
                self.replay_buffer.extend(torch.cat(trajs, 0) if len(trajs) > 1 else trajs[0])
        elif storage_ndim(self.replay_buffer) > 1:
            if batch.shape[0] % self.num_envs:
                raise ValueError(
                    f"replay_buffer's storage has ndim={storage_ndim(self.replay_buffer)}, so each batch goes in as "
                    f"[envs, steps]; this batch has {batch.shape[0]} rows for {self.num_envs} envs (rows were "
                    "dropped: nonfinite='drop'). Use a storage with ndim=1, or nonfinite='raise' or 'reset'"
                )
            # TorchRL's rollout layout, [envs, steps]: the buffer extends along its last batch dimension (time).
            self.replay_buffer.extend(batch.reshape(-1, self.num_envs).transpose(0, 1))
        else:
            self.replay_buffer.extend(batch)
