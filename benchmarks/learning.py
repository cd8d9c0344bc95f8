"""Learning benchmark: seeded trainings of the recipes, their evaluation returns, tables and learning curves.

Run::

    python benchmarks/learning.py --suite pendulum [--seeds 0 1 2]

See ``benchmarks/README.md``, section "Learning". It lists the suites (:data:`SUITES`), options and output files.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import math
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import sota_dropin
import wallclock
from common import (
    figure,
    kill_group,
    list_table,
    percentile_interval,
    provenance,
    recipe_config,
    recipe_script,
    scalar_rows,
    seed_count,
)

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Task:
    """One algorithm (``recipes/<algo>.py``, ``"sb3_td3"``/``"sb3_sac"`` or a key of :data:`TORCHRL_SCRIPTS`) on
    one env, with its overrides and the return it should reach."""

    algo: str
    env: str
    frames: int
    target: float | None
    overrides: list[str] = field(default_factory=list)
    seeds: tuple[int, ...] | None = None  # the suite's seeds, unless --seeds is given
    label: str = ""  # tells apart two runs of one algorithm on one env (file names, the table)
    minutes: float | None = None  # a wall-clock budget (max_minutes), a snapshot every minute; frames is a bound
    info_keys: tuple[str, ...] = ()  # EnvPool info entries each snapshot's evaluation reports (Go1's reward terms)
    config: str | None = None  # recipes/config/<config>.yaml; None: the algo's own
    rl_root: Path | None = None  # a pytorch/rl checkout (--rl-root), for TorchRL's own scripts

    @property
    def name(self) -> str:
        return "_".join(filter(None, (self.algo, self.env, self.label)))


#: The robot suite's Go1 runs collect with 4 envs per worker in place of ``td3_utd1``'s one.
GO1_COLLECTION = ["collector.env_per_collector=4", "collector.frames_per_batch=64"]
#: Go1's two critics: ``network.critic_input`` and the run's label.
GO1_CRITICS = (("privileged", "privileged"), ("observation", "symmetric"))
#: SAC and TD3 at one update per frame (SB3's schedule): the configs the suites measured at.
UTD1, TD3_UTD1 = "sac_utd1", "td3_utd1"
#: The 100k-frame suites' evaluation interval and buffer size.
EVERY_10K = ["logger.eval_iter=10000", "replay_buffer.size=100000"]

#: The ``wallclock`` suite's budget per run (``--minutes`` changes it) and its frame bound (never reached).
WALLCLOCK_MINUTES = 12.0
WALLCLOCK_FRAMES = 5_000_000
#: The levers screened against the defaults, each a change of one setting.
WALLCLOCK_CANDIDATES: dict[str, list[str]] = {
    "utd0.5": ["optim.utd_ratio=0.5"],
    "utd0.125": ["optim.utd_ratio=0.125"],
    "batch512": ["optim.batch_size=512"],
    "batch512_lr6e-4": ["optim.batch_size=512", "optim.lr=6e-4"],  # the learning rate scaled with the batch
    # past 2x, the learning rate scaled by the batch's square root (Adam's usual rule): 3e-4 * sqrt(4), * sqrt(8)
    "batch1024_lr6e-4": ["optim.batch_size=1024", "optim.lr=6e-4"],
    "batch2048_lr8.5e-4": ["optim.batch_size=2048", "optim.lr=8.5e-4"],
    "buffer100k": ["replay_buffer.size=100000"],  # sac_utd1's buffer size, at 4 frames per update
    "nstep3": ["collector.multi_step=3"],  # n-step returns (TorchRL's MultiStep in the workers)
    "layernorm": ["network.use_layer_norm=true"],  # in every hidden layer, as BRO and SimBa, without their residuals
    "bf16": ["optim.matmul_dtype=bf16"],  # the tensor-level loss's matmuls in bf16 (native on AVX512-BF16 / AMX)
}

#: CrossQ (``recipes/crossq.py``) screened at these critic widths (``network.critic_hidden_sizes``, two layers).
CROSSQ_WIDTHS = (256, 512, 1024)
#: The SB3 algorithm each of the suite's other algorithms is measured against.
SB3_COUNTERPART = {"crossq": "sac", "torchrl_sac": "sac"}

#: Go1 in FastTD3's Playground regime (fast_td3/hyperparams.py: 1024 envs, batch 32768, 8 updates per step of all
#: envs, gamma 0.97, tau 0.1, a noise std per env in [0.2, 0.8], observation normalisation) on 14 workers x 64 envs
#: and a cuda learner, with the recipe's critic (no C51 head) and MLPs.
GO1_GPU_MINUTES = 15.0
GO1_GPU = [
    "network.device=cuda", "collector.num_workers=14", "collector.env_per_collector=64",
    "collector.frames_per_batch=1024", "collector.max_lead_frames=65536", "collector.init_random_frames=10240",
    "collector.td3_noise=mixed", "collector.td3_std_min=0.2", "collector.td3_std_max=0.8",
    "optim.utd_ratio=0.0078125", "optim.batch_size=32768", "optim.lr=3e-4", "optim.gamma=0.97",
    "optim.target_update_polyak=0.9", "optim.policy_noise=0.2", "network.obs_norm=true",
    "network.hidden_sizes=[512,256,128]", "replay_buffer.size=2000000", "logger.num_eval_envs=16",
]
#: Go1's velocity-tracking reward terms (Playground's exp(-error^2 / 0.25), in (0, 1] per step): their mean per step
#: tells walking from standing. "Walks": the linear term's at least GO1_WALK_TRACKING (standing still earns 0.25 on
#: the suite's evaluation, random actions 0.22) with episodes at least GO1_WALK_LENGTH of the step limit (no falls).
GO1_WALK_TERMS = ("reward_tracking_lin_vel", "reward_tracking_ang_vel")
GO1_WALK_TRACKING = 0.6
GO1_WALK_LENGTH = 0.9


def against_sb3(algo: str, config: str) -> list[Task]:
    """The recipe at one update per frame (``config``) against SB3's ``algo`` on HalfCheetah-v5, 100k frames."""
    return [Task(algo, "HalfCheetah-v5", 100_000, None, ["logger.eval_iter=10000"], config=config),
            Task(f"sb3_{algo}", "HalfCheetah-v5", 100_000, None, config=config)]


def wallclock_tasks(algo: str, utd1: str, levers: dict[str, list[str]]) -> list[Task]:
    """The ``wallclock`` suite's runs of ``algo``: its defaults, one update per frame (the ``utd1`` config), each of
    ``levers``, and SB3's run, the reference."""
    runs = {"defaults": ([], None), "utd1": ([], utd1), **{label: (o, None) for label, o in levers.items()}}
    return [*(Task(algo, "HalfCheetah-v5", WALLCLOCK_FRAMES, None, overrides, minutes=WALLCLOCK_MINUTES, label=label,
                   config=config) for label, (overrides, config) in runs.items()),
            Task(f"sb3_{algo}", "HalfCheetah-v5", 100_000, None)]


