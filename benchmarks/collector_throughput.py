"""Collection throughput on HalfCheetah-v5: the simulators, TorchRL, and OffPolicyCollector on both engines.

Measures env steps per second, each configuration in alternating rounds (every
collector kept alive and paused between its rounds, windows on batch boundaries)
so that a shared machine's drifts weigh on all alike:

* ``raw``: a single-process gymnasium loop with random actions, the row every ratio is to;
* ``bare_mujoco``, ``envpool``, ``envpool_env``: 16 ``MjData`` in a Python loop, EnvPool
  alone (one thread), our :class:`~torchrl_unilab.EnvPoolEnv` alone, random actions;
* ``torchrl_collector``: TorchRL's ``Collector`` over ``GymEnv(num_envs=16)``;
* ``offpolicy_*``: ``OffPolicyCollector`` with the 512-wide LayerNorm SAC actor writing into
  a shared buffer: 1 worker x 16 envs on gymnasium, on EnvPool with 16 and 64 envs, with
  ``lanes=2`` (policy overlapped with physics), and 2 workers x 16 envs;
* ``actor_us_per_env``: the actor alone right after an EnvPool step and warm, per env.

``--task ID`` (a MuJoCo Playground or Control Suite id: ``Go1JoystickFlatTerrain-v1``,
``CheetahRun-v1``) measures that task only: EnvPool alone, ``EnvPoolEnv`` alone and the
collector (1 worker x 16 envs, rows with ``"privileged"``), with
``ratio_offpolicy_over_envpool`` against its target, and one worker x 64 envs in two
lanes against EnvPool alone on 64 envs. EnvPool alone counts transitions, not the
reset rows its autoreset returns. ``--group lanes`` runs only the
lanes comparison.

Run::

    python benchmarks/collector_throughput.py [--rounds 5] [--seconds 3] [--group all|lanes] [--task ID]
    python benchmarks/collector_throughput.py --out benchmarks/results/collector/halfcheetah.json

It prints one JSON line: rates (medians over rounds), ``ratio_*_over_raw`` (medians of the
per-round ratios), each worker's ``breakdown_us_per_step`` by phase, and the load average
at the start and end. ``benchmarks/README.md`` lists every key. ``--out FILE`` (with
``--group all``) also writes the figures the docs show, as ``benchmarks/report.py`` reads
them (:func:`results_file`).
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


class BareMujoco:
    """The ceiling: NUM_ENVS MjData stepped in a Python loop, no env logic at all."""

    def __init__(self) -> None:
        self.model = gym.make(ENV).unwrapped.model
        self.data = [mujoco.MjData(self.model) for _ in range(NUM_ENVS)]
        self.rng = np.random.default_rng(0)

    def __call__(self, seconds: float) -> float:
        model, data = self.model, self.data

        def step():
            controls = self.rng.uniform(-1, 1, (NUM_ENVS, model.nu))
            for ctrl, d in zip(controls, data):
                d.ctrl[:] = ctrl
                mujoco.mj_step(model, d, nstep=FRAME_SKIP)

        return timed_loop(step, NUM_ENVS, seconds)


class EnvPoolAlone:
    """EnvPool's own loop, one thread, random actions: transitions per second.

    EnvPool resets a finished env on its next step and returns the reset state
    (``elapsed_step == 0``) instead of a transition; those rows are not counted.
    A Go1 under random actions falls every ~42 steps, so about 2.4 % of its rows
    are reset rows.
    """

    def __init__(self, env_id: str = ENV, num_envs: int | None = None) -> None:
        self.num_envs = num_envs or NUM_ENVS
        self.env = envpool.make_gymnasium(env_id, num_envs=self.num_envs, num_threads=1, seed=0)
        self.env.reset()
        self.rng = np.random.default_rng(0)
        self.action_dim = dims(env_id)[1]

    def __call__(self, seconds: float) -> float:
        shape = (self.num_envs, self.action_dim)

        def step() -> int:
            info = self.env.step(self.rng.uniform(-1, 1, shape))[-1]
            return int(np.count_nonzero(info["elapsed_step"]))

        return timed_loop(step, self.num_envs, seconds)


class EnvPoolEnvAlone:
    def __init__(self, env_id: str = ENV) -> None:
        self.env = EnvPoolEnv(env_id, NUM_ENVS, seed=0)
        self.td = self.env.reset()
        space = self.env.action_spec.space
        self.low, self.width = space.low, space.high - space.low

    def __call__(self, seconds: float) -> float:
        def step():
            # Drawn as cheaply as EnvPoolAlone draws its own: action_spec.rand() costs ~100 us a batch
            self.td["action"] = self.low + self.width * torch.rand(self.width.shape)
            _, self.td = self.env.step_and_maybe_reset(self.td)

        return timed_loop(step, NUM_ENVS, seconds)


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
    """An OffPolicyCollector kept paused between measurement windows; it also sums the workers' phase times."""

    def __init__(self, num_workers: int, num_envs: int = NUM_ENVS, engine: str = "auto", lanes: int = 1,
                 env_id: str = ENV, frames_per_batch: int = 1024, buffer_size: int = 200_000) -> None:
        self.num_workers = num_workers
        options = dict(num_workers=num_workers, frames_per_batch=frames_per_batch,
                       replay_buffer=make_replay_buffer(buffer_size), seed=0)
        if lanes > 1:
            env = functools.partial(EnvPoolEnv, env_id, num_envs, lanes=lanes)
            self.collector = OffPolicyCollector(env, sac_actor(env_id), **options)
        else:
            self.collector = OffPolicyCollector(env_id, sac_actor(env_id), num_envs=num_envs, engine=engine, **options)
        self.collector.start()
        self.collector.wait_for_frames(2 * frames_per_batch * num_workers, timeout=120)  # past process start-up
        self._pause = self.collector.pause()
        self._pause.__enter__()
        self.phase_seconds: dict[str, float] = {}
        self.window_seconds = 0.0
        self.window_frames = 0

    def __call__(self, seconds: float) -> float:
        collector = self.collector
        self._pause.__exit__(None, None, None)
        try:
            # From one batch boundary to another: no partial batch inside the window.
            collector.wait_for_frames(collector.frames_written + 1, timeout=60)
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
            t2 = time.perf_counter()
            cold.append(t1 - t0)
            warm.append(t2 - t1)
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


