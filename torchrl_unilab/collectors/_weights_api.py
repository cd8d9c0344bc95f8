"""TorchRL's weight-update API of :class:`~torchrl_unilab.OffPolicyCollector`: publishing and receiving weights.

The learner publishes through the collector's
:class:`~torchrl_unilab.weight_update.weight_sync_scheme.SeqlockWeightSyncScheme`
(one shared-memory block every worker reads between steps). A collector run
on a node of TorchRL's Ray, RPC or distributed collectors also receives its
parent's weights through TorchRL's receiving schemes, and publishes them on.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from tensordict import TensorDictBase
from torch import nn
from torchrl.collectors import MultiAsyncCollector
from torchrl.weight_update import WeightSyncScheme

from torchrl_unilab._torchrl_private import has_receiver_schemes
from torchrl_unilab.weight_update.torchrl_schemes import bind_receiver_schemes

__all__ = ["WeightSyncAPI"]


class WeightSyncAPI:
    """Mixin of :class:`~torchrl_unilab.OffPolicyCollector`: TorchRL's weight-update methods.

    It reads the collector's fields (``_scheme``, ``_user_policy``,
    ``_weight_updater``, ...) and is not meant to be used alone.

    Examples:
        >>> from torchrl_unilab import OffPolicyCollector
        >>> actor = torch.nn.Linear(3, 1)
        >>> from tensordict.nn import TensorDictModule
        >>> policy = TensorDictModule(actor, ["observation"], ["action"])
        >>> with OffPolicyCollector("Pendulum-v1", policy, num_envs=2, frames_per_batch=32) as collector:
        ...     collector.update_policy_weights_()
        ...     collector.policy_version
        2
    """

    def update_policy_weights_(
        self,
        policy_or_weights: TensorDictBase | nn.Module | Mapping[str, torch.Tensor] | None = None,
        *,
        worker_ids: int | list[int] | None = None,
        model_id: str | None = None,
        **kwargs: Any,
    ) -> None:
        """Publishes new weights; every worker loads them before its next step.

        Args:
            policy_or_weights: a module, a ``state_dict`` or a TensorDict of weights
                (``TensorDict.from_module(actor)``), for the policy given to the
                constructor or any of its submodules: names are resolved under
                whatever the collector wrapped around it (``algo=``, ``obs_norm=``),
                and the rest (normaliser statistics) is published as it is now.
                ``None`` publishes the ``policy`` given to the constructor, which
                the learner typically trains in place (when it lives on a GPU, the
                workers act on a CPU copy, and this publishes the original). CUDA
                tensors reach the shared CPU block with one batched copy.
            worker_ids: accepted for TorchRL compatibility; all workers share one
                copy of the weights, so it must be ``None``.
            model_id: ``None`` or ``"policy"``, the one model the workers run. TorchRL's receiving
                schemes pass it once they have received weights.

        A ``weight_updater`` given to the constructor is called first, as TorchRL's
        collectors call it; the weights then go to the workers as above.
        """
        if "policy_weights" in kwargs:
            policy_or_weights = kwargs.pop("policy_weights")
        if kwargs:
            raise TypeError(f"update_policy_weights_() got unexpected keyword arguments {sorted(kwargs)}")
        if model_id not in (None, "policy"):
            raise ValueError(f"model_id must be None or 'policy' (the model the workers run), got {model_id!r}")
        self._raise_if_failed()
        if self.weight_updater is not None:
            self.weight_updater(policy_or_weights=policy_or_weights, worker_ids=worker_ids)
        self._publish(policy_or_weights, worker_ids=worker_ids)

    def register_scheme_receiver(self, weight_recv_schemes: Mapping[str, WeightSyncScheme], *,
                                 synchronize_weights: bool = True) -> None:
        """Takes weights from a parent collector through TorchRL's receiving schemes, as TorchRL's collectors do.

        TorchRL's Ray, RPC and distributed collectors call this on the collector
        they run on a node. Each scheme applies the weights it receives to the
        policy given to the constructor, then calls :meth:`update_policy_weights_`,
        which publishes them to the workers
        (:func:`~torchrl_unilab.weight_update.torchrl_schemes.bind_receiver_schemes`).
        """
        bind_receiver_schemes(self, weight_recv_schemes, self._receiving_model(), log=self._says_how_weights_arrive)
        MultiAsyncCollector.register_scheme_receiver(self, weight_recv_schemes,
                                                     synchronize_weights=synchronize_weights)

    def receive_weights(self, *args: Any, **kwargs: Any) -> None:
        """Receives weights through the schemes :meth:`register_scheme_receiver` registered, as TorchRL does.

        Without such a scheme this collector is the sender of its workers' weights, and this raises
        ``NotImplementedError``.
        """
        if not has_receiver_schemes(self):
            raise NotImplementedError("OffPolicyCollector receives weights only through the schemes given as "
                               "weight_recv_schemes or to register_scheme_receiver(); call update_policy_weights_() "
                               "to publish the learner's weights")
        MultiAsyncCollector.receive_weights(self, *args, **kwargs)

    def _receiving_model(self) -> nn.Module | None:
        """The module the parent's weights are for: the policy as given, or one built from ``policy_factory``."""
        if self._user_policy is None and self.policy_factory is not None:
            self._user_policy = self.policy_factory()
        return self._user_policy

    def _publish(self, policy_or_weights: Any = None, **kwargs: Any) -> None:
        # Weights restored by load_state_dict stay what the workers start from, until the learner publishes.
        restored, self._weights_restored = getattr(self, "_weights_restored", False), False
        if policy_or_weights is None or policy_or_weights is self._user_policy:
            # The constructor's policy as it is now; the workers' CPU copy of a CUDA policy is no part of training.
            policy_or_weights = self._user_policy if self._acts_on_copy else None
        if restored and not kwargs.get("new_version", True):
            policy_or_weights = None  # the collector's policy, where load_state_dict put the weights
        self._scheme.send(policy_or_weights, **kwargs)

    @property
    def policy_version(self) -> int:
        """Version of the latest published weights (1 = the initial policy)."""
        return self._scheme.version
