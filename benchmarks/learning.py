"""Learning benchmark: seeded trainings of the recipes, a results table and learning-curve plots.

Suites (each run is ``recipes/<algo>.py`` called in-process with Hydra overrides):

* ``pendulum``: SAC on Pendulum-v1, 3 seeds, 15k frames; target: mean
  deterministic eval return >= -200. About 7 minutes per seed on 2 CPU cores.
* ``halfcheetah``: SAC and TD3 on HalfCheetah-v5, 3 seeds each, 100k frames;
  target >= 3000. Hours on 2 CPU cores (the learner does ~40 updates/s).
* ``robot`` (issue 18): SAC on the Control Suite's CheetahRun-v1 and WalkerWalk-v1,
  100k frames, 2 seeds each; TD3 on MuJoCo Playground's Go1JoystickFlatTerrain-v1,
  100k frames, 2 seeds, with the asymmetric critic (``network.critic_input=privileged``)
  and with the symmetric one, the pair to compare. The Control Suite targets (300 and
  400) are what published SAC curves reach around 100k frames, a reference for this
  suite rather than a figure measured here; Go1 has none (the comparison is the result).
  Hours on 2 CPU cores; not run in the issue-18 session.

Writes ``results.md`` and ``results.csv`` (final and best eval return per
run, their means over seeds -- a task passes on the mean final return --,
frames and wall-clock time) and ``<suite>_<algo>.png`` (eval return
against frames and against wall-clock minutes, one line per seed) to
``--out``, keeps each run's directory under ``--out/runs``, and prints one
JSON line per task.

    python benchmarks/learning.py --suite pendulum [--seeds 0 1 2] [--out benchmarks/results/learning]
    python benchmarks/learning.py --suite robot    # seeds 0 1 (the suite's own) unless --seeds is given
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

from hydra import compose, initialize_config_dir

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Task:
    """One algorithm on one env, with its overrides and the return it should reach."""

    algo: str
    env: str
    frames: int
    target: float | None
    overrides: list[str] = field(default_factory=list)
    seeds: tuple[int, ...] | None = None
    """the suite's seeds, used unless ``--seeds`` is given"""
    label: str = ""
    """tells apart two runs of one algorithm on one env (file names, the table)"""

    @property
    def name(self) -> str:
        return "_".join(filter(None, (self.algo, self.env, self.label)))


SUITES: dict[str, list[Task]] = {
    "pendulum": [
        Task("sac", "Pendulum-v1", 15_000, -200.0, [
            "collector.init_random_frames=1000", "network.hidden_sizes=[128,128]", "optim.batch_size=256",
            "optim.utd_ratio=1.0", "optim.lr=3e-4", "logger.eval_iter=2500", "logger.num_eval_envs=10",
        ]),
    ],
    "halfcheetah": [
        Task("sac", "HalfCheetah-v5", 100_000, 3000.0, ["logger.eval_iter=10000", "replay_buffer.size=100000"]),
        Task("td3", "HalfCheetah-v5", 100_000, 3000.0, ["logger.eval_iter=10000", "replay_buffer.size=100000"]),
    ],
    "robot": [
        Task("sac", "CheetahRun-v1", 100_000, 300.0, ["logger.eval_iter=10000", "replay_buffer.size=100000"],
             seeds=(0, 1)),
        Task("sac", "WalkerWalk-v1", 100_000, 400.0, ["logger.eval_iter=10000", "replay_buffer.size=100000"],
             seeds=(0, 1)),
        Task("td3", "Go1JoystickFlatTerrain-v1", 100_000, None,
             ["logger.eval_iter=10000", "replay_buffer.size=100000", "network.critic_input=privileged",
              "network.obs_norm=true"], seeds=(0, 1), label="privileged"),
        Task("td3", "Go1JoystickFlatTerrain-v1", 100_000, None,
             ["logger.eval_iter=10000", "replay_buffer.size=100000", "network.critic_input=observation",
              "network.obs_norm=true"], seeds=(0, 1), label="symmetric"),
    ],
}