def task_throughput(env_id: str, rounds: int, seconds: float) -> dict:
    """``--task``: EnvPool alone, our env alone and one collector worker on ``env_id``, in alternating rounds."""
    load_start = os.getloadavg()
    torch.set_num_threads(1)
    collector = OffPolicy(1, env_id=env_id)
    wide = OffPolicy(1, num_envs=LANES_ENVS, lanes=2, env_id=env_id)
    try:
        rates = interleaved({"envpool": EnvPoolAlone(env_id), "envpool_env": EnvPoolEnvAlone(env_id),
                             "offpolicy_task": collector, f"envpool_{LANES_ENVS}": EnvPoolAlone(env_id, LANES_ENVS),
                             f"offpolicy_task_{LANES_ENVS}_lanes2": wide}, rounds, seconds)
        breakdown = collector.breakdown()
        breakdown_lanes = wide.breakdown()
    finally:
        collector.close()
        wide.close()
    out = {"benchmark": "collector_throughput", "task": env_id, "family": observation_layout(env_id).family,
           "keys": observation_layout(env_id).dims, "num_envs": NUM_ENVS, "unit": "env steps/s", "rounds": rounds,
           "seconds_per_round": seconds}
    out.update({name: round(statistics.median(r), 1) for name, r in rates.items()})
    ratio = median_ratio(rates["offpolicy_task"], rates["envpool"])
    out["ratio_offpolicy_over_envpool"] = round(ratio, 3)
    out["ratio_envpool_env_over_envpool"] = round(median_ratio(rates["envpool_env"], rates["envpool"]), 3)
    out["ratio_offpolicy_over_envpool_per_round"] = [
        round(a / b, 3) for a, b in zip(rates["offpolicy_task"], rates["envpool"])]
    # where a core is idle for EnvPool's second lane: 64 envs a worker, the policy of one half computed while
    # EnvPool steps the other, against EnvPool alone on the same 64 envs
    out[f"ratio_offpolicy_{LANES_ENVS}_lanes2_over_envpool_{LANES_ENVS}"] = round(
        median_ratio(rates[f"offpolicy_task_{LANES_ENVS}_lanes2"], rates[f"envpool_{LANES_ENVS}"]), 3)
    if env_id in TASK_TARGETS:
        out["target"] = TASK_TARGETS[env_id]
        out["target_met"] = ratio >= TASK_TARGETS[env_id]
    out["breakdown_us_per_step"] = breakdown
    out[f"breakdown_us_per_step_{LANES_ENVS}_lanes2"] = breakdown_lanes
    out["load_average_start_end"] = [round(load_start[0], 2), round(os.getloadavg()[0], 2)]
    out["machine"] = f"{platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}"
    return out


