"""Worker lifecycle: start, watch, stop, and carry errors to the parent.

Workers are processes forked from multiprocessing's fork server (or spawned:
:func:`process_context`), or threads of the parent for env *instances*
(a live ``ParallelEnv`` cannot be pickled into another process; its own
processes do the physics, so a thread that drives it costs the learner little).

Two things make a failed start readable. Each worker marks that it reached
its entry point, so an exit before that is reported as a start-up failure
(with a hint at the ``if __name__ == "__main__":`` guard) rather than a crash.
And a spawned process's stderr goes to an unlinked temporary file until its
entry point runs, which then restores the parent's stderr: what it printed
while the interpreter bootstrapped is kept and shown in the error. A forked
worker prints on the fork server's stderr, which is the parent's.

With a :class:`RestartPolicy`, the watcher that sees a worker die (its
reported exception, or an exit it did not explain) replaces it with a new
process in the same slot, after the policy's ``prepare`` hook has settled
what the dead one left (its unwritten claim, the random frames it still owed)
and handed the new one its arguments. A worker that fails more than
``max_restarts`` times, or crash-loops, ends the run with every traceback seen.
"""

from __future__ import annotations

import atexit
import contextlib
import io
import logging
import multiprocessing as mp
import multiprocessing.connection
import multiprocessing.util
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing import popen_spawn_posix, reduction
from typing import Any

import torch

from torchrl_unilab._residue import sweep_stale
from torchrl_unilab._sync import StopFlag

__all__ = ["RestartPolicy", "WorkerError", "WorkerPool", "report_error", "restore_stderr", "shut_down_at_exit",
           "worker_started"]

_BOOTSTRAP_HINT = (
    "it exited before reaching its entry point. Each worker re-imports the script that created the "
    "collector while it starts, so the code that builds the collector must sit under "
    "`if __name__ == \"__main__\":`."
)
_STDERR_TAIL = 4000
_THREAD_JOIN_SECONDS = 60.0
#: How long a dead worker's process may take to exit before its replacement starts (it reported, then exits).
_EXIT_WAIT_SECONDS = 5.0
#: Why a new worker failed when the parent could not write its arguments (its pipe broke: it was gone).
_DIED_STARTING = "process died while it started, before it read its arguments"

# A child of TorchRL's logger, as the collector's: restarts are logged beside TorchRL's own lines.
_log = logging.getLogger("torchrl.unilab")


#: Accepted ``start_method`` values of process workers.
START_METHODS = ("forkserver", "spawn")
#: What the fork server imports once, so that each worker forked from it starts with them loaded.
_FORKSERVER_PRELOAD = ["torchrl_unilab.collectors._worker", "torchrl_unilab.worker"]
#: multiprocessing's temporary directory (the fork server's socket) is ``{prefix}{pid}_...``: swept once pid is gone.
#: Short: the socket's whole path must fit in 108 bytes (AF_UNIX), under a TMPDIR that may be long already.
MP_DIR_PREFIX = "tul_mp_"


def process_context(start_method: str = "forkserver") -> mp.context.BaseContext:
    """The multiprocessing context that process workers start in; refuses an unknown ``start_method``.

    ``"forkserver"`` (the default) forks each worker from one server process,
    which imported torch, TorchRL and this package once, when the first
    worker started. A worker that is spawned instead imports them itself, which
    takes seconds, against a fork of an already loaded process. The cost is the
    same for a worker that replaces a dead one. Like spawn, and unlike fork, a worker
    shares no threads or locks with the learner, and it re-imports the main
    script, so the ``if __name__ == "__main__":`` guard is still needed. The
    server has the environment variables that the first start saw. Use
    ``"spawn"`` where a worker must see variables set later.

    Examples:
        >>> process_context().get_start_method()
        'forkserver'
        >>> process_context("fork")
        Traceback (most recent call last):
        ...
        ValueError: start_method must be one of ('forkserver', 'spawn'), got 'fork'
    """
    if start_method not in START_METHODS:
        raise ValueError(f"start_method must be one of {START_METHODS}, got {start_method!r}")
    return mp.get_context(start_method)


