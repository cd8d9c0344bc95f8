"""Soft Actor-Critic on a MuJoCo task, learning while workers collect in the background.

The task comes from gymnasium, MuJoCo Playground or the Control Suite. The
shape of TorchRL's ``sota-implementations/sac/sac.py``: a Hydra config with the
sections ``env``, ``collector``, ``replay_buffer``, ``optim``, ``network`` and
``logger``, TorchRL's ``SACLoss`` and ``SoftUpdate``, then a loop of sample,
loss, backward, optimiser step and target update. The difference: an
``OffPolicyCollector`` steps the envs in worker processes and writes straight
into the shared replay buffer, while this process only learns, holding
``optim.utd_ratio`` gradient updates per collected frame.

    python recipes/sac.py                                   # HalfCheetah-v5, 140k frames, 4 per update:
                                                            # 4.6 min on 2 cores
    python recipes/sac.py --config-name sac_utd1            # 40k frames at one update per frame (SB3's schedule)
    python recipes/sac.py env.name=Hopper-v5 collector.total_frames=200000
    python recipes/sac.py env.name=CheetahRun-v1              # the DeepMind Control Suite, on EnvPool
    python recipes/sac.py collector.lockstep=true           # collect, train, repeat: reproducible
    python recipes/sac.py replay_buffer.prb=true            # prioritized replay
    python recipes/sac.py resume=outputs/HalfCheetah-v5_SAC/<date>   # continue a run
    python recipes/sac.py network.device=cuda compile.compile=true compile.cudagraphs=true   # learner on a GPU

Ctrl-C saves a checkpoint to resume from.
"""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from torchrl_unilab.trainers.compile import compile_update
from torchrl_unilab.trainers.recipes_utils import make_learner, start_run


@hydra.main(config_path="config", config_name="sac", version_base="1.3")
def main(cfg: DictConfig) -> dict:
    # Denormals flushed and torch seeded; then, on the learner's device (network.device; null: cuda if available,
    # else cpu), the networks: actor, critic, and the exploration policy ([normaliser,] actor, noise) whose CPU copy
    # the workers act on; TorchRL's SACLoss (two Q-networks, learned alpha), Polyak-averaged target critics, one Adam
    learner = make_learner(cfg, "sac")
    loss_module, optimizer, target_net_updater = learner.loss_module, learner.optimizer, learner.target_net_updater
    # learner.fast_loss: the same losses as the loss module, from its own parameters, faster (None where it does not
    # apply); it has no importance weights, so prioritized replay trains with the loss module.
    loss_fn = learner.fast_loss or loss_module
    prb, priority = learner.prb, loss_module.tensor_keys.priority

    def update(batch):
        loss_td = loss_fn(batch)  # SACLoss also writes each row's "td_error" into batch
        (loss_td["loss_actor"] + loss_td["loss_qvalue"] + loss_td["loss_alpha"]).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        target_net_updater.step()
        losses = {key: value.detach() for key, value in loss_td.items()}
        if prb:  # returned, not read from batch: a CUDA graph writes into a batch of its own
            losses[priority] = batch.get(priority).detach()
        return losses

    # torch.compile, and on CUDA CUDA graphs, as the compile section asks (TorchRL's sota scripts, LeanRL)
    update = compile_update(update, cfg.compile, learner.device)

    # Replay buffer in shared memory, which the collector's workers fill in the background; the run: directory,
    # checkpoint (resume=...), logger, evaluation, collector and UTD pacing; sample(): replay_buffer.sample() for the
    # keys the losses read ("privileged" too for an asymmetric critic), into reused tensors (benchmarks/sampling.py);
    # for a GPU through pinned memory, the copy queued while the GPU still runs the previous update
    run, sample = start_run(cfg, "SAC", learner)
    utd = run.utd

    with run:  # Ctrl-C / SIGTERM: finish the update, save a checkpoint, shut the collector down
        while not run.done:  # total_frames trained on, max_minutes spent, or Ctrl-C / SIGTERM
            utd.wait()  # learner ahead: wait for data (lock-step: collect the next chunk)

            batch, info = sample()  # rows the buffer's sampler picks (prb: by priority, with their weights)
            learner.nets.normalize(batch)  # raw rows -> what the networks read (observation; privileged for its critic)
            losses = update(batch)
            sample.update_priorities(info, losses)  # prb: each row's new priority back to the buffer

            utd.step()  # collector ahead: its workers pause at the cap this moves
            run.after_update(batch, losses)  # weight publish, logging, evaluation, checkpoint when due
    return run.finish()


if __name__ == "__main__":
    main()
