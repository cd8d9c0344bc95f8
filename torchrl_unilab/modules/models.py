"""Actor and critic builders shared by the learner and the collector workers.

The learner and every worker build their networks with the same call, so the
parameter names and shapes match and a weight sync can copy a ``state_dict``
from one side to the other without any key mapping.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from tensordict import NestedKey
from tensordict.nn import NormalParamExtractor, TensorDictModule, TensorDictModuleBase, TensorDictSequential
from torch import Tensor, nn
from torchrl.data import Bounded
from torchrl.envs.utils import ExplorationType
from torchrl.modules import MLP, Actor, ProbabilisticActor, TanhNormal, ValueOperator
from torchrl.modules.models.batchrenorm import BatchRenorm1d

__all__ = ["ALGOS", "PRIVILEGED_ALGOS", "MultiInputSequential", "PassThroughActor", "actor_algo", "make_actor",
           "make_critic"]

ALGOS: tuple[str, ...] = ("sac", "td3")
"""The off-policy algorithms whose networks :func:`make_actor` can build."""

PRIVILEGED_ALGOS: tuple[str, ...] = tuple(f"{a}_priv" for a in ALGOS)
"""``algo_type`` values of the function-level API whose actor also reads privileged context."""


def actor_algo(algo_type: str) -> tuple[str, bool]:
    """``(algo, reads_privileged)`` for an ``algo_type`` of :data:`ALGOS` or :data:`PRIVILEGED_ALGOS`.

    ``"sac_priv"`` is SAC whose actor reads ``["observation", "privileged"]``.

    Examples:
        >>> actor_algo("td3_priv"), actor_algo("sac")
        (('td3', True), ('sac', False))
    """
    accepted = ALGOS + PRIVILEGED_ALGOS
    if algo_type not in accepted:
        raise ValueError(f"algo_type must be one of {accepted}, got {algo_type!r}")
    return algo_type.removesuffix("_priv"), algo_type in PRIVILEGED_ALGOS


def _check_algo(algo: str, name: str = "algo") -> None:
    if algo not in ALGOS:
        raise ValueError(f"{name} must be one of {ALGOS}, got {algo!r}")


def _check_positive(value: int, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")


def _hidden_sizes(hidden_sizes: Sequence[int] | None, hidden_dim: int, num_layers: int) -> list[int]:
    if hidden_sizes is None:
        _check_positive(hidden_dim, "hidden_dim")
        _check_positive(num_layers, "num_layers")
        return [hidden_dim] * num_layers
    sizes = list(hidden_sizes)
    if not sizes or any(isinstance(w, bool) or not isinstance(w, int) or w < 1 for w in sizes):
        raise ValueError(f"hidden_sizes must be a non-empty sequence of ints >= 1, got {hidden_sizes!r}")
    return sizes


def _mlp(
    in_features: int,
    out_features: int,
    hidden_sizes: list[int],
    use_layer_norm: bool,
    activation: type[nn.Module],
    batch_renorm: Mapping[str, Any] | None = None,
) -> MLP:
    # TorchRL's MLP: Linear -> norm -> activation per hidden layer, and it
    # concatenates several inputs (the critic's observation and action).
    norm_class, norm_kwargs = None, None
    if batch_renorm is not None:  # as TorchRL's sota crossq critic
        norm_class, norm_kwargs = BatchRenorm1d, [{"num_features": width, **batch_renorm} for width in hidden_sizes]
    elif use_layer_norm:
        norm_class, norm_kwargs = nn.LayerNorm, [{"normalized_shape": width} for width in hidden_sizes]
    return MLP(
        in_features=in_features,
        out_features=out_features,
        num_cells=hidden_sizes,
        activation_class=activation,
        norm_class=norm_class,
        norm_kwargs=norm_kwargs,
    )


def _bounds(
    action_low: float | Tensor, action_high: float | Tensor, action_dim: int
) -> tuple[Tensor, Tensor]:
    try:
        low, high = torch.broadcast_tensors(
            torch.as_tensor(action_low, dtype=torch.float32).expand(action_dim),
            torch.as_tensor(action_high, dtype=torch.float32).expand(action_dim),
        )
    except RuntimeError as err:
        raise ValueError(
            f"action_low and action_high must be scalars or have shape "
            f"({action_dim},) (action_dim), got {action_low!r} and {action_high!r}"
        ) from err
    if not bool((high > low).all()):
        raise ValueError(
            f"action_high must be > action_low in every dimension, got "
            f"action_low={low.tolist()} and action_high={high.tolist()}"
        )
    return low.clone(), high.clone()


class _AffineRescale(nn.Module):
    """Maps values in [-1, 1] onto [low, high] per action dimension."""

    def __init__(self, low: Tensor, high: Tensor) -> None:
        super().__init__()
        # Buffers, so that ``.to(device)`` moves the bounds with the weights.
        self.register_buffer("loc", (high + low) / 2)
        self.register_buffer("scale", (high - low) / 2)

    def forward(self, x: Tensor) -> Tensor:
        return x * self.scale + self.loc


class MultiInputSequential(nn.Sequential):
    """``nn.Sequential`` whose first module takes every input: TorchRL's MLP concatenates them.

    An actor reading several keys (observation and privileged context) stays a
    plain chain of layers, which the fast paths run layer by layer.

    Examples:
        >>> import torch
        >>> from torchrl.modules import MLP
        >>> net = MultiInputSequential(MLP(in_features=3, out_features=1, num_cells=[4]), torch.nn.Tanh())
        >>> net(torch.zeros(2, 1), torch.zeros(2, 2)).shape
        torch.Size([2, 1])
    """

    def forward(self, *inputs: Tensor) -> Tensor:
        x = self[0](*inputs)
        for module in self[1:]:
            x = module(x)
        return x


def make_actor(
    algo: str,
    obs_dim: int,
    action_dim: int,
    *,
    hidden_dim: int = 512,
    num_layers: int = 2,
    hidden_sizes: Sequence[int] | None = None,
    use_layer_norm: bool = True,
    action_low: float | Tensor = -1.0,
    action_high: float | Tensor = 1.0,
    in_key: NestedKey = "observation",
    in_keys: Sequence[NestedKey] | None = None,
    activation: type[nn.Module] = nn.ReLU,
) -> TensorDictModuleBase:
    """Builds the policy network for SAC or TD3, writing ``"action"``.

    Each of the ``num_layers`` hidden layers is
    ``Linear -> LayerNorm (if use_layer_norm) -> activation``.

    * ``"sac"``: a :class:`~torchrl.modules.ProbabilisticActor` whose MLP
      writes ``"loc"`` and ``"scale"`` (through a
      :class:`~tensordict.nn.NormalParamExtractor` with a biased softplus) and
      which samples a :class:`~torchrl.modules.TanhNormal` on
      ``[action_low, action_high]``. It samples under
      ``ExplorationType.RANDOM`` (its default) and returns the distribution's
      deterministic value under ``ExplorationType.DETERMINISTIC``. This is the
      ``actor_network`` that :class:`~torchrl.objectives.SACLoss` expects.
    * ``"td3"``: a deterministic :class:`~torchrl.modules.Actor`,
      ``MLP -> tanh -> affine map onto [action_low, action_high]``. This is the
      ``actor_network`` of :class:`~torchrl.objectives.TD3Loss`; exploration
      noise is added by a separate module (see
      :func:`torchrl_unilab.modules.exploration.make_exploration_policy`).

    Both actors carry a :class:`~torchrl.data.Bounded` action spec in
    ``actor.spec["action"]``.

    Args:
        algo: ``"sac"`` or ``"td3"`` (see :data:`ALGOS`).
        obs_dim: width of the observation read from ``in_key``.
        action_dim: number of action dimensions.

    Keyword Args:
        hidden_dim: width of each hidden layer (>= 1).
        num_layers: number of hidden layers (>= 1).
        hidden_sizes: the width of each hidden layer (TorchRL's
            ``network.hidden_sizes``); replaces ``hidden_dim`` and ``num_layers``.
        use_layer_norm: insert a ``LayerNorm`` after each hidden ``Linear``.
        action_low: lower action bound, a scalar or a ``(action_dim,)`` tensor.
        action_high: upper action bound, a scalar or a ``(action_dim,)`` tensor.
        in_key: the TensorDict key the actor reads.
        in_keys: several keys, concatenated in this order on their last
            dimension (e.g. ``["observation", "privileged"]`` for an actor that
            reads privileged context); replaces ``in_key``, and ``obs_dim`` is
            then their total width.
        activation: the activation class, instantiated once per hidden layer.

    Raises:
        ValueError: on an unknown ``algo``, a dimension below 1 or bounds with
            ``action_high <= action_low``.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.envs.utils import ExplorationType, set_exploration_type
        >>> from torchrl_unilab.modules.models import make_actor
        >>> actor = make_actor("td3", obs_dim=5, action_dim=2, hidden_dim=16)
        >>> td = actor(TensorDict({"observation": torch.randn(4, 5)}, batch_size=[4]))
        >>> td["action"].shape
        torch.Size([4, 2])
        >>> sac = make_actor("sac", 5, 2, hidden_dim=16, action_low=-2.0, action_high=2.0)
        >>> with set_exploration_type(ExplorationType.RANDOM):
        ...     td = sac(TensorDict({"observation": torch.randn(4, 5)}, batch_size=[4]))
        >>> sorted(td.keys())
        ['action', 'loc', 'observation', 'scale']
        >>> bool(td["action"].abs().max() <= 2.0)
        True
    """
    _check_algo(algo)
    _check_positive(obs_dim, "obs_dim")
    _check_positive(action_dim, "action_dim")
    sizes = _hidden_sizes(hidden_sizes, hidden_dim, num_layers)
    low, high = _bounds(action_low, action_high, action_dim)
    spec = Bounded(low=low, high=high, shape=(action_dim,))
    keys = [in_key] if in_keys is None else list(in_keys)
    if not keys:
        raise ValueError(f"in_keys must name at least one key, got {in_keys!r}")

    if algo == "sac":
        net = MultiInputSequential(
            _mlp(obs_dim, 2 * action_dim, sizes, use_layer_norm, activation),
            NormalParamExtractor(scale_mapping="biased_softplus_1.0"),
        )
        param_module = TensorDictModule(net, in_keys=keys, out_keys=["loc", "scale"])
        return ProbabilisticActor(
            module=param_module,
            in_keys=["loc", "scale"],
            out_keys=["action"],
            spec=spec,
            distribution_class=TanhNormal,
            distribution_kwargs={"low": low, "high": high, "tanh_loc": False},
            return_log_prob=False,
            default_interaction_type=ExplorationType.RANDOM,
        )

    net = MultiInputSequential(
        _mlp(obs_dim, action_dim, sizes, use_layer_norm, activation),
        nn.Tanh(),
        _AffineRescale(low, high),
    )
    return Actor(net, in_keys=keys, out_keys=["action"], spec=spec)


class PassThroughActor(TensorDictSequential):
    """An actor that also hands ``keys`` on unchanged, for a loss whose critic reads keys the actor does not.

    TorchRL's ``TD3Loss`` runs the critic on what it kept of the actor's input
    (``tensordict.select(*actor_network.in_keys)``), so an asymmetric critic's
    ``"privileged"`` must be among the actor's ``in_keys`` to reach it. This
    wrapper declares them without feeding them to the actor: ``self[0]`` is the
    actor itself, with its parameters (the loss trains those), and the workers
    keep running the bare actor.

    Args:
        actor: the actor module, writing ``"action"``.
        keys: the critic's other inputs, e.g. ``["privileged"]``.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> actor = make_actor("td3", obs_dim=3, action_dim=1, hidden_dim=8)
        >>> wrapped = PassThroughActor(actor, ["privileged"])
        >>> wrapped.in_keys, wrapped[0] is actor
        (['observation', 'privileged'], True)
        >>> td = wrapped(TensorDict({"observation": torch.zeros(2, 3), "privileged": torch.ones(2, 5)}, [2]))
        >>> td["action"].shape, td["privileged"].shape
        (torch.Size([2, 1]), torch.Size([2, 5]))
    """

    def __init__(self, actor: TensorDictModuleBase, keys: Sequence[NestedKey]) -> None:
        keys = [k for k in keys if k not in actor.in_keys]
        super().__init__(actor, *[TensorDictModule(nn.Identity(), in_keys=[k], out_keys=[k]) for k in keys])


def make_critic(
    obs_dim: int,
    action_dim: int,
    *,
    hidden_dim: int = 256,
    num_layers: int = 2,
    hidden_sizes: Sequence[int] | None = None,
    use_layer_norm: bool = False,
    in_keys: Sequence[NestedKey] = ("observation", "action"),
    activation: type[nn.Module] = nn.ReLU,
    batch_renorm: Mapping[str, Any] | None = None,
) -> ValueOperator:
    """Builds a Q-network ``Q(s, a)`` writing ``"state_action_value"``.

    The values under ``in_keys`` are concatenated on their last dimension and fed
    to an MLP with a single output, as :class:`~torchrl.objectives.SACLoss` and
    :class:`~torchrl.objectives.TD3Loss` expect from their ``qvalue_network``.

    Args:
        obs_dim: total width of every input except the action (for example
            observation plus privileged information for an asymmetric critic).
        action_dim: number of action dimensions.

    Keyword Args:
        hidden_dim, num_layers, hidden_sizes, use_layer_norm, activation: the
            hidden layers, as for :func:`make_actor`.
        in_keys: the keys read and concatenated, in that order.
        batch_renorm: TorchRL's ``BatchRenorm1d`` after each hidden ``Linear``, with these keyword arguments
            (``momentum``, ``warmup_steps``, ...), as CrossQ's critic (:class:`~torchrl.objectives.CrossQLoss`);
            it replaces ``use_layer_norm``.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl_unilab.modules.models import make_critic
        >>> critic = make_critic(obs_dim=5, action_dim=2, hidden_dim=16)
        >>> td = TensorDict(
        ...     {"observation": torch.randn(4, 5), "action": torch.rand(4, 2)}, batch_size=[4]
        ... )
        >>> critic(td)["state_action_value"].shape
        torch.Size([4, 1])
        >>> critic = make_critic(5, 2, hidden_sizes=[32, 16])
        >>> [m.out_features for m in critic.modules() if isinstance(m, torch.nn.Linear)]
        [32, 16, 1]
        >>> critic = make_critic(5, 2, hidden_sizes=[32], batch_renorm={"momentum": 0.01, "warmup_steps": 100})
        >>> type(critic.module[1]).__name__
        'BatchRenorm1d'
    """
    _check_positive(obs_dim, "obs_dim")
    _check_positive(action_dim, "action_dim")
    sizes = _hidden_sizes(hidden_sizes, hidden_dim, num_layers)
    in_keys = list(in_keys)
    if not in_keys:
        raise ValueError(f"in_keys must name at least one key, got {in_keys!r}")
    net = _mlp(obs_dim + action_dim, 1, sizes, use_layer_norm, activation, batch_renorm)
    return ValueOperator(module=net, in_keys=in_keys, out_keys=["state_action_value"])