def sweep_stale_fork_server_dirs() -> list[str]:
    """Removes the fork-server directories of dead processes from the temporary directory; returns their names."""
    return sweep_stale(tempfile.gettempdir(), MP_DIR_PREFIX)


def _prepare_fork_server() -> None:
    """Before the fork server starts: what it preloads, and a temporary directory we can sweep.

    multiprocessing removes its ``pymp-*`` directory when the process exits,
    and leaves it when the process is killed (a Ray node actor, a SIGKILLed
    run), so over many killed processes they pile up in the temporary
    directory. Named after the pid, a dead process's one is removed at the next
    start, as the buffer's scratch directories are.
    """
    mp.set_forkserver_preload(_FORKSERVER_PRELOAD)
    config = mp.current_process()._config  # noqa: SLF001 - where multiprocessing.util.get_temp_dir keeps it
    if config.get("tempdir") is not None:
        return
    sweep_stale_fork_server_dirs()
    path = tempfile.mkdtemp(prefix=f"{MP_DIR_PREFIX}{os.getpid()}_")
    # exitpriority -100, as multiprocessing's own: after the finalizers that still use the socket
    mp.util.Finalize(None, shutil.rmtree, args=(path,), kwargs={"ignore_errors": True}, exitpriority=-100)
    config["tempdir"] = path


def _remove_fork_server_dir() -> None:
    """Removes the temporary directory :func:`_prepare_fork_server` made for this process, now.

    For a process that is killed rather than left to exit (a Ray node actor
    once its workers stopped: ``RayCollector.shutdown`` kills it), whose exit
    handlers never run. The fork server's socket is in that directory: no
    worker can start in this process afterwards, which is why it has no
    example to run (it would break the process that runs it).
    """
    path = mp.current_process()._config.get("tempdir")  # noqa: SLF001 - see _prepare_fork_server
    if path and os.path.basename(path).startswith(f"{MP_DIR_PREFIX}{os.getpid()}_"):
        shutil.rmtree(path, ignore_errors=True)


class WorkerError(RuntimeError):
    """An exception raised inside a collector worker, re-raised in the main process.

    Attributes:
        worker_idx: index of the worker that failed.
        worker_traceback: the formatted traceback from the worker process (with
            restarts: every failure's, oldest first).
        failures: ``(worker_idx, message, traceback)`` of every failure seen,
            oldest first; restarted ones included.

    Examples:
        >>> err = WorkerError(1, "ValueError: boom", "Traceback ...")
        >>> err.worker_idx, len(err.failures)
        (1, 1)
    """

    def __init__(self, worker_idx: int, message: str, worker_traceback: str,
                 failures: Sequence[tuple[int, str, str]] = ()) -> None:
        self.worker_idx = worker_idx
        self.worker_traceback = worker_traceback
        self._message = message
        self.failures = list(failures) or [(worker_idx, message, worker_traceback)]
        super().__init__(f"collector worker {worker_idx} failed: {message}\n\nWorker traceback:\n{worker_traceback}")

    def __reduce__(self):
        # Exceptions pickle their args; these are the constructor's (Ray and multiprocessing send errors pickled).
        return type(self), (self.worker_idx, self._message, self.worker_traceback, self.failures)


@dataclass
class RestartPolicy:
    """How a :class:`WorkerPool` replaces its dead process workers.

    Args:
        max_restarts: restarts allowed per worker; its next failure ends the run.
        crash_loop: ``(failures, seconds)``: a worker that fails that many times
            within that many seconds ends the run however many restarts are left.
        prepare: called as ``prepare(worker_idx, restarts)`` (``restarts``
            counting this one) once the dead process is gone; returns the new
            process's arguments (``args`` of :class:`WorkerPool`). ``None``
            reuses the pool's ``args``.

    Examples:
        >>> policy = RestartPolicy(max_restarts=3)
        >>> policy.crash_loop
        (3, 60.0)
    """

    max_restarts: int = 0
    crash_loop: tuple[int, float] = (3, 60.0)
    prepare: Callable[[int, int], Sequence] | None = None


@dataclass
class _Failure:
    worker_idx: int
    error: WorkerError
    at: float = field(default_factory=time.monotonic)


