"""What a killed process leaves behind, and sweeping it up at the next start.

A process killed by SIGKILL (or the OOM killer) runs no cleanup: its buffer's
temporary scratch directory and its weight blocks in ``/dev/shm`` stay. Their
names carry the creating process's id, so a later process can tell which ones
belong to processes that no longer exist and remove them.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path

__all__ = [
    "SCRATCH_PREFIX", "SHM_DIR", "WEIGHTS_PREFIX", "command_line", "left_by", "live_processes",
    "multiprocessing_helpers", "pid_alive", "running", "sweep_stale", "worker_processes",
]

#: Weight blocks in :data:`SHM_DIR` are named ``{WEIGHTS_PREFIX}{pid}_...`` after the process that created them.
WEIGHTS_PREFIX = "tul_w_"
SHM_DIR = "/dev/shm"
#: A replay buffer's temporary scratch directories are named ``{SCRATCH_PREFIX}{pid}_...`` after their creator.
SCRATCH_PREFIX = "torchrl_unilab_rb_"


def pid_alive(pid: int) -> bool:
    """Whether a process with id ``pid`` exists (zombies included).

    Examples:
        >>> pid_alive(os.getpid())
        True
    """
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's live process
    return True


def running(pid: int) -> bool:
    """Whether process ``pid`` exists and has not exited: a zombie awaiting its reaper counts as exited.

    A zombie holds no memory mapping and runs no code, so what it named after
    its pid is as orphaned as a dead process's.

    Examples:
        >>> running(os.getpid()), running(2**22 + 1)  # the second is above Linux's pid_max
        (True, False)
    """
    if not pid_alive(pid):
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return pid_alive(pid)  # no /proc entry to read: trust the signal probe


def live_processes(*, parent: int | None = None, session: int | None = None) -> set[int]:
    """Ids of live (non-zombie) processes, optionally those of one ``parent`` or one ``session``.

    Read from ``/proc/<pid>/stat`` (Linux): the tests and the faults benchmark use
    it to find processes left behind.

    Examples:
        >>> os.getpid() in live_processes(session=os.getsid(0))
        True
    """
    out = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                state, ppid, _pgrp, sid = f.read().rsplit(")", 1)[1].split()[:4]
        except (OSError, ValueError):
            continue
        if state == "Z" or (parent is not None and int(ppid) != parent):
            continue
        if session is not None and int(sid) != session:
            continue
        out.add(int(entry))
    return out


def worker_processes(parent: int) -> set[int]:
    """Ids of the live worker processes that process ``parent`` started, spawned or forked from its fork server.

    Spawned workers are ``parent``'s children; forked ones are the children of
    the fork server, which is ``parent``'s child. The faults benchmark and the
    tests pick the workers they kill with it.

    Examples:
        >>> worker_processes(os.getpid()) <= live_processes()
        True
    """
    found = set()
    for pid in live_processes(parent=parent):
        line = command_line(pid)
        if b"spawn_main" in line:
            found.add(pid)
        elif b"multiprocessing.forkserver" in line:
            found |= live_processes(parent=pid)
    return found


def multiprocessing_helpers() -> set[int]:
    """Ids of this process's multiprocessing helpers: its resource tracker and its fork server, if started.

    Both are long-lived stdlib processes that exit with this one (the fork
    server is the one our workers are forked from); a check for processes left
    behind leaves them out.

    Examples:
        >>> os.getpid() in multiprocessing_helpers()
        False
    """
    from multiprocessing import forkserver, resource_tracker

    pids = {getattr(resource_tracker._resource_tracker, "_pid", None),  # noqa: SLF001
            getattr(forkserver._forkserver, "_forkserver_pid", None)}  # noqa: SLF001
    return {pid for pid in pids if pid}


def command_line(pid: int) -> bytes:
    """Process ``pid``'s command line as ``/proc`` has it (arguments separated by NUL), or ``b""`` if it is gone.

    Examples:
        >>> b"python" in command_line(os.getpid())
        True
    """
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


def sweep_stale(directory: str | os.PathLike, prefix: str) -> list[str]:
    """Removes entries ``{prefix}{pid}_...`` of ``directory`` whose ``pid`` has exited; returns their names.

    A zombie's entries go too (see :func:`running`): Ray's ``ray.kill`` can
    leave an actor unreaped for a while. Only entries owned by this user are
    touched; a pid reused by an unrelated live process keeps its entry (the
    safe side).

    Examples:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     os.mkdir(f"{tmp}/rb_{2**22 + 1}_x")  # above Linux's pid_max: no such process
        ...     os.mkdir(f"{tmp}/rb_{os.getpid()}_y")
        ...     sweep_stale(tmp, "rb_"), os.listdir(tmp) == [f"rb_{os.getpid()}_y"]
        (['rb_4194305_x'], True)
    """
    pattern = re.compile(re.escape(prefix) + r"(\d+)_")
    removed = []
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return removed
    uid = os.getuid()
    for entry in entries:
        match = pattern.match(entry.name)
        if match is None or running(int(match.group(1))):
            continue
        try:
            if entry.stat(follow_symlinks=False).st_uid != uid:
                continue
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(Path(entry.path))
            else:
                os.unlink(entry.path)
        except OSError:
            continue  # another process swept it first, or it is not ours to remove
        removed.append(entry.name)
    return removed


def left_by(pid: int) -> dict[str, list[str]]:
    """What is named after process ``pid``: its weight blocks (``"shm"``, in :data:`SHM_DIR`) and its buffers'
    scratch directories (``"tmp"``, in the temp directory). Once ``pid`` has exited, all of it is residue.

    Examples:
        >>> left_by(2**22 + 1)  # above Linux's pid_max: no such process
        {'shm': [], 'tmp': []}
    """
    def named_after(directory: str, prefix: str) -> list[str]:
        try:
            return sorted(e for e in os.listdir(directory) if e.startswith(f"{prefix}{pid}_"))
        except OSError:
            return []

    return {"shm": named_after(SHM_DIR, WEIGHTS_PREFIX), "tmp": named_after(tempfile.gettempdir(), SCRATCH_PREFIX)}
