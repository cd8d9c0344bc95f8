"""Observation normalisation shared by the learner and the collector workers."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from tensordict import NestedKey, TensorDictBase
from tensordict.nn import TensorDictModuleBase
from torch import Tensor

from torchrl_unilab._torchrl_private import writer_cursor

__all__ = ["ObservationNormalizer", "normalize_batch"]


class ObservationNormalizer(TensorDictModuleBase):
    """Normalises observations with running mean and variance: ``(x - mean) / sqrt(var + eps)``.

    **One writer.** Only the learner calls :meth:`update`. The running ``mean``,
    ``var`` and ``count`` are float64 persistent buffers, so they are part of
    :meth:`state_dict`. Placed at the front of the workers' policy
    (``TensorDictSequential(normalizer, actor, noise)``), they reach the workers
    with each weight publish, which copies the policy's ``state_dict``. Every
    worker therefore reads a consistent snapshot, the one matching the weights it
    acts with, and no process writes statistics that another reads concurrently.
    (TorchRL's ``VecNorm`` instead updates shared statistics from every worker,
    which races.) :meth:`forward` never updates the statistics.

    :meth:`update` merges a batch into the running statistics with Chan et al.'s
    parallel algorithm, in float64; the variance is the population variance
    (``ddof=0``). Before the first update, ``mean=0`` and ``var=1``, which leaves
    observations unchanged up to ``eps`` and clipping.

    The learner normalises the batches it samples with :meth:`normalize` (or
    :func:`normalize_batch`), which uses the same statistics and ``eps``.
    The replay buffer should hold raw observations: by default :meth:`forward`
    overwrites ``in_keys`` in the TensorDict it is given, so if that TensorDict is
    also the one stored, set ``out_keys`` to other keys and point the actor there.

    Args:
        shape: shape of one observation (an int for a flat vector).

    Keyword Args:
        in_keys: keys to normalise.
        out_keys: where to write the results; defaults to ``in_keys`` (in place).
        eps: added to the variance before the square root.
        clip: normalised values are clamped to ``[-clip, clip]``; ``None`` for no
            clamping.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl_unilab.modules.normalization import ObservationNormalizer
        >>> norm = ObservationNormalizer(2)
        >>> norm.update(torch.tensor([[0.0, 10.0], [2.0, 30.0]]))
        >>> norm.mean, norm.var
        (tensor([ 1., 20.], dtype=torch.float64), tensor([  1., 100.], dtype=torch.float64))
        >>> norm.count
        tensor(2., dtype=torch.float64)
        >>> td = TensorDict({"observation": torch.tensor([[3.0, 0.0]])}, batch_size=[1])
        >>> norm(td)["observation"]
        tensor([[ 2., -2.]])
        >>> sorted(norm.state_dict())
        ['count', 'mean', 'var']
    """

    def __init__(
        self,
        shape: int | Sequence[int],
        *,
        in_keys: Sequence[NestedKey] = ("observation",),
        out_keys: Sequence[NestedKey] | None = None,
        eps: float = 1e-8,
        clip: float | None = 10.0,
    ) -> None:
        shape = torch.Size([shape] if isinstance(shape, int) else shape)
        if any(d < 1 for d in shape):
            raise ValueError(f"shape must have dims >= 1, got {tuple(shape)}")
        in_keys = list(in_keys)
        out_keys = list(in_keys if out_keys is None else out_keys)
        if not in_keys or len(out_keys) != len(in_keys):
            raise ValueError(
                f"in_keys must be non-empty and out_keys must match its length, got "
                f"in_keys={in_keys} and out_keys={out_keys}"
            )
        if eps < 0:
            raise ValueError(f"eps must be >= 0, got {eps}")
        if clip is not None and clip <= 0:
            raise ValueError(f"clip must be > 0 or None, got {clip}")
        self.in_keys = in_keys
        self.out_keys = out_keys
        super().__init__()
        self.shape = shape
        self.eps = float(eps)
        self.clip = None if clip is None else float(clip)
        self.register_buffer("mean", torch.zeros(shape, dtype=torch.float64))
        self.register_buffer("var", torch.ones(shape, dtype=torch.float64))
        self.register_buffer("count", torch.zeros((), dtype=torch.float64))
        # Learner-local bookkeeping for update_from_buffer; not model state.
        self._buffer_write_count = 0
        #: Rows :meth:`update` left out because they held NaN or an infinity.
        self.nonfinite_rows = 0

    def _check_shape(self, obs: Tensor, name: str) -> None:
        n = len(self.shape)
        if obs.ndim < n or obs.shape[obs.ndim - n :] != self.shape:
            raise ValueError(
                f"{name} must have shape [..., {', '.join(map(str, self.shape))}], "
                f"got {tuple(obs.shape)}"
            )

    @torch.no_grad()
    def update(self, obs: Tensor) -> None:
        """Merges a batch ``[..., *shape]`` into the running statistics (float64).

        Rows holding NaN or an infinity are left out and counted in
        :attr:`nonfinite_rows`: merged once, they would poison the statistics,
        and with them every worker's policy, for the rest of the run.

        Examples:
            >>> import torch
            >>> from torchrl_unilab.modules.normalization import ObservationNormalizer
            >>> norm = ObservationNormalizer(1)
            >>> norm.update(torch.tensor([[1.0], [3.0]]))
            >>> norm.update(torch.tensor([[5.0]]))
            >>> norm.mean.item(), norm.var.item(), norm.count.item()
            (3.0, 2.6666666666666665, 3.0)
            >>> norm.update(torch.tensor([[float("nan")], [float("inf")]]))
            >>> norm.count.item(), norm.nonfinite_rows
            (3.0, 2)
        """
        self._check_shape(obs, "obs")
        x = obs.detach().to(device=self.mean.device, dtype=torch.float64)
        x = x.reshape(-1, *self.shape)
        finite = torch.isfinite(x).flatten(1).all(-1) if x.ndim > 1 else torch.isfinite(x)
        if not bool(finite.all()):
            self.nonfinite_rows += int((~finite).sum())
            x = x[finite]
        n = x.shape[0]
        if n == 0:
            return
        batch_mean = x.mean(0)
        batch_var = x.var(0, unbiased=False)
        total = self.count + n
        delta = batch_mean - self.mean
        m2 = self.var * self.count + batch_var * n + delta.square() * (self.count * n / total)
        self.mean.add_(delta * (n / total))
        self.var.copy_(m2 / total)
        self.count.copy_(total)

    def normalize(self, obs: Tensor) -> Tensor:
        """Returns ``obs`` normalised (and clipped), in ``obs``'s dtype.

        Examples:
            >>> import torch
            >>> from torchrl_unilab.modules.normalization import ObservationNormalizer
            >>> norm = ObservationNormalizer(1, clip=1.0)
            >>> norm.normalize(torch.tensor([[0.5], [4.0]]))
            tensor([[0.5000],
                    [1.0000]])
        """
        self._check_shape(obs, "obs")
        dtype = obs.dtype if obs.is_floating_point() else torch.get_default_dtype()
        # Computed in the observation dtype, not float64: float64 is slow on most
        # GPUs and the statistics only need float32 precision here.
        mean = self.mean.to(device=obs.device, dtype=dtype)
        std = (self.var + self.eps).sqrt().to(device=obs.device, dtype=dtype)
        out = (obs.to(dtype) - mean) / std
        if self.clip is not None:
            out = out.clamp(-self.clip, self.clip)
        return out

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        for in_key, out_key in zip(self.in_keys, self.out_keys):
            tensordict.set(out_key, self.normalize(tensordict.get(in_key)))
        return tensordict

    def update_from_buffer(self, replay_buffer, key: NestedKey | None = None) -> int:
        """Updates the statistics with the rows written to a replay buffer since the last call.

        Reads the positions a round-robin writer filled since the previous call
        (counted with ``replay_buffer.write_count``, the rows ending at the
        writer's cursor). If more rows than the
        capacity were written meanwhile, the older ones are overwritten already
        and only the rows still stored are used. Works with a one-dimensional
        TorchRL storage; rows being written concurrently may be read half-written,
        so call it from the learner between collection steps.

        ``key`` is the entry read, by default the normaliser's first ``in_keys`` entry.

        Returns:
            The number of rows merged.

        Examples:
            >>> import torch
            >>> from tensordict import TensorDict
            >>> from torchrl.data import ReplayBuffer, TensorStorage
            >>> from torchrl_unilab.modules.normalization import ObservationNormalizer
            >>> storage = TensorStorage(TensorDict({"observation": torch.zeros(4, 1)}, [4]))
            >>> rb = ReplayBuffer(storage=storage)
            >>> norm = ObservationNormalizer(1)
            >>> _ = rb.extend(TensorDict({"observation": torch.arange(6.0)[:, None]}, [6]))
            >>> norm.update_from_buffer(rb), norm.mean.item()  # rows 2..5 remain
            (4, 3.5)
            >>> norm.update_from_buffer(rb)
            0
        """
        key = self.in_keys[0] if key is None else key
        write_count = int(replay_buffer.write_count)
        new = write_count - self._buffer_write_count
        self._buffer_write_count = write_count
        storage = replay_buffer.storage
        if getattr(storage, "ndim", 1) != 1:
            raise ValueError(
                f"replay_buffer must have a one-dimensional storage, got ndim={storage.ndim}"
            )
        n = min(new, len(storage))
        if n <= 0:
            return 0
        end = int(writer_cursor(replay_buffer.writer))  # where the newest row ends
        index = torch.arange(end - n, end) % int(storage.max_size)
        self.update(storage[index].get(key))
        return n


def normalize_batch(
    tensordict: TensorDictBase,
    normalizer: ObservationNormalizer,
    keys: Sequence[NestedKey] = ("observation", ("next", "observation")),
) -> TensorDictBase:
    """Normalises ``keys`` of a sampled batch in place with ``normalizer``'s statistics.

    For the learner: the replay buffer holds raw observations, and both the
    current and the next observation must be normalised before the loss.
    Missing keys raise ``KeyError``.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl_unilab.modules.normalization import ObservationNormalizer, normalize_batch
        >>> norm = ObservationNormalizer(1)
        >>> norm.update(torch.tensor([[0.0], [2.0]]))
        >>> batch = TensorDict(
        ...     {"observation": torch.tensor([[3.0]]), ("next", "observation"): torch.tensor([[1.0]])},
        ...     batch_size=[1],
        ... )
        >>> batch = normalize_batch(batch, norm)
        >>> batch["observation"], batch["next", "observation"]
        (tensor([[2.]]), tensor([[0.]]))
    """
    for key in keys:
        tensordict.set(key, normalizer.normalize(tensordict.get(key)))
    return tensordict
