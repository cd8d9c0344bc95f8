"""Faults survived: real SIGKILLs and SIGTERMs against the buffer, the collector and the recipe.

Run ``python benchmarks/faults.py`` (the CI variant), ``--minutes 60`` (a soak of the kill cases) or
``--soak-minutes 20 --ray-soak-minutes 10`` (the recipe's soaks).

See ``benchmarks/README.md``, section "Faults survived". ``--out`` writes :func:`results_file`, or with both soaks
:func:`soak_results_file`.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import json
import multiprocessing as mp
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import torch
from common import kill_now, provenance, scalar_rows, wait_until
from tensordict import TensorDict

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from torchrl_unilab import make_replay_buffer  # noqa: E402
from torchrl_unilab._residue import (  # noqa: E402
    command_line,
    left_by,
    live_processes,
    multiprocessing_helpers,
    running,
    worker_processes,
)

CTX = mp.get_context("spawn")
#: buffer_kills: rows of each writer's batch, and the longest ``sample()`` it allows (a longer one ends the case)
WRITER_ROWS, SAMPLE_LIMIT_S = 4000, 5
#: recipe_soak: the local soak's workers, and the Ray soak's node actors (one worker each)
SOAK_PROCESSES = 2
#: Columns of an id-stamped row: (key, per-row shape, dtype).
ID_COLUMNS = (
    ("observation", (256,), torch.float32),
    ("action", (32,), torch.float64),
    (("next", "observation"), (256,), torch.float32),
    ("row_id", (), torch.int64),
)


def id_rows(first: int, count: int) -> TensorDict:
    """``count`` rows whose every column holds the row's id (``first``, ``first + 1``, ... modulo 2**22, below
    2**24: the largest range float32 columns hold exactly)."""
    ids = torch.arange(first, first + count, dtype=torch.int64) % 2**22
    out = TensorDict(batch_size=[count])
    for key, shape, dtype in ID_COLUMNS:
        out.set(key, ids.to(dtype).reshape(count, *[1] * len(shape)).expand(count, *shape).clone())
    return out


def torn_rows(batch: TensorDict) -> int:
    """How many rows of ``batch`` are torn (:func:`torn_mask`)."""
    return int(torn_mask(batch).sum())


def torn_mask(batch: TensorDict) -> torch.Tensor:
    """Which rows of ``batch`` are torn: their columns do not all hold the same id.

    A collector's rows carry no id: a row is torn when its ``("next", "step_count")`` is not its ``step_count + 1``
    (one ``extend`` writes both; a row half old, half new breaks the relation).
    """
    if "row_id" not in batch.keys():
        step = batch.get("step_count")
        return (batch.get(("next", "step_count")) != step + 1).reshape(len(step), -1).any(-1)
    ids = batch.get("row_id").to(torch.float64)
    bad = torch.zeros(len(ids), dtype=torch.bool)
    for key, _, _ in ID_COLUMNS:
        bad |= (batch.get(key).to(torch.float64).reshape(len(ids), -1) != ids[:, None]).any(-1)
    return bad


def id_writer(replay_buffer, first: int, rows: int) -> None:
    """Extends ``replay_buffer`` with id-stamped batches of ``rows`` until killed."""
    while True:
        replay_buffer.extend(id_rows(first, rows))
        first += rows


def fork_call(target: Callable[..., object], *args: object) -> int:
    """Forks a child that runs ``target(*args)`` and leaves with ``os._exit`` (0 if it returned, 1 if it raised),
    never returning into the caller's code; returns its pid."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            target(*args)
            code = 0
        finally:
            os._exit(code)
    return pid


def _forker_main(replay_buffer, rows: int, commands) -> None:
    # A fork starts in milliseconds where a spawn re-imports torch, and this spawned process has no threads that
    # forking would break. With SIGCHLD ignored the kernel reaps the killed writers.
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    while (first := commands.recv()) is not None:
        commands.send(fork_call(id_writer, replay_buffer, first, rows))


