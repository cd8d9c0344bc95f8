"""Faults injected for real: SIGKILLed writers, failing publishes, hostile checkpoints, SIGTERM.

The kill scenarios live in ``benchmarks/faults.py``, which measures them at
length; the tests here run them briefly and assert what must always hold.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

import faults  # noqa: E402
import pytest
import torch
from conftest import FUNCTION_API_ENV, collector_process, learner_side, wait_until  # noqa: E402

from torchrl_unilab import make_replay_buffer  # noqa: E402
from torchrl_unilab._residue import WEIGHTS_PREFIX, left_by, live_processes  # noqa: E402
from torchrl_unilab.modules.normalization import ObservationNormalizer  # noqa: E402


def test_sigkill_inside_extend_never_blocks_sampling_nor_tears_a_row(no_leaks):
    # A full buffer: every write overwrites rows sample() can return.
    result = faults.buffer_kills(12, rows=4000, capacity=10_000, max_delay_s=0.25, seed=1)
    assert result["kills"] == 12
    assert result["kills_mid_write"] >= 1, result  # the faults really landed inside writes
    assert result["longest_sample_s"] < 5.0, result
    assert result["torn_rows"] == 0, result
    assert result["samples"] > 0


def test_lock_is_released_by_the_kernel_when_its_holder_dies(no_leaks):
    rb = make_replay_buffer(100)
    rb.extend(faults.id_rows(0, 10))
    pid = os.fork()
    if pid == 0:  # a child that takes the lock and dies holding it
        rb._write_lock.acquire()  # noqa: SLF001
        os.kill(os.getpid(), signal.SIGKILL)
    os.waitpid(pid, 0)
    sampled = []
    sampler = threading.Thread(target=lambda: sampled.append(rb.sample(4)), daemon=True)
    sampler.start()
    sampler.join(5.0)
    assert len(sampled) == 1, "sample() blocked on a lock its dead holder never released"


def test_lock_waits_are_bounded_with_a_clear_error(no_leaks):
    rb = make_replay_buffer(100, lock_timeout=0.5)
    rb.extend(faults.id_rows(0, 10))
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # a live process that holds the lock and never lets go
        rb._write_lock.acquire()  # noqa: SLF001
        os.write(write, b"x")
        time.sleep(60)
        os._exit(0)
    try:
        os.read(read, 1)
        started = time.monotonic()
        with pytest.raises(TimeoutError, match=rf"lock_timeout.*|held by pid {pid}"):
            rb.sample(4)
        assert time.monotonic() - started < 3.0
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(read)
        os.close(write)


def test_rows_are_invisible_until_completely_written():
    rb = make_replay_buffer(8)
    rb.extend(faults.id_rows(0, 2))
    writer = rb._writer  # noqa: SLF001
    storage = rb.storage
    seen = {}
    original = storage.set

    def observing_set(*args, **kwargs):
        # Inside the copy: what a reader holding the lock right now would see.
        seen.update(len=len(rb), write_count=rb.write_count, cursor=writer._cursor)  # noqa: SLF001
        return original(*args, **kwargs)

    storage.set = observing_set
    rb.extend(faults.id_rows(2, 3))
    assert seen == {"len": 2, "write_count": 2, "cursor": 2}
    assert (len(rb), rb.write_count) == (5, 5)


def test_write_count_is_64_bit_and_the_normalizer_follows_it():
    rb = make_replay_buffer(16)
    rb.extend(faults.id_rows(0, 4))
    start = 2**31 - 2
    rb._writer._write_count = start  # noqa: SLF001 - a run 2**31 rows long, without writing them
    norm = ObservationNormalizer(256)
    norm._buffer_write_count = start  # noqa: SLF001
    rb.extend(faults.id_rows(100, 5))
    assert rb.write_count == start + 5
    assert norm.update_from_buffer(rb) == 5
    assert norm.mean[0].item() == pytest.approx(102.0)  # ids 100..104


def test_normalizer_never_merges_nonfinite_rows():
    rb = make_replay_buffer(16)
    rows = faults.id_rows(1, 6)
    rows.get("observation")[1, 3] = float("nan")
    rows.get("observation")[4, 0] = float("inf")
    rb.extend(rows)
    norm = ObservationNormalizer(256)
    assert norm.update_from_buffer(rb) == 6
    assert norm.count.item() == 4 and norm.nonfinite_rows == 2
    assert bool(torch.isfinite(norm.mean).all() and torch.isfinite(norm.var).all())
    assert norm.mean[0].item() == pytest.approx((1 + 3 + 4 + 6) / 4)  # ids 2 and 5 were left out


def _constant_weights(module: torch.nn.Module, value: float) -> dict:
    return {key: torch.full_like(tensor, value) for key, tensor in module.state_dict().items()}


def _weight_reader(name: str, layout, ready, stop, results) -> None:
    """A worker's side of the weight sync: load every new version, check it is not a mix."""
    from torchrl_unilab.weight_update.weight_sync import SharedWeights

    reader = SharedWeights.attach(name, layout)
    module = _publisher_net()
    ready.set()
    mixed = loads = 0
    error = None
    try:
        while not stop.is_set():
            if reader.load_into(module) is not None:
                loads += 1
                values = torch.cat([t.flatten() for t in module.state_dict().values()])
                mixed += int(not bool((values == values[0]).all()))
            time.sleep(0.0005)
    except Exception as err:  # noqa: BLE001 - reported to the test
        error = f"{type(err).__name__}: {err}"
    results.put({"loads": loads, "mixed": mixed, "error": error,
                 "last": float(next(iter(module.state_dict().values())).flatten()[0])})
    reader.close()


