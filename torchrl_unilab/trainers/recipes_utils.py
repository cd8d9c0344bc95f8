"""Builders the SAC and TD3 recipes share, in the shape of TorchRL's ``sota-implementations/*/utils.py``.

Each ``make_*`` reads one section of the Hydra config (``env``, ``collector``,
``replay_buffer``, ``optim``, ``network``) and returns TorchRL objects, so the
recipes in ``recipes/`` read top to bottom: config, collector, networks, loss,
loop. The collector comes from :mod:`~torchrl_unilab.trainers.collection`, the run around the
loop from :mod:`~torchrl_unilab.trainers.run`.

``network.critic_input=privileged`` makes the critic asymmetric: it reads
``["privileged", "action"]`` (a MuJoCo Playground robot's critic state, see
:mod:`~torchrl_unilab.envs.task_families`) while the actor and the workers read
``"observation"`` only.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from omegaconf import DictConfig, ListConfig, OmegaConf
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModuleBase
from torch import nn
from torchrl.data import ReplayBuffer
from torchrl.objectives import CrossQLoss, LossModule, SACLoss, TD3Loss
from torchrl.objectives.utils import TargetNetUpdater

from torchrl_unilab.data import replay_buffer as _rb
from torchrl_unilab.data.buffer_sampler import SAMPLE_KEYS, BufferSampler
from torchrl_unilab.data.prioritized_sampler import SharedPrioritizedSampler
from torchrl_unilab.envs.envpool_env import make_gym_id_env
from torchrl_unilab.modules.exploration import make_collector_policy
from torchrl_unilab.modules.models import ALGOS, PassThroughActor, make_actor, make_critic
from torchrl_unilab.modules.normalization import ObservationNormalizer, normalize_batch
from torchrl_unilab.objectives import tensor_loss
from torchrl_unilab.objectives.target_update import ForeachSoftUpdate
from torchrl_unilab.trainers.collection import env_kwargs, multi_step_postproc
from torchrl_unilab.trainers.device import learner_device, learner_matmul_dtype, module_device
from torchrl_unilab.trainers.run import RecipeRun
from torchrl_unilab.trainers.threads import flush_denormals
from torchrl_unilab.trainers.training import trainable_parameters

__all__ = [
    "CRITIC_INPUTS",
    "EnvInfo",
    "Learner",
    "RECIPE_ALGOS",
    "LearnerSampler",
    "Networks",
    "acting_algo",
    "config_to_dict",
    "critic_input",
    "cpu_copy_of_policy",
    "env_info",
    "gradient_step",
    "make_learner",
    "make_loss_module",
    "make_networks",
    "make_optimizer",
    "make_replay_buffer",
    "start_run",
]

_log = logging.getLogger("torchrl.unilab")

#: The recipes' algorithms: the collector's (:data:`~torchrl_unilab.modules.models.ALGOS`), and CrossQ
#: (Bhatt et al., ICLR 2024) on TorchRL's ``CrossQLoss``, which acts as SAC does.
RECIPE_ALGOS: tuple[str, ...] = (*ALGOS, "crossq")


#: Accepted values of ``network.critic_input``: what the critic reads beside the action.
CRITIC_INPUTS: tuple[str, ...] = ("observation", "privileged")


@dataclass
class EnvInfo:
    """Dimensions and action bounds of an environment (see :func:`env_info`).

    Examples:
        >>> import torch
        >>> EnvInfo(obs_dim=3, action_dim=1, action_low=-2 * torch.ones(1), action_high=2 * torch.ones(1)).obs_dim
        3
    """

    obs_dim: int
    action_dim: int
    action_low: torch.Tensor
    action_high: torch.Tensor
    privileged_dim: int | None = None
    """Width of the env's ``"privileged"`` entry (a MuJoCo Playground robot's critic state), if it has one."""
    env_name: str | None = None


def env_info(cfg: DictConfig) -> EnvInfo:
    """Opens one env of ``cfg.env.name`` (on the collector's engine) to read its dimensions and action bounds.

    Examples:
        >>> from omegaconf import OmegaConf
        >>> info = env_info(OmegaConf.create({"env": {"name": "Pendulum-v1"}}))
        >>> info.obs_dim, info.action_dim, info.action_high.tolist()
        (3, 1, [2.0])
        >>> info = env_info(OmegaConf.create({"env": {"name": "Go1JoystickFlatTerrain-v1"}}))
        >>> info.obs_dim, info.privileged_dim, info.action_dim
        (48, 123, 12)
    """
    env = make_gym_id_env(cfg.env.name, 1, env_kwargs=env_kwargs(cfg), stagger_resets=False)
    try:
        obs = env.observation_spec
        action = env.action_spec_unbatched
        return EnvInfo(
            obs_dim=int(obs["observation"].shape[-1]),
            action_dim=int(action.shape[-1]),
            action_low=action.space.low.to(torch.float32).reshape(-1).clone(),
            action_high=action.space.high.to(torch.float32).reshape(-1).clone(),
            privileged_dim=int(obs["privileged"].shape[-1]) if "privileged" in obs.keys() else None,
            env_name=str(cfg.env.name),
        )
    finally:
        env.close()


def critic_input(cfg: DictConfig, info: EnvInfo | None = None) -> str:
    """``network.critic_input`` (default ``"observation"``), checked against :data:`CRITIC_INPUTS` and the env.

    ``"privileged"`` needs an env with a ``"privileged"`` entry (``info.privileged_dim``).

    Examples:
        >>> from omegaconf import OmegaConf
        >>> critic_input(OmegaConf.create({"network": {}}))
        'observation'
        >>> critic_input(OmegaConf.create({"network": {"critic_input": "privileged"}}),
        ...              env_info(OmegaConf.create({"env": {"name": "Pendulum-v1"}})))
        Traceback (most recent call last):
        ...
        ValueError: network.critic_input=privileged needs an env with a 'privileged' entry, and Pendulum-v1 has none; use a MuJoCo Playground robot (e.g. env.name=Go1JoystickFlatTerrain-v1) or network.critic_input=observation
    """  # noqa: E501
    value = cfg.network.get("critic_input", "observation") or "observation"
    if value not in CRITIC_INPUTS:
        raise ValueError(f"network.critic_input must be one of {CRITIC_INPUTS}, got {value!r}")
    if value == "privileged" and info is not None and info.privileged_dim is None:
        raise ValueError(
            f"network.critic_input=privileged needs an env with a 'privileged' entry, and {info.env_name} has none; "
            "use a MuJoCo Playground robot (e.g. env.name=Go1JoystickFlatTerrain-v1) or "
            "network.critic_input=observation"
        )
    return value


@dataclass
class Networks:
    """What :func:`make_networks` builds: the modules a recipe trains and acts with.

    Examples:
        >>> from omegaconf import OmegaConf
        >>> cfg = OmegaConf.create({"network": {"hidden_sizes": [8], "use_layer_norm": False}})
        >>> nets = make_networks(cfg, "td3", env_info(OmegaConf.create({"env": {"name": "Pendulum-v1"}})))
        >>> nets.normalizer is None, type(nets.policy[1]).__name__, nets.worker_policy is nets.policy
        (True, 'PerEnvMixedNoise', True)
    """

    actor: TensorDictModuleBase
    """Trained by the loss; reads normalised observations if ``normalizer`` is set."""
    critic: nn.Module
    """One Q-network; the loss makes its ensemble and target copies."""
    policy: TensorDictModuleBase
    """What the evaluation runs, on the learner's device: ``[normalizer,] actor, exploration``."""
    normalizer: ObservationNormalizer | None
    """Observation statistics, or ``None`` when ``network.obs_norm`` is off."""
    worker_policy: TensorDictModuleBase | None = None
    """What the collector's workers run: ``policy`` itself on the CPU; on a GPU, a CPU build of it holding the
    same weights, which each publish refreshes from ``policy``."""
    critic_key: str = "observation"
    """What the critic reads beside the action (``network.critic_input``)."""
    critic_normalizer: ObservationNormalizer | None = None
    """Statistics of ``"privileged"`` for an asymmetric critic with ``network.obs_norm``; the learner's alone
    (the workers' actor never reads it)."""
    multi_step: bool = False
    """Whether rows are n-step transitions (``collector.multi_step`` > 1): the losses read ``"steps_to_next_obs"``."""

    def __post_init__(self) -> None:
        if self.worker_policy is None:
            self.worker_policy = self.policy

    @property
    def sample_keys(self) -> tuple:
        """The keys the losses read from a sampled batch (:data:`~torchrl_unilab.data.buffer_sampler.SAMPLE_KEYS`,
        ``"steps_to_next_obs"`` for n-step rows, and ``"privileged"`` / ``("next", "privileged")`` for an asymmetric
        critic)."""
        keys = SAMPLE_KEYS + ("steps_to_next_obs",) * self.multi_step
        if self.critic_key == "observation":
            return keys
        return (*keys, self.critic_key, ("next", self.critic_key))

    def normalizers(self) -> list[ObservationNormalizer]:
        """Every normaliser the learner keeps up to date: the actor's, then the critic's."""
        return [n for n in (self.normalizer, self.critic_normalizer) if n is not None]

    def normalize(self, batch: TensorDictBase) -> TensorDictBase:
        """Normalises a sampled batch in place: the actor's and the critic's inputs, now and next."""
        for norm in self.normalizers():
            key = norm.in_keys[0]
            normalize_batch(batch, norm, keys=(key, ("next", key)))
        return batch


def make_networks(cfg: DictConfig, algo: str, info: EnvInfo, *, device: torch.device | str | None = None) -> Networks:
    """Actor, critic and exploration policy from the ``network`` (and ``collector``) sections.

    The policy given to the collector is ``TensorDictSequential([normalizer,]
    actor, exploration)``: its ``state_dict`` carries the actor's weights and
    the normalisation statistics, so one weight publish sends both. For TD3 the
    exploration noise is ``collector.td3_noise`` (``"constant"`` with
    ``collector.td3_std``, or ``"mixed"`` in ``[td3_std_min, td3_std_max]``).

    ``network.critic_input=privileged`` builds the critic on ``["privileged", "action"]``
    (the actor still reads ``"observation"``), with a normaliser of its own when
    ``network.obs_norm`` is on.

    ``device`` (the learner's, from
    :func:`~torchrl_unilab.trainers.device.learner_device`; default the CPU)
    is where every tensor of the networks is made: weights, the action bounds
    the SAC actor's ``TanhNormal`` reads at each call, specs, normaliser
    statistics. Off the CPU, :attr:`Networks.worker_policy` is a second, CPU
    build of the policy with the same weights, for the workers.

    Examples:
        >>> from omegaconf import OmegaConf
        >>> cfg = OmegaConf.create({"network": {"hidden_sizes": [8], "use_layer_norm": False, "obs_norm": True}})
        >>> nets = make_networks(cfg, "sac", env_info(OmegaConf.create({"env": {"name": "Pendulum-v1"}})), device="cpu")
        >>> type(nets.policy[0]).__name__, nets.actor.module[0].module[0][0].weight.device.type
        ('ObservationNormalizer', 'cpu')
    """
    acting = acting_algo(algo)
    critic_key = critic_input(cfg, info)
    critic_dim = info.obs_dim if critic_key == "observation" else info.privileged_dim
    device = torch.device("cpu") if device is None else torch.device(device)
    # The default-device context reaches every tensor the builders make, bounds and specs included, which
    # ``module.to(device)`` would leave behind (the actor's distribution keyword arguments are no buffers).
    with contextlib.nullcontext() if device.type == "cpu" else device:
        actor = _make_actor(cfg, acting, info)
        critic = make_critic(critic_dim, info.action_dim, hidden_sizes=_critic_sizes(cfg, algo),
                             use_layer_norm=bool(cfg.network.use_layer_norm), in_keys=(critic_key, "action"),
                             batch_renorm=_batch_renorm(cfg) if algo == "crossq" else None)
        policy, normalizer = _make_policy(cfg, acting, info, actor)
        critic_normalizer = (ObservationNormalizer(critic_dim, in_keys=(critic_key,))
                             if normalizer is not None and critic_key != "observation" else None)
    worker_policy = policy if device.type == "cpu" else cpu_copy_of_policy(cfg, acting, info, policy)
    return Networks(actor=actor, critic=critic, policy=policy, normalizer=normalizer, worker_policy=worker_policy,
                    critic_key=critic_key, critic_normalizer=critic_normalizer,
                    multi_step=multi_step_postproc(cfg) is not None)


def cpu_copy_of_policy(cfg: DictConfig, algo: str, info: EnvInfo, policy: TensorDictModuleBase) -> TensorDictModuleBase:
    """A CPU build of the policy :func:`make_networks` makes, loaded with ``policy``'s ``state_dict``.

    The collector's workers act on CPU; built anew (rather than moved with
    ``.to("cpu")``), every tensor of the copy is on the CPU, the actor's
    action bounds included. Its per-env exploration state is its own.

    Examples:
        >>> from omegaconf import OmegaConf
        >>> cfg = OmegaConf.create({"network": {"hidden_sizes": [8], "use_layer_norm": False}})
        >>> info = env_info(OmegaConf.create({"env": {"name": "Pendulum-v1"}}))
        >>> policy = make_networks(cfg, "sac", info).policy
        >>> copy = cpu_copy_of_policy(cfg, "sac", info, policy)
        >>> copy is not policy and all(torch.equal(a, b) for a, b in zip(copy.state_dict().values(),
        ...                                                               policy.state_dict().values()))
        True
    """
    with torch.device("cpu"):
        worker_policy, _ = _make_policy(cfg, algo, info, _make_actor(cfg, algo, info))
    worker_policy.load_state_dict(policy.state_dict())
    return worker_policy


def _make_actor(cfg: DictConfig, algo: str, info: EnvInfo) -> TensorDictModuleBase:
    net = cfg.network
    return make_actor(
        algo, info.obs_dim, info.action_dim, hidden_sizes=_hidden_sizes(net.hidden_sizes),
        use_layer_norm=bool(net.use_layer_norm), action_low=info.action_low, action_high=info.action_high,
    )


def _make_policy(cfg: DictConfig, algo: str, info: EnvInfo,
                 actor: TensorDictModuleBase) -> tuple[TensorDictModuleBase, ObservationNormalizer | None]:
    collector = cfg.get("collector") or {}
    return make_collector_policy(
        actor, algo, actor.spec, obs_norm=bool(cfg.network.get("obs_norm", False)), obs_dim=info.obs_dim,
        td3_noise=collector.get("td3_noise", "constant"),
        td3_std=float(collector.get("td3_std", 0.1)),
        td3_std_min=float(collector.get("td3_std_min", 0.001)),
        td3_std_max=float(collector.get("td3_std_max", 0.4)),
    )


def acting_algo(algo: str) -> str:
    """The collector's ``algo`` (:data:`~torchrl_unilab.modules.models.ALGOS`) a recipe's ``algo`` acts as.

    CrossQ acts as SAC does: a ``TanhNormal`` actor, sampled in the workers.

    Examples:
        >>> acting_algo("crossq"), acting_algo("td3")
        ('sac', 'td3')
    """
    if algo not in RECIPE_ALGOS:
        raise ValueError(f"algo must be one of {RECIPE_ALGOS}, got {algo!r}")
    return "sac" if algo == "crossq" else algo


def _critic_sizes(cfg: DictConfig, algo: str) -> list[int]:
    """``network.critic_hidden_sizes`` for CrossQ (TorchRL's crossq key), else ``network.hidden_sizes``."""
    sizes = cfg.network.get("critic_hidden_sizes") if algo == "crossq" else None
    return _hidden_sizes(sizes or cfg.network.hidden_sizes)


def _batch_renorm(cfg: DictConfig) -> dict[str, Any]:
    """CrossQ's batch renormalisation in the critic, from TorchRL's crossq keys and defaults."""
    net = cfg.network
    return {"momentum": float(net.get("batch_norm_momentum", 0.01)),
            "warmup_steps": int(net.get("warmup_steps", 100_000))}


def _hidden_sizes(sizes: Any) -> list[int]:
    """``network.hidden_sizes`` as a list, the width of each hidden layer."""
    sizes = list(sizes) if isinstance(sizes, (list, tuple, ListConfig)) else None
    if not sizes or any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in sizes):
        raise ValueError(f"network.hidden_sizes must be a non-empty list of ints >= 1 (e.g. [256, 256]), got {sizes!r}")
    return sizes


