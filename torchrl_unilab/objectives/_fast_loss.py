"""A tensor-level fast path for TorchRL's ``SACLoss`` and ``TD3Loss`` on this package's networks.

TorchRL's losses spend about a third of an update (batch 256, 256x256
networks, one CPU thread) on TensorDict bookkeeping: selecting and expanding
TensorDicts, swapping parameters into modules, ``vmap`` over the Q-networks.
For the networks :mod:`torchrl_unilab.modules.models` builds (MLPs of ``Linear``,
``LayerNorm`` and parameter-free layers), :func:`tensor_loss` computes the same
losses from the loss module's own parameters with plain tensor operations:
the two Q-networks run as one batched matmul over their stacked weights, the
SAC actor's ``TanhNormal`` is sampled as plain tensor operations
(:mod:`~torchrl_unilab.modules._tanh_normal`), random numbers are drawn in
the loss module's order. Values and gradients equal the loss module's
(``tests/test_fast_loss.py``). Anything else -- another loss class or
configuration, a value estimator other than TD(0), a network with other
parametrised layers -- makes :func:`tensor_loss` return ``None`` and the
caller uses the loss module itself.

``python benchmarks/learner_throughput.py`` measures the update with it against
the same update calling ``SACLoss`` and TorchRL's sota loop (batch 256, 256x256
networks, one thread; the figures are in
``benchmarks/results/learning/learner_throughput.json``). ``torch.compile`` of
the loss module is no faster on CPU and takes tens of seconds to compile.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from tensordict import NestedKey, TensorDictBase
from tensordict.nn import ProbabilisticTensorDictModule, TensorDictModule
from torchrl.modules import ProbabilisticActor, TanhNormal
from torchrl.objectives import LossModule, SACLoss, TD3Loss
from torchrl.objectives.utils import distance_loss
from torchrl.objectives.value import TD0Estimator

from torchrl_unilab._torchrl_private import sac_alpha, sac_version
from torchrl_unilab.modules._mlp import MLPExecutor, concatenates_inputs, mlp_steps
from torchrl_unilab.modules._tanh_normal import TanhNormalSampler
from torchrl_unilab.modules.models import PassThroughActor

__all__ = ["tensor_loss"]


class _Network:
    """A TensorDict network (actor or Q-network) as in/out keys plus an MLP to bind to parameters."""

    def __init__(self, root: TensorDictModule, module: TensorDictModule) -> None:
        net = module.module
        self.concat = concatenates_inputs(net)
        self.steps = mlp_steps(net, root=root)
        self.in_keys: list[NestedKey] = list(module.in_keys)
        self.supported = self.steps is not None and (self.concat or len(self.in_keys) == 1)

    def bind(self, params: TensorDictBase, matmul_dtype: torch.dtype = torch.float32) -> MLPExecutor:
        return MLPExecutor(self.steps, params, matmul_dtype)

    def inputs(self, batch: TensorDictBase, *, next_: bool = False, **replace: torch.Tensor) -> torch.Tensor:
        """The network's input: ``in_keys`` read from ``batch`` (or ``batch["next"]``), some replaced."""
        values = [replace[key] if isinstance(key, str) and key in replace
                  else batch.get(_nested("next", key) if next_ else key) for key in self.in_keys]
        return torch.cat(values, dim=-1) if len(values) > 1 else values[0]


def _nested(prefix: str, key: NestedKey) -> tuple:
    return (prefix, *key) if isinstance(key, tuple) else (prefix, key)


def _is_td0(loss: LossModule) -> bool:
    return type(loss.value_estimator) is TD0Estimator  # the property builds the default (TD0) if unset


def _gamma(loss: LossModule) -> torch.Tensor:
    # Read on every call: make_value_estimator() may replace the estimator after construction. The buffer itself,
    # not float(): on a GPU that would wait for the device on every update (and break CUDA-graph capture).
    estimator = loss.value_estimator
    if type(estimator) is not TD0Estimator:
        raise ValueError(f"the tensor-level loss computes TD(0) targets, the loss now has {type(estimator).__name__}; "
                         "set compile.fast_loss=false, or call the loss module itself")
    return estimator.gamma


def _plain_weights(loss: LossModule) -> bool:
    # Reductions other than the mean, and priority weights, change the math.
    return getattr(loss, "reduction", "mean") == "mean" and getattr(loss, "use_prioritized_weights", "auto") is not True


def _check_unweighted(loss: LossModule, batch: TensorDictBase) -> None:
    if loss.tensor_keys.priority_weight in batch.keys():
        raise ValueError(
            f"the batch holds priority weights ({loss.tensor_keys.priority_weight!r}), which the tensor-level "
            "loss does not apply; call the loss module itself for prioritized replay"
        )


