"""Batches drawn by a shared buffer's own sampler and gathered into tensors allocated once.

``replay_buffer.sample()`` builds a new TensorDict of every stored key per
batch; on a 100,000-row buffer with the collector's keys that costs 2.6x to
4.7x a bare gather of the rows the losses read (``benchmarks/sampling.py``,
about 1 ms per update of a ~22 ms SAC update on a CPU).
:class:`BufferSampler` lets the buffer's sampler choose the rows (uniform,
prioritized, ...) exactly as ``sample()`` does, and copies only ``keys`` of
those rows into reused tensors, under the buffer's lock.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from tensordict import NestedKey, TensorDict, TensorDictBase
from torchrl.data import ReplayBuffer

from torchrl_unilab.data.replay_buffer import buffer_lock

__all__ = ["SAMPLE_KEYS", "BufferSampler"]

#: Keys :class:`BufferSampler` gathers by default: what the SAC and TD3 losses
#: read, and the policy version of each row (the recipes log the policy lag).
SAMPLE_KEYS: tuple[NestedKey, ...] = (
    "observation",
    "action",
    ("next", "observation"),
    ("next", "reward"),
    ("next", "done"),
    ("next", "terminated"),
    "policy_version",
)


class BufferSampler:
    """``replay_buffer.sample(return_info=True)`` for ``keys`` only, into tensors it reuses.

    The rows are those the buffer's sampler (``replay_buffer.sampler``)
    picks, so a :class:`~torchrl_unilab.data.prioritized_sampler.SharedPrioritizedSampler`
    samples by priority and returns its ``priority_weight``; ``info["index"]``
    holds the rows, for ``update_priority``. The locks are ``sample()``'s own
    (:func:`~torchrl_unilab.data.replay_buffer.buffer_lock`), held while the
    rows are copied, so that no worker overwrites a row half-way. The returned
    TensorDict and its tensors are the same objects on every call: use each
    batch before drawing the next.

    Args:
        replay_buffer: a buffer from :func:`~torchrl_unilab.make_replay_buffer`,
            with its storage laid out (by the collector or by ``extend``).
        batch_size: rows per batch.

    Keyword Args:
        keys: the keys to gather; missing keys raise ``KeyError``.

    Examples:
        >>> from torchrl_unilab import make_replay_buffer
        >>> rb = make_replay_buffer(100)
        >>> _ = rb.extend(TensorDict({"observation": torch.arange(10.0)[:, None]}, [10]))
        >>> sample = BufferSampler(rb, 4, keys=["observation"])
        >>> batch, info = sample()
        >>> batch["observation"].shape, torch.equal(batch["observation"][:, 0].long(), info["index"])
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
        if storage.ndim != 1:
            raise ValueError(f"BufferSampler needs a one-dimensional storage, got ndim={storage.ndim}")
        self.replay_buffer = replay_buffer
        self.batch_size = batch_size
        data = storage._storage  # noqa: SLF001 - the memory-mapped TensorDict behind the storage
        self._sources = []
        out = TensorDict(batch_size=[batch_size])
        for key in keys:
            leaf = data.get(key)  # KeyError names the missing key
            self._sources.append(leaf)
            out.set(key, torch.empty((batch_size, *leaf.shape[1:]), dtype=leaf.dtype))
        self._keys = list(keys)
        self._targets = [out.get(key) for key in keys]
        self._batch = out
        self._lock = buffer_lock(replay_buffer)

    def __call__(self) -> tuple[TensorDictBase, dict[str, Any]]:
        """Draws one batch: ``(batch, info)`` as ``sample(return_info=True)``; the same TensorDict each call."""
        rb = self.replay_buffer
        with self._lock:
            index, info = rb.sampler.sample(rb.storage, self.batch_size)
            index = torch.as_tensor(index, dtype=torch.int64)
            for source, target in zip(self._sources, self._targets):
                torch.index_select(source, 0, index, out=target)
        # Put the tensors back: the caller may have replaced entries in place
        # (observation normalisation does) since the previous batch.
        batch = self._batch
        for key, target in zip(self._keys, self._targets):
            batch.set(key, target)
        return batch, {**info, "index": index}
