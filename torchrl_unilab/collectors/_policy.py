"""The policy an :class:`~torchrl_unilab.OffPolicyCollector`'s workers act with, built from the user's.

One path for both of TorchRL's ways to give a policy: ``policy=`` (built here,
pickled to the workers) and ``policy_factory=`` (called in each worker, as
TorchRL's multi-process collectors do: what the workers act with is never
pickled). Given without ``policy``, the factory is also called once here, for the
policy the collector publishes weights from (:meth:`PolicyRecipe.build` of it lays
out the weights every worker's factory-built policy loads), and once in a spawned
process for the rows' layout (:func:`~torchrl_unilab.collectors._probe.probe_in_process`).
Either way the same steps make the acting policy: TorchRL's auto-wrapping of a
tensor-in module (:func:`wrapped_as_torchrl_does`), the env's spec for
exploration modules built with ``spec=None``, a CPU copy, and the algorithm's
exploration (:func:`~torchrl_unilab.modules.exploration.make_collector_policy`).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import torch
from tensordict import TensorDictBase
from torch import nn
from torch.nn.parameter import is_lazy
from torchrl.data import TensorSpec
from torchrl.envs import EnvBase
from torchrl.envs.utils import RandomPolicy
from torchrl.modules import set_exploration_modules_spec_from_env

from torchrl_unilab._torchrl_private import make_compatible_policy
from torchrl_unilab.modules.exploration import make_collector_policy
from torchrl_unilab.modules.normalization import ObservationNormalizer

__all__ = ["BuiltPolicy", "PolicyFromFactory", "PolicyRecipe", "RandomActions", "shaped_as", "wrapped_as_torchrl_does"]


class BuiltPolicy(NamedTuple):
    """What :meth:`PolicyRecipe.build` gives."""

    #: what the workers run: ``[normaliser,] policy, exploration``, on the CPU
    acting: nn.Module
    #: the user's policy as TorchRL's collectors hold it (auto-wrapped), where it lives: publishes read it
    given: Callable
    #: whether ``acting`` runs a CPU copy of ``given`` (a CUDA policy), rather than ``given`` itself
    on_copy: bool
    obs_norm: ObservationNormalizer | None


class RandomActions(nn.Module):
    """TorchRL's ``RandomPolicy`` as a module (with no weights), so that it syncs like any policy.

    The spec is the env's own (unbatched for an unbatched env, whose rows the policy sees without a batch
    dimension), as TorchRL's collectors give ``RandomPolicy``.

    Examples:
        >>> from torchrl.data import Bounded
        >>> from tensordict import TensorDict
        >>> RandomActions(Bounded(-1, 1, (2,)))(TensorDict())["action"].shape
        torch.Size([2])
    """

    def __init__(self, action_spec: TensorSpec) -> None:
        super().__init__()
        self.random = RandomPolicy(action_spec)

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        return self.random(tensordict)


def wrapped_as_torchrl_does(policy: Callable, env: EnvBase) -> Callable:
    """A policy that takes tensors (``forward(observation)``) wrapped in a ``TensorDictModule``, by TorchRL's
    own rule (its collectors call the same function); any other policy as it is.

    Examples:
        >>> from torchrl.envs import GymEnv
        >>> class Net(torch.nn.Module):
        ...     def forward(self, observation):  # named as the env's observation key
        ...         return observation[..., :1]
        >>> type(wrapped_as_torchrl_does(Net(), GymEnv("Pendulum-v1"))).__name__
        'TensorDictModule'
    """
    try:
        return make_compatible_policy(policy, env.observation_spec, env=env)
    except (TypeError, AttributeError, ValueError) as err:
        raise TypeError("Failed to wrap the policy. If the policy needs to be trusted, set trust_policy=True. "
                        f"TorchRL's wrapper said: {err}") from err


@dataclasses.dataclass
class PolicyRecipe:
    """How a user's policy becomes the acting policy; the same in the parent and, for a factory, in a worker.

    Args:
        algo: ``"sac"``, ``"td3"`` or ``None`` (:func:`~torchrl_unilab.modules.exploration.make_collector_policy`).
        trust_policy: TorchRL's argument: skip the auto-wrapping.
        obs_norm: ``True``, an :class:`~torchrl_unilab.ObservationNormalizer`, or ``None``.
        exploration: ``td3_noise``, ``td3_std``, ... for the exploration module.

    Examples:
        >>> from torchrl.envs import GymEnv
        >>> from torchrl_unilab.envs.resolve import as_batched_env
        >>> env = GymEnv("Pendulum-v1")
        >>> built = PolicyRecipe().build(None, env, as_batched_env(env))
        >>> type(built.acting).__name__, built.on_copy, built.obs_norm
        ('RandomActions', False, None)
    """

    algo: str | None = None
    trust_policy: bool = False
    obs_norm: bool | ObservationNormalizer | None = None
    exploration: dict[str, Any] = dataclasses.field(default_factory=dict)

    def build(self, policy: Callable | None, env: EnvBase, batched_env: EnvBase) -> BuiltPolicy:
        """The acting policy for ``env`` (as given) stepped as ``batched_env`` (batch ``[num_envs]``);
        ``policy=None`` acts uniformly at random."""
        if policy is None:
            policy = RandomActions(env.full_action_spec)
        elif not self.trust_policy:
            policy = wrapped_as_torchrl_does(policy, env)
        if isinstance(policy, nn.Module):
            # As TorchRL's collectors do: exploration modules built with spec=None take the env's.
            set_exploration_modules_spec_from_env(policy, batched_env)
        cpu_policy = _on_cpu(policy)
        acting, obs_norm = make_collector_policy(
            cpu_policy, self.algo, batched_env.action_spec_unbatched, obs_norm=self.obs_norm,
            obs_dim=batched_env.observation_spec["observation"].shape[-1] if self.obs_norm is True else None,
            **self.exploration,
        )
        return BuiltPolicy(acting, policy, cpu_policy is not policy, obs_norm)


@dataclasses.dataclass
class PolicyFromFactory:
    """What a worker gets instead of a pickled policy when the user gave ``policy_factory``: it builds there.

    Args:
        factory: the user's ``policy_factory``.
        recipe: how the factory's policy becomes the acting policy, as in the parent.
        keeps_own_weights: whether the worker acts with the weights its own factory call gave it until the collector
            publishes after construction, as TorchRL's workers do with a factory and no policy (the block's initial
            weights are then those of the parent's own instance). ``False`` when a ``policy`` was given too: the
            workers start from its weights, as they do from a pickled policy's.

    Examples:
        >>> from torchrl.envs import GymEnv
        >>> from torchrl_unilab.envs.resolve import as_batched_env
        >>> env = as_batched_env(GymEnv("Pendulum-v1"))
        >>> from tensordict.nn import TensorDictModule
        >>> make = PolicyFromFactory(lambda: TensorDictModule(torch.nn.Linear(3, 1), ["observation"], ["action"]),
        ...                          PolicyRecipe())
        >>> type(make(env)).__name__
        'TensorDictModule'
    """

    factory: Callable[[], Callable]
    recipe: PolicyRecipe
    keeps_own_weights: bool = True

    def __call__(self, batched_env: EnvBase) -> nn.Module:
        return self.recipe.build(self.factory(), batched_env, batched_env).acting


def shaped_as(policy: Callable, weights: Mapping[str, torch.Tensor]) -> None:
    """Loads ``weights`` into ``policy`` if it still has lazy (uninitialised) parameters or buffers, which their
    shapes then initialise; a policy without any is left as it is.

    A factory-built policy's lazy layers take their shapes at its first step. The parent never steps its own
    instance (the probe steps another one, in a process of its own), so it takes the probe's weights instead, and
    with them the layout that every worker's policy has once it has stepped.

    Examples:
        >>> lazy = torch.nn.LazyLinear(2)
        >>> shaped_as(lazy, torch.nn.Linear(3, 2).state_dict())
        >>> lazy.weight.shape
        torch.Size([2, 3])
    """
    if not isinstance(policy, nn.Module):
        return
    if any(is_lazy(tensor) for tensor in (*policy.parameters(), *policy.buffers())):
        policy.load_state_dict(dict(weights))


def _on_cpu(policy: Callable) -> Callable:
    """``policy``, or a CPU copy of it if any of its tensors lives elsewhere (workers act on CPU)."""
    tensors = list(policy.parameters()) + list(policy.buffers()) if isinstance(policy, nn.Module) else []
    if all(t.device.type == "cpu" for t in tensors):
        return policy
    return _attributes_to_cpu(copy.deepcopy(policy).to("cpu"))


def _attributes_to_cpu(policy: nn.Module) -> nn.Module:
    """Moves what ``.to()`` leaves behind to the CPU: distribution keyword arguments and specs, in place.

    A ProbabilisticActor's distribution keyword arguments (a TanhNormal's action bounds) and specs are
    plain attributes, not buffers: left on the GPU, every worker would initialise CUDA to act.
    """
    for module in policy.modules():
        kwargs = getattr(module, "distribution_kwargs", None)
        if isinstance(kwargs, dict):
            module.distribution_kwargs = {key: value.cpu() if isinstance(value, torch.Tensor) else value
                                          for key, value in kwargs.items()}
        for name, value in list(vars(module).items()):
            if isinstance(value, TensorSpec):  # a Composite may say device=None and hold CUDA leaves
                vars(module)[name] = value.to("cpu")
    return policy
