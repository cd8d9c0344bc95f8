"""TD3 on a gymnasium MuJoCo task, learning while workers collect in the background.

The shape of TorchRL's ``sota-implementations/td3/td3.py``: a Hydra config
with the sections ``env``, ``collector``, ``replay_buffer``, ``optim``,
``network`` and ``logger``, TorchRL's ``TD3Loss`` and ``SoftUpdate``, the
critics updated on every batch, the actor and the target networks every
``optim.policy_update_delay`` critic updates. The collection differs as in
``recipes/sac.py``: an ``OffPolicyCollector`` fills the shared replay buffer
from worker processes while this process learns at ``optim.utd_ratio``.

    python recipes/td3.py                                   # HalfCheetah-v5, ~15 min on 2 cores
    python recipes/td3.py env.name=Hopper-v5 collector.total_frames=200000
    python recipes/td3.py collector.lockstep=true           # collect, train, repeat: reproducible
    python recipes/td3.py replay_buffer.prb=true            # prioritized replay
    python recipes/td3.py resume=outputs/HalfCheetah-v5_TD3/<date>   # continue a run

Ctrl-C saves a checkpoint to resume from.
"""

from __future__ import annotations

import hydra
import torch
from omegaconf import DictConfig

from torchrl_unilab.data import BufferSampler
from torchrl_unilab.modules.normalization import normalize_batch
from torchrl_unilab.objectives import tensor_loss
from torchrl_unilab.trainers.recipes_utils import (
    env_info,
    make_loss_module,
    make_networks,
    make_optimizer,
    make_replay_buffer,
)
from torchrl_unilab.trainers.run import RecipeRun


@hydra.main(config_path="config", config_name="td3", version_base="1.3")
def main(cfg: DictConfig) -> dict:
    torch.manual_seed(cfg.env.seed)
    torch.set_num_threads(cfg.optim.num_threads)

    # Networks: deterministic actor, critic, and the exploration policy the workers run (actor + Gaussian noise)
    nets = make_networks(cfg, "td3", env_info(cfg))

    # Loss: TorchRL's TD3Loss (two Q-networks, target policy smoothing), Polyak-averaged targets, one Adam
    loss_module, target_net_updater = make_loss_module(cfg, "td3", nets)
    optimizer = make_optimizer(cfg, loss_module)
    # The same losses as the loss module, from its own parameters, faster (None where it does not apply);
    # it has no importance weights, so prioritized replay trains with the loss module.
    prb = cfg.replay_buffer.prb
    fast_loss = tensor_loss(loss_module) if cfg.compile.fast_loss and not prb else None

    def update(batch, update_actor):
        if fast_loss is not None:
            losses = fast_loss(batch, update_actor=update_actor)
        else:
            loss_qvalue, metadata = loss_module.value_loss(batch)
            losses = {"loss_qvalue": loss_qvalue}
            # TD3Loss's priority: the largest TD error of the Q-networks
            batch.set(loss_module.tensor_keys.priority, metadata["td_error"].detach().max(0)[0])
            if update_actor:
                losses["loss_actor"], _ = loss_module.actor_loss(batch)
        # One backward: the actor loss reads detached critics, so each loss reaches its own network only
        sum(losses.values()).backward()
        optimizer.step()  # the actor has no gradient on critic-only updates: Adam leaves it alone
        optimizer.zero_grad(set_to_none=True)
        if update_actor:
            target_net_updater.step()
        return {key: value.detach() for key, value in losses.items()}

    if cfg.compile.compile:
        update = torch.compile(update, mode=cfg.compile.compile_mode)

    # Replay buffer in shared memory; the collector's workers fill it in the background
    replay_buffer = make_replay_buffer(cfg)
    # Run directory, checkpoint (resume=...), logger, evaluation, collector and UTD pacing
    run = RecipeRun(cfg, "TD3", nets.policy, replay_buffer, normalizer=nets.normalizer,
                    modules={"loss": loss_module, "optimizer": optimizer, "target_updater": target_net_updater})
    utd, policy_delay = run.utd, cfg.optim.policy_update_delay
    # replay_buffer.sample() for the keys the losses read, into reused tensors (benchmarks/sampling.py)
    sample = BufferSampler(replay_buffer, cfg.optim.batch_size)

    with run:  # Ctrl-C / SIGTERM: finish the update, save a checkpoint, shut the collector down
        while not utd.done and not run.stop_requested:
            utd.wait()  # learner ahead: wait for data (lock-step: collect the next chunk)

            batch, info = sample()  # rows the buffer's sampler picks (prb: by priority), copied under its lock
            if prb:
                batch.set(loss_module.tensor_keys.priority_weight, info["priority_weight"])
            if nets.normalizer is not None:
                normalize_batch(batch, nets.normalizer)
            # The policy delay: the actor and the targets move on every policy_delay-th update only
            losses = update(batch, update_actor=utd.updates % policy_delay == 0)
            if prb:
                replay_buffer.update_priority(info["index"], batch.get(loss_module.tensor_keys.priority))

            utd.step()
            run.after_update(batch, losses)  # weight publish, logging, evaluation, checkpoint when due
    return run.finish()


if __name__ == "__main__":
    main()