SUITES: dict[str, list[Task]] = {
    "pendulum": [
        Task("sac", "Pendulum-v1", 15_000, -200.0, [
            "collector.init_random_frames=1000", "network.hidden_sizes=[128,128]", "optim.batch_size=256",
            "optim.utd_ratio=1.0", "optim.lr=3e-4", "logger.eval_iter=2500", "logger.num_eval_envs=10",
        ], config=UTD1),
    ],
    "halfcheetah": [Task(algo, "HalfCheetah-v5", 100_000, 3000.0, EVERY_10K, config=config)
                    for algo, config in (("sac", UTD1), ("td3", TD3_UTD1))],
    "robot": [
        *(Task("sac", env, 100_000, target, EVERY_10K, seeds=(0, 1), config=UTD1)
          for env, target in (("CheetahRun-v1", 300.0), ("WalkerWalk-v1", 400.0))),
        *(Task("td3", "Go1JoystickFlatTerrain-v1", 100_000, None,
               [*EVERY_10K, f"network.critic_input={critic}", "network.obs_norm=true", *GO1_COLLECTION],
               seeds=(0, 1), label=label, config=TD3_UTD1) for critic, label in GO1_CRITICS),
    ],
    "td3": against_sb3("td3", TD3_UTD1),  # the targets are relative (see compare_with_sb3)
    # the defaults, one update per frame, SAC's screened levers, CrossQ's widths; SB3 the reference (--algo
    # sb3_<algo>, or --sb3-reference with its saved results)
    "wallclock": [*wallclock_tasks("sac", UTD1, WALLCLOCK_CANDIDATES), *wallclock_tasks("td3", TD3_UTD1, {}),
                  *(Task("crossq", "HalfCheetah-v5", WALLCLOCK_FRAMES, None, [f"network.critic_hidden_sizes=[{w},{w}]"],
                         minutes=WALLCLOCK_MINUTES, label=f"crossq{w}") for w in CROSSQ_WIDTHS),
                  # the anchor a TorchRL user runs today: TorchRL's sac.py with its defaults (--rl-root)
                  Task("torchrl_sac", "HalfCheetah-v5", 1_000_000, None, minutes=WALLCLOCK_MINUTES)],
    "go1_gpu": [
        Task("td3", "Go1JoystickFlatTerrain-v1", WALLCLOCK_FRAMES * 20, None,
             [*GO1_GPU, f"network.critic_input={critic}"], seeds=(0,), label=label,
             minutes=GO1_GPU_MINUTES, info_keys=GO1_WALK_TERMS)
        for critic, label in GO1_CRITICS
    ],
    "sb3": against_sb3("sac", UTD1),  # the SAC recipe against SB3's SAC, same sizes and batch
}

#: Each algorithm's targets against SB3 (:func:`compare_with_sb3`'s keyword arguments).
SB3_TARGETS: dict[str, dict] = {
    "td3": {"from_mark": 30_000, "last_within": 0.1, "band_mark": 40_000},
    "sac": {"from_mark": 50_000, "last_within": None, "speedup": 1.5, "band_mark": 100_000},
}
#: Frames between two evaluations of an SB3 run or a TorchRL script: the marks the tables compare at.
SB3_EVAL_EVERY = 10_000

#: TorchRL's own scripts a task can run (its ``algo``), by their path in a pytorch/rl checkout.
TORCHRL_SCRIPTS = {"torchrl_sac": "sota-implementations/sac/sac.py"}
#: The longest a TorchRL script may take from its start to its main loop (imports, envs, collector).
TORCHRL_SETUP_LIMIT_S = 300.0
#: Runs the script after ``-c`` as its ``__main__``, its csv logger taking a list (sac.py logs a batch's episode
#: returns as one) as their mean: TorchRL's ``CSVExperiment.add_scalar`` raises on a list.
TORCHRL_CSV_BOOT = (
    "import runpy, statistics, sys; from torchrl.record.loggers import csv; add = csv.CSVExperiment.add_scalar; "
    "csv.CSVExperiment.add_scalar = lambda self, name, value, global_step=None: add("
    "self, name, statistics.fmean(value) if isinstance(value, list) else value, global_step); "
    "sys.argv = sys.argv[1:]; sys.path.insert(0, sys.argv[0].rpartition('/')[0]); "
    "runpy.run_path(sys.argv[0], run_name='__main__')")


def selected(task: Task, parts: list[str], suite: list[Task]) -> bool:
    """``--task``: whether one of ``parts`` names ``task``: a label of the suite picks that label only (``utd0.25``,
    not ``utd0.25_mixed``), any other part the tasks whose name holds it.

    Examples:
        >>> suite = [Task("sac", "Hopper-v5", 1, None, label="a"), Task("sac", "Hopper-v5", 1, None, label="a_b")]
        >>> [selected(t, ["a"], suite) for t in suite], [selected(t, ["Hopper"], suite) for t in suite]
        ([True, False], [True, True])
    """
    labels = {t.label for t in suite}
    return any(part == task.label if part in labels else part in task.name for part in parts)


def load_result(run_dir: Path, frames: int) -> dict | None:
    """The finished run saved in ``run_dir/result.json`` if it ran ``frames`` frames, else ``None``."""
    saved = run_dir / "result.json"
    if not saved.exists():
        return None
    result = json.loads(saved.read_text())
    if result["frames"] != frames:
        return None
    result["curve"] = [tuple(point) for point in result["curve"]]
    result["elapsed_at"] = {float(f): t for f, t in result["elapsed_at"].items()}
    return result


def run_or_reuse(task: Task, seed: int, run_dir: Path, reuse: bool) -> dict:
    """:func:`run`, or with ``reuse`` the run's ``result.json`` when it holds a run of ``task.frames`` frames.
    A finished run is saved there; an interrupted one (Ctrl-C, SIGTERM) is not."""
    saved = load_result(run_dir, task.frames) if reuse else None
    if saved is not None:
        return saved
    result = run(task, seed, run_dir)
    if not result.get("interrupted"):
        run_dir.mkdir(parents=True, exist_ok=True)
        # the task's frames (what --reuse matches); the recipe may collect up to a batch past them
        (run_dir / "result.json").write_text(json.dumps({**result, "frames_collected": result["frames"],
                                                         "frames": task.frames, "seed": seed}))
    return result


def saved_runs(directory: Path, task: Task, seeds: list[int]) -> dict[int, dict]:
    """The finished runs of ``task`` for ``seeds`` under another ``--out`` ``directory`` (``--reruns``); raises
    ``FileNotFoundError`` naming the first seed with none of the task's frames there."""
    runs = {}
    for seed in seeds:
        run_dir = directory / "runs" / f"{task.name}_seed{seed}"
        runs[seed] = load_result(run_dir, task.frames)
        if runs[seed] is None:
            raise FileNotFoundError(f"--reruns {directory}: no finished {task.frames}-frame run of {task.name} "
                                    f"seed {seed} in {run_dir}")
    return runs


def run(task: Task, seed: int, run_dir: Path) -> dict:
    """One seed of ``task`` in ``run_dir``: the recipe's summary with its eval ``curve``, ``elapsed_at`` and
    ``snapshots`` (a budgeted run's), or :func:`run_sb3`'s or :func:`run_torchrl_script`'s."""
    if task.algo.startswith("sb3_"):
        return run_sb3(task, seed)
    if task.algo in TORCHRL_SCRIPTS:
        return run_torchrl_script(task, seed, run_dir)
    recipe = recipe_script(task.algo)  # recipes/sac.py or recipes/td3.py
    # a budgeted run is evaluated from its snapshots afterwards: no evaluation takes its clock
    budget = [] if task.minutes is None else [f"max_minutes={task.minutes}", "logger.eval_iter=0",
                                              f"logger.snapshot_every_s={wallclock.SNAPSHOT_EVERY_S}"]
    cfg = recipe_config(task.config or task.algo, [
        f"env.name={task.env}", f"env.seed={seed}", f"collector.total_frames={task.frames}",
        f"logger.log_dir={run_dir}", "logger.progress_bar=false", "logger.checkpoint_every=0", *task.overrides,
        *budget,
    ])
    summary = recipe.main(cfg)
    exp = run_dir / cfg.logger.exp_name / "scalars"
    curve = scalar_rows(exp / "eval" / "return.csv")
    # a budgeted run shorter than one log interval logs no times (its snapshots have them)
    elapsed = dict(scalar_rows(exp / "time" / "elapsed_s.csv"))
    snapshots = ([] if task.minutes is None else
                 wallclock.evaluate_snapshots(Path(summary["run_dir"]), cfg, task.algo, task.info_keys))
    return {**summary, "curve": curve, "elapsed_at": elapsed, "snapshots": snapshots}


