"""A host copy of a ``state_dict`` in one contiguous buffer, filled from any device with one copy.

:meth:`SharedWeights.publish <torchrl_unilab.weight_update.weight_sync.SharedWeights.publish>`
stages the weights here before it touches the shared block, so that a bad value
or a failing copy leaves the published weights as they were. The buffer has the
byte layout of the block's tensor region, so the seqlock write that follows is
one ``memcpy``.

Weights trained on a GPU come over with one device-to-host copy per publish:
each CUDA tensor is first gathered into a device buffer of the same layout
(device-to-device copies, queued without waiting), then the whole buffer
crosses to host memory in one ``non_blocking`` copy into *pinned* memory, and a
single synchronisation of the current stream makes it readable. Copying the
tensors one by one with ``.cpu()`` would instead wait for the GPU once per
tensor and go through pageable memory each time.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["HostStaging"]


class HostStaging:
    """Host tensors of given shapes and dtypes, views of one byte buffer, filled by :meth:`fill`.

    Args:
        layout: ``(name, shape, dtype)`` for each tensor.
        offsets: the byte offset of each tensor in the buffer; each a multiple
            of its dtype's size.
        nbytes: the buffer's size.

    Examples:
        >>> import torch
        >>> staging = HostStaging([("w", (2, 2), torch.float32), ("n", (), torch.int64)], offsets=[0, 64], nbytes=128)
        >>> staging.fill([torch.ones(2, 2), torch.tensor(7)])
        >>> staging.views[0].tolist(), int(staging.views[1]), staging.flat.numel()
        ([[1.0, 1.0], [1.0, 1.0]], 7, 128)
        >>> staging.pinned  # pinned memory only once a CUDA tensor comes through
        False
    """

    def __init__(self, layout: Sequence[tuple[str, tuple[int, ...], torch.dtype]], *, offsets: Sequence[int],
                 nbytes: int) -> None:
        if len(offsets) != len(layout):
            raise ValueError(f"offsets must give one offset per layout entry ({len(layout)}), got {len(offsets)}")
        self.layout = list(layout)
        self.offsets = list(offsets)
        self.nbytes = int(nbytes)
        self.flat = torch.empty(self.nbytes, dtype=torch.uint8)
        self.views = _views(self.flat, self.layout, self.offsets)
        self._device_flat: torch.Tensor | None = None
        self._device_views: list[torch.Tensor] = []

    @property
    def pinned(self) -> bool:
        """Whether :attr:`flat` is in pinned (page-locked) host memory."""
        return self.flat.is_pinned()

    def fill(self, values: Sequence[torch.Tensor]) -> None:
        """Copies ``values`` (one per layout entry, any devices) into :attr:`views`; returns when they are readable.

        CPU tensors are copied directly. The tensors on the device of the first
        non-CPU tensor cross in one device-to-host copy; on CUDA it is a
        ``non_blocking`` copy into pinned memory followed by one
        synchronisation of the current stream. Tensors on any further device
        (a model split over two GPUs) are copied one by one.
        """
        if len(values) != len(self.layout):
            raise ValueError(f"values must hold {len(self.layout)} tensors (the layout), got {len(values)}")
        on_device = [i for i, value in enumerate(values) if value.device.type != "cpu"]
        if on_device:
            device = values[on_device[0]].device
            batched = [i for i in on_device if values[i].device == device]
            self._copy_from_device(device, [(i, values[i]) for i in batched])
            for i in set(on_device) - set(batched):
                self.views[i].copy_(values[i].detach())
        # After the device copy: it brought the whole byte range over, these slots included.
        for i, value in enumerate(values):
            if value.device.type == "cpu":
                self.views[i].copy_(value.detach())

    def _copy_from_device(self, device: torch.device, values: list[tuple[int, torch.Tensor]]) -> None:
        cuda = device.type == "cuda"
        if cuda and not self.pinned:
            # A non_blocking copy into pageable memory is no faster than a blocking one: pin the buffer.
            self.flat = torch.empty(self.nbytes, dtype=torch.uint8, pin_memory=True)
            self.views = _views(self.flat, self.layout, self.offsets)
        if self._device_flat is None or self._device_flat.device != device:
            self._device_flat = torch.empty(self.nbytes, dtype=torch.uint8, device=device)
            self._device_views = _views(self._device_flat, self.layout, self.offsets)
        for i, value in values:  # device-to-device, queued on the current stream
            self._device_views[i].copy_(value.detach())
        self.flat.copy_(self._device_flat, non_blocking=cuda)
        if cuda:
            # The one wait: for the queued work (the update that made these weights, then the copy) to finish.
            torch.cuda.current_stream(device).synchronize()


def _views(flat: torch.Tensor, layout: Sequence[tuple[str, tuple[int, ...], torch.dtype]],
           offsets: Sequence[int]) -> list[torch.Tensor]:
    out = []
    for (_, shape, dtype), offset in zip(layout, offsets):
        count = 1
        for size in shape:
            count *= int(size)
        nbytes = count * torch.empty((), dtype=dtype).element_size()
        out.append(flat[offset:offset + nbytes].view(dtype).view(shape))
    return out
