"""Exploration modules for off-policy collection, following TorchRL's conventions.

Each module is a :class:`~tensordict.nn.TensorDictModuleBase` placed after the
actor in a :class:`~tensordict.nn.TensorDictSequential`. It acts only under
``ExplorationType.RANDOM`` (or when no exploration type is set, as TorchRL's own
exploration modules do); under ``DETERMINISTIC`` the actor's deterministic action
passes through unchanged.

* TD3: :class:`PerEnvMixedNoise` adds Gaussian noise whose std is drawn per
  environment at the start of each episode (FastTD3's mixed noise), or a constant
  std (:meth:`PerEnvMixedNoise.constant`, classic TD3).
* SAC: the actor itself samples its TanhNormal; :class:`ActionProjection` only
  clamps the result onto the action bounds.

:func:`make_exploration_policy` assembles either; :func:`make_collector_policy`
adds the observation normaliser, and is the one builder of what the workers run
(the collector, the function API and the recipes call it).
:func:`sample_offpolicy_actions` is the tensor-in, tensor-out entry point of
the original design.
"""

from __future__ import annotations

import warnings
import weakref
from typing import Any

import torch
from tensordict import NestedKey, TensorDict, TensorDictBase
from tensordict.nn import (
    ProbabilisticTensorDictModule,
    TensorDictModuleBase,
    TensorDictSequential,
)
from torch import Tensor, nn
from torchrl.data import Bounded, Composite, TensorSpec
from torchrl.envs.utils import ExplorationType, exploration_type, set_exploration_type

from torchrl_unilab.modules.models import ALGOS, actor_algo
from torchrl_unilab.modules.normalization import ObservationNormalizer

__all__ = [
    "TD3_NOISES",
    "ActionProjection",
    "PerEnvMixedNoise",
    "make_collector_policy",
    "make_exploration_policy",
    "sample_offpolicy_actions",
]

TD3_NOISES: tuple[str, ...] = ("mixed", "constant")
"""The accepted values of ``td3_noise`` in :func:`make_exploration_policy`."""


def _exploring() -> bool:
    # ``None`` means no context was set; TorchRL's exploration modules explore
    # then too, so a bare call in a training loop behaves the same here.
    mode = exploration_type()
    return mode is None or mode == ExplorationType.RANDOM


def _as_composite(spec: TensorSpec, action_key: NestedKey) -> Composite:
    if not isinstance(spec, Composite):
        spec = Composite({action_key: spec}, shape=spec.shape[:-1])
    try:
        leaf = spec[action_key]
    except KeyError as err:
        raise KeyError(
            f"spec has no entry {action_key!r} (action_key); its keys are "
            f"{list(spec.keys(True, True))}"
        ) from err
    if not isinstance(leaf, Bounded):
        raise TypeError(
            f"spec[{action_key!r}] must be a torchrl.data.Bounded (continuous, "
            f"bounded) spec, got {type(leaf).__name__}"
        )
    return spec


class _BoundedActionModule(TensorDictModuleBase):
    """Holds a bounded action spec and clamps actions onto it."""

    def __init__(self, spec: TensorSpec, action_key: NestedKey) -> None:
        super().__init__()
        self.action_key = action_key
        self.in_keys = [action_key]
        self.out_keys = [action_key]
        self._spec = _as_composite(spec, action_key)

    @property
    def spec(self) -> Composite:
        """The action spec, as a :class:`~torchrl.data.Composite`."""
        return self._spec

    @spec.setter
    def spec(self, value: TensorSpec) -> None:
        self._spec = _as_composite(value, self.action_key)

    def _bounds(self, like: Tensor) -> tuple[Tensor, Tensor]:
        space = self._spec[self.action_key].space
        return (
            space.low.to(device=like.device, dtype=like.dtype),
            space.high.to(device=like.device, dtype=like.dtype),
        )

    def _project(self, action: Tensor) -> Tensor:
        low, high = self._bounds(action)
        return torch.clamp(action, low, high)


class ActionProjection(_BoundedActionModule):
    """Clamps the action onto the bounds of its spec, under every exploration type.

    Used after the SAC actor: a TanhNormal sample can land exactly on a bound, or
    a float rounding past it once rescaled to ``[low, high]``, and environments
    may reject such actions. Actions already in bounds pass through bit-exact.

    Args:
        spec: a :class:`~torchrl.data.Bounded` action spec, or a
            :class:`~torchrl.data.Composite` holding one under ``action_key``.

    Keyword Args:
        action_key: the key of the action to project.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import Bounded
        >>> from torchrl_unilab.modules.exploration import ActionProjection
        >>> proj = ActionProjection(Bounded(-1.0, 1.0, shape=(2,)))
        >>> td = TensorDict({"action": torch.tensor([[1.5, -0.2]])}, batch_size=[1])
        >>> proj(td)["action"]
        tensor([[ 1.0000, -0.2000]])
    """

    def __init__(self, spec: TensorSpec, *, action_key: NestedKey = "action") -> None:
        super().__init__(spec, action_key)

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        tensordict.set(self.action_key, self._project(tensordict.get(self.action_key)))
        return tensordict


