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

__all__ = ["learner_device", "learner_matmul_dtype", "module_device"]

_ACCEPTED = "null (cuda if available, else cpu), 'cpu', 'cuda' or 'cuda:<index>'"
_MATMUL_DTYPES = {"fp32": torch.float32, "float32": torch.float32, "bf16": torch.bfloat16,
                  "bfloat16": torch.bfloat16}


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


def cpu_computes_bf16() -> bool:
    """Whether this CPU multiplies bf16 natively (AVX512-BF16 or AMX); elsewhere torch emulates it, slowly.

    Examples:
        >>> isinstance(cpu_computes_bf16(), bool)
        True
    """
    return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())


def learner_matmul_dtype(value: str, device: torch.device) -> torch.dtype:
    """The dtype of the learner's matmuls from ``optim.matmul_dtype``: ``"fp32"``, ``"bf16"`` or ``"auto"``.

    ``"auto"`` is bf16 on a CPU that computes it natively (:func:`cpu_computes_bf16`) and float32
    elsewhere (a CUDA learner included). Only the networks' matmuls change: the parameters, the
    optimizer's state and the losses stay float32 (:func:`~torchrl_unilab.objectives.tensor_loss`).

    Examples:
        >>> learner_matmul_dtype("fp32", torch.device("cpu"))
        torch.float32
        >>> learner_matmul_dtype("auto", torch.device("cpu")) == (
        ...     torch.bfloat16 if cpu_computes_bf16() else torch.float32)
        True
        >>> learner_matmul_dtype("fp16", torch.device("cpu"))
        Traceback (most recent call last):
        ...
        ValueError: optim.matmul_dtype must be 'auto', 'fp32' or 'bf16', got 'fp16'
    """
    if value == "auto":
        return torch.bfloat16 if device.type == "cpu" and cpu_computes_bf16() else torch.float32
    if value not in _MATMUL_DTYPES:
        raise ValueError(f"optim.matmul_dtype must be 'auto', 'fp32' or 'bf16', got {value!r}")
    return _MATMUL_DTYPES[value]
