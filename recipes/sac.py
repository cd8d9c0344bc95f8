"""Soft Actor-Critic on a gymnasium MuJoCo task, learning while workers collect in the background.

The shape of TorchRL's ``sota-implementations/sac``: a Hydra config with the
sections ``env``, ``collector``, ``replay_buffer``, ``optim``, ``network`` and
``logger``, TorchRL's ``SACLoss`` and ``SoftUpdate``. The difference: an
``OffPolicyCollector`` steps the envs in worker processes and writes straight
into the shared replay buffer, while this process only learns, holding
``optim.utd_ratio`` gradient updates per collected frame.

    python recipes/sac.py                                   # HalfCheetah-v5, ~15 min on 2 cores
    python recipes/sac.py env.name=Hopper-v5 collector.total_frames=200000
    python recipes/sac.py collector.lockstep=true           # collect, train, repeat: reproducible
    python recipes/sac.py resume=outputs/HalfCheetah-v5_SAC/<date>   # continue a run

Ctrl-C saves a checkpoint to resume from.
"""

from __future__ import annotations

import os

import hydra
import torch
from omegaconf import DictConfig, OmegaConf

from torchrl_unilab import WorkerError
from torchrl_unilab.modules.normalization import normalize_batch
from torchrl_unilab.trainers.checkpoint import Checkpointer
from torchrl_unilab.trainers.logging_utils import LearningCurve, RunLogger, make_logger
from torchrl_unilab.trainers.recipes_utils import (
    Evaluator,
    env_info,
    env_kwargs,
    make_collector,
    make_loss_module,
    make_networks,
    make_optimizer,
    make_replay_buffer,
    run_dir,
)
from torchrl_unilab.trainers.training import (
    BufferSampler,
    Every,
    GracefulStop,
    UpdateStep,
    UTDController,
    policy_lag,
    update_normalizer,
)