def run(task: Task, seed: int, run_dir: Path) -> dict:
    sys.path.insert(0, str(ROOT / "recipes"))
    recipe = __import__(task.algo)  # recipes/sac.py or recipes/td3.py
    with initialize_config_dir(config_dir=str(ROOT / "recipes" / "config"), version_base="1.3"):
        cfg = compose(config_name=task.algo, overrides=[
            f"env.name={task.env}", f"env.seed={seed}", f"collector.total_frames={task.frames}",
            f"logger.log_dir={run_dir}", "logger.progress_bar=false", "logger.checkpoint_every=0", *task.overrides,
        ])
    summary = recipe.main(cfg)
    exp = run_dir / cfg.logger.exp_name / "scalars"
    curve = [tuple(map(float, line.split(","))) for line in open(exp / "eval" / "return.csv")]
    elapsed = dict(tuple(map(float, line.split(","))) for line in open(exp / "time" / "elapsed_s.csv"))
    return {**summary, "curve": curve, "elapsed_at": elapsed}


def plot(path: Path, title: str, runs: dict[int, dict]) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 4), dpi=100)
    FigureCanvasAgg(fig)
    left, right = fig.subplots(1, 2)
    for seed, result in runs.items():
        frames = [f for f, _ in result["curve"]]
        values = [v for _, v in result["curve"]]
        # wall-clock of each evaluation: the nearest logged elapsed time at or before its frame count
        times = [max((t for f2, t in result["elapsed_at"].items() if f2 <= f), default=0.0) / 60 for f in frames]
        left.plot(frames, values, marker="o", markersize=3, label=f"seed {seed}")
        right.plot(times, values, marker="o", markersize=3, label=f"seed {seed}")
    for ax, label in ((left, "frames"), (right, "wall-clock time (min)")):
        ax.set_xlabel(label)
        ax.set_ylabel("deterministic eval return")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--suite", choices=[*SUITES, "all"], default="pendulum")
    parser.add_argument("--seeds", type=int, nargs="+", default=None, help="default: the suite's, else 0 1 2")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "learning")
    args = parser.parse_args()
    suites = list(SUITES) if args.suite == "all" else [args.suite]
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for suite in suites:
        for task in SUITES[suite]:
            seeds = args.seeds or task.seeds or (0, 1, 2)
            runs = {seed: run(task, seed, args.out / "runs" / f"{task.name}_seed{seed}") for seed in seeds}
            seeds = f"{len(runs)} seed" + "s" * (len(runs) != 1)
            label = f" {task.label}" if task.label else ""
            png = f"{suite}_{task.algo}.png" if suite in ("pendulum", "halfcheetah") else f"{suite}_{task.name}.png"
            plot(args.out / png, f"{task.algo.upper()} {task.env}{label} ({seeds})", runs)
            finals = [r["final_return"] for r in runs.values()]
            bests = [max(v for _, v in r["curve"]) for r in runs.values()]
            mean = statistics.mean(finals)
            row = {"suite": suite, "algo": task.algo + (f" ({task.label})" if task.label else ""), "env": task.env,
                   "frames": task.frames,
                   "seeds": len(finals), "final_returns": [round(v, 1) for v in finals],
                   "mean_return": round(mean, 1), "best_returns": [round(v, 1) for v in bests],
                   "mean_best_return": round(statistics.mean(bests), 1), "target": task.target,
                   "passed": None if task.target is None else mean >= task.target,
                   "mean_wall_clock_min": round(statistics.mean(r["elapsed_s"] for r in runs.values()) / 60, 1),
                   "mean_updates": round(statistics.mean(r["updates"] for r in runs.values()))}
            rows.append(row)
            print(json.dumps({"benchmark": "learning", **row}), flush=True)
    with open(args.out / "results.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    lines = ["| algo | env | frames | seeds | final returns | mean | best returns | mean best | target "
             "| passed (final mean) | wall-clock (min/run) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    lines += [f"| {r['algo']} | {r['env']} | {r['frames']} | {r['seeds']} | {r['final_returns']} | {r['mean_return']} "
              f"| {r['best_returns']} | {r['mean_best_return']} | {r['target']} | {r['passed']} "
              f"| {r['mean_wall_clock_min']} |" for r in rows]
    (args.out / "results.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
