"""A tensor-level fast path for calling an exploration policy in the worker loop.

A TensorDict policy call pays about a millisecond of bookkeeping per step
(key checks, output wrapping, building the TanhNormal object) on top of a
0.4 ms MLP, which is as much as simulating 8 MuJoCo steps. For the module
types this package builds (plain ``TensorDictModule`` networks, a TanhNormal
``ProbabilisticActor``, :class:`~torchrl_unilab.modules.exploration.ActionProjection`,
:class:`~torchrl_unilab.modules.exploration.PerEnvMixedNoise`), this module runs the
same computation on a plain dict of tensors. Any other module makes
:func:`tensor_policy` return ``None`` and the worker calls the policy as usual.

``python benchmarks/policy_call.py`` compares this path with the TensorDict
call for SAC's and TD3's exploration policies on HalfCheetah-v5 sizes, and with
``--cold`` with the caches evicted before each call, as after physics.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from tensordict.nn import (
    ProbabilisticTensorDictModule,
    TensorDictModule,
    TensorDictModuleBase,
    TensorDictSequential,
)
from torchrl.modules import TanhNormal

from torchrl_unilab.modules._mlp import MLPExecutor, concatenates_inputs, mlp_steps
from torchrl_unilab.modules._tanh_normal import TanhNormalSampler
from torchrl_unilab.modules.exploration import ActionProjection, PerEnvMixedNoise
from torchrl_unilab.modules.normalization import ObservationNormalizer

__all__ = ["tensor_policy"]


class _TensorMap(dict):
    """A dict with the ``get``/``set`` subset of the TensorDict API our modules use."""

    def set(self, key, value):
        self[key] = value
        return self


def _network_step(module: TensorDictModule) -> Callable[[_TensorMap], None]:
    net, in_keys, out_keys = module.module, list(module.in_keys), list(module.out_keys)
    concat = len(in_keys) > 1 and concatenates_inputs(net)
    steps = mlp_steps(net) if len(in_keys) == 1 or concat else None
    if steps is not None:  # a plain MLP: functional calls instead of a module call per layer
        executor = MLPExecutor(steps)
        net = (lambda *inputs: executor(torch.cat(inputs, dim=-1))) if concat else executor

    def step(values: _TensorMap) -> None:
        out = net(*[values[k] for k in in_keys])
        if not isinstance(out, tuple):
            out = (out,)
        for key, value in zip(out_keys, out):
            values[key] = value

    return step


def _tanh_normal_step(module: ProbabilisticTensorDictModule) -> Callable[[_TensorMap], None] | None:
    kwargs = dict(module.distribution_kwargs or {})
    if kwargs.pop("tanh_loc", False) or set(kwargs) - {"low", "high"} or module.return_log_prob:
        return None
    if getattr(module, "safe", False):
        return None
    sampler = TanhNormalSampler(kwargs.get("low", -1.0), kwargs.get("high", 1.0))
    loc_key, scale_key = module.in_keys if isinstance(module.in_keys, list) else list(module.in_keys)
    (out_key,) = module.out_keys[:1]

    def step(values: _TensorMap) -> None:
        values[out_key] = sampler.sample(values[loc_key], values[scale_key])

    return step


def _steps(module: TensorDictModuleBase) -> list[Callable[[_TensorMap], None]] | None:
    if isinstance(module, TensorDictSequential):
        steps: list = []
        for sub in module.module:
            sub_steps = _steps(sub)
            if sub_steps is None:
                return None
            steps += sub_steps
        return steps
    if isinstance(module, (ActionProjection, PerEnvMixedNoise, ObservationNormalizer)):
        return [module.forward]
    if isinstance(module, ProbabilisticTensorDictModule):
        if module.distribution_class is not TanhNormal or len(module.in_keys) != 2:
            return None
        step = _tanh_normal_step(module)
        return None if step is None else [step]
    if type(module).forward is TensorDictModule.forward or _is_plain_safe_module(module):
        return [_network_step(module)]
    return None


def _is_plain_safe_module(module: TensorDictModuleBase) -> bool:
    # torchrl's Actor / SafeModule only differ from TensorDictModule when safe=True.
    from torchrl.modules import SafeModule

    return isinstance(module, SafeModule) and not getattr(module, "safe", False)


def tensor_policy(policy: TensorDictModuleBase) -> Callable[[dict], torch.Tensor] | None:
    """Returns ``f(values) -> action`` running ``policy`` on a dict of tensors, or ``None``.

    Only valid under ``ExplorationType.RANDOM`` (the TanhNormal step samples).
    ``values`` must hold every key the policy reads (e.g. ``"observation"``,
    ``"is_init"``); it is updated in place with the intermediate outputs.
    """
    steps = _steps(policy)
    if not steps:
        return None

    def run(values: dict) -> torch.Tensor:
        mapped = _TensorMap(values)
        for step in steps:
            step(mapped)
        values.update(mapped)  # the caller keeps what the policy wrote (the worker's rows hold it)
        return mapped["action"]

    return run
