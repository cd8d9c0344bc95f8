"""Plain-tensor execution of the MLPs :mod:`torchrl_unilab.modules.models` builds.

Both fast paths -- the worker's policy call (:mod:`torchrl_unilab.modules._fast_policy`)
and the learner's loss (:mod:`torchrl_unilab.objectives._fast_loss`) -- run networks made
of ``Linear``, ``LayerNorm`` and parameter-free layers. Calling such a network
as an ``nn.Module`` tree costs a Python module call per layer; in the worker,
where the weights and code are cold after each batch of MuJoCo steps, that is
about a quarter of the policy's time. :func:`mlp_steps` flattens the tree once
and :class:`MLPExecutor` runs it as a list of ``torch.nn.functional`` calls,
with the network's own weights or with any other set of the same layout (a
loss module's target or stacked Q-network parameters).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from tensordict import TensorDictBase
from tensordict.nn import NormalParamExtractor
from tensordict.nn.utils import biased_softplus
from torch import nn

__all__ = ["MLPExecutor", "concatenates_inputs", "mlp_steps", "normal_params"]

#: ("linear" | "norm", parameter-key prefix, layer) or ("call", function)
Step = tuple

_FUNCTIONS: dict[type, Callable[[torch.Tensor], torch.Tensor]] = {
    nn.ReLU: torch.relu, nn.Tanh: torch.tanh, nn.Sigmoid: torch.sigmoid, nn.Identity: lambda x: x,
}


def concatenates_inputs(net: nn.Module) -> bool:
    """Whether ``net(*inputs)`` runs on its inputs concatenated on the last dimension (TorchRL's MLP does).

    Examples:
        >>> from torchrl.modules import MLP
        >>> concatenates_inputs(MLP(in_features=3, out_features=1, num_cells=[4])), concatenates_inputs(nn.ReLU())
        (True, False)
    """
    from torchrl.modules import MLP

    from torchrl_unilab.modules.models import MultiInputSequential

    return isinstance(net, MLP) or (isinstance(net, MultiInputSequential) and isinstance(net[0], MLP))


def mlp_steps(net: nn.Module, *, root: nn.Module | None = None) -> list[Step] | None:
    """``net`` as a flat list of steps, or ``None`` if it has parametrised layers other than Linear/LayerNorm.

    Parameter keys are the layers' names relative to ``root`` (``net`` by
    default), split on dots: the keys of ``TensorDict.from_module(root)``.
    Parameter-free layers run through their ``forward`` (hooks are not called).

    Examples:
        >>> from torch import nn
        >>> [step[0] for step in mlp_steps(nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 1)))]
        ['linear', 'call', 'linear']
        >>> mlp_steps(nn.Sequential(nn.Conv1d(1, 1, 1))) is None
        True
    """
    if not isinstance(net, nn.Module):  # a TensorDictModule may wrap a plain function
        return None
    root = net if root is None else root
    names = {id(module): tuple(name.split(".")) if name else () for name, module in root.named_modules()}
    steps: list[Step] = []

    def visit(module: nn.Module) -> bool:
        if isinstance(module, nn.Sequential):
            return all(visit(child) for child in module)
        if isinstance(module, nn.Linear):
            steps.append(("linear", names[id(module)], module))
        elif isinstance(module, nn.LayerNorm):
            steps.append(("norm", names[id(module)], module))
        elif next(module.parameters(), None) is not None:
            return False
        elif isinstance(module, NormalParamExtractor):
            steps.append(("call", normal_params(module)))
        else:
            steps.append(("call", _FUNCTIONS.get(type(module), module.forward)))
        return True

    return steps if visit(net) else None


def normal_params(module: NormalParamExtractor) -> Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    """``module``'s forward on one tensor, ``(loc, scale)``, without its two module calls when it maps the scale
    with a biased softplus (the SAC actor's); otherwise its own forward.

    A collection worker runs the actor once per batched step, so the Python overhead of the module calls of
    ``NormalParamExtractor`` and its ``biased_softplus`` is on its hot path; this is the same arithmetic in the
    same order, so the values are equal bit for bit.

    Examples:
        >>> import torch
        >>> extractor = NormalParamExtractor()
        >>> x = torch.randn(5, 6)
        >>> all(torch.equal(a, b) for a, b in zip(normal_params(extractor)(x), extractor(x)))
        True
    """
    mapping, lower = module.scale_mapping, module.scale_lb
    if type(mapping) is not biased_softplus:
        return module.forward
    bias, min_val = mapping.bias, mapping.min_val

    def forward(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        loc, scale = x.chunk(2, -1)
        return loc, (F.softplus(scale + bias) + min_val).clamp_min(lower)

    return forward


class MLPExecutor:
    """Runs :func:`mlp_steps` with one set of weights: plain (``[out, in]``) or stacked (``[n, out, in]``).

    ``params`` is a TensorDict keyed like ``TensorDict.from_module(root)``;
    ``None`` uses each layer's own parameters. The tensors are looked up once:
    in-place updates (optimizer steps, ``load_state_dict``, target updates)
    are seen, replaced tensors are not. Stacked weights run the ``n``
    networks as batched matmuls on an input of shape ``[n, B, in]``.

    ``matmul_dtype=torch.bfloat16`` runs the network under ``torch.autocast``
    in that dtype (its matmuls in bf16, the weights kept in float32) and
    returns float32: what reads the output (distributions, losses, targets)
    computes in float32.

    Examples:
        >>> import torch
        >>> from torch import nn
        >>> net = nn.Sequential(nn.Linear(3, 4), nn.LayerNorm(4), nn.ReLU(), nn.Linear(4, 1))
        >>> run = MLPExecutor(mlp_steps(net))
        >>> x = torch.randn(5, 3)
        >>> torch.allclose(run(x), net(x))
        True
        >>> out = MLPExecutor(mlp_steps(net), matmul_dtype=torch.bfloat16)(x)
        >>> out.dtype, torch.allclose(out, net(x), atol=0.05)
        (torch.float32, True)
    """

    def __init__(self, steps: list[Step], params: TensorDictBase | None = None,
                 matmul_dtype: torch.dtype = torch.float32) -> None:
        self.matmul_dtype = matmul_dtype
        self._ops: list[Callable[[torch.Tensor], torch.Tensor]] = []
        for step in steps:
            if step[0] == "call":
                self._ops.append(step[1])
                continue
            kind, prefix, layer = step
            if params is None:
                weight, bias = layer.weight, layer.bias
            else:
                weight, bias = params.get((*prefix, "weight"), None), params.get((*prefix, "bias"), None)
            self._ops.append(self._linear(weight, bias) if kind == "linear" else self._norm(layer, weight, bias))

    @staticmethod
    def _linear(weight: torch.Tensor, bias: torch.Tensor | None) -> Callable[[torch.Tensor], torch.Tensor]:
        if weight.dim() == 2:
            return lambda x: F.linear(x, weight, bias)
        weight_t = weight.transpose(1, 2)
        if bias is None:
            return lambda x: torch.bmm(x, weight_t)
        bias = bias.unsqueeze(1)
        return lambda x: torch.baddbmm(bias, x, weight_t)

    @staticmethod
    def _norm(layer: nn.LayerNorm, weight, bias) -> Callable[[torch.Tensor], torch.Tensor]:
        shape, eps = layer.normalized_shape, layer.eps
        if weight is None or weight.dim() == 1:
            return lambda x: F.layer_norm(x, shape, weight, bias, eps)
        weight, bias = weight.unsqueeze(1), bias.unsqueeze(1)
        return lambda x: torch.addcmul(bias, F.layer_norm(x, shape, None, None, eps), weight)

    def __call__(self, x: torch.Tensor, copies: int | None = None) -> torch.Tensor:
        """Runs the network on ``x``; ``copies=n`` first expands ``x`` to ``[n, *x.shape]`` (stacked weights)."""
        if copies is not None:
            x = x.expand(copies, *x.shape)
        if self.matmul_dtype == torch.float32:
            for op in self._ops:
                x = op(x)
            return x
        with torch.autocast(x.device.type, dtype=self.matmul_dtype):
            for op in self._ops:
                x = op(x)
        return tuple(t.float() for t in x) if isinstance(x, tuple) else x.float()
