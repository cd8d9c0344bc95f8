"""CrossQ on a MuJoCo task, learning while workers collect in the background.

CrossQ (Bhatt et al., ICLR 2024) is SAC without target networks: the critic renormalises its batches
(``BatchRenorm1d``) and sees ``(s, a)`` and ``(s', a')`` in one pass. The shape of TorchRL's
``sota-implementations/crossq/crossq.py``: its config keys, TorchRL's ``CrossQLoss``, the critics updated on every
batch, the actor and the temperature every ``optim.policy_update_delay`` critic updates. It differs in three ways:
- the temperature is trained: the actor's step backpropagates ``loss_actor + loss_alpha`` (TorchRL's script
  backpropagates ``loss_actor`` twice, so its ``alpha`` stays at ``alpha_init``);
- the actor is the SAC recipe's, without batch renormalisation, so that the workers act with it as with SAC's;
- an ``OffPolicyCollector`` fills the shared replay buffer from worker processes while this process learns at
  ``optim.utd_ratio``, as in ``recipes/sac.py``.

    python recipes/crossq.py                                      # HalfCheetah-v5, 100k frames, critics 256 wide
    python recipes/crossq.py network.critic_hidden_sizes=[1024,1024]   # SB3-contrib's width: a GPU learner's
    python recipes/crossq.py collector.lockstep=true              # collect, train, repeat: reproducible

Ctrl-C saves a checkpoint to resume from.
"""

from __future__ import annotations

from collections.abc import Callable

import hydra
import torch
from omegaconf import DictConfig
from tensordict import TensorDictBase
from torchrl.objectives import CrossQLoss

from torchrl_unilab.trainers.compile import compile_delayed_update
from torchrl_unilab.trainers.recipes_utils import gradient_step, make_learner, start_run


def make_update(loss_module: CrossQLoss, optimizer: torch.optim.Optimizer, *,
                prb: bool = False) -> Callable[[TensorDictBase, bool], dict]:
    """``update(batch, update_actor) -> losses``: one CrossQ gradient update, the critics' and, if asked, the actor's
    and the temperature's.

    The critics step first (TorchRL's ``CrossQLoss.qvalue_loss``); then the actor climbs the updated critics, read
    with their running batch statistics (``actor_loss``), and ``alpha`` follows the actor's entropy
    (``alpha_loss``). With ``prb`` the losses also hold each row's new priority.

    Examples:
        >>> from omegaconf import OmegaConf
        >>> from tensordict import TensorDict
        >>> from torchrl_unilab.trainers.recipes_utils import env_info, make_loss_module, make_networks, make_optimizer
        >>> cfg = OmegaConf.create({"network": {"hidden_sizes": [8], "use_layer_norm": False},
        ...     "optim": {"gamma": 0.99, "loss_function": "l2", "alpha_init": 1.0, "lr": 1e-3, "weight_decay": 0.0,
        ...               "adam_eps": 1e-8}})
        >>> loss_module, _ = make_loss_module(cfg, "crossq", make_networks(cfg, "crossq", env_info(
        ...     OmegaConf.create({"env": {"name": "Pendulum-v1"}}))))
        >>> update = make_update(loss_module, make_optimizer(cfg, loss_module))
        >>> done = torch.zeros(4, 1, dtype=torch.bool)
        >>> batch = TensorDict({"observation": torch.randn(4, 3), "action": torch.rand(4, 1), ("next", "observation"):
        ...     torch.randn(4, 3), ("next", "reward"): torch.randn(4, 1), ("next", "terminated"): done,
        ...     ("next", "done"): done}, [4])
        >>> sorted(update(batch, False)), sorted(update(batch, True))
        (['loss_qvalue'], ['alpha', 'loss_actor', 'loss_alpha', 'loss_qvalue'])
    """
    priority = loss_module.tensor_keys.priority

    step = gradient_step(optimizer)  # one Adam for all networks: those a loss does not reach are left alone

    def update(batch: TensorDictBase, update_actor: bool) -> dict[str, torch.Tensor]:
        loss_qvalue, metadata = loss_module.qvalue_loss(batch)
        step(loss_qvalue)
        losses = {"loss_qvalue": loss_qvalue.detach()}
        if update_actor:
            loss_actor, actor_metadata = loss_module.actor_loss(batch)  # the critics' parameters detached
            loss_alpha = loss_module.alpha_loss(actor_metadata["log_prob"])  # log_prob detached: alpha's alone
            step(loss_actor + loss_alpha)
            losses |= {"loss_actor": loss_actor.detach(), "loss_alpha": loss_alpha.detach(),
                       "alpha": loss_module.log_alpha.detach().exp()}
        if prb:  # returned, not read from batch: a CUDA graph writes into a batch of its own
            losses[priority] = metadata["td_error"]
        return losses

    return update


@hydra.main(config_path="config", config_name="crossq", version_base="1.3")
def main(cfg: DictConfig) -> dict:
    # Denormals flushed and torch seeded; then, on the learner's device, the networks: SAC's actor, a critic with
    # batch renormalisation (network.critic_hidden_sizes wide), the exploration policy whose CPU copy the workers
    # act on; TorchRL's CrossQLoss (two Q-networks, learned alpha, no targets), one Adam with optim.beta1/beta2
    learner = make_learner(cfg, "crossq")
    update = make_update(learner.loss_module, learner.optimizer, prb=learner.prb)
    # torch.compile, and on CUDA CUDA graphs, as the compile section asks; one per value of update_actor
    updates = compile_delayed_update(update, cfg.compile, learner.device)

    # Replay buffer in shared memory, which the collector's workers fill in the background; the run: directory,
    # checkpoint (resume=...), logger, evaluation, collector and UTD pacing; sample(): the keys the losses read
    run, sample = start_run(cfg, "CrossQ", learner)
    utd, policy_delay = run.utd, cfg.optim.policy_update_delay

    with run:  # Ctrl-C / SIGTERM: finish the update, save a checkpoint, shut the collector down
        while not run.done:
            utd.wait()  # learner ahead: wait for data (lock-step: collect the next chunk)
            batch, info = sample()
            learner.nets.normalize(batch)
            losses = updates[utd.updates % policy_delay == 0](batch)  # the actor and alpha: every policy_delay-th
            sample.update_priorities(info, losses)
            utd.step()
            run.after_update(batch, losses)  # weight publish, logging, evaluation, checkpoint when due
    return run.finish()


if __name__ == "__main__":
    main()
