"""A recipe run's collector from the ``env`` and ``collector`` sections of its config.

:func:`make_collector` builds an :class:`~torchrl_unilab.OffPolicyCollector`, or with
``collector.backend=ray`` a
:class:`~torchrl_unilab.collectors.ray_collector.RayOffPolicyCollector`, for the frames left in
the run; :func:`env_kwargs` and :func:`multi_step_postproc` read the env options and n-step
returns it hands to the workers.
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig
from tensordict.nn import TensorDictModuleBase
from torchrl.data import ReplayBuffer
from torchrl.envs.utils import ExplorationType

from torchrl_unilab.collectors.offpolicy_collector import OffPolicyCollector
from torchrl_unilab.data.postprocs import MultiStepWithDone

__all__ = ["env_kwargs", "make_collector", "multi_step_postproc"]


def env_kwargs(cfg: DictConfig) -> dict[str, Any]:
    """Keyword arguments for ``gymnasium.make`` from the ``env`` section (``max_episode_steps``).

    Examples:
        >>> from omegaconf import OmegaConf
        >>> env_kwargs(OmegaConf.create({"env": {"max_episode_steps": 200}}))
        {'max_episode_steps': 200}
    """
    steps = cfg.env.get("max_episode_steps")
    return {} if steps is None else {"max_episode_steps": int(steps)}


def multi_step_postproc(cfg: DictConfig) -> MultiStepWithDone | None:
    """``collector.multi_step`` (TorchRL's key; 0 or 1: off): n-step returns summed in the workers before each
    write, with ``optim.gamma``, as :class:`~torchrl_unilab.data.postprocs.MultiStepWithDone`.

    Examples:
        >>> from omegaconf import OmegaConf
        >>> multi_step_postproc(OmegaConf.create({"collector": {"multi_step": 3}, "optim": {"gamma": 0.99}})).n_steps
        3
        >>> multi_step_postproc(OmegaConf.create({"collector": {}, "optim": {"gamma": 0.99}})) is None
        True
    """
    n_steps = _multi_steps(cfg)
    return MultiStepWithDone(gamma=float(cfg.optim.gamma), n_steps=n_steps) if n_steps > 1 else None


def _multi_steps(cfg: DictConfig) -> int:
    n_steps = cfg.get("collector", {}).get("multi_step", 0)
    if not isinstance(n_steps, int) or isinstance(n_steps, bool) or n_steps < 0:
        raise ValueError(f"collector.multi_step must be an int >= 0 (0 or 1: one-step transitions), got {n_steps!r}")
    return n_steps


def make_collector(
    cfg: DictConfig, policy: TensorDictModuleBase, replay_buffer: ReplayBuffer, *, frames_done: int = 0
) -> OffPolicyCollector:
    """An :class:`~torchrl_unilab.OffPolicyCollector` from the ``env`` and ``collector`` sections.

    ``collector.backend=ray`` builds a
    :class:`~torchrl_unilab.collectors.ray_collector.RayOffPolicyCollector` instead, with
    the same interface: ``collector.num_nodes`` nodes, each running
    ``num_workers`` x ``env_per_collector`` envs (see ``docs/guide/ray.rst``).

    ``collector.max_worker_restarts`` (and with Ray ``collector.max_node_restarts``)
    replace dead workers (lost nodes) instead of ending the run.

    The collector gets the frames left in the run (``total_frames -
    frames_done``) and the random frames not yet collected; a resumed run
    reseeds its workers with ``env.seed + frames_done``, so it does not replay
    the episodes it already saw. Lock-step runs need ``num_workers=1``: two
    workers interleave their writes in an order that changes from run to run.

    Examples:
        >>> from omegaconf import OmegaConf
        >>> from torchrl_unilab.trainers.recipes_utils import env_info, make_networks, make_replay_buffer
        >>> cfg = OmegaConf.create({"env": {"name": "Pendulum-v1", "seed": 0},
        ...     "collector": {"num_workers": 1, "env_per_collector": 2, "frames_per_batch": 32, "total_frames": 64,
        ...                   "init_random_frames": 64, "lockstep": False},
        ...     "network": {"hidden_sizes": [8], "use_layer_norm": False},
        ...     "replay_buffer": {"size": 256, "scratch_dir": None}, "optim": {"batch_size": 8}})
        >>> nets = make_networks(cfg, "sac", env_info(cfg))
        >>> with make_collector(cfg, nets.policy, make_replay_buffer(cfg)) as collector:
        ...     collector.allow_frames(64)
        ...     collector.wait_for_frames(64, timeout=60)
        True
    """
    col = cfg.collector
    workers = int(col.num_workers)
    if col.get("lockstep", False) and workers != 1:
        raise ValueError(
            f"collector.lockstep=true needs collector.num_workers=1 for a reproducible buffer order, got {workers}"
        )
    total = int(col.total_frames)
    if total <= frames_done:
        raise ValueError(
            f"collector.total_frames={total} is already reached ({frames_done} frames done); "
            "raise collector.total_frames to continue the run"
        )
    seed = cfg.env.get("seed")
    backend = col.get("backend", "local")
    postproc = multi_step_postproc(cfg)
    if backend == "ray":
        if postproc is not None:
            raise ValueError(f"collector.multi_step={col.multi_step} needs collector.backend=local: Ray nodes "
                             "deliver flat rows, with no [envs, steps] batch to sum rewards along")
        return _make_ray_collector(cfg, policy, replay_buffer, frames_done=frames_done)
    if backend != "local":
        raise ValueError(f"collector.backend must be one of ('local', 'ray'), got {backend!r}")
    return OffPolicyCollector(
        cfg.env.name,
        policy,
        postproc=postproc,
        num_workers=workers,
        num_envs=int(col.env_per_collector),
        frames_per_batch=int(col.frames_per_batch),
        total_frames=total - frames_done,
        replay_buffer=replay_buffer,
        init_random_frames=max(0, int(col.init_random_frames) - frames_done),
        seed=None if seed is None else int(seed) + frames_done,
        exploration_type=ExplorationType.RANDOM,
        env_kwargs=env_kwargs(cfg),
        max_worker_restarts=int(col.get("max_worker_restarts", 0)),
        engine=str(col.get("engine", "auto")),
    )


def _make_ray_collector(cfg: DictConfig, policy: TensorDictModuleBase, replay_buffer: ReplayBuffer, *,
                        frames_done: int) -> Any:
    """``collector.backend=ray``: ``collector.num_nodes`` Ray actors of ``num_workers`` x ``env_per_collector`` each.

    ``collector.ray_address`` joins a running cluster (``"auto"`` or
    ``"host:6379"``); ``null`` starts a local one, which the collector's
    shutdown stops. Batches arrive in this process and go into ``replay_buffer``.
    """
    from torchrl_unilab.collectors.ray_collector import (
        RayOffPolicyCollector,  # Ray is an optional dependency
    )

    col = cfg.collector
    if col.get("lockstep", False):
        raise ValueError("collector.lockstep=true needs collector.backend=local: nodes deliver in arrival order")
    seed = cfg.env.get("seed")
    address = col.get("ray_address")
    return RayOffPolicyCollector(
        cfg.env.name,
        policy,
        num_nodes=int(col.get("num_nodes", 2)),
        num_workers=int(col.num_workers),
        num_envs=int(col.env_per_collector),
        frames_per_batch=int(col.frames_per_batch),
        total_frames=int(col.total_frames) - frames_done,
        init_random_frames=max(0, int(col.init_random_frames) - frames_done),
        seed=None if seed is None else int(seed) + frames_done,
        replay_buffer=replay_buffer,
        max_node_restarts=int(col.get("max_node_restarts", 0)),
        collector_kwargs={"env_kwargs": env_kwargs(cfg), "max_worker_restarts": int(col.get("max_worker_restarts", 0)),
                          "engine": str(col.get("engine", "auto"))},
        ray_init_config={"address": address} if address else {"include_dashboard": False},
    )