def make_loss_module(cfg: DictConfig, algo: str, nets: Networks) -> tuple[LossModule, TargetNetUpdater | None]:
    """TorchRL's ``SACLoss``, ``TD3Loss`` or ``CrossQLoss`` from the ``optim`` section, with its ``SoftUpdate``.

    As in TorchRL's SOTA recipes: two Q-networks, target critics (and a target
    actor for TD3), ``gamma``, ``loss_function``; SAC and CrossQ learn ``alpha``
    from ``alpha_init``; TD3 smooths its target with ``policy_noise`` clipped at
    ``noise_clip``. The target networks follow with Polyak averaging,
    ``target = polyak * target + (1 - polyak) * online`` (fused). CrossQ has no
    target networks, so no updater (``None``).

    Examples:
        >>> from omegaconf import OmegaConf
        >>> cfg = OmegaConf.create({"network": {"hidden_sizes": [8], "use_layer_norm": False},
        ...                         "optim": {"gamma": 0.99, "loss_function": "l2", "alpha_init": 1.0,
        ...                                   "target_update_polyak": 0.995}})
        >>> nets = make_networks(cfg, "sac", env_info(OmegaConf.create({"env": {"name": "Pendulum-v1"}})))
        >>> loss, updater = make_loss_module(cfg, "sac", nets)
        >>> type(loss).__name__, type(updater).__name__
        ('SACLoss', 'ForeachSoftUpdate')
    """
    optim = cfg.optim
    if algo == "sac":
        loss = SACLoss(
            actor_network=nets.actor, qvalue_network=nets.critic, num_qvalue_nets=2,
            loss_function=optim.loss_function, delay_actor=False, delay_qvalue=True,
            alpha_init=float(optim.alpha_init),
        )
    elif algo == "crossq":
        # No targets: the batch-renormalised critic sees (s, a) and (s', a') in one pass
        loss = CrossQLoss(
            actor_network=nets.actor, qvalue_network=nets.critic, num_qvalue_nets=2,
            loss_function=optim.loss_function, alpha_init=float(optim.alpha_init),
        )
    elif algo == "td3":
        # TD3Loss runs the critic on the actor's inputs: an asymmetric critic's keys pass by the actor, unread
        actor = nets.actor if nets.critic_key == "observation" else PassThroughActor(nets.actor, [nets.critic_key])
        loss = TD3Loss(
            actor_network=actor, qvalue_network=nets.critic, action_spec=nets.actor.spec,
            num_qvalue_nets=2, loss_function=optim.loss_function, delay_actor=True, delay_qvalue=True,
            policy_noise=float(optim.policy_noise), noise_clip=float(optim.noise_clip),
        )
    else:
        raise ValueError(f"algo must be one of {RECIPE_ALGOS}, got {algo!r}")
    loss.make_value_estimator(gamma=float(optim.gamma))
    device = module_device(nets.actor)
    if device.type != "cpu":
        # The networks are there already; the estimator's gamma (and any buffer made on the CPU) join them.
        loss.to(device)
    return loss, None if algo == "crossq" else ForeachSoftUpdate(loss, eps=float(optim.target_update_polyak))


