"""A recipe run's evaluation: the deterministic policy on envs of its own (:class:`EvalRunner`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from tensordict.nn import TensorDictModuleBase
from torchrl.envs.utils import ExplorationType, set_exploration_type

from torchrl_unilab.envs.envpool_env import EnvPoolEnv, make_gym_id_env
from torchrl_unilab.trainers.device import module_device

__all__ = ["EvalRunner"]


class EvalRunner:
    """Runs the deterministic policy for one episode on each of ``num_envs`` envs of its own.

    The policy runs on its own device (a GPU learner's actor evaluates on the
    GPU); the envs step on the CPU.

    Not TorchRL's :class:`torchrl.collectors.Evaluator`: that one runs a
    collector (in a thread or process) over an env it does not reseed. This
    one steps its own batched envs in the caller's thread and reseeds them
    before every evaluation, which keeps lock-step runs reproducible.

    The envs live in the main process, apart from the collector's, and are
    reseeded with the same seeds before every evaluation, so successive
    evaluations start from the same states and differ only by the policy.

    Args:
        env_name: a task id, run on the collector's engine (EnvPool for MuJoCo Playground and
            Control Suite ids).
        num_envs: episodes per evaluation, run as one batch.

    Keyword Args:
        seed: env ``i`` starts from ``seed + i``.
        env_kwargs: keyword arguments for ``gymnasium.make``.
        info_keys: EnvPool ``info`` entries (:meth:`EnvPoolEnv.step_info
            <torchrl_unilab.EnvPoolEnv.step_info>`) to report as ``eval/<key>``, their mean
            per step over the episodes: e.g. a Playground robot's reward terms. EnvPool tasks only.

    Examples:
        >>> import torch
        >>> from tensordict.nn import TensorDictModule
        >>> policy = TensorDictModule(torch.nn.Linear(3, 1), in_keys=["observation"], out_keys=["action"])
        >>> evaluator = EvalRunner("Pendulum-v1", 2, seed=0)
        >>> result = evaluator(policy)
        >>> sorted(result), result["eval/episode_length"]
        (['eval/episode_length', 'eval/return', 'eval/return_std'], 200.0)
        >>> evaluator.close()

        A Go1 standing still, with its velocity-tracking reward term:

        >>> standing = TensorDictModule(lambda obs: torch.zeros(len(obs), 12), in_keys=["observation"],
        ...                             out_keys=["action"])
        >>> evaluator = EvalRunner("Go1JoystickFlatTerrain-v1", 2, info_keys=["reward_tracking_lin_vel"])
        >>> 0 < evaluator(standing)["eval/reward_tracking_lin_vel"] < 1
        True
        >>> evaluator.close()
    """

    def __init__(
        self, env_name: str, num_envs: int, *, seed: int = 0, env_kwargs: Mapping[str, Any] | None = None,
        info_keys: Sequence[str] = (),
    ) -> None:
        self.seed = int(seed)
        self.env = make_gym_id_env(env_name, num_envs, seed=self.seed, env_kwargs=env_kwargs, stagger_resets=False)
        self.info_keys = list(info_keys)
        if self.info_keys and not isinstance(self.env, EnvPoolEnv):
            self.env.close()
            raise ValueError(f"info_keys needs a task EnvPool runs (its per-step info); {env_name!r} runs on "
                             f"{type(self.env).__name__}")

    @torch.no_grad()
    def __call__(self, policy: TensorDictModuleBase) -> dict[str, float]:
        """Returns ``eval/return`` (mean), ``eval/return_std`` and ``eval/episode_length`` (mean)."""
        env = self.env
        env.set_seed(self.seed)
        n = env.batch_size[0]
        returns = torch.zeros(n, dtype=torch.float64)
        lengths = torch.zeros(n, dtype=torch.int64)
        running = torch.ones(n, dtype=torch.bool)
        info_sums = {key: 0.0 for key in self.info_keys}
        td = env.reset()
        if self.info_keys:
            unknown = sorted(set(self.info_keys) - set(env.info_names))
            if unknown:
                raise ValueError(f"info_keys {unknown} are not info entries of {env.env_id}: {list(env.info_names)}")
        device = module_device(policy)
        with set_exploration_type(ExplorationType.DETERMINISTIC):
            while running.any():
                # The policy acts where it trains; the envs step on the CPU.
                td = policy(td) if device.type == "cpu" else policy(td.to(device)).to("cpu")
                transition, td = env.step_and_maybe_reset(td)
                reward = transition.get(("next", "reward")).reshape(n).double()
                returns += torch.where(running, reward, 0.0)
                lengths += running.long()
                for key in info_sums:
                    info_sums[key] += float(env.step_info(key).reshape(n)[running.numpy()].sum())
                running &= ~transition.get(("next", "done")).reshape(n)
        return {
            "eval/return": float(returns.mean()),
            "eval/return_std": float(returns.std(unbiased=False)),
            "eval/episode_length": float(lengths.double().mean()),
            **{f"eval/{key}": total / float(lengths.sum()) for key, total in info_sums.items()},
        }

    def close(self) -> None:
        """Closes the envs."""
        self.env.close()