@contextlib.contextmanager
def writer_forker(replay_buffer, rows: int):
    """Yields ``start_writer(first_id) -> pid``: starts a process writing id-stamped batches of ``rows`` from
    ``first_id`` on, to be SIGKILLed (forked from one spawned helper, which ends with the block)."""
    commands, child_end = CTX.Pipe()
    process = CTX.Process(target=_forker_main, args=(replay_buffer, rows, child_end), daemon=True)
    process.start()
    child_end.close()

    def start_writer(first_id: int) -> int:
        commands.send(first_id)
        if not commands.poll(120):
            raise RuntimeError("the writer forker did not answer within 120 s")
        return commands.recv()

    try:
        yield start_writer
    finally:
        commands.send(None)
        process.join(10)
        if process.is_alive():
            process.kill()
            process.join(5)
        commands.close()


def wait_gone_all(pids_now, timeout: float, poll: float = 0.05) -> bool:
    """Whether ``pids_now()`` returned nothing within ``timeout`` seconds (checked every ``poll`` seconds)."""
    return wait_until(lambda: not pids_now(), timeout, poll)


class TimedSampler:
    """Samples ``replay_buffer`` in a thread, all the time; records the longest call and torn rows."""

    def __init__(self, replay_buffer, batch_size: int = 256) -> None:
        self.rb, self.batch_size = replay_buffer, batch_size
        self.longest_s, self.samples, self.torn = 0.0, 0, 0
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._current_start: float | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self._current_start = time.monotonic()
                batch = self.rb.sample(self.batch_size)
                self.longest_s = max(self.longest_s, time.monotonic() - self._current_start)
                self._current_start = None
                self.torn += torn_rows(batch)
                self.samples += 1
        except BaseException as err:  # noqa: BLE001 - reported by __exit__
            self.error = err

    def blocked_s(self) -> float:
        """How long the call in progress has been running (0 when none is)."""
        start = self._current_start
        return 0.0 if start is None else time.monotonic() - start

    def __enter__(self) -> TimedSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(10.0)
        if self._thread.is_alive():
            self.longest_s = max(self.longest_s, self.blocked_s())
            raise TimeoutError(f"sample() has been blocked for {self.blocked_s():.1f}s")
        if self.error is not None:
            raise self.error


def buffer_kills(kills: int, *, rows: int = WRITER_ROWS, capacity: int = 10_000, max_delay_s: float = 0.25,
                 seed: int = 0, deadline: float | None = None) -> dict:
    """SIGKILLs id-writing processes at random moments while this process samples all the time.

    The buffer is full from the start, so every write overwrites rows that ``sample()`` can return.
    """
    rng = random.Random(seed)
    rb = make_replay_buffer(capacity)
    rb.extend(id_rows(0, capacity))
    counters = getattr(rb._writer, "counters", None)  # noqa: SLF001 - absent from TorchRL's own writer
    mid_write = done = 0
    with TimedSampler(rb) as sampler, writer_forker(rb, rows) as start_writer:
        next_id = capacity
        while done < kills and (deadline is None or time.monotonic() < deadline):
            pid = start_writer(next_id)
            time.sleep(rng.uniform(0.0, max_delay_s))
            if counters is not None and done % 2:
                # Every other kill waits for the writer's mark (rows marked, not yet committed): at random
                # moments alone, few kills land inside a write.
                give_up = time.monotonic() + 2.0
                while counters[6] == 0 and time.monotonic() < give_up:
                    pass
            # The mark is read at the kill: the sampler repairs the rows as soon as the dead writer's lock is freed.
            marked = counters is not None and counters[6] > 0
            os.kill(pid, signal.SIGKILL)
            marked = marked or (counters is not None and counters[6] > 0)
            if not wait_gone_all(functools.partial(running, pid), 10, poll=0.001):
                raise RuntimeError(f"writer {pid} survived SIGKILL for 10 s")
            mid_write += marked
            next_id += 1_000_000
            done += 1
            if sampler.blocked_s() > SAMPLE_LIMIT_S:
                break
        time.sleep(0.2)  # let the sampler run past the last kill
    return {"kills": done, "kills_mid_write": int(mid_write), "samples": sampler.samples,
            "longest_sample_s": round(sampler.longest_s, 4), "torn_rows": sampler.torn}


