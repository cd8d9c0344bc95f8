"""What several benchmark scripts share: provenance, processes, a pytorch/rl checkout, tracebacks, intervals, plots.

A script in ``benchmarks/`` imports it as ``from common import provenance, run_in_own_group`` (the scripts' folder
is on ``sys.path`` when one runs, and pytest's ``pythonpath`` holds it for the tests).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import importlib.metadata
import os
import platform
import random
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence, Sized
from pathlib import Path


def provenance(benchmark: str, load_start: float | None = None, load_end: float | None = None,
               note: str | None = None, argv: list[str] | None = None) -> dict:
    """The keys every ``--out`` file starts with: ``benchmark``, ``date``, ``command`` (``argv``, by default this
    process's arguments), ``machine`` (with the load averages given, then ``note``) and ``torch``.

    Example::

        >>> sorted(provenance("sampling", load_start=0.5, load_end=1.2))
        ['benchmark', 'command', 'date', 'machine', 'torch']
        >>> provenance("faults", load_start=0.31, load_end=1.02)["machine"].endswith(
        ...     "load average 0.31 at the start, 1.02 at the end")
        True
    """
    import torch  # here, so that a script's --help need not load torch

    loads = [f"{load} at the {when}" for load, when in ((load_start, "start"), (load_end, "end")) if load is not None]
    machine = "; ".join([f"{os.cpu_count()}-core {platform.machine()} CPU",
                         *([f"load average {', '.join(loads)}"] if loads else []), *([note] if note else [])])
    return {"benchmark": benchmark, "date": time.strftime("%Y-%m-%d"),  # quoted as a shell would need it
            "command": " ".join([f"python benchmarks/{benchmark}.py",
                                 shlex.join(sys.argv[1:] if argv is None else argv)]).rstrip(),
            "machine": machine, "torch": torch.__version__}


def torchrl_version() -> str:
    """The installed TorchRL's version, as ``torchrl.__version__`` reads it: the ``torchrl`` distribution's, else
    ``torchrl-nightly``'s (a date such as ``2026.10.27``), without importing torchrl.

    Example::

        >>> torchrl_version().split(".")[0].isdigit()
        True
    """
    for name in ("torchrl", "torchrl-nightly"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            return importlib.metadata.version(name)
    raise importlib.metadata.PackageNotFoundError("neither torchrl nor torchrl-nightly is installed")


# ------------------------------------------------------------------ processes
def _pids() -> Iterator[str]:
    return (entry for entry in os.listdir("/proc") if entry.isdigit())


def group_members(pgid: int) -> dict[int, str]:
    """``{pid: command line}`` of the live processes of group ``pgid`` (read from /proc)."""
    out = {}
    for pid in _pids():
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) ": state ppid pgrp ...
            if int(fields[2]) == pgid and fields[0] != "Z":
                out[int(pid)] = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile
    return out


def _is_resource_tracker(cmdline: str) -> bool:
    return "multiprocessing.resource_tracker" in cmdline


def _only_trackers(members: dict[int, str]) -> bool:
    return all(_is_resource_tracker(cmd) for cmd in members.values())


def wait_until(check: Callable[[], object], timeout: float, poll: float = 0.05) -> bool:
    """Whether ``check()`` came true within ``timeout`` seconds (called every ``poll`` seconds).

    Example::

        >>> wait_until(lambda: True, 1.0), wait_until(lambda: False, 0.1)
        (True, False)
    """
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(poll)
    return True


def _wait_for(pgid: int, seconds: float, done: Callable[[dict[int, str]], bool]) -> dict[int, str]:
    deadline = time.monotonic() + seconds
    members = group_members(pgid)
    while not done(members) and time.monotonic() < deadline:
        time.sleep(0.2)
        members = group_members(pgid)
    return members


def _kill(pids: Sequence[int], sig: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def kill_group(pgid: int, grace: float = 5.0) -> None:
    """Ends every process of group ``pgid``: SIGTERM, then SIGKILL after ``grace`` seconds.

    Multiprocessing's resource tracker ignores SIGTERM and unlinks the semaphores and shared memory the others
    leaked once they are gone: it is SIGKILLed only 10 s later, so that a killed script leaves nothing in /dev/shm.
    """
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return
    members = _wait_for(pgid, grace, _only_trackers)
    _kill([pid for pid, cmd in members.items() if not _is_resource_tracker(cmd)], signal.SIGKILL)
    _kill(list(_wait_for(pgid, 10.0, lambda m: not m)), signal.SIGKILL)
    _wait_for(pgid, 5.0, lambda m: not m)


def kill_now(proc: subprocess.Popen) -> None:
    """SIGKILLs the process group that ``proc`` leads (started with ``start_new_session=True``) if it still runs,
    and reaps it."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # the child leads its own session: this kills only its group
        proc.wait()


def _dump_stacks(pgid: int) -> int:
    """SIGABRTs each process of the group but the resource tracker; returns how many.

    With ``PYTHONFAULTHANDLER=1`` each writes every thread's stack to its stderr (the run's log): where it hangs.
    """
    pids = [pid for pid, cmd in group_members(pgid).items() if not _is_resource_tracker(cmd)]
    _kill(pids, signal.SIGABRT)
    _wait_for(pgid, 3.0, _only_trackers)
    return len(pids)


def shm_entries() -> set[str]:
    """The names in /dev/shm (none where it cannot be read)."""
    try:
        return set(os.listdir("/dev/shm"))
    except OSError:
        return set()


def mapped_shm() -> set[str]:
    """Names in /dev/shm that a live process maps (a named semaphore or shared block in use)."""
    out = set()
    for pid in _pids():
        try:
            maps = Path(f"/proc/{pid}/maps").read_text()
        except OSError:
            continue
        out.update(line.split("/dev/shm/", 1)[1].split()[0] for line in maps.splitlines() if "/dev/shm/" in line)
    return out


def shm_left(before: set[str], *, skip: tuple[str, ...] = ()) -> list[str]:
    """Entries of /dev/shm made since ``before`` (:func:`shm_entries`) that no live process maps and whose names
    start with none of ``skip``; looked at again after 5 s, as a resource tracker may still be removing them. On a
    shared machine another job's entries cannot be told apart."""
    left = {e for e in shm_entries() - before - mapped_shm() if not e.startswith(skip)}
    if left:
        time.sleep(5.0)
        left &= shm_entries() - mapped_shm()
    return sorted(left)


@dataclasses.dataclass
class GroupRun:
    """How a command run by :func:`run_in_own_group` ended."""

    returncode: int
    seconds: float
    timed_out: bool
    dumped: int  # processes whose stacks were written to the log at the timeout
    leftovers: dict[int, str]  # processes of its group still alive 10 s after it exited (killed since)
    exit_after_output_s: float | None  # from its last output (tqdm's bar: the last update) to its exit; None: killed


def run_in_own_group(cmd: Sequence[str], cwd: Path, env: dict[str, str], log_path: Path,
                     timeout: float) -> GroupRun:
    """Runs ``cmd`` in a session of its own, its output into ``log_path``.

    At ``timeout`` the group's stacks go into the log and the group is killed; what of the group is still alive 10 s
    after it exits (a resource tracker may need a moment) is killed too.
    """
    start = time.monotonic()
    timed_out, dumped = False, 0
    with log_path.open("wb") as log:
        proc = subprocess.Popen(list(cmd), cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            dumped = _dump_stacks(proc.pid)
            kill_group(proc.pid)
            proc.wait()
    seconds = time.monotonic() - start
    exit_after_output = None if timed_out else max(0.0, time.time() - log_path.stat().st_mtime)
    leftovers = _wait_for(proc.pid, 10.0, lambda members: not members)
    if leftovers:
        kill_group(proc.pid, grace=2.0)
    return GroupRun(proc.returncode, seconds, timed_out, dumped, leftovers, exit_after_output)


def run_captured(cmd: Sequence[str], *, timeout: float, cwd: Path | None = None,
                 env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``subprocess.run(cmd, capture_output=True, text=True)`` in a session of its own: at ``timeout`` its whole
    process group (a collector's workers too) is killed and :class:`subprocess.TimeoutExpired` raised.

    Example::

        >>> run_captured([sys.executable, "-c", "print(6 * 7)"], timeout=60).stdout
        '42\\n'
    """
    proc = subprocess.Popen(list(cmd), cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_group(proc.pid, grace=2.0)
        proc.communicate()
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def with_pythonpath(*paths: str | Path, **env: str) -> dict[str, str]:
    """``os.environ`` with ``paths`` ahead of its ``PYTHONPATH`` (this checkout's torchrl_unilab before an editable
    install of another one), updated with ``env``.

    Example::

        >>> with_pythonpath("/repo", MUJOCO_GL="egl")["PYTHONPATH"].split(os.pathsep)[0]
        '/repo'
    """
    entries = [str(p) for p in paths if p] + [os.environ.get("PYTHONPATH", "")]
    return {**os.environ, **env, "PYTHONPATH": os.pathsep.join(e for e in entries if e)}


@contextlib.contextmanager
def work_dir(prefix: str, keep: bool) -> Iterator[Path]:
    """A new temporary directory (``prefix`` its name's start), removed at the end unless ``keep`` (``--keep``):
    then its path goes to stderr.

    Example::

        >>> with work_dir("example_", keep=False) as path:
        ...     _ = (path / "log").write_text("x")
        >>> path.exists()
        False
    """
    path = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield path
    finally:
        if keep:
            print(f"kept {path}", file=sys.stderr)
        else:
            shutil.rmtree(path, ignore_errors=True)


# --------------------------------------------------------------- the checkout
def git(args: Sequence[str], **kwargs) -> str:
    """``git *args``'s output, stripped; raises :class:`subprocess.CalledProcessError` when it fails."""
    return subprocess.run(["git", *args], check=True, capture_output=True, text=True, **kwargs).stdout.strip()


@dataclasses.dataclass
class Checkout:
    """A pytorch/rl work tree (``bare=False``) or bare git repository (its ``HEAD``), read alike."""

    root: Path
    bare: bool
    commit: str  # "unknown" for a work tree without its .git

    def _git(self, *args: str) -> str:
        return git(["--git-dir", str(self.root), *args])

    def read(self, path: str) -> str:
        """The text of the file at ``path``; raises :class:`OSError` or ``CalledProcessError`` if absent."""
        return self._git("show", f"HEAD:{path}") if self.bare else (self.root / path).read_text()

    def names(self, folder: str) -> list[str]:
        """The names of the entries of ``folder``."""
        if self.bare:
            return [Path(p).name for p in self._git("ls-tree", "--name-only", "HEAD", f"{folder}/").splitlines()]
        return [p.name for p in (self.root / folder).iterdir()]

    def has(self, path: str) -> bool:
        """Whether ``path`` (a file or a folder) is there."""
        if not self.bare:
            return (self.root / path).exists()
        return subprocess.run(["git", "--git-dir", str(self.root), "cat-file", "-e", f"HEAD:{path}"],
                              capture_output=True).returncode == 0

    def copy(self, paths: Sequence[str], into: Path) -> None:
        """Copies those of ``paths`` that are there (files or whole folders) under ``into``, at the same paths."""
        present = [p for p in paths if self.has(p)]
        if self.bare:
            if present:
                archive = subprocess.run(["git", "--git-dir", str(self.root), "archive", "HEAD", *present],
                                         check=True, capture_output=True).stdout
                subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
            return
        for path in present:
            source, target = self.root / path, into / path
            target.parent.mkdir(parents=True, exist_ok=True)
            if source.is_dir():
                shutil.copytree(source, target)
            else:
                shutil.copy2(source, target)


def open_rl(rl_root: Path, holding: str) -> Checkout:
    """``rl_root`` as a :class:`Checkout`: a work tree holding ``holding`` (a path in it), else a git dir whose
    ``HEAD`` holds it (a mirror may lack the config that says core.bare); :class:`ValueError` if neither."""
    if (rl_root / holding).exists():
        try:
            commit = git(["-C", str(rl_root), "rev-parse", "HEAD"])
        except (subprocess.CalledProcessError, FileNotFoundError):
            commit = "unknown"  # a copy without its .git
        return Checkout(rl_root, False, commit)
    try:
        git(["--git-dir", str(rl_root), "cat-file", "-e", f"HEAD:{holding.rstrip('/')}"])
    except (subprocess.CalledProcessError, FileNotFoundError):
        raise ValueError(f"--rl-root must be a pytorch/rl work tree (holding {holding}) or a bare git "
                         f"repository of it, got {str(rl_root)!r}") from None
    return Checkout(rl_root, True, git(["--git-dir", str(rl_root), "rev-parse", "HEAD"]))


# ------------------------------------------------------------- the recipes
RECIPES = Path(__file__).resolve().parents[1] / "recipes"


def recipe_config(name: str, overrides: list[str]):
    """``recipes/config/<name>.yaml`` composed with ``overrides``, as the recipe's command line would.

    Example::

        >>> recipe_config("sac", ["optim.batch_size=512"]).optim.batch_size
        512
    """
    from hydra import compose, initialize_config_dir  # here, so that a script's --help need not load hydra

    with initialize_config_dir(config_dir=str(RECIPES / "config"), version_base="1.3"):
        return compose(config_name=name, overrides=overrides)


def recipe_script(name: str):
    """``recipes/<name>.py``, imported as a module (``recipes/`` put on ``sys.path`` once).

    Example::

        >>> recipe_script("sac").__file__.endswith("recipes/sac.py")
        True
    """
    if str(RECIPES) not in sys.path:
        sys.path.insert(0, str(RECIPES))
    return importlib.import_module(name)


# ------------------------------------------------------- results and figures
def first_error(output: str) -> str | None:
    """The exception line of the last traceback in ``output`` (``Type: message``), or ``None``.

    Later lines may be any later output (warnings, logs), so only the first is taken, unless it ends with ``:``
    (hydra's ``InstantiationException`` before the exception it wraps): then the next lines, joined with `` | ``,
    up to a blank, ``full_key:`` or warning line.

    Examples:
        >>> first_error("ok\\nTraceback (most recent call last):\\n  File \\"a.py\\", line 1\\n"
        ...             "    f()\\nValueError: bad\\n/x.py:3: UserWarning: later output\\n")
        'ValueError: bad'
        >>> first_error("Traceback (most recent call last):\\n  File \\"a.py\\", line 1\\n"
        ...             "hydra.errors.InstantiationException: Error in call to target 'f':\\n"
        ...             "TypeError('no')\\nfull_key: trainer\\n")
        "hydra.errors.InstantiationException: Error in call to target 'f': | TypeError('no')"
        >>> first_error("all good\\n") is None
        True
    """
    lines = output.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("Traceback (most recent call last):")]
    if not starts:
        return None
    rest = lines[starts[-1] + 1:]
    # The frames are indented; the first line that is not is the exception's.
    first = next((i for i, line in enumerate(rest) if line.strip() and not line[0].isspace()), None)
    if first is None:
        return None
    message = [rest[first].strip()]
    for line in rest[first + 1:first + 4] if message[0].endswith(":") else ():
        if not line.strip() or line.startswith("full_key:") or re.match(r"\S+:\d+: \w*Warning", line):
            break
        message.append(line.strip())
    text = " | ".join(message)
    return text[:600] + (" ..." if len(text) > 600 else "")


def percentile_interval(draw: Callable[[random.Random], float], *, level: float = 0.9,
                        draws: int = 10_000) -> tuple[float, float]:
    """The central ``level`` interval of ``draws`` values of ``draw(rng)`` (a percentile bootstrap), with a fixed
    RNG: the same runs give the same interval.

    Examples:
        >>> percentile_interval(lambda rng: rng.choice([1.0, 2.0, 3.0]))
        (1.0, 3.0)
    """
    rng = random.Random(0)
    values = sorted(draw(rng) for _ in range(draws))
    tail = (1 - level) / 2
    return values[int(tail * draws)], values[min(draws - 1, int((1 - tail) * draws))]


def bootstrap_interval(values: list[float], *, statistic: Callable[[list[float]], float] = statistics.fmean,
                       level: float = 0.9, draws: int = 10_000) -> tuple[float, float] | None:
    """A percentile-bootstrap interval of ``statistic`` (the mean) of ``values`` (seeds, rounds); ``None`` below 3.

    Examples:
        >>> bootstrap_interval([1.0, 2.0, 3.0, 4.0, 5.0])
        (2.0, 4.0)
        >>> bootstrap_interval([0.95, 1.0, 1.05, 1.0, 0.97, 0.99, 1.02], statistic=statistics.median)
        (0.97, 1.02)
        >>> bootstrap_interval([1.0, 2.0]) is None
        True
    """
    if len(values) < 3:
        return None
    return percentile_interval(lambda rng: statistic(rng.choices(values, k=len(values))), level=level, draws=draws)


def seed_count(runs: Sized | int) -> str:
    """``"1 seed"``, ``"3 seeds"``: how many runs ``runs`` holds (or is).

    Example::

        >>> seed_count(1), seed_count({0: {}, 1: {}, 2: {}})
        ('1 seed', '3 seeds')
    """
    count = runs if isinstance(runs, int) else len(runs)
    return f"{count} seed" + "s" * (count != 1)


def scalar_rows(path: Path) -> list[tuple[float, float]]:
    """``(frames, value)`` rows of a csv scalar file of the recipes' logger (``<run>/<exp>/scalars/<group>/<name>
    .csv``: ``frames,value`` lines); a line being written is skipped, a file not there yet gives none."""
    rows = []
    for line in path.read_text().splitlines() if path.exists() else ():
        with contextlib.suppress(ValueError):
            frames, value = map(float, line.split(","))
            rows.append((frames, value))
    return rows


def list_table(header: list[str], rows: list[list], widths: list[int] | None = None) -> str:
    """A reStructuredText ``list-table`` of ``rows`` under ``header``.

    Examples:
        >>> print(list_table(["a", "b"], [[1, 2]]), end="")
        .. list-table::
           :header-rows: 1
        <BLANKLINE>
           * - a
             - b
           * - 1
             - 2
    """
    lines = [".. list-table::", "   :header-rows: 1"]
    if widths:
        lines.append("   :widths: " + " ".join(map(str, widths)))
    lines.append("")
    for row in [header, *rows]:
        lines += [f"   * - {row[0]}", *(f"     - {cell}" for cell in row[1:])]
    return "\n".join(lines) + "\n"


@contextlib.contextmanager
def figure(path: Path, title: str, xlabel: str | Sequence[str], ylabel: str | None = None, *,
           size: tuple[float, float] = (6, 4), dpi: int = 100, grid_axis: str = "both", legend: dict | None = None,
           ncols: int = 1) -> Iterator:
    """Yields the axes of a new figure (matplotlib's Agg canvas, no pyplot state); then labels it, draws its grid
    and legend (``legend``: its keyword arguments; ``None``: no legend) and saves it to ``path``, its folder made.

    With ``ncols`` > 1 it yields that many axes side by side, ``xlabel`` one label for each, ``title`` above them all.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=size)
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, ncols, squeeze=False)[0]
    yield axes[0] if ncols == 1 else tuple(axes)
    for ax, label in zip(axes, [xlabel] if ncols == 1 else xlabel, strict=True):
        ax.set(xlabel=label, **({"ylabel": ylabel} if ylabel else {}))
        ax.grid(alpha=0.3, axis=grid_axis)
        if legend is not None:
            ax.legend(**legend)
    (axes[0].set_title if ncols == 1 else fig.suptitle)(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi, metadata={"Software": None})
