"""Privileged information for asymmetric actor-critic training.

:class:`PrivilegedInfoTransform` writes state the actor does not observe (the
simulator's ``qpos``/``qvel``, entries of gymnasium's ``info`` dict, or a
custom env's critic observation) into the TensorDict under its own key, with a
spec, so the collector's replay buffer stores it and the critic can read it.

The helpers :func:`resolve_offpolicy_actor_priv_info` and
:func:`resolve_collector_actor_dims` are the function-level API of the
original design.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from tensordict import NestedKey, TensorDictBase
from torchrl.data import Composite, Unbounded
from torchrl.envs import EnvBase, Transform

from torchrl_unilab.modules.models import ALGOS, PRIVILEGED_ALGOS

__all__ = [
    "PrivilegedInfoTransform",
    "as_privileged_transform",
    "resolve_collector_actor_dims",
    "resolve_offpolicy_actor_priv_info",
]

MujocoFn = Callable[[Any, Any], np.ndarray]



class PrivilegedInfoTransform(Transform):
    """Writes privileged state under ``out_key`` (``"privileged"``), with its spec.

    Sources are concatenated, in this order, into one float32 vector per env:

    1. ``info_keys``: entries of each env's gymnasium ``info`` dict;
    2. ``mujoco``: fields of the MuJoCo ``data`` struct, e.g. ``("qpos", "qvel")``;
    3. ``mujoco_fn``: a function ``f(model, data) -> array`` of your own;
    4. ``critic_key``: an entry the (custom) env itself writes, e.g. a critic observation.

    Sources 1-3 read the simulator of a :class:`~torchrl_unilab.BatchedGymEnv`
    (the transform's base env); source 4 works with any TorchRL env. The values
    of ``("next", out_key)`` are read right after the step, before any reset,
    so at an episode end they describe the true final state. The actor never
    reads ``out_key`` unless its ``in_keys`` name it.

    Keyword Args:
        info_keys: keys of gymnasium's ``info`` dict; a key missing from an
            ``info`` (e.g. after a reset) reads as zeros.
        mujoco: names of ``mujoco.MjData`` array fields.
        mujoco_fn: ``f(model, data)`` returning a flat array; its size is probed once.
        critic_key: a key of the env's observation spec to include.
        out_key: where to write the vector. Default ``"privileged"``.

    Examples:
        >>> from torchrl.envs import TransformedEnv
        >>> from torchrl_unilab import BatchedGymEnv
        >>> env = TransformedEnv(BatchedGymEnv("Hopper-v5", 2, seed=0),
        ...                      PrivilegedInfoTransform(mujoco=("qpos", "qvel"), info_keys=("x_velocity",)))
        >>> env.observation_spec["privileged"].shape  # 6 qpos + 6 qvel + 1 info entry
        torch.Size([2, 13])
        >>> td = env.rand_step(env.reset())
        >>> td["next", "privileged"].shape
        torch.Size([2, 13])
    """

    def __init__(
        self,
        *,
        info_keys: Sequence[str] = (),
        mujoco: Sequence[str] = (),
        mujoco_fn: MujocoFn | None = None,
        critic_key: NestedKey | None = None,
        out_key: NestedKey = "privileged",
    ) -> None:
        if not (info_keys or mujoco or mujoco_fn or critic_key):
            raise ValueError(
                "PrivilegedInfoTransform needs at least one source: info_keys=, mujoco=, mujoco_fn= or critic_key="
            )
        in_keys = [critic_key] if critic_key is not None else []
        super().__init__(in_keys=in_keys, out_keys=[out_key])
        self.info_keys = tuple(info_keys)
        self.mujoco = tuple(mujoco)
        self.mujoco_fn = mujoco_fn
        self.critic_key = critic_key
        self.out_key = out_key
        self._sizes: dict[str, int] | None = None

    # -------------------------------------------------------------- simulator
    def _sim_env(self):
        base = self.parent.base_env if self.parent is not None else None
        if base is None or not hasattr(base, "unwrapped_envs"):
            raise TypeError(
                "PrivilegedInfoTransform's info_keys=, mujoco= and mujoco_fn= sources need a "
                f"torchrl_unilab.BatchedGymEnv as base env, got {type(base).__name__}; use critic_key= for other envs"
            )
        return base

    def _probe_sizes(self) -> dict[str, int]:
        if self._sizes is not None:
            return self._sizes
        sizes: dict[str, int] = {}
        if self.info_keys or self.mujoco or self.mujoco_fn:
            base = self._sim_env()
            # A separate env, so probing never disturbs the envs being stepped.
            probe = gym.make(base.env_id, **base.env_kwargs)
            probe.reset(seed=0)
            _, _, _, _, info = probe.step(np.zeros(probe.action_space.shape, dtype=probe.action_space.dtype))
            for key in self.info_keys:
                if key not in info:
                    raise ValueError(f"info_keys entry {key!r} is not in {base.env_id}'s info dict; "
                                     f"accepted keys: {sorted(info)}")
                sizes[f"info:{key}"] = int(np.asarray(info[key]).size)
            data = probe.unwrapped.data
            for field in self.mujoco:
                if not hasattr(data, field):
                    raise ValueError(f"mujoco entry {field!r} is not a field of mujoco.MjData (e.g. 'qpos', 'qvel')")
                sizes[f"mujoco:{field}"] = int(np.asarray(getattr(data, field)).size)
            if self.mujoco_fn is not None:
                sizes["mujoco_fn"] = int(np.asarray(self.mujoco_fn(probe.unwrapped.model, data)).size)
            probe.close()
        if self.critic_key is not None:
            spec = self.parent.base_env.full_observation_spec if self.parent is not None else None
            if spec is None or self.critic_key not in spec.keys(True):
                raise ValueError(f"critic_key {self.critic_key!r} is not in the env's observation spec")
            sizes["critic"] = int(spec[self.critic_key].shape[-1])
        self._sizes = sizes
        return sizes

    @property
    def dim(self) -> int:
        """Length of the privileged vector."""
        return sum(self._probe_sizes().values())

    def _gather(self, td: TensorDictBase, infos: list[dict] | None) -> torch.Tensor:
        sizes = self._probe_sizes()
        parts: list[np.ndarray] = []
        if self.info_keys or self.mujoco or self.mujoco_fn:
            base = self._sim_env()
            infos = base.last_infos if infos is None else infos
            for i, env in enumerate(base.unwrapped_envs):
                row = [
                    np.asarray(infos[i].get(key, np.zeros(sizes[f"info:{key}"])), dtype=np.float32).reshape(-1)
                    for key in self.info_keys
                ]
                row += [np.asarray(getattr(env.data, f), dtype=np.float32).reshape(-1) for f in self.mujoco]
                if self.mujoco_fn is not None:
                    row.append(np.asarray(self.mujoco_fn(env.model, env.data), dtype=np.float32).reshape(-1))
                parts.append(np.concatenate(row) if row else np.zeros(0, np.float32))
        out = torch.as_tensor(np.stack(parts)) if parts else None
        if self.critic_key is not None:
            critic = td.get(self.critic_key).to(torch.float32)
            out = critic if out is None else torch.cat([out, critic.reshape(out.shape[0], -1)], -1)
        return out

    # ------------------------------------------------------------- transform
    def _step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
        next_tensordict.set(self.out_key, self._gather(next_tensordict, None))
        return next_tensordict

    def _reset(self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase) -> TensorDictBase:
        # After a (partial) reset the simulator holds each env's current state;
        # reset envs have no step info yet, so their info entries read as zeros.
        infos = None
        if self.info_keys:
            base = self._sim_env()
            infos = [dict(info) if base.step_counts[i] else {} for i, info in enumerate(base.last_infos)]
        tensordict_reset.set(self.out_key, self._gather(tensordict_reset, infos))
        return tensordict_reset

    def _call(self, next_tensordict: TensorDictBase) -> TensorDictBase:
        return next_tensordict

    def transform_observation_spec(self, observation_spec: Composite) -> Composite:
        """Declares ``out_key`` so the collector's storage layout includes it."""
        batch = observation_spec.shape
        observation_spec[self.out_key] = Unbounded(
            shape=(*batch, self.dim), dtype=torch.float32, device=observation_spec.device
        )
        return observation_spec


def as_privileged_transform(
    value: PrivilegedInfoTransform | Mapping[str, Any] | None,
) -> PrivilegedInfoTransform | None:
    """The ``privileged=`` argument of the collector and the function-level API, as a transform (or ``None``).

    Examples:
        >>> type(as_privileged_transform({"mujoco": ["qvel"]})).__name__
        'PrivilegedInfoTransform'
        >>> as_privileged_transform(3)
        Traceback (most recent call last):
        ...
        TypeError: privileged must be a PrivilegedInfoTransform or a dict of its keyword arguments, got int
    """
    if isinstance(value, Mapping):
        value = PrivilegedInfoTransform(**value)
    if value is not None and not isinstance(value, PrivilegedInfoTransform):
        raise TypeError("privileged must be a PrivilegedInfoTransform or a dict of its keyword arguments, "
                        f"got {type(value).__name__}")
    return value


def resolve_offpolicy_actor_priv_info(
    *,
    algo_type: str,
    obs_np: np.ndarray,
    critic_np: np.ndarray | None,
    info: dict | None,
) -> np.ndarray | None:
    """Resolves the collector-side privileged context an actor consumes, if any.

    Actors of ``algo_type`` ``"sac"`` and ``"td3"`` read observations only, so
    the answer is ``None`` whatever else is available: privileged state is then
    for the critic alone and travels through :class:`PrivilegedInfoTransform`.
    Actors of ``"sac_priv"`` / ``"td3_priv"`` consume a context, taken by this
    precedence:

    1. ``critic_np``, the env's separate critic observation, when given;
    2. ``info["privileged"]``, when the env reports it in its info dict;
    3. otherwise a ``ValueError`` saying what is missing.

    The context must have one row per env (``obs_np.shape[0]``).

    Examples:
        >>> import numpy as np
        >>> obs = np.zeros((2, 3))
        >>> critic = np.ones((2, 5))
        >>> resolve_offpolicy_actor_priv_info(algo_type="sac", obs_np=obs, critic_np=critic, info={}) is None
        True
        >>> resolve_offpolicy_actor_priv_info(algo_type="td3_priv", obs_np=obs, critic_np=critic, info={}).shape
        (2, 5)
    """
    accepted = ALGOS + PRIVILEGED_ALGOS
    if algo_type not in accepted:
        raise ValueError(f"algo_type must be one of {accepted}, got {algo_type!r}")
    if algo_type in ALGOS:
        return None
    if critic_np is not None:
        context = np.asarray(critic_np)
    elif info is not None and info.get("privileged") is not None:
        context = np.asarray(info["privileged"])
    else:
        raise ValueError(
            f"algo_type={algo_type!r} needs privileged context for its actor, but critic_np is None and "
            "info has no 'privileged' entry; add a PrivilegedInfoTransform or pass the critic observation"
        )
    n = np.asarray(obs_np).shape[0]
    if context.ndim == 1:
        context = context.reshape(n, -1) if context.size % n == 0 else context
    if context.shape[0] != n:
        raise ValueError(f"privileged context has {context.shape[0]} rows, expected one per env ({n})")
    return context.astype(np.float32, copy=False)


def resolve_collector_actor_dims(
    env: EnvBase | gym.Env | None,
    obs_dim: int | None = None,
    action_dim: int | None = None,
) -> tuple[int, int]:
    """Returns ``(obs_dim, action_dim)`` for the collector's actor.

    Explicit dims win, so that learner and collector build identical actors even
    where env overrides make the env's own spaces awkward to read; when the env
    can be read too, explicit dims that contradict it raise ``ValueError``.

    Args:
        env: a TorchRL env (``"observation"`` / action specs), a gymnasium env,
            or ``None`` when both dims are given.
        obs_dim: explicit observation size.
        action_dim: explicit action size.

    Examples:
        >>> from torchrl_unilab import BatchedGymEnv
        >>> resolve_collector_actor_dims(BatchedGymEnv("Pendulum-v1", 2))
        (3, 1)
        >>> resolve_collector_actor_dims(None, obs_dim=3, action_dim=1)
        (3, 1)
    """
    env_dims: tuple[int | None, int | None] = (None, None)
    if isinstance(env, EnvBase):
        env_dims = (int(env.observation_spec["observation"].shape[-1]), int(env.action_spec.shape[-1]))
    elif isinstance(env, gym.Env):
        env_dims = (int(np.prod(env.observation_space.shape)), int(np.prod(env.action_space.shape)))
    elif env is not None:
        raise TypeError(f"env must be a TorchRL EnvBase, a gymnasium Env or None, got {type(env).__name__}")
    dims = []
    for name, explicit, found in (("obs_dim", obs_dim, env_dims[0]), ("action_dim", action_dim, env_dims[1])):
        if explicit is not None:
            if isinstance(explicit, bool) or not isinstance(explicit, int) or explicit < 1:
                raise ValueError(f"{name} must be an int >= 1 or None, got {explicit!r}")
            if found is not None and found != explicit:
                raise ValueError(f"{name}={explicit} contradicts the env, whose {name} is {found}")
            dims.append(explicit)
        elif found is not None:
            dims.append(found)
        else:
            raise ValueError(f"{name} is needed when env is None")
    return dims[0], dims[1]