class PerEnvMixedNoise(_BoundedActionModule):
    """Additive Gaussian noise with one std per environment, redrawn per episode.

    FastTD3's "mixed" exploration noise: each environment (each row of the batch)
    gets its own std, drawn uniformly in ``[std_min, std_max]``, so one batch of
    environments explores at many noise levels at once. An environment's std is
    redrawn only when it starts a new episode, that is on the rows where
    ``tensordict[is_init_key]`` (TorchRL's :class:`~torchrl.envs.InitTracker`
    flag, shape ``[*batch, 1]``) is ``True``; the other rows keep theirs, so the
    std is constant within an episode.

    The std is a fraction of the action half-range: per action dimension
    ``d`` the noise is ``std_env * (high[d] - low[d]) / 2 * N(0, 1)``, so
    ``std_max=0.4`` means 40% of the half-range whatever the action bounds are.
    With ``safe=True`` the noisy action is clamped onto ``[low, high]``.

    The per-env stds live in a non-persistent buffer (``register_buffer(...,
    persistent=False)``): they move with ``.to(device)`` but are absent from
    :meth:`state_dict`, so a weight sync that loads the learner's ``state_dict``
    into a worker's policy leaves the worker's stds untouched. (They are present in
    ``TensorDict.from_module``, which lists every buffer; a weight sync must copy
    ``state_dict`` rather than ``from_module(...).to_module(...)``.) The buffer
    is (re)allocated, with fresh stds for every row, whenever the batch shape,
    device or dtype of the action changes.

    Only ``ExplorationType.RANDOM`` (or no exploration type set) adds noise and
    updates the stds; ``DETERMINISTIC`` returns the actor's action unchanged.

    Args:
        spec: a :class:`~torchrl.data.Bounded` action spec, or a
            :class:`~torchrl.data.Composite` holding one under ``action_key``.
        std_min: lowest per-env std, as a fraction of the half-range (>= 0).
        std_max: highest per-env std, as a fraction of the half-range
            (>= ``std_min``).

    Keyword Args:
        action_key: the key of the action to perturb.
        is_init_key: the key of the episode-start flag.
        done_key: if given, read the previous step's done flag from this key
            instead of ``is_init_key`` (both mean "this row starts an episode").
        generator: the RNG for the std draws and the noise; ``None`` uses the
            global torch RNG.
        safe: clamp the noisy action onto the spec bounds.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import Bounded
        >>> from torchrl_unilab.modules.exploration import PerEnvMixedNoise
        >>> noise = PerEnvMixedNoise(Bounded(-1.0, 1.0, shape=(2,)), std_min=0.1, std_max=0.3)
        >>> td = TensorDict(
        ...     {"action": torch.zeros(3, 2), "is_init": torch.ones(3, 1, dtype=torch.bool)},
        ...     batch_size=[3],
        ... )
        >>> td = noise(td)
        >>> first = noise.stds
        >>> first.shape
        torch.Size([3, 1])
        >>> bool(((first >= 0.1) & (first <= 0.3)).all())
        True
        >>> td["is_init"] = torch.tensor([[True], [False], [False]])
        >>> td = noise(td)
        >>> torch.equal(noise.stds[1:], first[1:])  # rows 1 and 2 keep their std
        True
        >>> "_stds" in noise.state_dict()
        False
    """

    def __init__(
        self,
        spec: TensorSpec,
        std_min: float = 0.001,
        std_max: float = 0.4,
        *,
        action_key: NestedKey = "action",
        is_init_key: NestedKey = "is_init",
        done_key: NestedKey | None = None,
        generator: torch.Generator | None = None,
        safe: bool = True,
    ) -> None:
        super().__init__(spec, action_key)
        for name, value in (("std_min", std_min), ("std_max", std_max)):
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{name} must be a number >= 0, got {value!r}")
        if std_min > std_max:
            raise ValueError(
                f"std_min must be <= std_max, got std_min={std_min} and std_max={std_max}"
            )
        self.std_min = float(std_min)
        self.std_max = float(std_max)
        self.is_init_key = is_init_key
        self.done_key = done_key
        self.generator = generator
        self.safe = safe
        self._warned_missing_flag = False
        self.register_buffer("_stds", torch.empty(0, 1), persistent=False)

    @classmethod
    def constant(cls, spec: TensorSpec, std: float = 0.1, **kwargs) -> PerEnvMixedNoise:
        """Classic TD3 noise: the same std for every env, a fraction of the half-range.

        This is ``PerEnvMixedNoise(spec, std_min=std, std_max=std, **kwargs)``: the
        same code path with a degenerate range, so no episode-start flag is needed.

        Examples:
            >>> from torchrl.data import Bounded
            >>> from torchrl_unilab.modules.exploration import PerEnvMixedNoise
            >>> noise = PerEnvMixedNoise.constant(Bounded(-2.0, 2.0, shape=(3,)), std=0.1)
            >>> noise.std_min, noise.std_max
            (0.1, 0.1)
        """
        return cls(spec, std_min=std, std_max=std, **kwargs)

    @property
    def stds(self) -> Tensor:
        """A copy of the current per-env stds, shape ``[*batch, 1]``.

        Fractions of the action half-range; empty (shape ``[0, 1]``) before the
        first exploring call.
        """
        return self._stds.clone()

    def _flag_key(self) -> NestedKey:
        return self.done_key if self.done_key is not None else self.is_init_key

    def _new_episode_mask(self, tensordict: TensorDictBase, batch: torch.Size) -> Tensor | None:
        key = self._flag_key()
        flag = tensordict.get(key, None)
        if flag is None:
            if self.std_min != self.std_max and not self._warned_missing_flag:
                self._warned_missing_flag = True
                warnings.warn(
                    f"PerEnvMixedNoise found no {key!r} entry in the TensorDict, so "
                    f"per-env stds are never redrawn. Add torchrl.envs.InitTracker() "
                    f"to the env, or pass done_key=<key of the previous done flag>.",
                    stacklevel=3,
                )
            return None
        if flag.numel() != batch.numel():
            raise ValueError(
                f"tensordict[{key!r}] must have one flag per env, shape "
                f"{tuple(batch) + (1,)} or {tuple(batch)}, got {tuple(flag.shape)}"
            )
        return flag.reshape(*batch, 1).to(torch.bool)

    def _draw(self, shape: tuple[int, ...], like: Tensor, uniform: bool) -> Tensor:
        gen = self.generator
        device = gen.device if gen is not None else like.device
        sampler = torch.rand if uniform else torch.randn
        return sampler(shape, generator=gen, device=device, dtype=like.dtype).to(like.device)

    def _update_stds(self, tensordict: TensorDictBase, action: Tensor) -> Tensor:
        batch = action.shape[:-1]
        shape = (*batch, 1)
        new = self.std_min + (self.std_max - self.std_min) * self._draw(shape, action, True)
        stds = self._stds
        if stds.shape != shape or stds.device != action.device or stds.dtype != action.dtype:
            # A new batch layout means new envs: every row starts fresh.
            stds = new
        else:
            mask = self._new_episode_mask(tensordict, batch)
            if mask is not None:
                stds = torch.where(mask.to(action.device), new, stds)
        self._stds = stds
        return stds

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        if not _exploring():
            return tensordict
        action = tensordict.get(self.action_key)
        stds = self._update_stds(tensordict, action)
        low, high = self._bounds(action)
        noise = self._draw(tuple(action.shape), action, False)
        action = action + noise * stds * ((high - low) / 2)
        if self.safe:
            action = torch.clamp(action, low, high)
        tensordict.set(self.action_key, action)
        return tensordict