class _InheritedFd:
    """An fd the spawned child receives as its own (multiprocessing passes it along at spawn)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __reduce__(self):
        return _detach_fd, (reduction.DupFd(self.fd),)


def _detach_fd(dup) -> int:
    return dup.detach()


def restore_stderr(stderr_fd: int | None) -> None:
    """Worker side: points fd 2 back at the parent's stderr once bootstrapping is over (-1: it is already)."""
    if stderr_fd is None or stderr_fd < 0:
        return
    with contextlib.suppress(OSError):
        sys.stderr.flush()
        os.dup2(stderr_fd, 2)
        os.close(stderr_fd)


def report_error(error_pipe, worker_idx: int, err: BaseException) -> None:
    """Worker side, inside ``except``: sends ``err`` and its traceback to the pool's watcher."""
    with contextlib.suppress(OSError, ValueError):  # the parent is gone: nobody to tell
        error_pipe.send((worker_idx, f"{type(err).__name__}: {err}", traceback.format_exc()))


def worker_started(started: torch.Tensor, idx: int) -> None:
    """Worker side: records that worker ``idx`` reached its entry point."""
    started[idx] = 1


class _ThreadWorker(threading.Thread):
    """A worker thread with the small part of ``Process``'s interface the pool uses."""

    pid = None

    def __init__(self, target: Callable, args: tuple, name: str) -> None:
        super().__init__(target=self._run_target, args=(target, args), name=name, daemon=True)
        self._exitcode: int | None = None

    def _run_target(self, target: Callable, args: tuple) -> None:
        try:
            target(*args)
            self._exitcode = 0
        except BaseException:  # noqa: BLE001 - the target reports its own errors on the queue
            self._exitcode = 1

    @property
    def exitcode(self) -> int | None:
        return None if self.is_alive() else self._exitcode

    def terminate(self) -> None:  # threads cannot be killed; they stop on the stop event
        pass

    kill = terminate


_AT_EXIT: weakref.WeakSet = weakref.WeakSet()


def shut_down_at_exit(owner: Any) -> None:
    """Calls ``owner.shutdown(raise_on_error=False)`` when the interpreter exits, if it is still alive then."""
    _AT_EXIT.add(owner)


@atexit.register
def _shut_down_owners() -> None:
    # Runs before multiprocessing's own exit handler (registered earlier), which
    # would otherwise join non-daemonic workers that nobody asked to stop.
    for owner in list(_AT_EXIT):
        with contextlib.suppress(Exception):
            owner.shutdown(timeout=2.0, raise_on_error=False)