def _publisher_net() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Linear(256, 256), torch.nn.Linear(256, 8))


def test_failing_publishes_leave_weights_consistent_and_readers_alive(no_leaks):
    from torchrl_unilab.weight_update.weight_sync import SharedWeights, layout_of

    net = _publisher_net()
    weights = SharedWeights.create(_constant_weights(net, 0.0))
    ready, stop, results = faults.CTX.Event(), faults.CTX.Event(), faults.CTX.Queue()
    reader = faults.CTX.Process(target=_weight_reader, args=(weights.name, layout_of(net), ready, stop, results),
                                daemon=True)
    reader.start()
    try:
        assert ready.wait(120), "the reader process did not start"
        good = _constant_weights(net, 1.0)
        with pytest.raises(TypeError, match="'2.bias' must be a torch.Tensor"):
            weights.publish({**good, "2.bias": [0.0] * 8})
        with pytest.raises(ValueError, match=r"'2.bias' has shape \(9,\)"):
            weights.publish({**good, "2.bias": torch.ones(9)})
        with pytest.raises(NotImplementedError):  # copying from the meta device fails for real
            weights.publish({**good, "2.weight": torch.empty(8, 256, device="meta")})
        assert weights.version == 1 and weights._header[0] % 2 == 0  # noqa: SLF001

        # Ctrl-C at random moments while publishing, the handler raising KeyboardInterrupt.
        armed = {"on": False}

        def on_sigint(signum, frame):
            if armed["on"]:
                raise KeyboardInterrupt

        previous = signal.signal(signal.SIGINT, on_sigint)
        storm_stop = threading.Event()

        def storm():
            while not storm_stop.is_set():
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.0003)

        sender = threading.Thread(target=storm, daemon=True)
        interrupted = 0
        sender.start()
        try:
            deadline = time.monotonic() + 2.0
            value = 2.0
            while time.monotonic() < deadline:
                try:
                    try:
                        armed["on"] = True
                        weights.publish(_constant_weights(net, value))
                    finally:
                        armed["on"] = False
                except KeyboardInterrupt:
                    interrupted += 1
                value += 1.0
        finally:
            storm_stop.set()
            sender.join()
            signal.signal(signal.SIGINT, previous)
        # A publish interrupted inside its copy completes it first: the version still advances.
        assert interrupted > 0 and weights.version > 1
        assert torch.is_grad_enabled(), "an interrupted publish left the caller's thread with gradients off"
        assert weights._header[0] % 2 == 0  # noqa: SLF001
        assert weights.publish(_constant_weights(net, 12345.0)) == weights.version
        time.sleep(0.5)  # the reader polls every 0.5 ms
    finally:
        stop.set()
        report = results.get(timeout=60)
        reader.join(10)
        weights.close()
    assert report["error"] is None, report
    assert report["mixed"] == 0 and report["loads"] >= 2, report
    assert report["last"] == 12345.0


