"""The policy's weights as :class:`~torchrl_unilab.OffPolicyCollector`'s workers act with them.

:class:`WeightPublisher` publishes the learner's weights through the collector's
:class:`~torchrl_unilab.weight_update.weight_sync_scheme.SeqlockWeightSyncScheme` (one shared-memory block every
worker reads between steps), restores them from a checkpoint, and reads back what was published last.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase
from torch import nn

from torchrl_unilab.weight_update.weight_sync_scheme import SeqlockWeightSyncScheme, resolve_weight_names

__all__ = ["WeightPublisher"]


class WeightPublisher:
    """Publishes the policy's weights to the workers, and restores them from a checkpoint.

    Args:
        scheme: the collector's scheme, initialised on the sender.
        policy: the policy the workers act with (the given one, wrapped as the collector wraps it).
        given: the policy as given to the collector, or the one built here by a ``policy_factory`` given alone.
        on_copy: whether the workers act on a CPU copy of ``given`` (a policy on a GPU).
        holds_published: whether ``given`` was built by the collector (a ``policy_factory`` given alone), so that no
            learner trains it: each publish also loads the published weights into it, and into ``policy``, so that
            ``publish()``, :meth:`saved_weights` and a parent collector's weights start from what was published last.

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
                 on_copy: bool, holds_published: bool = False) -> None:
        self._scheme = scheme
        self._policy, self._given, self._on_copy = policy, given, on_copy
        self._holds_published = holds_published
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
        """The policy as given to the collector, or built by its ``policy_factory`` (given alone); a parent
        collector's weights are for it."""
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
        if self._holds_published and policy_or_weights is not None and policy_or_weights is not self._given:
            self._hold_published()

    def _hold_published(self) -> None:
        """Loads the weights published last into the policy the collector built, and into its original (a policy
        on a GPU) if the workers act on a copy."""
        if isinstance(self._policy, nn.Module):
            self._policy.load_state_dict(self._scheme.published_state_dict())
        if self._on_copy and isinstance(self._given, nn.Module):
            self._given.load_state_dict(self._scheme.published_state_dict(like=self._given))

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

    def shutdown(self) -> None:
        """Closes the shared block."""
        self._scheme.shutdown()
