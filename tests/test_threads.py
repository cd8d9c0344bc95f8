"""The learner's torch threads (``optim.num_threads``): a fixed count, and ``auto`` following a real collector."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import torch
from conftest import linear_policy, wait_until

from torchrl_unilab import OffPolicyCollector, make_replay_buffer
from torchrl_unilab.trainers.threads import LearnerThreads


@pytest.fixture(autouse=True)
def restore_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


class Readings:
    """Busy seconds the test scripts, on a clock the test moves."""

    def __init__(self) -> None:
        self.now, self.busy = 0.0, 0.0

    def metrics(self) -> dict:
        return {"time": {"env_step": self.busy * 0.7, "policy": self.busy * 0.3, "wait": 1e6}}

    def advance(self, seconds: float, cores_used: float) -> None:
        self.now += seconds
        self.busy += seconds * cores_used


@pytest.mark.parametrize("setting", [0, -1, "2", "all", 1.5, True, None])
def test_a_bad_setting_names_the_key_and_the_accepted_values(setting):
    with pytest.raises(ValueError, match=r"optim.num_threads must be a thread count >= 1 or 'auto', got"):
        LearnerThreads(setting)


def test_a_fixed_count_is_set_once_and_kept():
    threads = LearnerThreads(2, cores=4)
    assert torch.get_num_threads() == 2
    torch.set_num_threads(1)  # step() does not undo what the user sets meanwhile
    assert threads.step() == 2 and torch.get_num_threads() == 1 and threads.changes == 0


def test_auto_moves_one_thread_at_a_time_with_hysteresis():
    r = Readings()
    threads = LearnerThreads("auto", r.metrics, cores=4, interval_s=5.0, clock=lambda: r.now, read_cpu=None)
    assert threads.step() == 1  # first reading
    r.advance(2.0, 0.0)
    assert threads.step() == 1  # within the interval: nothing read
    seen = []
    for _ in range(4):  # workers idle at the cap: up by one per interval, to every core
        r.advance(5.0, 0.1)
        seen.append(threads.step())
    assert seen == [2, 3, 4, 4] and torch.get_num_threads() == 4
    assert threads.collection_cores == pytest.approx(0.1)
    r.advance(5.0, 0.4)  # free 3.6 >= 4 - 0.5: kept
    assert threads.step() == 4
    r.advance(5.0, 0.6)  # free 3.4 < 3.5: one back
    assert threads.step() == 3
    r.advance(5.0, 0.6)  # free 3.4: neither up (needs >= 3.75) nor down (< 2.5): no flipping
    assert threads.step() == 3
    r.advance(5.0, 3.0)  # collection takes three cores: down to one, one step per interval
    assert [threads.step(), (r.advance(5.0, 3.0), threads.step())[1]] == [2, 1]
    r.advance(5.0, 4.0)
    assert threads.step() == 1 and threads.changes == 6 and torch.get_num_threads() == 1


def test_auto_leaves_the_cores_other_processes_take():
    r, cpu = Readings(), {"machine": 0.0, "own": 0.0}

    def advance(seconds: float, collection: float, learner: float, others: float) -> None:
        r.advance(seconds, collection)
        cpu["own"] += seconds * learner
        cpu["machine"] += seconds * (collection + learner + others)

    threads = LearnerThreads("auto", r.metrics, cores=2, interval_s=5.0, clock=lambda: r.now,
                             read_cpu=lambda: (cpu["machine"], cpu["own"]))
    threads.step()
    advance(5.0, 0.05, 1.0, 0.0)  # alone, workers at the cap: the second core
    assert threads.step() == 2 and threads.other_cores == pytest.approx(0.05)
    advance(5.0, 0.05, 1.0, 0.95)  # a second training takes a core: it is given back
    assert threads.step() == 1 and threads.other_cores == pytest.approx(1.0)
    advance(5.0, 0.05, 1.0, 0.95)  # free 1.0 < 1.75: not taken again while the other job runs
    assert threads.step() == 1 and threads.collection_cores == pytest.approx(0.05)
    advance(5.0, 0.05, 1.0, 0.0)
    assert threads.step() == 2 and threads.changes == 3
    # A process that cannot read /proc/stat counts collection only.
    fallback = LearnerThreads("auto", r.metrics, cores=2, interval_s=5.0, clock=lambda: r.now, read_cpu=lambda: None)
    fallback.step()
    advance(5.0, 0.05, 1.0, 0.95)
    assert fallback.step() == 2 and fallback.other_cores != fallback.other_cores  # nan


def test_auto_without_readings_stays_at_one_thread():
    threads = LearnerThreads("auto", lambda: None, cores=4, interval_s=0.0)
    assert [threads.step() for _ in range(3)] == [1, 1, 1] and torch.get_num_threads() == 1
    assert LearnerThreads("auto", cores=4).step() == 1


def test_auto_follows_a_real_collector_waiting_at_its_cap_then_running_free(no_leaks):
    rb = make_replay_buffer(100_000)
    with OffPolicyCollector("Pendulum-v1", linear_policy(3, 1), num_workers=1, num_envs=4, frames_per_batch=64,
                            total_frames=-1, replay_buffer=rb) as collector:
        collector.allow_frames(256)
        assert collector.wait_for_frames(256, timeout=120)
        # the collector's signal alone: the machine's would depend on what else runs beside the test
        threads = LearnerThreads("auto", collector.metrics, cores=2, interval_s=1.0, read_cpu=None)
        threads.step()
        time.sleep(1.2)  # the worker waits at the cap: collection uses no core
        assert threads.step() == 2, threads.collection_cores
        assert threads.collection_cores < 0.25
        collector.allow_frames(10**9)  # the worker now steps as fast as it can: a core of its own
        written = collector.frames_written
        assert wait_until(lambda: collector.frames_written > written + 256, timeout=60)
        threads.step()
        time.sleep(1.5)
        assert threads.step() == 1, threads.collection_cores
        assert threads.collection_cores > 0.5


def test_auto_leaves_a_core_that_another_process_takes_beside_a_real_collector(no_leaks):
    burner = subprocess.Popen([sys.executable, "-c", "while True: pass"])  # another job, a core of its own
    try:
        rb = make_replay_buffer(100_000)
        with OffPolicyCollector("Pendulum-v1", linear_policy(3, 1), num_workers=1, num_envs=4, frames_per_batch=64,
                                total_frames=-1, replay_buffer=rb) as collector:
            collector.allow_frames(256)
            assert collector.wait_for_frames(256, timeout=120)  # then the worker waits at the cap
            machine = LearnerThreads("auto", collector.metrics, cores=2, interval_s=1.0)
            only_collection = LearnerThreads("auto", collector.metrics, cores=2, interval_s=1.0, read_cpu=None)
            seen = []
            for _ in range(3):
                machine.step(), only_collection.step()
                time.sleep(1.2)
                seen.append((machine.step(), only_collection.step(), machine.other_cores))
            # Without the machine's signal the idle worker leaves a core free; the burner takes it.
            assert [c for _, c, _ in seen] == [2, 2, 2], seen
            assert [m for m, _, _ in seen] == [1, 1, 1] and all(other > 0.7 for *_, other in seen), seen
    finally:
        burner.kill()
        burner.wait()


_DENORMALS_IN_EVERY_THREAD = """
import sys
import torch
if sys.argv[1] == "pool-first":
    torch.set_num_threads(2)
    (torch.randn(1_000_000) * 2).sum()  # starts the intra-op threads before the flag
from torchrl_unilab.trainers.threads import flush_denormals
print(flush_denormals(sys.argv[1] != "disabled"))
"""


@pytest.mark.parametrize("order, flushed", [("first", True), ("pool-first", False), ("disabled", False)])
def test_flush_denormals_reaches_every_thread_only_when_called_first(order, flushed):
    # a fresh interpreter each: the flag and the thread pool are per process
    out = subprocess.run([sys.executable, "-c", _DENORMALS_IN_EVERY_THREAD, order], capture_output=True, text=True,
                         timeout=120, check=True, env={**os.environ, "OMP_NUM_THREADS": "2"})
    assert out.stdout.split()[-1] == str(flushed)