def sb3_config(task: Task, seed: int):
    """The recipe's config an SB3 run takes its settings from: its defaults with the task's overrides (``--set``)."""
    return recipe_config(task.config or task.algo.removeprefix("sb3_"), [f"env.name={task.env}", f"env.seed={seed}",
                                                                         *task.overrides])


def run_sb3(task: Task, seed: int) -> dict:
    """Stable-Baselines3's TD3 or SAC (``task.algo``), evaluated every :data:`SB3_EVAL_EVERY` frames by the recipe's
    ``EvalRunner``; SB3's defaults but ``learning_starts`` (the recipe's ``init_random_frames``), the recipe learner's
    torch threads and, for SAC, one update per step with the SAC recipe's network and batch sizes."""
    import gymnasium as gym
    import torch
    from stable_baselines3 import SAC, TD3
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.logger import Logger
    from tensordict.nn import TensorDictModule

    from torchrl_unilab.trainers.evaluation import EvalRunner
    from torchrl_unilab.trainers.threads import AUTO, machine_cores

    cfg = sb3_config(task, seed)
    threads = cfg.optim.num_threads  # with "auto" the cores the recipe's learner may take
    torch.set_num_threads(machine_cores() if threads == AUTO else int(threads))
    common = {"learning_starts": int(cfg.collector.init_random_frames), "seed": seed, "device": "cpu"}
    if task.algo == "sb3_td3":
        model = TD3("MlpPolicy", gym.make(task.env), **common)
    else:
        model = SAC("MlpPolicy", gym.make(task.env), train_freq=1, gradient_steps=1,
                    batch_size=int(cfg.optim.batch_size),
                    policy_kwargs={"net_arch": [int(w) for w in cfg.network.hidden_sizes]}, **common)
    model.set_logger(Logger(folder=None, output_formats=[]))  # its default logger leaves a /tmp/SB3-<date> folder
    evaluator = EvalRunner(task.env, int(cfg.logger.num_eval_envs), seed=seed + 10_000)

    class Actor(torch.nn.Module):  # SB3's actor acts in [-1, 1]; the env's bounds are unscale_action's
        def forward(self, observation: torch.Tensor) -> torch.Tensor:
            with torch.no_grad():
                scaled = model.policy._predict(observation, deterministic=True)  # noqa: SLF001 - SAC: its mean
            return torch.as_tensor(model.policy.unscale_action(scaled.numpy()), dtype=torch.float32)

    actor = Actor()
    actor.register_module("sb3", model.actor)  # its parameters tell EvalRunner the device
    policy = TensorDictModule(actor, in_keys=["observation"], out_keys=["action"])
    curve, elapsed_at = [], {}

    class Evaluate(BaseCallback):
        def _on_step(self) -> bool:
            if self.num_timesteps % SB3_EVAL_EVERY == 0:
                elapsed_at[float(self.num_timesteps)] = time.perf_counter() - started
                curve.append((float(self.num_timesteps), evaluator(policy)["eval/return"]))
            return True

    started = time.perf_counter()
    model.learn(total_timesteps=task.frames, callback=Evaluate())
    evaluator.close()
    elapsed = time.perf_counter() - started
    return {"final_return": curve[-1][1], "frames": task.frames, "updates": model._n_updates,  # noqa: SLF001
            "elapsed_s": elapsed, "curve": curve, "elapsed_at": elapsed_at}