class _PlantedPickle:
    """Unpickling this creates ``marker``: proof that loading ran code from the checkpoint."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _saved_run(tmp_path, rows: int = 5):
    from torchrl_unilab.trainers.checkpoint import Checkpointer

    net = torch.nn.Linear(3, 2)
    rb = make_replay_buffer(16)
    rb.extend(faults.id_rows(0, rows))
    ckpt = Checkpointer(tmp_path / "checkpoint", modules={"net": net})
    ckpt.save(rb, counters={"frames": rows})
    return net, rb, ckpt


@pytest.mark.parametrize("where", ["replay_buffer/prefetch.pkl", "replay_buffer/storage/extra.pickle",
                                   "replay_buffer/transform.t"])
def test_checkpoint_load_reads_no_pickle(tmp_path, where, no_leaks):
    import pickle

    from torchrl_unilab.trainers.checkpoint import Checkpointer

    net, _, _ = _saved_run(tmp_path)
    marker = tmp_path / "pwned"
    with open(tmp_path / "checkpoint" / where, "wb") as file:
        pickle.dump(_PlantedPickle(str(marker)), file)
    fresh = make_replay_buffer(16)
    with pytest.raises(ValueError, match="is a pickle file"):
        Checkpointer(tmp_path / "checkpoint", modules={"net": net}).load(fresh)
    assert not marker.exists()
    assert len(fresh) == 0


@pytest.mark.parametrize("fail_at", ["tmp_to_dir", "dir_to_old"])
def test_checkpoint_survives_an_interrupted_swap(tmp_path, monkeypatch, fail_at, no_leaks):
    import pathlib

    from torchrl_unilab.trainers.checkpoint import Checkpointer

    net, rb, ckpt = _saved_run(tmp_path, rows=5)
    rb.extend(faults.id_rows(5, 3))
    real_rename = pathlib.Path.rename

    def interrupted_rename(self, target):
        if (fail_at == "tmp_to_dir" and self.name.endswith(".tmp")) or (
                fail_at == "dir_to_old" and str(target).endswith(".old")):
            raise KeyboardInterrupt  # the process dies here
        return real_rename(self, target)

    monkeypatch.setattr(pathlib.Path, "rename", interrupted_rename)
    with pytest.raises(KeyboardInterrupt):
        ckpt.save(rb, counters={"frames": 8})
    monkeypatch.setattr(pathlib.Path, "rename", real_rename)
    expected = 8 if fail_at == "tmp_to_dir" else 5  # the new checkpoint is complete in .tmp; or the old one stays
    restored = make_replay_buffer(16)
    counters = Checkpointer(tmp_path / "checkpoint", modules={"net": net}).load(restored)
    assert counters["frames"] == expected and len(restored) == expected
    assert torch.equal(restored[:]["row_id"], torch.arange(expected))
    # The next save after a crash keeps working and never loses the only complete copy.
    Checkpointer(tmp_path / "checkpoint", modules={"net": net}).save(restored, counters={"frames": expected})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint"]


def _session_pids(sid: int) -> set[int]:
    return live_processes(session=sid)


def _residue_of(pid: int) -> dict:
    return {**left_by(pid), "processes": sorted(_session_pids(pid))}


def test_sigterm_saves_a_checkpoint_leaves_no_residue_and_the_run_resumes(tmp_path, no_leaks):
    from test_recipes import check_run, run_recipe, running_sac, saved_counters

    from torchrl_unilab.trainers.checkpoint import Checkpointer

    run_dir = tmp_path / "run"
    with running_sac(tmp_path, run_dir) as proc:
        proc.send_signal(signal.SIGTERM)  # the learner only, as `timeout` and `docker stop` do
        sent = time.monotonic()
        out, _ = proc.communicate(timeout=60)
        took = time.monotonic() - sent
    assert proc.returncode == 0, out
    assert took < 15.0, f"exited {took:.1f}s after SIGTERM"
    assert "Interrupted: checkpoint saved" in out, out
    assert faults.wait_gone_all(lambda: _residue_of(proc.pid)["processes"], 5.0)
    assert _residue_of(proc.pid) == {"tmp": [], "shm": [], "processes": []}
    stopped = saved_counters(run_dir)
    assert 256 < stopped["frames"] < 100_000 and stopped["updates"] > 0

    # The checkpoint holds the buffer as it was; resume= continues from it.
    saved = make_replay_buffer(20_000)
    Checkpointer(run_dir / "checkpoint", modules={}).load(saved)
    assert len(saved) == stopped["frames"]
    total = stopped["frames"] + 192
    summary = run_recipe("sac", run_dir, f"resume={run_dir}", f"collector.total_frames={total}")
    check_run(run_dir, summary, frames=total, updates=total - 256)


def test_startup_sweeps_what_a_killed_process_left(no_leaks):
    import tempfile

    from torchrl_unilab.weight_update.weight_sync import SharedWeights

    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # creates a buffer and a weight block, then is SIGKILLed: no cleanup runs
        rb = make_replay_buffer(10)
        rb.extend(faults.id_rows(0, 2))
        weights = SharedWeights.create(torch.nn.Linear(2, 2))
        os.write(write, weights.name.encode())
        time.sleep(60)
        os._exit(0)
    try:
        name = os.read(read, 100).decode()
        assert name.startswith(f"{WEIGHTS_PREFIX}{pid}_")
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(read)
        os.close(write)
    stale = _residue_of(pid)
    assert len(stale["tmp"]) == 1 and stale["shm"] == [name]
    rb = make_replay_buffer(10)
    weights = SharedWeights.create(torch.nn.Linear(2, 2))
    weights.close()
    assert _residue_of(pid) == {"tmp": [], "shm": [], "processes": []}
    assert os.path.isdir(os.path.join(tempfile.gettempdir(), os.path.basename(rb._torchrl_unilab_owned_dir)))  # noqa: SLF001


def test_a_zombies_weight_block_is_swept_before_its_parent_reaps_it(no_leaks):
    """An exited process not yet reaped (Ray's ray.kill can leave a node actor so) owns nothing any more: the sweep
    removes its block then, not only once its parent has waited for it."""
    from torchrl_unilab._residue import pid_alive, running
    from torchrl_unilab.weight_update.weight_sync import SharedWeights, sweep_stale_blocks

    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # creates a weight block and exits at once: no cleanup runs
        weights = SharedWeights.create(torch.nn.Linear(2, 2))
        os.write(write, weights.name.encode())
        os._exit(0)
    try:
        name = os.read(read, 100).decode()
        assert wait_until(lambda: not running(pid), timeout=10) and pid_alive(pid), "the child is not a zombie"
        sweep_stale_blocks()  # (a sweep beside this one, in another test run, may come first)
        assert not os.path.exists(f"/dev/shm/{name}")
    finally:
        os.waitpid(pid, 0)
        os.close(read)
        os.close(write)


def test_function_level_crash_mid_run_with_a_full_queue_keeps_its_traceback(no_leaks):
    from torchrl_unilab import WorkerError
    from torchrl_unilab.worker import make_pack_slots

    requests, packed, full = faults.CTX.Queue(), faults.CTX.Queue(), faults.CTX.Queue(maxsize=4)
    with learner_side(5000) as (rb, actor, weights), \
            collector_process(rb, actor, weights, metrics_queue=full, collector_pack_request_queue=requests,
                              collector_pack_ready_queue=packed,
                              collector_pack_shared_slots=make_pack_slots(rb, batch_size=16)) as proc:
        deadline = time.monotonic() + 180  # a first start can take a minute on a loaded 2-core machine
        while rb.write_count < 200 and time.monotonic() < deadline:
            proc.raise_if_failed()
            time.sleep(0.05)  # nobody reads the metrics queue: it is full
        # The worker drops the oldest message to put each new one: full() is False for a moment in between (CI).
        assert rb.write_count >= 200 and wait_until(full.full, timeout=10)
        requests.put({"batch_size": 7, "seed": 0})  # the slots hold 16 rows: the collector raises mid-run
        proc.process.join(60)
        assert proc.process.exitcode not in (None, 0)
        with pytest.raises(WorkerError) as info:
            proc.raise_if_failed()
        assert "pack request for 7 rows, but the slots hold 16" in str(info.value)
        assert "Traceback" in info.value.worker_traceback and "_Packer" in info.value.worker_traceback or \
            "in pack" in info.value.worker_traceback


def test_function_level_collectors_sharing_a_buffer_never_collide(no_leaks):
    from torchrl_unilab.worker import MAX_COLLECTORS

    with learner_side(20_000) as (rb, actor, weights):
        common = dict(num_envs=4, seed=0)  # the same seed on purpose
        with collector_process(rb, actor, weights, **common) as first, \
                collector_process(rb, actor, weights, **common) as second:
            deadline = time.monotonic() + 180  # two first starts on a loaded 2-core machine

            def both_wrote() -> bool:
                traj = rb[: len(rb)].get(("collector", "traj_ids")).reshape(-1) if len(rb) else torch.zeros(0)
                return rb.write_count >= 2000 and set((traj % MAX_COLLECTORS).tolist()) >= {0, 1}

            while not both_wrote() and time.monotonic() < deadline:
                first.metrics(), second.metrics()
                time.sleep(0.1)
        rows = rb[: len(rb)]
        traj = rows.get(("collector", "traj_ids")).reshape(-1)
        step = rows.get("step_count").reshape(-1)
        starts = traj[step == 0]
        assert set((traj % MAX_COLLECTORS).tolist()) == {0, 1}  # each collector took its own index
        assert len(starts) >= 8 and starts.unique().numel() == starts.numel(), "a trajectory id was used twice"
        # Env 0's first trajectory is id 0 in collector 0 and id 1 in collector 1: their first observations.
        first_obs = {index: rows.get("observation")[(traj == index) & (step == 0)][0] for index in (0, 1)}
        assert not torch.equal(first_obs[0], first_obs[1]), "both collectors were seeded alike"


def test_collector_index_is_validated():
    from torchrl_unilab import layout_of
    from torchrl_unilab.worker import off_policy_collector_fn

    with learner_side(100) as (rb, actor, weights):
        with pytest.raises(ValueError, match=r"collector_index must be an int in \[0, 2\)"):
            off_policy_collector_fn(None, FUNCTION_API_ENV, 2, rb, weights.name, layout_of(actor), collector_index=2,
                                    num_collectors=2)
        with pytest.raises(ValueError, match="num_collectors must be an int >= 1"):
            off_policy_collector_fn(None, FUNCTION_API_ENV, 2, rb, weights.name, layout_of(actor), num_collectors=0)


def _claim_write_and_count_until_killed_at(control, committed, kill_at: int) -> None:
    """A worker's batch (claim, pending record, buffer write, count) that SIGKILLs itself at the ``kill_at``-th
    line it runs in the frame accounting or its lock."""
    from torchrl_unilab import _sync
    from torchrl_unilab.collectors import _control

    files, lines = {_control.__file__, _sync.__file__}, [0]

    def tracer(frame, event, arg):
        if frame.f_code.co_filename not in files:
            return None
        if event == "line":
            lines[0] += 1
            if lines[0] == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
        return tracer

    sys.settrace(tracer)
    assert control.claim(64, worker_idx=0)
    control.writing_(0, (7, 0), random_frames=64)
    committed[0] = 1  # the buffer's extend() has returned: the rows are in
    control.written_(64, worker_idx=0, random_frames=64)
    sys.settrace(None)


def test_a_worker_killed_at_any_line_of_its_frame_accounting_leaves_the_counts_exact(no_leaks):
    """SIGKILL before each line a worker runs to claim, record and count a batch: the parent settles exactly.

    Counters changed in place lost to such kills: a batch counted twice (CI: 2112 frames counted for 2048
    rows) or a claim never handed back (``total_frames`` never reached).
    """
    from torchrl_unilab.collectors._control import FrameControl

    failures, kill_at = [], 0
    while True:
        kill_at += 1
        control = FrameControl([64, 0], frames_per_batch=64, total_frames=192)
        control.allow(192)
        committed = torch.zeros(1, dtype=torch.int64).share_memory_()
        pid = faults.fork_call(_claim_write_and_count_until_killed_at, control, committed, kill_at)
        _, status = os.waitpid(pid, 0)
        if not os.WIFSIGNALED(status):
            break  # the batch ran to its end: every line has been a kill point
        rows = 64 * int(committed[0])
        lost, owed = control.settle(0, random_share=64, in_buffer=lambda traj, step: bool(committed[0]))
        # Worker 1 then claims all that is left but the batch reserved for worker 0's replacement.
        while control.claim(64, worker_idx=1):
            control.written_(64, worker_idx=1)
        got = (control.written - control.worker_written(1), control.random_written(0), owed, control.claimed)
        if got != (rows, rows, 64 - rows, control.written) or control.written != 192 - (64 - rows):
            failures.append((kill_at, got, rows, lost))
    assert kill_at > 20, f"only {kill_at - 1} kill points: the tracer did not reach the frame accounting"
    assert failures == []


def _hold_frame_lock_then_sleep(control, stop, holding) -> None:
    control._lock.acquire()  # noqa: SLF001 - the worker side of claim(), frozen inside it
    holding.set()
    while True:
        stop.is_set()  # what a worker polls every step
        time.sleep(0.001)


def test_a_worker_killed_holding_the_frame_lock_or_polling_stop_blocks_nobody(no_leaks):
    """SIGKILL a process inside FrameControl's lock and inside stop.is_set(): the parent's calls still return.

    With multiprocessing's Lock and Event the dead process kept their semaphores
    and the collector's shutdown hung in ``stop_event.set()`` (benchmarks/faults.py).
    """
    from torchrl_unilab._sync import StopFlag
    from torchrl_unilab.collectors._control import FrameControl

    control, stop, holding = FrameControl(), StopFlag(), StopFlag()
    child = faults.CTX.Process(target=_hold_frame_lock_then_sleep, args=(control, stop, holding))
    child.start()
    try:
        assert holding.wait(120), "the child did not take the lock"
        os.kill(child.pid, signal.SIGKILL)
        child.join(10)
        done = threading.Event()

        def parent_side() -> None:
            control.allow(64)
            control.freeze()
            stop.set()
            done.set()

        caller = threading.Thread(target=parent_side, daemon=True)
        caller.start()
        assert done.wait(5), "the parent blocked on a lock the killed process held"
        assert stop.is_set() and control.claim(0)
    finally:
        if child.is_alive():
            child.kill()
            child.join(5)
