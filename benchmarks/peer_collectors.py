"""OffPolicyCollector against TorchRL's AsyncBatchedCollector, both writing every frame into a replay buffer.

Run::

    python benchmarks/peer_collectors.py --rl-root ~/src/rl [--rounds 3] [--seconds 6]
    python benchmarks/peer_collectors.py --workloads state                          # no pytorch/rl checkout needed
    python benchmarks/peer_collectors.py --rl-root ~/src/rl --out benchmarks/results/collector/peer_async_batched.json

See ``benchmarks/README.md``, section "Against TorchRL's AsyncBatchedCollector". The pixel workloads are TorchRL's
own ``benchmarks/bench_collectors.py``, read from the pytorch/rl checkout ``--rl-root`` at run time.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib.metadata
import json
import os
import queue
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

# The env workers TorchRL spawns import this module again to unpickle its factories: what it imports at the top
# stays light, and each function imports what it runs.
from common import (
    bootstrap_interval,
    first_error,
    group_members,
    kill_group,
    open_rl,
    provenance,
    wait_until,
    with_pythonpath,
    work_dir,
)

ROOT = Path(__file__).resolve().parents[1]
BENCH = "benchmarks/bench_collectors.py"
ENV = "HalfCheetah-v5"
SIDES = ("ours", "theirs")
READY, RESULT = "READY", "RESULT "
#: TorchRL's transitions per worker message in its fast configuration (``transition_chunk_size``)
CHUNK = 64


@dataclasses.dataclass(frozen=True)
class Workload:
    """One comparison: what both sides step and act with, the target of ours over theirs, and the buffer's rows."""

    name: str
    what: str
    target: float
    buffer_rows: int
    policy_delay_ms: float = 0.0
    pixels: bool = True


WORKLOADS = {w.name: w for w in (
    Workload("state", f"{ENV} (state), the recipes' SAC actor", 10.0, 1_000_000, pixels=False),
    Workload("pixels", "bench_collectors.py's fake pixel env (1 ms step latency) and CNN policy", 2.0, 100_000),
    Workload("pixels_delay", "the same, its policy delayed 20 ms a call (a large model's inference)", 1.0, 100_000,
             policy_delay_ms=20.0),
)}


# ------------------------------------------------------------------ what both sides run
def state_env():
    """TorchRL's ``GymEnv`` of the task with ``DoubleToFloat``, one per AsyncBatchedCollector worker process."""
    from torchrl.envs import DoubleToFloat, GymEnv, TransformedEnv

    return TransformedEnv(GymEnv(ENV), DoubleToFloat())


def recipe_actor_factory() -> Callable:
    """A picklable factory of the SAC actor ``recipes/config/sac.yaml`` builds (its ``network`` section)."""
    from collector_throughput import dims
    from common import recipe_config

    from torchrl_unilab.modules.models import make_actor

    network = recipe_config("sac", []).network
    return functools.partial(make_actor, "sac", *dims(ENV), hidden_sizes=list(network.hidden_sizes),
                             use_layer_norm=bool(network.use_layer_norm))


def factories(workload: Workload, args: argparse.Namespace) -> tuple[Callable, Callable]:
    """``(env factory, policy factory)``: for the pixel workloads ``bench_collectors.py``'s fake pixel env and CNN
    policy as it makes them; for the state task TorchRL's env (ours takes the task's id) and the recipes' actor."""
    if not workload.pixels:
        return state_env, recipe_actor_factory()
    import bench_collectors  # the checkout's, on PYTHONPATH: TorchRL's spawned workers import it by this name

    return (bench_collectors.EnvFactory(env="fake-pixels", step_latency_s=args.step_latency_ms / 1000),
            bench_collectors.PolicyFactory(delay_s=workload.policy_delay_ms / 1000))


def row_bytes(replay_buffer) -> tuple[int, list[str]]:
    """The bytes one stored row takes in ``replay_buffer``'s storage, and its keys."""
    import torch

    row = replay_buffer.storage[0]
    leaves = {".".join(k) if isinstance(k, tuple) else k: v
              for k, v in row.items(include_nested=True, leaves_only=True) if isinstance(v, torch.Tensor)}
    return sum(v.numel() * v.element_size() for v in leaves.values()), sorted(leaves)


