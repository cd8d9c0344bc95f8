"""Collection through Ray against the local collector, on one machine: the overhead of the Ray path.

Run: ``python benchmarks/ray_scaling.py [--rounds 5] [--frames 32768] [--num-envs 8] [--frames-per-batch 64 512]``

See ``benchmarks/README.md``, section "Ray scaling", for the JSON line's keys. ``--out`` writes
:func:`results_file`.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import statistics
import time
from pathlib import Path

import torch
from common import provenance
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage, ReplayBuffer, RoundRobinWriter

from torchrl_unilab import OffPolicyCollector, make_replay_buffer
from torchrl_unilab.collectors.ray_collector import RayOffPolicyCollector
from torchrl_unilab.modules.exploration import make_exploration_policy
from torchrl_unilab.modules.models import make_actor

ENV = "HalfCheetah-v5"
#: the default and README's headline batch size: the learner's cost is per batch
FRAMES_PER_BATCH = 512
#: --out: the target for ray_over_local
TARGET_RAY_OVER_LOCAL = 0.8


def sac_policy():
    actor = make_actor("sac", 17, 6, hidden_dim=256)
    return make_exploration_policy(actor, "sac", actor.spec)


def timed_round(collector, frames: int) -> float:
    """Frames per second over ``frames`` more frames, from a batch boundary."""
    start_frames, start = collector.frames_written, time.perf_counter()
    collector.allow_frames(start_frames + frames)
    if not collector.wait_for_frames(start_frames + frames, timeout=600):
        raise TimeoutError(f"{type(collector).__name__} did not reach {start_frames + frames} frames")
    return (collector.frames_written - start_frames) / (time.perf_counter() - start)


def tensor_bytes(td) -> int:
    return sum(t.numel() * t.element_size() for t in td.values(include_nested=True, leaves_only=True))


def synthetic_batch(rows: int, obs_dim: int) -> TensorDict:
    """``rows`` transitions shaped as the collector writes them, with ``obs_dim``-dim observations."""
    flag = functools.partial(torch.zeros, rows, 1, dtype=torch.bool)
    return TensorDict({
        "observation": torch.randn(rows, obs_dim), "action": torch.rand(rows, 6),
        "step_count": torch.zeros(rows, 1, dtype=torch.int64), "policy_version": torch.ones(rows, dtype=torch.int64),
        "collector": {"traj_ids": torch.zeros(rows, dtype=torch.int64)},
        "next": {"observation": torch.randn(rows, obs_dim), "reward": torch.randn(rows, 1), "done": flag(),
                 "terminated": flag(), "truncated": flag(), "step_count": torch.zeros(rows, 1, dtype=torch.int64)},
    }, batch_size=[rows])


class _Source:
    """Hands out one batch from another process, as a node would (a Ray actor, made in :func:`receive_cost`)."""

    def __init__(self, rows: int, obs_dim: int) -> None:
        self.batch = synthetic_batch(rows, obs_dim)

    def get(self) -> TensorDict:
        return self.batch


def receive_cost(obs_dim: int, rows: int = FRAMES_PER_BATCH, repeats: int = 200) -> float:
    """Learner-side microseconds per frame to fetch a finished batch from another actor and extend a buffer."""
    import ray

    source = ray.remote(num_cpus=0)(_Source).remote(rows, obs_dim)
    rb = make_replay_buffer(repeats * rows)
    rb.extend(ray.get(source.get.remote()))
    times = []
    for _ in range(repeats):
        ref = source.get.remote()
        ray.wait([ref])
        start = time.perf_counter()
        rb.extend(ray.get(ref))
        times.append(time.perf_counter() - start)
    ray.kill(source)
    return statistics.median(times) / rows * 1e6


def sample_ms(buffer, repeats: int = 50) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        buffer.sample(256)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def measure(fpb: int, rounds: int, frames: int, n: int) -> dict:
    """One batch size of ``fpb`` frames, on a Ray session of its own: the JSON line's figures (``benchmarks/README.md``,
    section "Ray scaling")."""
    import ray  # the [ray] extra; imported here so that the report's tests read this module without it

    ray.init(num_cpus=2, include_dashboard=False)
    common = dict(frames_per_batch=fpb, total_frames=-1, seed=0)
    local_rb, ray_rb = make_replay_buffer(1_000_000), make_replay_buffer(1_000_000)
    # compilable: TorchRL's default counters are mp.Value-s, whose named semaphores outlive the buffer's actor
    ray_buffer = ReplayBuffer(storage=functools.partial(LazyTensorStorage, 1_000_000, compilable=True),
                              writer=functools.partial(RoundRobinWriter, compilable=True), batch_size=256,
                              service_backend="ray", service_backend_options={"remote_config": {"num_cpus": 0}})
    # 4 actors on 2 CPUs
    node_cfg = dict(num_nodes=2, num_workers=1, num_envs=n, remote_configs={"num_cpus": 0.5}, **common)
    collectors = {
        "local": OffPolicyCollector(ENV, sac_policy(), num_workers=2, num_envs=n, replay_buffer=local_rb, **common),
        "ray": RayOffPolicyCollector(ENV, sac_policy(), replay_buffer=ray_rb, **node_cfg),
        "ray_buffer": RayOffPolicyCollector(ENV, sac_policy(), replay_buffer=ray_buffer, **node_cfg),
    }
    try:
        for collector in collectors.values():  # warm-up: workers started, first batches through
            timed_round(collector, 4 * fpb)
        rates: dict[str, list[float]] = {name: [] for name in collectors}
        ray_receive_s, ray_frames = 0.0, 0
        for _ in range(rounds):
            for name, collector in collectors.items():
                before = (collector.receive_s, collector.frames_written) if name == "ray" else None
                rates[name].append(timed_round(collector, frames))
                if before is not None:
                    ray_receive_s += collector.receive_s - before[0]
                    ray_frames += collector.frames_written - before[1]
        over_local = {name: [remote / local for remote, local in zip(rates[name], rates["local"])]
                      for name in ("ray", "ray_buffer")}
        batch = ray_rb[:fpb]
        return {
            "benchmark": "ray_scaling", "env": ENV, "num_envs_per_worker": n, "frames_per_batch": fpb,
            "workers_total": 2, "rounds": rounds, **{f"{name}_fps": statistics.median(r) for name, r in rates.items()},
            "ray_over_local": statistics.median(over_local["ray"]),
            "ray_buffer_over_local": statistics.median(over_local["ray_buffer"]),
            "ray_over_local_per_round": [round(ratio, 3) for ratio in over_local["ray"]],
            "bytes_per_frame": tensor_bytes(batch) / fpb,
            "serialized_bytes_per_frame": len(ray.cloudpickle.dumps(batch.clone())) / fpb,
            "receive_us_per_frame": ray_receive_s / max(ray_frames, 1) * 1e6,
            "receive_us_per_frame_17d": receive_cost(17, fpb), "receive_us_per_frame_1000d": receive_cost(1000, fpb),
            "bytes_per_frame_1000d": tensor_bytes(synthetic_batch(FRAMES_PER_BATCH, 1000)) / FRAMES_PER_BATCH,
            "sample_ms_local": sample_ms(ray_rb), "sample_ms_ray_buffer": sample_ms(ray_buffer),
            "load_avg_1m": os.getloadavg()[0], "machine": f"{platform.machine()} {os.cpu_count()} cpus",
        }
    finally:
        for collector in collectors.values():
            collector.shutdown()
        ray_buffer.shutdown()
        ray.shutdown()


def results_file(results: list[dict]) -> dict:
    """``--out``'s file from the JSON lines of one run, one per batch size: rates, Ray's ratios to the local
    collector and their per-round range, the learner's receive cost and the wire bytes per frame, as
    ``benchmarks/report.py`` reads them for README's headline and the Ray page's table."""
    n = results[0]["num_envs_per_worker"]
    loads = ", ".join(f"{r['load_avg_1m']:.2f} after {r['frames_per_batch']} frames per batch" for r in results)
    return {
        **provenance("ray_scaling", note=f"load average {loads}"),
        "workers": f"2 workers x {n} envs local, against 2 Ray nodes x 1 worker x {n} envs",
        "task": results[0]["env"], "rounds": results[0]["rounds"],
        "by_frames_per_batch": {str(r["frames_per_batch"]): {
            "local_fps": round(r["local_fps"]), "ray_fps": round(r["ray_fps"]),
            "ray_over_local": round(r["ray_over_local"], 2),
            "ray_rounds": [round(min(r["ray_over_local_per_round"]), 2), round(max(r["ray_over_local_per_round"]), 2)],
            "ray_buffer_fps": round(r["ray_buffer_fps"]), "ray_buffer_over_local": round(r["ray_buffer_over_local"], 2),
            "receive_us_per_frame": round(r["receive_us_per_frame"]),
            "wire_bytes_per_frame": round(r["serialized_bytes_per_frame"]),  # as Ray pickles a batch
        } for r in results},
        "tensor_bytes_per_frame": round(results[0]["bytes_per_frame"]),
        "target_ray_over_local": TARGET_RAY_OVER_LOCAL,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    # Each node keeps one batch in flight beyond the cap, so a round starts with up to
    # num_nodes * frames_per_batch frames already collected: rounds of 64 batches keep that under 4 %.
    parser.add_argument("--frames", type=int, default=32768, help="frames timed per round")
    parser.add_argument("--num-envs", type=int, default=8, help="envs per worker")
    parser.add_argument("--frames-per-batch", type=int, nargs="+", default=[FRAMES_PER_BATCH],
                        help="frames of one batch (one ray.get and extend on the learner); several: one after another")
    parser.add_argument("--out", type=Path, default=None,
                        help=f"also write the docs' figures to this file (results_file); needs --frames-per-batch "
                             f"to include {FRAMES_PER_BATCH}, README's headline batch size")
    args = parser.parse_args()
    if args.out is not None and FRAMES_PER_BATCH not in args.frames_per_batch:
        parser.error(f"--out needs --frames-per-batch to include {FRAMES_PER_BATCH} (README's headline reads it); "
                     f"got {' '.join(map(str, args.frames_per_batch))}")
    results = []
    for fpb in args.frames_per_batch:
        results.append(measure(fpb, args.rounds, args.frames, args.num_envs))
        print(json.dumps(results[-1]), flush=True)
    if args.out is not None:
        args.out.write_text(json.dumps(results_file(results), indent=1) + "\n")


if __name__ == "__main__":
    main()