def _check_choice(value: str, name: str, accepted: tuple[str, ...]) -> None:
    if value not in accepted:
        raise ValueError(f"{name} must be one of {accepted}, got {value!r}")


# Policies already checked by ``_check_policy_explores``: the check walks the
# module tree, and ``sample_offpolicy_actions`` runs once per env step.
_CHECKED: weakref.WeakKeyDictionary[nn.Module, str] = weakref.WeakKeyDictionary()


def _check_policy_explores(policy: nn.Module, algo: str, name: str) -> None:
    if _CHECKED.get(policy) == algo:
        return
    if algo == "sac":
        ok = any(isinstance(m, ProbabilisticTensorDictModule) for m in policy.modules())
        why = (
            f"{name} must sample its actions for 'sac' (a ProbabilisticActor from "
            f"make_actor('sac', ...)), got {type(policy).__name__} with no "
            f"ProbabilisticTensorDictModule inside"
        )
    else:
        ok = any(isinstance(m, PerEnvMixedNoise) for m in policy.modules())
        why = (
            f"{name} must add exploration noise for 'td3': pass "
            f"make_exploration_policy(actor, 'td3', spec), got "
            f"{type(policy).__name__} with no PerEnvMixedNoise inside"
        )
    if not ok:
        raise ValueError(why)
    _CHECKED[policy] = algo


