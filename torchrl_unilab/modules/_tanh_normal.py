"""TorchRL's ``TanhNormal`` (``tanh_loc=False``) sampled as plain tensor operations, for the two fast paths.

``TanhNormal(loc, scale, low=..., high=...).rsample_and_log_prob()`` builds a
``TransformedDistribution`` (an ``Independent`` ``Normal``, TorchRL's safe
tanh as an ``autograd.Function``, an affine map onto ``[low, high]``) on every
call. :class:`TanhNormalSampler` computes the same sample and log-probability
from ``loc`` and ``scale`` directly: the same random numbers (one
``randn_like`` on ``loc``'s shape), the same clamp of the tanh to
``1 - resolution``, the same stable ``log(1 - tanh(u)^2)``. One difference:
where that clamp binds (``|u|`` above about 7.2 in float32), the action's
gradient here is 0, TorchRL's ``1 - limit^2`` (about 2e-6).

Why: the distribution objects are rebuilt on every call, in the SAC update and
in each worker's policy call, while the sample itself is a handful of
elementwise ops; here no object is built and no ``autograd.Function`` runs.
``benchmarks/learner_throughput.py``'s ``recipe_loop`` measures the SAC
recipe's update that uses it.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

__all__ = ["TanhNormalSampler"]

_LOG_2 = math.log(2.0)
_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)


class TanhNormalSampler:
    """Draws ``TanhNormal(loc, scale, low=low, high=high, tanh_loc=False)`` samples with plain tensor ops.

    ``low``/``high``: the action bounds (tensors or numbers); the unit box skips the affine map.

    Examples:
        >>> import torch
        >>> from torchrl.modules import TanhNormal
        >>> loc, scale = torch.zeros(4, 2), torch.full((4, 2), 0.5)
        >>> sampler = TanhNormalSampler(-2.0, 2.0)
        >>> _ = torch.manual_seed(0)
        >>> action, log_prob = sampler.rsample_and_log_prob(loc, scale)
        >>> _ = torch.manual_seed(0)
        >>> ref_action, ref_log_prob = TanhNormal(loc, scale, low=-2.0, high=2.0).rsample_and_log_prob()
        >>> torch.allclose(action, ref_action), torch.allclose(log_prob, ref_log_prob)
        (True, True)
    """

    def __init__(self, low: torch.Tensor | float = -1.0, high: torch.Tensor | float = 1.0) -> None:
        low = torch.as_tensor(low, dtype=torch.float32)
        high = torch.as_tensor(high, dtype=torch.float32)
        if not bool((high > low).all()):
            raise ValueError(f"TanhNormalSampler needs high > low, got low={low.tolist()}, high={high.tolist()}")
        half, mid = (high - low) / 2, (high + low) / 2
        self.unit_box = bool((half == 1).all() and (mid == 0).all())
        self._box = (half, mid, half.log())
        # the box on each (dtype, device) it is used with, copied once: a copy per call would wait for the device
        self._boxes: dict[tuple[torch.dtype, torch.device], tuple[torch.Tensor, ...]] = {}

    def _box_like(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        key = (x.dtype, x.device)
        if key not in self._boxes:
            self._boxes[key] = tuple(t.to(x) for t in self._box)
        return self._boxes[key]

    def _squash(self, preimage: torch.Tensor) -> torch.Tensor:
        # TorchRL's SafeTanhTransform: tanh clamped away from +-1, so that the action stays invertible.
        limit = 1.0 - torch.finfo(preimage.dtype).resolution
        action = torch.tanh(preimage).clamp(-limit, limit)
        if self.unit_box:
            return action
        half, mid, _ = self._box_like(action)
        return action * half + mid

    def sample(self, loc: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        """A reparametrised sample, without its log-probability (the worker's exploration)."""
        return self._squash(loc + torch.randn_like(loc) * scale)

    def rsample_and_log_prob(self, loc: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The sample and its log-probability summed over the last dimension, as ``TanhNormal``'s method."""
        noise = torch.randn_like(loc)
        preimage = loc + noise * scale
        # Normal log-density of the preimage minus log|d tanh(u)/du| = 2 (log 2 - u - softplus(-2u)).
        log_prob = -0.5 * noise.square() - scale.log() - _HALF_LOG_2PI
        log_prob = log_prob - 2.0 * (_LOG_2 - preimage - F.softplus(-2.0 * preimage))
        log_prob = log_prob.sum(-1)
        if not self.unit_box:
            log_prob = log_prob - self._box_like(log_prob)[2].expand(loc.shape[-1:]).sum()
        return self._squash(preimage), log_prob
