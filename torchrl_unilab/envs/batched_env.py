"""A lean batched environment over gymnasium MuJoCo tasks.

gymnasium's ``SyncVectorEnv`` and TorchRL's ``GymEnv(num_envs=...)`` each cost
about as much per step as the simulator itself on a small CPU. This env steps
the *unwrapped* gymnasium environments in a plain loop, writes into
preallocated arrays, applies the time limit itself and resets finished envs in
place, so nearly all of the time goes to MuJoCo.
"""

from __future__ import annotations

import difflib
import importlib
import math
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import gymnasium as gym
import mujoco
import numpy as np
import torch
from tensordict import TensorDictBase
from torchrl.data import Bounded, Categorical, Composite, Unbounded
from torchrl.envs import EnvBase

from torchrl_unilab._torchrl_private import WritesEveryDoneKey, unchecked_tensordict

__all__ = ["BatchedGymEnv", "BatchedTaskEnv", "make_gym_env"]

#: Observation dtypes a batched task env can present, with their numpy equivalents.
_OBS_DTYPES = {torch.float32: np.float32, torch.float64: np.float64}


def _mujoco_warning(message: str) -> None:
    warnings.warn(f"MuJoCo: {message}", RuntimeWarning, stacklevel=2)


# MuJoCo prints its warnings (e.g. the deprecated 'settotalmass' of gymnasium's
# XML files) on every model compile and appends them to MUJOCO_LOG.TXT in the
# working directory; as Python warnings they are shown once and can be filtered.
if mujoco.get_mju_user_warning() is None:
    mujoco.set_mju_user_warning(_mujoco_warning)
# gymnasium's half_cheetah.xml (HalfCheetah-v5) sets 'settotalmass', which MuJoCo 4 deprecates at every compile
# (each env, each worker). The model is gymnasium's and compiles to the masses gymnasium intends, so the warning
# names nothing a user of ours can change; only that message is filtered, other MuJoCo warnings still show.
warnings.filterwarnings(
    "ignore", message="MuJoCo: compiler attribute 'settotalmass' is deprecated", category=RuntimeWarning
)


def make_gym_env(env_id: str, **env_kwargs: Any) -> gym.Env:
    """Creates one gymnasium environment, turning an unknown id into a clear error.

    Args:
        env_id: a registered gymnasium id such as ``"HalfCheetah-v5"``, or
            gymnasium's ``"module:Env-vN"`` form, which imports ``module`` (where a
            third-party package registers its envs) first.
        **env_kwargs: keyword arguments for the environment's constructor.

    Examples:
        >>> env = make_gym_env("Pendulum-v1")
        >>> env.observation_space.shape
        (3,)
    """
    if not isinstance(env_id, str):
        raise TypeError(
            f"env must be a gymnasium id (str) or a callable returning an EnvBase, got {type(env_id).__name__}"
        )
    module, _, name = env_id.rpartition(":")
    if module:
        try:
            importlib.import_module(module)
        except ImportError as err:
            raise ValueError(f"gymnasium id {env_id!r}: cannot import module {module!r} ({err})") from err
    if name not in gym.registry:
        close = difflib.get_close_matches(env_id, list(gym.registry), n=3)
        hint = f" Did you mean one of {close}?" if close else " See gymnasium.registry.keys() for the accepted ids."
        raise ValueError(f"unknown gymnasium id {env_id!r}.{hint}")
    return gym.make(name, **env_kwargs)