def rate_between_writes(count: Callable[[], int], seconds: float, warmup_frames: int, timeout: float) -> float:
    """Frames per second that ``count()`` (a buffer's write count) grows, from its first change after ``warmup_frames``
    more frames to its first change ``seconds`` later: whole writes only, however many frames each holds."""
    def next_write(beyond: int) -> tuple[int, float]:
        before = count()
        if not wait_until(lambda: count() > before + beyond, timeout, poll=0.005):
            raise TimeoutError(f"fewer than {beyond + 1} frames written into the buffer in {timeout} s")
        return count(), time.perf_counter()

    f0, t0 = next_write(warmup_frames)
    time.sleep(seconds)
    f1, t1 = next_write(0)
    return (f1 - f0) / (t1 - t0)


def pixel_envs(kind: str, per_worker: int, make_env: Callable) -> Callable:
    """A worker's pixel envs: TorchRL's threaded ``AsyncEnvPool`` (``"pool"``: the envs wait at the same time) or a
    ``SerialEnv`` (``"serial"``: one after another)."""
    from torchrl.envs import AsyncEnvPool, SerialEnv

    if kind == "pool":
        return functools.partial(AsyncEnvPool, [make_env] * per_worker, backend="threading")
    return functools.partial(SerialEnv, per_worker, make_env)


class Ours:
    """``OffPolicyCollector``, ``--workers`` workers sharing ``--envs`` envs (the pixel env in a threaded
    ``AsyncEnvPool`` or a ``SerialEnv``, ``--ours-pixel-envs``; EnvPool for the state task), into
    :func:`~torchrl_unilab.make_replay_buffer`'s shared ``LazyMemmapStorage``; kept paused between its windows
    (``collector_throughput.OffPolicy``)."""

    def __init__(self, workload: Workload, args: argparse.Namespace) -> None:
        from collector_throughput import OffPolicy

        make_env, make_policy = factories(workload, args)
        per_worker = args.envs // args.workers
        env = pixel_envs(args.ours_pixel_envs, per_worker, make_env) if workload.pixels else None
        self.side = OffPolicy(args.workers, num_envs=per_worker, env=env, actor=make_policy(), env_id=ENV,
                              frames_per_batch=args.frames_per_batch, buffer_size=workload.buffer_rows,
                              start_timeout=args.timeout)
        # every worker's batch in flight when the window opens was started after the pause
        self.warmup_frames = args.workers * args.frames_per_batch

    def measure(self, seconds: float) -> dict:
        fps = self.side(seconds, warmup_frames=self.warmup_frames)
        stored, keys = row_bytes(self.side.replay_buffer)
        return {"fps": fps, "bytes_per_transition": stored, "stored_keys": keys,
                "engine": self.side.collector.metrics()["engine"], "breakdown_us_per_frame": self.side.breakdown()}

    def close(self) -> None:
        self.side.close()


class Theirs:
    """``AsyncBatchedCollector`` in the fast configuration its docstring gives for many process-backed envs: one env
    per worker process, ``transport="auto"`` with a ``policy_factory`` (a dedicated inference process the workers
    reach directly), 64-step chunks, batches of up to every env; ``replay_buffer=`` a ``LazyMemmapStorage`` buffer
    that its background thread extends (``start()``); kept paused (its ``pause()``) between its windows."""

    def __init__(self, workload: Workload, args: argparse.Namespace) -> None:
        from torchrl.collectors import AsyncBatchedCollector
        from torchrl.data import LazyMemmapStorage, ReplayBuffer
        from torchrl.modules.inference_server import InferenceDeviceConfig, InferenceServerConfig

        make_env, make_policy = factories(workload, args)
        self.rb = ReplayBuffer(storage=LazyMemmapStorage(workload.buffer_rows))
        batch = CHUNK * args.envs
        self.collector = AsyncBatchedCollector(
            [make_env] * args.envs, policy_factory=make_policy, frames_per_batch=batch, total_frames=-1,
            env_backend="multiprocessing", transport="auto", transition_chunk_size=CHUNK,
            server_config=InferenceServerConfig(max_batch_size=args.envs, min_batch_size=1, timeout=0.001),
            device_config=InferenceDeviceConfig(policy_device="cpu", output_device="cpu", storing_device="cpu"),
            replay_buffer=self.rb)
        self.collector.start()
        if not wait_until(lambda: self.rb.write_count >= 2 * batch, args.timeout, poll=0.05):  # past start-up
            raise TimeoutError(f"AsyncBatchedCollector wrote {self.rb.write_count} frames in {args.timeout} s")
        # A paused worker keeps its chunk under way: two batches after a resume, every chunk in a write was begun
        # after it.
        self.warmup_frames, self.timeout = 2 * batch, args.timeout
        self._pause = self.collector.pause()
        self._pause.__enter__()

    def measure(self, seconds: float) -> dict:
        self._pause.__exit__(None, None, None)
        try:
            self.collector.server_stats(reset=True)
            fps = rate_between_writes(lambda: self.rb.write_count, seconds, self.warmup_frames, self.timeout)
            stats = self.collector.server_stats()
        finally:
            self._pause = self.collector.pause()
            self._pause.__enter__()
        stored, keys = row_bytes(self.rb)
        return {"fps": fps, "bytes_per_transition": stored, "stored_keys": keys,
                "server_backend": self.collector.server_backend,
                "server": {key: round(stats[key], 2) for key in ("avg_batch_size", "p50_forward_ms", "p50_queue_ms")}}

    def close(self) -> None:
        self._pause.__exit__(None, None, None)
        self.collector.shutdown()


