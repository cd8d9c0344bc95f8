"""Shared fixtures: real MuJoCo envs, real worker processes, and leak checks."""

from __future__ import annotations

import gc
import logging
import multiprocessing as mp
import os
import shutil
import tempfile
import time

import pytest
import torch
from tensordict.nn import TensorDictModule
from torchrl.envs import Transform

from torchrl_unilab._residue import live_processes, multiprocessing_helpers


def child_pids() -> set[int]:
    """PIDs of live (non-zombie) processes whose parent is this process."""
    return live_processes(parent=os.getpid())


def shm_entries() -> set[str]:
    """/dev/shm entries this test run could have created.

    Under CI nothing else runs beside the suite, so every entry counts (named
    semaphores of multiprocessing locks included). On a shared development
    machine only the shared-memory blocks tagged with this process's pid do.
    """
    entries = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    if os.environ.get("CI"):
        return entries
    return {e for e in entries if e.startswith(f"tul_w_{os.getpid()}_")}


def tmp_entries() -> set[str]:
    prefix = "torchrl_unilab" if os.environ.get("CI") else f"torchrl_unilab_rb_{os.getpid()}_"
    return {e for e in os.listdir(tempfile.gettempdir()) if e.startswith(prefix)}


def wait_until(predicate, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def let_worker_write(collector, idx: int, beyond: int, cap_limit: int) -> bool:
    """Raises the frame cap one batch at a time until worker ``idx`` has written more than ``beyond`` frames.

    The other worker takes at most a batch per step, so ``idx`` gets frames however late it starts.
    """
    control, deadline = collector._control, time.monotonic() + 180  # noqa: SLF001
    while control.worker_written(idx) <= beyond and time.monotonic() < deadline:
        if collector.wait_for_frames(control.allowed, timeout=1.0):
            if control.allowed >= cap_limit:
                break
            time.sleep(0.5)
            collector.allow_frames(min(control.allowed + collector.frames_per_batch, cap_limit))
    return control.worker_written(idx) > beyond


def start_after_waits_that_could_never_end(collector, total_frames: int, timeout: float) -> None:
    """The pacing contract the local and the Ray collector share: a wait that could never end raises at once
    (beyond ``total_frames``, or before anything collects in the background); after ``start()`` a wait for
    ``total_frames`` returns."""
    with pytest.raises(ValueError, match=f"total_frames is {total_frames}"):
        collector.wait_for_frames(total_frames + 1)
    with pytest.raises(ValueError, match=r"call start\(\) or allow_frames\(\) first"):
        collector.wait_for_frames(collector.frames_per_batch)
    collector.start()
    assert collector.wait_for_frames(total_frames, timeout=timeout)


def linear_policy(obs_dim: int, action_dim: int, seed: int = 0) -> TensorDictModule:
    """A deterministic tanh-linear policy: actions are a pure function of the weights."""
    torch.manual_seed(seed)
    net = torch.nn.Sequential(torch.nn.Linear(obs_dim, action_dim), torch.nn.Tanh())
    return TensorDictModule(net, in_keys=["observation"], out_keys=["action"])


class RaiseAfter(Transform):
    """Raises ``RuntimeError(message)`` from the env's step once ``steps`` steps are done: a real fault in a worker.

    With ``marker`` (a file path) it raises once only, in the first process that gets there.
    """

    def __init__(self, steps: int, message: str, marker: str | None = None) -> None:
        super().__init__()
        self.steps, self.message, self.marker = steps, message, marker

    def _step(self, tensordict, next_tensordict):
        self.steps -= 1
        if self.steps < 0 and not (self.marker and os.path.exists(self.marker)):
            if self.marker:
                open(self.marker, "w").close()
            raise RuntimeError(self.message)
        return next_tensordict


@pytest.fixture(scope="session", autouse=True)
def ray_temp_dir():
    """Ray's session logs go to a temp dir of this run's own, removed at its end.

    Ray keeps every session's logs under ``$RAY_TMPDIR/ray`` by design (0.2-0.7
    MB a session; the Ray tests and the Ray docs example start two). The path
    stays short: Ray's AF_UNIX sockets live under it, and their paths stop at
    107 bytes.
    """
    path = tempfile.mkdtemp(prefix="tul_ray_", dir="/tmp")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RAY_TMPDIR", path)
        yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(autouse=True)
def torch_state():
    """Seeds torch for each test, and fails a test that leaves the thread's autograd mode switched.

    Seeding keeps a test's random initialisation from depending on which
    tests ran before it; a leaked ``no_grad`` breaks every later backward. The
    recipes flush denormals on the main thread (``optim.flush_denormal``): each
    test starts with torch's default again.
    """
    torch.manual_seed(0)
    before = torch.is_grad_enabled()
    yield
    torch.set_flush_denormal(False)
    after = torch.is_grad_enabled()
    torch.set_grad_enabled(before)
    assert after == before, f"the test left torch.is_grad_enabled() == {after}"


@pytest.fixture
def unilab_log():
    """The records of the collector's logger (a child of TorchRL's, which does not propagate to the root)."""
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger("torchrl.unilab")
    logger.addHandler(handler)
    yield records
    logger.removeHandler(handler)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    """Keeps each phase's report on the test item, so that a fixture's teardown knows whether the test failed."""
    report = yield
    setattr(item, f"report_{report.when}", report)
    return report


def remove_temp_dirs(names: set[str]) -> None:
    for name in names:
        shutil.rmtree(os.path.join(tempfile.gettempdir(), name), ignore_errors=True)


@pytest.fixture
def no_leaks(request):
    """Asserts the test leaves no child process, /dev/shm entry or temp dir behind.

    A test that failed still holds its buffers in the traceback pytest keeps, so their temp dirs outlive it: they
    are removed here, and reported only for a test that passed.
    """
    mp.active_children()  # reap finished children from earlier tests
    before_children = child_pids()
    before_shm, before_tmp = shm_entries(), tmp_entries()
    yield
    report = getattr(request.node, "report_call", None)
    if report is None or report.failed:
        remove_temp_dirs(tmp_entries() - before_tmp)
        return
    gc.collect()  # multiprocessing unlinks a lock's /dev/shm semaphore when the lock is collected
    mp.active_children()
    assert wait_until(lambda: child_pids() - before_children <= multiprocessing_helpers()), (
        f"leftover child processes: {child_pids() - before_children}"
    )
    assert shm_entries() - before_shm == set(), f"leftover /dev/shm entries: {shm_entries() - before_shm}"
    leftover_tmp = tmp_entries() - before_tmp
    remove_temp_dirs(leftover_tmp)
    assert leftover_tmp == set(), f"leftover temp dirs: {leftover_tmp}"