def make_exploration_policy(
    actor: TensorDictModuleBase,
    algo: str,
    action_spec: TensorSpec,
    *,
    td3_noise: str = "mixed",
    td3_std_min: float = 0.001,
    td3_std_max: float = 0.4,
    td3_std: float = 0.1,
    generator: torch.Generator | None = None,
) -> TensorDictSequential:
    """Wraps an actor from :func:`~torchrl_unilab.modules.models.make_actor` for collection.

    * ``"sac"``: ``TensorDictSequential(actor, ActionProjection(action_spec))``;
      the actor's TanhNormal sample is the exploration (drawn from the global
      torch RNG, ``generator`` does not apply).
    * ``"td3"``: ``TensorDictSequential(actor, noise)`` with ``noise`` a
      :class:`PerEnvMixedNoise` in ``[td3_std_min, td3_std_max]``
      (``td3_noise="mixed"``) or :meth:`PerEnvMixedNoise.constant` with
      ``td3_std`` (``td3_noise="constant"``). Stds are fractions of the action
      half-range.

    The returned policy's ``state_dict`` holds the actor's weights under
    ``"module.0."`` and nothing from the exploration module, so the learner can
    publish ``policy.state_dict()`` to the workers' copies.

    Args:
        actor: the policy network; for ``"sac"`` it must sample (a
            ProbabilisticActor).
        algo: ``"sac"`` or ``"td3"``.
        action_spec: the :class:`~torchrl.data.Bounded` action spec (or a
            Composite holding it under ``"action"``).

    Keyword Args:
        td3_noise: ``"mixed"`` or ``"constant"`` (see :data:`TD3_NOISES`).
        td3_std_min: lowest per-env std for ``"mixed"``.
        td3_std_max: highest per-env std for ``"mixed"``.
        td3_std: the std for ``"constant"``.
        generator: RNG of the TD3 noise; ``None`` uses the global torch RNG.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.envs.utils import ExplorationType, set_exploration_type
        >>> from torchrl_unilab.modules.exploration import make_exploration_policy
        >>> from torchrl_unilab.modules.models import make_actor
        >>> actor = make_actor("td3", obs_dim=4, action_dim=2, hidden_dim=16)
        >>> policy = make_exploration_policy(actor, "td3", actor.spec)
        >>> td = TensorDict(
        ...     {"observation": torch.randn(5, 4), "is_init": torch.ones(5, 1, dtype=torch.bool)},
        ...     batch_size=[5],
        ... )
        >>> with set_exploration_type(ExplorationType.RANDOM):
        ...     action = policy(td)["action"]
        >>> action.shape
        torch.Size([5, 2])
        >>> all(key.startswith("module.0.") for key in policy.state_dict())
        True
    """
    _check_choice(algo, "algo", ALGOS)
    _check_choice(td3_noise, "td3_noise", TD3_NOISES)
    if algo == "sac":
        _check_policy_explores(actor, "sac", "actor")
        explore: TensorDictModuleBase = ActionProjection(action_spec)
    elif td3_noise == "mixed":
        explore = PerEnvMixedNoise(
            action_spec, std_min=td3_std_min, std_max=td3_std_max, generator=generator
        )
    else:
        explore = PerEnvMixedNoise.constant(action_spec, std=td3_std, generator=generator)
    return TensorDictSequential(actor, explore)


