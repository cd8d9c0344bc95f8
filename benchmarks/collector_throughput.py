"""Collection throughput on HalfCheetah-v5: the simulators, TorchRL, and OffPolicyCollector on both engines.

Run::

    python benchmarks/collector_throughput.py [--rounds 5] [--seconds 3] [--group all|lanes] [--task ID]
    python benchmarks/collector_throughput.py --out benchmarks/results/collector/halfcheetah.json

See ``benchmarks/README.md``, section "Collection throughput". ``--out`` writes :func:`results_file`.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import envpool
import gymnasium as gym
import mujoco
import numpy as np
import torch
from common import provenance
from torchrl.collectors import Collector
from torchrl.envs import DoubleToFloat, GymEnv, TransformedEnv
from torchrl.envs.utils import ExplorationType, set_exploration_type

from torchrl_unilab import EnvPoolEnv, OffPolicyCollector, make_replay_buffer
from torchrl_unilab.envs.task_families import observation_layout
from torchrl_unilab.modules._fast_policy import tensor_policy
from torchrl_unilab.modules.models import make_actor

ENV = "HalfCheetah-v5"
NUM_ENVS = 16
FRAME_SKIP = 5
#: --task: the target ratio of our collector to EnvPool alone on each robot task
TASK_TARGETS = {"Go1JoystickFlatTerrain-v1": 0.9, "CheetahRun-v1": 0.6}
#: --task: the envs of the worker whose policy overlaps EnvPool's physics (EnvPoolEnv(lanes=2))
LANES_ENVS = 64
#: --out: the configurations of a full run, the raw loop first (every ratio is to it)
RATE_KEYS = ("raw", "bare_mujoco", "envpool", "envpool_env", "torchrl_collector", "offpolicy_gymnasium",
             "offpolicy_envpool_16", "offpolicy_envpool_64", "offpolicy_lanes_16", "offpolicy_lanes_64",
             "offpolicy_envpool_2w")
#: --out: the collector's targets, which the docs' table shows beside the rows they apply to
TARGETS = {"offpolicy_envpool_16": "ratio to raw >= 1.2", "offpolicy_envpool_64": "ratio to raw >= 1.2",
           "offpolicy_envpool_2w": ">= 1.8 x 1 worker"}
#: --out: a worker's phases (the collector's metrics' names), each configuration's missing ones as 0
PHASES = ("env_step", "policy", "buffer_write", "weight_sync", "pack")


def dims(env_id: str) -> tuple[int, int]:
    """``(observation width, action width)`` of an EnvPool task."""
    return observation_layout(env_id).dims["observation"], envpool.make_spec(env_id).gymnasium_action_space.shape[0]


def sac_actor(env_id: str = ENV):
    return make_actor("sac", *dims(env_id), hidden_dim=512, use_layer_norm=True)


def timed_loop(step, batch: int, seconds: float) -> float:
    """Calls ``step()`` for ``seconds``; env steps per second, ``batch`` per call unless ``step`` returns its count."""
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        counted = step()
        steps += batch if counted is None else counted
    return steps / (time.perf_counter() - start)


def raw_gym(seconds: float) -> float:
    env = gym.make(ENV)
    env.reset(seed=0)
    rng = np.random.default_rng(0)
    low, high = env.action_space.low, env.action_space.high

    def step():
        _, _, terminated, truncated, _ = env.step(rng.uniform(low, high))
        if terminated or truncated:
            env.reset()

    return timed_loop(step, 1, seconds)


def bare_mujoco() -> Callable[[float], float]:
    """The ceiling: NUM_ENVS MjData stepped in a Python loop, no env logic at all."""
    model = gym.make(ENV).unwrapped.model
    data = [mujoco.MjData(model) for _ in range(NUM_ENVS)]
    rng = np.random.default_rng(0)

    def step():
        for ctrl, one in zip(rng.uniform(-1, 1, (NUM_ENVS, model.nu)), data):
            one.ctrl[:] = ctrl
            mujoco.mj_step(model, one, nstep=FRAME_SKIP)

    return functools.partial(timed_loop, step, NUM_ENVS)


class EnvPoolAlone:
    """EnvPool's own loop, one thread, random actions: transitions per second, not counting the reset state EnvPool
    returns on a finished env's next step (``elapsed_step == 0``)."""

    def __init__(self, env_id: str = ENV, num_envs: int | None = None) -> None:
        self.num_envs = num_envs or NUM_ENVS
        self.env = envpool.make_gymnasium(env_id, num_envs=self.num_envs, num_threads=1, seed=0)
        self.env.reset()
        self.rng = np.random.default_rng(0)
        self.action_dim = dims(env_id)[1]

    def __call__(self, seconds: float) -> float:
        def step() -> int:
            info = self.env.step(self.rng.uniform(-1, 1, (self.num_envs, self.action_dim)))[-1]
            return int(np.count_nonzero(info["elapsed_step"]))

        return timed_loop(step, self.num_envs, seconds)


