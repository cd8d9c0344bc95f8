"""The policy's weights as :class:`~torchrl_unilab.OffPolicyCollector`'s workers act with them.

:class:`WeightPublisher` publishes the learner's weights through the collector's
:class:`~torchrl_unilab.weight_update.weight_sync_scheme.SeqlockWeightSyncScheme` (one shared-memory block every
worker reads between steps), restores them from a checkpoint, and reads back what was published last.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase
from torch import nn

from torchrl_unilab.collectors._policy import RandomActions
from torchrl_unilab.weight_update.weight_sync_scheme import SeqlockWeightSyncScheme, resolve_weight_names

__all__ = ["WeightPublisher"]


class WeightPublisher:
    """Publishes the policy's weights to the workers, and restores them from a checkpoint.

    Args:
        scheme: the collector's scheme, initialised on the sender.
        policy: the policy the workers act with (the given one, wrapped as the collector wraps it).
        given: the policy as given to the collector (``None`` for a ``policy_factory`` alone).
        on_copy: whether the workers act on a CPU copy of ``given`` (a policy on a GPU).

    Examples:
        >>> from tensordict.nn import TensorDictModule
        >>> from torchrl_unilab import OffPolicyCollector
        >>> policy = TensorDictModule(torch.nn.Linear(3, 1), ["observation"], ["action"])
        >>> scheme = SeqlockWeightSyncScheme()
        >>> scheme.init_on_sender(model_id="policy", model=policy)
        >>> weights = WeightPublisher(scheme, policy=policy, given=policy, on_copy=False)
        >>> weights.publish()
        >>> weights.version, sorted(weights.cached_weights().keys(True, True))[0]
        (2, ('module', 'bias'))
        >>> weights.shutdown()
    """

    def __init__(self, scheme: SeqlockWeightSyncScheme, *, policy: nn.Module, given: nn.Module | None,
                 on_copy: bool) -> None:
        self._scheme = scheme
        self._policy, self._given, self._on_copy = policy, given, on_copy
        self._restored = False  # weights load_state_dict put in the policy, not yet published over

    @property
    def scheme(self) -> Any:
        """The scheme as given (ours by default; TorchRL's runs on our block through an adapter)."""
        return getattr(self._scheme, "scheme", None) or self._scheme

    @property
    def shared(self) -> Any:
        """The shared block the workers read."""
        return self._scheme.shared

    @property
    def given(self) -> nn.Module | None:
        """The policy as given to the collector (or built by :meth:`receiving_model`)."""
        return self._given

    @property
    def version(self) -> int:
        """Version of the latest published weights (1 = the initial policy)."""
        return self._scheme.version

    def publish(self, policy_or_weights: Any = None, **kwargs: Any) -> None:
        """Publishes ``policy_or_weights`` (``None``: the given policy as it is now) to every worker.

        ``new_version=False`` republishes under the same version (the workers' first weights).
        """
        # Weights restored by restore() stay what the workers start from, until the learner publishes.
        restored, self._restored = self._restored, False
        if policy_or_weights is None or policy_or_weights is self._given:
            # The given policy as it is now; the workers' CPU copy of a CUDA policy is no part of training.
            policy_or_weights = self._given if self._on_copy else None
        if restored and not kwargs.get("new_version", True):
            policy_or_weights = None  # the collector's policy, where restore() put the weights
        self._scheme.send(policy_or_weights, **kwargs)

    def restore(self, weights: Mapping[str, torch.Tensor], strict: bool = True) -> None:
        """Loads checkpointed weights into the policy and publishes them; ``strict`` as in
        ``nn.Module.load_state_dict`` (``False``: the names given are loaded, the others kept)."""
        policy = self._policy
        if isinstance(policy, nn.Module) and not strict:
            policy.load_state_dict(dict(weights), strict=False)
            weights = None  # the policy, as it now is, is what the workers get
        elif isinstance(policy, nn.Module):
            policy.load_state_dict(resolve_weight_names(policy, weights))
        self._scheme.send(weights)
        self._restored = True

    def saved_weights(self) -> dict[str, torch.Tensor] | None:
        """The weights a checkpoint holds, under the names of the given policy: a CPU policy's own weights, and
        for a policy on a GPU the weights published last (``None`` once the block is closed)."""
        if isinstance(self._given, nn.Module) and not self._on_copy:
            return {name: value.detach().clone() for name, value in self._given.state_dict().items()}
        if self._scheme.shared.closed:
            return None
        return self._scheme.published_state_dict(like=self._given)

    def cached_weights(self) -> TensorDictBase:
        """The weights published last, as a TensorDict."""
        version_and_tensors = self._scheme.shared.read()
        names = [name for name, _, _ in self._scheme.shared.layout]
        return TensorDict(dict(zip(names, version_and_tensors[1])), []).unflatten_keys(".")

    def receiving_model(self, policy_factory: Callable[[], nn.Module] | None) -> nn.Module | None:
        """The module a parent collector's weights are for: the policy as given, or one built by ``policy_factory``
        (then published from) when it was given without a policy: the collector then acts with random actions,
        whose weights (none) would leave a receiving scheme waiting while its sender sends the factory module's."""
        if policy_factory is not None and (self._given is None or isinstance(self._given, RandomActions)):
            self._given = policy_factory()
        return self._given

    def shutdown(self) -> None:
        """Closes the shared block."""
        self._scheme.shutdown()
