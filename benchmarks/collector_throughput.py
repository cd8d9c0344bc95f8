"""Collection throughput on HalfCheetah-v5: raw gymnasium vs TorchRL vs OffPolicyCollector.

Prints one JSON line with env steps per second for

* ``raw``: a single-process gymnasium loop with uniformly random actions (the
  simulator's own speed, the ceiling for one core);
* ``torchrl_collector``: TorchRL's ``Collector`` over ``GymEnv(num_envs=16)``
  with a 512-wide LayerNorm SAC actor;
* ``offpolicy_1w`` / ``offpolicy_2w``: ``OffPolicyCollector`` with 1 and 2
  workers x 16 envs, the same actor, writing into a shared replay buffer;

and the ratios ``offpolicy_1w / raw`` (target >= 0.6) and
``offpolicy_1w / torchrl_collector`` (target >= 3).

Run: ``python benchmarks/collector_throughput.py [--seconds 8]``
"""

from __future__ import annotations

import argparse
import json
import platform
import time

import gymnasium as gym
import numpy as np
import torch
from torchrl.collectors import Collector
from torchrl.envs import DoubleToFloat, GymEnv, TransformedEnv

from torchrl_unilab import OffPolicyCollector, make_replay_buffer
from torchrl_unilab.models import make_actor

ENV = "HalfCheetah-v5"
NUM_ENVS = 16


def sac_actor():
    return make_actor("sac", 17, 6, hidden_dim=512, use_layer_norm=True)


def raw_gym(seconds: float) -> float:
    env = gym.make(ENV)
    env.reset(seed=0)
    rng = np.random.default_rng(0)
    low, high = env.action_space.low, env.action_space.high
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        _, _, terminated, truncated, _ = env.step(rng.uniform(low, high))
        if terminated or truncated:
            env.reset()
        steps += 1
    return steps / (time.perf_counter() - start)


def torchrl_collector(seconds: float) -> float:
    torch.set_num_threads(1)
    env = TransformedEnv(GymEnv(ENV, num_envs=NUM_ENVS), DoubleToFloat())
    collector = Collector(env, sac_actor(), frames_per_batch=1024, total_frames=-1)
    try:
        frames, start = 0, None
        for batch in collector:
            if start is None:  # first batch includes start-up
                start = time.perf_counter()
                continue
            frames += batch.numel()
            if time.perf_counter() - start > seconds:
                break
        return frames / (time.perf_counter() - start)
    finally:
        collector.shutdown()


def offpolicy(seconds: float, num_workers: int) -> float:
    rb = make_replay_buffer(1_000_000)
    collector = OffPolicyCollector(ENV, sac_actor(), num_workers=num_workers, num_envs=NUM_ENVS,
                                   frames_per_batch=1024, replay_buffer=rb, seed=0)
    try:
        collector.start()
        collector.wait_for_frames(2048 * num_workers, timeout=120)  # past process start-up
        f0, t0 = collector.frames_written, time.perf_counter()
        time.sleep(seconds)
        return (collector.frames_written - f0) / (time.perf_counter() - t0)
    finally:
        collector.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=8.0, help="measurement window per configuration")
    args = parser.parse_args()
    figures = {
        "raw": raw_gym(args.seconds),
        "torchrl_collector": torchrl_collector(args.seconds),
        "offpolicy_1w": offpolicy(args.seconds, 1),
        "offpolicy_2w": offpolicy(args.seconds, 2),
    }
    out = {"benchmark": "collector_throughput", "env": ENV, "num_envs": NUM_ENVS, "unit": "env steps/s"}
    out.update({k: round(v, 1) for k, v in figures.items()})
    out["ratio_1w_over_raw"] = round(figures["offpolicy_1w"] / figures["raw"], 3)
    out["ratio_1w_over_torchrl"] = round(figures["offpolicy_1w"] / figures["torchrl_collector"], 3)
    out["ratio_2w_over_1w"] = round(figures["offpolicy_2w"] / figures["offpolicy_1w"], 3)
    out["machine"] = f"{platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}"
    print(json.dumps(out))


if __name__ == "__main__":
    main()