def train(cfg: DictConfig, algo: str = "sac") -> dict:
    """Trains ``algo`` ("sac" or "td3", which shares this loop) and returns a summary dict."""
    # --- Config and run directory (a resumed run continues in its own directory)
    torch.manual_seed(cfg.env.seed)
    torch.set_num_threads(cfg.optim.num_threads)
    out_dir = run_dir(cfg)
    os.makedirs(out_dir, exist_ok=True)
    OmegaConf.save(cfg, os.path.join(out_dir, "config.yaml"))

    # --- Networks: actor, critic, and the exploration policy the workers run
    nets = make_networks(cfg, algo, env_info(cfg))

    # --- Loss (TorchRL's SACLoss, or TD3Loss with its policy delay), target networks, optimizer, update step
    loss_module, target_updater = make_loss_module(cfg, algo, nets)
    optimizer = make_optimizer(cfg, loss_module)
    update = UpdateStep(loss_module, optimizer, target_updater, policy_delay=cfg.optim.get("policy_update_delay", 1),
                        fast_loss=cfg.compile.get("fast_loss", True), compile=cfg.compile.compile,
                        compile_mode=cfg.compile.compile_mode)

    # --- Replay buffer, and the checkpoint to resume from
    replay_buffer = make_replay_buffer(cfg)
    checkpointer = Checkpointer(
        os.path.join(out_dir, "checkpoint"),
        modules={"loss": loss_module, "optimizer": optimizer, "target_updater": target_updater},
        normalizer=nets.normalizer,
    )
    saved = checkpointer.load(replay_buffer) if cfg.resume else {}
    frames_done, update.updates = saved.get("frames", 0), saved.get("updates", 0)

    # --- Logging and evaluation (deterministic policy, envs of its own)
    run = RunLogger(
        make_logger(cfg.logger.backend, out_dir, cfg.logger.exp_name, project_name=cfg.logger.project_name,
                    state_dict=saved.get("logger")),
        os.path.join(out_dir, "learning_curve.png"),
        cfg.collector.total_frames,
        frames=frames_done, updates=update.updates, elapsed=saved.get("elapsed", 0.0),
        curve=LearningCurve.from_state(saved.get("curve", [])),
        title=f"{algo.upper()} {cfg.env.name}", progress_bar=cfg.logger.progress_bar,
    )
    evaluator = Evaluator(cfg.env.name, cfg.logger.num_eval_envs, seed=cfg.env.seed + 10_000,
                          env_kwargs=env_kwargs(cfg))

    # --- Collector: workers step the envs and fill the replay buffer in the background
    collector = make_collector(cfg, nets.policy, replay_buffer, frames_done=frames_done)
    utd = UTDController(
        collector, cfg.optim.utd_ratio,
        learning_starts=max(cfg.collector.init_random_frames, cfg.optim.batch_size),
        total_frames=cfg.collector.total_frames, max_lead_frames=cfg.collector.max_lead_frames,
        lockstep=cfg.collector.lockstep, frames_offset=frames_done, updates=update.updates,
    )

    def save_checkpoint() -> None:
        with collector.pause():  # no worker writes while the buffer is dumped
            checkpointer.save(replay_buffer, counters={"frames": utd.frames, "updates": utd.updates,
                                                       **run.state()})

    stop = GracefulStop()  # Ctrl-C: finish the update, save a checkpoint, shut down (twice: abort)
    try:
        with stop:
            sample = BufferSampler(replay_buffer, cfg.optim.batch_size)
            log_due = Every(cfg.logger.log_every, start=frames_done)
            eval_due = Every(cfg.logger.eval_every, start=frames_done)
            checkpoint_due = Every(cfg.logger.checkpoint_every, start=frames_done)

            # --- The loop: one gradient update per iteration, paced by the UTD controller
            while not utd.done and not stop.requested:
                utd.wait()  # learner ahead: wait for data (lock-step: collect the next chunk)
                batch = sample()
                if nets.normalizer is not None:
                    normalize_batch(batch, nets.normalizer)
                run.add_losses(update(batch))
                utd.step()  # collector ahead: its workers pause at the cap this moves

                if utd.updates % cfg.collector.sync_every == 0:
                    if nets.normalizer is not None:
                        update_normalizer(nets.normalizer, replay_buffer)
                    collector.update_policy_weights_()  # statistics travel with the weights

                frames = utd.frames
                if log_due(frames):
                    episodes = collector.metrics()
                    run.log_training(frames=frames, updates=utd.updates, extra={
                        "train/episode_return": episodes["mean_return"],
                        "train/episode_length": episodes["mean_length"],
                        "utd/achieved": utd.window(),  # updates per frame over this log window
                        "utd/cumulative": utd.achieved(),
                        "learner/policy_lag": policy_lag(batch, collector.policy_version),
                        "learner/waited_s": utd.waited_s,
                    })
                if eval_due(frames):
                    run.log_eval(frames=frames, values=evaluator(nets.policy))
                if checkpoint_due(frames):
                    save_checkpoint()
    except WorkerError:
        if not stop.requested:  # workers also get a terminal's Ctrl-C; anything else is a failure
            raise
    finally:
        collector.shutdown(raise_on_error=not stop.requested)

    # --- The end: a final evaluation and checkpoint (the collector is shut down: no writer left)
    if not stop.requested and (not run.curve.points or run.curve.points[-1][0] != utd.frames):
        run.log_eval(frames=utd.frames, values=evaluator(nets.policy))
    checkpointer.save(replay_buffer, counters={"frames": utd.frames, "updates": utd.updates, **run.state()})
    if stop.requested:
        print(f"\nInterrupted: checkpoint saved; continue with resume={out_dir}")
    run.close()
    evaluator.close()
    summary = {
        "final_return": run.last_eval,
        "frames": utd.frames,
        "updates": utd.updates,
        "utd_achieved": utd.achieved(),
        "elapsed_s": run.elapsed,
        "run_dir": out_dir,
        "plot": run.plot_path,
        "checkpoint": str(checkpointer.directory),
        "interrupted": stop.requested,
    }
    print(f"{algo.upper()} {cfg.env.name}: final eval return {summary['final_return']:.1f} after {summary['frames']} frames, "
          f"{summary['updates']} updates, {summary['elapsed_s'] / 60:.1f} min\n"
          f"learning curve: {summary['plot']}\ncheckpoint: {summary['checkpoint']} (resume={out_dir})")
    return summary


@hydra.main(config_path="config", config_name="sac", version_base="1.3")
def main(cfg: DictConfig) -> dict:
    return train(cfg, "sac")


if __name__ == "__main__":
    main()