def envpool_env_alone(env_id: str = ENV) -> Callable[[float], float]:
    """Our EnvPoolEnv, random actions."""
    env = EnvPoolEnv(env_id, NUM_ENVS, seed=0)
    td = env.reset()
    low, width = env.action_spec.space.low, env.action_spec.space.high - env.action_spec.space.low

    def step():
        nonlocal td
        # drawn as cheaply as EnvPoolAlone draws its own: action_spec.rand() costs ~100 us a batch
        td["action"] = low + width * torch.rand(width.shape)
        _, td = env.step_and_maybe_reset(td)

    return functools.partial(timed_loop, step, NUM_ENVS)


class TorchRLCollector:
    """TorchRL's Collector over GymEnv(num_envs=16), iterated for a window at a time."""

    def __init__(self) -> None:
        torch.set_num_threads(1)
        env = TransformedEnv(GymEnv(ENV, num_envs=NUM_ENVS), DoubleToFloat())
        self.collector = Collector(env, sac_actor(), frames_per_batch=1024, total_frames=-1)
        self.batches = iter(self.collector)
        next(self.batches)  # start-up

    def __call__(self, seconds: float) -> float:
        return timed_loop(lambda: next(self.batches).numel(), 0, seconds)

    def close(self) -> None:
        self.collector.shutdown()


class OffPolicy:
    """An OffPolicyCollector kept paused between measurement windows; it also sums the workers' phase times.

    ``env``: a factory of the env each worker steps, in place of ``env_id``'s; ``actor``: in place of the 512-wide
    SAC actor; ``start_timeout``: seconds the workers may take to write their first two batches.
    """

    def __init__(self, num_workers: int, num_envs: int = NUM_ENVS, engine: str = "auto", lanes: int = 1,
                 env_id: str = ENV, frames_per_batch: int = 1024, buffer_size: int = 200_000,
                 env: Callable | None = None, actor=None, start_timeout: float = 120.0) -> None:
        self.num_workers = num_workers
        self.replay_buffer = make_replay_buffer(buffer_size)
        actor = sac_actor(env_id) if actor is None else actor
        options = dict(num_workers=num_workers, frames_per_batch=frames_per_batch, replay_buffer=self.replay_buffer,
                       seed=0)
        if env is not None:
            self.collector = OffPolicyCollector(env, actor, **options)
        elif lanes > 1:
            env = functools.partial(EnvPoolEnv, env_id, num_envs, lanes=lanes)
            self.collector = OffPolicyCollector(env, actor, **options)
        else:
            self.collector = OffPolicyCollector(env_id, actor, num_envs=num_envs, engine=engine, **options)
        self.collector.start()
        # past process start-up
        self.collector.wait_for_frames(2 * frames_per_batch * num_workers, timeout=start_timeout)
        self._pause = self.collector.pause()
        self._pause.__enter__()
        self.phase_seconds: dict[str, float] = {}
        self.window_seconds = 0.0
        self.window_frames = 0

    def __call__(self, seconds: float, warmup_frames: int = 0) -> float:
        """Env steps per second over ``seconds``, from the first batch boundary after ``warmup_frames`` more frames."""
        collector = self.collector
        self._pause.__exit__(None, None, None)
        try:
            # From one batch boundary to another: no partial batch inside the window.
            collector.wait_for_frames(collector.frames_written + warmup_frames + 1, timeout=60)
            f0, t0, m0 = collector.frames_written, time.perf_counter(), collector.metrics()
            time.sleep(seconds)
            collector.wait_for_frames(collector.frames_written + 1, timeout=60)
            f1, t1, m1 = collector.frames_written, time.perf_counter(), collector.metrics()
        finally:
            self._pause = collector.pause()
            self._pause.__enter__()
        for phase, total in m1["time"].items():
            self.phase_seconds[phase] = self.phase_seconds.get(phase, 0.0) + total - m0["time"][phase]
        self.window_seconds += (t1 - t0) * self.num_workers
        self.window_frames += f1 - f0
        return (f1 - f0) / (t1 - t0)

    def breakdown(self) -> dict[str, float]:
        """Microseconds of worker time per env step, by phase; ``other`` is the loop's own bookkeeping."""
        # "wait" (for the frame allowance) is left in "other": a batch's wait includes the pause before the
        # window, which the window's wall time does not
        us = {p: 1e6 * t / self.window_frames for p, t in self.phase_seconds.items() if t > 0 and p != "wait"}
        us["other"] = 1e6 * self.window_seconds / self.window_frames - sum(us.values())
        return {p: round(v, 1) for p, v in us.items()}

    def close(self) -> None:
        self._pause.__exit__(None, None, None)
        self.collector.shutdown()


