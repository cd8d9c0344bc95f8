"""Drop-in speed-up: TorchRL's collectors against OffPolicyCollector, with TorchRL's own env stack.

Run: ``python benchmarks/dropin_speedup.py [--rounds 3] [--seconds 6] [--workers 2] [--envs 4] [--engine-torchrl]``

See ``benchmarks/README.md``, section "Drop-in speed-up". ``--out`` writes :func:`results_file`.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch
from common import kill_now, provenance, wait_until, with_pythonpath
from tensordict.nn import TensorDictModule
from torchrl.collectors import MultiAsyncCollector
from torchrl.data import LazyTensorStorage, ReplayBuffer
from torchrl.envs import EnvCreator, GymEnv, SerialEnv
from torchrl.envs.transforms import Compose, DoubleToFloat, InitTracker, RewardSum, StepCounter, TransformedEnv
from torchrl.modules import MLP, ProbabilisticActor, TanhNormal
from torchrl.modules.distributions import NormalParamExtractor

import torchrl_unilab
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


def sota_collector(cls, args: argparse.Namespace, **options):
    """``cls`` over ``--workers`` factories of the sota env stack, as TorchRL's SAC scripts make it."""
    return cls([functools.partial(make_train_env, args.envs)] * args.workers, sota_actor(),
               frames_per_batch=args.frames_per_batch, total_frames=-1, device="cpu", compile_policy=False,
               cudagraph_policy=False, **options)


def engine_of(collector) -> str:
    return collector.metrics()["engine"] if isinstance(collector, OffPolicyCollector) else "torchrl"


def pattern1(cls, args: argparse.Namespace) -> tuple[float, str]:
    collector = sota_collector(cls, args)
    try:
        it = iter(collector)
        next(it)
        frames, start = 0, time.perf_counter()
        while time.perf_counter() - start < args.seconds:
            frames += next(it).numel()
        return frames / (time.perf_counter() - start), engine_of(collector)
    finally:
        collector.shutdown()


def pattern2(cls, args: argparse.Namespace, fast_path: bool = False, **options) -> tuple[float, str]:
    if fast_path:
        rb = make_replay_buffer(1_000_000)
        collector = OffPolicyCollector(ENV, sota_actor(), num_workers=args.workers, num_envs=args.envs,
                                       frames_per_batch=args.frames_per_batch, replay_buffer=rb, stagger_resets=False)
    else:
        rb = ReplayBuffer(storage=LazyTensorStorage(1_000_000), shared=True)
        rb.extend(make_train_env(args.envs).rollout(1).view(-1))
        rb.empty()
        collector = sota_collector(cls, args, env_device="cpu", replay_buffer=rb, extend_buffer=True,
                                   postproc=flatten, no_cuda_sync=True, **options)
    try:
        collector.start()
        wait_until(lambda: rb.write_count >= args.frames_per_batch, 300, poll=0.01)
        first, start = rb.write_count, time.perf_counter()
        time.sleep(args.seconds)
        return (rb.write_count - first) / (time.perf_counter() - start), engine_of(collector)
    finally:
        collector.shutdown()


#: each configuration: its pattern, the collector class and their options
CONFIGS = {
    "p1_torchrl": (pattern1, MultiAsyncCollector, {}),
    "p1_offpolicy": (pattern1, OffPolicyCollector, {}),
    "p2_torchrl": (pattern2, MultiAsyncCollector, {}),
    "p2_offpolicy": (pattern2, OffPolicyCollector, {}),
    "fast_path": (pattern2, OffPolicyCollector, {"fast_path": True}),
    "p2_offpolicy_torchrl_engine": (pattern2, OffPolicyCollector, {"engine": "torchrl"}),
}
RESULT = "RESULT "