def make_optimizer(cfg: DictConfig, loss_module: LossModule) -> torch.optim.Adam:
    """One Adam over every trainable parameter of the loss (actor, critics, SAC's ``log_alpha``).

    Fused (one kernel for all parameters; on CPU measurably faster than three
    ``foreach`` optimizers, see ``benchmarks/learner_throughput.py``).
    ``optim.weight_decay`` applies to the networks, never to ``log_alpha``;
    ``optim.beta1`` / ``optim.beta2`` (TorchRL's crossq keys) are Adam's betas, default ``(0.9, 0.999)``.
    With ``compile.cudagraphs=true`` on CUDA and ``compile.compile=false`` it
    is ``capturable``, which a CUDA-graph capture of ``step()`` requires
    (under ``torch.compile`` the compiler takes care of it), as in LeanRL.

    Examples:
        >>> from omegaconf import OmegaConf
        >>> cfg = OmegaConf.create({"optim": {"lr": 3e-4, "weight_decay": 0.0, "adam_eps": 1e-8}})
        >>> opt = make_optimizer(cfg, torch.nn.Linear(2, 2))
        >>> opt.defaults["fused"], len(opt.param_groups[0]["params"])
        (True, 2)
    """
    optim = cfg.optim
    params = trainable_parameters(loss_module)
    alpha = [p for p in params if p is getattr(loss_module, "log_alpha", None)]
    nets = [p for p in params if all(p is not a for a in alpha)]
    groups = [{"params": nets, "weight_decay": float(optim.weight_decay)}]
    if alpha:
        groups.append({"params": alpha, "weight_decay": 0.0})
    compile_cfg = cfg.get("compile") or {}
    capturable = (module_device(loss_module).type == "cuda" and bool(compile_cfg.get("cudagraphs", False))
                  and not bool(compile_cfg.get("compile", False)))
    betas = (float(optim.get("beta1", 0.9)), float(optim.get("beta2", 0.999)))
    return torch.optim.Adam(groups, lr=float(optim.lr), betas=betas, eps=float(optim.adam_eps), fused=True,
                            capturable=capturable)