class BatchedTaskEnv(WritesEveryDoneKey, EnvBase):
    """What every batched MuJoCo-task env of this package shares: specs, time limit, in-place autoreset.

    Subclasses own the simulators and implement two hooks:

    * ``_physics_step(actions)`` steps every env with clipped float32 actions and returns
      ``(next_obs [n, obs_dim], reward [n] float32, terminated [n] bool, truncated [n] bool)``,
      ``next_obs`` of ``obs_dtype`` and ``truncated`` the simulator's own (time limits are applied here);
    * ``_reset_envs(ids)`` resets the envs ``ids`` and returns their observations ``[len(ids), obs_dim]``
      (with ``extra_obs``, the extra keys' columns after them).

    The returned transitions keep TorchRL's conventions (see :class:`BatchedGymEnv`). This class is
    not meant to be built directly.

    ``extra_obs`` declares observation keys beside ``"observation"`` (``{"privileged": 123}``
    for a MuJoCo Playground task's critic state): the hooks then return ``[n, obs_dim + sum of
    extra widths]`` arrays, ``"observation"`` first and the extra keys in order, and each key is
    a view of its columns.

    Two keyword arguments let a subclass present what TorchRL's ``GymEnv`` presents
    (:mod:`torchrl_unilab.envs.torchrl_stack` uses them): ``obs_dtype=torch.float64``
    (gymnasium's MuJoCo observations are float64; the default float32 is what the
    collector stores) and ``truncated_when_terminated=True`` (an episode that
    terminates on the step its time limit is reached also reports ``truncated``, as
    gymnasium's ``TimeLimit`` wrapper does; by default a time-limit end is
    truncated only when the episode did not terminate).

    Examples:
        >>> issubclass(BatchedGymEnv, BatchedTaskEnv)
        True
    """

    def __init__(
        self,
        num_envs: int,
        *,
        obs_dim: int,
        action_low: np.ndarray,
        action_high: np.ndarray,
        max_episode_steps: int | None,
        stagger_resets: bool,
        device: torch.device | str,
        obs_dtype: torch.dtype = torch.float32,
        truncated_when_terminated: bool = False,
        extra_obs: Mapping[str, int] | None = None,
    ) -> None:
        if obs_dtype not in _OBS_DTYPES:
            raise ValueError(f"obs_dtype must be one of {list(_OBS_DTYPES)}, got {obs_dtype!r}")
        super().__init__(batch_size=torch.Size([num_envs]), device=device)
        self.obs_dtype = obs_dtype
        self._obs_np_dtype = _OBS_DTYPES[obs_dtype]
        self._truncated_when_terminated = truncated_when_terminated
        self.num_envs = num_envs
        self.obs_dim = obs_dim
        self.action_dim = int(action_low.size)
        self._action_low = action_low.astype(np.float32).reshape(-1)
        self._action_high = action_high.astype(np.float32).reshape(-1)
        self._action_bounds = (torch.from_numpy(self._action_low), torch.from_numpy(self._action_high))
        self.max_episode_steps = int(max_episode_steps) if max_episode_steps else None
        batch = (num_envs,)
        widths = {"observation": obs_dim, **dict(extra_obs or {})}
        starts = np.cumsum([0, *widths.values()]).tolist()
        #: each observation key's columns of the arrays the hooks return
        self._obs_columns = {key: slice(a, b) for key, a, b in zip(widths, starts, starts[1:])}
        self.observation_spec = Composite(
            {key: Unbounded(shape=(*batch, width), dtype=obs_dtype, device=self.device)
             for key, width in widths.items()},
            shape=batch,
        )
        self.action_spec = Bounded(
            low=torch.as_tensor(self._action_low).expand(*batch, self.action_dim),
            high=torch.as_tensor(self._action_high).expand(*batch, self.action_dim),
            shape=(*batch, self.action_dim),
            dtype=torch.float32,
            device=self.device,
        )
        self.reward_spec = Unbounded(shape=(*batch, 1), dtype=torch.float32, device=self.device)
        self.done_spec = Composite(
            done=Categorical(2, shape=(*batch, 1), dtype=torch.bool, device=self.device),
            terminated=Categorical(2, shape=(*batch, 1), dtype=torch.bool, device=self.device),
            truncated=Categorical(2, shape=(*batch, 1), dtype=torch.bool, device=self.device),
            shape=batch,
        )
        self._steps = np.zeros(num_envs, dtype=np.int64)
        self._full_limit = self.max_episode_steps or np.iinfo(np.int64).max
        self._limits = np.full(num_envs, self._full_limit, dtype=np.int64)
        if stagger_resets and self.max_episode_steps:
            self._limits[:] = [max(1, math.ceil(self.max_episode_steps * (i + 1) / num_envs)) for i in range(num_envs)]
        self._obs = np.zeros((num_envs, starts[-1]), dtype=self._obs_np_dtype)

    @property
    def obs_keys(self) -> tuple[str, ...]:
        """The observation keys, ``"observation"`` first."""
        return tuple(self._obs_columns)

    def _split_obs(self, obs: np.ndarray) -> dict[str, torch.Tensor]:
        """Each observation key's tensor, a view of its columns of ``obs``."""
        if len(self._obs_columns) == 1:
            return {"observation": torch.from_numpy(obs)}
        return {key: torch.from_numpy(obs[:, columns]) for key, columns in self._obs_columns.items()}

    @property
    def step_counts(self) -> np.ndarray:
        """Steps taken in each env's current episode (0 right after a reset)."""
        return self._steps

    # ------------------------------------------------------------------ hooks
    def _physics_step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        raise NotImplementedError

    def _reset_envs(self, ids: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    # --------------------------------------------------------------- stepping
    def _reset(self, tensordict: TensorDictBase | None = None, **kwargs: Any) -> TensorDictBase:
        ids = np.arange(self.num_envs)
        if tensordict is not None and "_reset" in tensordict.keys():
            ids = np.flatnonzero(tensordict.get("_reset").reshape(self.num_envs).cpu().numpy())
        if len(ids):
            self._obs[ids] = self._reset_envs(ids)
            self._steps[ids] = 0
        # Every done key is written (all False after a reset): TorchRL's done completion is skipped.
        not_done = torch.zeros(self.num_envs, 1, dtype=torch.bool)
        return unchecked_tensordict(
            {**self._split_obs(self._obs.copy()), "done": not_done, "terminated": not_done.clone(),
             "truncated": not_done.clone()},
            batch_size=self.batch_size, device=self.device,
        )

    def _clip(self, action: torch.Tensor) -> np.ndarray:
        # torch.clamp costs about half of np.clip on a small batch.
        return torch.clamp(action.detach(), *self._action_bounds).cpu().numpy()

    def _step_all(self, action: torch.Tensor):
        return self._apply_limits(self._physics_step(self._clip(action)), slice(None))

    def _apply_limits(self, physics: tuple, envs: slice):
        """Applies the time limit to the physics outputs of the envs ``envs``: ``(obs, reward, term, trunc)``."""
        next_obs, reward, terminated, sim_truncated = physics
        steps, limits = self._steps[envs], self._limits[envs]  # views: updated in place
        steps += 1
        truncated = sim_truncated | (steps >= limits)
        if not self._truncated_when_terminated:
            truncated &= ~terminated
        ended = terminated | truncated
        if ended.any():
            limits[ended] = self._full_limit  # staggering cuts the first episode only
        return next_obs, reward.reshape(-1, 1), terminated.reshape(-1, 1), truncated.reshape(-1, 1)

    def _next_td(self, next_obs, reward, terminated, truncated) -> dict[str, torch.Tensor]:
        return {
            **self._split_obs(next_obs),
            "reward": torch.from_numpy(reward),
            "terminated": torch.from_numpy(terminated),
            "truncated": torch.from_numpy(truncated),
            "done": torch.from_numpy(terminated | truncated),
        }

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        next_obs, reward, terminated, truncated = self._step_all(tensordict.get("action"))
        self._obs[:] = next_obs
        # Built without per-key validation: every entry has the shape and dtype the specs declare.
        return unchecked_tensordict(self._next_td(next_obs, reward, terminated, truncated),
                                      batch_size=self.batch_size, device=self.device)

    def step_and_maybe_reset(self, tensordict: TensorDictBase) -> tuple[TensorDictBase, TensorDictBase]:
        """Steps every env, then resets the finished ones in place.

        Returns ``(transition, next_root)`` as :meth:`EnvBase.step_and_maybe_reset`
        does, with ``("next", "observation")`` the true final observation of a
        finished episode and ``next_root["observation"]`` its reset observation.
        The transition carries ``"observation"``, ``"action"`` and ``"next"``.
        """
        return self._autoreset(tensordict, self._step_all(tensordict.get("action")), slice(None))

    def _autoreset(
        self, tensordict: TensorDictBase, stepped: tuple, envs: slice
    ) -> tuple[TensorDictBase, TensorDictBase]:
        """Resets the finished envs among ``envs`` in place; ``(transition, next_root)`` over those envs."""
        next_obs, reward, terminated, truncated = stepped
        root_obs = next_obs.copy()
        ended = np.flatnonzero(terminated[:, 0] | truncated[:, 0])
        if len(ended):
            first = envs.start or 0
            root_obs[ended] = self._reset_envs(ended + first)
            self._steps[ended + first] = 0
        self._obs[envs] = root_obs
        batch_size = torch.Size([len(next_obs)])
        # Built without per-key validation: every entry comes from this env's
        # own preallocated arrays, with the batch size the specs declare.
        transition = unchecked_tensordict(
            {
                **{key: tensordict.get(key) for key in self._obs_columns},
                "action": tensordict.get("action"),
                "next": unchecked_tensordict(self._next_td(next_obs, reward, terminated, truncated),
                                               batch_size=batch_size),
            },
            batch_size=batch_size,
        )
        root = unchecked_tensordict(self._split_obs(root_obs), batch_size=batch_size)
        return transition, root


class BatchedGymEnv(BatchedTaskEnv):
    """``num_envs`` gymnasium environments stepped as one TorchRL batch.

    The env keeps TorchRL's conventions (``"observation"``, ``("next", "reward")``,
    ``("next", "terminated")``, ``("next", "truncated")``, ``("next", "done")``,
    partial resets through ``"_reset"``) and adds a fast
    :meth:`step_and_maybe_reset` that resets finished envs in place: the returned
    transition holds the true final observation under ``("next", "observation")``
    and the next root TensorDict holds the reset observation.

    The time limit is applied here (the unwrapped envs carry no ``TimeLimit``),
    and a time-limit end is ``truncated``, never ``terminated``.

    With ``stagger_resets=True`` the first episode of env ``i`` is cut (truncated)
    after ``ceil(max_episode_steps * (i + 1) / num_envs)`` steps, so that the envs
    of a batch do not all reset on the same step afterwards; later episodes run
    to the full limit.

    A step that MuJoCo finds unstable (its ``BADQPOS``/``BADQVEL``/``BADQACC``
    warnings: NaN, infinite or huge values, after which MuJoCo resets the
    simulation itself) gets a NaN reward, so that the collector's ``nonfinite=``
    treats it as any non-finite value: ``"raise"``, ``"drop"`` or ``"reset"``.
    (EnvPool's C++ MuJoCo does not expose these warnings.)

    Args:
        env_id: a gymnasium id, e.g. ``"HalfCheetah-v5"``.
        num_envs: how many environments are stepped together (``>= 1``).

    Keyword Args:
        seed: env ``i`` is seeded with ``seed + i``; ``None`` leaves them unseeded.
        env_kwargs: keyword arguments for ``gymnasium.make``.
        max_episode_steps: time limit; defaults to the id's registered limit.
        stagger_resets: stagger the first episodes (see above). Default ``True``.
        device: TorchRL device, ``"cpu"`` by default.

    Examples:
        >>> env = BatchedGymEnv("Pendulum-v1", num_envs=4, seed=0)
        >>> rollout = env.rollout(3, break_when_any_done=False)  # [envs, steps], as TorchRL's batched envs
        >>> rollout["observation"].shape, rollout["next", "reward"].shape
        (torch.Size([4, 3, 3]), torch.Size([4, 3, 1]))
    """

    def __init__(
        self,
        env_id: str,
        num_envs: int,
        *,
        seed: int | None = None,
        env_kwargs: Mapping[str, Any] | None = None,
        max_episode_steps: int | None = None,
        stagger_resets: bool = True,
        device: torch.device | str = "cpu",
    ) -> None:
        if not isinstance(num_envs, int) or num_envs < 1:
            raise ValueError(f"num_envs must be an int >= 1, got {num_envs!r}")
        self.env_id = env_id
        self.env_kwargs = dict(env_kwargs or {})
        envs = [make_gym_env(env_id, **self.env_kwargs) for _ in range(num_envs)]
        obs_space, act_space = envs[0].observation_space, envs[0].action_space
        for what, space in (("action", act_space), ("observation", obs_space)):
            if not isinstance(space, gym.spaces.Box) or len(space.shape) != 1:
                raise TypeError(
                    f"BatchedGymEnv supports 1-D Box {what} spaces, got {space} for {env_id!r}; wrap the env "
                    f"(e.g. gymnasium.wrappers.FlattenObservation) or pass a callable returning a TorchRL EnvBase"
                )
        super().__init__(
            num_envs,
            obs_dim=int(np.prod(obs_space.shape)),
            action_low=act_space.low,
            action_high=act_space.high,
            max_episode_steps=max_episode_steps or (envs[0].spec.max_episode_steps if envs[0].spec else None),
            stagger_resets=stagger_resets,
            device=device,
        )
        self._envs = [e.unwrapped for e in envs]
        self._wrapped = envs
        # MuJoCo's warning counters, a view per env (None for envs without MuJoCo data).
        self._mj_warnings = [_warning_counts(e) for e in self._envs]
        self._seed = seed
        self._needs_seed = seed is not None
        self._last_infos: list[dict] = [{} for _ in range(num_envs)]

    @property
    def unwrapped_envs(self) -> list[gym.Env]:
        """The unwrapped gymnasium environments, e.g. to read ``env.data.qpos``."""
        return self._envs

    @property
    def last_infos(self) -> list[dict]:
        """The ``info`` dict each env returned on its latest step (before any reset)."""
        return self._last_infos

    # --------------------------------------------------------------- stepping
    def _reset_envs(self, ids: np.ndarray) -> np.ndarray:
        obs = np.empty((len(ids), self.obs_dim), dtype=np.float32)
        for k, i in enumerate(ids.tolist()):
            seed = self._seed + i if self._needs_seed else None
            obs[k], _ = self._envs[i].reset(seed=seed)
            self._last_infos[i] = {}
        self._needs_seed = False
        return obs

    def _physics_step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        n = self.num_envs
        next_obs = np.empty((n, self.obs_dim), dtype=np.float32)
        reward = np.empty(n, dtype=np.float32)
        terminated = np.empty(n, dtype=bool)
        truncated = np.empty(n, dtype=bool)
        infos, mj_warnings = self._last_infos, self._mj_warnings
        for i, env in enumerate(self._envs):
            next_obs[i], reward[i], terminated[i], truncated[i], infos[i] = env.step(actions[i])
            counts = mj_warnings[i]
            if counts is not None and (counts[_BADQPOS] or counts[_BADQVEL] or counts[_BADQACC]):
                # MuJoCo found the state unstable and reset its simulation itself: the step is no transition.
                counts[:] = 0
                reward[i] = np.nan
        return next_obs, reward, terminated, truncated

    def _set_seed(self, seed: int | None) -> None:
        self._seed = seed
        self._needs_seed = seed is not None

    def close(self, *, raise_if_closed: bool = True) -> None:  # noqa: D102
        for env in self._wrapped:
            env.close()
        self._wrapped = []
        self._envs = []
        try:
            super().close(raise_if_closed=raise_if_closed)
        except TypeError:
            super().close()


_BADQPOS, _BADQVEL, _BADQACC = (int(w) for w in (mujoco.mjtWarning.mjWARN_BADQPOS, mujoco.mjtWarning.mjWARN_BADQVEL,
                                                   mujoco.mjtWarning.mjWARN_BADQACC))


def _warning_counts(env: gym.Env) -> np.ndarray | None:
    data = getattr(env, "data", None)
    warning = getattr(data, "warning", None)
    return getattr(warning, "number", None)


CreateEnvFn = Callable[[], EnvBase]
