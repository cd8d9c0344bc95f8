"""One command that turns a GPU machine (one GPU, 16 cores) into figures.

    python benchmarks/gpu_check.py [--rl-root ~/src/rl] [--out h200_2026-12-04.json]
    python benchmarks/gpu_check.py --device cpu --quick

See ``benchmarks/README.md``, section "The GPU machine's first command".
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import importlib.metadata
import json
import multiprocessing as mp
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCHMARKS))
# The parts are forked from this process, and the CUDA driver cannot be used in a child forked after it was
# initialised: a torch.cuda.is_available() at some import (TorchRL's) must ask NVML instead of the driver.
os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
# Imported here, before any part is forked, so that each fork starts with them loaded.
import collector_throughput  # noqa: E402
import learner_throughput  # noqa: E402
import sota_dropin  # noqa: E402
import torch  # noqa: E402
from common import kill_group  # noqa: E402

from torchrl_unilab.data import BufferSampler  # noqa: E402

RESULTS = BENCHMARKS / "results" / "gpu"
PARTS = ("machine", "learner_ups", "sample_ms", "publish_ms", "e2e_fps", "collector_scaling", "dropin_sac_cuda",
         "collector_lanes")
WORKERS = (1, 2, 4, 8, 14)
#: collector_lanes' tasks: Go1 (target 0.9 of EnvPool alone) and CheetahRun (0.28, the actor costing more than physics)
LANE_TASKS = ("Go1JoystickFlatTerrain-v1", "CheetahRun-v1")
VARIANTS = {"eager": {}, "compile": {"compile": True}, "compile_cudagraphs": {"compile": True, "cudagraphs": True}}
#: The targets the figures are read against, printed beside them.
TARGETS = {"e2e_sac_frames_per_s": 1000, "collector_scaling_ratio_at_14_workers": 0.8,
           "anchor_leanrl_h100_sac_fps": 725}


@dataclasses.dataclass(frozen=True)
class Settings:
    """What each part measures: the GPU run's sizes, or ``--quick``'s tiny ones."""

    device: str
    quick: bool
    rl_root: Path | None
    batches: tuple[int, ...] = (256, 4096)
    blocks: int = 3
    block_updates: int = 100
    warmup_updates: int = 10  # CUDA graphs capture after 5 eager calls (trainers/compile.py)
    compiled: bool = True  # run the compiled variants (else built only)
    repeats: int = 200
    e2e_seconds: float = 60.0
    e2e_workers: int = 2
    e2e_envs: int = 8
    e2e_start_frames: int = 5000
    e2e_log_every: int = 1000
    e2e_batch_size: int = 256
    e2e_buffer: int = 200_000
    #: collector_scaling's tasks and the worker counts of each
    scaling: dict[str, tuple[int, ...]] = dataclasses.field(default_factory=lambda: {
        "HalfCheetah-v5": WORKERS, "Go1JoystickFlatTerrain-v1": WORKERS})
    scaling_seconds: float = 4.0
    scaling_rounds: int = 1
    scaling_frames_per_batch: int = 1024
    scaling_buffer: int = 200_000
    lane_tasks: tuple[str, ...] = LANE_TASKS
    lane_rounds: int = 2
    dropin_frames: int = 3000
    timeouts: dict[str, float] = dataclasses.field(default_factory=lambda: {
        "machine": 30, "learner_ups": 150, "sample_ms": 30, "publish_ms": 30, "e2e_fps": 220,
        "collector_scaling": 150, "dropin_sac_cuda": 120, "collector_lanes": 60})

    @classmethod
    def make(cls, device: str, quick: bool, rl_root: Path | None, e2e_seconds: float | None = None) -> Settings:
        """The settings of a run on ``device``; ``quick``: tiny sizes, a few seconds a part.

        Examples:
            >>> Settings.make("cpu", True, None).scaling
            {'HalfCheetah-v5': (1, 2), 'Go1JoystickFlatTerrain-v1': (1,)}
        """
        if not quick:
            return cls(device, quick, rl_root, **({"e2e_seconds": e2e_seconds} if e2e_seconds else {}))
        return cls(device, quick, rl_root, batches=(32, 64), blocks=1, block_updates=5, warmup_updates=2,
                   compiled=False, repeats=10, e2e_seconds=2.0, e2e_workers=1, e2e_envs=2, e2e_start_frames=200,
                   e2e_log_every=50, e2e_batch_size=32, e2e_buffer=5000, scaling_seconds=0.5,
                   # a Go1 pool takes ~6 s of CPU to build: one worker (the code path is HalfCheetah's)
                   scaling={"HalfCheetah-v5": (1, 2), "Go1JoystickFlatTerrain-v1": (1,)},
                   scaling_rounds=1, scaling_frames_per_batch=64, scaling_buffer=5000,
                   lane_tasks=LANE_TASKS[1:], lane_rounds=1, dropin_frames=600,
                   timeouts={"machine": 60, "learner_ups": 120, "sample_ms": 60, "publish_ms": 60, "e2e_fps": 240,
                             "collector_scaling": 240, "dropin_sac_cuda": 300, "collector_lanes": 240})


Emit = Callable[[tuple[str, ...], object], None]


def _device(settings: Settings) -> torch.device:
    return learner_throughput.learner_device(settings.device)


def _percentiles(times_ms: list[float]) -> dict[str, float]:
    ordered = sorted(times_ms)
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
    return {"p50": round(statistics.median(ordered), 4), "p99": round(p99, 4)}


# ------------------------------------------------------------------ the parts
def part_machine(settings: Settings, emit: Emit) -> None:
    """The GPU's name, CPU count, torch and CUDA versions (and the packages measured)."""
    cuda = torch.cuda.is_available()
    emit(("gpu",), torch.cuda.get_device_name(0) if cuda else None)
    emit(("gpu_memory_gib",), round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1) if cuda else None)
    emit(("cpu_count",), os.cpu_count())
    emit(("cpus_usable",), len(os.sched_getaffinity(0)))
    emit(("cpu_model",), _cpu_model())
    emit(("torch",), torch.__version__)
    emit(("cuda",), torch.version.cuda)
    emit(("cudnn",), torch.backends.cudnn.version() if cuda else None)
    emit(("python",), platform.python_version())
    for package in ("torchrl", "tensordict", "envpool", "mujoco"):
        emit((package,), importlib.metadata.version(package))
    try:
        driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                capture_output=True, text=True, timeout=20, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        driver = None
    emit(("driver",), driver)
    emit(("load_average",), round(os.getloadavg()[0], 2))