def make_collector_policy(
    actor: TensorDictModuleBase,
    algo: str | None,
    action_spec: TensorSpec,
    *,
    obs_norm: bool | ObservationNormalizer | None = None,
    obs_dim: int | None = None,
    **exploration: Any,
) -> tuple[TensorDictModuleBase, ObservationNormalizer | None]:
    """What the workers run: ``[normalizer,] actor, exploration``, and the normaliser.

    ``algo`` (``"sac"``, ``"td3"``, or ``None`` for a policy that explores by
    itself) wraps ``actor`` with :func:`make_exploration_policy` and the
    ``exploration`` keyword arguments (``td3_noise``, ``td3_std``, ...).
    ``obs_norm=True`` puts a new :class:`~torchrl_unilab.ObservationNormalizer`
    of width ``obs_dim`` in front, an ``ObservationNormalizer`` puts that one.
    The policy's ``state_dict`` then carries the actor's weights and the
    normalisation statistics, so one weight publish sends both.

    Examples:
        >>> from torchrl_unilab.modules.models import make_actor
        >>> actor = make_actor("sac", obs_dim=3, action_dim=1, hidden_dim=8)
        >>> policy, norm = make_collector_policy(actor, "sac", actor.spec, obs_norm=True, obs_dim=3)
        >>> [type(m).__name__ for m in policy], norm is policy[0]
        (['ObservationNormalizer', 'TensorDictSequential'], True)
        >>> make_collector_policy(actor, None, actor.spec, obs_norm="yes")
        Traceback (most recent call last):
        ...
        TypeError: obs_norm must be True, False, None or an ObservationNormalizer, got 'yes'
    """
    policy = actor if algo is None else make_exploration_policy(actor, algo, action_spec, **exploration)
    if obs_norm is True:
        if obs_dim is None:
            raise ValueError("obs_norm=True needs obs_dim, the width of the observation")
        normalizer = ObservationNormalizer(obs_dim)
    elif isinstance(obs_norm, ObservationNormalizer):
        normalizer = obs_norm
    elif obs_norm in (None, False):
        return policy, None
    else:
        raise TypeError(f"obs_norm must be True, False, None or an ObservationNormalizer, got {obs_norm!r}")
    return TensorDictSequential(normalizer, policy), normalizer


def sample_offpolicy_actions(
    actor: TensorDictModuleBase,
    algo_type: str,
    obs_torch: Tensor,
    prev_dones_torch: Tensor,
    priv_info_torch: Tensor | None = None,
) -> Tensor:
    """Samples one exploring action per env from plain tensors.

    Builds ``TensorDict({"observation": obs, "is_init": prev_dones[:, None]})``
    (plus ``"privileged"`` when given), runs ``actor`` under
    ``ExplorationType.RANDOM`` without gradients and returns ``"action"``. This is
    exactly what calling the policy through the module API does, so both give the
    same actions from the same RNG state.

    ``actor`` must be the exploration policy from :func:`make_exploration_policy`.
    A bare TD3 actor would add no noise and collect without exploring, so it is
    refused (``ValueError``); a bare SAC actor is accepted as it samples on its
    own, but its actions are not projected onto the bounds.

    Args:
        actor: the exploration policy.
        algo_type: ``"sac"`` or ``"td3"``, or ``"sac_priv"`` / ``"td3_priv"``
            (an actor that also reads ``"privileged"``: ``priv_info_torch`` is then required).
        obs_torch: observations, shape ``[num_envs, obs_dim]``.
        prev_dones_torch: whether each env's previous step ended its episode
            (so this step starts a new one), shape ``[num_envs]`` or
            ``[num_envs, 1]``, bool or 0/1.
        priv_info_torch: optional privileged information, written under
            ``"privileged"`` for actors that read it.

    Returns:
        The actions, shape ``[num_envs, action_dim]``.

    Examples:
        >>> import torch
        >>> from torchrl_unilab.modules.exploration import make_exploration_policy, sample_offpolicy_actions
        >>> from torchrl_unilab.modules.models import make_actor
        >>> actor = make_actor("sac", obs_dim=4, action_dim=2, hidden_dim=16)
        >>> policy = make_exploration_policy(actor, "sac", actor.spec)
        >>> obs, dones = torch.randn(3, 4), torch.zeros(3, dtype=torch.bool)
        >>> sample_offpolicy_actions(policy, "sac", obs, dones).shape
        torch.Size([3, 2])
    """
    algo, reads_privileged = actor_algo(algo_type)
    if reads_privileged and priv_info_torch is None:
        raise ValueError(f"algo_type={algo_type!r} needs priv_info_torch: its actor reads the privileged context "
                         "(see resolve_offpolicy_actor_priv_info)")
    _check_policy_explores(actor, algo, "actor")
    num_envs = obs_torch.shape[0]
    if prev_dones_torch.numel() != num_envs:
        raise ValueError(
            f"prev_dones_torch must hold one flag per env ({num_envs}), got shape "
            f"{tuple(prev_dones_torch.shape)}"
        )
    td = TensorDict(
        {
            "observation": obs_torch,
            "is_init": prev_dones_torch.reshape(num_envs, 1).to(torch.bool),
        },
        batch_size=[num_envs],
        device=obs_torch.device,
    )
    if priv_info_torch is not None:
        td.set("privileged", priv_info_torch)
    with torch.no_grad(), set_exploration_type(ExplorationType.RANDOM):
        td = actor(td)
    return td.get("action")
