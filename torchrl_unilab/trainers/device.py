"""Where a recipe's learner runs: TorchRL's ``network.device`` key, resolved once.

The networks, the loss, the optimiser and the target updater live on the
learner's device; the collector's workers always act on a CPU copy of the
policy, and the replay buffer stays in shared CPU memory (batches cross to the
device in :class:`~torchrl_unilab.data.buffer_sampler.BufferSampler`, weights come back in
:meth:`SharedWeights.publish <torchrl_unilab.SharedWeights.publish>`).

``network.device: null`` means CUDA when ``torch.cuda.is_available()``, else
the CPU. TorchRL's sota scripts fall back to any accelerator
(``torchrl._utils.get_available_device``: CUDA, NPU, MPS); the recipes take
CUDA or the CPU only, the two devices they are tested on.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

__all__ = ["learner_device", "module_device"]

_ACCEPTED = "null (cuda if available, else cpu), 'cpu', 'cuda' or 'cuda:<index>'"


def learner_device(value: Any) -> torch.device:
    """The learner's device from ``network.device`` (a string, a ``torch.device`` or ``None``).

    ``None`` (or ``""``) is ``cuda`` when ``torch.cuda.is_available()``, else
    ``cpu``. A CUDA device without an index gets the current one, so that
    streams and events of the learner name one GPU.

    Examples:
        >>> learner_device("cpu")
        device(type='cpu')
        >>> learner_device(None) == torch.device("cuda" if torch.cuda.is_available() else "cpu")
        True
        >>> learner_device("mps")
        Traceback (most recent call last):
        ...
        ValueError: network.device must be null (cuda if available, else cpu), 'cpu', 'cuda' or 'cuda:<index>', got 'mps'
    """  # noqa: E501
    if value is None or value == "":
        return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    try:
        device = torch.device(value)
    except (RuntimeError, TypeError):
        raise ValueError(f"network.device must be {_ACCEPTED}, got {value!r}") from None
    if device.type == "cpu":
        return device
    if device.type != "cuda":
        raise ValueError(f"network.device must be {_ACCEPTED}, got {value!r}")
    if not torch.cuda.is_available():
        raise ValueError(
            f"network.device={value!r} but no CUDA device is available (torch {torch.__version__}, built with CUDA "
            f"{torch.version.cuda}); use network.device=cpu, or null to take a GPU only where there is one"
        )
    index = torch.cuda.current_device() if device.index is None else device.index
    if index >= torch.cuda.device_count():
        raise ValueError(f"network.device={value!r}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    return torch.device("cuda", index)


def module_device(module: nn.Module) -> torch.device:
    """The device of ``module``'s first parameter or buffer (the CPU for a module without either).

    Examples:
        >>> module_device(torch.nn.Linear(2, 2)), module_device(torch.nn.ReLU())
        (device(type='cpu'), device(type='cpu'))
    """
    for tensor in module.parameters():
        return tensor.device
    for tensor in module.buffers():
        return tensor.device
    return torch.device("cpu")