def _cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def part_learner_ups(settings: Settings, emit: Emit) -> None:
    """SAC's and TD3's updates/s (256x256) per batch size and variant; each figure emitted once measured."""
    device = _device(settings)
    sync = learner_throughput.device_sync(device)
    torch.set_num_threads(1)
    rb = learner_throughput.filled_buffer()
    loops = {"sac": lambda **kw: learner_throughput.recipe_loop(rb, device=device, **kw),
             "td3": lambda **kw: learner_throughput.td3_loop(rb, device=device, hidden=(256, 256), **kw)}
    for batch in settings.batches:
        for algo, loop in loops.items():
            for name, flags in VARIANTS.items():
                step = loop(batch_size=batch, **flags)  # built in every run: the plumbing is checked on CPU too
                where = (algo, f"batch_{batch}", name)
                if flags and not settings.compiled:
                    emit(where, {"skipped": "--quick: built, not run (compiling takes 30-70 s on a CPU)"})
                    continue
                rate = learner_throughput.update_rates({name: step}, settings.blocks, settings.block_updates,
                                                       warmup_steps=settings.warmup_updates, sync=sync)[name]
                emit(where, {"ups": round(rate["ups"], 1), "warmup_s": round(rate["warmup_s"], 1)})


def part_sample_ms(settings: Settings, emit: Emit) -> None:
    """One batch sampled into pinned memory (on a GPU) and its copy queued: CPU milliseconds, p50 and p99."""
    device = _device(settings)
    torch.set_num_threads(1)
    rb = learner_throughput.filled_buffer()
    sync = learner_throughput.device_sync(device)
    emit(("pinned",), device.type == "cuda")
    for batch in settings.batches:
        sampler = BufferSampler(rb, batch, device=device)
        times = learner_throughput.call_times_ms(sampler, settings.repeats, sync)
        emit((f"batch_{batch}",), _percentiles(times))