def make_collector(rb):
    """A Pendulum ``OffPolicyCollector`` (2 workers of 4 envs) filling ``rb``, with a tanh-linear actor: what the
    policy is does not matter to these faults."""
    from tensordict.nn import TensorDictModule

    from torchrl_unilab import OffPolicyCollector

    policy = TensorDictModule(torch.nn.Sequential(torch.nn.Linear(3, 1), torch.nn.Tanh()), in_keys=["observation"],
                              out_keys=["action"])
    return OffPolicyCollector("Pendulum-v1", policy, num_workers=2, num_envs=4, frames_per_batch=256,
                              replay_buffer=rb, seed=0)


def worker_kills(kills: int, *, seed: int = 0, deadline: float | None = None) -> dict:
    """SIGKILLs one ``OffPolicyCollector`` worker at a random moment, with the learner sampling all the time."""
    from torchrl_unilab import WorkerError

    rng = random.Random(seed)
    latencies, longest_sample, torn, done = [], 0.0, 0, 0
    while done < kills and (deadline is None or time.monotonic() < deadline):
        rb = make_replay_buffer(20_000)
        collector = make_collector(rb)
        try:
            collector.start()
            collector.wait_for_frames(512, timeout=120)
            with TimedSampler(rb) as sampler:
                time.sleep(rng.uniform(0.0, 0.5))
                os.kill(rng.choice(collector.procs).pid, signal.SIGKILL)
                killed = time.monotonic()
                while True:
                    try:
                        collector.metrics()
                    except WorkerError:
                        latencies.append(time.monotonic() - killed)
                        break
                    if time.monotonic() - killed > 30:
                        raise RuntimeError("the learner got no WorkerError within 30 s of a worker's SIGKILL")
                    time.sleep(0.005)
                time.sleep(0.2)
            longest_sample, torn = max(longest_sample, sampler.longest_s), torn + sampler.torn
        finally:
            collector.shutdown(raise_on_error=False)
        done += 1
    return {"kills": done, "longest_error_latency_s": round(max(latencies, default=float("nan")), 3),
            "longest_sample_s": round(longest_sample, 4), "torn_rows": torn}


def _residue_of_pid(pid: int) -> int:
    return sum(map(len, left_by(pid).values()))


def residue_snapshot() -> dict:
    """What this process and its children hold: /dev/shm entries, fds, threads, children, temp dirs."""
    gc.collect()
    mp.active_children()
    me = os.getpid()
    left = left_by(me)
    return {"shm": set(left["shm"]), "fds": len(os.listdir("/proc/self/fd")), "threads": threading.active_count(),
            "children": live_processes(parent=me) - multiprocessing_helpers(),  # the helpers are not ours
            "tmp": set(left["tmp"])}


def residue_since(before: dict, settle_s: float = 5.0) -> dict:
    """Counts of what appeared since ``before`` (waiting up to ``settle_s`` for exiting children)."""
    deadline = time.monotonic() + settle_s
    while True:
        after = residue_snapshot()
        diff = {key: len(now - before[key]) if isinstance(now, set) else max(now - before[key], 0)
                for key, now in after.items()}
        if not any(diff.values()) or time.monotonic() > deadline:
            return diff
        time.sleep(0.1)


def _collect_briefly(frames: int) -> None:
    """Creates a collector on a new buffer, collects ``frames`` and shuts it down."""
    with make_collector(make_replay_buffer(5000)) as collector:
        collector.start()
        collector.wait_for_frames(frames, timeout=120)


def cycles(count: int) -> dict:
    """Create / collect / shutdown cycles; the residue they leave."""
    # One cycle first: Python's process-wide helpers start at their first use and live on (multiprocessing's
    # forkserver holds a pipe from then on), which would count as the cycles' residue.
    _collect_briefly(512)
    before = residue_snapshot()
    for _ in range(count):
        _collect_briefly(512)
    return {"cycles": count, "residue": residue_since(before)}


def _learner() -> None:
    """The learner that :func:`learner_kill` SIGKILLs: it collects, prints its workers' pids, then samples."""
    rb = make_replay_buffer(20_000)
    collector = make_collector(rb)
    collector.start()
    collector.wait_for_frames(512, timeout=120)
    print("WORKERS", *(p.pid for p in collector.procs), flush=True)
    while True:
        rb.sample(256)