def run_one(args: argparse.Namespace) -> None:
    """The child process: runs one configuration and prints its rate on a ``RESULT`` line."""
    torch.set_num_threads(1)
    pattern, cls, options = CONFIGS[args.run_one]
    fps, engine = pattern(cls, args, **options)
    print(RESULT + json.dumps({"fps": fps, "engine": engine}), flush=True)


def run_in_subprocess(name: str, args: argparse.Namespace) -> tuple[dict | None, str | None]:
    """Runs configuration ``name`` in a fresh interpreter; ``(result, problem)``.

    ``problem`` is ``None``, ``"hang at run"`` (no result within ``--timeout``), ``"hang at exit"`` (no exit within
    ``--exit-grace`` seconds of the result) or ``"failed: <last stderr line>"``. A hung child is killed with its
    process group (its collector's workers).
    """
    command = [sys.executable, __file__, "--run-one", name, "--seconds", str(args.seconds), "--workers",
               str(args.workers), "--envs", str(args.envs), "--frames-per-batch", str(args.frames_per_batch)]
    # The child imports the torchrl_unilab this process imported (a checkout, not another install).
    package_root = os.path.dirname(os.path.dirname(torchrl_unilab.__file__))
    env = with_pythonpath(package_root)
    stderr = tempfile.TemporaryFile(mode="w+")
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=stderr, text=True, start_new_session=True,
                            env=env)
    result: list[dict] = []

    def read() -> None:
        for line in proc.stdout:
            if line.startswith(RESULT):
                result.append(json.loads(line[len(RESULT):]))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    wait_until(lambda: result or proc.poll() is not None, args.timeout, poll=0.1)
    problem = None
    if not result and proc.poll() is None:
        problem = "hang at run"
    else:
        try:
            proc.wait(timeout=args.exit_grace)
        except subprocess.TimeoutExpired:
            problem = "hang at exit"
    if problem is not None:
        kill_now(proc)
    reader.join(timeout=5)
    if not result and problem is None:
        stderr.seek(0)
        lines = [line.strip() for line in stderr.read().splitlines() if line.strip()]
        problem = f"failed: {lines[-1] if lines else f'exit code {proc.returncode}'}"
    stderr.close()
    return (result[0] if result else None), problem


#: --out: each pattern's two sides, TorchRL's collector then ours (the fast path's baseline is pattern 2's)
PATTERNS = {"pattern1": ("p1_torchrl", "p1_offpolicy"), "pattern2": ("p2_torchrl", "p2_offpolicy"),
            "fast_path": ("p2_torchrl", "fast_path")}
#: --out: the targets for the two patterns of TorchRL's SAC scripts
TARGETS = {"pattern1": 3, "pattern2": 4}


def per_round_ratios(rates: dict[str, list[float | None]], numerator: str, denominator: str) -> list[float]:
    """The frames/s of configuration ``numerator`` over ``denominator``'s in each round where both gave a result.

    Example::

        >>> per_round_ratios({"ours": [300.0, None, 330.0], "torchrl": [100.0, 90.0, 110.0]}, "ours", "torchrl")
        [3.0, 3.0]
    """
    return [x / y for x, y in zip(rates[numerator], rates[denominator]) if x is not None and y]