def results_file(out: dict) -> dict:
    """``--out``'s file from a full run's JSON line ``out``: the rates, ratios to the raw loop, phases and actor
    costs that ``benchmarks/report.py`` turns into README's and the collector page's tables."""
    per_round = out["ratio_envpool_16_over_raw_per_round"]
    load = out["load_average_start_end"]
    return {
        **provenance("collector_throughput", *load), "task": ENV,
        "actor": "512-wide LayerNorm SAC actor", "rounds": out["rounds"], "seconds": out["seconds_per_round"],
        "load_average_start_end": load,
        "steps_per_s": {key: round(out[key]) for key in RATE_KEYS},
        "ratio_over_raw": {"raw": 1, **{key: round(out[f"ratio_{key}_over_raw"], 2) for key in RATE_KEYS[1:]}},
        "ratio_envpool_16_over_raw_range": [round(min(per_round), 2), round(max(per_round), 2)],
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
    load_start = os.getloadavg()
    out = {"benchmark": "collector_throughput", "env": ENV, "unit": "env steps/s", "rounds": args.rounds,
           "seconds_per_round": args.seconds, "group": args.group}
    out["actor_us_per_env"] = {n: actor_after_physics(n) for n in (NUM_ENVS, 64)}
    collectors = {
        "offpolicy_envpool_16": OffPolicy(1),
        "offpolicy_envpool_64": OffPolicy(1, num_envs=64),
        "offpolicy_lanes_16": OffPolicy(1, lanes=2),
        "offpolicy_lanes_64": OffPolicy(1, num_envs=64, lanes=2),
    }
    if args.group == "all":
        collectors = {"torchrl_collector": TorchRLCollector(), "offpolicy_gymnasium": OffPolicy(1, engine="gymnasium"),
                      **collectors}
    simulators = {"bare_mujoco": BareMujoco(), "envpool": EnvPoolAlone(),
                  "envpool_env": EnvPoolEnvAlone()} if args.group == "all" else {}
    try:
        first = interleaved({"raw": raw_gym, **simulators, **collectors}, args.rounds, args.seconds)
        breakdown = {name: c.breakdown() for name, c in collectors.items() if isinstance(c, OffPolicy)}
    finally:
        for c in collectors.values():
            c.close()
    figures = dict(first)
    if args.group == "all":
        two = OffPolicy(2)
        try:
            second = interleaved({"raw": raw_gym, "offpolicy_envpool_2w": two}, args.rounds, args.seconds)
            breakdown["offpolicy_envpool_2w"] = two.breakdown()
        finally:
            two.close()
        figures["offpolicy_envpool_2w"] = second["offpolicy_envpool_2w"]
    out.update({name: round(statistics.median(r), 1) for name, r in figures.items()})
    for name, rates in first.items():
        if name != "raw":
            out[f"ratio_{name}_over_raw"] = round(median_ratio(rates, first["raw"]), 3)
    for n in (16, 64):
        out[f"ratio_lanes_{n}_over_envpool_{n}"] = round(
            median_ratio(first[f"offpolicy_lanes_{n}"], first[f"offpolicy_envpool_{n}"]), 3)
    if args.group == "all":
        out["ratio_offpolicy_envpool_2w_over_raw"] = round(
            median_ratio(second["offpolicy_envpool_2w"], second["raw"]), 3)
        out["ratio_2w_over_1w"] = round(out["offpolicy_envpool_2w"] / out["offpolicy_envpool_16"], 3)
    out["ratio_envpool_16_over_raw_per_round"] = [
        round(a / b, 3) for a, b in zip(first["offpolicy_envpool_16"], first["raw"])
    ]
    out["breakdown_us_per_step"] = breakdown
    out["load_average_start_end"] = [round(load_start[0], 2), round(os.getloadavg()[0], 2)]
    out["machine"] = f"{platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}"
    print(json.dumps(out))
    if args.out is not None:
        args.out.write_text(json.dumps(results_file(out), indent=1) + "\n")


if __name__ == "__main__":
    main()
