"""What a recipe's run needs besides the algorithm: directory, checkpoint, logging, evaluation, collection pacing.

:class:`RecipeRun` holds the parts of ``recipes/sac.py`` and ``recipes/td3.py``
that do not depend on the algorithm, so that each recipe shows only its own:
networks, loss, optimiser, and a loop of sampling, loss, backward, optimiser
step and target update.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Mapping
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModuleBase
from torch import nn
from torchrl.data import ReplayBuffer

from torchrl_unilab.collectors import OffPolicyCollector, WorkerError
from torchrl_unilab.modules.normalization import ObservationNormalizer
from torchrl_unilab.trainers.checkpoint import Checkpointer
from torchrl_unilab.trainers.collection import env_kwargs, make_collector
from torchrl_unilab.trainers.evaluation import EvalRunner
from torchrl_unilab.trainers.logging_utils import LearningCurve, RunLogger, make_logger
from torchrl_unilab.trainers.threads import LearnerThreads
from torchrl_unilab.trainers.training import (
    Every,
    GracefulStop,
    UTDController,
    policy_lag,
    update_normalizer,
)

__all__ = ["RecipeRun", "restart_counts", "run_dir"]


def restart_counts(metrics: Mapping[str, Any], prefix: str = "collector/") -> dict[str, int]:
    """The restarts in a collector's ``metrics()``: ``worker_restarts``, and ``node_restarts`` with Ray.

    Examples:
        >>> restart_counts({"worker_restarts": 2, "frames": 10})
        {'collector/worker_restarts': 2}
    """
    return {f"{prefix}{key}": int(metrics[key]) for key in ("worker_restarts", "node_restarts") if key in metrics}


def run_dir(cfg: DictConfig) -> str:
    """Where a run writes its logs, plots and checkpoint.

    ``resume`` (a previous run directory) if set; else ``logger.log_dir`` if
    set; else Hydra's output directory for this run; else ``./outputs``.

    Examples:
        >>> from omegaconf import OmegaConf
        >>> run_dir(OmegaConf.create({"resume": None, "logger": {"log_dir": "/tmp/run"}}))
        '/tmp/run'
    """
    if cfg.get("resume"):
        return os.path.abspath(str(cfg.resume))
    if cfg.logger.get("log_dir"):
        return os.path.abspath(str(cfg.logger.log_dir))
    try:
        from hydra.core.hydra_config import HydraConfig

        return HydraConfig.get().runtime.output_dir
    except (ImportError, ValueError):
        return os.path.abspath("outputs")


class RecipeRun:
    """Run directory, checkpoint and resume, logger, evaluation, collector and UTD pacing of one recipe run.

    Building it makes the run directory (``logger.log_dir``, ``resume`` or
    Hydra's), saves the config there, restores ``modules``, ``normalizer``,
    the RNG and ``replay_buffer`` from the checkpoint when ``resume`` is set,
    and starts the collector (:attr:`collector`) paced by a
    :class:`~torchrl_unilab.trainers.training.UTDController` (:attr:`utd`).
    The learner's torch threads are ``optim.num_threads``, a count or ``auto``:
    the cores the workers and other processes leave idle, followed between updates
    (:attr:`threads`, a :class:`~torchrl_unilab.trainers.threads.LearnerThreads`).

    Use it as a context around the training loop, which runs until :attr:`done`:
    inside, the first Ctrl-C or SIGTERM sets :attr:`stop_requested` (the loop
    ends after its update and a checkpoint is saved); on the way out the
    collector shuts down. Call :meth:`after_update` after each gradient update
    and :meth:`finish` after the loop. ``max_minutes`` bounds the run's
    wall-clock, and ``logger.snapshot_every_s`` saves the policy's weights with
    the frames and updates done every so many seconds (:meth:`save_snapshot`),
    for an evaluation against wall-clock that takes none of the run's time.

    Args:
        cfg: the recipe's Hydra config (sections ``env``, ``collector``,
            ``replay_buffer``, ``optim``, ``logger``, ``resume``).
        name: the algorithm's name for titles and messages, e.g. ``"SAC"``.
        policy: what the evaluation runs, and what the workers run unless
            ``worker_policy`` is given; the weights each publish sends.
        replay_buffer: the shared buffer the collector fills.
        modules: what the checkpoint saves and restores, by name (loss
            module, optimiser, target updater).

    Keyword Args:
        normalizer: the observation normaliser, if ``network.obs_norm``.
        critic_normalizer: the asymmetric critic's normaliser of ``"privileged"``
            (``network.critic_input=privileged`` with ``network.obs_norm``); updated from the
            buffer with ``normalizer`` and saved in the checkpoint, never sent to the workers.
        worker_policy: a CPU build of ``policy`` for the workers, when
            ``policy`` lives on a GPU (:attr:`Networks.worker_policy
            <torchrl_unilab.trainers.recipes_utils.Networks.worker_policy>`).
            Each publish copies ``policy``'s weights, by name, to the shared
            block the workers load from.

    Examples:
        >>> import tempfile
        >>> log_dir = tempfile.TemporaryDirectory()
        >>> from pathlib import Path
        >>> from omegaconf import OmegaConf
        >>> import torchrl_unilab
        >>> from torchrl_unilab.trainers.recipes_utils import env_info, make_networks, make_replay_buffer
        >>> checkout = Path(torchrl_unilab.__file__).parents[1]  # the recipes' configs are in the source tree
        >>> cfg = OmegaConf.load(checkout / "recipes" / "config" / "sac.yaml")
        >>> cfg.merge_with_dotlist(["env.name=Pendulum-v1", "network.hidden_sizes=[8]", "collector.total_frames=96",
        ...     "collector.init_random_frames=64", "collector.env_per_collector=2", "collector.frames_per_batch=32",
        ...     "optim.batch_size=32", "replay_buffer.size=1000", "logger.backend=none", "logger.progress_bar=false",
        ...     "logger.num_eval_envs=1", f"logger.log_dir={log_dir.name}"])
        >>> nets = make_networks(cfg, "sac", env_info(cfg))
        >>> run = RecipeRun(cfg, "SAC", nets.policy, make_replay_buffer(cfg), modules={"actor": nets.actor})
        >>> with run:
        ...     while not run.done:  # a recipe samples and updates between these two
        ...         run.utd.wait()
        ...         run.utd.step()
        >>> summary = run.finish()  # doctest: +ELLIPSIS
        SAC Pendulum-v1: final eval return ...
        >>> summary["frames"], summary["updates"], summary["interrupted"]  # optim.utd_ratio=0.25 past the 64 random
        (96, 8, False)
        >>> log_dir.cleanup()
    """

    def __init__(
        self,
        cfg: DictConfig,
        name: str,
        policy: TensorDictModuleBase,
        replay_buffer: ReplayBuffer,
        modules: Mapping[str, nn.Module | Any],
        *,
        normalizer: ObservationNormalizer | None = None,
        critic_normalizer: ObservationNormalizer | None = None,
        worker_policy: TensorDictModuleBase | None = None,
    ) -> None:
        max_minutes = cfg.get("max_minutes")
        if max_minutes is not None and (isinstance(max_minutes, bool) or not isinstance(max_minutes, (int, float))
                                        or not max_minutes > 0):
            raise ValueError(f"max_minutes must be a number of minutes > 0, or null (no limit), got {max_minutes!r}")
        self._deadline_s = None if max_minutes is None else 60.0 * float(max_minutes)
        self.cfg, self.name, self.policy = cfg, name, policy
        self.worker_policy = policy if worker_policy is None else worker_policy
        self.replay_buffer, self.normalizer = replay_buffer, normalizer
        self.critic_normalizer = critic_normalizer
        if critic_normalizer is not None:
            # its statistics (not its read position in the buffer) are restored on resume
            modules = {**modules, "critic_normalizer": critic_normalizer}
        self.out_dir = run_dir(cfg)
        os.makedirs(self.out_dir, exist_ok=True)
        OmegaConf.save(cfg, os.path.join(self.out_dir, "config.yaml"))

        self.checkpointer = Checkpointer(os.path.join(self.out_dir, "checkpoint"), modules=dict(modules),
                                         normalizer=normalizer)
        saved = self.checkpointer.load(replay_buffer) if cfg.resume else {}
        frames_done, updates_done = saved.get("frames", 0), saved.get("updates", 0)

        log = cfg.logger
        self.logger = RunLogger(
            make_logger(log.backend, self.out_dir, log.exp_name, project_name=log.project_name,
                        state_dict=saved.get("logger")),
            os.path.join(self.out_dir, "learning_curve.png"),
            cfg.collector.total_frames,
            frames=frames_done, updates=updates_done, elapsed=saved.get("elapsed", 0.0),
            curve=LearningCurve.from_state(saved.get("curve", [])),
            title=f"{name} {cfg.env.name}", progress_bar=log.progress_bar,
        )
        # Deterministic policy on envs of its own, reseeded before each evaluation.
        self.eval_runner = EvalRunner(cfg.env.name, log.num_eval_envs, seed=cfg.env.seed + 10_000,
                                      env_kwargs=env_kwargs(cfg))

        col = cfg.collector
        # Set (and checked) before the workers start; "auto" reads their timers once the updates begin.
        self.threads = LearnerThreads(cfg.optim.get("num_threads", "auto"), self._collector_metrics)
        self.collector = make_collector(cfg, self.worker_policy, replay_buffer, frames_done=frames_done)
        self.utd = UTDController(
            self.collector, cfg.optim.utd_ratio,
            learning_starts=max(col.init_random_frames, cfg.optim.batch_size),
            total_frames=col.total_frames, max_lead_frames=col.max_lead_frames,
            lockstep=col.lockstep, frames_offset=frames_done, updates=updates_done,
        )
        self._sync_every = int(col.sync_every)
        self._log_due = Every(log.log_every, start=frames_done)
        self._eval_due = Every(log.eval_iter, start=frames_done)
        self._checkpoint_due = Every(log.checkpoint_every, start=frames_done)
        self._snapshot_due = Every(int(log.get("snapshot_every_s") or 0), start=int(self.logger.elapsed))
        self._stop = GracefulStop()
        self._restarts: dict[str, int] = {"worker_restarts": 0}
        self._collector_closed = False
        # The longest time from one update to the next outside evaluations and checkpoints (waits for data,
        # sampling, the update, publishes, logging): a learner stall. The wait for the warm-up frames is none.
        self.longest_stall_s = 0.0
        self._stall_mark: float | None = None

    @property
    def stop_requested(self) -> bool:
        """Whether a Ctrl-C or SIGTERM asked the run to stop."""
        return self._stop.requested

    @property
    def out_of_time(self) -> bool:
        """Whether the run's wall-clock (resumed runs: in all) has reached ``max_minutes``."""
        return self._deadline_s is not None and self.logger.elapsed >= self._deadline_s

    @property
    def done(self) -> bool:
        """Whether the loop should end: ``collector.total_frames`` trained on, out of time, or a stop requested."""
        return self.utd.done or self.stop_requested or self.out_of_time

    def __enter__(self) -> RecipeRun:
        self._stop.__enter__()
        return self

    def __exit__(self, exc_type: type | None, exc: BaseException | None, tb: Any) -> bool:
        stopped = self.stop_requested
        self.restarts()  # while the collector can still answer
        self._collector_closed = True
        try:
            self._stop.__exit__(exc_type, exc, tb)
        finally:
            self.collector.shutdown(raise_on_error=not stopped)
        # The workers also get a terminal's Ctrl-C and fail; after a stop request that is expected.
        return exc_type is not None and issubclass(exc_type, WorkerError) and stopped

    def _collector_metrics(self) -> Mapping[str, Any] | None:
        # Ray's node actors answer only between their batches: no reading between two updates.
        return self.collector.metrics() if isinstance(self.collector, OffPolicyCollector) else None

    def save_checkpoint(self) -> None:
        """Saves modules, normaliser, RNG, buffer and counters; no worker writes while the buffer is dumped."""
        with self.collector.pause(timeout=None):  # the batches in flight are in first, however long they take
            self._save()

    def _save(self) -> None:
        counters = {"frames": self.utd.frames, "updates": self.utd.updates, **self.logger.state()}
        self.checkpointer.save(self.replay_buffer, counters=counters)

    def after_update(self, batch: TensorDictBase, losses: Mapping[str, Any]) -> None:
        """After one gradient update: publish the weights every ``collector.sync_every`` updates (in lock-step
        also before each chunk is collected); log, evaluate and checkpoint when ``logger.log_every``,
        ``logger.eval_iter`` and ``logger.checkpoint_every`` frames have passed.
        """
        utd, collector = self.utd, self.collector
        self.logger.add_losses(losses)
        self.threads.step()
        # Lock-step is collect, train, repeat: each chunk is collected with the weights of the last update, as
        # SB3 and a TorchRL script calling update_policy_weights_() every iteration do. Without it the workers
        # act with weights up to sync_every updates old (docs/recipes.rst, "Pacing").
        chunk_next = utd.lockstep and utd.updates_available() == 0 and not utd.done
        if utd.updates % self._sync_every == 0 or chunk_next:
            for normalizer in (self.normalizer, self.critic_normalizer):
                if normalizer is not None:
                    update_normalizer(normalizer, self.replay_buffer)
            self.publish_weights()  # the normaliser's statistics travel with the weights
        frames = utd.frames
        if self._log_due(frames):
            episodes = collector.metrics()
            self._restarts = restart_counts(episodes, prefix="")
            self.logger.log_training(frames=frames, updates=utd.updates, extra={
                "train/episode_return": episodes["mean_return"],
                "train/episode_length": episodes["mean_length"],
                "utd/achieved": utd.window(),  # updates per frame over this log window
                "utd/cumulative": utd.achieved(),
                "learner/policy_lag": policy_lag(batch, collector.policy_version),
                "learner/waited_s": utd.waited_s,
                "learner/longest_stall_s": self.longest_stall_s,
                "learner/threads": self.threads.threads,  # optim.num_threads=auto: what the workers leave idle
                "learner/collection_cores": self.threads.collection_cores,
                "learner/other_cores": self.threads.other_cores,  # other processes, the workers included
                **restart_counts(episodes),
            })
        now = time.perf_counter()
        if self._stall_mark is not None:
            self.longest_stall_s = max(self.longest_stall_s, now - self._stall_mark)
        if self._eval_due(frames):
            self.logger.log_eval(frames=frames, values=self.eval_runner(self.policy))
        if self._checkpoint_due(frames):
            self.save_checkpoint()
        if self._snapshot_due(int(self.logger.elapsed)):
            self.save_snapshot()
        self._stall_mark = time.perf_counter()

    def save_snapshot(self) -> str:
        """Saves :attr:`policy`'s weights, with the wall-clock seconds, frames and updates so far; returns the path.

        ``<run>/snapshots/<seconds>.pt``, a dict of tensors and numbers (``torch.load(path,
        weights_only=True)`` reads it). Copying the weights takes well under a millisecond for the
        recipes' networks; evaluating them is left to whoever reads the snapshots.
        """
        elapsed = self.logger.elapsed
        directory = os.path.join(self.out_dir, "snapshots")
        os.makedirs(directory, exist_ok=True)
        path = os.path.join(directory, f"{elapsed:09.1f}.pt")
        weights = {name: value.detach().to("cpu", copy=True) for name, value in self.policy.state_dict().items()}
        torch.save({"elapsed_s": elapsed, "frames": self.utd.frames, "updates": self.utd.updates,
                    "policy": weights}, path)
        return path

    def publish_weights(self) -> None:
        """Sends :attr:`policy`'s weights to the workers (they load them before their next step).

        With a CPU policy the workers act on that very module. A GPU policy
        reaches the local workers' shared block with one batched
        device-to-host copy (:meth:`SharedWeights.publish
        <torchrl_unilab.SharedWeights.publish>`); Ray nodes, which may have no
        GPU, get them through the CPU :attr:`worker_policy`.
        """
        if self.worker_policy is self.policy:
            self.collector.update_policy_weights_()
        elif self.cfg.collector.get("backend", "local") == "ray":
            self.worker_policy.load_state_dict(self.policy.state_dict())
            self.collector.update_policy_weights_()
        else:
            self.collector.update_policy_weights_(self.policy)

    def restarts(self) -> dict[str, int]:
        """Worker restarts (and, with Ray, node restarts) the run survived, as last read from the collector.

        Read while the collector runs: at each log line and as the run's context exits.
        """
        if not self._collector_closed:
            with contextlib.suppress(Exception):  # a collector that failed for good raises its error elsewhere
                self._restarts = restart_counts(self.collector.metrics(), prefix="")
        return dict(self._restarts)

    def finish(self) -> dict[str, Any]:
        """After the loop: a final evaluation and checkpoint; returns the run's summary."""
        utd, logger, stopped = self.utd, self.logger, self.stop_requested
        if self._snapshot_due.period > 0 and not stopped:
            self.save_snapshot()  # where the run ended
        if not stopped and (not logger.curve.points or logger.curve.points[-1][0] != utd.frames):
            logger.log_eval(frames=utd.frames, values=self.eval_runner(self.policy))
        restarts = self.restarts()
        self._save()  # the collector is shut down: no writer is left
        if stopped:
            print(f"\nInterrupted: checkpoint saved; continue with resume={self.out_dir}")
        logger.close()
        self.eval_runner.close()
        summary = {
            "final_return": logger.last_eval,
            "frames": utd.frames,
            "updates": utd.updates,
            "utd_achieved": utd.achieved(),
            "longest_stall_s": self.longest_stall_s,
            "learner_threads": self.threads.threads,
            "learner_thread_changes": self.threads.changes,
            "elapsed_s": logger.elapsed,
            "run_dir": self.out_dir,
            "plot": logger.plot_path,
            "checkpoint": str(self.checkpointer.directory),
            "interrupted": stopped,
            "out_of_time": self.out_of_time and not utd.done,
            **restarts,
        }
        survived = "".join(f", {count} {name.replace('_', ' ')}" for name, count in restarts.items() if count)
        print(f"{self.name} {self.cfg.env.name}: final eval return {summary['final_return']:.1f} after "
              f"{summary['frames']} frames, {summary['updates']} updates, {summary['elapsed_s'] / 60:.1f} min"
              f"{survived}\n"
              f"learning curve: {summary['plot']}\ncheckpoint: {summary['checkpoint']} (resume={self.out_dir})")
        return summary