def gradient_step(optimizer: torch.optim.Optimizer) -> Callable[[torch.Tensor], None]:
    """``step(loss)``: backward, one optimizer step, and the gradients set to ``None``.

    With one optimizer over every parameter (:func:`make_optimizer`), a loss that reaches some parameters steps
    those alone: Adam skips a parameter whose gradient is ``None``. The recipes step critics and actor apart so.

    Examples:
        >>> layer = torch.nn.Linear(2, 1)
        >>> step = gradient_step(torch.optim.Adam(layer.parameters()))
        >>> before = layer.weight.detach().clone()
        >>> step(layer(torch.ones(1, 2)).sum())
        >>> bool((layer.weight != before).all()), layer.weight.grad is None
        (True, True)
    """
    def step(loss: torch.Tensor) -> None:
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def make_replay_buffer(cfg: DictConfig) -> ReplayBuffer:
    """The shared replay buffer from the ``replay_buffer`` section (``size``, ``scratch_dir``, ``prb``).

    ``replay_buffer.prb=true`` samples with a
    :class:`~torchrl_unilab.data.prioritized_sampler.SharedPrioritizedSampler`
    (TorchRL's prioritized sampler, aware of the rows the workers write) with
    exponents ``replay_buffer.alpha`` and ``replay_buffer.beta``; the recipe
    then feeds the loss's ``td_error`` back with ``update_priority``.

    Examples:
        >>> from omegaconf import OmegaConf
        >>> rb = make_replay_buffer(OmegaConf.create({"replay_buffer": {"size": 1000, "scratch_dir": None},
        ...                                           "optim": {"batch_size": 32}}))
        >>> rb.storage.max_size
        1000
    """
    section = cfg.replay_buffer
    size = int(section.size)
    sampler = None
    if section.get("prb", False):
        sampler = SharedPrioritizedSampler(size, alpha=float(section.alpha), beta=float(section.beta))
    return _rb.make_replay_buffer(
        size, scratch_dir=section.get("scratch_dir"), batch_size=int(cfg.optim.batch_size), sampler=sampler
    )