class WorkerPool:
    """Starts workers, watches them from a thread, and stops them all.

    The watcher notices a worker's reported exception (or an unexplained exit)
    within ``poll_interval`` seconds, stops the other workers and keeps the
    error; :meth:`raise_if_failed` re-raises it as :class:`WorkerError`.

    Processes are not daemonic, so that a worker may start processes of its own
    (a ``ParallelEnv``); they stop when the parent dies, and their owner
    registers with :func:`shut_down_at_exit`.

    Args:
        ctx: multiprocessing context (:func:`process_context`: forkserver or spawn).
        target: the worker entry point; called as
            ``target(idx, *args, stop_event, error_pipe, started, stderr_fd)``;
            a worker that fails sends ``(idx, message, traceback)`` on its
            ``error_pipe`` (the write end of a pipe: unlike an ``mp.Queue`` it
            has no named semaphore in ``/dev/shm`` to outlive a killed process).
        args: per-worker positional arguments after the index.
        num_workers: how many workers to start.
        in_thread: which workers run as threads of this process (default: none).
        stop_event: what :meth:`stop` sets and workers poll (default: a new
            :class:`~torchrl_unilab._sync.StopFlag`); anything with ``set`` / ``is_set``.
        restart: replaces dead process workers (a :class:`RestartPolicy`);
            default: the first failure stops every worker. A worker thread is
            never restarted (the env instance it steps cannot be rebuilt).

    Examples:
        >>> import multiprocessing as mp
        >>> pool = WorkerPool(mp.get_context("spawn"), target=print, args=(), num_workers=0)
        >>> pool.start(); pool.stop(); pool.alive()
        0
    """

    def __init__(self, ctx: mp.context.BaseContext, target: Callable, args: Sequence, num_workers: int,
                 poll_interval: float = 0.05, name: str = "OffPolicyCollector",
                 in_thread: Sequence[bool] | None = None, stop_event: Any = None,
                 restart: RestartPolicy | None = None) -> None:
        self.ctx = ctx
        # Spawned processes get their stderr kept until they start; forked ones print on the server's, ours.
        self._spawns = ctx.get_start_method() == "spawn"
        self.target, self.args, self.name = target, tuple(args), name
        self.restart = restart or RestartPolicy()
        #: Restarts of each worker so far.
        self.restarts = [0] * num_workers
        #: Every failure seen, oldest first.
        self.failures: list[_Failure] = []
        # Held while a worker is replaced, and by stop() when it sets _stopping: no replacement starts after.
        self._lifecycle = threading.Lock()
        # default: an mp.Event's lock stays held by a worker killed inside is_set()
        self.stop_event = StopFlag() if stop_event is None else stop_event
        pipes = [ctx.Pipe(duplex=False) for _ in range(num_workers)]
        self._error_readers = [reader for reader, _ in pipes]
        self._error_writers = [writer for _, writer in pipes]
        self.poll_interval = poll_interval
        self.started = torch.zeros(num_workers, dtype=torch.uint8).share_memory_()
        in_thread = list(in_thread) if in_thread is not None else [False] * num_workers
        self._stderr_files: list[int | None] = [None] * num_workers
        self._parent_stderr = [_InheritedFd(-1) for _ in range(num_workers)]
        self.procs = []
        for i in range(num_workers):
            if in_thread[i]:
                common = (i, *args, self.stop_event, self._error_writers[i], self.started)
                self.procs.append(_ThreadWorker(target, (*common, None), name=f"{name}-worker-{i}"))
            else:
                self.procs.append(self._process(i, self.args))
        self._open = set(range(num_workers))  # workers whose error pipe is still open
        self.error: WorkerError | None = None
        self._stopping = False
        self._watcher: threading.Thread | None = None
        self._watching = False  # until the watcher's last notification: its thread is still alive then
        # Notified after each pass of the watcher: raise_if_failed(wait_for_report=...) waits on it for an exit
        # to be handled (named or replaced), not for the watcher to end, which with restarts on it never does.
        self._watched = threading.Condition()
        # One reader of exit statuses at a time: a forkserver child's status is read once from a pipe, and a second
        # thread polling the same Popen meanwhile reads EOF, which multiprocessing reports as exit code 255.
        self._status_lock = threading.Lock()

    def start(self) -> None:
        """Starts every worker and the watcher thread."""
        if self.ctx.get_start_method() == "forkserver":
            _prepare_fork_server()
        for i, proc in enumerate(self.procs):
            if isinstance(proc, _ThreadWorker):
                proc.start()
            else:
                try:
                    self._start_process(i, proc)
                except OSError as err:
                    raise WorkerError(i, f"{_DIED_STARTING} ({err})", "(no traceback)") from err
                self._error_writers[i].close()  # the child has its own copy: EOF here once it exits
        self._watcher = threading.Thread(target=self._watch, name="collector-watcher", daemon=True)
        self._watching = True
        self._watcher.start()

    def _process(self, idx: int, args: Sequence) -> mp.process.BaseProcess:
        common = (idx, *args, self.stop_event, self._error_writers[idx], self.started)
        if self._spawns:
            process, parent_stderr = _SpawnProcess, self._parent_stderr[idx]
        else:  # forked from the fork server, whose fd 2 is the parent's stderr already
            process, parent_stderr = self.ctx.Process, -1
        return process(target=self.target, args=(*common, parent_stderr),
                       name=f"{self.name}-worker-{idx}", daemon=False)

    def _start_process(self, idx: int, proc: mp.process.BaseProcess) -> None:
        if self._spawns:
            self._stderr_files[idx] = _start_with_captured_stderr(proc, self._parent_stderr[idx])
        else:
            proc.start()

    def _watch(self) -> None:
        try:
            self._watch_until_failed_or_stopped()
        finally:
            with self._watched:
                self._watching = False
                self._watched.notify_all()

    def _watch_until_failed_or_stopped(self) -> None:
        while not self._stopping:
            readers = {self._error_readers[idx]: idx for idx in self._open}
            for reader in mp.connection.wait(list(readers), timeout=self.poll_interval):
                idx = readers[reader]
                report = _receive(reader)
                if report is None:
                    self._open.discard(idx)  # the worker is gone, or was killed mid-report: its exit names it
                elif not self._failed(idx, WorkerError(*report)):
                    return
            for idx, proc in enumerate(self.procs):
                exitcode = self._exitcode(proc)
                if exitcode not in (None, 0) and not self._stopping:
                    # Give the worker's own report a moment to arrive; it is more useful.
                    reader = self._error_readers[idx]
                    report = _receive(reader) if idx in self._open and reader.poll(0.5) else None
                    error = WorkerError(*report) if report is not None else self._unexplained_exit(idx, exitcode)
                    if not self._failed(idx, error):
                        return
            with self._watched:
                self._watched.notify_all()

    def _failed(self, idx: int, error: WorkerError) -> bool:
        """Records a failure; replaces the worker if the policy allows it. Returns whether the pool goes on."""
        with self._lifecycle:
            if self._stopping:
                return False
            self.failures.append(_Failure(idx, error))
            if self.restart.max_restarts == 0:  # no restarts asked for: the error as it came
                self._fail(error)
                return False
            while True:
                refusal = self._refusal(idx)
                if refusal is not None:
                    self._fail(self._final_error(idx, error, refusal))
                    return False
                not_started = self._replace(idx, error)
                if not_started is None:
                    return True
                # The replacement died before it read its arguments: one more failure of this worker
                error = WorkerError(idx, f"{_DIED_STARTING} ({not_started})", "(no traceback)")
                self.failures.append(_Failure(idx, error))

    def _refusal(self, idx: int) -> str | None:
        """Why worker ``idx`` is not restarted, or None if it is."""
        policy = self.restart
        if isinstance(self.procs[idx], _ThreadWorker):
            return "a worker thread (it steps an env instance, which cannot be rebuilt) is not restarted"
        if self.restarts[idx] >= policy.max_restarts:
            return (f"it failed {self.restarts[idx] + 1} times, more than max_worker_restarts={policy.max_restarts} "
                    "allows")
        count, window = policy.crash_loop
        now = time.monotonic()
        recent = [f for f in self.failures if f.worker_idx == idx and now - f.at <= window]
        if len(recent) >= count:
            return f"it crash-loops: {len(recent)} failures within {window:g} s"
        return None

    def _final_error(self, idx: int, error: WorkerError, refusal: str) -> WorkerError:
        seen = [(f.worker_idx, f.error._message, f.error.worker_traceback) for f in self.failures]  # noqa: SLF001
        tracebacks = "\n".join(f"--- failure {n} of {len(seen)}, worker {w}: {message}\n{tb}"
                               for n, (w, message, tb) in enumerate(seen, 1))
        return WorkerError(idx, f"{error._message} (not restarted: {refusal}; {sum(self.restarts)} "  # noqa: SLF001
                                f"restart(s) in all)", tracebacks, failures=seen)

    def _replace(self, idx: int, error: WorkerError) -> OSError | None:
        """Starts a new process in worker ``idx``'s place, once the old one has exited; None once it started,
        else the error that stopped it."""
        old = self.procs[idx]
        # Waited for on its sentinel, its status read under the lock (threads are never replaced).
        mp.connection.wait([old.sentinel], _EXIT_WAIT_SECONDS)  # one that reported its error exits at once
        if self._exitcode(old) is None:
            old.kill()
            mp.connection.wait([old.sentinel], _EXIT_WAIT_SECONDS)
        # Not old.close(): other threads may still read its exitcode; its fds go with the object.
        self._error_readers[idx].close()
        self._open.discard(idx)
        self._close_stderr(idx)
        self.restarts[idx] += 1
        prepare = self.restart.prepare
        args = self.args if prepare is None else tuple(prepare(idx, self.restarts[idx]))
        reader, writer = self.ctx.Pipe(duplex=False)
        self._error_readers[idx], self._error_writers[idx] = reader, writer
        self.started[idx] = 0
        proc = self._process(idx, args)
        _log.warning(f"{self.name}: worker {idx} failed ({error._message.splitlines()[0]}); restarting it "  # noqa: SLF001
                     f"(restart {self.restarts[idx]} of at most {self.restart.max_restarts} for this worker)")
        try:
            self._start_process(idx, proc)
        except OSError as err:  # it died before it read its arguments (_SpawnPopen)
            writer.close()
            return err
        writer.close()
        self.procs[idx] = proc
        self._open.add(idx)
        return None

    def last_failure(self, idx: int) -> WorkerError | None:
        """The latest failure of worker ``idx``, restarted or not."""
        return next((f.error for f in reversed(self.failures) if f.worker_idx == idx), None)

    def _unexplained_exit(self, idx: int, code: int) -> WorkerError:
        how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
        stderr = self._stderr_tail(idx)
        if not self.started[idx]:
            if not self._spawns:  # forked: what it printed is on this process's stderr
                return WorkerError(idx, f"process {how}: {_BOOTSTRAP_HINT}", "(its stderr is this process's stderr)")
            return WorkerError(idx, f"process {how}: {_BOOTSTRAP_HINT}",
                               f"(worker stderr while starting)\n{stderr or '(empty)'}")
        return WorkerError(idx, f"process {how} without reporting an exception", stderr or "(no traceback)")

    def _stderr_tail(self, idx: int) -> str:
        fd = self._stderr_files[idx]
        if fd is None:
            return ""
        with contextlib.suppress(OSError):
            size = os.fstat(fd).st_size
            data = os.pread(fd, _STDERR_TAIL, max(0, size - _STDERR_TAIL))
            return data.decode(errors="replace").strip()
        return ""

    def _fail(self, error: WorkerError) -> None:
        if self.error is None:
            self.error = error
        self.stop_event.set()

    def raise_if_failed(self, wait_for_report: float = 0.0) -> None:
        """Re-raises the first worker error, if any.

        With ``wait_for_report`` > 0, a worker that has already exited with an
        error gives the watcher up to that many seconds to handle its exit (read
        its report or name it, then fail the pool or replace the worker) before
        this looks; it returns as soon as the watcher has.
        """
        if wait_for_report > 0:
            with self._watched:
                self._watched.wait_for(lambda: self.error is not None or not self._watching or not any(
                    self._exitcode(p) not in (None, 0) for p in self.procs), timeout=wait_for_report)
        if self.error is not None:
            raise self.error

    def alive(self) -> int:
        """How many workers are still running."""
        return sum(p.ident is not None and self._exitcode(p) is None for p in self.procs)

    def _exitcode(self, proc: mp.process.BaseProcess | _ThreadWorker) -> int | None:
        with self._status_lock:
            return proc.exitcode

    def stop(self, timeout: float = 4.0) -> None:
        """Asks workers to stop, then terminates and kills stragglers within ``timeout`` seconds."""
        with self._lifecycle:  # a replacement being started finishes first; none starts after
            self._stopping = True
        self.stop_event.set()
        deadline = time.monotonic() + timeout
        started = [p for p in self.procs if p.ident is not None]
        for proc in started:
            proc.join(max(0.0, deadline - time.monotonic() - 0.3 * timeout))
        for proc in started:
            if isinstance(proc, _ThreadWorker):
                # A thread cannot be killed; it ends at its next step now that the stop event is set,
                # and its env must not be closed under it.
                proc.join(_THREAD_JOIN_SECONDS)
        for proc in started:
            if proc.is_alive():
                proc.terminate()
        for proc in started:
            proc.join(max(0.05, deadline - time.monotonic()))
            if proc.is_alive():
                proc.kill()
                proc.join(1.0)
        if self._watcher is not None:
            self._watcher.join(1.0)
        # Pick up an error reported while we were stopping (e.g. during a pause).
        for reader in self._error_readers:
            report = _receive(reader) if self.error is None and _readable(reader) else None
            if report is not None:
                self.error = WorkerError(*report)
            reader.close()
        for writer in self._error_writers:
            writer.close()  # a thread worker's end
        for i in range(len(self._stderr_files)):
            self._close_stderr(i)

    def _close_stderr(self, idx: int) -> None:
        fd, self._stderr_files[idx] = self._stderr_files[idx], None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)


