"""Drop-in speed-up: TorchRL's collectors against OffPolicyCollector, with TorchRL's own env stack.

Both usage patterns of TorchRL's SAC scripts on HalfCheetah-v5, with the sota
env stack (``SerialEnv`` of ``GymEnv`` + ``InitTracker``, ``StepCounter``,
``DoubleToFloat``, ``RewardSum``) and the sota actor (256x256 MLP, TanhNormal):

* pattern 1 (``sac.py``): iterate and get batches. TorchRL's ``MultiAsyncCollector``
  against ``OffPolicyCollector`` with the same env factories;
* pattern 2 (``sac-async.py``): workers write into a shared TorchRL
  ``ReplayBuffer(LazyTensorStorage, shared=True)`` after ``start()``.
  ``MultiAsyncCollector`` against ``OffPolicyCollector`` (target >= 2x);
* ``fast_path``: ``OffPolicyCollector("HalfCheetah-v5", ...)`` (our gymnasium-id
  env) in pattern 2, with the same number of workers and envs.

Collected frames per second are measured over a window that starts after the
first batch (start-up excluded). The configurations run in alternating rounds,
so that drifts in a shared machine's speed weigh on all of them alike; rates
are medians over rounds and ratios medians of per-round ratios.

Run: ``python benchmarks/dropin_speedup.py [--rounds 3] [--seconds 6] [--workers 2] [--envs 4]``
"""

from __future__ import annotations

import argparse
import functools
import json
import platform
import statistics
import time

import torch
from tensordict.nn import TensorDictModule
from torchrl.collectors import MultiAsyncCollector
from torchrl.data import LazyTensorStorage, ReplayBuffer
from torchrl.envs import (
    Compose,
    DoubleToFloat,
    EnvCreator,
    GymEnv,
    InitTracker,
    RewardSum,
    SerialEnv,
    StepCounter,
    TransformedEnv,
)
from torchrl.modules import MLP, ProbabilisticActor, TanhNormal
from torchrl.modules.distributions import NormalParamExtractor

from torchrl_unilab import OffPolicyCollector, make_replay_buffer

ENV = "HalfCheetah-v5"


def env_maker():
    return GymEnv(ENV)


def make_train_env(num_envs: int):
    """TorchRL's sota ``make_environment``, serial (one core per worker)."""
    env = SerialEnv(num_envs, EnvCreator(env_maker))
    return TransformedEnv(env, Compose(InitTracker(), StepCounter(1000), DoubleToFloat(), RewardSum()))


def flatten(td):
    return td.reshape(-1)


def sota_actor():
    net = torch.nn.Sequential(MLP(in_features=17, out_features=12, num_cells=[256, 256]), NormalParamExtractor())
    return ProbabilisticActor(TensorDictModule(net, in_keys=["observation"], out_keys=["loc", "scale"]),
                              in_keys=["loc", "scale"], spec=make_train_env(1).action_spec_unbatched,
                              distribution_class=TanhNormal, distribution_kwargs={"low": -1.0, "high": 1.0})


def pattern1(cls, workers: int, envs: int, fpb: int, seconds: float) -> float:
    factories = [functools.partial(make_train_env, envs)] * workers
    collector = cls(factories, sota_actor(), frames_per_batch=fpb, total_frames=-1, device="cpu",
                    compile_policy=False, cudagraph_policy=False)
    try:
        it = iter(collector)
        next(it)
        frames, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            frames += next(it).numel()
        return frames / (time.perf_counter() - start)
    finally:
        collector.shutdown()


def pattern2(cls, workers: int, envs: int, fpb: int, seconds: float, fast_path: bool = False) -> float:
    if fast_path:
        rb = make_replay_buffer(1_000_000)
        collector = OffPolicyCollector(ENV, sota_actor(), num_workers=workers, num_envs=envs,
                                       frames_per_batch=fpb, replay_buffer=rb, stagger_resets=False)
    else:
        rb = ReplayBuffer(storage=LazyTensorStorage(1_000_000), shared=True)
        rb.extend(make_train_env(envs).rollout(1).view(-1))
        rb.empty()
        factories = [functools.partial(make_train_env, envs)] * workers
        collector = cls(factories, sota_actor(), frames_per_batch=fpb, total_frames=-1, device="cpu",
                        env_device="cpu", compile_policy=False, cudagraph_policy=False, replay_buffer=rb,
                        extend_buffer=True, postproc=flatten, no_cuda_sync=True)
    try:
        collector.start()
        deadline = time.monotonic() + 300
        while rb.write_count < fpb and time.monotonic() < deadline:
            time.sleep(0.01)
        first, start = rb.write_count, time.perf_counter()
        time.sleep(seconds)
        return (rb.write_count - first) / (time.perf_counter() - start)
    finally:
        collector.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--envs", type=int, default=4, help="envs per worker (SerialEnv)")
    parser.add_argument("--frames-per-batch", type=int, default=200)
    args = parser.parse_args()
    torch.set_num_threads(1)
    w, n, fpb, secs = args.workers, args.envs, args.frames_per_batch, args.seconds
    configs = {
        "p1_torchrl": lambda: pattern1(MultiAsyncCollector, w, n, fpb, secs),
        "p1_offpolicy": lambda: pattern1(OffPolicyCollector, w, n, fpb, secs),
        "p2_torchrl": lambda: pattern2(MultiAsyncCollector, w, n, fpb, secs),
        "p2_offpolicy": lambda: pattern2(OffPolicyCollector, w, n, fpb, secs),
        "fast_path": lambda: pattern2(OffPolicyCollector, w, n, fpb, secs, fast_path=True),
    }
    rates: dict[str, list[float]] = {name: [] for name in configs}
    for r in range(args.rounds):
        for name, run in configs.items():
            rates[name].append(run())
            print(f"round {r}: {name} {rates[name][-1]:.0f} frames/s", flush=True)

    def ratio(a: str, b: str) -> float:
        return round(statistics.median(x / y for x, y in zip(rates[a], rates[b])), 3)

    result = {
        "benchmark": "dropin_speedup",
        "env": ENV,
        "workers": w,
        "envs_per_worker": n,
        "frames_per_batch": fpb,
        "rounds": args.rounds,
        "machine": f"{platform.machine()} {torch.get_num_threads()} thread(s)",
        **{f"{name}_fps": round(statistics.median(v), 1) for name, v in rates.items()},
        "ratio_pattern1": ratio("p1_offpolicy", "p1_torchrl"),
        "ratio_pattern2": ratio("p2_offpolicy", "p2_torchrl"),
        "ratio_fast_path_over_p2_torchrl": ratio("fast_path", "p2_torchrl"),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