def part_publish_ms(settings: Settings, emit: Emit) -> None:
    """One publish of the SAC exploration policy's weights from the learner's device: p50 and p99."""
    times = learner_throughput.publish_times_ms(_device(settings), settings.repeats)
    for kind in ("batched", "per_tensor"):
        emit((kind,), _percentiles(times[kind]))


def part_e2e_fps(settings: Settings, emit: Emit) -> None:
    """recipes/sac.py, then recipes/td3.py, for ``e2e_seconds`` after warm-up each."""
    device = _device(settings)
    compiled = ["compile.compile=true", "compile.cudagraphs=true"] if device.type == "cuda" else []
    for recipe in ("sac", "td3"):
        overrides = [f"network.device={device}", *compiled,
                     f"collector.num_workers={settings.e2e_workers}",
                     f"collector.env_per_collector={settings.e2e_envs}",
                     f"collector.frames_per_batch={settings.e2e_envs * 8}",
                     f"optim.batch_size={settings.e2e_batch_size}", f"replay_buffer.size={settings.e2e_buffer}"]
        figures = learner_throughput.end_to_end(
            0, "1", overrides, recipe=recipe, seconds=settings.e2e_seconds,
            start_frames=settings.e2e_start_frames, log_every=settings.e2e_log_every)
        emit((recipe,), {key: round(value, 3) if isinstance(value, float) else value
                         for key, value in figures.items()} | {"compiled": bool(compiled)})


def part_collector_scaling(settings: Settings, emit: Emit) -> None:
    """Env steps/s of 1..14 workers x 16 envs on EnvPool, policy on CPU, per task; the ratio to linear."""
    torch.set_num_threads(1)
    envs = collector_throughput.NUM_ENVS  # per worker, as EnvPool alone steps them
    for task, counts in settings.scaling.items():
        alone = collector_throughput.EnvPoolAlone(task)
        emit((task, "envpool_alone_1_thread"), round(alone(settings.scaling_seconds * settings.scaling_rounds), 1))
        alone.env.close()
        one = None
        for workers in counts:
            collector = collector_throughput.OffPolicy(workers, num_envs=envs, env_id=task,
                                                       frames_per_batch=settings.scaling_frames_per_batch,
                                                       buffer_size=settings.scaling_buffer)
            try:
                rate = statistics.median(collector(settings.scaling_seconds) for _ in range(settings.scaling_rounds))
                breakdown = collector.breakdown()
            finally:
                collector.close()
            one = rate if workers == 1 else one
            emit((task, f"workers_{workers}"), {
                "steps_per_s": round(rate, 1), "envs_per_worker": envs,
                "ratio_to_linear": round(rate / (workers * one), 3) if one else None,
                "breakdown_us_per_step": breakdown})