def serve(args: argparse.Namespace) -> None:
    """The child process: one side of one workload, started and paused (then ``READY``); each ``measure`` line on
    stdin is answered by a ``RESULT`` line; any other line, or the end of stdin, shuts it down."""
    import torch

    torch.set_num_threads(1)
    workload, side = args.serve.split(":")
    measured = {"ours": Ours, "theirs": Theirs}[side](WORKLOADS[workload], args)
    print(READY, flush=True)
    for line in sys.stdin:
        if line.strip() != "measure":
            break
        print(RESULT + json.dumps(measured.measure(args.seconds)), flush=True)
    measured.close()


# ------------------------------------------------------------------ the rounds
def cpu_seconds(pgid: int) -> float:
    """The CPU seconds (user and system) that the live processes of group ``pgid`` have used so far."""
    total = 0
    for pid in group_members(pgid):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            total += sum(int(x) for x in stat[stat.rindex(")") + 2:].split()[11:13])  # utime, stime
        except (OSError, ValueError):
            continue  # gone meanwhile
    return total / os.sysconf("SC_CLK_TCK")


class Side:
    """A side's :func:`serve` process, in a process group of its own, its stderr in ``log``."""

    def __init__(self, name: str, command: list[str], env: dict[str, str], log: Path) -> None:
        self.name, self.log = name, log
        with log.open("wb") as err:
            self.proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
                                         text=True, start_new_session=True, env=env)
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def expect(self, prefix: str, timeout: float) -> str | None:
        """The rest of the next stdout line that starts with ``prefix``; ``None`` if it exits or ``timeout`` passes."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                return None
            if line is None:
                return None
            if line.startswith(prefix):
                return line[len(prefix):].strip()

    def measure(self, timeout: float) -> dict | None:
        try:
            self.proc.stdin.write("measure\n")
            self.proc.stdin.flush()
        except OSError:
            return None
        answer = self.expect(RESULT, timeout)
        return None if answer is None else json.loads(answer)

    def problem(self, at: str) -> str:
        """What went wrong ``at`` a step: its exception line, or that it hangs."""
        if self.proc.poll() is None:
            return f"hang at {at}"
        return f"failed at {at}: {first_error(self.log.read_text(errors='replace')) or f'exit {self.proc.returncode}'}"

    def close(self, grace: float) -> str | None:
        """Asks it to shut down; kills what of its group is left after ``grace`` seconds. ``"hang at exit"`` if the
        process itself was still running then."""
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=grace)
            problem = None
        except subprocess.TimeoutExpired:
            problem = "hang at exit"
        kill_group(self.proc.pid, grace=2.0)  # its workers and resource tracker too
        self.proc.wait()
        return problem


def serve_command(workload: str, side: str, args: argparse.Namespace) -> list[str]:
    return [sys.executable, __file__, "--serve", f"{workload}:{side}", "--seconds", str(args.seconds),
            "--envs", str(args.envs), "--workers", str(args.workers), "--frames-per-batch", str(args.frames_per_batch),
            "--step-latency-ms", str(args.step_latency_ms), "--timeout", str(args.timeout),
            "--ours-pixel-envs", args.ours_pixel_envs]


def workload_rounds(workload: str, args: argparse.Namespace, env: dict[str, str], logs: Path
                    ) -> tuple[dict[str, list[dict | None]], list[dict]]:
    """Starts both sides of ``workload`` (one after the other, each then paused), then measures them in ``--rounds``
    rounds, the order of the sides alternating from round to round; ``({side: [result or None per round]},
    problems)``. Each result carries the 1-minute load average after it and the cores the other, paused side used
    meanwhile."""
    runs: dict[str, list[dict | None]] = {side: [] for side in SIDES}
    problems: list[dict] = []
    sides: dict[str, Side] = {}
    try:
        for name in SIDES:
            started = time.monotonic()
            side = Side(name, serve_command(workload, name, args), env, logs / f"{workload}_{name}.log")
            sides[name] = side
            if side.expect(READY, args.timeout) is None:
                problems.append({"workload": workload, "side": name, "problem": side.problem("start-up")})
            print(f"{workload} {name}: started in {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
        for r in range(args.rounds):
            for name in SIDES if r % 2 == 0 else SIDES[::-1]:
                side, other = sides[name], sides[SIDES[1 - SIDES.index(name)]]
                result = None
                if side.proc.poll() is None and not any(p["side"] == name for p in problems):
                    other_cpu, wall = cpu_seconds(other.proc.pid), time.monotonic()
                    result = side.measure(args.timeout)
                    if result is None:
                        problems.append({"workload": workload, "side": name, "round": r,
                                         "problem": side.problem("a measurement")})
                    else:
                        result["paused_other_side_cores"] = round(
                            (cpu_seconds(other.proc.pid) - other_cpu) / (time.monotonic() - wall), 3)
                        result["load_1min"] = round(os.getloadavg()[0], 2)
                runs[name].append(result)
                shown = f"{result['fps']:.0f} frames/s" if result else "no result"
                print(f"{workload} round {r}: {name} {shown}", file=sys.stderr, flush=True)
    finally:
        for name, side in sides.items():
            problem = side.close(args.exit_grace)
            if problem:
                problems.append({"workload": workload, "side": name, "problem": problem})
    return runs, problems


def summary(workload: Workload, runs: dict[str, list[dict | None]], args: argparse.Namespace) -> dict:
    """One workload's figures: each side's frames/s per round and median, ours over theirs in each round where both
    gave a rate, their median with its 90 % bootstrap interval (3 rounds or more), the target, the bytes a stored
    transition takes on each side, and what each side reported of its own work."""
    fps = {side: [None if r is None else round(r["fps"], 1) for r in runs[side]] for side in SIDES}
    ratios = [a / b for a, b in zip(fps["ours"], fps["theirs"]) if a is not None and b]
    interval = bootstrap_interval(ratios, statistic=statistics.median)
    last = {side: next((r for r in reversed(runs[side]) if r is not None), {}) for side in SIDES}
    out = {"what": workload.what, "buffer_rows": workload.buffer_rows}
    if workload.pixels:
        out |= {"step_latency_ms": args.step_latency_ms, "policy_delay_ms": workload.policy_delay_ms}
    per_round = ("fps", "load_1min", "paused_other_side_cores")
    for side in SIDES:
        rates = [v for v in fps[side] if v is not None]
        out[side] = {"fps_rounds": fps[side], "fps": round(statistics.median(rates), 1) if rates else None,
                     **{f"{key}_rounds": [None if r is None else r.get(key) for r in runs[side]]
                        for key in per_round[1:]},
                     **{k: v for k, v in last[side].items() if k not in per_round}}
    median = statistics.median(ratios) if ratios else None
    out |= {"ratio_rounds": [round(x, 3) for x in ratios], "ratio": None if median is None else round(median, 3),
            "ratio_interval": None if interval is None else [round(x, 3) for x in interval],
            "target": workload.target, "target_met": None if median is None else median >= workload.target}
    return out


def configurations(args: argparse.Namespace) -> dict[str, str]:
    """What each side runs, in words, for the results file."""
    per_worker = args.envs // args.workers
    pixels = (f"AsyncEnvPool([pixel env] * {per_worker}, backend='threading')" if args.ours_pixel_envs == "pool"
              else f"SerialEnv({per_worker}) of the pixel env")
    return {
        "ours": f"OffPolicyCollector, {args.workers} workers x {per_worker} envs (EnvPool for the state task, "
                f"{pixels}), {args.frames_per_batch} frames a worker batch, "
                "make_replay_buffer (a shared LazyMemmapStorage) written by the workers",
        "theirs": f"AsyncBatchedCollector, {args.envs} env worker processes (env_backend='multiprocessing', one env "
                  "each), transport='auto' with a policy_factory (a dedicated inference process the workers reach "
                  f"directly), transition_chunk_size={CHUNK}, frames_per_batch={CHUNK * args.envs}, "
                  f"InferenceServerConfig(max_batch_size={args.envs}, min_batch_size=1, timeout=0.001), "
                  "replay_buffer=ReplayBuffer(LazyMemmapStorage) extended by its background thread (start())",
        "windows": f"{args.seconds} s a round, between two buffer writes, after a warm-up: each worker's batch "
                   f"(ours), two batches (theirs, whose paused workers keep their {CHUNK}-step chunk under way)",
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rl-root", type=Path, default=None,
                        help=f"a pytorch/rl work tree or bare git repository holding {BENCH} (the pixel workloads)")
    parser.add_argument("--workloads", nargs="+", choices=list(WORKLOADS), default=list(WORKLOADS))
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds (3 or more give an interval)")
    parser.add_argument("--seconds", type=float, default=6.0, help="the measured window of each side in a round")
    parser.add_argument("--envs", type=int, default=16, help="envs on each side")
    parser.add_argument("--workers", type=int, default=2, help="our worker processes, --envs shared among them")
    parser.add_argument("--frames-per-batch", type=int, default=256, help="our frames a worker batch")
    parser.add_argument("--step-latency-ms", type=float, default=1.0, help="the fake pixel env's step latency")
    parser.add_argument("--ours-pixel-envs", choices=["pool", "serial"], default="pool",
                        help="how a worker of ours steps its pixel envs: TorchRL's threaded AsyncEnvPool (their "
                             "waits overlap) or a SerialEnv (one after another)")
    parser.add_argument("--timeout", type=float, default=600.0,
                        help="seconds a side may take to start, or to answer a measurement (then it is killed)")
    parser.add_argument("--exit-grace", type=float, default=30.0,
                        help="seconds a side may take to shut down (then its process group is killed)")
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON to this file, indented")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (the sides' logs)")
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        serve(args)
        return 0
    if args.rounds < 1 or args.seconds <= 0:
        parser.error(f"--rounds must be >= 1 and --seconds > 0, got {args.rounds} and {args.seconds}")
    if args.envs < args.workers or args.envs % args.workers:
        parser.error(f"--envs must be a multiple of --workers, got {args.envs} and {args.workers}")
    pixels = [w for w in args.workloads if WORKLOADS[w].pixels]
    if pixels and args.rl_root is None:
        parser.error(f"--rl-root (a pytorch/rl checkout holding {BENCH}) is needed for {', '.join(pixels)}; "
                     "without one, run --workloads state")
    checkout = open_rl(args.rl_root, BENCH) if args.rl_root is not None else None
    load_start, started = os.getloadavg(), time.monotonic()
    workloads, problems = {}, []
    with work_dir("peer_collectors_", args.keep) as work:
        if checkout is not None:
            checkout.copy([BENCH], work)
        env = with_pythonpath(ROOT, ROOT / "benchmarks", work / "benchmarks")
        for name in args.workloads:
            runs, found = workload_rounds(name, args, env, work)
            workloads[name], problems = summary(WORKLOADS[name], runs, args), problems + found
    load_end = os.getloadavg()
    out = {
        **provenance("peer_collectors", round(load_start[0], 2), round(load_end[0], 2), argv=argv),
        "rl_commit": checkout.commit if checkout is not None else None,
        "torchrl": importlib.metadata.version("torchrl"),
        "load_average_start_end": [[round(x, 2) for x in load_start], [round(x, 2) for x in load_end]],
        "minutes": round((time.monotonic() - started) / 60, 1), "rounds": args.rounds, "seconds": args.seconds,
        "envs": args.envs, "configurations": configurations(args), "workloads": workloads, "problems": problems,
    }
    print(json.dumps(out))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
