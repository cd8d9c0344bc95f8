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

The configurations are measured in alternating rounds (raw, TorchRL, 1 worker,
raw, ...; then raw and 2 workers), every collector kept alive and paused
between its rounds, so that slow drifts in a shared machine's speed weigh on
all of them alike. Rates are medians over rounds; ratios are medians of the
per-round ratios. Collector windows start and end on a batch boundary
(``wait_for_frames``), so whole batches never skew a window.

Run: ``python benchmarks/collector_throughput.py [--rounds 5] [--seconds 3]``
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
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


class TorchRLCollector:
    """TorchRL's Collector over GymEnv(num_envs=16), iterated for a window at a time."""

    def __init__(self) -> None:
        torch.set_num_threads(1)
        env = TransformedEnv(GymEnv(ENV, num_envs=NUM_ENVS), DoubleToFloat())
        self.collector = Collector(env, sac_actor(), frames_per_batch=1024, total_frames=-1)
        self.batches = iter(self.collector)
        next(self.batches)  # start-up

    def __call__(self, seconds: float) -> float:
        frames, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            frames += next(self.batches).numel()
        return frames / (time.perf_counter() - start)

    def close(self) -> None:
        self.collector.shutdown()


class OffPolicy:
    """An OffPolicyCollector kept paused between measurement windows."""

    def __init__(self, num_workers: int) -> None:
        self.collector = OffPolicyCollector(ENV, sac_actor(), num_workers=num_workers, num_envs=NUM_ENVS,
                                            frames_per_batch=1024, replay_buffer=make_replay_buffer(1_000_000),
                                            seed=0)
        self.collector.start()
        self.collector.wait_for_frames(2048 * num_workers, timeout=120)  # past process start-up
        self._pause = self.collector.pause()
        self._pause.__enter__()

    def __call__(self, seconds: float) -> float:
        collector = self.collector
        self._pause.__exit__(None, None, None)
        try:
            # From one batch boundary to another: no partial batch inside the window.
            collector.wait_for_frames(collector.frames_written + 1, timeout=60)
            f0, t0 = collector.frames_written, time.perf_counter()
            time.sleep(seconds)
            collector.wait_for_frames(collector.frames_written + 1, timeout=60)
            f1, t1 = collector.frames_written, time.perf_counter()
        finally:
            self._pause = collector.pause()
            self._pause.__enter__()
        return (f1 - f0) / (t1 - t0)

    def close(self) -> None:
        self._pause.__exit__(None, None, None)
        self.collector.shutdown()


def interleaved(configs: dict, rounds: int, seconds: float) -> dict[str, list[float]]:
    """Runs each configuration for ``seconds`` in turn, ``rounds`` times; the rates per configuration."""
    rates: dict[str, list[float]] = {name: [] for name in configs}
    for _ in range(rounds):
        for name, measure in configs.items():
            rates[name].append(measure(seconds))
    return rates


def median_ratio(num: list[float], den: list[float]) -> float:
    return statistics.median(a / b for a, b in zip(num, den))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds per configuration")
    parser.add_argument("--seconds", type=float, default=3.0, help="measurement window per round")
    args = parser.parse_args()
    torchrl, one = TorchRLCollector(), OffPolicy(1)
    try:
        first = interleaved({"raw": raw_gym, "torchrl_collector": torchrl, "offpolicy_1w": one},
                            args.rounds, args.seconds)
    finally:
        torchrl.close()
        one.close()
    two = OffPolicy(2)
    try:
        second = interleaved({"raw": raw_gym, "offpolicy_2w": two}, args.rounds, args.seconds)
    finally:
        two.close()
    out = {"benchmark": "collector_throughput", "env": ENV, "num_envs": NUM_ENVS, "unit": "env steps/s",
           "rounds": args.rounds, "seconds_per_round": args.seconds}
    figures = {**first, "offpolicy_2w": second["offpolicy_2w"]}
    out.update({name: round(statistics.median(r), 1) for name, r in figures.items()})
    out["ratio_1w_over_raw"] = round(median_ratio(first["offpolicy_1w"], first["raw"]), 3)
    out["ratio_1w_over_torchrl"] = round(median_ratio(first["offpolicy_1w"], first["torchrl_collector"]), 3)
    out["ratio_2w_over_raw"] = round(median_ratio(second["offpolicy_2w"], second["raw"]), 3)
    out["ratio_2w_over_1w"] = round(out["offpolicy_2w"] / out["offpolicy_1w"], 3)
    out["ratio_1w_over_raw_per_round"] = [round(a / b, 3) for a, b in zip(first["offpolicy_1w"], first["raw"])]
    out["machine"] = f"{platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}"
    print(json.dumps(out))


if __name__ == "__main__":
    main()