def results_file(result: dict, rates: dict[str, list[float | None]]) -> dict:
    """``--out``'s file: each pattern's frames/s (medians), the median of its per-round ratios and their range,
    as ``benchmarks/report.py`` reads them for README and the drop-in page, from a run of every pattern."""
    ratios = {key: per_round_ratios(rates, ours, torchrl) for key, (torchrl, ours) in PATTERNS.items()}
    load = result["load_average_start_end"]
    return {
        **provenance("dropin_speedup", *load),
        "task": f"{ENV} through TorchRL's env stack (SerialEnv of {result['envs_per_worker']} GymEnv + InitTracker, "
                "StepCounter, DoubleToFloat, RewardSum)",
        "workers": result["workers"], "actor": "sota 256x256 TanhNormal actor", "rounds": result["rounds"],
        "fps": {key: {"torchrl": result[f"{a}_fps"], "ours": result[f"{b}_fps"]} for key, (a, b) in PATTERNS.items()},
        **{f"ratio_{key}": round(statistics.median(ratios[key]), 2) for key in PATTERNS},
        "ratio_rounds": {key: [round(min(ratios[key]), 2), round(max(ratios[key]), 2)] for key in TARGETS},
        "targets": TARGETS, "engines": result["engines"], "problems": result["problems"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--envs", type=int, default=4, help="envs per worker (SerialEnv)")
    parser.add_argument("--frames-per-batch", type=int, default=200)
    parser.add_argument("--timeout", type=float, default=240.0, help="seconds a configuration may run")
    parser.add_argument("--exit-grace", type=float, default=10.0, help="seconds a finished run may take to exit")
    parser.add_argument("--engine-torchrl", action="store_true",
                        help="also run pattern 2 with engine='torchrl' (the env stack as given)")
    parser.add_argument("--configs", nargs="+", choices=sorted(CONFIGS), default=None,
                        help="run only these configurations (default: all; ratios need both of their sides)")
    parser.add_argument("--out", type=Path, default=None,
                        help="also write the docs' figures to this file (results_file); needs every pattern's "
                             "configurations (no --configs)")
    parser.add_argument("--run-one", choices=sorted(CONFIGS), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.out is not None and args.configs:
        parser.error(f"--out needs every configuration of the three patterns; drop --configs {' '.join(args.configs)}")
    if args.run_one:
        run_one(args)
        return
    names = [n for n in CONFIGS if args.engine_torchrl or n != "p2_offpolicy_torchrl_engine"]
    if args.configs:
        names = [n for n in CONFIGS if n in args.configs]
    rates: dict[str, list[float | None]] = {name: [] for name in names}
    engines: dict[str, str] = {}
    problems: list[dict] = []
    load_start = os.getloadavg()[0]
    for r in range(args.rounds):
        for name in names:
            result, problem = run_in_subprocess(name, args)
            rates[name].append(result["fps"] if result else None)
            if result:
                engines[name] = result["engine"]
            if problem:
                problems.append({"round": r, "config": name, "problem": problem})
            shown = f"{result['fps']:.0f} frames/s" if result else "no result"
            print(f"round {r}: {name} {shown}{f' ({problem})' if problem else ''}", flush=True)

    def median(name: str) -> float | None:
        values = [v for v in rates[name] if v is not None]
        return round(statistics.median(values), 1) if values else None

    def ratio(a: str, b: str) -> float | None:
        pairs = per_round_ratios(rates, a, b) if a in rates and b in rates else []
        return round(statistics.median(pairs), 3) if pairs else None

    result = {
        "benchmark": "dropin_speedup", "env": ENV, "workers": args.workers, "envs_per_worker": args.envs,
        "frames_per_batch": args.frames_per_batch, "rounds": args.rounds,
        "machine": f"{platform.machine()} {os.cpu_count()} cpu(s), 1 torch thread per process",
        "load_average_start_end": [round(load_start, 2), round(os.getloadavg()[0], 2)],
        **{f"{name}_fps": median(name) for name in names},
        "ratio_pattern1": ratio("p1_offpolicy", "p1_torchrl"), "ratio_pattern2": ratio("p2_offpolicy", "p2_torchrl"),
        "ratio_fast_path_over_p2_torchrl": ratio("fast_path", "p2_torchrl"), "engines": engines, "problems": problems,
    }
    if "p2_offpolicy_torchrl_engine" in names:
        result["ratio_pattern2_torchrl_engine"] = ratio("p2_offpolicy_torchrl_engine", "p2_torchrl")
    print(json.dumps(result))
    if args.out is not None:
        args.out.write_text(json.dumps(results_file(result, rates), indent=1) + "\n")


if __name__ == "__main__":
    main()