def learner_kill() -> dict:
    """SIGKILLs a learner during collection: its workers must be gone within 5 s, its residue swept next start."""
    code = f"import sys\nsys.path[:0] = {[str(ROOT), str(ROOT / 'benchmarks')]!r}\nimport faults\nfaults._learner()"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line = ""
        while not line.startswith("WORKERS"):
            line = proc.stdout.readline()
            if not line:
                raise RuntimeError("the learner subprocess exited before reporting its workers")
        workers = [int(pid) for pid in line.split()[1:]]
        if not workers:
            raise RuntimeError("the learner subprocess reported no workers")
        os.kill(proc.pid, signal.SIGKILL)
        killed = time.monotonic()
        proc.wait(10)
        gone = wait_gone_all(lambda: [pid for pid in workers if running(pid)], 30.0)
        workers_gone_s = time.monotonic() - killed
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
    left_before = _residue_of_pid(proc.pid)
    _collect_briefly(256)
    return {"workers": len(workers), "all_workers_gone": gone, "workers_gone_s": round(workers_gone_s, 2),
            "residue_before_next_start": left_before, "residue_after_next_start": _residue_of_pid(proc.pid)}


def _sac(run_dir: Path, overrides: list[str]) -> list[str]:
    """The command that runs ``recipes/sac.py`` with ``overrides``, logging into ``run_dir``."""
    return [sys.executable, str(ROOT / "recipes" / "sac.py"), *overrides, f"logger.log_dir={run_dir}"]


def _checkpointed_buffer(run_dir: Path, size: int):
    """A buffer of capacity ``size`` loaded from the recipe run's checkpoint in ``run_dir``."""
    from torchrl_unilab.trainers.checkpoint import Checkpointer

    rb = make_replay_buffer(size)
    Checkpointer(run_dir / "checkpoint", modules={}).load(rb)
    return rb