@dataclass
class Learner:
    """What a recipe trains, as :func:`make_learner` builds it for SAC and TD3 alike.

    Examples:
        >>> from omegaconf import OmegaConf
        >>> cfg = OmegaConf.create({"env": {"name": "Pendulum-v1", "seed": 0},
        ...     "network": {"hidden_sizes": [8], "use_layer_norm": False, "device": "cpu"},
        ...     "optim": {"flush_denormal": False, "gamma": 0.99, "loss_function": "l2", "target_update_polyak": 0.995,
        ...               "policy_noise": 0.2, "noise_clip": 0.5, "lr": 1e-3, "weight_decay": 0.0, "adam_eps": 1e-8},
        ...     "replay_buffer": {"prb": True}, "compile": {"fast_loss": True}})
        >>> learner = make_learner(cfg, "td3")
        >>> type(learner.loss_module).__name__, learner.prb, learner.fast_loss is None  # prb: no fast loss
        ('TD3Loss', True, True)
    """

    device: torch.device
    """The learner's device (``network.device``), where the networks and the sampled batches are."""
    nets: Networks
    """Actor, critic and exploration policy (:func:`make_networks`)."""
    loss_module: LossModule
    """TorchRL's ``SACLoss``, ``TD3Loss`` or ``CrossQLoss`` (:func:`make_loss_module`)."""
    target_net_updater: TargetNetUpdater | None
    """The Polyak averaging of the target networks; ``None`` for CrossQ, which has none."""
    optimizer: torch.optim.Optimizer
    """One Adam over every trainable parameter of the loss (:func:`make_optimizer`)."""
    fast_loss: Callable[..., dict[str, torch.Tensor]] | None
    """The loss module's losses from its own parameters, faster
    (:func:`~torchrl_unilab.objectives.tensor_loss`); ``None`` where it does not apply, with
    ``compile.fast_loss`` off, or with prioritized replay, whose importance weights it does not read."""
    prb: bool
    """``replay_buffer.prb``: prioritized replay, whose losses return each row's new priority."""


