"""The parts of TorchRL's collector API that :class:`~torchrl_unilab.OffPolicyCollector` answers in this process.

TorchRL's multi-process collectors forward these calls to their workers over a
command pipe. Ours run a batched loop with no command channel, so each answer
comes from what the training process holds or shares with the workers: the
env's specs probed at construction, the replay buffer, the policy as
published, the hooks handed to the workers when they start.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from tensordict import TensorDict, TensorDictBase
from torch import nn
from torchrl.envs import EnvBase

from torchrl_unilab._torchrl_private import collector_stats, normalize_worker_calls
from torchrl_unilab.collectors._worker_view import WorkerView

__all__ = ["InProcessCollectorAPI"]


class InProcessCollectorAPI:
    """Mixin of :class:`~torchrl_unilab.OffPolicyCollector`: TorchRL's collector methods answered without the workers.

    It reads the collector's fields (``policy``, ``replay_buffer``, ``_env_view``,
    ``_scheme``, ...) and is not meant to be used alone.

    Examples:
        >>> from torchrl_unilab import OffPolicyCollector
        >>> with OffPolicyCollector("Pendulum-v1", num_envs=4, frames_per_batch=64) as collector:
        ...     collector.getattr_env("batch_size"), collector.get_model("policy") is collector.policy
        (torch.Size([4]), True)
    """

    def metrics(self) -> dict[str, Any]:
        """Collection figures, readable at any time from the main process.

        Returns a dict with ``frames`` (collected), ``fps``, ``random_frames``,
        ``nonfinite_dropped``, ``episodes``, ``terminated``, ``truncated``,
        ``mean_return`` and ``mean_length`` over the recent-episode windows,
        ``time`` (seconds per worker phase), ``policy_version`` (the oldest any
        worker acts with), ``published_version``, ``buffer_size`` (``None``
        without a replay buffer), ``engine`` (what steps the envs: ``"envpool"``,
        ``"gymnasium"``, ``"torchrl"`` for an env stack run as given, or ``"mixed"``)
        and ``workers`` (the same figures per worker, with each one's ``engine``).
        With ``max_worker_restarts``: ``worker_restarts`` (in all), ``frames_lost``
        (claimed by workers that died before writing them; not in ``frames``), and per
        worker ``restarts`` and ``last_error`` (the last failure's message and traceback,
        ``None`` if none).
        Raises :class:`~torchrl_unilab.WorkerError` if a worker failed for good.
        """
        self._raise_if_failed()
        out = self._metrics.summary()
        out["frames"] = self.frames_written
        out["buffer_size"] = len(self.replay_buffer) if self.replay_buffer is not None else None
        out["published_version"] = self.policy_version
        out["engine"] = self._engines[0] if len(set(self._engines)) == 1 else "mixed"
        pool = self._pool
        out["worker_restarts"] = sum(pool.restarts) if pool is not None else 0
        out["frames_lost"] = self.frames_lost
        for idx, (worker, engine) in enumerate(zip(out["workers"], self._engines)):
            # From the frame accounting, exact across restarts: a batch of a worker killed after its rows were in
            # and before it added them to its metrics row is counted by the parent (FrameControl.settle) only.
            worker["frames"] = self._worker_frames.control.worker_written(idx)
            worker["random_frames"] = self._worker_frames.control.random_written(idx)
            worker["engine"] = engine
            worker["restarts"] = pool.restarts[idx] if pool is not None else 0
            last = pool.last_failure(idx) if pool is not None else None
            worker["last_error"] = None if last is None else f"{last}"
        out["random_frames"] = sum(worker["random_frames"] for worker in out["workers"])
        return out

    def get_policy_version(self) -> int:
        """Same as :attr:`policy_version`."""
        return self.policy_version

    def increment_version(self) -> None:
        """Publishes the constructor's policy again, as a new version (versions count publishes here)."""
        self.update_policy_weights_()

    def get_model(self, model_id: str) -> nn.Module:
        """The model synced under ``model_id``; only ``"policy"`` exists."""
        if model_id != "policy":
            raise KeyError(f"model_id must be 'policy', got {model_id!r}")
        return self.policy

    def get_cached_weights(self, model_id: str) -> TensorDictBase:
        """The weights last published for ``model_id`` (``"policy"``), as a TensorDict."""
        self.get_model(model_id)
        version_and_tensors = self._scheme.shared.read()
        names = [name for name, _, _ in self._scheme.shared.layout]
        return TensorDict(dict(zip(names, version_and_tensors[1])), []).unflatten_keys(".")

    def reset(self, reset_idx: Sequence[bool] | None = None) -> None:
        """Not supported: workers reset their envs as episodes end; bound episodes with ``max_frames_per_traj``."""
        raise NotImplementedError(
            "OffPolicyCollector workers reset their envs themselves as episodes end; bound episode length "
            "with max_frames_per_traj"
        )

    def getattr_policy(self, attr: str) -> Any:
        """An attribute of the policy the workers run (this process holds the same module)."""
        return getattr(self.policy, attr)

    def getattr_env(self, attr: str) -> Any:
        """An attribute of the env: specs and batch size always, anything while an env lives in this process.

        The specs are a snapshot of the env probed at construction; other
        attributes live in the worker processes (an env instance stepped by a
        thread of this process answers them all).
        """
        return self._env_view.get(attr)

    def _live_env(self) -> EnvBase | None:
        if self._probe_given is not None:
            return self._probe_given
        return self._worker_envs[0] if isinstance(self._worker_envs[0], EnvBase) else None

    @property
    def env(self) -> Any:
        """The env, as TorchRL's single-process ``Collector`` exposes it (its trainers read ``collector.env``).

        The envs run in the workers, so this is a view whose attributes are
        :meth:`getattr_env`'s: the specs and batch size always (TorchRL's TD3
        trainer reads ``collector.env.action_spec`` to bound its loss), anything
        else while an env lives in this process.

        Examples:
            >>> from torchrl_unilab import OffPolicyCollector
            >>> with OffPolicyCollector("Pendulum-v1", num_envs=4, frames_per_batch=64) as collector:
            ...     collector.env.action_spec_unbatched.shape
            torch.Size([1])
        """
        return self._env_view

    def getattr_rb(self, attr: str) -> Any:
        """An attribute of the replay buffer."""
        if self.replay_buffer is None:
            raise RuntimeError("this collector has no replay_buffer")
        return getattr(self.replay_buffer, attr)

    def fake_tensordict(self) -> TensorDictBase:
        """One batch of zeroed rows with every key a worker writes (for laying out a storage)."""
        return self._row.select(*self._row_keys).expand(self.num_envs).clone().zero_()

    def map_fn(self, method_name: str, list_of_args: list[tuple] | None = None,
               list_of_kwargs: list[dict] | None = None) -> list[Any]:
        """Calls the method at the dotted path ``method_name`` for each worker, one entry of arguments each.

        As with TorchRL's collectors, e.g. ``map_fn("replay_buffer.__len__")``. It is answered in
        this process from what each worker shares with it (its ``worker_idx``, the
        ``replay_buffer``, the ``policy`` as published):
        our workers run a batched loop with no command channel.

        Examples:
            >>> from torchrl.envs.utils import RandomPolicy
            >>> from torchrl.testing.mocking_classes import ContinuousActionVecMockEnv
            >>> from torchrl_unilab import OffPolicyCollector
            >>> collector = OffPolicyCollector([ContinuousActionVecMockEnv] * 2,
            ...                                RandomPolicy(ContinuousActionVecMockEnv().action_spec),
            ...                                frames_per_batch=16, total_frames=32)
            >>> collector.map_fn("get_distant_attr", list_of_args=[("worker_idx",), ("worker_idx",)])
            [0, 1]
            >>> collector.shutdown()
        """
        list_of_args, list_of_kwargs = normalize_worker_calls(self, list_of_args, list_of_kwargs)
        return [view.get_distant_attr(method_name)(*args, **kwargs)
                for view, args, kwargs in zip(self._worker_views(), list_of_args, list_of_kwargs)]

    def get_distant_attr(self, attr: str) -> list[Any]:
        """The attribute at the dotted path ``attr`` for each worker, e.g. ``"replay_buffer.write_count"``
        (see :meth:`map_fn`)."""
        return [view.get_distant_attr(attr) for view in self._worker_views()]

    def _worker_views(self) -> list[WorkerView]:
        self._raise_if_failed()
        return [WorkerView(idx, self.replay_buffer, self._user_policy) for idx in range(self.num_workers)]

    def enable_profile(self, **kwargs: Any) -> None:
        """Not supported: use the worker trace and per-phase timings instead."""
        raise NotImplementedError(
            "OffPolicyCollector workers are profiled with their phase timers: metrics()['time'] gives seconds per "
            "phase, and torchrl_unilab.worker.off_policy_collector_fn(trace_enabled=True) writes a Perfetto trace"
        )

    def disable_profile(self) -> None:
        """Not supported: see :meth:`enable_profile`."""
        self.enable_profile()

    @property
    def pre_collect_hook(self) -> Callable[[], None] | None:
        """Called in each worker before a batch; set it before collection starts."""
        return self._pre_hook

    @pre_collect_hook.setter
    def pre_collect_hook(self, hook: Callable[[], None] | None) -> None:
        self._check_not_started("pre_collect_hook")
        self._pre_hook = hook

    @property
    def post_collect_hook(self) -> Callable[[TensorDictBase], None] | None:
        """Called in each worker with each batch once written; set it before collection starts."""
        return self._post_hook

    @post_collect_hook.setter
    def post_collect_hook(self, hook: Callable[[TensorDictBase], None] | None) -> None:
        self._check_not_started("post_collect_hook")
        self._post_hook = hook

    def _check_not_started(self, what: str) -> None:
        if getattr(self, "_started", False):
            raise RuntimeError(f"{what} must be set before collection starts: workers take it when they start")

    def stats(self, workers: str = "aggregate") -> dict[str, int | float | bool]:
        """TorchRL's progress snapshot, from :meth:`metrics`.

        Args:
            workers: ``"aggregate"`` (default), ``"per_worker"`` (entries named
                ``"worker_<idx>/<metric>"``) or ``"both"``.
        """
        if workers not in ("aggregate", "per_worker", "both"):
            raise ValueError(f"workers must be one of 'aggregate', 'per_worker' or 'both', got {workers!r}")
        metrics = self.metrics()
        out: dict[str, int | float | bool] = {}
        if workers in ("aggregate", "both"):
            out.update(collector_stats(self, frames=self._consumed_frames, iteration=self._iteration))
            out.update(frames_written=metrics["frames"], fps=metrics["fps"], episodes=metrics["episodes"],
                       random_frames=metrics["random_frames"])
        out["workers"] = self.num_workers
        out["workers_alive"] = self._pool.alive() if self._pool is not None else 0
        if workers in ("per_worker", "both"):
            for idx, worker in enumerate(metrics["workers"]):
                for key, value in worker.items():
                    if isinstance(value, (int, float, bool)):
                        out[f"worker_{idx}/{key}"] = value
        return out