def run_torchrl_script(task: Task, seed: int, run_dir: Path) -> dict:
    """TorchRL's own script (:data:`TORCHRL_SCRIPTS`, in ``task.rl_root``) run for ``task.minutes`` of its main loop,
    with the csv logger (:data:`TORCHRL_CSV_BOOT`) and an evaluation every :data:`SB3_EVAL_EVERY` frames; returns a
    run's result (``final_return``, ``curve``, ``snapshots``, ...) on its own clock, which leaves out its
    evaluations. How it is run and timed: ``benchmarks/README.md``, section "Learning".
    """
    from omegaconf import OmegaConf

    if task.rl_root is None:
        raise ValueError(f"the {task.algo} task runs TorchRL's {TORCHRL_SCRIPTS[task.algo]}: --rl-root must name a "
                         "pytorch/rl checkout (a work tree or a bare git dir), got none")
    run_dir.mkdir(parents=True, exist_ok=True)
    sota, commit = sota_dropin.open_checkout(task.rl_root.expanduser().resolve(), run_dir)
    script = sota.parent / TORCHRL_SCRIPTS[task.algo]
    hydra_dir = run_dir / "hydra"
    overrides = [f"env.name={task.env}", f"env.seed={seed}", "logger.backend=csv",
                 f"logger.eval_iter={SB3_EVAL_EVERY}", f"hydra.run.dir={hydra_dir}", *task.overrides]
    cmd = [sys.executable, "-c", TORCHRL_CSV_BOOT, str(script), *overrides]
    env = dict(os.environ, TMPDIR=str(run_dir / "tmp"), HYDRA_FULL_ERROR="1")
    (run_dir / "tmp").mkdir(exist_ok=True)
    log_path, rows, loop_start, failed = run_dir / "script.log", {}, None, False
    with log_path.open("wb") as log, log_path.open("rb") as output:
        proc = subprocess.Popen(cmd, cwd=run_dir, env=env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        launched = time.monotonic()
        try:
            while proc.poll() is None and not failed:
                now, new = time.monotonic(), output.read()
                if loop_start is None and b"%|" in new:  # tqdm's first bar: the main loop begins
                    loop_start = now
                failed = b"Traceback (most recent call last)" in new  # it may hang on its way out
                for path in hydra_dir.glob("*/*/scalars/eval/reward.csv"):
                    for frames, value in scalar_rows(path):
                        rows.setdefault(frames, (now, value))
                if (loop_start is None and now - launched > TORCHRL_SETUP_LIMIT_S
                        or loop_start is not None and now - loop_start >= 60 * task.minutes):
                    break
                time.sleep(0.5)
        finally:
            kill_group(proc.pid)
            proc.wait()
    if failed or loop_start is None or not rows:
        raise RuntimeError(f"{script} in {run_dir}: " + ("failed" if failed else "no evaluation within its budget")
                           + f" (its output: {log_path})")
    eval_s = dict(scalar_rows(next(hydra_dir.glob("*/*/scalars")) / "time" / "eval.csv"))
    cfg = OmegaConf.load(hydra_dir / ".hydra" / "config.yaml")
    per_batch = int(cfg.collector.frames_per_batch * cfg.optim.utd_ratio)
    snapshots, evaluating = [], 0.0
    for frames, (seen, value) in sorted(rows.items()):
        evaluating += eval_s.get(frames, 0.0)
        snapshots.append({"elapsed_s": seen - loop_start - evaluating, "frames": int(frames),
                          "updates": per_batch * max(0, int(frames - cfg.collector.init_random_frames)
                                                     // int(cfg.collector.frames_per_batch) + 1),
                          "return": value, "eval_s": eval_s.get(frames)})
    last = snapshots[-1]
    return {"final_return": last["return"], "frames": last["frames"], "updates": last["updates"],
            "elapsed_s": last["elapsed_s"], "curve": [(float(p["frames"]), p["return"]) for p in snapshots],
            "elapsed_at": {float(p["frames"]): p["elapsed_s"] for p in snapshots}, "snapshots": snapshots,
            "command": " ".join([TORCHRL_SCRIPTS[task.algo], *overrides]), "rl_commit": commit,
            "setup_s": round(loop_start - launched, 1)}


def on_grid(curve: list[tuple[float, float]], every: int = SB3_EVAL_EVERY) -> dict[float, float]:
    """A curve's returns by the multiple of ``every`` each evaluation stands for: the recipe evaluates at the first
    log past each multiple (its frame count moves by whole batches), SB3 at the multiple itself.

    Examples:
        >>> on_grid([(10112.0, -4.0), (20032.0, 418.0), (40000.0, 1809.0)])
        {10000.0: -4.0, 20000.0: 418.0, 40000.0: 1809.0}
    """
    return {float(round(f / every) * every): v for f, v in curve}


def difference_interval(ours: list[float], sb3: list[float], *, level: float = 0.9,
                        draws: int = 10_000) -> tuple[float, float] | None:
    """A percentile-bootstrap interval of ``mean(ours) - mean(sb3)``, each draw resampling both sides' seeds; ``None``
    below 3 seeds a side. An interval that holds 0 does not tell the two means apart.

    Examples:
        >>> difference_interval([10.0, 12.0, 11.0], [1.0, 2.0, 3.0])
        (8.0, 10.0)
        >>> difference_interval([10.0, 12.0], [1.0, 2.0, 3.0]) is None
        True
    """
    if min(len(ours), len(sb3)) < 3:
        return None
    return percentile_interval(
        lambda rng: statistics.fmean(rng.choices(ours, k=len(ours))) - statistics.fmean(rng.choices(sb3, k=len(sb3))),
        level=level, draws=draws)


def elapsed_by(result: dict, frame: float) -> float:
    """Wall-clock seconds of a run at ``frame``: the last time logged at or before it."""
    return max((t for f, t in result["elapsed_at"].items() if f <= frame), default=0.0)


def time_at_mark(result: dict, mark: float) -> float:
    """Wall-clock seconds of a run at its evaluation on ``mark`` (see :func:`on_grid`).

    Examples:
        >>> time_at_mark({"curve": [(10112.0, 1.0)], "elapsed_at": {9000.0: 50.0, 10112.0: 61.0}}, 10_000)
        61.0
    """
    return elapsed_by(result, next(f for f, _ in result["curve"] if round(f / SB3_EVAL_EVERY) * SB3_EVAL_EVERY == mark))


def mean_curve(runs: dict[int, dict]) -> dict[float, float]:
    """The mean return at each 10k mark (:func:`on_grid`) over the seeds evaluated there.

    Examples:
        >>> mean_curve({0: {"curve": [(10112.0, 2.0)]}, 1: {"curve": [(10000.0, 4.0), (20032.0, 9.0)]}})
        {10000.0: 3.0, 20000.0: 9.0}
    """
    grids = [on_grid(r["curve"]) for r in runs.values()]
    return {f: statistics.mean(g[f] for g in grids if f in g) for f in sorted({f for g in grids for f in g})}


def return_targets(ours: dict[float, float], reference: dict[float, float], *, from_mark: float,
                   last_within: float | None) -> tuple[list[float], bool]:
    """The marks from ``from_mark`` on where the mean curve ``ours`` is below ``reference``, and whether at the last
    common mark it is within ``last_within`` of it or above (``True`` with no ``last_within``).

    Examples:
        >>> return_targets({30000.0: 9.0, 40000.0: 95.0}, {30000.0: 10.0, 40000.0: 100.0},
        ...                from_mark=30_000, last_within=0.1)
        ([30000.0, 40000.0], True)
    """
    marks = sorted(set(ours) & set(reference))
    below = [f for f in marks if f >= from_mark and ours[f] < reference[f]]
    last = marks[-1]
    within = last_within is None or ours[last] >= reference[last] - last_within * abs(reference[last])
    return below, within


def compare_reruns(runs: dict[str, dict[int, dict]], sb3: dict[int, dict] | None, *, from_mark: float = 30_000,
                   last_within: float | None = 0.1) -> list[str]:
    """The return targets of each run of a recipe's seeds (``runs``: by output directory) against SB3 and each other:
    a target the same code misses against itself measures the run-to-run spread.

    Examples:
        >>> a = {0: {"curve": [(30000.0, 10.0), (40000.0, 30.0)]}}
        >>> b = {0: {"curve": [(30000.0, 12.0), (40000.0, 28.0)]}}
        >>> print("\\n".join(compare_reruns({"a": a, "b": b}, None)[2:]))
        | a | b | 30k | yes | not passed |
        | b | a | 40k | yes | not passed |
    """
    sides = {**({} if sb3 is None else {"SB3": sb3}), **runs}
    curves = {name: mean_curve(side) for name, side in sides.items()}
    lines = ["| run | against | below at (from {}k on) | last mark within {} | targets |".format(
        int(from_mark // 1000), "-" if last_within is None else f"{last_within:.0%}"),
        "| --- | --- | --- | --- | --- |"]
    for name in runs:
        for other in (other for other in sides if other != name):
            below, within = return_targets(curves[name], curves[other], from_mark=from_mark, last_within=last_within)
            marks = ", ".join(f"{int(f // 1000)}k" for f in below) or "none"
            lines.append(f"| {name} | {other} | {marks} | {'yes' if within else 'no'} | "
                         f"{'passed' if not below and within else 'not passed'} |")
    return lines


def time_to_sb3(ours: dict[int, dict], sb3: dict[int, dict]) -> dict:
    """The wall-clock each side needs to SB3's mean return at the last mark both mean curves have (``mark``,
    ``sb3_return``): SB3's mean minutes to that mark (``sb3_min``), and the first mark where the recipe's mean curve
    reaches it with its mean minutes there (``recipe_frames``, ``recipe_min``; both ``None`` if it never does).

    Examples:
        >>> sb3 = {0: {"curve": [(10000.0, 1.0), (20000.0, 5.0)], "elapsed_at": {10000.0: 60.0, 20000.0: 240.0}}}
        >>> ours = {0: {"curve": [(10048.0, 6.0), (20032.0, 7.0)], "elapsed_at": {10048.0: 120.0, 20032.0: 200.0}}}
        >>> time_to_sb3(ours, sb3)
        {'mark': 20000, 'sb3_return': 5.0, 'sb3_min': 4.0, 'recipe_frames': 10000, 'recipe_min': 2.0}
    """
    ours_mean, sb3_mean = mean_curve(ours), mean_curve(sb3)
    marks = sorted(set(ours_mean) & set(sb3_mean))
    last = marks[-1]
    reached = next((f for f in marks if ours_mean[f] >= sb3_mean[last]), None)
    return {"mark": int(last), "sb3_return": sb3_mean[last],
            "sb3_min": statistics.mean(time_at_mark(r, last) for r in sb3.values()) / 60,
            "recipe_frames": None if reached is None else int(reached),
            "recipe_min": None if reached is None else statistics.mean(time_at_mark(r, reached)
                                                                        for r in ours.values()) / 60}


def compare_with_sb3(ours: dict[int, dict], sb3: dict[int, dict], *, from_mark: float = 30_000,
                     last_within: float | None = 0.1, band_mark: float | None = 40_000.0,
                     speedup: float | None = None) -> list[str]:
    """The recipe against SB3: both sides' mean eval return per 10k mark, their difference (its
    :func:`difference_interval` with 3 seeds a side), and the targets.

    Passed: ours >= SB3 at every mark from ``from_mark`` on; with ``last_within``, within that fraction of SB3 or
    above at the last mark; with ``speedup``, SB3's mean return at its last mark reached within ``1 / speedup`` of
    SB3's wall-clock to it. At ``band_mark``, each of the recipe's seeds is placed against SB3's lowest to highest.
    """
    grids = {name: {seed: on_grid(r["curve"]) for seed, r in side.items()}
             for name, side in (("ours", ours), ("sb3", sb3))}

    def at_mark(name: str, mark: float) -> dict[int, float]:
        return {seed: grid[mark] for seed, grid in grids[name].items() if mark in grid}

    def interval(mark: float) -> str:
        bounds = difference_interval(list(at_mark("ours", mark).values()), list(at_mark("sb3", mark).values()))
        return "" if bounds is None else f"{bounds[0]:+.0f} to {bounds[1]:+.0f}"

    ours_mean, sb3_mean = mean_curve(ours), mean_curve(sb3)
    marks = sorted(set(ours_mean) & set(sb3_mean))
    last = marks[-1]
    below, last_ok = return_targets(ours_mean, sb3_mean, from_mark=from_mark, last_within=last_within)
    ok = not below and last_ok
    targets = [f">= SB3 from {int(from_mark // 1000)}k on"]
    if last_within is not None:
        targets.append(f"within {last_within:.0%} at {int(last)}")
    lines = [f"| frames | recipe mean ({seed_count(ours)}) | SB3 mean ({seed_count(sb3)}) | recipe - SB3 | "
             "90% interval over seeds |", "| --- | --- | --- | --- | --- |"]
    lines += [f"| {int(f)} | {ours_mean[f]:.0f} | {sb3_mean[f]:.0f} | {ours_mean[f] - sb3_mean[f]:+.0f} | "
              f"{interval(f)} |" for f in marks]
    if band_mark in marks:
        at = {name: at_mark(name, band_mark) for name in ("ours", "sb3")}
        low, high = min(at["sb3"].values()), max(at["sb3"].values())
        seeds = ", ".join(f"seed {seed} {value:.0f} ({'in or above' if value >= low else 'below'})"
                          for seed, value in at["ours"].items())
        lines += ["", f"SB3's band at {int(band_mark)} frames: {low:.0f} to {high:.0f} ({seed_count(at['sb3'])}); "
                  f"recipe: {seeds}"]
    timing = time_to_sb3(ours, sb3)
    goal, sb3_minutes, reached, ours_minutes = (timing[k] for k in ("sb3_return", "sb3_min", "recipe_frames",
                                                                    "recipe_min"))
    said = f"SB3's mean return at {int(last)} frames, {goal:.0f}, is reached by SB3 in {sb3_minutes:.1f} min"
    if reached is None:
        lines += ["", f"{said}; the recipe's mean curve does not reach it"]
    else:
        lines += ["", f"{said}, by the recipe's mean curve at {int(reached)} frames in {ours_minutes:.1f} min "
                  f"({ours_minutes / sb3_minutes:.2f} of SB3's wall-clock)"]
    if speedup is not None:
        ok = ok and reached is not None and ours_minutes <= sb3_minutes / speedup
        targets.append(f"SB3's return in <= 1/{speedup:g} of its wall-clock")
    minutes = [statistics.mean(r["elapsed_s"] for r in side.values()) / 60 for side in (ours, sb3)]
    lines += ["", f"wall-clock per run: recipe {minutes[0]:.1f} min, SB3 {minutes[1]:.1f} min; "
              f"targets ({', '.join(targets)}): {'passed' if ok else 'not passed'}"]
    return lines


def sb3_summary(suite: str, algo: str, ours: dict[int, dict], sb3: dict[int, dict], *, from_mark: float = 30_000,
                last_within: float | None = 0.1, band_mark: float | None = 40_000.0,
                speedup: float | None = None) -> dict:
    """The ``sb3`` and ``td3`` suites' results file (``<algo>_vs_sb3.json``, read by ``report.py``): each seed's
    return at every 10k mark (``None`` where a run has no evaluation) and minutes per run, each side's mean, their
    difference with its 90 % interval over seeds (``None`` below 3 seeds a side), :func:`time_to_sb3`, and
    :func:`compare_with_sb3`'s targets (same keyword arguments; ``band_mark`` is the table's only).

    Examples:
        >>> def run(values, minutes):
        ...     return {"curve": [(10000.0 * (i + 1), v) for i, v in enumerate(values)], "elapsed_s": 60.0 * minutes,
        ...             "elapsed_at": {10000.0 * (i + 1): 30.0 * minutes * (i + 1) for i in range(len(values))}}
        >>> summary = sb3_summary("td3", "td3", {0: run([1.0, 9.0], 4)}, {0: run([2.0, 8.0], 8)}, from_mark=20_000)
        >>> summary["marks"], summary["recipe"], summary["difference"], summary["interval_90"]
        ([10000, 20000], {0: {'returns': [1, 9], 'minutes': 4.0}}, [-1.0, 1.0], {'10000': None, '20000': None})
        >>> summary["time_to_sb3_return"], summary["targets"]["passed"]
        ({'mark': 20000, 'sb3_return': 8.0, 'sb3_min': 8.0, 'recipe_frames': 20000, 'recipe_min': 4.0, \
'ratio': 0.5}, True)
    """
    sides = {"recipe": ours, f"sb3_{algo}": sb3}
    means = {key: mean_curve(runs) for key, runs in sides.items()}
    marks = sorted({m for curve in means.values() for m in curve})
    timing = time_to_sb3(ours, sb3)
    below, last_ok = return_targets(means["recipe"], means[f"sb3_{algo}"], from_mark=from_mark,
                                    last_within=last_within)
    passed = not below and last_ok and (speedup is None or timing["recipe_min"] is not None
                                        and timing["recipe_min"] <= timing["sb3_min"] / speedup)

    def rounded(value: float | None, digits: int | None = None) -> float | None:
        return None if value is None else round(value, digits)

    def difference(mark: float) -> float | None:
        if mark not in means["recipe"] or mark not in means[f"sb3_{algo}"]:
            return None
        return means["recipe"][mark] - means[f"sb3_{algo}"][mark]

    def interval(mark: float) -> list[float] | None:
        values = [[on_grid(r["curve"])[mark] for r in runs.values() if mark in on_grid(r["curve"])]
                  for runs in sides.values()]
        bounds = difference_interval(*values)
        return None if bounds is None else [round(bound) for bound in bounds]

    return {
        **provenance("learning"), "suite": suite, "algo": algo, "task": "HalfCheetah-v5",
        "frames": int(marks[-1]), "marks": [int(m) for m in marks],
        **{key: {seed: {"returns": [rounded(on_grid(r["curve"]).get(m)) for m in marks],
                        "minutes": round(r["elapsed_s"] / 60, 1)} for seed, r in sorted(runs.items())}
           for key, runs in sides.items()},
        "means": {key: [rounded(curve.get(m), 1) for m in marks] for key, curve in means.items()},
        "means_note": "the mean over seeds of their unrounded returns",
        "difference": [rounded(difference(m), 1) for m in marks],
        "interval_90": {str(int(m)): interval(m) for m in marks},
        "time_to_sb3_return": {**{k: rounded(v, 1) if k != "mark" and k != "recipe_frames" else v
                                  for k, v in timing.items()},
                               "ratio": None if timing["recipe_min"] is None
                               else round(timing["recipe_min"] / timing["sb3_min"], 2)},
        "targets": {"at_or_above_from": int(from_mark),
                    "within_percent_at_last_mark": None if last_within is None else round(100 * last_within),
                    "time_ratio_at_most": None if speedup is None else round(1 / speedup, 2),
                    "below_at": [int(m) for m in below], "last_mark_within": last_ok, "passed": passed},
    }


def rst_table(sides: dict[str, dict[int, dict]]) -> list[str]:
    """A reStructuredText list-table for the docs: each seed's return at every 10k mark, each side's mean, minutes.

    Examples:
        >>> run = {"curve": [(10112.0, 5.4), (20032.0, 418.0)], "elapsed_s": 120.0}
        >>> print("\\n".join(rst_table({"recipe": {0: run}})[-4:]))
           * - recipe, seed 0
             - 5
             - 418
             - 2
    """
    marks = sorted({f for runs in sides.values() for r in runs.values() for f in on_grid(r["curve"])})

    def row(label: str, values: list[float | None], seconds: float) -> list:
        return [label, *("" if v is None else round(v) for v in values), f"{seconds / 60:.0f}"]

    rows = []
    for side, runs in sides.items():
        for seed, r in sorted(runs.items()):
            rows.append(row(f"{side}, seed {seed}", [on_grid(r["curve"]).get(m) for m in marks], r["elapsed_s"]))
        if len(runs) > 1:
            means = mean_curve(runs)
            rows.append(row(f"**{side}, mean of {len(runs)} seeds**", [means.get(m) for m in marks],
                            statistics.mean(r["elapsed_s"] for r in runs.values())))
    return list_table(["run", *(f"{int(m // 1000)}k" for m in marks), "min"], rows).splitlines()


def plot(path: Path, title: str, runs: dict[int, dict]) -> None:
    """Each seed's eval return against frames (left) and against wall-clock minutes (right)."""
    with figure(path, title, ("frames", "wall-clock time (min)"), "deterministic eval return", size=(10, 4),
                legend={}, ncols=2) as (left, right):
        for seed, result in runs.items():
            frames, values = [f for f, _ in result["curve"]], [v for _, v in result["curve"]]
            left.plot(frames, values, marker="o", markersize=3, label=f"seed {seed}")
            right.plot([elapsed_by(result, f) / 60 for f in frames], values, marker="o", markersize=3,
                       label=f"seed {seed}")


def plot_sides(path: Path, title: str, sides: dict[str, dict[int, dict]]) -> None:
    """Each side's (a recipe, SB3, a task's variant) mean eval return against frames, its seeds' range as a band."""
    with figure(path, title, "frames", "deterministic eval return", legend={}) as ax:
        for label, runs in sides.items():
            curves = [on_grid(r["curve"]) for r in runs.values()]
            marks = sorted({f for c in curves for f in c})
            values = [[c[f] for c in curves if f in c] for f in marks]
            ax.plot(marks, [statistics.mean(v) for v in values], marker="o", markersize=3,
                    label=f"{label} (mean of {seed_count(runs)})" if len(runs) > 1 else f"{label} ({seed_count(runs)})")
            ax.fill_between(marks, [min(v) for v in values], [max(v) for v in values], alpha=0.2)


def write(path: Path, lines: list[str], show: bool = False) -> None:
    """``lines`` into ``path``, one a line; printed too with ``show``."""
    path.write_text("\n".join(lines) + "\n")
    if show:
        print("\n".join(lines), flush=True)


def report_wallclock(out: Path, sides: dict[str, dict[int, dict]], sb3_runs: dict[int, dict] | None,
                     sb3_saved: dict | None, minutes: float, algo: str = "sac") -> dict:
    """The ``wallclock`` suite's table, plot and targets for one algorithm (``wallclock.md/.png/.json`` for SAC,
    ``wallclock_<algo>.*`` else); returns its summary. SB3's reference is its runs in this suite (``sb3_runs``), else
    a saved one (``sb3_saved``, from :func:`sb3_references`). Without a reference (SB3's runs stopped before 100k
    frames, or none at all) the summary's ``reference`` is ``None``, ``reference_missing`` says why, and no
    configuration has targets.

    Examples:
        >>> import tempfile
        >>> run = {"snapshots": [{"elapsed_s": 60.5, "frames": 2000, "updates": 500, "return": 7.0}],
        ...        "elapsed_s": 61.0, "frames": 2000, "updates": 500}
        >>> sb3 = {0: {"curve": [(10000.0, -3.0)], "elapsed_at": {10000.0: 80.0}, "elapsed_s": 80.0, "updates": 5000}}
        >>> with tempfile.TemporaryDirectory() as out:
        ...     summary = report_wallclock(Path(out), {"defaults": {0: run}}, sb3, None, 1.0)  # doctest: +ELLIPSIS
        | config | seeds | minutes | ...
        >>> summary["reference"], summary["reference_missing"].split(",")[0]
        (None, "SB3's run of seed 0 ends at 10000 frames")
    """
    reference, missing = sb3_saved, None
    if sb3_runs:
        missing = wallclock.sb3_reference_missing(sb3_runs)
        reference = None if missing else {**wallclock.sb3_reference(sb3_runs), "seeds": len(sb3_runs),
                                          "source": "this suite's runs"}
    elif sb3_saved is None:
        missing = f"no SB3 runs in this suite (--algo sb3_{SB3_COUNTERPART.get(algo, algo)}) and no --sb3-reference"
    overrides = {task.label: [f"--config-name {task.config}"] * bool(task.config) + task.overrides
                 for task in SUITES["wallclock"] if task.algo == algo}
    stem = {"sac": "wallclock", "torchrl_sac": "wallclock_anchor"}.get(algo, f"wallclock_{algo}")
    against = SB3_COUNTERPART.get(algo, algo)
    table, curves = {}, {}
    for label, runs in sides.items():
        per_seed = {}
        for seed, run in runs.items():
            points = run["snapshots"]
            per_seed[seed] = wallclock.value_at_minutes(points, wallclock.clock_minutes(points, minutes))
        curve = curves[label] = wallclock.mean_with_interval(per_seed)
        table[label] = {
            "overrides": overrides.get(label),
            "by_seed": {seed: [None if v is None else round(v, 1) for v in values]
                        for seed, values in per_seed.items()},
            "seeds": len(runs),
            "minutes": round(statistics.fmean(r["elapsed_s"] for r in runs.values()) / 60, 1),
            "frames": round(statistics.fmean(r.get("frames_collected", r["frames"]) for r in runs.values())),
            "updates": round(statistics.fmean(r["updates"] for r in runs.values())),
            "curve": curve,
            "targets": reference and wallclock.wallclock_targets(curve, reference),
        }
    points = {seed: wallclock.sb3_points(run) for seed, run in (sb3_runs or {}).items()}
    if sb3_runs:
        sb3_minutes = math.ceil(max(r["elapsed_s"] for r in sb3_runs.values()) / 60)
        curves[f"SB3 {against.upper()}, 100k frames"] = wallclock.mean_with_interval(
            {seed: wallclock.value_at_minutes(run, sb3_minutes) for seed, run in points.items()})
    lines = wallclock.markdown_table(table)
    if reference is not None:
        lines += ["", f"SB3's {against.upper()}: mean return {reference['return']:.0f} at 100k frames after "
                      f"{reference['minutes']:.1f} min ({reference['seeds']} seeds; {reference['source']})."]
    else:
        lines += ["", f"No SB3 reference, no targets: {missing}."]
    write(out / f"{stem}.md", lines, show=True)
    wallclock.plot_against_minutes(out / f"{stem}.png", f"{TORCHRL_SCRIPTS.get(algo, algo.upper())} HalfCheetah-v5: "
                                   "return against wall-clock", curves, reference)
    # TorchRL's script, per seed: its command, seconds to its main loop, its evaluations' seconds (not on its clock)
    scripts = {seed: {key: run[key] for key in ("command", "rl_commit", "setup_s")}
               | {"evaluation_s": round(wallclock.evaluation_seconds(run["snapshots"]), 1)}
               for runs in sides.values() for seed, run in runs.items() if "command" in run}
    note = "one run after the other"
    if scripts:
        commits = sorted({run["rl_commit"] for run in scripts.values()})
        note += (f"; {TORCHRL_SCRIPTS[algo]} at pytorch/rl {', '.join(commits)}, its clock from its main loop's start "
                 "(its progress bar), less its own evaluation rollouts (one deterministic episode on each of its "
                 f"evaluation envs every {SB3_EVAL_EVERY} frames; on average "
                 f"{statistics.fmean(run['evaluation_s'] for run in scripts.values()):.0f} s a run)")
    summary = {**provenance("learning", note=note), "suite": "wallclock", "algo": algo, "sb3_algo": against,
               **({"script_runs": scripts} if scripts else {}),
               "task": "HalfCheetah-v5", "snapshot_every_s": wallclock.SNAPSHOT_EVERY_S, "reference": reference,
               **({"reference_missing": missing} if missing else {}),
               # SB3's runs behind the reference, per seed: the return and minutes at each evaluation
               "sb3_runs": {seed: {"updates": sb3_runs[seed]["updates"], "frames": [p["frames"] for p in run],
                                   "returns": [round(p["return"], 1) for p in run],
                                   "minutes": [round(p["elapsed_s"] / 60, 2) for p in run]}
                            for seed, run in points.items()},
               "configs": {label: {k: v for k, v in side.items() if k != "curve"} | {
                   "minute": [p["minute"] for p in side["curve"]],
                   "mean_by_minute": [round(p["mean"], 1) for p in side["curve"]],
                   "interval_by_minute": [None if p["low"] is None else [round(p["low"], 1), round(p["high"], 1)]
                                          for p in side["curve"]]} for label, side in table.items()}}
    (out / f"{stem}.json").write_text(json.dumps(summary) + "\n")
    print(json.dumps(summary), flush=True)
    return summary


def sb3_references(paths: list[Path]) -> dict[str, dict]:
    """``--sb3-reference``'s files as SB3 references by algorithm: a saved SB3 comparison's runs
    (:func:`wallclock.sb3_reference_from_results`) or a saved ``wallclock`` report's reference."""
    references = {}
    for path in paths:
        saved = json.loads(Path(path).read_text())
        found = {algo: wallclock.sb3_reference_from_results(saved, str(path), algo)
                 for algo in ("sac", "td3") if f"sb3_{algo}" in saved}
        if saved.get("suite") == "wallclock" and saved.get("reference"):
            found[saved["algo"]] = {**saved["reference"], "source": wallclock.results_source(saved, str(path))}
        if not found:
            raise ValueError(f"--sb3-reference {path}: holds no SB3 runs ('sb3_sac' or 'sb3_td3') and no wallclock "
                             "reference; accepted: benchmarks/results/learning/sac_vs_sb3.json, td3_vs_sb3.json or "
                             "wallclock.json")
        references.update(found)
    return references


def report_go1(out: Path, sides: dict[str, dict[int, dict]], minutes: float) -> dict:
    """The ``go1_gpu`` suite's ``go1_gpu.md`` and ``.json``: per critic and minute, the mean over seeds of the return,
    the velocity-tracking terms and the episode length, and the first minute the Go1 walks."""
    import torch

    keys = ("return", *GO1_WALK_TERMS, "episode_length")
    limit = 1000  # Go1JoystickFlatTerrain-v1's episode limit
    table = {}
    for label, runs in sides.items():
        by_minute = {key: wallclock.mean_with_interval({seed: wallclock.value_at_minutes(
            run["snapshots"], math.ceil(minutes), key) for seed, run in runs.items()}) for key in keys}
        walks = next((a["minute"] for a, b in zip(by_minute[GO1_WALK_TERMS[0]], by_minute["episode_length"])
                      if a["mean"] >= GO1_WALK_TRACKING and b["mean"] >= GO1_WALK_LENGTH * limit), None)
        table[label] = {
            "seeds": len(runs), "walks_at_minute": walks,
            "frames": round(statistics.fmean(r.get("frames_collected", r["frames"]) for r in runs.values())),
            "updates": round(statistics.fmean(r["updates"] for r in runs.values())),
            "minutes": round(statistics.fmean(r["elapsed_s"] for r in runs.values()) / 60, 1),
            **{key: [round(p["mean"], 3) for p in by_minute[key]] for key in keys},
        }
    lines = [f"| critic | seeds | minutes | frames | updates | walks at minute | {GO1_WALK_TERMS[0]} by minute "
             "| episode length by minute |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    lines += [f"| {label} | {side['seeds']} | {side['minutes']} | {side['frames']} | {side['updates']} "
              f"| {side['walks_at_minute']} | {side[GO1_WALK_TERMS[0]]} | {side['episode_length']} |"
              for label, side in table.items()]
    lines += ["", f"Walks: {GO1_WALK_TERMS[0]} >= {GO1_WALK_TRACKING} per step (mean over the evaluation's steps) "
                  f"with episodes >= {GO1_WALK_LENGTH:.0%} of the {limit}-step limit."]
    write(out / "go1_gpu.md", lines, show=True)
    summary = {**provenance("learning"), "suite": "go1_gpu",
               "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
               "walk_tracking": GO1_WALK_TRACKING, "walk_length": GO1_WALK_LENGTH, "critics": table}
    (out / "go1_gpu.json").write_text(json.dumps(summary) + "\n")
    return summary


def episode_lengths(run: dict) -> dict[float, float]:
    """A recipe run's mean evaluation episode length at each 10k mark (:func:`on_grid`), from its scalars."""
    return on_grid(scalar_rows(next(Path(run["run_dir"]).glob("*/scalars/eval/episode_length.csv"))))


def report_robot(out: Path, by_env: dict[tuple[str, str], dict[str, dict[int, dict]]], note: str | None) -> dict:
    """The ``robot`` suite's ``robot.json`` (``report.py``'s ``robot/learning.json``): per task, its target, each
    run's return at every 10k mark and minutes, each variant's mean and, with variants, the mean evaluation episode
    length from 30k frames on (how long the robot stays up). ``note``: how the runs shared the machine."""
    frames = max(r["frames"] for sides in by_env.values() for runs in sides.values() for r in runs.values())
    marks = [float(m) for m in range(SB3_EVAL_EVERY, frames + 1, SB3_EVAL_EVERY)]
    references = {t.env: t.target for t in SUITES["robot"]}
    # a run shorter than the first mark (a reduced --frames) has none: its frames stand
    summary = {**provenance("learning", note=note), "suite": "robot", "frames": int(marks[-1]) if marks else frames,
               "marks": [int(m) for m in marks], "tasks": {}}
    for (algo, env), sides in by_env.items():
        entry = {"algo": algo, **({"reference": references[env]} if references[env] is not None else {}),
                 "runs": {}, "means": {}}
        for side, runs in sides.items():
            prefix = "" if side.startswith("recipes/") else f"{side}, "
            for seed, run in sorted(runs.items()):
                grid = on_grid(run["curve"])
                entry["runs"][f"{prefix}seed {seed}"] = {"returns": [round(grid[m]) for m in marks],
                                                          "minutes": round(run["elapsed_s"] / 60)}
            means = mean_curve(runs)
            entry["means"][side] = [round(means[m]) for m in marks]
        standing = {side: [v for r in runs.values() for m, v in episode_lengths(r).items() if m >= 30_000]
                    for side, runs in sides.items()} if len(sides) > 1 else {}
        if standing and all(standing.values()):  # a run shorter than 30k frames has none
            entry["mean_episode_steps_30k_100k"] = {side: round(statistics.fmean(v)) for side, v in standing.items()}
        summary["tasks"][env] = entry
    (out / "robot.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary


def results_row(suite: str, task: Task, runs: dict[int, dict]) -> dict:
    """A task's line of ``results.csv``: its final and best returns over seeds, their means, the target, time."""
    finals = [r["final_return"] for r in runs.values()]
    bests = [max(v for _, v in r["curve"]) for r in runs.values()]
    mean = statistics.mean(finals)
    return {"suite": suite, "algo": task.algo + (f" ({task.label})" if task.label else ""), "env": task.env,
            "frames": task.frames, "seeds": len(finals), "final_returns": [round(v, 1) for v in finals],
            "mean_return": round(mean, 1), "best_returns": [round(v, 1) for v in bests],
            "mean_best_return": round(statistics.mean(bests), 1), "target": task.target,
            "passed": None if task.target is None else mean >= task.target,
            "mean_wall_clock_min": round(statistics.mean(r["elapsed_s"] for r in runs.values()) / 60, 1),
            "mean_updates": round(statistics.mean(r["updates"] for r in runs.values()))}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--suite", choices=[*SUITES, "all"], default="pendulum")
    parser.add_argument("--seeds", type=int, nargs="+", default=None, help="default: the suite's, else 0 1 2")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "learning")
    parser.add_argument("--algo", nargs="+", default=None,
                        help="only the suite's tasks of these algos (e.g. td3 or sb3_td3); default: all of them")
    parser.add_argument("--task", nargs="+", default=None,
                        help="only the suite's tasks of these labels (e.g. utd1), or whose name (algo_env_label, "
                             "e.g. td3_Go1JoystickFlatTerrain-v1_symmetric) holds one of these; default: all")
    parser.add_argument("--frames", type=int, default=None, help="frames per run instead of the suite's")
    parser.add_argument("--minutes", type=float, default=None,
                        help="wallclock and go1_gpu suites: the wall-clock budget per run instead of the suite's")
    parser.add_argument("--sb3-reference", type=Path, nargs="+", default=[], metavar="JSON",
                        help="wallclock suite without SB3 runs of its own: SB3's saved results as the reference, "
                             "one file per algorithm (benchmarks/results/learning/sac_vs_sb3.json, td3_vs_sb3.json)")
    parser.add_argument("--rl-root", type=Path, default=None,
                        help="wallclock suite's torchrl_sac task: a pytorch/rl work tree or bare git dir, whose "
                             "sota-implementations/sac/sac.py it runs")
    parser.add_argument("--reuse", action="store_true",
                        help="take a run from its directory's result.json when it has the same frames")
    parser.add_argument("--set", nargs="+", default=[], metavar="KEY=VALUE", dest="extra",
                        help="hydra overrides for every recipe run, after the suite's, and for the recipe config an "
                             "SB3 run reads; e.g. optim.num_threads=1 for two suites side by side on 2 cores")
    parser.add_argument("--note", default=None,
                        help="robot suite: how the runs shared the machine (e.g. two side by side), for robot.json")
    parser.add_argument("--reruns", type=Path, nargs="+", default=[], metavar="DIR",
                        help="td3 and sb3 suites: --out directories of other runs of the same seeds; writes "
                             "<algo>_reruns.md, the return targets of each run against SB3 and each other run")
    args = parser.parse_args(argv)
    suites = list(SUITES) if args.suite == "all" else [args.suite]
    chosen = {suite: [task for task in SUITES[suite] if (not args.algo or task.algo in args.algo)
                      and (not args.task or selected(task, args.task, SUITES[suite]))] for suite in suites}
    scripts = {task.algo for tasks in chosen.values() for task in tasks if task.algo in TORCHRL_SCRIPTS}
    if scripts and args.rl_root is None and not args.reuse:
        parser.error(f"--rl-root is needed for {', '.join(sorted(scripts))} (TorchRL's own scripts); give a "
                     "pytorch/rl checkout, or pick other algorithms with --algo")
    short = sorted({task.algo for tasks in chosen.values() for task in tasks if task.algo.startswith("sb3_")})
    if short and args.frames is not None and args.frames < SB3_EVAL_EVERY:
        parser.error(f"--frames must be at least {SB3_EVAL_EVERY} for {', '.join(short)} (SB3's runs are evaluated "
                     f"every {SB3_EVAL_EVERY} frames), got {args.frames}; or leave SB3 out with --algo")
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for suite in suites:
        results, tasks = {}, {}
        by_env: dict[tuple[str, str], dict[str, dict[int, dict]]] = {}  # (algo, env) -> variant -> seed -> run
        for task in chosen[suite]:
            task = dataclasses.replace(task, frames=args.frames or task.frames,
                                       minutes=None if task.minutes is None else args.minutes or task.minutes,
                                       overrides=[*task.overrides, *args.extra], rl_root=args.rl_root)
            runs = {seed: run_or_reuse(task, seed, args.out / "runs" / f"{task.name}_seed{seed}", args.reuse)
                    for seed in args.seeds or task.seeds or (0, 1, 2)}
            results[task.algo], tasks[task.algo] = runs, task
            side = task.label or TORCHRL_SCRIPTS.get(task.algo, f"recipes/{task.algo}.py")
            by_env.setdefault((task.algo, task.env), {})[side] = runs
            label = f" {task.label}" if task.label else ""
            png = f"{suite}_{task.algo}.png" if suite in ("pendulum", "halfcheetah") else f"{suite}_{task.name}.png"
            plot(args.out / png, f"{task.algo.upper()} {task.env}{label} ({seed_count(runs)})", runs)
            rows.append(results_row(suite, task, runs))
            print(json.dumps({"benchmark": "learning", **rows[-1]}), flush=True)
        for (algo, env), sides in by_env.items():  # each task's seeds, and its variants side by side
            stem = f"{suite}_{algo}_{env}"
            write(args.out / f"{stem}_table.rst", rst_table(sides))
            if len(sides) > 1:
                plot_sides(args.out / f"{stem}_sides.png", f"{algo.upper()} {env}: {' against '.join(sides)}", sides)
        if suite == "robot" and by_env:
            report_robot(args.out, by_env, args.note)
        if suite == "go1_gpu":
            report_go1(args.out, by_env.get(("td3", "Go1JoystickFlatTerrain-v1"), {}),
                       args.minutes or GO1_GPU_MINUTES)
            continue
        if suite == "wallclock":
            minutes = args.minutes or max((t.minutes for t in SUITES[suite] if t.minutes), default=0.0)
            references = sb3_references(args.sb3_reference)
            for algo in ("sac", "td3", *SB3_COUNTERPART):
                sides, sb3_runs = by_env.get((algo, "HalfCheetah-v5"), {}), results.get(f"sb3_{algo}")
                if sides or sb3_runs:
                    report_wallclock(args.out, sides, sb3_runs, references.get(SB3_COUNTERPART.get(algo, algo)),
                                     minutes, algo)
            continue
        for algo, targets in SB3_TARGETS.items():
            shared = {algo, f"sb3_{algo}"} <= set(results) and sorted(
                set(mean_curve(results[algo])) & set(mean_curve(results[f"sb3_{algo}"])))
            if {algo, f"sb3_{algo}"} <= set(results) and not shared:  # a --frames too short for the recipe
                print(json.dumps({"benchmark": "learning", "suite": suite, "algo": algo, "compared": None,
                                  "reason": f"the recipe's evaluations ({sorted(mean_curve(results[algo]))}) and "
                                            f"SB3's ({sorted(mean_curve(results[f'sb3_{algo}']))}) share no 10k mark; "
                                            "no comparison written"}), flush=True)
            if shared:
                ours, sb3, name = results[algo], results[f"sb3_{algo}"], f"SB3 {algo.upper()}"
                write(args.out / f"{algo}_vs_sb3.md", compare_with_sb3(ours, sb3, **targets), show=True)
                summary = sb3_summary(suite, algo, ours, sb3, **targets)
                (args.out / f"{algo}_vs_sb3.json").write_text(json.dumps(summary) + "\n")
                print(json.dumps(summary), flush=True)
                write(args.out / f"{algo}_vs_sb3_table.rst", rst_table({f"``recipes/{algo}.py``": ours, name: sb3}))
                plot_sides(args.out / f"{algo}_vs_sb3.png", f"{algo.upper()} HalfCheetah-v5: recipe against SB3",
                           {f"recipes/{algo}.py": ours, name: sb3})
            if args.reruns and algo in results and f"sb3_{algo}" in {t.algo for t in SUITES[suite]}:
                runs = {str(args.out): results[algo]}
                for directory in args.reruns:
                    runs[str(directory)] = saved_runs(directory, tasks[algo], list(results[algo]))
                table = compare_reruns(runs, results.get(f"sb3_{algo}"), from_mark=targets["from_mark"],
                                       last_within=targets["last_within"])
                write(args.out / f"{algo}_reruns.md", table, show=True)
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
    write(args.out / "results.md", lines)


if __name__ == "__main__":
    main()
