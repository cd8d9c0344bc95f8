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
import torch
from omegaconf import DictConfig

from torchrl_unilab.data import BufferSampler
from torchrl_unilab.objectives import tensor_loss
from torchrl_unilab.trainers.compile import compile_update
from torchrl_unilab.trainers.device import learner_device
from torchrl_unilab.trainers.recipes_utils import (
    env_info,
    make_loss_module,
    make_networks,
    make_optimizer,
    make_replay_buffer,
)
from torchrl_unilab.trainers.run import RecipeRun
from torchrl_unilab.trainers.threads import flush_denormals


@hydra.main(config_path="config", config_name="sac", version_base="1.3")
def main(cfg: DictConfig) -> dict:
    # before any parallel op: torch's threads copy the flag at start
    flush_denormals(cfg.optim.get("flush_denormal", True))
    torch.manual_seed(cfg.env.seed)
    device = learner_device(cfg.network.device)  # TorchRL's key; null: cuda if available, else cpu

    # Networks on the learner's device: actor, critic, and the exploration policy ([normaliser,] actor, noise);
    # the workers act on a CPU copy of that policy (nets.worker_policy: the policy itself on CPU)
    nets = make_networks(cfg, "sac", env_info(cfg), device=device)

    # Loss: TorchRL's SACLoss (two Q-networks, learned alpha), Polyak-averaged target critics, one Adam
    loss_module, target_net_updater = make_loss_module(cfg, "sac", nets)
    optimizer = make_optimizer(cfg, loss_module)
    # The same losses as the loss module, from its own parameters, faster (None where it does not apply);
    # it has no importance weights, so prioritized replay trains with the loss module.
    prb, priority = cfg.replay_buffer.prb, loss_module.tensor_keys.priority
    fast_loss = tensor_loss(loss_module) if cfg.compile.fast_loss and not prb else None
    loss_fn = fast_loss or loss_module

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
    update = compile_update(update, cfg.compile, device)

    # Replay buffer in shared memory; the collector's workers fill it in the background
    replay_buffer = make_replay_buffer(cfg)
    # Run directory, checkpoint (resume=...), logger, evaluation, collector and UTD pacing
    run = RecipeRun(cfg, "SAC", nets.policy, replay_buffer, normalizer=nets.normalizer,
                    critic_normalizer=nets.critic_normalizer, worker_policy=nets.worker_policy,
                    modules={"loss": loss_module, "optimizer": optimizer, "target_updater": target_net_updater})
    utd = run.utd
    # replay_buffer.sample() for the keys the losses read (nets.sample_keys: "privileged" too for an asymmetric
    # critic), into reused tensors (benchmarks/sampling.py); for a GPU through pinned memory, the copy queued while
    # the GPU still runs the previous update
    sample = BufferSampler(replay_buffer, cfg.optim.batch_size, keys=nets.sample_keys, device=device)

    with run:  # Ctrl-C / SIGTERM: finish the update, save a checkpoint, shut the collector down
        while not run.done:  # total_frames trained on, max_minutes spent, or Ctrl-C / SIGTERM
            utd.wait()  # learner ahead: wait for data (lock-step: collect the next chunk)

            batch, info = sample()  # rows the buffer's sampler picks (prb: by priority), copied under its lock
            if prb:
                batch.set(loss_module.tensor_keys.priority_weight, info["priority_weight"])
            nets.normalize(batch)  # raw rows -> what the networks read (observation; privileged for its critic)
            losses = update(batch)
            if prb:
                replay_buffer.update_priority(info["index"], losses[priority])

            utd.step()  # collector ahead: its workers pause at the cap this moves
            run.after_update(batch, losses)  # weight publish, logging, evaluation, checkpoint when due
    return run.finish()


if __name__ == "__main__":
    main()
