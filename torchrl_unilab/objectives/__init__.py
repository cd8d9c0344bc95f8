"""Loss support: a tensor-level fast path for TorchRL's ``SACLoss`` and ``TD3Loss``.

Laid out like :mod:`torchrl.objectives`; the losses themselves are TorchRL's.

Example:
    >>> from torchrl_unilab.objectives import tensor_loss
"""

from torchrl_unilab.objectives._fast_loss import tensor_loss
