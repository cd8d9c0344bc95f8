"""Loss support: a tensor-level fast path for TorchRL's ``SACLoss`` and ``TD3Loss``, and a fused ``SoftUpdate``.

Laid out like :mod:`torchrl.objectives`; the losses themselves are TorchRL's.

Example:
    >>> from torchrl_unilab.objectives import ForeachSoftUpdate, tensor_loss
"""

from torchrl_unilab.objectives._fast_loss import tensor_loss
from torchrl_unilab.objectives.target_update import ForeachSoftUpdate