def recipe_sigterm() -> dict:
    """SIGTERM to ``recipes/sac.py``: exit time, checkpoint, residue; resume restores the buffer exactly."""
    tiny = ["env.name=Pendulum-v1", "network.hidden_sizes=[32,32]", "optim.batch_size=64",
            "collector.env_per_collector=4", "collector.frames_per_batch=64", "collector.init_random_frames=256",
            "collector.max_lead_frames=256", "replay_buffer.size=20000", "logger.num_eval_envs=2",
            "logger.log_every=128", "logger.eval_iter=100000", "logger.checkpoint_every=0",
            "logger.progress_bar=false"]
    with tempfile.TemporaryDirectory(prefix="faults_recipe_") as tmp:
        run_dir = Path(tmp) / "run"
        proc = subprocess.Popen(_sac(run_dir, [*tiny, "collector.total_frames=1000000"]), cwd=tmp,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            logged = run_dir / "Pendulum-v1_SAC" / "scalars" / "utd" / "achieved.csv"
            wait_until(lambda: logged.exists() and logged.stat().st_size > 0, 180, poll=0.2)
            proc.send_signal(signal.SIGTERM)
            sent = time.monotonic()
            out, _ = proc.communicate(timeout=120)
            exit_s = time.monotonic() - sent
        finally:
            kill_now(proc)
        saved = torch.load(run_dir / "checkpoint" / "state.pt", weights_only=True)["counters"]
        checkpointed = _checkpointed_buffer(run_dir, 20_000)
        rows = len(checkpointed)
        expected = checkpointed[:rows]
        # Resume for one more batch: the buffer (not full) keeps the checkpointed rows in place and appends.
        subprocess.run(_sac(run_dir, [*tiny, f"resume={run_dir}", f"collector.total_frames={saved['frames'] + 64}"]),
                       cwd=tmp, capture_output=True, timeout=300, check=True)
        resumed = _checkpointed_buffer(run_dir, 20_000)
        equal = resumed.write_count == checkpointed.write_count + 64 and bool((resumed[:rows] == expected).all())
        return {"exit_code": proc.returncode, "exit_s": round(exit_s, 2), "frames_at_stop": saved["frames"],
                "checkpoint_saved": "Interrupted: checkpoint saved" in out, "residue": _residue_of_pid(proc.pid),
                "resumed_buffer_equals_checkpoint": equal}


class WorkerKiller(threading.Thread):
    """SIGKILLs a random one of ``find_workers()``'s processes every ``interval_s`` (a ``(low, high)`` range).

    Each kill waits for the replacement to appear and gives it the dead worker's slot; no slot is killed a third
    time within ``window_s``, so that the collector's crash-loop rule (3 failures within 60 s, timed when it sees
    them) never ends the run: the soak measures survival, ``tests/test_restarts.py`` tests the rule.
    """

    def __init__(self, find_workers: Callable[[], set[int]], workers: int, interval_s: tuple[float, float], *,
                 seed: int = 0, window_s: float = 75.0, collecting: Callable[[], bool] = lambda: True) -> None:
        super().__init__(name="WorkerKiller", daemon=True)
        self.find_workers, self.workers, self.interval_s, self.window_s = find_workers, workers, interval_s, window_s
        self.collecting = collecting  # kills stop with collection: a worker killed at shutdown is not replaced
        self.rng = random.Random(seed)
        self.stop = threading.Event()
        self.kills: list[float] = []  # seconds since start of each kill
        self.replacement_s: list[float] = []  # kill to the replacement's appearance
        self._t0 = time.monotonic()

    def run(self) -> None:
        slots: dict[int, int] = {}  # pid -> slot
        history: dict[int, list[float]] = {}
        while not self.stop.is_set() and len(slots) < self.workers:
            for pid in self.find_workers() - set(slots):
                slots[pid] = len(slots)
            self.stop.wait(0.2)
        while not self.stop.wait(self.rng.uniform(*self.interval_s)):
            now = time.monotonic()
            eligible = [pid for pid, slot in slots.items()
                        if sum(now - t <= self.window_s for t in history.get(slot, [])) < 2]
            if not self.collecting():
                return
            if not eligible:
                continue
            victim = self.rng.choice(eligible)
            slot = slots.pop(victim)
            with contextlib.suppress(ProcessLookupError):
                os.kill(victim, signal.SIGKILL)
            self.kills.append(round(now - self._t0, 1))
            history.setdefault(slot, []).append(now)
            while not self.stop.is_set():  # the replacement takes the slot
                new = self.find_workers() - set(slots) - {victim}
                if new:
                    slots[new.pop()] = slot
                    self.replacement_s.append(round(time.monotonic() - now, 2))
                    break
                self.stop.wait(0.05)


def _last_scalar(run_dir: Path, name: str, column: int = -1) -> float | None:
    """The last logged value of a recipe's scalar (``column=0``: the frames it was logged at)."""
    rows = [row for path in list(run_dir.glob(f"*/scalars/{name}.csv"))[:1] for row in scalar_rows(path)]
    return rows[-1][column] if rows else None


def _processes(text: bytes) -> set[int]:
    """Live processes whose command line holds ``text``."""
    return {pid for pid in live_processes() if text in command_line(pid)}


def _checked_buffer(run_dir: Path, size: int) -> dict:
    """The checkpointed buffer of a finished run: its rows, and those torn (:func:`torn_mask`) or not finite."""
    rb = _checkpointed_buffer(run_dir, size)
    rows = rb[: len(rb)]
    finite = torch.stack([rows[key].reshape(len(rows), -1).isfinite().all(-1)
                          for key in ("observation", ("next", "observation"), ("next", "reward"))]).all(0)
    return {"rows": len(rows), "torn_rows": int((torn_mask(rows) | ~finite).sum())}


def _summary(proc, run_dir: Path, log: Path, size: int, frames: int) -> dict:
    """A finished soak run's figures, from its log, its checkpointed buffer and what of its session is left."""
    text = log.read_text()
    match = re.search(r"final eval return (-?[\d.]+) after (\d+) frames, (\d+) updates, ([\d.]+) min(.*)", text)
    if proc.returncode != 0 or match is None:
        error = text.rfind("Error")
        raise RuntimeError(f"the soak's recipe failed (exit {proc.returncode}); its error:\n"
                           f"{text[max(0, error - 1500):error + 1500]}")
    final, got, updates, minutes, survived = match.groups()
    restarts = {name.replace(" ", "_"): int(count) for count, name in re.findall(r"(\d+) (\w+ restarts)", survived)}
    buffer = _checked_buffer(run_dir, size)
    # the recipe started its own session: its workers, Ray, anything
    wait_gone_all(lambda: live_processes(session=proc.pid), 30.0, poll=0.5)
    left = live_processes(session=proc.pid)
    return {"final_return": float(final), "frames": int(got), "updates": int(updates), "minutes": float(minutes),
            "frames_lost": int(got) - buffer["rows"], "frames_short": frames - int(got),
            "torn_rows_in_buffer": buffer["torn_rows"],
            "longest_learner_stall_s": round(_last_scalar(run_dir, "learner/longest_stall_s") or 0.0, 2),
            "residue": _residue_of_pid(proc.pid), "processes_left": len(left), **restarts}


def recipe_soak(minutes: float, *, frames: int | None = None, seed: int = 0, backend: str = "local") -> dict:
    """The SAC recipe on HalfCheetah-v5, a worker (``backend="ray"``: a node actor) SIGKILLed again and again.

    ``frames`` defaults to what 2 cores collect in ``minutes`` (430 frames/s a run, 400 on Ray). The settings and
    the figures returned: ``benchmarks/README.md``, section "Faults survived" (``recipe_soak``, ``ray_soak``).
    """
    ray = backend == "ray"
    frames = -(-(frames or int(minutes * 60 * (400 if ray else 430))) // 1024) * 1024  # whole batches of every worker
    size = frames + 1024
    overrides = [f"env.seed={seed}", f"collector.total_frames={frames}", f"replay_buffer.size={size}",
                 "logger.eval_iter=1000000000", "logger.checkpoint_every=0", "logger.progress_bar=false",
                 "logger.log_every=1000"]
    if ray:
        overrides += ["collector.backend=ray", f"collector.num_nodes={SOAK_PROCESSES}", "collector.num_workers=1",
                      "collector.frames_per_batch=512", "collector.max_lead_frames=1536",
                      "collector.max_node_restarts=1000"]
    else:
        overrides += [f"collector.num_workers={SOAK_PROCESSES}", "collector.max_worker_restarts=1000"]
    results = {"backend": backend, "frames": frames, "load_1min_start": round(os.getloadavg()[0], 2)}
    with tempfile.TemporaryDirectory(prefix="faults_soak_") as tmp:
        runs = {name: (Path(tmp) / name, Path(tmp) / f"{name}.log")
                for name in (["killed"] if ray else ["killed", "undisturbed"])}
        procs = {name: subprocess.Popen(_sac(run_dir, overrides), cwd=run_dir.parent, stdout=log.open("w"),
                                        stderr=subprocess.STDOUT, start_new_session=True)
                 for name, (run_dir, log) in runs.items()}

        def collecting() -> bool:
            return (_last_scalar(runs["killed"][0], "utd/achieved", column=0) or 0) < frames - 2048

        if ray:  # the node actors are Ray's worker processes (titled after their class), not the recipe's children
            find, interval = functools.partial(_processes, b"ray::RayNodeCollector"), (60.0, 60.0)
        else:  # the collector's workers: forked from the recipe's fork server (or spawned by the recipe)
            find, interval = functools.partial(worker_processes, procs["killed"].pid), (20.0, 40.0)
        killer = WorkerKiller(find, SOAK_PROCESSES, interval, seed=seed, collecting=collecting)
        deadline = time.monotonic() + 60 * minutes * 4 + 600
        try:
            killer.start()
            for proc in procs.values():
                proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        finally:
            killer.stop.set()
            if killer.is_alive():
                killer.join(10)
            for proc in procs.values():
                kill_now(proc)
        for name, (run_dir, log) in runs.items():
            results[name] = _summary(procs[name], run_dir, log, size, frames)
        results["killed"]["kills"] = len(killer.kills)
        results["killed"].setdefault("node_restarts" if ray else "worker_restarts", 0)
        results["killed"]["longest_replacement_s"] = max(killer.replacement_s, default=None)
    results["load_1min_end"] = round(os.getloadavg()[0], 2)
    return results


def results_file(results: dict) -> dict:
    """``--out``'s file from the kill cases' JSON object ``results`` (the recipe's SIGTERM case included): the
    faults table's figures, as ``benchmarks/report.py`` reads them."""
    b, w, c = results["buffer_kills"], results["worker_kills"], results["cycles"]
    lk, st = results["learner_kill"], results["recipe_sigterm"]
    residue = c["residue"]
    return {
        **provenance("faults", results["load_1min_start"], results["load_1min_end"]), "seconds": results["seconds"],
        "buffer_kills": {"kills": b["kills"], "inside_write": b["kills_mid_write"], "batch_rows": WRITER_ROWS,
                         "max_sample_s": b["longest_sample_s"], "limit_s": SAMPLE_LIMIT_S,
                         "torn_rows": b["torn_rows"], "samples": b["samples"]},
        # a worker kill whose WorkerError never came (or a sample() that never returned) raises and ends the run:
        # a run that gets here had no hang
        "worker_kills": {"kills": w["kills"], "hangs": 0, "max_error_s": w["longest_error_latency_s"],
                         "max_sample_s": w["longest_sample_s"], "torn_rows": w["torn_rows"]},
        "cycles": {"cycles": c["cycles"], "residue": {"dev_shm": residue["shm"], "fds": residue["fds"],
                                                      "threads": residue["threads"],
                                                      "children": residue["children"], "temp_dirs": residue["tmp"]}},
        "learner_kill": {"workers_gone_s": lk["workers_gone_s"], "all_workers_gone": lk["all_workers_gone"],
                         "residue_removed_by_next_collector": lk["residue_after_next_start"] == 0},
        "recipe_sigterm": {"exit_code": st["exit_code"], "exit_s": st["exit_s"], "checkpoint": st["checkpoint_saved"],
                           "residue": st["residue"], "resume_buffer_exact": st["resumed_buffer_equals_checkpoint"]},
    }


def saved_soaks(logs: list[Path]) -> dict:
    """The ``recipe_soak`` and ``ray_soak`` JSON lines that earlier soak runs printed into ``logs``: each from the
    last log that has one. Lines that are not a JSON object are skipped."""
    soak = {}
    for line in (line for log in logs for line in log.read_text().splitlines()):
        try:
            found = json.loads(line)
        except ValueError:
            continue
        if isinstance(found, dict):
            soak.update({k: v for k, v in found.items() if k in ("recipe_soak", "ray_soak")})
    return soak


def soak_results_file(soak: dict, note: str | None = None) -> dict:
    """``--out``'s file from both soaks' JSON object ``soak`` (``recipe_soak`` and ``ray_soak``), as
    ``benchmarks/report.py`` reads it. ``note``: how the soaks ran, if not in one command."""
    def killed_run(result: dict, restarts: str) -> dict:
        runs = [result[name] for name in ("killed", "undisturbed") if name in result]
        left = sum(run["residue"] for run in runs), sum(run["processes_left"] for run in runs)
        k = result["killed"]
        return {"frames": k["frames"], "minutes": k["minutes"], "kills": k["kills"], "restarts": k[restarts],
                "frames_lost": k["frames_lost"], "torn_rows": k["torn_rows_in_buffer"],
                "max_stall_s": k["longest_learner_stall_s"], "final_return": k["final_return"],
                "residue": "none, no process left" if left == (0, 0) else
                           f"{left[0]} temp dirs or /dev/shm blocks, {left[1]} processes left"}

    local, ray = soak["recipe_soak"], soak["ray_soak"]
    quiet = local["undisturbed"]
    return {
        **provenance("faults", local["load_1min_start"], ray["load_1min_end"], note=note),
        "recipe_soak": {"workers": SOAK_PROCESSES, **killed_run(local, "worker_restarts"),
                        "undisturbed_minutes": quiet["minutes"],
                        "undisturbed_max_stall_s": quiet["longest_learner_stall_s"],
                        "undisturbed_final_return": quiet["final_return"]},
        "ray_soak": {"nodes": SOAK_PROCESSES, **killed_run(ray, "node_restarts")},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=None,
                        help="soak: repeat the kill cases until this many minutes are spent")
    for option, default in (("--buffer-kills", 40), ("--worker-kills", 3), ("--cycles", 5)):
        parser.add_argument(option, type=int, default=default)
    parser.add_argument("--worker-kill-minutes", type=float, default=None,
                        help="stop the worker kills after this many minutes even if fewer were done")
    parser.add_argument("--skip-recipe", action="store_true", help="leave out the recipe SIGTERM case")
    parser.add_argument("--soak-minutes", type=float, default=None,
                        help="instead: the SAC recipe with a worker SIGKILLed every 20-40 s, an undisturbed run "
                             "beside it")
    parser.add_argument("--soak-frames", type=int, default=None, help="the soak's total_frames (default: from minutes)")
    parser.add_argument("--ray-soak-minutes", type=float, default=None,
                        help="the recipe on a local Ray cluster, a node actor killed every minute")
    parser.add_argument("--ray-soak-frames", type=int, default=None,
                        help="the Ray soak's total_frames (default: from minutes)")
    parser.add_argument("--soak-json", type=Path, nargs="+", default=None, metavar="LOG",
                        help="instead of running: soak.json (--out) from what earlier soak runs printed (their "
                             "saved output; a later LOG's soak replaces an earlier one's), to rerun one soak alone")
    parser.add_argument("--out", type=Path, default=None,
                        help="also write the docs' figures to this file: faults.json's (results_file), or with "
                             "--soak-minutes and --ray-soak-minutes soak.json's (soak_results_file)")
    args = parser.parse_args()

    def write(figures: dict) -> None:
        args.out.write_text(json.dumps(figures, indent=1) + "\n")

    if args.soak_json:
        soak = saved_soaks(args.soak_json)
        missing = [name for name in ("recipe_soak", "ray_soak") if name not in soak]
        if args.out is None or missing:
            parser.error(f"--soak-json needs --out and a recipe_soak and a ray_soak line in its logs (missing: "
                         f"{', '.join(missing) or 'none'})")
        write(soak_results_file(soak, f"the soaks from {len(args.soak_json)} runs, one after the other"))
        return
    soaks = bool(args.soak_minutes or args.ray_soak_minutes)
    if args.out is not None and soaks and not (args.soak_minutes and args.ray_soak_minutes):
        parser.error("--out with a soak needs both --soak-minutes and --ray-soak-minutes (soak.json holds both)")
    if args.out is not None and not soaks and args.skip_recipe:
        parser.error("--out needs the recipe SIGTERM case (faults.json holds it); drop --skip-recipe")
    results = {}

    def case(name: str, figures: dict) -> None:  # printed as each case ends: a long run may be cut
        results[name] = figures
        print(json.dumps({name: figures}), flush=True)

    if soaks:
        if args.soak_minutes:
            case("recipe_soak", recipe_soak(args.soak_minutes, frames=args.soak_frames))
        if args.ray_soak_minutes:
            case("ray_soak", recipe_soak(args.ray_soak_minutes, frames=args.ray_soak_frames, backend="ray"))
        print(json.dumps(results))
        if args.out is not None:
            write(soak_results_file(results))
        return
    started = time.monotonic()
    results["load_1min_start"] = round(os.getloadavg()[0], 2)
    case("cycles", cycles(args.cycles))
    if args.minutes is None:
        case("buffer_kills", buffer_kills(args.buffer_kills))
        kill_deadline = None if args.worker_kill_minutes is None else time.monotonic() + 60 * args.worker_kill_minutes
        case("worker_kills", worker_kills(args.worker_kills, deadline=kill_deadline))
    else:  # the soak: half the time each
        results["buffer_kills"] = buffer_kills(10**9, deadline=started + 30 * args.minutes)
        case("worker_kills", worker_kills(10**9, deadline=started + 60 * args.minutes))
    results["learner_kill"] = learner_kill()
    if not args.skip_recipe:
        results["recipe_sigterm"] = recipe_sigterm()
    results["seconds"] = round(time.monotonic() - started, 1)
    results["load_1min_end"] = round(os.getloadavg()[0], 2)
    print(json.dumps(results))
    if args.out is not None:
        write(results_file(results))


if __name__ == "__main__":
    main()
