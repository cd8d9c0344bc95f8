"""The loop each collector worker process runs.

One code path for every batched TorchRL ``EnvBase``: pick actions (uniformly
at random during the worker's share of ``init_random_frames``, else with the
exploration policy), call ``env.step_and_maybe_reset``, tag each row with its
trajectory id, step count and policy version, and write one whole batch of
flat transitions into the shared replay buffer at a time.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import multiprocessing as mp
import os
import pickle
import signal
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import cloudpickle
import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import TensorDictModuleBase
from torchrl.envs import EnvBase
from torchrl.envs.utils import ExplorationType, set_exploration_type

from torchrl_unilab.collectors._batches import BatchSlots, SlotWriter
from torchrl_unilab.collectors._control import STREAM_TRAJ_BITS, FrameControl, stream_seed
from torchrl_unilab.collectors._policy import PolicyFromFactory
from torchrl_unilab.collectors._processes import (
    report_error,
    restore_stderr,
    worker_started,
)
from torchrl_unilab.collectors.metrics import CollectorMetrics
from torchrl_unilab.collectors.trace import PhaseTimer
from torchrl_unilab.envs.envpool_env import EnvPoolEnv
from torchrl_unilab.envs.resolve import BatchOfOne, as_batched_env, seed_env
from torchrl_unilab.modules._fast_policy import tensor_policy
from torchrl_unilab.weight_update.weight_sync import SharedWeights

#: Keys the worker adds to every row, beside the env's own.
TRAJ_KEY = ("collector", "traj_ids")
STEP_KEY = "step_count"
NEXT_STEP_KEY = ("next", "step_count")
VERSION_KEY = "policy_version"
#: Policy version stored on rows whose action was drawn uniformly at random.
RANDOM_VERSION = -1


#: Every env of the batch.
_ALL = slice(None)


class ActionEntry:
    """Where an env takes its action: one key (a tensor), or several (TorchRL's multi-key envs: a TensorDict of them).

    Examples:
        >>> from torchrl.envs import GymEnv
        >>> entry = ActionEntry(GymEnv("Pendulum-v1"))
        >>> entry.key, entry.shape
        ('action', (1,))
    """

    def __init__(self, env: EnvBase) -> None:
        keys = list(env.action_keys)
        self.keys = keys
        #: the one action key, or None for several
        self.key = keys[0] if len(keys) == 1 else None
        self.spec = env.full_action_spec[self.key] if self.key is not None else env.full_action_spec
        self.shape = tuple(self.spec.shape)

    def get(self, td: TensorDictBase):
        """The action(s) in ``td``: a tensor, or a TensorDict of every action key; ``None`` if one is missing."""
        if self.key is not None:
            return td.get(self.key, None)
        return td.select(*self.keys) if all(key in td.keys(True) for key in self.keys) else None

    def set(self, td: TensorDictBase, action) -> None:
        if self.key is not None:
            td.set(self.key, action)
        else:
            td.update(action)

    def conform(self, action, n: int):
        """``action`` (of ``n`` envs) with the env's action shape: as given, or reshaped to the spec where each
        env's action has as many elements as the spec's (a scalar for a spec of shape ``(1,)``, which TorchRL's
        collectors hand to the env as is); ``None`` if an action is missing or has another number of elements.

        Examples:
            >>> from torchrl.envs import GymEnv, SerialEnv
            >>> entry = ActionEntry(SerialEnv(2, lambda: GymEnv("Pendulum-v1")))
            >>> entry.conform(torch.zeros(2), 2).shape, entry.conform(torch.zeros(2, 2), 2)
            (torch.Size([2, 1]), None)
        """
        if action is None:
            return None
        if self.key is not None:
            return _conform(action, n, self.shape[1:])
        if tuple(action.batch_size[:1]) != (n,):
            return None
        values = {key: _conform(action.get(key, None), n, tuple(self.spec[key].shape[1:])) for key in self.keys}
        if any(value is None for value in values.values()):
            return None
        if all(value is action.get(key) for key, value in values.items()):
            return action
        return action.empty().update(values)

    def describe(self, action, skip: int) -> str:
        if action is None:
            return "no action"
        if self.key is not None:
            return str(tuple(action.shape)[skip:])
        return str({str(key): tuple(action.get(key).shape)[skip:] for key in self.keys})

    def describe_spec(self, skip: int) -> str:
        if self.key is not None:
            return str(self.shape[skip:])
        return str({str(key): tuple(self.spec[key].shape)[skip:] for key in self.keys})


def _conform(value: torch.Tensor | None, n: int, shape: tuple) -> torch.Tensor | None:
    """``value`` as ``[n, *shape]``: as it is, reshaped if it holds ``n`` times the elements of ``shape``
    (``[n]`` first), else ``None`` (and for no value)."""
    if value is None:
        return None
    if value.shape == (n, *shape):
        return value
    if value.dim() >= 1 and value.shape[0] == n and value.numel() == n * math.prod(shape):
        return value.reshape(n, *shape)
    return None


#: Accepted values of ``nonfinite``.
NONFINITE_MODES = ("raise", "drop", "reset")


class NonFiniteError(ValueError):
    """A worker's env produced NaN or infinite values."""


@dataclass
class WorkerConfig:
    """What every worker loop needs to know, gathered once and handed down."""

    num_workers: int
    frames_per_batch: int
    num_envs: int
    random_frames: list[int]
    seed: int | None
    exploration_type: ExplorationType
    row_keys: list
    nonfinite: str = "raise"
    #: torch threads of a worker process; 0 leaves the setting alone (a thread worker shares the learner's).
    num_threads: int = 1
    #: seed the process-wide torch RNG (not in a thread worker: that RNG is the learner's).
    seed_torch: bool = True
    #: each worker's seed stream: 0 at first, one more for each process that took the worker's place.
    streams: list[int] = field(default_factory=list)
    #: one row of zeros of each key the policy writes besides ``"action"`` (see :func:`probe_step`): rows keep
    #: those keys, as TorchRL's collectors keep them; rows of uniformly random actions hold zeros there.
    policy_row: TensorDictBase | None = None
    #: TorchRL's ``set_truncated``: the last step of each batch is marked truncated (and done) in the rows.
    set_truncated: bool = False

    def stream(self, worker_idx: int) -> int:
        return self.streams[worker_idx] if self.streams else 0

    def env_seed(self, worker_idx: int) -> int | None:
        """Env ``j`` of worker ``i`` on stream ``s`` is seeded ``seed + (s * num_workers + i) * num_envs + j``.

        All distinct: stream 0 takes the first ``num_workers * num_envs`` seeds, each later stream the next block.
        """
        return stream_seed(self.seed, worker_idx, self.stream(worker_idx), self.num_workers, self.num_envs)

    def torch_seed(self, worker_idx: int) -> int | None:
        """The worker's torch seed (random actions, exploration noise): a hash of ``seed``, its stream and the worker.

        Never ``seed`` or an offset of it: a training script seeds its own torch RNG with the seed it gives the
        collector (the recipes, TorchRL's sota scripts) and draws its networks' initial weights from it. A
        worker seeded alike would replay those draws: its uniformly random warm-up actions would be the actor's
        first-layer weights divided by their bound, row for row. ``numpy.random.SeedSequence``
        hashes ``(seed, stream, worker)`` into an unrelated 64-bit seed, distinct per worker and stream.
        """
        if self.seed is None:
            return None
        key = (self.stream(worker_idx), worker_idx)
        return int(np.random.SeedSequence(self.seed % 2**64, spawn_key=key).generate_state(1, np.uint64)[0])


@dataclass
class LoopHooks:
    """Optional behaviour around the worker loop (the function-level API uses these).

    Attributes:
        timer: times the phases, and writes a trace when it has a path.
        extra_syncs: further ``(SharedWeights, module)`` pairs refreshed with the weights,
            e.g. observation-normaliser statistics.
        between_steps: called after every env step (collector-side batch packing).
        after_write: called after every buffer write; returns False to end the loop
            (metrics messages, the lock-step token).
        while_waiting: called while the worker waits for its frame allowance
            (the lock-step handshake, batch packing).
    """

    timer: PhaseTimer = field(default_factory=PhaseTimer)
    extra_syncs: list = field(default_factory=list)
    between_steps: Callable[[], None] | None = None
    after_write: Callable[[], bool] | None = None
    while_waiting: Callable[[], None] | None = None
    before_batch: Callable[[], None] | None = None
    postproc: Callable[[TensorDictBase], TensorDictBase] | None = None
    after_batch: Callable[[TensorDictBase], None] | None = None


def apply_postproc(postproc: Callable[[TensorDictBase], TensorDictBase], batch: TensorDictBase) -> TensorDictBase:
    """``postproc`` on a ``[steps, envs]`` batch laid out as TorchRL's collectors give it, envs first and time
    last (``MultiStep`` sums rewards along the last dimension); returns the rows flat, step-major, as workers
    write them (env-major if ``postproc`` flattened the batch itself).

    Examples:
        >>> from tensordict import TensorDict
        >>> batch = TensorDict({"t": torch.arange(3).repeat_interleave(2).reshape(3, 2)}, [3, 2])  # 3 steps, 2 envs
        >>> seen = []
        >>> apply_postproc(lambda td: seen.append(td["t"].tolist()) or td, batch)["t"].tolist()
        [0, 0, 1, 1, 2, 2]
        >>> seen
        [[[0, 1, 2], [0, 1, 2]]]
    """
    out = postproc(batch.transpose(0, 1))
    return (out.transpose(0, 1) if out.batch_dims == 2 else out).reshape(-1)


def add_collector_keys(transition: TensorDictBase, step_count, traj_ids, version) -> TensorDictBase:
    """Tags transitions with trajectory ids, step counts and the policy version per row.

    Works on one step (batch ``[num_envs]``) or stacked steps (``[T, num_envs]``).
    The tensors are stored as they are: callers must not modify them in place afterwards.
    """
    transition.set(STEP_KEY, step_count)
    transition.set(NEXT_STEP_KEY, step_count + 1)
    transition.set(TRAJ_KEY, traj_ids)
    transition.set(VERSION_KEY, version)
    return transition


class WorkerLoop:
    """The collection loop of one worker: act, step, tag, write, repeat.

    Args:
        worker_idx: this worker's index (trajectory ids and seeds derive from it).
        cfg: the shared :class:`WorkerConfig`.
        env: a batched TorchRL env, batch size ``[num_envs]``.
        policy: the exploration policy; ``weights`` are loaded into ``sync_module``.
        replay_buffer: the shared buffer rows are written into.
        weights: the learner's published weights.
        metrics: shared counters this worker updates.
        control: frame allowance; ``None`` collects without limit.
        stop_event: ends the loop when set.
        hooks: optional extras (:class:`LoopHooks`).
        sync_module: the module the weights belong to; ``policy`` by default.
    """

    def __init__(self, worker_idx: int, cfg: WorkerConfig, env: EnvBase, policy, replay_buffer,
                 weights: SharedWeights, metrics: CollectorMetrics, control: FrameControl | None, stop_event,
                 hooks: LoopHooks | None = None, sync_module=None) -> None:
        self.idx = worker_idx
        self.cfg = cfg
        self.env = env
        self.policy = policy
        self.rb = replay_buffer
        self.metrics = metrics
        self.control = control
        self.stop_event = stop_event
        self.hooks = hooks or LoopHooks()
        self.timer = self.hooks.timer
        self.syncs = [(weights, sync_module if sync_module is not None else policy), *self.hooks.extra_syncs]
        # An unbatched env is stepped with a batch dimension of one; its policy sees rows without one, as in
        # TorchRL's collectors (a RandomPolicy or spec-shaped module built from the env's unbatched spec).
        self.unbatched = isinstance(env, BatchOfOne)
        self.action = ActionEntry(env)
        self.fast_policy = tensor_path(policy, env, cfg.exploration_type)
        self.policy_keys = [] if cfg.policy_row is None else list(cfg.policy_row.keys(True, True))
        #: the policy's keys that the env leaves out of its transitions (found on the first step), copied in
        self._policy_keys_dropped: list | None = None if self.policy_keys else []
        # Whether the policy's keys go into the root the env steps, as TorchRL's collectors put them there. Not for
        # the tensor-level policy: its outputs (a distribution's loc and scale) are read by no env or transform,
        # and carrying them through a TorchRL env stack costs time at every step. Otherwise known after the
        # first step (dropped_policy_values).
        self._policy_keys_in_root = self.fast_policy is None
        self._truncated_keys = _truncated_keys(env) if cfg.set_truncated else []
        self.random_left = cfg.random_frames[worker_idx]
        n = cfg.num_envs
        self.steps_per_batch = cfg.frames_per_batch // n
        self.step_count = torch.zeros(n, 1, dtype=torch.int64)
        # Trajectory ids are unique across workers without any coordination, and across a worker's
        # seed streams: each stream numbers its trajectories from its own block of 2**32.
        first = cfg.stream(worker_idx) << STREAM_TRAJ_BITS
        self.traj_ids = (torch.arange(n, dtype=torch.int64) + first) * cfg.num_workers + worker_idx
        self.next_traj = first + n
        self.ep_return = torch.zeros(n, dtype=torch.float64)
        # The env's own keys, nested ones included (TorchRL's multi-agent and nested envs).
        self._done_key, self._terminated_key = _done_entry(env, "done"), _done_entry(env, "terminated")
        self._reward_key = ("next", *_as_tuple(env.reward_keys[0]))
        self._policy_zeros = (None if cfg.policy_row is None else
                              cfg.policy_row.unsqueeze(0).expand(n, *cfg.policy_row.shape).clone())
        self._version_rows = (self.version, torch.full((n,), self.version, dtype=torch.int64))
        #: The policy's private TensorDict state (see _carry_policy_state), per lane.
        self._policy_state: dict[tuple, TensorDictBase] = {}
        # EnvPoolEnv's own lanes only: a TransformedEnv forwards attribute reads to its base env,
        # and stepping that base env's lanes directly would skip the transforms.
        self.lanes = LanePolicyState(policy, env.lanes) if type(env) is EnvPoolEnv and env.lanes > 1 else None

    @property
    def version(self) -> int:
        """Version of the actor weights in use."""
        return self.syncs[0][0].loaded_version

    def sync_weights(self) -> None:
        for i, (weights, module) in enumerate(self.syncs):
            # Each handle remembers the version it loaded last, so this is one header read.
            if weights.load_into(module) is not None and i == 0:
                self.metrics.set(self.idx, policy_version=self.version)

    def act(self, td: TensorDictBase, envs: slice = _ALL) -> tuple[torch.Tensor, dict]:
        """Sets the action (``td[env.action_key]``) of the envs ``envs`` (``td`` holds their rows); returns their
        policy versions and what else the policy wrote (for :meth:`dropped_policy_values`)."""
        n = len(td)
        n_random = min(self.random_left, n)
        outputs = None
        if n_random < n:
            # A shallow copy: modules such as an observation normaliser may
            # overwrite keys, and the buffer must keep the env's raw values.
            is_init = self.step_count[envs] == 0
            if self.fast_policy is not None:  # only built for ExplorationType.RANDOM
                outputs = dict(td.items())
                outputs["is_init"] = is_init
                action = self.fast_policy(outputs)  # writes its outputs into the dict
            else:
                with torch.no_grad(), set_exploration_type(self.cfg.exploration_type):
                    policy_td = td.copy()
                    policy_td.set("is_init", is_init)
                    carried = self._policy_state.get(_lane_key(envs))
                    if carried is not None:
                        policy_td.update(carried)
                    if self.unbatched:
                        policy_td = self.policy(policy_td[0]).unsqueeze(0)
                    else:
                        policy_td = self.policy(policy_td)
                    action = self.action.get(policy_td)
                    self._carry_policy_state(policy_td, envs)
                outputs = policy_td
            shaped = self.action.conform(action, n)
            if shaped is None:
                raise ValueError(
                    f"policy returned an action of shape {self.action.describe(action, 0)}, the env's action_spec "
                    f"is {self.action.describe_spec(0)} (an action with its number of elements is reshaped to it)"
                )
            action = shaped.detach().clone()
        else:
            action = None
        if self._version_rows[0] != self.version:
            n_all = self.cfg.num_envs
            self._version_rows = (self.version, torch.full((n_all,), self.version, dtype=torch.int64))
        version = self._version_rows[1][envs]  # stored in every row as is: replaced, never modified in place
        if n_random:
            random_action = self.action.spec.rand()[envs]
            action = random_action if action is None else torch.cat([random_action[:n_random], action[n_random:]])
            self.random_left -= n_random
            version = version.clone()
            version[:n_random] = RANDOM_VERSION
        self.action.set(td, action)
        written = {key: self._policy_zeros.get(key)[envs] if outputs is None else outputs[key]
                   for key in self.policy_keys}
        if self._policy_keys_in_root:  # as TorchRL's collectors put them there
            for key, value in written.items():
                td.set(key, value)
        return version, written

    def dropped_policy_values(self, transition: TensorDictBase, written: dict) -> list[torch.Tensor]:
        """The policy's values (``written`` by :meth:`act`) of the keys ``transition``'s env left out, in the
        order of ``_policy_keys_dropped``; they are set on the whole batch once its steps are stacked."""
        if self._policy_keys_dropped is None:
            have = set(transition.keys(True, True))
            self._policy_keys_dropped = [key for key in self.policy_keys if key not in have]
            # An env whose transitions drop them all (ours build new ones) does not read them: from now on they
            # skip the root and go straight into the batch: set once per batch, not copied through the root or
            # into each step's transition.
            self._policy_keys_in_root = len(self._policy_keys_dropped) < len(self.policy_keys)
        return [written[key] for key in self._policy_keys_dropped]

    def _carry_policy_state(self, policy_td: TensorDictBase, envs: slice) -> None:
        """Keeps the entries under private ``"_"`` keys the policy wrote, for its next call on ``envs``.

        TorchRL's exploration modules keep per-env state in the TensorDict (the OU
        process's ``"_ou_prev_noise"`` and ``"_ou_steps"``), which TorchRL's
        collectors carry from step to step; the rows stored never hold it.
        """
        private = [key for key in policy_td.keys() if isinstance(key, str) and key.startswith("_")]
        if private:
            self._policy_state[_lane_key(envs)] = policy_td.select(*private)

    def end_episodes(self, transition: TensorDictBase, envs: slice = _ALL) -> None:
        """Counts the step of the envs ``envs`` (``transition`` holds their rows), and starts their new episodes."""
        # numpy views of the step's tensors: a few element-wise ops cost less there than in torch.
        done = _per_env(transition.get(self._done_key).numpy(), np.any)
        ep_return = self.ep_return.numpy()[envs]
        ep_return += _per_env(transition.get(self._reward_key).numpy(), np.sum)
        # New tensors, never in-place updates: the stored rows hold the old ones.
        if envs == _ALL:
            step_count = self.step_count + 1
        else:
            step_count = self.step_count.clone()
            step_count[envs] += 1
        if done.any():
            idx = np.flatnonzero(done)
            first = envs.start or 0
            self.metrics.record_episodes(
                self.idx,
                returns=ep_return[idx].tolist(),
                lengths=step_count.numpy()[idx + first, 0].tolist(),
                terminated=(done if self._terminated_key is None else
                            _per_env(transition.get(self._terminated_key).numpy(), np.any))[idx].tolist(),
            )
            self.step_count = step_count
            self._new_trajectories(idx + first)
        else:
            self.step_count = step_count

    def _new_trajectories(self, ids: np.ndarray) -> None:
        """Envs ``ids`` (of the whole batch) start new trajectories: new ids, step 0, return 0."""
        self.ep_return.numpy()[ids] = 0
        new_ids = np.arange(self.next_traj, self.next_traj + len(ids), dtype=np.int64)
        traj_ids, step_count = self.traj_ids.clone(), self.step_count.clone()
        traj_ids.numpy()[ids] = new_ids * self.cfg.num_workers + self.idx
        step_count.numpy()[ids] = 0
        self.traj_ids, self.step_count = traj_ids, step_count
        self.next_traj += len(ids)

    def reset_nonfinite(self, transition: TensorDictBase, td: TensorDictBase) -> TensorDictBase:
        """``nonfinite="reset"``: resets the envs whose step gave a non-finite value; returns the next root.

        Their transitions are dropped with the batch's other non-finite rows
        (:meth:`finite_rows`); reset now, the env's next step starts from a sound
        state rather than from the NaN one.
        """
        bad = None
        for value in transition.get("next").values(include_nested=True, leaves_only=True):
            if value.is_floating_point():
                ok = torch.isfinite(value).reshape(len(transition), -1).all(-1)
                bad = ~ok if bad is None else bad | ~ok
        if bad is None or not bool(bad.any()):
            return td
        reset = self.env.reset(TensorDict({"_reset": bad.reshape(self.env.full_done_spec["done"].shape)},
                                          batch_size=self.env.batch_size))
        td = td.clone()  # the root may share tensors with the stored transition
        for key in td.keys(include_nested=True, leaves_only=True):
            if key in reset.keys(include_nested=True, leaves_only=True):
                td.get(key)[bad] = reset.get(key)[bad]
        self._new_trajectories(np.flatnonzero(bad.numpy()))
        self.metrics.add(self.idx, nonfinite_resets=int(bad.sum()))
        return td

    def should_stop(self) -> bool:
        """True once ``stop_event`` is set or the parent process is gone (no orphaned workers)."""
        return self.stop_event.is_set() or not _parent_alive()

    def wait_for_claim(self) -> bool:
        if self.control is None:
            return not self.should_stop()
        frames = self.cfg.frames_per_batch
        with self.timer("wait"):
            claimed = self.control.wait(lambda: self.should_stop() or self.control.claim(frames, self.idx),
                                        timeout=None, on_poll=self.hooks.while_waiting or (lambda: None))
        return claimed and not self.should_stop()

    def finite_rows(self, batch: TensorDictBase) -> TensorDictBase:
        """Raises on non-finite values (``nonfinite="raise"``), or drops the rows holding them ("drop", "reset").

        One ``isfinite`` per float key of the whole ``[steps, num_envs]`` batch (flat after a ``postproc``):
        cheap next to the env steps. Returns the rows kept, flat.
        """
        bad = None
        for key, value in batch.items(include_nested=True, leaves_only=True):
            if not value.is_floating_point():
                continue
            ok = torch.isfinite(value).reshape(*batch.shape, -1).all(-1)
            if bool(ok.all()):
                continue
            if self.cfg.nonfinite == "raise":
                # [steps, envs], or flat step-major once a postproc ran
                step, env = divmod(int((~ok).reshape(-1).nonzero()[0]), self.cfg.num_envs)
                raise NonFiniteError(
                    f"non-finite value in key {key!r} from env {env} of worker {self.idx}, step {step} of the batch "
                    f"(frames written before it: {self.metrics.worker(self.idx)['frames']}; BatchedGymEnv reports a "
                    "step MuJoCo found unstable as a NaN reward); pass nonfinite='drop' to drop such transitions, "
                    "or nonfinite='reset' to drop them and reset their env"
                )
            bad = ~ok if bad is None else bad | ~ok
        if bad is None:
            return batch.reshape(-1)
        self.metrics.add(self.idx, nonfinite_dropped=int(bad.sum()))
        return batch[~bad]  # flat already (a boolean mask over both batch dimensions)

    def run(self) -> None:
        """Collects until ``stop_event`` is set (or a hook ends the loop)."""
        with torch.no_grad():  # once for the loop rather than once per step: nothing here backpropagates
            self._run()

    def _run(self) -> None:
        cfg, env, phase, hooks = self.cfg, self.env, self.timer, self.hooks
        if cfg.num_threads:
            torch.set_num_threads(cfg.num_threads)
        if cfg.seed is not None:
            if cfg.seed_torch:
                torch.manual_seed(cfg.torch_seed(self.idx))
            seed_env(env, cfg.env_seed(self.idx))
        self.sync_weights()
        td = env.reset()
        self.metrics.start(self.idx)
        steps = self._lane_steps(td) if self.lanes is not None else self._batch_steps(td)
        while self.wait_for_claim():
            if hooks.before_batch is not None:
                hooks.before_batch()
            rows, tags = [], []
            for _ in range(self.steps_per_batch):
                if self.stop_event.is_set():
                    return
                with phase("weight check"):
                    self.sync_weights()
                for row, tag in next(steps):
                    rows.append(row)
                    # Tagged once per batch below: a TensorDict set per key and step costs more than the stacking.
                    tags.append(tag)
                if self.hooks.between_steps is not None:
                    self.hooks.between_steps()
            with phase("buffer write"):
                shape = (self.steps_per_batch, cfg.num_envs)  # lanes' rows, step by step, are whole steps
                step_counts, traj_ids, versions, *policy_values = (
                    torch.stack(tag).reshape(*shape, *tag[0].shape[1:]) for tag in zip(*tags))
                batch = add_collector_keys(torch.stack(rows).reshape(shape), step_counts, traj_ids, versions)
                for key, value in zip(self._policy_keys_dropped or (), policy_values):
                    batch.set(key, value)
                if self._truncated_keys:
                    mark_truncated(batch, self._truncated_keys)
                if hooks.postproc is not None:
                    # On whole trajectories, before rows are dropped; the keys it adds are among the rows' keys.
                    batch = apply_postproc(hooks.postproc, batch)
                batch = self.finite_rows(batch.select(*cfg.row_keys, strict=True))
                random_frames = int((versions == RANDOM_VERSION).sum())
                if len(batch):  # every row of it may have been dropped
                    if self.control is not None and TRAJ_KEY in batch.keys(True) and STEP_KEY in batch.keys():
                        # what the parent looks for in the buffer should this process die before counting
                        self.control.writing_(self.idx, (int(batch[TRAJ_KEY][0]), int(batch[STEP_KEY][0])),
                                              random_frames)
                    self.rb.extend(batch)
            if hooks.after_batch is not None:
                hooks.after_batch(batch)
            totals = phase.take_totals()
            self.metrics.add(
                self.idx,
                frames=cfg.frames_per_batch,
                random_frames=random_frames,
                **{f"time_{name}": totals.get(label, 0.0) for name, label in _METRIC_PHASES.items()},
            )
            # Counted last: a consumer that waits for the count then reads metrics that include this batch.
            if self.control is not None:
                self.control.written_(cfg.frames_per_batch, self.idx, random_frames)
            if self.hooks.after_write is not None and not self.hooks.after_write():
                return

    def _batch_steps(self, td: TensorDictBase) -> Iterator[list[tuple[TensorDictBase, tuple]]]:
        """Steps the whole batch at once; yields each step's ``[(transition, tags)]``."""
        phase = self.timer
        while True:
            with phase("actor inference"):
                version, written = self.act(td)
            with phase("env step"):
                transition, td = self.env.step_and_maybe_reset(td)
                # the policy's keys the env dropped: tags too, set once per batch
                tags = (self.step_count, self.traj_ids, version, *self.dropped_policy_values(transition, written))
                self.end_episodes(transition)
                if self.cfg.nonfinite == "reset":
                    td = self.reset_nonfinite(transition, td)
            yield [(transition, tags)]

    def _lane_steps(self, td: TensorDictBase) -> Iterator[list[tuple[TensorDictBase, tuple]]]:
        """Steps an env's lanes in turn, the policy of each overlapping the physics of the others.

        Yields each step's ``[(transition, tags)]``, one per lane in lane order. A lane's next
        action is computed and sent as soon as its step is received, so at the end of a batch
        every lane has its next step in flight, which the next batch receives.
        """
        env, phase, lanes = self.env, self.timer, self.env.lane_slices
        if self.cfg.nonfinite == "reset":
            # A partial reset would reach pools whose steps are in flight.
            raise ValueError("nonfinite='reset' needs an env without lanes (EnvPoolEnv(lanes=1)); use "
                             "nonfinite='drop' with lanes")
        in_flight: list[tuple | None] = [None] * len(lanes)
        policy_written: list[dict | None] = [None] * len(lanes)

        def launch(lane: int, root: TensorDictBase) -> None:
            envs = lanes[lane]
            with self.lanes.policy_state(lane):
                version, policy_written[lane] = self.act(root, envs)
            in_flight[lane] = (self.step_count[envs], self.traj_ids[envs], version)
            env.send_lane(lane, root)

        with phase("actor inference"):
            for lane, envs in enumerate(lanes):
                launch(lane, td[envs])
        while True:
            step = []
            for lane, envs in enumerate(lanes):
                with phase("env step"):  # mostly the wait for this lane's C++ step
                    transition, root = env.recv_lane(lane)
                    step.append((transition, (*in_flight[lane],
                                              *self.dropped_policy_values(transition, policy_written[lane]))))
                    self.end_episodes(transition, envs)
                with phase("actor inference"):
                    launch(lane, root)
            yield step

    def close(self, close_env: bool = True) -> None:
        """Closes the env (unless its owner does), the shared-memory handles, and writes the trace."""
        if close_env:
            with contextlib.suppress(Exception):  # best effort while exiting
                self.env.close()
        for weights, _ in self.syncs:
            weights.close()
        self.timer.save()


class LanePolicyState:
    """Keeps the policy's per-env state apart for each lane of a laned env.

    Exploration modules keep per-env state in non-persistent buffers (e.g.
    :class:`~torchrl_unilab.modules.exploration.PerEnvMixedNoise`'s stds), sized
    by the batch they see. With lanes the policy sees one lane at a time, so each
    lane gets its own copy of those buffers, swapped in around its policy call.

    Examples:
        >>> from tensordict import TensorDict
        >>> from torchrl.data import Bounded
        >>> from torchrl_unilab.modules.exploration import PerEnvMixedNoise
        >>> noise = PerEnvMixedNoise(Bounded(-1.0, 1.0, shape=(2,)), std_min=0.0, std_max=1.0)
        >>> state = LanePolicyState(noise, lanes=2)
        >>> td = TensorDict({"action": torch.zeros(3, 2), "is_init": torch.ones(3, 1, dtype=torch.bool)}, [3])
        >>> with state.policy_state(0):
        ...     _ = noise(td.clone())
        >>> with state.policy_state(1):
        ...     noise.stds.shape  # lane 1 has drawn no stds yet
        torch.Size([0, 1])
    """

    def __init__(self, policy, lanes: int) -> None:
        modules = policy.modules() if isinstance(policy, torch.nn.Module) else ()
        self._slots = [(m, name) for m in modules for name in sorted(m._non_persistent_buffers_set)]  # noqa: SLF001
        self._saved = [[m._buffers[name] for m, name in self._slots] for _ in range(lanes)]  # noqa: SLF001

    @contextlib.contextmanager
    def policy_state(self, lane: int) -> Iterator[None]:
        """Runs the ``with`` block with ``lane``'s per-env buffers in the policy."""
        saved = self._saved[lane]
        for (module, name), value in zip(self._slots, saved):
            module._buffers[name] = value  # noqa: SLF001
        try:
            yield
        finally:
            saved[:] = [m._buffers[name] for m, name in self._slots]  # noqa: SLF001


def _lane_key(envs: slice) -> tuple:
    return (envs.start, envs.stop)


def _parent_alive() -> bool:
    parent = mp.parent_process()
    return parent is None or parent.is_alive()


#: Metrics counter name -> trace phase name.
_METRIC_PHASES = {
    "env_step": "env step",
    "policy": "actor inference",
    "buffer_write": "buffer write",
    "weight_sync": "weight check",
    "pack": "pack",
    "wait": "wait",
}


@dataclass(frozen=True)
class WorkerInputs:
    """What every worker of one collector starts from, besides its index and the pool's channels.

    Examples:
        >>> import dataclasses
        >>> cfg = WorkerConfig(num_workers=1, frames_per_batch=8, num_envs=2, random_frames=[0], seed=0,
        ...                    exploration_type=ExplorationType.RANDOM, row_keys=[])
        >>> inputs = WorkerInputs(cfg, [b""], b"", b"", None, None, None, None)
        >>> dataclasses.replace(inputs, cfg=dataclasses.replace(cfg, random_frames=[8])).cfg.random_frames
        [8]
    """

    cfg: WorkerConfig
    #: one per worker: a cloudpickled env factory (a process) or a live env instance (a thread)
    env_sources: list
    #: the cloudpickled acting policy, or a PolicyFromFactory that builds it in the worker
    policy_bytes: bytes
    #: cloudpickled ``init_fn``, collect hooks and ``postproc``
    extras_bytes: bytes
    #: where batches go: the shared replay buffer, or BatchSlots read by the parent
    sink: Any
    weights: SharedWeights
    metrics: CollectorMetrics
    control: FrameControl | None


def worker_main(worker_idx: int, inputs: WorkerInputs, stop_event, error_pipe, started,
                stderr_fd: int | None) -> None:
    """:class:`~torchrl_unilab.OffPolicyCollector`'s worker entry point; reports any exception to the parent.

    A process worker gets its env factory as cloudpickled bytes and ``stderr_fd``;
    a thread worker (``stderr_fd is None``) gets a live env instance and leaves
    process-wide settings (signals, torch threads, exit) alone. ``stop_event``,
    ``error_pipe`` and ``started`` are the pool's (:class:`~._processes.WorkerPool`).
    """
    cfg, weights, sink = inputs.cfg, inputs.weights, inputs.sink
    in_process = stderr_fd is not None
    worker_started(started, worker_idx)
    if in_process:
        restore_stderr(stderr_fd)
        # A terminal's Ctrl-C reaches the whole process group; the parent decides when
        # workers stop, so that none dies in the middle of a buffer write.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    else:
        cfg = dataclasses.replace(cfg, num_threads=0, seed_torch=False)
        # A handle of its own, as a process gets by unpickling: closing it must not close the collector's.
        weights = pickle.loads(pickle.dumps(weights))
    loop, code = None, 0
    try:
        extras = cloudpickle.loads(inputs.extras_bytes)
        if extras.get("init_fn") is not None:
            extras["init_fn"]()
        source = inputs.env_sources[worker_idx]
        env = as_batched_env(cloudpickle.loads(source)() if in_process else source)
        policy = cloudpickle.loads(inputs.policy_bytes)
        if isinstance(policy, PolicyFromFactory):  # the user's policy_factory, called here as TorchRL's workers do
            if policy.keeps_own_weights:  # the block's initial weights are the parent's own instance's
                weights.keep_initial()
            policy = policy(env)
        hooks = LoopHooks(before_batch=extras.get("pre_collect_hook"), postproc=extras.get("postproc"),
                          after_batch=extras.get("post_collect_hook"))
        if isinstance(sink, BatchSlots):
            sink = SlotWriter(sink, worker_idx, lambda: stop_event.is_set() or not _parent_alive())
        loop = WorkerLoop(worker_idx, cfg, env, policy, sink, weights, inputs.metrics, inputs.control, stop_event,
                          hooks)
        loop.run()
    except BaseException as err:  # noqa: BLE001 - everything must reach the parent
        code = 1
        report_error(error_pipe, worker_idx, err)
    finally:
        if loop is not None:
            with contextlib.suppress(Exception):
                # A thread's env instance belongs to the collector, which closes it once the thread is done.
                loop.close(close_env=in_process)
    if not in_process:
        if code:
            raise SystemExit(code)
        return
    error_pipe.close()
    # Everything shared is closed and the report is flushed; skip the interpreter's
    # slow teardown so that shutdown() does not wait for torch and MuJoCo to unload.
    os._exit(code)


def tensor_path(policy, env: EnvBase, exploration_type: ExplorationType) -> Callable[[dict], torch.Tensor] | None:
    """The tensor-level policy a worker loop acts with (see :func:`~torchrl_unilab.modules._fast_policy.tensor_policy`),
    or ``None`` where it calls ``policy`` itself, under tensordict's exploration type.

    Only under ``RANDOM``, for a batched env with one ``"action"`` key, and a
    policy that reads nothing but the env's observations and ``"is_init"``.

    Examples:
        >>> from tensordict.nn import TensorDictModule
        >>> from torchrl.envs import GymEnv, SerialEnv
        >>> env = SerialEnv(2, lambda: GymEnv("Pendulum-v1"))
        >>> actor = TensorDictModule(torch.nn.Linear(3, 1), ["observation"], ["action"])
        >>> tensor_path(actor, env, ExplorationType.RANDOM) is not None, tensor_path(actor, env, ExplorationType.MODE)
        (True, None)
    """
    if (exploration_type != ExplorationType.RANDOM or env.batch_dims != 1 or isinstance(env, BatchOfOne)
            or ActionEntry(env).key != "action" or not _reads_env_keys_only(policy, env)):
        return None
    return tensor_policy(policy)


def mark_truncated(batch: TensorDictBase, truncated_keys: list) -> None:
    """TorchRL's ``set_truncated``: the last step of ``batch`` (``[steps, ...]``) ends truncated, and done."""
    for key in truncated_keys:
        key = key if isinstance(key, tuple) else (key,)
        for name in (key, (*key[:-1], "done")):
            value = batch.get(("next", *name), None)
            if value is not None:
                value = value.clone()
                value[-1] = True
                batch.set(("next", *name), value)


def _as_tuple(key) -> tuple:
    return key if isinstance(key, tuple) else (key,)


def _done_entry(env: EnvBase, name: str) -> tuple | None:
    """``("next", *key)`` of the env's first done key named ``name`` (``"done"``, ``"terminated"``), or ``None``."""
    for key in env.done_keys:
        if _as_tuple(key)[-1] == name:
            return ("next", *_as_tuple(key))
    return None


def _per_env(value: np.ndarray, reduce: Callable) -> np.ndarray:
    """One value per env of an ``[envs, ...]`` array: its single column (the usual ``[envs, 1]``), else ``reduce``d."""
    flat = value.reshape(len(value), -1)
    return flat[:, 0] if flat.shape[1] == 1 else reduce(flat, axis=-1)


def _truncated_keys(env: EnvBase) -> list:
    return [key for key in env.done_keys if (key[-1] if isinstance(key, tuple) else key) == "truncated"]


def _is_private(key) -> bool:
    """TorchRL's collectors leave keys starting with ``_`` out of the rows they return."""
    return any(part.startswith("_") for part in (key if isinstance(key, tuple) else (key,)))


def _reads_env_keys_only(policy, env: EnvBase) -> bool:
    """Whether ``policy`` reads only the env's top-level observations and ``"is_init"``: what the tensor-level
    fast path hands it (a recurrent policy reading its own state from the row takes the TensorDict path)."""
    if not isinstance(policy, TensorDictModuleBase):
        return False
    available = {key for key in (*env.observation_spec.keys(), *env.state_spec.keys()) if isinstance(key, str)}
    return all(isinstance(key, str) and key in available | {"is_init"} for key in policy.in_keys)