def make_learner(cfg: DictConfig, algo: str) -> Learner:
    """The start of a recipe, as SAC and TD3 share it: the process set up, then what the learner trains.

    Flushes denormals on torch's CPU threads unless ``optim.flush_denormal``
    is off (first: torch's threads copy the flag when they start), seeds torch
    with ``env.seed``, picks the learner's device (``network.device``), and
    builds there the networks (:func:`make_networks`), TorchRL's loss with its
    target updater (:func:`make_loss_module`), one Adam
    (:func:`make_optimizer`) and the fast loss (``compile.fast_loss``, not with
    ``replay_buffer.prb``), whose matmuls run in ``optim.matmul_dtype``
    (:func:`~torchrl_unilab.trainers.device.learner_matmul_dtype`; default ``fp32``), said in the log.

    Examples:
        >>> from omegaconf import OmegaConf
        >>> cfg = OmegaConf.create({"env": {"name": "Pendulum-v1", "seed": 0},
        ...     "network": {"hidden_sizes": [8], "use_layer_norm": False, "device": "cpu"},
        ...     "optim": {"flush_denormal": False, "gamma": 0.99, "loss_function": "l2", "alpha_init": 1.0,
        ...               "target_update_polyak": 0.995, "lr": 3e-4, "weight_decay": 0.0, "adam_eps": 1e-8},
        ...     "replay_buffer": {"prb": False}, "compile": {"fast_loss": True}})
        >>> learner = make_learner(cfg, "sac")
        >>> type(learner.loss_module).__name__, learner.device.type, learner.fast_loss is not None
        ('SACLoss', 'cpu', True)
    """
    flush_denormals(cfg.optim.get("flush_denormal", True))
    torch.manual_seed(cfg.env.seed)
    device = learner_device(cfg.network.device)  # TorchRL's key; null: cuda if available, else cpu
    nets = make_networks(cfg, algo, env_info(cfg), device=device)
    loss_module, target_net_updater = make_loss_module(cfg, algo, nets)
    optimizer = make_optimizer(cfg, loss_module)
    prb = bool(cfg.replay_buffer.prb)
    if prb and not hasattr(loss_module.tensor_keys, "priority_weight"):
        raise ValueError(f"replay_buffer.prb=true needs a loss that reads importance weights; TorchRL's "
                         f"{type(loss_module).__name__} ({algo}) reads none: use replay_buffer.prb=false")
    asked = cfg.optim.get("matmul_dtype", "fp32")
    matmul_dtype = learner_matmul_dtype(asked, device)
    fast_loss = tensor_loss(loss_module, matmul_dtype) if cfg.compile.fast_loss and not prb else None
    if fast_loss is not None:
        _log.info(f"learner: the networks' matmuls in {str(matmul_dtype).removeprefix('torch.')} "
                  f"(optim.matmul_dtype={asked}); losses and weights in float32")
    elif matmul_dtype != torch.float32:
        _log.info("learner: optim.matmul_dtype applies to the fast loss only; the loss module runs in float32")
    return Learner(device=device, nets=nets, loss_module=loss_module, target_net_updater=target_net_updater,
                   optimizer=optimizer, fast_loss=fast_loss, prb=prb)