def actor_after_physics(num_envs: int, calls: int = 300) -> dict[str, float]:
    """Actor microseconds per env: right after an EnvPool step of the batch, and called again at once (warm)."""
    torch.set_num_threads(1)
    env = EnvPoolEnv(ENV, num_envs, seed=0)
    td = env.reset()
    policy = tensor_policy(sac_actor())
    cold, warm = [], []
    with torch.no_grad(), set_exploration_type(ExplorationType.RANDOM):
        for _ in range(calls):
            values = {"observation": td["observation"], "is_init": torch.zeros(num_envs, 1, dtype=torch.bool)}
            t0 = time.perf_counter()
            action = policy(values)
            t1 = time.perf_counter()
            policy(values)
            cold.append(t1 - t0)
            warm.append(time.perf_counter() - t1)
            td["action"] = action
            _, td = env.step_and_maybe_reset(td)
    env.close()
    return {"after_physics": round(1e6 * statistics.median(cold) / num_envs, 2),
            "warm": round(1e6 * statistics.median(warm) / num_envs, 2)}


def interleaved(configs: dict, rounds: int, seconds: float) -> dict[str, list[float]]:
    """Runs each configuration for ``seconds`` in turn, ``rounds`` times; the rates per configuration."""
    rates: dict[str, list[float]] = {name: [] for name in configs}
    for _ in range(rounds):
        for name, measure in configs.items():
            rates[name].append(measure(seconds))
    return rates


def median_ratio(num: list[float], den: list[float]) -> float:
    return statistics.median(a / b for a, b in zip(num, den))


def ratio(num: list[float], den: list[float]) -> float:
    return round(median_ratio(num, den), 3)


def per_round(num: list[float], den: list[float]) -> list[float]:
    return [round(a / b, 3) for a, b in zip(num, den)]


def measured(configs: dict, rounds: int, seconds: float) -> tuple[dict[str, list[float]], dict[str, dict]]:
    """:func:`interleaved`'s rates and each :class:`OffPolicy`'s breakdown; the collectors are closed after."""
    try:
        rates = interleaved(configs, rounds, seconds)
        return rates, {name: c.breakdown() for name, c in configs.items() if isinstance(c, OffPolicy)}
    finally:
        for c in configs.values():
            if isinstance(c, (OffPolicy, TorchRLCollector)):
                c.close()


def machine(load_start: float) -> dict:
    """The JSON line's last keys: the load average at the start and now, and the machine."""
    return {"load_average_start_end": [round(load_start, 2), round(os.getloadavg()[0], 2)],
            "machine": f"{platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}"}


def task_throughput(env_id: str, rounds: int, seconds: float) -> dict:
    """``--task``: EnvPool alone, our env alone and one collector worker on ``env_id``, in alternating rounds."""
    load_start = os.getloadavg()[0]
    torch.set_num_threads(1)
    wide, alone_wide = f"offpolicy_task_{LANES_ENVS}_lanes2", f"envpool_{LANES_ENVS}"
    rates, breakdown = measured({
        "envpool": EnvPoolAlone(env_id), "envpool_env": envpool_env_alone(env_id),
        "offpolicy_task": OffPolicy(1, env_id=env_id), alone_wide: EnvPoolAlone(env_id, LANES_ENVS),
        wide: OffPolicy(1, num_envs=LANES_ENVS, lanes=2, env_id=env_id)}, rounds, seconds)
    layout = observation_layout(env_id)
    out = {"benchmark": "collector_throughput", "task": env_id, "family": layout.family, "keys": layout.dims,
           "num_envs": NUM_ENVS, "unit": "env steps/s", "rounds": rounds, "seconds_per_round": seconds,
           **{name: round(statistics.median(r), 1) for name, r in rates.items()}}
    out["ratio_offpolicy_over_envpool"] = ratio(rates["offpolicy_task"], rates["envpool"])
    out["ratio_envpool_env_over_envpool"] = ratio(rates["envpool_env"], rates["envpool"])
    out["ratio_offpolicy_over_envpool_per_round"] = per_round(rates["offpolicy_task"], rates["envpool"])
    # 64 envs a worker, the policy of one half computed while EnvPool steps the other (where a core is idle for
    # EnvPool's second lane), against EnvPool alone on the same 64 envs
    out[f"ratio_offpolicy_{LANES_ENVS}_lanes2_over_envpool_{LANES_ENVS}"] = ratio(rates[wide], rates[alone_wide])
    if env_id in TASK_TARGETS:
        out["target"] = TASK_TARGETS[env_id]
        out["target_met"] = median_ratio(rates["offpolicy_task"], rates["envpool"]) >= TASK_TARGETS[env_id]
    out["breakdown_us_per_step"] = breakdown["offpolicy_task"]
    out[f"breakdown_us_per_step_{LANES_ENVS}_lanes2"] = breakdown[wide]
    return out | machine(load_start)