def _readable(reader: mp.connection.Connection) -> bool:
    with contextlib.suppress(OSError, ValueError):
        return reader.poll(0)
    return False


def _receive(reader: mp.connection.Connection) -> tuple[int, str, str] | None:
    """A worker's ``(idx, message, traceback)`` report, or None at EOF (or for a report cut short by a kill)."""
    try:
        return reader.recv()
    except (EOFError, OSError, ValueError, TypeError, AttributeError, ImportError):
        return None


class _SpawnPopen(popen_spawn_posix.Popen):
    """The spawn start method's ``Popen``, which fails instead of hanging when the new process dies at once.

    The standard one writes the pickled process object into a pipe while it
    still holds the child's read end of that pipe itself; a child that dies
    before it has read the payload (SIGKILLed while it imports torch) leaves the
    parent blocked in that write forever: for a replacement worker, the
    collector's watcher thread hangs in ``Popen._launch``, and so does a
    shutdown that waits on that thread (``benchmarks/faults.py --soak-minutes``
    kills workers again and again, replacements included). Here the parent
    closes the child's ends before writing, so the write raises
    ``BrokenPipeError`` once the child is gone; the child is reaped.
    """

    def _launch(self, process_obj: mp.process.BaseProcess) -> None:
        from multiprocessing import resource_tracker, spawn, util

        tracker_fd = resource_tracker.getfd()
        self._fds.append(tracker_fd)
        payload = io.BytesIO()
        popen_spawn_posix.set_spawning_popen(self)
        try:
            reduction.dump(spawn.get_preparation_data(process_obj._name), payload)  # noqa: SLF001
            reduction.dump(process_obj, payload)
        finally:
            popen_spawn_posix.set_spawning_popen(None)
        parent_r, child_w = os.pipe()
        child_r, parent_w = os.pipe()
        try:
            cmd = spawn.get_command_line(tracker_fd=tracker_fd, pipe_handle=child_r)
            self.pid = util.spawnv_passfds(spawn.get_executable(), cmd, [*self._fds, child_r, child_w])
        except BaseException:
            util.close_fds(parent_r, parent_w)
            raise
        finally:
            os.close(child_r)  # the child has its copies: once it is gone, nobody reads the payload
            os.close(child_w)
        self.sentinel = parent_r
        self.finalizer = util.Finalize(self, util.close_fds, [parent_r, parent_w])
        try:
            with open(parent_w, "wb", closefd=False) as f:
                f.write(payload.getbuffer())
        except OSError:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(self.pid, 0)
            self.finalizer()
            raise


class _SpawnProcess(mp.context.SpawnProcess):
    """A spawned process started through :class:`_SpawnPopen`."""

    @staticmethod
    def _Popen(process_obj: mp.process.BaseProcess) -> _SpawnPopen:  # noqa: N802 - multiprocessing's name
        return _SpawnPopen(process_obj)


def _start_with_captured_stderr(proc: mp.process.BaseProcess, parent_stderr: _InheritedFd) -> int:
    """Starts ``proc`` with fd 2 on an unlinked temporary file; returns a read fd on that file.

    The file is unlinked at once, so nothing is left behind whatever happens to
    either process. The child points fd 2 back at the parent's stderr (passed
    to it as an argument) as soon as its entry point runs.
    """
    fd, path = tempfile.mkstemp(prefix="torchrl_unilab_stderr_")
    os.unlink(path)
    saved = os.dup(2)
    parent_stderr.fd = saved  # what the child gets back once its entry point runs
    with contextlib.suppress(Exception):
        sys.stderr.flush()
    os.dup2(fd, 2)
    try:
        proc.start()
    except BaseException:
        os.close(fd)
        raise
    finally:
        os.dup2(saved, 2)
        os.close(saved)
    return fd