class LearnerSampler:
    """The learner's batches: a :class:`~torchrl_unilab.data.buffer_sampler.BufferSampler` with prioritized replay.

    Each call returns ``(batch, info)`` as the ``BufferSampler`` does, for the
    keys the losses read (:attr:`Networks.sample_keys`) on the learner's
    device; with prioritized replay (:attr:`Learner.prb`) the batch also holds
    the rows' importance weights, which the loss module reads, and
    :meth:`update_priorities` gives the buffer each row's new priority.

    Args:
        replay_buffer: the shared buffer the collector fills, its storage laid out.
        batch_size: rows per batch.
        learner: what the batches train (:func:`make_learner`).

    Examples:
        >>> from omegaconf import OmegaConf
        >>> from tensordict import TensorDict
        >>> cfg = OmegaConf.create({"env": {"name": "Pendulum-v1", "seed": 0},
        ...     "network": {"hidden_sizes": [8], "use_layer_norm": False, "device": "cpu"},
        ...     "optim": {"flush_denormal": False, "gamma": 0.99, "loss_function": "l2", "alpha_init": 1.0,
        ...               "target_update_polyak": 0.995, "lr": 3e-4, "weight_decay": 0.0, "adam_eps": 1e-8,
        ...               "batch_size": 4},
        ...     "replay_buffer": {"prb": True, "size": 100, "alpha": 0.7, "beta": 0.5}, "compile": {"fast_loss": True}})
        >>> learner = make_learner(cfg, "sac")
        >>> rb = make_replay_buffer(cfg)
        >>> done = torch.zeros(10, 1, dtype=torch.bool)
        >>> _ = rb.extend(TensorDict({"observation": torch.randn(10, 3), "action": torch.rand(10, 1),
        ...     ("next", "observation"): torch.randn(10, 3), ("next", "reward"): torch.randn(10, 1),
        ...     ("next", "terminated"): done, ("next", "done"): done, "policy_version": torch.ones(10)}, [10]))
        >>> sample = LearnerSampler(rb, 4, learner)
        >>> batch, info = sample()
        >>> batch["priority_weight"].shape
        torch.Size([4])
        >>> sample.update_priorities(info, {"td_error": torch.ones(4)})
    """

    def __init__(self, replay_buffer: ReplayBuffer, batch_size: int, learner: Learner) -> None:
        self.replay_buffer = replay_buffer
        self.prb = learner.prb
        self._sample = BufferSampler(replay_buffer, batch_size, keys=learner.nets.sample_keys, device=learner.device)
        keys = learner.loss_module.tensor_keys
        self._weight_key = keys.priority_weight if self.prb else None  # make_learner checks that the loss has it
        self._priority_key = keys.priority

    def __call__(self) -> tuple[TensorDictBase, dict[str, Any]]:
        """Draws one batch (the same TensorDict each call): ``(batch, info)``, ``info["index"]`` the rows."""
        batch, info = self._sample()
        if self.prb:
            batch.set(self._weight_key, info["priority_weight"])
        return batch, info

    def update_priorities(self, info: Mapping[str, Any], losses: Mapping[str, torch.Tensor]) -> None:
        """With prioritized replay, gives the buffer the new priority of each row of the batch ``info`` came with:
        the loss's ``td_error`` entry of ``losses``; without, does nothing."""
        if self.prb:
            self.replay_buffer.update_priority(info["index"], losses[self._priority_key])


