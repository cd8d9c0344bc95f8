"""The loop each collector worker process runs.

One code path for every batched TorchRL ``EnvBase``: pick actions (uniformly
at random during the worker's share of ``init_random_frames``, else with the
exploration policy), call ``env.step_and_maybe_reset``, tag each row with its
trajectory id, step count and policy version, and write one whole batch of
flat transitions into the shared replay buffer at a time.
"""

from __future__ import annotations

import os
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

import cloudpickle
import torch
from tensordict import TensorDict, TensorDictBase
from torchrl.envs import EnvBase
from torchrl.envs.utils import ExplorationType, set_exploration_type

from torchrl_unilab._control import FrameControl
from torchrl_unilab._fast_policy import tensor_policy
from torchrl_unilab.metrics import CollectorMetrics
from torchrl_unilab.weight_sync import SharedWeights

#: Keys the worker adds to every row, beside the env's own.
TRAJ_KEY = ("collector", "traj_ids")
STEP_KEY = "step_count"
NEXT_STEP_KEY = ("next", "step_count")
VERSION_KEY = "policy_version"
#: Policy version stored on rows whose action was drawn uniformly at random.
RANDOM_VERSION = -1


@dataclass
class WorkerConfig:
    """Everything a worker needs, gathered once by the parent and pickled to the child."""

    num_workers: int
    frames_per_batch: int
    num_envs: int
    random_frames: list[int]
    seed: int | None
    exploration_type: ExplorationType
    row_keys: list
    env_fn_bytes: bytes
    policy_bytes: bytes
    hooks: dict[str, Any] = field(default_factory=dict)

    def env_seed(self, worker_idx: int) -> int | None:
        """Env ``j`` of worker ``i`` is seeded ``seed + i * num_envs + j``: all distinct."""
        return None if self.seed is None else self.seed + worker_idx * self.num_envs


def add_collector_keys(transition: TensorDictBase, step_count, traj_ids, version) -> TensorDictBase:
    """Tags a transition with trajectory ids, step counts and the policy version per row."""
    transition.set(STEP_KEY, step_count.clone())
    transition.set(NEXT_STEP_KEY, step_count + 1)
    transition.set(TRAJ_KEY, traj_ids.clone())
    transition.set(VERSION_KEY, version)
    return transition