def part_dropin_sac_cuda(settings: Settings, emit: Emit) -> None:
    """TorchRL's sota sac.py with its own device logic (``cuda:0`` on a GPU), with TorchRL's collector and ours, as
    ``sota_dropin.py`` runs it; frames and updates per second over the whole script, start-up included."""
    if settings.rl_root is None:
        emit(("skipped",), "no --rl-root given (a pytorch/rl work tree or bare git dir)")
        return
    script = sota_dropin.select_scripts("sac")[0]
    workdir = Path(tempfile.mkdtemp(prefix="gpu_check_dropin_"))
    budget = sota_dropin.Budget(settings.dropin_frames, 2, 0.1)
    rates = {}
    try:
        sota, commit = sota_dropin.open_checkout(settings.rl_root.expanduser().resolve(), workdir)
        emit(("commit",), commit)
        emit(("device",), "cuda:0" if torch.cuda.is_available() else "cpu")
        for label, stock in (("torchrl", True), ("ours", False)):
            result = sota_dropin.run_one(
                script, sota, workdir, budget, settings.timeouts["dropin_sac_cuda"] / 2 - 10,
                trainer_collector=sota_dropin.SWAP_TARGET, trainer_import=None, stock=stock, extra=[])
            emit((label, "status"), result.status)
            emit((label, "seconds"), round(result.seconds, 1))
            for key, value in (("first_error", result.error), ("notes", result.notes)):
                if value:
                    emit((label, key), value)
            if result.status == "ok" and result.seconds > 0:
                rates[label] = budget.frames / result.seconds
                emit((label, "frames_per_s"), round(rates[label], 1))
                emit((label, "updates_per_s"), round(rates[label] * budget.utd, 1))
            shutil.rmtree(workdir / script.name, ignore_errors=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    if len(rates) == 2:
        emit(("ours_over_torchrl",), round(rates["ours"] / rates["torchrl"], 3))


def part_collector_lanes(settings: Settings, emit: Emit) -> None:
    """One worker x 16 envs with and without ``EnvPoolEnv(lanes=2)``, against EnvPool alone, alternating rounds."""
    torch.set_num_threads(1)
    options = {"frames_per_batch": settings.scaling_frames_per_batch, "buffer_size": settings.scaling_buffer}
    for task in settings.lane_tasks:
        with contextlib.ExitStack() as stack:
            alone = collector_throughput.EnvPoolAlone(task)
            stack.callback(alone.env.close)
            runs = {"envpool_alone": alone}
            for name, lanes in (("workers_1", 1), ("workers_1_lanes_2", 2)):
                runs[name] = collector_throughput.OffPolicy(1, env_id=task, lanes=lanes, **options)
                stack.callback(runs[name].close)
            rates = collector_throughput.interleaved(runs, settings.lane_rounds, settings.scaling_seconds)
            breakdown = {name: runs[name].breakdown() for name in ("workers_1", "workers_1_lanes_2")}
        ratio, alone_rates = collector_throughput.median_ratio, rates["envpool_alone"]
        emit((task,), {**{name: round(statistics.median(r), 1) for name, r in rates.items()},
                       "ratio_offpolicy_over_envpool": round(ratio(rates["workers_1"], alone_rates), 3),
                       "ratio_lanes_2_over_envpool": round(ratio(rates["workers_1_lanes_2"], alone_rates), 3),
                       "breakdown_us_per_step": breakdown})


PART_FUNCTIONS: dict[str, Callable[[Settings, Emit], None]] = {name: globals()[f"part_{name}"] for name in PARTS}


# ------------------------------------------------------------ running parts
def _child(name: str, settings: Settings, path: str, tmp: str) -> None:
    """A part's process: its own session (its group is killed at the timeout), figures appended to ``path``, its
    temporary files in ``tmp``, which the parent removes (a forked part ends with ``os._exit``: no finalisers)."""
    os.setsid()
    os.dup2(2, 1)  # what the part prints goes to stderr: stdout holds the one JSON line
    os.environ["TMPDIR"] = tempfile.tempdir = tmp  # its collectors' workers inherit it too
    with open(path, "a") as out:
        def emit(where: tuple[str, ...], value: object) -> None:
            out.write(json.dumps({"at": list(where), "value": value}) + "\n")
            out.flush()

        try:
            PART_FUNCTIONS[name](settings, emit)
        except BaseException as err:  # noqa: BLE001 - recorded, whatever it is
            out.write(json.dumps({"error": f"{type(err).__name__}: {err}".splitlines()[0][:500],
                                  "traceback": traceback.format_exc()[-3000:]}) + "\n")
            out.flush()
            os._exit(1)
    os._exit(0)


def run_part(name: str, settings: Settings, timeout: float) -> dict:
    """Runs one part in a forked process of its own session; its figures, and ``error`` if it failed."""
    if torch.cuda.is_initialized():  # every part after this one would fail on the GPU
        raise RuntimeError("gpu_check: CUDA was initialised in the parent process; parts must be forked before")
    figures: dict = {}
    with tempfile.NamedTemporaryFile("r", prefix=f"gpu_check_{name}_", suffix=".jsonl") as lines, \
            tempfile.TemporaryDirectory(prefix=f"gpu_check_{name}_tmp_", ignore_cleanup_errors=True) as tmp:
        process = mp.get_context("fork").Process(target=_child, args=(name, settings, lines.name, tmp),
                                                 daemon=False)
        sys.stdout.flush()  # else the fork would print what is buffered a second time
        sys.stderr.flush()
        start = time.monotonic()
        process.start()
        process.join(timeout)
        timed_out = process.is_alive()
        # The whole group (collector workers, fork servers, a sota script), the resource tracker last;
        # also after a clean exit, in case anything of it was left.
        kill_group(process.pid)
        process.join()
        seconds = time.monotonic() - start
        error = None
        for line in lines.read().splitlines():
            entry = json.loads(line)
            if "error" in entry:
                error = entry["error"]
                figures["traceback_tail"] = entry["traceback"]
                continue
            *path, last = entry["at"]
            node = figures
            for key in path:
                node = node.setdefault(key, {})
            node[last] = entry["value"]
    if timed_out:
        error = f"timeout after {timeout:.0f} s (the part's process group was killed; figures before it kept)"
    elif error is None and process.exitcode != 0:
        error = f"the part's process exited with code {process.exitcode}"
    if error is not None:
        figures["error"] = error
    status = "timeout" if timed_out else "failed" if error else "skipped" if "skipped" in figures else "ok"
    return {"figures": figures, "status": status, "seconds": round(seconds, 1)}


def gpu_check(settings: Settings, budget_s: float, only: tuple[str, ...] = PARTS) -> dict:
    """Every part of ``only`` in turn, each within its timeout and what is left of ``budget_s``; the JSON's dict."""
    started = time.monotonic()
    out: dict = {"benchmark": "gpu_check", "date": datetime.datetime.now(datetime.timezone.utc).isoformat(
        timespec="seconds"), "device": settings.device, "quick": settings.quick, "budget_s": budget_s}
    status = {}
    for name in only:
        left = budget_s - (time.monotonic() - started)
        if left < 10:
            out[name] = {"error": f"not run: {budget_s:.0f} s budget spent (--budget-s)"}
            status[name] = {"status": "not run", "seconds": 0.0}
            continue
        result = run_part(name, settings, min(settings.timeouts[name], left))
        out[name] = result["figures"]
        status[name] = {"status": result["status"], "seconds": result["seconds"]}
        print(f"gpu_check: {name}: {result['status']} ({result['seconds']:.0f} s)"
              + (f": {result['figures']['error']}" if "error" in result["figures"] else ""),
              file=sys.stderr, flush=True)
    out["parts"] = status
    out["elapsed_s"] = round(time.monotonic() - started, 1)
    out["targets"] = TARGETS
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="the learner's device: cuda (default) or cpu")
    parser.add_argument("--quick", action="store_true", help="tiny sizes, a few seconds a part (the CPU dry run)")
    parser.add_argument("--rl-root", type=Path, default=None,
                        help="a pytorch/rl work tree or bare git dir, for dropin_sac_cuda (skipped without it)")
    parser.add_argument("--out", default=None, help="also write the JSON to benchmarks/results/gpu/OUT")
    parser.add_argument("--budget-s", type=float, default=470.0, help="seconds for all parts together (default 470)")
    parser.add_argument("--only", default=None, help=f"comma-separated parts, of {','.join(PARTS)}")
    parser.add_argument("--e2e-seconds", type=float, default=None,
                        help="each recipe's measured window after warm-up (default 60; --quick: 2)")
    args = parser.parse_args(argv)
    only = PARTS if args.only is None else tuple(p.strip() for p in args.only.split(",") if p.strip())
    unknown = sorted(set(only) - set(PARTS))
    if unknown:
        parser.error(f"--only: unknown parts {unknown}; accepted: {','.join(PARTS)}")
    if args.device.split(":")[0] not in ("cuda", "cpu"):
        parser.error(f"--device must be cuda, cuda:N or cpu, got {args.device!r}")
    out = gpu_check(Settings.make(args.device, args.quick, args.rl_root, args.e2e_seconds), args.budget_s, only)
    line = json.dumps(out)
    print(line, flush=True)
    if args.out:
        path = Path(args.out) if Path(args.out).parent != Path(".") else RESULTS / args.out
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(line + "\n")
        print(f"gpu_check: written to {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