def start_run(cfg: DictConfig, name: str, learner: Learner) -> tuple[RecipeRun, LearnerSampler]:
    """The run of a recipe and its batches, once its update is defined: ``(run, sample)``.

    Makes the replay buffer in shared memory (:func:`make_replay_buffer`),
    then the :class:`~torchrl_unilab.trainers.run.RecipeRun` (run directory,
    checkpoint and ``resume``, logger, evaluation, the collector whose workers
    fill the buffer, UTD pacing), which checkpoints the loss module, the
    optimiser and the target updater, and last the :class:`LearnerSampler` over
    the buffer the collector has laid out.

    Examples:
        >>> import tempfile
        >>> from pathlib import Path
        >>> from omegaconf import OmegaConf
        >>> import torchrl_unilab
        >>> log_dir = tempfile.TemporaryDirectory()
        >>> checkout = Path(torchrl_unilab.__file__).parents[1]  # the recipes' configs are in the source tree
        >>> cfg = OmegaConf.load(checkout / "recipes" / "config" / "sac.yaml")
        >>> cfg.merge_with_dotlist(["env.name=Pendulum-v1", "network.hidden_sizes=[8]", "collector.total_frames=96",
        ...     "collector.init_random_frames=64", "collector.env_per_collector=2", "collector.frames_per_batch=32",
        ...     "optim.batch_size=32", "optim.flush_denormal=false", "replay_buffer.size=1000", "logger.backend=none",
        ...     "logger.progress_bar=false", "logger.num_eval_envs=1", f"logger.log_dir={log_dir.name}"])
        >>> learner = make_learner(cfg, "sac")
        >>> run, sample = start_run(cfg, "SAC", learner)
        >>> with run:
        ...     while not run.done:  # a recipe updates between sample() and step()
        ...         run.utd.wait()
        ...         batch, info = sample()
        ...         run.utd.step()
        >>> summary = run.finish()  # doctest: +ELLIPSIS
        SAC Pendulum-v1: final eval return ...
        >>> batch.shape, summary["updates"]
        (torch.Size([32]), 8)
        >>> log_dir.cleanup()
    """
    replay_buffer = make_replay_buffer(cfg)
    nets = learner.nets
    run = RecipeRun(cfg, name, nets.policy, replay_buffer, normalizer=nets.normalizer,
                    critic_normalizer=nets.critic_normalizer, worker_policy=nets.worker_policy,
                    modules={"loss": learner.loss_module, "optimizer": learner.optimizer}
                    | ({} if learner.target_net_updater is None else {"target_updater": learner.target_net_updater}))
    return run, LearnerSampler(replay_buffer, cfg.optim.batch_size, learner)


def config_to_dict(cfg: DictConfig) -> dict[str, Any]:
    """The resolved config as plain Python containers (for checkpoints and logs).

    Examples:
        >>> from omegaconf import OmegaConf
        >>> config_to_dict(OmegaConf.create({"a": 1, "b": "${a}"}))
        {'a': 1, 'b': 1}
    """
    return OmegaConf.to_container(cfg, resolve=True)