class _TensorLoss:
    """What SAC and TD3 share: the bound networks and the Q-networks' regression onto a target."""

    def __init__(self, loss: SACLoss | TD3Loss, actor: _Network, critic: _Network, matmul_dtype: torch.dtype) -> None:
        self.loss, self.actor, self.critic = loss, actor, critic
        self.policy = actor.bind(loss.actor_network_params, matmul_dtype)
        self.q = critic.bind(loss.qvalue_network_params, matmul_dtype)
        self.q_target = critic.bind(loss.target_qvalue_network_params, matmul_dtype)
        self.n = loss.num_qvalue_nets
        self.action_key = loss.tensor_keys.action

    def _loss_qvalue(self, batch: TensorDictBase, target: torch.Tensor) -> torch.Tensor:
        # As both losses: the distance of every Q-network to the target, summed over networks, mean over rows.
        q = self.q(self.critic.inputs(batch), self.n).squeeze(-1)
        return distance_loss(q, target.expand_as(q), loss_function=self.loss.loss_function).sum(0).mean()


class _SACTensorLoss(_TensorLoss):
    """``SACLoss`` (v2: two Q-networks, no value network) on tensors; see the module docstring."""

    def __init__(self, loss: SACLoss, actor: _Network, critic: _Network, dist_kwargs: dict,
                 matmul_dtype: torch.dtype) -> None:
        super().__init__(loss, actor, critic, matmul_dtype)
        if dist_kwargs.get("tanh_loc", False):
            self._draw = lambda loc, scale: TanhNormal(loc, scale, **dist_kwargs).rsample_and_log_prob()
        else:
            sampler = TanhNormalSampler(dist_kwargs.get("low", -1.0), dist_kwargs.get("high", 1.0))
            self._draw = sampler.rsample_and_log_prob
        self.q_detached = critic.bind(loss.qvalue_network_params.detach(), matmul_dtype)

    def _sample(self, observation: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self._draw(*self.policy(observation))

    def __call__(self, batch: TensorDictBase, update_actor: bool = True) -> dict[str, torch.Tensor]:
        loss, act = self.loss, self.action_key
        _check_unweighted(loss, batch)
        alpha = sac_alpha(loss)
        # The Q-target first: SACLoss draws the next action before the current one.
        with torch.no_grad():
            next_action, next_log_prob = self._sample(self.actor.inputs(batch, next_=True))
            next_q = self.q_target(self.critic.inputs(batch, next_=True, **{act: next_action}), self.n)
            next_value = (next_q - alpha * next_log_prob.unsqueeze(-1)).min(0)[0]
            target = _td0_target(batch, next_value, _gamma(loss))
        loss_qvalue = self._loss_qvalue(batch, target)

        action, log_prob = self._sample(self.actor.inputs(batch))
        q_pi = self.q_detached(self.critic.inputs(batch, **{act: action}), self.n).min(0)[0].squeeze(-1)
        loss_actor = (alpha * log_prob - q_pi).mean()
        log_prob = log_prob.detach()
        loss_alpha = (-loss.log_alpha * (log_prob + loss.target_entropy)).mean()
        return {"loss_actor": loss_actor, "loss_qvalue": loss_qvalue, "loss_alpha": loss_alpha,
                "alpha": alpha, "entropy": -log_prob.mean()}


class _TD3TensorLoss(_TensorLoss):
    """``TD3Loss`` on tensors: :meth:`value_loss` and :meth:`actor_loss` as the loss module's, or both at once.

    ``update_actor=False`` computes the critic loss alone (the delayed steps). A TD3 update steps the critics
    on :meth:`value_loss` before it computes :meth:`actor_loss`, so that the actor climbs the updated critic.
    """

    def __init__(self, loss: TD3Loss, actor: _Network, critic: _Network, matmul_dtype: torch.dtype) -> None:
        super().__init__(loss, actor, critic, matmul_dtype)
        self.policy_target = actor.bind(loss.target_actor_network_params, matmul_dtype)
        # The actor loss reads the first Q-network only: no need to run the others.
        self.q1_detached = critic.bind(loss.qvalue_network_params.detach()[:1], matmul_dtype)

    def actor_loss(self, batch: TensorDictBase) -> torch.Tensor:
        """``TD3Loss.actor_loss``: ``-Q1(s, actor(s))`` averaged over the batch, gradients to the actor only."""
        _check_unweighted(self.loss, batch)
        action = self.policy(self.actor.inputs(batch))
        return -self.q1_detached(self.critic.inputs(batch, **{self.action_key: action}), 1)[0].mean()

    def value_loss(self, batch: TensorDictBase) -> torch.Tensor:
        """``TD3Loss.value_loss``: both Q-networks onto the smoothed, clipped double-Q TD(0) target."""
        loss, act = self.loss, self.action_key
        _check_unweighted(loss, batch)
        action = batch.get(act)
        noise = (torch.randn_like(action) * loss.policy_noise).clamp(-loss.noise_clip, loss.noise_clip)
        with torch.no_grad():
            next_action = (self.policy_target(self.actor.inputs(batch, next_=True)) + noise).clamp(
                loss.min_action, loss.max_action)
            next_q = self.q_target(self.critic.inputs(batch, next_=True, **{act: next_action}), self.n)
            target = _td0_target(batch, next_q.min(0)[0], _gamma(loss))
        return self._loss_qvalue(batch, target)

    def __call__(self, batch: TensorDictBase, update_actor: bool = True) -> dict[str, torch.Tensor]:
        # TD3Loss.forward's order: the actor loss, then the value loss (both on the same parameters)
        out = {"loss_actor": self.actor_loss(batch)} if update_actor else {}
        out["loss_qvalue"] = self.value_loss(batch)
        return out


def _td0_target(batch: TensorDictBase, next_value: torch.Tensor, gamma: torch.Tensor) -> torch.Tensor:
    """TD(0) as TorchRL's ``TD0Estimator``: ``r + gamma * (1 - terminated) * V(s')``, shape ``[B]``; for n-step
    rows (``"steps_to_next_obs"``, :class:`~torchrl.data.postprocs.MultiStep`) ``gamma ** steps_to_next_obs``."""
    reward, terminated = batch.get(("next", "reward")), batch.get(("next", "terminated"))
    steps = batch.get("steps_to_next_obs", None)
    if steps is not None:
        gamma = gamma ** steps.view_as(reward)
    return (reward + gamma * (~terminated) * next_value).squeeze(-1)


def tensor_loss(loss: LossModule,
                matmul_dtype: torch.dtype = torch.float32) -> Callable[..., dict[str, torch.Tensor]] | None:
    """``f(batch, update_actor=True) -> {"loss_actor", "loss_qvalue", ...}`` computing ``loss``'s math, or ``None``.

    Supported: :class:`~torchrl.objectives.SACLoss` (v2) and
    :class:`~torchrl.objectives.TD3Loss` with TD(0) targets, mean reduction,
    and networks built by :mod:`torchrl_unilab.modules.models` (or any MLP of
    ``Linear``, ``LayerNorm`` and parameter-free layers). The returned values
    are the scalar entries the loss module's output holds (SAC: losses,
    ``alpha``, ``entropy``; TD3: losses). For TD3 the returned object also
    has ``value_loss(batch)`` and ``actor_loss(batch)``, each a scalar, as
    ``TD3Loss``'s methods of those names (which return ``(loss, metadata)``).

    ``matmul_dtype=torch.bfloat16`` runs the networks' matmuls in bf16
    (:class:`~torchrl_unilab.modules._mlp.MLPExecutor`): the parameters, the
    optimizer's state, the networks' outputs and everything computed from them
    (log-probabilities, targets, losses) stay float32. See
    :func:`~torchrl_unilab.trainers.device.learner_matmul_dtype` for where bf16 is native.

    Examples:
        >>> from torchrl.objectives import TD3Loss
        >>> from torchrl_unilab.modules.models import make_actor, make_critic
        >>> actor = make_actor("td3", 3, 1, hidden_dim=8)
        >>> fast = tensor_loss(TD3Loss(actor, make_critic(3, 1, hidden_dim=8), action_spec=actor.spec))
        >>> callable(fast.value_loss), callable(fast.actor_loss)
        (True, True)
    """
    if type(loss) not in (SACLoss, TD3Loss) or not _is_td0(loss) or not _plain_weights(loss):
        return None
    if loss.tensor_keys.action != "action" or loss.tensor_keys.state_action_value != "state_action_value":
        return None
    critic = _Network(loss.qvalue_network, loss.qvalue_network)
    if not critic.supported:
        return None
    if type(loss) is SACLoss:
        return _sac(loss, critic, matmul_dtype)
    return _td3(loss, critic, matmul_dtype)


def _sac(loss: SACLoss, critic: _Network, matmul_dtype: torch.dtype) -> _SACTensorLoss | None:
    actor = loss.actor_network
    if sac_version(loss) != 2 or getattr(loss, "skip_done_states", False):
        return None
    if not isinstance(actor, ProbabilisticActor) or len(actor.module) != 2:
        return None
    params_module, dist_module = actor.module
    if type(params_module) is not TensorDictModule or not isinstance(dist_module, ProbabilisticTensorDictModule):
        return None
    kwargs = dict(dist_module.distribution_kwargs or {})
    if dist_module.distribution_class is not TanhNormal or set(kwargs) - {"low", "high", "tanh_loc", "upscale"}:
        return None
    if list(params_module.out_keys) != list(dist_module.in_keys):
        return None
    network = _Network(actor, params_module)
    return _SACTensorLoss(loss, network, critic, kwargs, matmul_dtype) if network.supported else None


def _td3(loss: TD3Loss, critic: _Network, matmul_dtype: torch.dtype) -> _TD3TensorLoss | None:
    root = actor = loss.actor_network
    if isinstance(actor, PassThroughActor):  # an asymmetric critic's inputs pass by the actor, unread
        actor = actor[0]
    if not isinstance(actor, TensorDictModule) or list(actor.out_keys) != ["action"]:
        return None
    network = _Network(root, actor)
    return _TD3TensorLoss(loss, network, critic, matmul_dtype) if network.supported else None

