"""Faults survived: real SIGKILLs and SIGTERMs against the buffer, the collector and the recipe.

Each case injects its fault for real and measures what the issue asks for:

* ``buffer_kills``: a writer process extends the shared buffer with large
  batches whose every column holds the row's id; it is SIGKILLed at a random
  moment, again and again, while the learner samples all the time. Reported:
  the kills that landed inside a write, the longest ``sample()`` call, and the
  torn rows seen (a row whose columns disagree).
* ``worker_kills``: an ``OffPolicyCollector`` worker is SIGKILLed at a random
  moment while the learner samples; the longest time until the learner got
  the ``WorkerError``, the longest ``sample()`` call, torn rows.
* ``cycles``: create / collect / shutdown cycles; residue afterwards
  (``/dev/shm`` entries, file descriptors, threads, child processes, temp dirs).
* ``learner_kill``: the learner is SIGKILLed during collection; time until all
  its workers are gone, and the residue once the next collector starts.
* ``recipe_sigterm``: ``recipes/sac.py`` gets SIGTERM; exit time, checkpoint,
  residue, and whether ``resume=`` restores the buffer exactly.

Run ``python benchmarks/faults.py`` (CI variant, about 2 minutes) or
``python benchmarks/faults.py --minutes 60`` for a soak (the kill cases repeat
until the time is spent). The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch
from tensordict import TensorDict

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from torchrl_unilab import make_replay_buffer  # noqa: E402

CTX = mp.get_context("spawn")
#: Columns of an id-stamped row: (key, per-row shape, dtype).
ID_COLUMNS = (
    ("observation", (256,), torch.float32),
    ("action", (32,), torch.float64),
    (("next", "observation"), (256,), torch.float32),
    ("row_id", (), torch.int64),
)


def id_rows(first: int, count: int) -> TensorDict:
    """``count`` rows whose every column holds the row's id (``first``, ``first + 1``, ... modulo 2**22).

    Ids stay below 2**24, the largest range float32 columns hold exactly.
    """
    ids = torch.arange(first, first + count, dtype=torch.int64) % 2**22
    out = TensorDict(batch_size=[count])
    for key, shape, dtype in ID_COLUMNS:
        out.set(key, ids.to(dtype).reshape(count, *[1] * len(shape)).expand(count, *shape).clone())
    return out


def torn_rows(batch: TensorDict) -> int:
    """Rows of ``batch`` whose columns do not all hold the same id."""
    ids = batch.get("row_id").to(torch.float64)
    bad = torch.zeros(len(ids), dtype=torch.bool)
    for key, shape, _ in ID_COLUMNS:
        values = batch.get(key).to(torch.float64).reshape(len(ids), -1)
        bad |= (values != ids[:, None]).any(-1)
    return int(bad.sum())


def id_writer(replay_buffer, first: int, rows: int) -> None:
    """Extends ``replay_buffer`` with id-stamped batches of ``rows`` until killed."""
    while True:
        replay_buffer.extend(id_rows(first, rows))
        first += rows


def _forker_main(replay_buffer, rows: int, commands) -> None:
    # A spawned process forks the writers: a fork starts in milliseconds where a
    # spawn re-imports torch (seconds), and this process has no other threads to
    # break by forking. Killed children are reaped by the kernel (SIGCHLD ignored).
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    while True:
        first = commands.recv()
        if first is None:
            return
        pid = os.fork()
        if pid == 0:
            try:
                id_writer(replay_buffer, first, rows)
            finally:
                os._exit(1)
        commands.send(pid)


class WriterForker:
    """Starts id-writing processes on request (forked from one spawned helper), to be SIGKILLed."""

    def __init__(self, replay_buffer, rows: int) -> None:
        self._commands, child_end = CTX.Pipe()
        self.process = CTX.Process(target=_forker_main, args=(replay_buffer, rows, child_end), daemon=True)
        self.process.start()
        child_end.close()

    def start_writer(self, first_id: int) -> int:
        """Starts a writer whose rows have ids from ``first_id``; returns its pid."""
        self._commands.send(first_id)
        if not self._commands.poll(120):
            raise RuntimeError("the writer forker did not answer within 120 s")
        return self._commands.recv()

    def close(self) -> None:
        self._commands.send(None)
        self.process.join(10)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(5)
        self._commands.close()

    def __enter__(self) -> WriterForker:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def wait_gone(pid: int, timeout: float) -> bool:
    """Waits until no process ``pid`` exists (the forker reaps its children at once)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.001)
    return False


def wait_gone_all(pids_now, timeout: float) -> bool:
    """Waits until ``pids_now()`` returns nothing; True if it did within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while pids_now():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


class TimedSampler:
    """Samples ``replay_buffer`` in a thread, all the time; records the longest call and torn rows."""

    def __init__(self, replay_buffer, batch_size: int = 256) -> None:
        self.rb, self.batch_size = replay_buffer, batch_size
        self.longest_s = 0.0
        self.samples = 0
        self.torn = 0
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
        except BaseException as err:  # noqa: BLE001 - reported by stop()
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


def buffer_kills(kills: int, *, rows: int = 4000, capacity: int = 10_000, max_delay_s: float = 0.25,
                 seed: int = 0, deadline: float | None = None) -> dict:
    """SIGKILLs id-writing processes at random moments while this process samples all the time.

    The buffer is full from the start, so every write overwrites rows that
    ``sample()`` can return. Returns the figures (see the module docstring).
    """
    rng = random.Random(seed)
    rb = make_replay_buffer(capacity)
    rb.extend(id_rows(0, capacity))
    counters = getattr(rb._writer, "counters", None)  # noqa: SLF001 - absent from TorchRL's own writer
    mid_write = done = 0
    with TimedSampler(rb) as sampler, WriterForker(rb, rows) as forker:
        next_id = capacity
        while done < kills and (deadline is None or time.monotonic() < deadline):
            pid = forker.start_writer(next_id)
            time.sleep(rng.uniform(0.0, max_delay_s))
            os.kill(pid, signal.SIGKILL)
            if not wait_gone(pid, 10):
                raise RuntimeError(f"writer {pid} survived SIGKILL for 10 s")
            # The mark a dead writer leaves: it died between marking its rows and committing them.
            mid_write += counters is not None and counters[6] > 0
            next_id += 1_000_000
            done += 1
            if sampler.blocked_s() > 5.0:
                break
        time.sleep(0.2)  # let the sampler run past the last kill
    return {"kills": done, "kills_mid_write": int(mid_write), "samples": sampler.samples,
            "longest_sample_s": round(sampler.longest_s, 4), "torn_rows": sampler.torn}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=None, help="soak: repeat the kill cases this long")
    parser.add_argument("--buffer-kills", type=int, default=100)
    args = parser.parse_args()
    load = os.getloadavg()[0]
    started = time.monotonic()
    deadline = None if args.minutes is None else started + 60 * args.minutes
    results = {"load_1min": round(load, 2)}
    results["buffer_kills"] = buffer_kills(10**9 if deadline else args.buffer_kills, deadline=deadline)
    results["seconds"] = round(time.monotonic() - started, 1)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
