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

from torchrl_unilab._torchrl_private import storage_tensors
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

    For a learner on a GPU (``device="cuda"``) the rows are still gathered on
    the CPU, into pinned host tensors, and cross to tensors allocated once on
    the device with one ``non_blocking`` copy each: the call returns as soon as
    the copies are queued, so gathering the next batch overlaps the update the
    GPU is running. Before it gathers into the host tensors again, a call waits
    for the previous batch's copies to have left them (a CUDA event), which
    bounds how far the CPU runs ahead.

    Args:
        replay_buffer: a buffer from :func:`~torchrl_unilab.make_replay_buffer`,
            with its storage laid out (by the collector or by ``extend``).
        batch_size: rows per batch.

    Keyword Args:
        keys: the keys to gather; missing keys raise ``KeyError``.
        device: where batches are returned (default: the CPU, where they are
            gathered). ``info``'s tensors other than ``"index"`` go there too.
        pin_memory: gather into pinned host memory; default: when ``device``
            is a CUDA device. Needs a CUDA build with a GPU present.

    Examples:
        >>> from torchrl_unilab import make_replay_buffer
        >>> rb = make_replay_buffer(100)
        >>> _ = rb.extend(TensorDict({"observation": torch.arange(10.0)[:, None]}, [10]))
        >>> sample = BufferSampler(rb, 4, keys=["observation"])
        >>> batch, info = sample()
        >>> batch["observation"].shape, torch.equal(batch["observation"][:, 0].long(), info["index"])
        (torch.Size([4, 1]), True)
        >>> BufferSampler(rb, 4, keys=["observation"], device="cpu").pin_memory
        False
    """

    def __init__(
        self,
        replay_buffer: ReplayBuffer,
        batch_size: int,
        *,
        keys: Sequence[NestedKey] = SAMPLE_KEYS,
        device: torch.device | str | None = None,
        pin_memory: bool | None = None,
    ) -> None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
        storage = replay_buffer.storage
        if not getattr(storage, "initialized", False):
            raise ValueError("replay_buffer's storage is not laid out yet; create the collector (or extend) first")
        if storage.ndim != 1:
            raise ValueError(f"BufferSampler needs a one-dimensional storage, got ndim={storage.ndim}")
        self.device = torch.device("cpu") if device is None else torch.device(device)
        if pin_memory is None:
            pin_memory = self.device.type == "cuda"
        if pin_memory and not torch.cuda.is_available():
            raise ValueError(
                f"pin_memory=True needs a CUDA build with a GPU present (torch {torch.__version__}, "
                f"torch.cuda.is_available() is False); pass pin_memory=False or None"
            )
        self.pin_memory = bool(pin_memory)
        self.replay_buffer = replay_buffer
        self.batch_size = batch_size
        data = storage_tensors(storage)  # the memory-mapped TensorDict behind the storage
        self._sources = []
        out = TensorDict(batch_size=[batch_size])
        for key in keys:
            leaf = data.get(key)  # KeyError names the missing key
            self._sources.append(leaf)
            out.set(key, torch.empty((batch_size, *leaf.shape[1:]), dtype=leaf.dtype, pin_memory=self.pin_memory))
        self._keys = list(keys)
        self._targets = [out.get(key) for key in keys]
        self._lock = buffer_lock(replay_buffer)
        self._on_host = self.device.type == "cpu"
        if self._on_host:
            self._batch, self._outputs = out, self._targets
        else:
            self._batch = out.to(self.device)  # allocated once; each call copies into it
            self._outputs = [self._batch.get(key) for key in keys]
        # Set when a batch's host-to-device copies are queued: the host tensors are free again once it has passed.
        self._copied = torch.cuda.Event() if self.device.type == "cuda" else None

    def __call__(self) -> tuple[TensorDictBase, dict[str, Any]]:
        """Draws one batch: ``(batch, info)`` as ``sample(return_info=True)``; the same TensorDict each call."""
        rb = self.replay_buffer
        if self._copied is not None:
            self._copied.synchronize()  # the previous batch's copies have read the host tensors
        with self._lock:
            index, info = rb.sampler.sample(rb.storage, self.batch_size)
            index = torch.as_tensor(index, dtype=torch.int64)
            for source, target in zip(self._sources, self._targets):
                torch.index_select(source, 0, index, out=target)
        if not self._on_host:
            for target, output in zip(self._targets, self._outputs):
                output.copy_(target, non_blocking=self.pin_memory)
            if self._copied is not None:
                self._copied.record(torch.cuda.current_stream(self.device))
            info = {key: value.to(self.device, non_blocking=True) if isinstance(value, torch.Tensor) else value
                    for key, value in info.items()}
        # Put the tensors back: the caller may have replaced entries in place
        # (observation normalisation does) since the previous batch.
        batch = self._batch
        for key, output in zip(self._keys, self._outputs):
            batch.set(key, output)
        return batch, {**info, "index": index}
