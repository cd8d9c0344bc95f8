"""MuJoCo tasks stepped by EnvPool's C++ implementation: gymnasium's, MuJoCo Playground's and the Control Suite's.

EnvPool (``envpool`` on the package index) reimplements every gymnasium MuJoCo
v5 task in C++ and steps a batch of them on its own thread pool, faster than the
raw gymnasium loop on one core (``benchmarks/collector_throughput.py`` measures
both; the figures are in ``benchmarks/results/collector/halfcheetah.json``).

EnvPool also ports MuJoCo Playground's robot tasks (``Go1JoystickFlatTerrain-v1``, ...) and the
DeepMind Control Suite (``CheetahRun-v1``, ...), which only EnvPool runs here. Their
observations are dicts; :mod:`torchrl_unilab.envs.task_families` is the table of how each
family's entries become ``"observation"`` (and ``"privileged"``, Playground's critic state),
read once when the env is built. ``python benchmarks/collector_throughput.py --task <task>``
measures EnvPool alone on these tasks (``benchmarks/results/robot/collector_speed.json``).

:class:`EnvPoolEnv` is a lean TorchRL env over one EnvPool pool with the output
contract of :class:`~torchrl_unilab.BatchedGymEnv`: the time limit, staggered
first episodes, truncated-vs-terminated and in-place autoreset are applied by
the shared :class:`~torchrl_unilab.envs.batched_env.BatchedTaskEnv`. EnvPool
resets an env whose episode ended on that env's *next* step and ignores the
action sent with it; this env resets every finished env explicitly right after
the step instead, so no such step ever produces a transition.

``EnvPoolEnv(..., lanes=2)`` splits the batch into pools stepped asynchronously
(:meth:`EnvPoolEnv.send_lane` / :meth:`EnvPoolEnv.recv_lane`); the collector's
worker loop then computes one lane's actions while EnvPool steps the other.
The overlap pays only where a core is idle: a half-batch actor call costs nearly a
whole one, so where every core is busy two lanes run slower than one.
``python benchmarks/collector_throughput.py`` measures lanes on HalfCheetah-v5
(``offpolicy_lanes_*`` in ``benchmarks/results/collector/halfcheetah.json``) and
``--task`` on the robot tasks (``benchmarks/results/robot/collector_speed.json``).
So lanes are off by default and not a collector option; pass an ``EnvPoolEnv`` factory
with ``lanes=`` to use them where cores are idle (docs: Results, "Robot tasks", "Collection
speed").

:func:`make_gym_id_env` is where a gymnasium id is routed to an engine.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from tensordict import TensorDictBase
from torchrl.envs import EnvBase

try:
    # Imported here, at package import, and not on first use: importing envpool keeps a
    # reference to the importing frame, which would keep a collector's arguments alive.
    import envpool
    from envpool.mujoco.gym.registration import gym_mujoco_envs
except ImportError:  # pragma: no cover - envpool is a dependency; gymnasium still works without it
    envpool = None

from torchrl_unilab.envs.batched_env import BatchedGymEnv, BatchedTaskEnv
from torchrl_unilab.envs.task_families import family_ids, observation_layout, task_family

__all__ = ["ENGINES", "EnvPoolEnv", "envpool_task_ids", "make_gym_id_env", "select_engine"]

#: Accepted values of ``engine=``.
ENGINES = ("auto", "envpool", "gymnasium")

# EnvPool config entries this module sets itself (or that name files of EnvPool's own assets).
_RESERVED = frozenset({
    "num_envs", "batch_size", "num_threads", "max_num_players", "thread_affinity_offset", "base_path", "seed",
    "env_seed", "gym_reset_return_info", "max_episode_steps", "frame_stack", "xml_file",
    "gymnasium_v5_render_camera",
})
# Larger than any time limit; the limit itself is applied by BatchedTaskEnv, as for gymnasium.
_NO_LIMIT = 2**30


@functools.cache
def envpool_task_ids() -> frozenset[str]:
    """The MuJoCo ids EnvPool runs here (routed to it by ``engine="auto"``).

    They are gymnasium's, Playground's and the Control Suite's.

    Examples:
        >>> "HalfCheetah-v5" in envpool_task_ids(), "Go1JoystickFlatTerrain-v1" in envpool_task_ids()
        (True, True)
        >>> "Pendulum-v1" in envpool_task_ids()
        False
    """
    if envpool is None:
        return frozenset()
    gym_ids = {f"{task}-{v}" for task, versions, _ in gym_mujoco_envs for v in versions}
    return frozenset(i for i in family_ids() if task_family(i).name != "gymnasium" or i in gym_ids)


def _config_keys(env_id: str) -> set[str]:
    return set(envpool.make_spec(env_id).config._fields) - _RESERVED


def select_engine(env_id: str, engine: str = "auto", env_kwargs: Mapping[str, Any] | None = None,
                  privileged: Any = None) -> str:
    """Returns ``"envpool"`` or ``"gymnasium"``: the engine that runs ``env_id`` in the workers.

    ``engine="auto"`` picks EnvPool when it implements ``env_id``, accepts every
    key of ``env_kwargs`` (besides ``max_episode_steps``) and ``privileged``
    reads no simulator state; otherwise gymnasium. ``engine="envpool"`` insists,
    and says why it cannot when it cannot. ``engine="gymnasium"`` picks
    gymnasium (:class:`~torchrl_unilab.BatchedGymEnv`). MuJoCo Playground and
    Control Suite ids (:mod:`~torchrl_unilab.envs.task_families`) have no
    gymnasium version: they run on EnvPool or raise, whatever ``engine``.

    A :class:`~torchrl_unilab.PrivilegedInfoTransform` reading ``info_keys``,
    ``mujoco`` fields or ``mujoco_fn`` needs gymnasium's ``info`` dicts and
    MuJoCo ``data``, which EnvPool does not expose: only ``critic_key`` works
    with EnvPool.

    Examples:
        >>> select_engine("HalfCheetah-v5")
        'envpool'
        >>> select_engine("HalfCheetah-v5", env_kwargs={"ctrl_cost_weight": 0.2})
        'envpool'
        >>> select_engine("HalfCheetah-v5", env_kwargs={"render_mode": "rgb_array"})
        'gymnasium'
        >>> select_engine("Pendulum-v1")
        'gymnasium'
        >>> select_engine("CheetahRun-v1")
        'envpool'
    """
    if engine == "torchrl":
        raise ValueError(
            f"engine='torchrl' runs a TorchRL env stack as given, and {env_id!r} is a gymnasium id, not a stack: "
            f"pass engine='auto', 'envpool' or 'gymnasium', or a factory that builds your stack"
        )
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")
    family = task_family(env_id)
    only_envpool = family is not None and not family.gymnasium_fallback
    if engine == "gymnasium" and only_envpool:
        raise ValueError(f"engine='gymnasium' cannot run {env_id!r}: it is a {family.suite} task that only EnvPool "
                         "implements here; use engine='auto' or 'envpool'")
    if engine == "gymnasium":
        return "gymnasium"
    reason = None
    if env_id not in envpool_task_ids():
        reason = (f"EnvPool does not implement {env_id!r}; it has {sorted(envpool_task_ids())}"
                  if envpool_task_ids() else "the envpool package is not installed (pip install envpool)")
    else:
        unknown = sorted(set(env_kwargs or {}) - {"max_episode_steps"} - _config_keys(env_id))
        if unknown:
            reason = (f"env_kwargs {unknown} are not options of EnvPool's {env_id}; "
                      f"accepted: {sorted(_config_keys(env_id) | {'max_episode_steps'})}")
        elif privileged is not None and (privileged.info_keys or privileged.mujoco or privileged.mujoco_fn):
            reason = ("PrivilegedInfoTransform's info_keys=, mujoco= and mujoco_fn= read gymnasium's info dicts "
                      "and MuJoCo data, which EnvPool does not expose (critic_key= works with either engine)")
    if reason is None:
        return "envpool"
    if only_envpool:
        raise ValueError(f"EnvPool cannot run {env_id!r}, a {family.suite} task gymnasium does not have: {reason}")
    if engine == "envpool":
        raise ValueError(f"engine='envpool' cannot run {env_id!r}: {reason}. Use engine='gymnasium' or 'auto'.")
    return "gymnasium"


class EnvPoolEnv(BatchedTaskEnv):
    """``num_envs`` EnvPool MuJoCo envs stepped as one TorchRL batch.

    The same output contract as :class:`~torchrl_unilab.BatchedGymEnv` (keys,
    specs, float32 observations, time limit, staggered first episodes, true final
    observation under ``("next", "observation")`` with in-place autoreset in
    :meth:`step_and_maybe_reset`), with the physics in EnvPool's C++ threads.

    A MuJoCo Playground task with a critic state also writes ``"privileged"``
    (EnvPool's ``privileged_state``), beside ``"observation"`` (``state``) and
    with the same contract; a Control Suite task's parts are concatenated into
    ``"observation"`` in the suite's order, each part's columns in
    :attr:`observation_slices` (see :mod:`~torchrl_unilab.envs.task_families`).

    Args:
        env_id: a MuJoCo id EnvPool implements, e.g. ``"HalfCheetah-v5"``,
            ``"Go1JoystickFlatTerrain-v1"`` or ``"CheetahRun-v1"`` (see :func:`envpool_task_ids`).
        num_envs: how many environments are stepped together (``>= 1``).

    Keyword Args:
        seed: env ``i`` is seeded with ``seed + i``; ``None`` draws fresh entropy.
            EnvPool fixes seeds when a pool is built, so :meth:`set_seed` rebuilds it.
        env_kwargs: options of the task, as for ``gymnasium.make`` (``ctrl_cost_weight``,
            ``reset_noise_scale``, ``max_episode_steps``, ...); they go to EnvPool's config.
        max_episode_steps: time limit; defaults to ``env_kwargs["max_episode_steps"]``, else the
            id's registered limit.
        stagger_resets: stagger the first episodes (see :class:`~torchrl_unilab.BatchedGymEnv`).
        threads: EnvPool worker threads (per lane). Default 1.
        lanes: split the batch into this many equal lanes, each an EnvPool pool of its own
            (``num_envs`` must be a multiple). :meth:`send_lane` / :meth:`recv_lane` step one
            lane asynchronously, so a worker can run the policy on one lane while EnvPool's C++
            threads step another (the collector's worker loop does so).
            Env ``j`` keeps seed ``seed + j`` whatever the lanes. Default 1.
        device: TorchRL device, ``"cpu"`` by default.
        obs_dtype: ``torch.float32`` (default) or ``torch.float64``, the dtype gymnasium's
            MuJoCo observations (and EnvPool's) have.
        truncated_when_terminated: an episode that terminates on the step its time limit is
            reached also reports ``truncated``, as gymnasium's ``TimeLimit`` does. Default ``False``.

    Examples:
        >>> env = EnvPoolEnv("Hopper-v5", num_envs=4, seed=0)
        >>> td = env.reset()
        >>> td["observation"].shape
        torch.Size([4, 11])
        >>> td["action"] = env.action_spec.rand()
        >>> transition, td = env.step_and_maybe_reset(td)
        >>> transition["next", "reward"].shape
        torch.Size([4, 1])
        >>> env.close()

        A Playground robot, with its critic state, and a Control Suite task:

        >>> env = EnvPoolEnv("Go1JoystickFlatTerrain-v1", num_envs=2, seed=0)
        >>> {key: tuple(spec.shape) for key, spec in env.observation_spec.items()}
        {'observation': (2, 48), 'privileged': (2, 123)}
        >>> env.close()
        >>> EnvPoolEnv("CheetahRun-v1", num_envs=2).observation_slices
        {'position': slice(0, 8, None), 'velocity': slice(8, 17, None)}

        Two lanes, stepped asynchronously:

        >>> env = EnvPoolEnv("Hopper-v5", num_envs=4, seed=0, lanes=2)
        >>> td = env.reset()
        >>> td["action"] = env.action_spec.zero()
        >>> env.lane_slices
        [slice(0, 2, None), slice(2, 4, None)]
        >>> env.send_lane(0, td[0:2])  # returns at once: EnvPool steps lane 0 meanwhile
        >>> transition, root = env.recv_lane(0)
        >>> transition.batch_size
        torch.Size([2])
        >>> env.close()
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
        threads: int = 1,
        lanes: int = 1,
        device: torch.device | str = "cpu",
        obs_dtype: torch.dtype = torch.float32,
        truncated_when_terminated: bool = False,
    ) -> None:
        if not isinstance(num_envs, int) or num_envs < 1:
            raise ValueError(f"num_envs must be an int >= 1, got {num_envs!r}")
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise ValueError(f"threads must be an int >= 1, got {threads!r}")
        if isinstance(lanes, bool) or not isinstance(lanes, int) or lanes < 1 or num_envs % lanes:
            raise ValueError(f"lanes must be an int >= 1 that divides num_envs={num_envs}, got {lanes!r}")
        select_engine(env_id, "envpool", env_kwargs)
        self.env_id = env_id
        self.env_kwargs = dict(env_kwargs or {})
        self.threads = threads
        self._config = {k: v for k, v in self.env_kwargs.items() if k != "max_episode_steps"}
        spec = envpool.make_spec(env_id, **self._config)
        act_space = spec.gymnasium_action_space
        limit = max_episode_steps or self.env_kwargs.get("max_episode_steps") or spec.config.max_episode_steps
        #: how EnvPool's observation entries become this env's keys (envs/task_families.py)
        self.layout = observation_layout(env_id)
        dims = self.layout.dims
        super().__init__(
            num_envs,
            obs_dim=dims["observation"],
            extra_obs={key: width for key, width in dims.items() if key != "observation"},
            action_low=act_space.low,
            action_high=act_space.high,
            max_episode_steps=limit,
            stagger_resets=stagger_resets,
            device=device,
            obs_dtype=obs_dtype,
            truncated_when_terminated=truncated_when_terminated,
        )
        self._seed = seed
        self.lanes = lanes
        self.lane_size = num_envs // lanes
        self._pools: list = []
        self._in_flight: list[TensorDictBase | None] = [None] * lanes
        # each lane's last step as EnvPool returned it, for step_info
        self._last_step: list[list[np.ndarray] | None] = [None] * lanes
        self._local_ids = np.arange(self.lane_size, dtype=np.int32)

    # ------------------------------------------------------------------ pool
    def _build_pool(self) -> None:
        self._close_pools()
        base = self._seed if self._seed is not None else int(np.random.SeedSequence().entropy % 2**31)
        h = self.lane_size
        self._pools = [
            envpool.make_gymnasium(
                self.env_id, num_envs=h, batch_size=h, num_threads=self.threads, seed=base + lane * h,
                env_seed=[(base + lane * h + i) % 2**31 for i in range(h)], max_episode_steps=_NO_LIMIT,
                **self._config,
            )
            for lane in range(self.lanes)
        ]
        pool = self._pools[0]
        keys = pool._state_keys  # noqa: SLF001 - the raw C++ outputs skip the pytree conversion per step
        self._at = {name: keys.index(name) for name in ("reward", "done", "trunc", "info:env_id")}
        self._obs_at = [keys.index(entry if entry == "obs" else f"obs:{entry}") for _, entry, _ in self.layout.parts]
        self._info_at = {name.removeprefix("info:"): at for at, name in enumerate(keys)
                         if name.startswith("info:") and "env_id" not in name}
        action_keys = tuple(pool._action_keys)  # noqa: SLF001
        if action_keys != ("env_id", "players.env_id", "action"):
            raise RuntimeError(f"unexpected EnvPool action keys {action_keys}; this envpool version is not supported")

    def _close_pools(self) -> None:
        for pool in self._pools:
            pool.close()
        self._pools = []
        self._in_flight = [None] * self.lanes
        self._last_step = [None] * self.lanes

    def _check_built(self) -> None:
        if not self._pools:
            raise RuntimeError("EnvPoolEnv must be reset before it is stepped (after construction or set_seed)")

    def _send(self, lane: int, ids: np.ndarray, actions: np.ndarray | None) -> None:
        """Starts a step (``actions``) or a reset (``None``) of the sorted envs ``ids`` of ``lane`` (local ids)."""
        if actions is None:
            self._pools[lane]._reset(ids)  # noqa: SLF001
        else:
            self._pools[lane]._send([ids, ids, actions])  # noqa: SLF001 - in the order of EnvPool's _action_keys

    def _recv(self, lane: int, ids: np.ndarray) -> list[np.ndarray]:
        out = self._pools[lane]._recv()  # noqa: SLF001
        got = out[self._at["info:env_id"]]
        if got.tobytes() != ids.tobytes():  # both int32: a cheaper np.array_equal
            # With several threads EnvPool returns envs in the order they finish.
            order = np.argsort(got)
            out = [a[order] if getattr(a, "ndim", 0) and len(a) == len(ids) else a for a in out]
        return out

    def _observations(self, out: list[np.ndarray]) -> np.ndarray:
        """The layout's entries of one recv, ``[n, width]`` in this env's dtype (one copy, or none)."""
        if len(self._obs_at) == 1:
            # EnvPool hands out new arrays on every recv (owned by a capsule): float64 observations, as
            # gymnasium's, are used as they are.
            return out[self._obs_at[0]].astype(self._obs_np_dtype, copy=False)
        parts = [out[i] for i in self._obs_at]
        return np.concatenate([p.reshape(len(p), -1) for p in parts], axis=1, dtype=self._obs_np_dtype)

    def _physics_outputs(self, out: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        done, trunc = out[self._at["done"]], out[self._at["trunc"]]
        return (self._observations(out), out[self._at["reward"]].astype(np.float32, copy=False), done & ~trunc, trunc)

    @property
    def observation_slices(self) -> dict[str, slice]:
        """The columns of each EnvPool entry within ``"observation"`` (e.g. a Control Suite task's parts)."""
        return self.layout.slices("observation")

    # ----------------------------------------------------------------- hooks
    def _reset_envs(self, ids: np.ndarray) -> np.ndarray:
        if not self._pools:
            self._build_pool()
        ids = np.asarray(ids, dtype=np.int32)
        obs = np.empty((len(ids), self._obs.shape[1]), dtype=self._obs_np_dtype)
        lane_of = ids // self.lane_size
        for lane in np.unique(lane_of).tolist():
            if self._in_flight[lane] is not None:
                raise RuntimeError(f"lane {lane} has a step in flight: call recv_lane({lane}) before resetting it")
            mine = lane_of == lane
            local = ids[mine] - lane * self.lane_size
            self._send(lane, local, None)
            obs[mine] = self._observations(self._recv(lane, local))
        return obs

    def _physics_step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        self._check_built()
        h = self.lane_size
        for lane in range(self.lanes):  # every lane's C++ threads start before the first result is awaited
            self._send(lane, self._local_ids, actions[lane * h:(lane + 1) * h].astype(np.float64))
        self._last_step = [self._recv(lane, self._local_ids) for lane in range(self.lanes)]
        outs = [self._physics_outputs(out) for out in self._last_step]
        return tuple(np.concatenate(parts) for parts in zip(*outs)) if self.lanes > 1 else outs[0]

    @property
    def info_names(self) -> tuple[str, ...]:
        """The entries of EnvPool's per-step ``info`` that :meth:`step_info` reads (after the first reset)."""
        self._check_built()
        return tuple(self._info_at)

    def step_info(self, name: str) -> np.ndarray:
        """EnvPool's ``info`` entry ``name`` of every env at the last step, before any reset: one row per env.

        A MuJoCo Playground task's reward terms live there, e.g. Go1's velocity tracking
        (``"reward_tracking_lin_vel"``), which the Go1 benchmark reads to tell walking
        from standing (``benchmarks/learning.py --suite go1_gpu``).

        Examples:
            >>> env = EnvPoolEnv("Go1JoystickFlatTerrain-v1", num_envs=2, seed=0)
            >>> td = env.reset()
            >>> td["action"] = env.action_spec.zero()
            >>> _ = env.step_and_maybe_reset(td)
            >>> env.step_info("reward_tracking_lin_vel").shape
            (2,)
            >>> env.close()
        """
        self._check_built()
        if name not in self._info_at:
            raise ValueError(f"name must be one of {self.env_id}'s info entries {list(self._info_at)}, got {name!r}")
        if any(out is None for out in self._last_step):
            raise RuntimeError("step_info reads the last step: step the env first")
        values = [out[self._info_at[name]] for out in self._last_step]
        return np.concatenate(values) if self.lanes > 1 else values[0]

    # ---------------------------------------------------- asynchronous lanes
    @property
    def lane_slices(self) -> list[slice]:
        """The envs of each lane, as slices of the batch."""
        h = self.lane_size
        return [slice(lane * h, (lane + 1) * h) for lane in range(self.lanes)]

    def send_lane(self, lane: int, tensordict: TensorDictBase) -> None:
        """Starts stepping the envs of ``lane`` with ``tensordict["action"]`` and returns at once.

        ``tensordict`` holds that lane's rows only (batch ``[lane_size]``), with
        ``"observation"`` and ``"action"``. EnvPool's C++ threads step the lane
        while the caller computes, e.g. the next actions of another lane;
        :meth:`recv_lane` collects the result.
        """
        self._check_built()
        if self._in_flight[lane] is not None:
            raise RuntimeError(f"lane {lane} already has a step in flight: call recv_lane({lane}) first")
        self._send(lane, self._local_ids, self._clip(tensordict.get("action")).astype(np.float64))
        self._in_flight[lane] = tensordict

    def recv_lane(self, lane: int) -> tuple[TensorDictBase, TensorDictBase]:
        """Waits for the step :meth:`send_lane` started on ``lane``; ``(transition, next_root)`` of its envs.

        The same contract as :meth:`step_and_maybe_reset`, over the lane's envs:
        finished envs are reset in place and keep their true final observation
        under ``("next", "observation")``.
        """
        tensordict = self._in_flight[lane]
        if tensordict is None:
            raise RuntimeError(f"lane {lane} has no step in flight: call send_lane({lane}, td) first")
        self._in_flight[lane] = None
        envs = self.lane_slices[lane]
        self._last_step[lane] = self._recv(lane, self._local_ids)
        stepped = self._apply_limits(self._physics_outputs(self._last_step[lane]), envs)
        return self._autoreset(tensordict, stepped, envs)

    def _set_seed(self, seed: int | None) -> None:
        self._seed = seed
        # EnvPool fixes seeds at construction: the next reset builds new pools.
        self._close_pools()

    def close(self, *, raise_if_closed: bool = True) -> None:  # noqa: D102
        self._close_pools()
        try:
            super().close(raise_if_closed=raise_if_closed)
        except TypeError:
            super().close()


def make_gym_id_env(
    env_id: str,
    num_envs: int,
    *,
    env_kwargs: Mapping[str, Any] | None = None,
    stagger_resets: bool = True,
    engine: str = "auto",
    threads: int = 1,
    seed: int | None = None,
) -> EnvBase:
    """Builds the batched env for a task id on the engine :func:`select_engine` picks.

    Args:
        env_id: a gymnasium id, e.g. ``"HalfCheetah-v5"``, or a MuJoCo Playground or Control
            Suite id EnvPool runs (``"Go1JoystickFlatTerrain-v1"``, ``"CheetahRun-v1"``).
        num_envs: environments stepped as one batch.

    Keyword Args:
        env_kwargs: task options (``gymnasium.make`` keyword arguments).
        stagger_resets: stagger the first episode ends.
        engine: ``"auto"`` (EnvPool where it can, else gymnasium), ``"envpool"`` or ``"gymnasium"``.
        threads: EnvPool threads (ignored by gymnasium).
        seed: env ``i`` is seeded ``seed + i``.

    Examples:
        >>> type(make_gym_id_env("HalfCheetah-v5", 2)).__name__
        'EnvPoolEnv'
        >>> type(make_gym_id_env("HalfCheetah-v5", 2, engine="gymnasium")).__name__
        'BatchedGymEnv'
        >>> type(make_gym_id_env("Pendulum-v1", 2)).__name__
        'BatchedGymEnv'
        >>> type(make_gym_id_env("CheetahRun-v1", 2)).__name__
        'EnvPoolEnv'
    """
    if select_engine(env_id, engine, env_kwargs) == "envpool":
        return EnvPoolEnv(env_id, num_envs, seed=seed, env_kwargs=env_kwargs, stagger_resets=stagger_resets,
                          threads=threads)
    return BatchedGymEnv(env_id, num_envs, seed=seed, env_kwargs=env_kwargs, stagger_resets=stagger_resets)
