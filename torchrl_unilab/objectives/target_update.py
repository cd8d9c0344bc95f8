"""TorchRL's ``SoftUpdate`` as one ``torch._foreach_lerp_`` over every target tensor.

``SoftUpdate.step`` walks the loss module's source and target ``TensorDict``s
and lerps them tensor by tensor on every update. The pairs do not change
between updates (optimizers, ``load_state_dict`` and ``SoftUpdate.init_``
all write in place), so :class:`ForeachSoftUpdate` lists them once and
updates them in one fused call: no ``TensorDict`` walk and one call instead
of one lerp per tensor, on every update. ``benchmarks/learner_throughput.py``'s
``recipe_loop`` measures the SAC recipe's update that uses it.
"""

from __future__ import annotations

import torch
from torchrl.objectives import SoftUpdate

from torchrl_unilab._torchrl_private import soft_update_tensors

__all__ = ["ForeachSoftUpdate"]


class ForeachSoftUpdate(SoftUpdate):
    """``SoftUpdate`` (``target = eps * target + (1 - eps) * source``) with one fused in-place lerp per step.

    Same arguments and semantics as :class:`torchrl.objectives.SoftUpdate`; it is one. As the tensor-level
    loss's ``MLPExecutor``, it sees in-place writes to the parameters, not
    tensors replaced after it was built (``loss.to(device)`` afterwards): build it once the loss sits on its device,
    as :func:`~torchrl_unilab.trainers.recipes_utils.make_loss_module` does.

    Examples:
        >>> import torch
        >>> from torchrl.objectives import SACLoss, SoftUpdate
        >>> from torchrl_unilab.modules.models import make_actor, make_critic
        >>> loss = SACLoss(make_actor("sac", 3, 1, hidden_dim=8), make_critic(3, 1, hidden_dim=8))
        >>> updater = ForeachSoftUpdate(loss, eps=0.9)
        >>> with torch.no_grad():
        ...     _ = [p.add_(1.0) for p in loss.qvalue_network_params.values(True, True)]
        >>> updater.step()
        >>> source, target = loss.qvalue_network_params, loss.target_qvalue_network_params
        >>> pairs = zip(source.values(True, True), target.values(True, True))
        >>> all(torch.allclose(t, s - 0.9, atol=1e-6) for s, t in pairs)
        True
        >>> isinstance(updater, SoftUpdate)
        True
    """

    def __init__(self, loss_module, *, eps: float | None = None, tau: float | None = None) -> None:
        super().__init__(loss_module, eps=eps, tau=tau)
        self._target_data: list[torch.Tensor] = []
        self._source_data: list[torch.Tensor] = []
        sources, targets = soft_update_tensors(self)
        for key, source in sources.items(True, True):
            key = key if isinstance(key, tuple) else (key,)
            target = targets.get(("target_" + key[0], *key[1:]))
            self._target_data.append(target.data)
            self._source_data.append(source.data)

    def step(self) -> None:
        """Moves every target tensor ``1 - eps`` of the way to its source, in place."""
        if not self.initialized:
            raise RuntimeError(f"{type(self).__name__} must be initialized (init_()) before step()")
        torch._foreach_lerp_(self._target_data, self._source_data, 1 - self.eps)
