"""Collect HalfCheetah-v5 frames into a shared replay buffer with a fresh SAC actor.

The smallest end-to-end use of :class:`torchrl_unilab.OffPolicyCollector`:
background workers step batches of MuJoCo envs and write transitions into a
``LazyMemmapStorage``; the main process watches progress and, at the end,
prints throughput and buffer statistics.

Run: ``python recipes/collect.py [--env HalfCheetah-v5] [--frames 200000] [--workers 2] [--envs 16]``
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from tqdm import tqdm

from torchrl_unilab import BatchedGymEnv, OffPolicyCollector, make_replay_buffer
from torchrl_unilab.modules.exploration import make_exploration_policy
from torchrl_unilab.modules.models import make_actor


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="HalfCheetah-v5")
    parser.add_argument("--frames", type=int, default=200_000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--envs", type=int, default=16, help="envs per worker, stepped as one batch")
    parser.add_argument("--frames-per-batch", type=int, default=1024)
    parser.add_argument("--init-random-frames", type=int, default=5000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    # Networks: the SAC actor the learner would train, wrapped with its exploration.
    spec_env = BatchedGymEnv(args.env, num_envs=args.envs)
    obs_dim, action_dim = spec_env.obs_dim, spec_env.action_dim
    actor = make_actor("sac", obs_dim, action_dim, hidden_dim=512, use_layer_norm=True,
                       action_low=spec_env.action_spec.space.low[0], action_high=spec_env.action_spec.space.high[0])
    policy = make_exploration_policy(actor, "sac", spec_env.action_spec)
    spec_env.close()

    rb = make_replay_buffer(capacity=max(args.frames, args.frames_per_batch), batch_size=256)
    collector = OffPolicyCollector(
        args.env,
        policy,
        num_workers=args.workers,
        num_envs=args.envs,
        frames_per_batch=args.frames_per_batch,
        total_frames=args.frames,
        replay_buffer=rb,
        init_random_frames=args.init_random_frames,
        seed=args.seed,
    )
    try:
        start = time.perf_counter()
        with tqdm(total=collector.total_frames, unit="frames") as pbar:
            for _ in collector:
                m = collector.metrics()
                pbar.update(collector.frames_written - pbar.n)
                pbar.set_postfix(fps=f"{m['fps']:.0f}", episodes=m["episodes"], ret=f"{m['mean_return']:.1f}")
        elapsed = time.perf_counter() - start
        m = collector.metrics()
        sample = rb.sample()
        report = {
            "env": args.env,
            "frames_written": m["frames"],
            "wall_s": round(elapsed, 1),
            "frames_per_s_wall": round(m["frames"] / elapsed, 1),
            "frames_per_s_workers": round(m["fps"], 1),
            "buffer_size": m["buffer_size"],
            "random_frames": m["random_frames"],
            "episodes": m["episodes"],
            "terminated": m["terminated"],
            "truncated": m["truncated"],
            "mean_return_recent": round(m["mean_return"], 2),
            "reward_mean_in_buffer": round(float(rb[: len(rb)]["next", "reward"].mean()), 4),
            "worker_time_s": {k: round(v, 2) for k, v in m["time"].items()},
            "sample_keys": sorted(str(k) for k in sample.keys(include_nested=True, leaves_only=True)),
        }
        print(json.dumps(report, indent=2))
    finally:
        collector.shutdown()


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
