"""TD3 on a MuJoCo task, learning while workers collect in the background.

The task comes from gymnasium, MuJoCo Playground or the Control Suite. The
shape of TorchRL's ``sota-implementations/td3/td3.py``: a Hydra config with the
sections ``env``, ``collector``, ``replay_buffer``, ``optim``, ``network`` and
``logger``, TorchRL's ``TD3Loss`` and ``SoftUpdate``, the critics updated on
every batch, the actor (on the updated critics) and the target networks every
``optim.policy_update_delay`` critic updates. The collection differs as in
``recipes/sac.py``: an ``OffPolicyCollector`` fills the shared replay buffer
from worker processes while this process learns at ``optim.utd_ratio``.

    python recipes/td3.py                                   # HalfCheetah-v5, 130k frames, 4 per update, 16 envs
    python recipes/td3.py --config-name td3_utd1            # 40k frames at one update per frame (SB3's TD3)
    python recipes/td3.py env.name=Hopper-v5 collector.total_frames=200000
    python recipes/td3.py env.name=Go1JoystickFlatTerrain-v1 network.critic_input=privileged   # asymmetric critic
    python recipes/td3.py collector.lockstep=true           # collect, train, repeat: reproducible
    python recipes/td3.py replay_buffer.prb=true            # prioritized replay
    python recipes/td3.py resume=outputs/HalfCheetah-v5_TD3/<date>   # continue a run
    python recipes/td3.py network.device=cuda compile.compile=true compile.cudagraphs=true   # learner on a GPU

Ctrl-C saves a checkpoint to resume from.
"""

from __future__ import annotations

from collections.abc import Callable

import hydra
import torch
from omegaconf import DictConfig
from tensordict import TensorDictBase
from torchrl.objectives import TD3Loss
from torchrl.objectives.utils import TargetNetUpdater

from torchrl_unilab.trainers.compile import compile_delayed_update
from torchrl_unilab.trainers.recipes_utils import gradient_step, make_learner, start_run


def make_update(loss_module: TD3Loss, optimizer: torch.optim.Optimizer, target_net_updater: TargetNetUpdater,
                fast_loss: Callable | None = None, *, prb: bool = False) -> Callable[[TensorDictBase, bool], dict]:
    """``update(batch, update_actor) -> losses``: one TD3 gradient update, the critics' and, if asked, the actor's.

    The critics step first; then the actor climbs the updated Q1 and the targets
    follow, as in TD3 (Fujimoto et al.), SB3, CleanRL and TorchRL's sota
    ``td3.py``. ``fast_loss`` (:func:`~torchrl_unilab.objectives.tensor_loss`)
    computes the losses if given, else the loss module; with ``prb`` the
    losses also hold each row's new priority.

    Examples:
        >>> from omegaconf import OmegaConf
        >>> from tensordict import TensorDict
        >>> from torchrl_unilab.objectives import tensor_loss
        >>> from torchrl_unilab.trainers.recipes_utils import env_info, make_loss_module, make_networks, make_optimizer
        >>> cfg = OmegaConf.create({"network": {"hidden_sizes": [8], "use_layer_norm": False},
        ...     "optim": {"gamma": 0.99, "loss_function": "l2", "target_update_polyak": 0.995, "policy_noise": 0.2,
        ...               "noise_clip": 0.5, "lr": 1e-3, "weight_decay": 0.0, "adam_eps": 1e-8}})
        >>> info = env_info(OmegaConf.create({"env": {"name": "Pendulum-v1"}}))
        >>> loss_module, target = make_loss_module(cfg, "td3", make_networks(cfg, "td3", info))
        >>> update = make_update(loss_module, make_optimizer(cfg, loss_module), target, tensor_loss(loss_module))
        >>> done = torch.zeros(4, 1, dtype=torch.bool)
        >>> batch = TensorDict({"observation": torch.randn(4, 3), "action": torch.rand(4, 1), ("next", "observation"):
        ...     torch.randn(4, 3), ("next", "reward"): torch.randn(4, 1), ("next", "terminated"): done,
        ...     ("next", "done"): done}, [4])
        >>> sorted(update(batch, False)), sorted(update(batch, True))
        (['loss_qvalue'], ['loss_actor', 'loss_qvalue'])
    """
    priority = loss_module.tensor_keys.priority

    step = gradient_step(optimizer)  # one Adam for all networks: those a loss does not reach are left alone

    def update(batch: TensorDictBase, update_actor: bool) -> dict[str, torch.Tensor]:
        # One backward of both losses would have the actor climb the critic of one step before
        if fast_loss is not None:
            loss_qvalue = fast_loss.value_loss(batch)
        else:
            loss_qvalue, metadata = loss_module.value_loss(batch)
            # TD3Loss's priority: the largest TD error of the Q-networks
            batch.set(priority, metadata["td_error"].detach().max(0)[0])
        step(loss_qvalue)
        losses = {"loss_qvalue": loss_qvalue.detach()}
        if update_actor:
            loss_actor = fast_loss.actor_loss(batch) if fast_loss is not None else loss_module.actor_loss(batch)[0]
            step(loss_actor)
            target_net_updater.step()
            losses["loss_actor"] = loss_actor.detach()
        if prb:  # returned, not read from batch: a CUDA graph writes into a batch of its own
            losses[priority] = batch.get(priority)
        return losses

    return update


@hydra.main(config_path="config", config_name="td3", version_base="1.3")
def main(cfg: DictConfig) -> dict:
    # Denormals flushed and torch seeded; then, on the learner's device (network.device; null: cuda if available,
    # else cpu), the networks: deterministic actor, critic, and the exploration policy (actor + Gaussian noise) whose
    # CPU copy the workers act on; TorchRL's TD3Loss (two Q-networks, target policy smoothing), Polyak-averaged
    # targets, one Adam, and learner.fast_loss (None with prioritized replay, whose weights it does not read)
    learner = make_learner(cfg, "td3")
    update = make_update(learner.loss_module, learner.optimizer, learner.target_net_updater, learner.fast_loss,
                         prb=learner.prb)

    # torch.compile, and on CUDA CUDA graphs, as the compile section asks (TorchRL's sota scripts, LeanRL);
    # one per value of update_actor: a CUDA graph replays the branch it captured
    updates = compile_delayed_update(update, cfg.compile, learner.device)

    # Replay buffer in shared memory, which the collector's workers fill in the background; the run: directory,
    # checkpoint (resume=...), logger, evaluation, collector and UTD pacing; sample(): replay_buffer.sample() for the
    # keys the losses read, into reused tensors on the learner's device
    run, sample = start_run(cfg, "TD3", learner)
    utd, policy_delay = run.utd, cfg.optim.policy_update_delay

    with run:  # Ctrl-C / SIGTERM: finish the update, save a checkpoint, shut the collector down
        while not run.done:  # total_frames trained on, max_minutes spent, or Ctrl-C / SIGTERM
            utd.wait()  # learner ahead: wait for data (lock-step: collect the next chunk)

            batch, info = sample()  # rows the buffer's sampler picks (prb: by priority, with their weights)
            learner.nets.normalize(batch)  # raw rows -> what the networks read (observation; privileged for its critic)
            # The policy delay: the actor and the targets move on every policy_delay-th update only
            losses = updates[utd.updates % policy_delay == 0](batch)
            sample.update_priorities(info, losses)  # prb: each row's new priority back to the buffer

            utd.step()
            run.after_update(batch, losses)  # weight publish, logging, evaluation, checkpoint when due
    return run.finish()


if __name__ == "__main__":
    main()
