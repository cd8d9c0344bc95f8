"""Shared fixtures: real MuJoCo envs, real worker processes, and leak checks."""

from __future__ import annotations

import contextlib
import gc
import logging
import multiprocessing as mp
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator

import pytest
import torch
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModule
from torchrl.data import ReplayBuffer
from torchrl.envs import (
    Compose,
    DoubleToFloat,
    EnvBase,
    EnvCreator,
    InitTracker,
    ParallelEnv,
    RewardSum,
    SerialEnv,
    StepCounter,
    Transform,
    TransformedEnv,
)

from torchrl_unilab import BatchedGymEnv, SharedWeights, layout_of, make_replay_buffer
from torchrl_unilab._residue import left_by, live_processes, multiprocessing_helpers
from torchrl_unilab.worker import CollectorProcess, init_offpolicy_storage, make_collector_actor

#: The task of the function-level API tests (``learner_side``, ``collector_process``).
FUNCTION_API_ENV = "Pendulum-v1"


def needs_extra(module: str, extra: str):
    """Imports ``module`` from one of the package's extras, or skips the calling test with a reason naming the extra.

    ``pip install -e ".[test]"`` alone runs the suite with these tests skipped. Where ``UNILAB_REQUIRE_EXTRAS`` is
    set (``.ci/run`` sets it: CI installs every extra), a missing extra fails the test instead, so that a broken
    install cannot pass as skips.
    """
    reason = f"needs {module!r} from the [{extra}] extra: pip install -e '.[test,{extra}]'"
    if os.environ.get("UNILAB_REQUIRE_EXTRAS"):
        try:
            return __import__(module)
        except ImportError as error:
            pytest.fail(f"{reason} (UNILAB_REQUIRE_EXTRAS is set): {error}")
    return pytest.importorskip(module, reason=reason)


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
    return set(left_by(os.getpid())["shm"])


def tmp_entries() -> set[str]:
    if os.environ.get("CI"):
        return {e for e in os.listdir(tempfile.gettempdir()) if e.startswith("torchrl_unilab")}
    return set(left_by(os.getpid())["tmp"])


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
    control, deadline = collector._worker_frames.control, time.monotonic() + 180  # noqa: SLF001
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


def publish_zero_weights(collector, policy: torch.nn.Module) -> None:
    """Zeroes every parameter of ``policy`` in place and publishes them with ``collector.update_policy_weights_()``.

    A :func:`linear_policy` then acts with zeros (``tanh(0)``), which tells its rows from those of the weights before.
    """
    with torch.no_grad():
        for p in policy.parameters():
            p.zero_()
    collector.update_policy_weights_()


def rows_after_publish(collector, replay_buffer: ReplayBuffer, frames: int, timeout: float,
                       version: int | None = None) -> TensorDictBase:
    """The buffer's rows once ``frames`` more frames are written after a publish.

    With ``version``, first asserts that every worker acts with that policy version (``metrics()``) within
    ``timeout``; then asserts that ``frames`` frames beyond those written so far come within ``timeout``.
    """
    if version is not None:
        assert wait_until(lambda: collector.metrics()["policy_version"] == version, timeout=timeout)
    start = collector.frames_written
    assert collector.wait_for_frames(start + frames, timeout=timeout)
    return replay_buffer[: collector.frames_written]


def sota_transforms(max_steps: int) -> Compose:
    """The transforms TorchRL's sota ``make_environment`` puts over the batched env, episodes cut at ``max_steps``."""
    return Compose(InitTracker(), StepCounter(max_steps), DoubleToFloat(), RewardSum())


def sota_env(make_env: Callable[[], EnvBase], num_envs: int = 2, *, max_steps: int = 200, parallel: bool = False,
             seed: int | None = None) -> TransformedEnv:
    """The shape of TorchRL's sota ``make_environment``: ``num_envs`` envs of ``make_env`` batched in a ``SerialEnv``
    (a ``ParallelEnv`` with ``parallel``), seeded with ``seed`` if given, under :func:`sota_transforms`."""
    if parallel:
        env = ParallelEnv(num_envs, EnvCreator(make_env), serial_for_single=True)
    else:
        env = SerialEnv(num_envs, EnvCreator(make_env))
    if seed is not None:
        env.set_seed(seed)
    return TransformedEnv(env, sota_transforms(max_steps))


@contextlib.contextmanager
def learner_side(capacity: int, algo: str = "sac") -> Iterator[tuple[ReplayBuffer, torch.nn.Module, SharedWeights]]:
    """The learner's side of the function-level API on :data:`FUNCTION_API_ENV`: ``(rb, actor, weights)``.

    A buffer of ``capacity`` rows laid out for the task, a seeded actor with ``actor_hidden_dim=16`` and its
    weights in shared memory, closed on the way out.
    """
    rb = make_replay_buffer(capacity)
    init_offpolicy_storage(rb, FUNCTION_API_ENV)
    env = BatchedGymEnv(FUNCTION_API_ENV, 1)
    torch.manual_seed(0)  # the learner's initial weights are part of what must repeat
    actor = make_collector_actor(algo, env, actor_hidden_dim=16)
    env.close()
    weights = SharedWeights.create(actor)
    try:
        yield rb, actor, weights
    finally:
        weights.close()


def collector_process(rb: ReplayBuffer, actor: torch.nn.Module, weights: SharedWeights, **kwargs) -> CollectorProcess:
    """A :class:`~torchrl_unilab.worker.CollectorProcess` that fills ``rb`` acting with ``weights``.

    It steps 2 envs of :data:`FUNCTION_API_ENV` with ``actor``'s layout (``actor_hidden_dim=16``, as
    :func:`learner_side` builds it); ``kwargs`` add to these or replace them. Use it as a context: it stops on exit.
    """
    return CollectorProcess(**{"env_name": FUNCTION_API_ENV, "num_envs": 2, "replay_buffer": rb,
                               "weight_sync_name": weights.name, "weight_param_shapes": layout_of(actor),
                               "actor_hidden_dim": 16, **kwargs})


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
