"""The parent's probe: one env step with the policy, run before any worker starts.

The row it gives holds every key, shape and dtype a worker will write, so that the shared storage (a replay
buffer's, or the batch slots) is laid out before the workers start, and errors in the env or the policy
(an action of the wrong shape, a spec of varying size) are raised in the constructor, naming what to fix.
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing as mp
from collections.abc import Callable

import cloudpickle
import torch
from tensordict import TensorDict
from torch import nn
from torchrl.envs import EnvBase
from torchrl.envs.utils import ExplorationType, set_exploration_type

from torchrl_unilab.collectors._policy import PolicyFromFactory
from torchrl_unilab.collectors._worker import ActionEntry, _is_private, _truncated_keys, add_collector_keys
from torchrl_unilab.envs.resolve import BatchOfOne, as_batched_env
from torchrl_unilab.envs.specs import VaryingShapeError, varying_shape_keys

__all__ = ["probe_in_process", "probe_row", "probe_step"]


def probe_step(env: EnvBase, policy, exploration_type: ExplorationType,
               set_truncated: bool = False) -> tuple[TensorDict, TensorDict]:
    """Runs one step of ``env`` with ``policy`` in the parent, as a worker's first step runs.

    Returns one flat row holding every key a worker will write, so that the shared
    storage can be laid out before any worker starts, and one row of zeros of each
    key the policy writes besides ``"action"`` (for :attr:`WorkerConfig.policy_row`).
    The env steps the policy's own action and outputs, as in TorchRL's collectors
    (an env may check its actions: a one-hot spec, bounds). An action with as many
    elements per env as the action spec's but another shape (a scalar for a spec of
    shape ``(1,)``, which TorchRL's collectors pass to the env as is) is reshaped to
    the spec's shape, here and in the workers: the rows carry the spec's shape. An
    action with another number of elements is refused. ``env`` must have batch
    size ``[num_envs]`` (:func:`as_batched_env`).

    Examples:
        >>> from torchrl.envs import GymEnv
        >>> from torchrl.envs.utils import RandomPolicy
        >>> env = GymEnv("Pendulum-v1")
        >>> row, policy_row = probe_step(as_batched_env(env), RandomPolicy(env.action_spec), ExplorationType.RANDOM)
        >>> row["action"].shape, row["next", "observation"].shape, list(policy_row.keys())
        (torch.Size([1]), torch.Size([3]), [])
    """
    varying = varying_shape_keys(env)
    if varying:
        raise VaryingShapeError(varying)
    truncated = _truncated_keys(env) if set_truncated else []
    if set_truncated and not truncated:
        raise RuntimeError(
            "set_truncated=True needs a truncated key in the env's done keys, got "
            f"{[str(k) for k in env.done_keys]}; add them with env.add_truncated_keys() before passing the env"
        )
    td = env.reset()
    n = env.batch_size[0]
    policy_td = td.copy().set("is_init", torch.ones(n, 1, dtype=torch.bool))
    with torch.no_grad(), set_exploration_type(exploration_type):
        if isinstance(env, BatchOfOne):
            out = policy(policy_td[0]).unsqueeze(0)
        else:
            out = policy(policy_td)
    entry = ActionEntry(env)
    given_action = entry.get(out)
    action = entry.conform(given_action, n)
    if action is None:
        # Shown as the policy sees them: without the batch dimension of one an unbatched env is given.
        skip, what = (1, "the unbatched env's row") if isinstance(env, BatchOfOne) else (0, "the whole batch of envs")
        wanted = entry.key if entry.key is not None else [str(key) for key in entry.keys]
        raise ValueError(
            f"policy's action shape {entry.describe(given_action, skip)} differs from the env's action spec shape "
            f"{entry.describe_spec(skip)} (key {wanted!r}); the policy must write {wanted!r} for {what}, of the "
            "spec's shape or of any shape with as many elements (reshaped to the spec's)"
        )
    given = set(td.keys(True, True))
    keys = [key for key in out.keys(True, True)
            if key not in given and key not in (*entry.keys, "is_init") and not _is_private(key)]
    entry.set(td, action.clone())
    for key in keys:
        td.set(key, out.get(key))
    transition, _ = env.step_and_maybe_reset(td)
    have = set(transition.keys(True, True))
    for key in keys:
        if key not in have:
            transition.set(key, td.get(key))
    zeros = torch.zeros(n, dtype=torch.int64)
    add_collector_keys(transition, zeros.unsqueeze(-1), zeros, zeros)
    return transition[0].clone(), out.select(*keys)[0].clone().zero_()


def probe_in_process(env_source: EnvBase | Callable[[], EnvBase], make_policy: PolicyFromFactory,
                     exploration_type: ExplorationType, set_truncated: bool = False,
                     ) -> tuple[TensorDict, TensorDict, dict[str, torch.Tensor]]:
    """:func:`probe_step` with a policy built by ``make_policy`` from the user's ``policy_factory``, in a spawned
    process of its own when ``env_source`` is a callable (the workers are processes, and their policy may not run
    here); in this process for an env instance, whose workers are threads of it anyway.

    Returns :func:`probe_step`'s two rows and the probed policy's ``state_dict`` after its step (lazy layers then
    have their shapes: :func:`~torchrl_unilab.collectors._policy.shaped_as`).

    The spawn costs what starting a worker does (imports, a few seconds); it happens only for a
    ``policy_factory`` given without ``policy``, whose outputs cannot be known otherwise.
    """
    if isinstance(env_source, EnvBase):
        return _probe_with(as_batched_env(env_source), make_policy, exploration_type, set_truncated)
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=mp.get_context("spawn")) as pool:
        job = pool.submit(_probe_built_here, cloudpickle.dumps((env_source, make_policy)), exploration_type,
                          set_truncated)
        return job.result()


def _probe_built_here(payload: bytes, exploration_type: ExplorationType, set_truncated: bool,
                      ) -> tuple[TensorDict, TensorDict, dict[str, torch.Tensor]]:
    env_fn, make_policy = cloudpickle.loads(payload)
    env = as_batched_env(env_fn())
    try:
        return _probe_with(env, make_policy, exploration_type, set_truncated)
    finally:
        env.close(raise_if_closed=False)


def _probe_with(env: EnvBase, make_policy: PolicyFromFactory, exploration_type: ExplorationType,
                set_truncated: bool) -> tuple[TensorDict, TensorDict, dict[str, torch.Tensor]]:
    policy = make_policy(env)
    row, policy_row = probe_step(env, policy, exploration_type, set_truncated)
    state = policy.state_dict() if isinstance(policy, nn.Module) else {}
    return row, policy_row, {name: value.detach().clone() for name, value in state.items()}


def probe_row(env: EnvBase, policy, exploration_type: ExplorationType) -> TensorDict:
    """The row of :func:`probe_step`: one flat row with every key a worker will write.

    Examples:
        >>> from torchrl.envs import GymEnv
        >>> from torchrl.envs.utils import RandomPolicy
        >>> env = GymEnv("Pendulum-v1")
        >>> row = probe_row(as_batched_env(env), RandomPolicy(env.action_spec), ExplorationType.RANDOM)
        >>> sorted(row.keys())[:3]
        ['action', 'collector', 'done']
    """
    return probe_step(env, policy, exploration_type)[0]