class _WorkerLoop:
    def __init__(self, worker_idx: int, cfg: WorkerConfig, replay_buffer, weights: SharedWeights,
                 metrics: CollectorMetrics, control: FrameControl, stop_event) -> None:
        self.idx = worker_idx
        self.cfg = cfg
        self.rb = replay_buffer
        self.weights = weights
        self.metrics = metrics
        self.control = control
        self.stop_event = stop_event
        self.env: EnvBase = cloudpickle.loads(cfg.env_fn_bytes)()
        self.policy = cloudpickle.loads(cfg.policy_bytes)
        self.fast_policy = tensor_policy(self.policy) if cfg.exploration_type == ExplorationType.RANDOM else None
        self.version = 0
        self.random_left = cfg.random_frames[worker_idx]
        n = cfg.num_envs
        self.steps_per_batch = cfg.frames_per_batch // n
        self.step_count = torch.zeros(n, 1, dtype=torch.int64)
        # Trajectory ids are unique across workers without any coordination.
        self.traj_ids = torch.arange(n, dtype=torch.int64) * cfg.num_workers + worker_idx
        self.next_traj = n
        self.ep_return = torch.zeros(n, dtype=torch.float64)

    def sync_weights(self) -> None:
        version = self.weights.load_into(self.policy, since_version=self.version)
        if version is not None:
            self.version = version
            self.metrics.set(self.idx, policy_version=version)

    def act(self, td: TensorDictBase) -> torch.Tensor:
        n = self.cfg.num_envs
        n_random = min(self.random_left, n)
        if n_random < n:
            # A shallow copy: modules such as an observation normaliser may
            # overwrite keys, and the buffer must keep the env's raw values.
            is_init = self.step_count == 0
            with torch.no_grad(), set_exploration_type(self.cfg.exploration_type):
                if self.fast_policy is not None:
                    action = self.fast_policy({**td.to_dict(), "is_init": is_init})
                else:
                    policy_td = td.copy()
                    policy_td.set("is_init", is_init)
                    action = self.policy(policy_td).get("action")
            if tuple(action.shape) != tuple(self.env.action_spec.shape):
                raise ValueError(
                    f"policy returned an action of shape {tuple(action.shape)}, the env's action_spec is "
                    f"{tuple(self.env.action_spec.shape)}"
                )
            action = action.detach().clone()
        else:
            action = None
        if n_random:
            random_action = self.env.action_spec.rand()
            action = random_action if action is None else torch.cat([random_action[:n_random], action[n_random:]])
            self.random_left -= n_random
        version = torch.full((n,), self.version, dtype=torch.int64)
        version[:n_random] = RANDOM_VERSION
        td.set("action", action)
        return version

    def end_episodes(self, transition: TensorDictBase) -> None:
        done = transition.get(("next", "done")).reshape(-1)
        self.ep_return += transition.get(("next", "reward")).reshape(-1).double()
        if done.any():
            idx = done.nonzero().squeeze(-1)
            self.metrics.record_episodes(
                self.idx,
                returns=self.ep_return[idx].tolist(),
                lengths=(self.step_count[idx, 0] + 1).tolist(),
                terminated=transition.get(("next", "terminated")).reshape(-1)[idx].tolist(),
            )
            self.ep_return[idx] = 0
            new_ids = torch.arange(self.next_traj, self.next_traj + len(idx), dtype=torch.int64)
            self.traj_ids[idx] = new_ids * self.cfg.num_workers + self.idx
            self.next_traj += len(idx)
        self.step_count = torch.where(done.unsqueeze(-1), 0, self.step_count + 1)

    def wait_for_claim(self) -> bool:
        frames = self.cfg.frames_per_batch
        return self.control.wait(
            lambda: self.stop_event.is_set() or self.control.claim(frames), timeout=None, on_poll=lambda: None
        ) and not self.stop_event.is_set()

    def run(self) -> None:
        cfg, env = self.cfg, self.env
        torch.set_num_threads(1)
        if cfg.seed is not None:
            torch.manual_seed(cfg.seed + 7919 * self.idx)
            env.set_seed(cfg.env_seed(self.idx))
        self.sync_weights()
        td = env.reset()
        self.metrics.start(self.idx)
        clock = time.perf_counter
        while self.wait_for_claim():
            rows = []
            t_env = t_policy = t_sync = 0.0
            for _ in range(self.steps_per_batch):
                if self.stop_event.is_set():
                    return
                t0 = clock()
                self.sync_weights()
                t1 = clock()
                version = self.act(td)
                t2 = clock()
                transition, td = env.step_and_maybe_reset(td)
                t3 = clock()
                add_collector_keys(transition, self.step_count, self.traj_ids, version)
                rows.append(transition.select(*cfg.row_keys, strict=True))
                self.end_episodes(transition)
                t_sync += t1 - t0
                t_policy += t2 - t1
                t_env += t3 - t2
            t4 = clock()
            batch = torch.stack(rows).reshape(-1)
            self.rb.extend(batch)
            self.control.written_(cfg.frames_per_batch)
            n_random = int((batch.get(VERSION_KEY) == RANDOM_VERSION).sum())
            self.metrics.add(
                self.idx,
                frames=cfg.frames_per_batch,
                random_frames=n_random,
                time_env_step=t_env,
                time_policy=t_policy,
                time_weight_sync=t_sync,
                time_buffer_write=clock() - t4,
            )

    def close(self) -> None:
        try:
            self.env.close()
        except Exception:  # noqa: BLE001 - best effort while exiting
            pass
        self.weights.close()


def worker_main(worker_idx: int, cfg: WorkerConfig, replay_buffer, weights: SharedWeights,
                metrics: CollectorMetrics, control: FrameControl, stop_event, error_queue) -> None:
    """Process entry point: runs the loop and reports any exception to the parent."""
    loop = None
    try:
        loop = _WorkerLoop(worker_idx, cfg, replay_buffer, weights, metrics, control, stop_event)
        loop.run()
    except BaseException as err:  # noqa: BLE001 - everything must reach the parent
        error_queue.put((worker_idx, f"{type(err).__name__}: {err}", traceback.format_exc()))
        error_queue.close()
        error_queue.join_thread()
        os._exit(1)
    finally:
        if loop is not None:
            loop.close()


def flat_row(transition: TensorDictBase) -> TensorDictBase:
    """The first row of a batched transition, as the storage template."""
    return transition.reshape(-1)[0].clone()


def probe_row(env: EnvBase, policy, exploration_type: ExplorationType) -> TensorDict:
    """Runs one step of ``env`` with ``policy`` in the parent and returns one flat row.

    The row holds every key a worker will write, so the shared storage can be
    laid out before any worker starts.
    """
    td = env.reset()
    n = env.batch_size.numel()
    td.set("is_init", torch.ones(*env.batch_size, 1, dtype=torch.bool))
    with torch.no_grad(), set_exploration_type(exploration_type):
        action = policy(td.clone()).get("action")
    expected = tuple(env.action_spec.shape)
    if tuple(action.shape) != expected:
        raise ValueError(
            f"policy's action shape {tuple(action.shape)} differs from the env's action_spec shape {expected}; "
            "the policy must read 'observation' and write 'action' for the whole batch"
        )
    td = td.exclude("is_init")
    td.set("action", env.action_spec.zero())
    transition, _ = env.step_and_maybe_reset(td)
    step = torch.zeros(n, 1, dtype=torch.int64).reshape(*env.batch_size, 1)
    add_collector_keys(
        transition.reshape(-1) if env.batch_dims != 1 else transition,
        step.reshape(n, 1),
        torch.zeros(n, dtype=torch.int64),
        torch.zeros(n, dtype=torch.int64),
    )
    return flat_row(transition)