def results_file(out: dict) -> dict:
    """``--out``'s file from a full run's JSON line ``out``: the rates, ratios to the raw loop, phases and actor
    costs that ``benchmarks/report.py`` turns into README's and the collector page's tables."""
    spread = out["ratio_envpool_16_over_raw_per_round"]
    load = out["load_average_start_end"]
    return {
        **provenance("collector_throughput", *load), "task": ENV,
        "actor": "512-wide LayerNorm SAC actor", "rounds": out["rounds"], "seconds": out["seconds_per_round"],
        "load_average_start_end": load,
        "steps_per_s": {key: round(out[key]) for key in RATE_KEYS},
        "ratio_over_raw": {"raw": 1, **{key: round(out[f"ratio_{key}_over_raw"], 2) for key in RATE_KEYS[1:]}},
        "ratio_envpool_16_over_raw_range": [round(min(spread), 2), round(max(spread), 2)],
        "ratio_2w_over_1w": round(out["ratio_2w_over_1w"], 2), "targets": TARGETS,
        "breakdown_us_per_step": {name: {phase: phases.get(phase, 0.0) for phase in (*PHASES, "other")}
                                  for name, phases in out["breakdown_us_per_step"].items()},
        "actor_us_per_env": {f"{envs}_envs_{kind}": round(us) for envs, figures in out["actor_us_per_env"].items()
                             for kind, us in sorted(figures.items(), reverse=True)},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds per configuration")
    parser.add_argument("--seconds", type=float, default=3.0, help="measurement window per round")
    parser.add_argument("--group", choices=("all", "lanes"), default="all",
                        help="'lanes': only raw, the EnvPool collector rows and the overlapped (lanes) rows")
    parser.add_argument("--task", default=None,
                        help="one EnvPool task (e.g. Go1JoystickFlatTerrain-v1, CheetahRun-v1): "
                             "our collector against EnvPool alone on it")
    parser.add_argument("--out", type=Path, default=None,
                        help="with --group all: also write the docs' figures to this file (results_file)")
    args = parser.parse_args()
    if args.out is not None and (args.task is not None or args.group != "all"):
        parser.error(f"--out needs --group all and no --task (got --group {args.group}, --task {args.task})")
    if args.task is not None:
        print(json.dumps(task_throughput(args.task, args.rounds, args.seconds)))
        return
    load_start, full = os.getloadavg()[0], args.group == "all"
    out = {"benchmark": "collector_throughput", "env": ENV, "unit": "env steps/s", "rounds": args.rounds,
           "seconds_per_round": args.seconds, "group": args.group,
           "actor_us_per_env": {n: actor_after_physics(n) for n in (NUM_ENVS, 64)}}
    configs = {"raw": raw_gym}
    if full:
        configs |= {"bare_mujoco": bare_mujoco(), "envpool": EnvPoolAlone(), "envpool_env": envpool_env_alone(),
                    "torchrl_collector": TorchRLCollector(), "offpolicy_gymnasium": OffPolicy(1, engine="gymnasium")}
    for kind, lanes in (("envpool", 1), ("lanes", 2)):
        configs |= {f"offpolicy_{kind}_{n}": OffPolicy(1, num_envs=n, lanes=lanes) for n in (NUM_ENVS, 64)}
    first, breakdown = measured(configs, args.rounds, args.seconds)
    out.update({name: round(statistics.median(r), 1) for name, r in first.items()})
    if full:
        second, two = measured({"raw": raw_gym, "offpolicy_envpool_2w": OffPolicy(2)}, args.rounds, args.seconds)
        breakdown |= two
        out["offpolicy_envpool_2w"] = round(statistics.median(second["offpolicy_envpool_2w"]), 1)
    out |= {f"ratio_{name}_over_raw": ratio(rates, first["raw"]) for name, rates in first.items() if name != "raw"}
    for n in (NUM_ENVS, 64):
        out[f"ratio_lanes_{n}_over_envpool_{n}"] = ratio(first[f"offpolicy_lanes_{n}"], first[f"offpolicy_envpool_{n}"])
    if full:
        out["ratio_offpolicy_envpool_2w_over_raw"] = ratio(second["offpolicy_envpool_2w"], second["raw"])
        out["ratio_2w_over_1w"] = round(out["offpolicy_envpool_2w"] / out["offpolicy_envpool_16"], 3)
    out["ratio_envpool_16_over_raw_per_round"] = per_round(first["offpolicy_envpool_16"], first["raw"])
    out |= {"breakdown_us_per_step": breakdown} | machine(load_start)
    print(json.dumps(out))
    if args.out is not None:
        args.out.write_text(json.dumps(results_file(out), indent=1) + "\n")


if __name__ == "__main__":
    main()
