"""TorchRL's own collector tests, run with ``OffPolicyCollector`` in place of ``MultiAsyncCollector``.

Run::

    python benchmarks/torchrl_conformance.py --rl-root ~/src/rl                  # a work tree of pytorch/rl

See ``benchmarks/README.md``, section "TorchRL's own collector tests, class rebound". It lists the options and the JSON
line's keys.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import dataclasses
import datetime
import functools
import importlib
import importlib.abc
import importlib.util
import inspect
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

# The runner imports this from benchmarks/ (a script's own folder), the plugin from PYTHONPATH; appended, so
# that the benchmarks' own module names shadow nothing.
if str(Path(__file__).resolve().parent) not in sys.path:
    sys.path.append(str(Path(__file__).resolve().parent))
from common import (  # noqa: E402
    GroupRun,
    git,
    open_rl,
    run_in_own_group,
    shm_entries,
    shm_left,
    torchrl_version,
    with_pythonpath,
    work_dir,
)

BENCHMARKS = Path(__file__).resolve().parent
REPO_ROOT = BENCHMARKS.parent
PLUGIN = Path(__file__).stem
TEST_FILE = "test/test_collectors.py"
#: The test files whose selected tests run: ``TEST_FILE``, which a checkout must hold, then the collector tests of
#: TorchRL's distributed collectors (``collector_class=``: Ray, Distributed, RPC, Sync), run where a checkout has them.
TEST_FILES = (TEST_FILE, "test/test_distributed.py")
#: The class under test, by its current and its legacy name.
TARGET_NAMES = ("MultiAsyncCollector", "MultiaSyncDataCollector")
#: Parametrized variants left out: the synchronous multi-process collector.
LEFT_OUT_NAMES = ("MultiSyncCollector", "MultiSyncDataCollector")
OURS = "OffPolicyCollector"
OUTCOMES = ("passed", "failed", "skipped")

ENV_SIDE = "TORCHRL_CONFORMANCE_SIDE"  # "stock" or "ours"; the plugin is inert without it
ENV_LOG = "TORCHRL_CONFORMANCE_LOG"  # where the plugin appends its events (JSON lines)
ENV_REBIND = "TORCHRL_CONFORMANCE_REBIND"  # "module:name,..." set to our class
ENV_VERIFY = "TORCHRL_CONFORMANCE_VERIFY"  # "name,..." the test module must hold as our class
ENV_MODULES = "TORCHRL_CONFORMANCE_MODULES"  # "name,...": test modules a child process imports after a rebinding


# ------------------------------------------------------------------ selection
def _names_target(nodes: Iterable[ast.AST]) -> bool:
    """Whether any of ``nodes`` (or what they hold) names the class under test, as a name or a whole string."""
    return any(
        (isinstance(node, ast.Name) and node.id in TARGET_NAMES)
        or (isinstance(node, ast.Attribute) and node.attr in TARGET_NAMES)
        or (isinstance(node, ast.alias) and node.name in TARGET_NAMES)
        or (isinstance(node, ast.Constant) and node.value in TARGET_NAMES)  # a parameter naming the class
        for top in nodes for node in ast.walk(top))


def select_tests(source: str) -> dict[str, str]:
    """The tests of ``source`` that use the class under test: ``{"Class::test" or "test": why}``.

    A test (a module-level ``test*`` function or a ``test*`` method of a ``Test*`` class, its own or one it
    inherits from a class of the same module, as pytest collects them) is selected when its code, decorators
    included, names the class (``"function"``) or its class's decorators do (``"class decorator"``); words in
    other strings, docstrings or comments do not count.

    Examples:
        >>> select_tests("class Base:\\n"
        ...              "    @pytest.mark.parametrize('cls', [MultiAsyncCollector, Collector])\\n"
        ...              "    def test_cls(self, cls): ...\\n"
        ...              "    def test_other(self): ...\\n"
        ...              "class TestA(Base): ...\\n")
        {'TestA::test_cls': 'function'}
    """
    selected: dict[str, str] = {}

    def is_test(node: ast.AST) -> bool:
        return isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test")

    body = ast.parse(source).body
    classes = {node.name: node for node in body if isinstance(node, ast.ClassDef)}

    def methods(cls: ast.ClassDef) -> dict[str, ast.AST]:
        """Its test methods by name, those it inherits from this module's classes under its own."""
        found: dict[str, ast.AST] = {}
        for base in reversed(cls.bases):
            if isinstance(base, ast.Name) and base.id in classes and base.id != cls.name:
                found |= methods(classes[base.id])
        return found | {sub.name: sub for sub in cls.body if is_test(sub)}

    for node in body:  # a function's node holds its decorators, arguments and body
        if is_test(node) and _names_target([node]):
            selected[node.name] = "function"
        elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            by_class = _names_target(node.decorator_list)
            for sub in methods(node).values():
                if _names_target([sub]) or by_class:
                    selected[f"{node.name}::{sub.name}"] = "function" if _names_target([sub]) else "class decorator"
    return selected


def rebind_targets(source: str) -> tuple[list[str], list[str]]:
    """Where ``source`` takes the class under test from (``"module:name"``, ``torchrl.collectors``'s always), and
    the names it binds at module level, which the plugin checks.

    Examples:
        >>> rebind_targets("from torchrl.collectors import Collector, MultiAsyncCollector as MAC\\n"
        ...                "from torchrl.collectors.collectors import MultiaSyncDataCollector\\n")
        ... # doctest: +NORMALIZE_WHITESPACE
        (['torchrl.collectors:MultiAsyncCollector', 'torchrl.collectors.collectors:MultiaSyncDataCollector'],
         ['MAC', 'MultiaSyncDataCollector'])
    """
    rebind, bound = ["torchrl.collectors:MultiAsyncCollector"], []
    tree = ast.parse(source)
    # Imports inside functions bind nothing at module level (they still name a module to rebind in).
    local = {id(node) for func in ast.walk(tree) if isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef))
             for node in ast.walk(func)}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and not node.level and node.module:
            for alias in node.names:
                if alias.name in TARGET_NAMES:
                    spec = f"{node.module}:{alias.name}"
                    rebind += [spec] if spec not in rebind else []
                    bound += [alias.asname or alias.name] if id(node) not in local else []
    return rebind, bound


def local_imports(source: str, available: Iterable[str]) -> set[str]:
    """The names of ``available`` (modules of ``test/``: ``"x"`` for ``x.py`` or ``x/``) that ``source`` imports.

    Examples:
        >>> sorted(local_imports("import os\\nfrom mocking_classes import A\\nimport _utils_internal as u\\n",
        ...                      ["mocking_classes", "_utils_internal", "test_envs"]))
        ['_utils_internal', 'mocking_classes']
    """
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names.add(node.module.split(".")[0])
    return names & set(available)


def is_left_out(params: dict[str, Any]) -> bool:
    """Whether a case's parameters make it a ``MultiSyncCollector`` variant (left out of the comparison): a
    parameter that is the class, a subclass, a ``functools.partial`` of one, its name, or a tuple or list holding
    one."""
    def left_out(value: Any) -> bool:
        if isinstance(value, str):
            return value in LEFT_OUT_NAMES
        if isinstance(value, functools.partial):
            return left_out(value.func)
        if inspect.isclass(value):
            return any(cls.__name__ in LEFT_OUT_NAMES for cls in value.__mro__)
        return isinstance(value, (tuple, list)) and any(left_out(item) for item in value)

    return any(left_out(value) for value in params.values())


def canonical_nodeid(nodeid: str) -> str:
    """``nodeid`` with our class name in its parametrization id (``test_y[True-OffPolicyCollector-2]``) written as
    TorchRL's (``test_y[True-MultiAsyncCollector-2]``)."""
    head, bracket, params = nodeid.partition("[")
    return head + bracket + params.replace(OURS, TARGET_NAMES[0])


# ------------------------------------------------------------------ the plugin
# Its hooks record events only in a pytest process that the runner started (ENV_SIDE set).
def _event(**fields: Any) -> None:
    path = os.environ.get(ENV_LOG)
    if path and os.environ.get(ENV_SIDE):
        # One open per event: what was written survives a segfault or a kill.
        with open(path, "a", encoding="utf-8") as log:
            log.write(json.dumps(fields) + "\n")


def _ours() -> type:
    from torchrl_unilab import OffPolicyCollector  # noqa: PLC0415 - only the ours side imports it

    return OffPolicyCollector


def pytest_configure(config: Any) -> None:
    """Plugin hook: on the ``ours`` side, binds our class to the class under test's names before any test module
    is imported (whose ``from torchrl.collectors import MultiAsyncCollector`` then binds our class)."""
    if os.environ.get(ENV_SIDE) == "ours":
        ours = _ours()
        _event(event="rebind", specs=_rebind(ours), target=f"{ours.__module__}.{ours.__qualname__}")


def _rebind(ours: type) -> list[str]:
    """Binds ``ours`` to each name of the class under test (``ENV_REBIND``, and the legacy alias where TorchRL
    has it)."""
    specs = [s for s in os.environ.get(ENV_REBIND, "torchrl.collectors:MultiAsyncCollector").split(",") if s]
    collectors = importlib.import_module("torchrl.collectors")
    specs += [f"torchrl.collectors:{name}" for name in TARGET_NAMES[1:]
              if hasattr(collectors, name) and f"torchrl.collectors:{name}" not in specs]
    for spec in specs:
        module, _, name = spec.partition(":")
        setattr(importlib.import_module(module), name, ours)
    return specs


class _RebindAfterImport(importlib.abc.MetaPathFinder):
    """Rebinds the class under test as soon as ``torchrl.collectors`` has been imported."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != "torchrl.collectors":
            return None
        sys.meta_path.remove(self)  # once, and not for the imports the rebinding makes
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        execute = spec.loader.exec_module

        def exec_module(module: Any) -> None:
            execute(module)
            _rebind(_ours())

        spec.loader.exec_module = exec_module
        return spec


class _RebindBeforeTestModule(importlib.abc.MetaPathFinder):
    """Rebinds the class under test just before one of ``modules`` (a test module) is imported, in a process that
    a test spawned with a function of that module (``test_distributed.py``'s bodies run in ``mp.Process``)."""

    def __init__(self, modules: Sequence[str]) -> None:
        self.modules = set(modules)

    def find_spec(self, name: str, path: Any, target: Any = None) -> None:
        if name not in self.modules:
            return None
        sys.meta_path.remove(self)  # once, and not for the imports the rebinding makes
        _rebind(_ours())
        _event(event="child_rebind", module=name, pid=os.getpid())
        return None  # the usual finders import the module, which then binds our class


def install_script_hook() -> bool:
    """On the ``ours`` side, makes ``torchrl.collectors`` hold our class in the processes a test starts; returns
    whether it did.

    In a ``python -c`` script a test runs (``test_env_that_waits``) it is bound once ``torchrl.collectors`` is
    imported. In a multiprocessing child (spawn, forkserver: a ``-c`` whose code names ``multiprocessing``) it is
    bound only before the test module (``TORCHRL_CONFORMANCE_MODULES``) is imported, as a child that runs a test's
    function imports it: the collector's own workers, which import no test module, are left alone (importing
    ``torchrl_unilab`` while it is being imported would fail). The runner's ``sitecustomize`` calls it.

    Examples:
        >>> install_script_hook()  # outside the runner's ours side
        False
    """
    # sys.argv[0] is "-c" only under ``python -c`` (``-c`` after ``-m pytest`` is pytest's).
    argv = getattr(sys, "orig_argv", [])
    code = argv[argv.index("-c") + 1] if sys.argv[:1] == ["-c"] and "-c" in argv[:-1] else None
    if os.environ.get(ENV_SIDE) != "ours" or code is None:
        return False
    if "multiprocessing" not in code:
        sys.meta_path.insert(0, _RebindAfterImport())
        return True
    modules = [m for m in os.environ.get(ENV_MODULES, "").split(",") if m]
    if not modules:
        return False
    sys.meta_path.insert(0, _RebindBeforeTestModule(modules))
    return True


SITECUSTOMIZE = f"""# Written by {PLUGIN}.py for one run, removed with it.
import importlib.machinery, importlib.util, os, sys
import {PLUGIN}
{PLUGIN}.install_script_hook()
# A sitecustomize this one shadows still runs.
_here = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.machinery.PathFinder.find_spec("sitecustomize", [p for p in sys.path if os.path.abspath(p) != _here])
if _spec is not None and _spec.loader is not None:
    _spec.loader.exec_module(importlib.util.module_from_spec(_spec))
"""


def pytest_collection_modifyitems(session: Any, config: Any, items: list) -> None:
    """Plugin hook: leaves out the ``MultiSyncCollector`` variants and checks the rebinding."""
    side = os.environ.get(ENV_SIDE)
    if side not in ("stock", "ours"):
        return
    kept, dropped = [], []
    for item in items:
        callspec = getattr(item, "callspec", None)
        (dropped if callspec is not None and is_left_out(callspec.params) else kept).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept
    _event(event="collected", kept=[i.nodeid for i in kept], dropped=[i.nodeid for i in dropped])
    names = [n for n in os.environ.get(ENV_VERIFY, "").split(",") if n]
    ours = _ours() if side == "ours" else None
    wrong = []
    for module in {id(m): m for m in (getattr(i, "module", None) for i in kept) if m is not None}.values():
        for name in names:
            value = vars(module).get(name)
            shown = f"{value.__module__}.{value.__qualname__}" if inspect.isclass(value) else repr(value)
            _event(event="bound", module=module.__name__, name=name, value=shown, ours=value is ours)
            if ours is not None and value is not ours:
                wrong.append(f"{module.__name__}.{name} is {shown}")
    if wrong:
        import pytest  # noqa: PLC0415 - the plugin runs inside pytest

        raise pytest.UsageError(f"torchrl_conformance: the rebinding to {OURS} did not take effect: {wrong}")


def pytest_collectreport(report: Any) -> None:
    """Plugin hook: records a collection error (an import error of the test module, say)."""
    if report.failed:
        _event(event="collect_error", nodeid=report.nodeid, error=_exception_line(str(report.longrepr)))


def pytest_runtest_logstart(nodeid: str, location: Any) -> None:
    """Plugin hook: records that a case started (a crash or hang is then blamed on it)."""
    _event(event="start", nodeid=nodeid)


def _exception_line(text: str) -> str:
    """The last ``Type: message`` line of a formatted failure (its last line when none looks like one).

    Examples:
        >>> _exception_line("Traceback (most recent call last):\\n  File \\"t.py\\", line 1\\n"
        ...                 "E   ModuleNotFoundError: No module named 'x'\\n\\nshort summary\\n")
        "ModuleNotFoundError: No module named 'x'"
    """
    lines = [line.removeprefix("E ").strip() for line in text.splitlines() if line.strip()]
    typed = [line for line in lines if re.match(r"[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b", line)]
    return (typed[-1] if typed else (lines[-1] if lines else ""))[:500]


def _first_error(message: str) -> str:
    """The first line of a failure's message; for a failed ``assert a == b`` also the lines pytest adds to say
    what differs, for an error whose message holds a traceback (``test_distributed.py`` re-raises a child's as
    ``Error with stack Traceback ...``) that traceback's exception line, joined with `` | ``.

    Examples:
        >>> _first_error("RuntimeError: Error with stack Traceback (most recent call last):\\n  File 't.py'\\n"
        ...              "AssertionError: tensor([1.])\\n")
        'RuntimeError: Error with stack | AssertionError: tensor([1.])'
    """
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
    shown = lines[:1]
    if lines and lines[0].startswith("AssertionError: assert "):  # the explanation, up to the full diff
        for line in lines[1:5]:
            if line.startswith(("Full diff", "Use -v", "Omitting")):
                break
            shown.append(line)
    elif lines and lines[0].endswith("Traceback (most recent call last):"):
        shown = [lines[0].removesuffix("Traceback (most recent call last):").strip(),
                 _exception_line("\n".join(lines[1:]))]
    return " | ".join(shown)[:500]


def pytest_runtest_logreport(report: Any) -> None:
    """Plugin hook: records each phase's outcome, with the error or the skip reason."""
    error = None
    if report.failed:
        crash = getattr(report.longrepr, "reprcrash", None)
        error = _first_error(crash.message) if crash is not None else _exception_line(str(report.longrepr))
    elif report.skipped and isinstance(report.longrepr, tuple):
        error = str(report.longrepr[2])[:500]
    _event(event="report", nodeid=report.nodeid, when=report.when, outcome=report.outcome,
           xfail=hasattr(report, "wasxfail"), error=error)


def pytest_sessionfinish(session: Any, exitstatus: int) -> None:
    """Plugin hook: records that pytest finished (a process that never gets here died or hung)."""
    _event(event="finish", exitstatus=int(exitstatus))


# ---------------------------------------------------------------- the checkout
def open_tests(rl_root: Path, workdir: Path) -> tuple[Path, str]:
    """Copies the test files (``TEST_FILES``, those ``rl_root`` holds), the ``test/`` modules they need and
    ``pytest.ini`` of ``rl_root`` (a pytorch/rl work tree or bare git repository) into ``workdir / "rl"``, laid out
    as the checkout: ``(that root, commit)``."""
    root = workdir / "rl"
    (root / "test").mkdir(parents=True)
    checkout = open_rl(rl_root, TEST_FILE)
    # the test modules and packages it may import (any folder of a bare repository)
    available = {n.removesuffix(".py") for n in checkout.names("test")
                 if n.endswith(".py") or checkout.bare or checkout.has(f"test/{n}/__init__.py")}
    files = [Path(f).stem for f in TEST_FILES if Path(f).stem in available]
    wanted, todo = {*files, "conftest"}, [*files, "conftest"]
    while todo:  # the local modules they import, and what those import
        name = todo.pop()
        try:
            text = checkout.read(f"test/{name}.py")
        except (OSError, subprocess.CalledProcessError):
            continue  # a package (test/name/): copied whole, not followed
        for found in local_imports(text, available) - wanted:
            wanted.add(found)
            todo.append(found)
    paths = ["pytest.ini"] + [f"test/{n}.py" for n in sorted(wanted)] + [f"test/{n}" for n in sorted(wanted)]
    checkout.copy(paths, root)
    if not (root / TEST_FILE).is_file():
        raise ValueError(f"--rl-root: {TEST_FILE} could not be copied from {str(rl_root)!r}")
    return root, checkout.commit


# -------------------------------------------------------------------- running
@dataclasses.dataclass
class FunctionRun:
    """What one pytest process of one test function gave, in TorchRL's node ids."""

    test: str
    seconds: float
    outcomes: dict[str, str]  # case -> passed / failed / skipped
    errors: dict[str, str]  # case -> the exception line (failed) or the skip reason
    crashed: str | None = None  # why the process died or hung, if it did
    notes: list[str] = dataclasses.field(default_factory=list)


def read_events(path: Path) -> list[dict]:
    """The plugin's events (a line cut short by a kill is dropped)."""
    events = []
    for line in path.read_text(encoding="utf-8").splitlines() if path.exists() else ():
        with contextlib.suppress(json.JSONDecodeError):
            events.append(json.loads(line))
    return events


def outcomes_from_events(events: list[dict], cases: Iterable[str], crash: str | None) -> tuple[dict, dict]:
    """``(outcomes, errors)`` per case (keyed by :func:`canonical_nodeid`) from the plugin's events; ``crash``: the
    error of a case that did not finish. The rules: ``benchmarks/README.md``, section "TorchRL's own collector tests,
    class rebound".
    """
    reports: dict[str, list[dict]] = {}
    started = {canonical_nodeid(e["nodeid"]) for e in events if e["event"] == "start"}
    collect_error = next((e["error"] for e in events if e["event"] == "collect_error"), None)
    for event in events:
        if event["event"] == "report":
            reports.setdefault(canonical_nodeid(event["nodeid"]), []).append(event)
    outcomes, errors = {}, {}
    for case in dict.fromkeys([*cases, *reports]):
        phases = reports.get(case, [])
        failed = next((p for p in phases if p["outcome"] == "failed"), None)
        skipped = next((p for p in phases if p["outcome"] == "skipped"), None)
        finished = any(p["when"] == "teardown" for p in phases)
        if failed is not None:
            outcomes[case], errors[case] = "failed", failed["error"] or f"failed in {failed['when']}"
        elif skipped is not None:
            outcomes[case], errors[case] = "skipped", skipped["error"] or ""
        elif finished and any(p["when"] == "call" and p["outcome"] == "passed" for p in phases):
            outcomes[case] = "passed"
        else:
            outcomes[case] = "failed"
            why = crash or collect_error or "no outcome reported"
            errors[case] = why if case in started else f"not run: {why}"
    return outcomes, errors


def _crash(run: GroupRun, events: list[dict], timeout: float) -> str | None:
    """Why a pytest process died or hung, blamed on the case it was in; ``None`` if pytest finished."""
    finished = any(e["event"] == "finish" for e in events)
    done = {e["nodeid"] for e in events if e["event"] == "report" and e["when"] == "teardown"}
    started = [e["nodeid"] for e in events if e["event"] == "start"]
    current = next((canonical_nodeid(n) for n in reversed(started) if n not in done), None)
    in_case = f" in {current}" if current else ""
    if run.timed_out:
        where = f"in {current}" if current else ("at exit, after its last case" if finished else "outside a case")
        return f"hung: no exit within {timeout:.0f} s ({where}; killed)"
    if run.returncode < 0:
        try:
            name = signal.Signals(-run.returncode).name
        except ValueError:
            name = f"signal {-run.returncode}"
        return f"died: {name}{in_case}"
    if not finished or run.returncode == 3:
        return f"died: exit code {run.returncode}{in_case}" + ("" if finished else " before pytest finished")
    return None


def run_pytest(root: Path, args: Sequence[str], side: str, rundir: Path, timeout: float, *,
               rebind: Sequence[str] = (), verify: Sequence[str] = (), plugin_dir: Path = BENCHMARKS,
               python: str | Path = sys.executable,
               modules: Sequence[str] = ()) -> tuple[list[dict], str | None, float, list[str]]:
    """Runs pytest under ``python`` with the plugin (imported from ``plugin_dir``) in its own process group, its
    output into ``rundir/pytest.log``: ``(events, crash, seconds, notes)``, ``crash`` as :func:`_crash` says. A
    ``side`` other than ``stock`` and ``ours`` only records events. On the ``ours`` side a child process that
    imports one of ``modules`` (the test module, in a process a test spawns) gets the rebinding first."""
    rundir.mkdir(parents=True)
    log_path, events_path = rundir / "pytest.log", rundir / "events.jsonl"
    # The tests' temporary files go with this directory. Short: multiprocessing's sockets live there, and an
    # AF_UNIX path has at most 107 bytes.
    tmp = Path(tempfile.mkdtemp(prefix="tcf_"))
    site = ""
    if side == "ours":  # the rebinding in the scripts the tests run (install_script_hook)
        (tmp / "site").mkdir()
        (tmp / "site" / "sitecustomize.py").write_text(SITECUSTOMIZE)
        site = str(tmp / "site")
    env = with_pythonpath(REPO_ROOT, plugin_dir, site, PYTHONFAULTHANDLER="1", TMPDIR=str(tmp), **{
        ENV_SIDE: side, ENV_LOG: str(events_path), ENV_REBIND: ",".join(rebind), ENV_VERIFY: ",".join(verify),
        ENV_MODULES: ",".join(modules)})
    ini = ["-c", str(root / "pytest.ini")] if (root / "pytest.ini").is_file() else []
    command = [str(python), "-m", "pytest", *ini, "--rootdir", str(root), "-p", PLUGIN, "-p", "no:cacheprovider",
               "-q", *args]
    notes: list[str] = []
    shm_before = shm_entries()
    run = run_in_own_group(command, root, env, log_path, timeout)
    if run.leftovers:
        notes.append(f"{len(run.leftovers)} process(es) of its group alive 10 s after pytest exited, killed: "
                     + "; ".join(f"{pid}: {cmd[:100]}" for pid, cmd in sorted(run.leftovers.items())))
    shutil.rmtree(tmp, ignore_errors=True)
    events = read_events(events_path)
    # multiprocessing's named semaphores (sem.mp-*) come and go with every job on the machine: not counted.
    left = shm_left(shm_before, skip=("sem.mp-",))
    if left:  # maybe another job's: a count and a few names
        notes.append(f"{len(left)} entries left in /dev/shm (made during the run, held by no live process; "
                     f"maybe another job's): {', '.join(left[:3])}{', ...' if len(left) > 3 else ''}")
    return events, _crash(run, events, timeout), run.seconds, notes


def collect_cases(root: Path, tests: Sequence[str], workdir: Path, timeout: float,
                  plugin_dir: Path = BENCHMARKS) -> tuple[dict[str, list[str]], int]:
    """The cases of each test (``"file::Class::test"``; stock side, ``MultiSyncCollector`` variants left out), and
    how many were left out."""
    events, crash, _, _ = run_pytest(root, ["--collect-only", *tests], "stock", workdir / "collect", timeout,
                                     plugin_dir=plugin_dir)
    collected = next((e for e in events if e["event"] == "collected"), None)
    if collected is None:
        errors = [e["error"] for e in events if e["event"] == "collect_error"]
        files = ", ".join(dict.fromkeys(t.split("::")[0] for t in tests))
        raise RuntimeError(f"collecting {files} failed: {crash or errors or 'no collection reported'} "
                           f"(see {workdir / 'collect' / 'pytest.log'} with --keep)")
    cases: dict[str, list[str]] = {t: [] for t in tests}
    for nodeid in collected["kept"]:
        cases.setdefault(nodeid.split("[")[0], []).append(canonical_nodeid(nodeid))
    return cases, len(collected["dropped"])


def run_function(root: Path, test: str, side: str, cases: Sequence[str], workdir: Path, timeout: float, *,
                 rebind: Sequence[str] = (), verify: Sequence[str] = (), plugin_dir: Path = BENCHMARKS) -> FunctionRun:
    """Runs one test function's cases (``test``: ``"file::Class::test"``) on one side in its own pytest process;
    never raises for its failures."""
    module = Path(test.split("::")[0]).stem
    events, crash, seconds, notes = run_pytest(root, [test], side,
                                               workdir / side / test.replace("/", ".").replace("::", "."), timeout,
                                               rebind=rebind, verify=verify, plugin_dir=plugin_dir, modules=[module])
    outcomes, errors = outcomes_from_events(events, cases, crash)
    if side == "ours" and outcomes and verify and not any(e["event"] == "bound" and e["ours"] for e in events):
        notes.append("the rebinding was not confirmed (no module of the run held our class)")
    return FunctionRun(test, seconds, outcomes, errors, crash, notes)


def counts(outcomes: dict[str, str]) -> dict[str, int]:
    """``{"passed": n, "failed": n, "skipped": n}`` of ``{case: outcome}``."""
    return {name: sum(1 for o in outcomes.values() if o == name) for name in OUTCOMES}


def compare(stock: dict[str, str], ours: dict[str, str]) -> tuple[list[str], list[str]]:
    """``(passes with stock, not with ours; passes with ours, not with stock)``, over cases both ran."""
    both = [case for case in stock if case in ours]
    return ([c for c in both if stock[c] == "passed" and ours[c] != "passed"],
            [c for c in both if ours[c] == "passed" and stock[c] != "passed"])


def _unilab_state() -> tuple[str, bool]:
    try:
        commit = git(["-C", str(REPO_ROOT), "rev-parse", "HEAD"])
        dirty = bool(git(["-C", str(REPO_ROOT), "status", "--porcelain", "--", "torchrl_unilab"]))
    except (subprocess.CalledProcessError, FileNotFoundError):
        return "unknown", False
    return commit, dirty


def _match_only(tests: Sequence[str], only: str | None) -> list[str]:
    """The tests whose ``Class::test`` contains one of ``only``'s comma-separated substrings.

    Examples:
        >>> _match_only(["TestA::test_reloading", "TestB::test_keys", "test_c"], "reload,test_c")
        ['TestA::test_reloading', 'test_c']
    """
    if only is None:
        return list(tests)
    wanted = [item.strip() for item in only.split(",") if item.strip()]
    return [t for t in tests if any(w in t for w in wanted)]


def _summary(args: argparse.Namespace, head: dict[str, Any], tests: list[str], cases: dict[str, list[str]],
             results: dict[str, dict[str, FunctionRun]], wall: dict[str, float],
             saved: dict | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(the printed JSON, the saved JSON)``: the latter adds every case's outcome and error per side."""
    outcomes = {side: {c: o for r in runs.values() for c, o in r.outcomes.items()} for side, runs in results.items()}
    errors = {side: {c: e for r in runs.values() for c, e in r.errors.items()} for side, runs in results.items()}
    summary: dict[str, Any] = head | {"stock": None, "ours": None}
    for side, runs in results.items():
        crashed = [t for t, r in runs.items() if r.crashed]
        summary[side] = counts(outcomes[side]) | {"crashed": crashed, "seconds": round(wall.get(side, 0.0), 1)}
    if saved is not None:
        wanted_cases = {c for t in tests for c in cases[t]}
        outcomes["stock"] = {c: o for c, o in saved["outcomes"]["stock"].items() if c in wanted_cases}
        errors["stock"] = {c: e for c, e in saved.get("errors", {}).get("stock", {}).items() if c in outcomes["stock"]}
        summary["stock"] = counts(outcomes["stock"]) | {
            "crashed": [c for c in saved["stock"]["crashed"] if c in tests],
            "seconds": saved["stock"].get("seconds"), "from": str(args.stock_results),
            "missing": len(wanted_cases - set(outcomes["stock"]))}
    primary = summary["ours"] or summary["stock"]
    summary["crashed"] = primary["crashed"] if primary else []
    if "stock" in outcomes and "ours" in outcomes:
        summary["pass_stock_not_ours"], summary["pass_ours_not_stock"] = compare(outcomes["stock"], outcomes["ours"])
    else:
        summary["pass_stock_not_ours"] = summary["pass_ours_not_stock"] = None
    if args.first_errors and "ours" in outcomes:
        summary["first_errors"] = {c: errors["ours"][c] for c, o in outcomes["ours"].items() if o == "failed"}
    functions = [(f"{side}:{t}", r) for side, runs in results.items() for t, r in runs.items()]
    crashes = {key: r.crashed for key, r in functions if r.crashed}
    notes = {key: r.notes for key, r in functions if r.notes}
    summary |= ({"crash_reasons": crashes} if crashes else {}) | ({"notes": notes} if notes else {})
    return summary, summary | {"outcomes": outcomes, "errors": errors}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rl-root", type=Path, required=True,
                        help=f"a pytorch/rl work tree (holding {TEST_FILE}) or a bare git dir (HEAD is used)")
    parser.add_argument("--only", help="comma-separated substrings of 'test/file.py::Class::test_name': run only "
                                       "those functions")
    parser.add_argument("--side", choices=("stock", "ours", "both"), default="both")
    parser.add_argument("--stock-results", type=Path,
                        help="a saved --out of a stock run of the same checkout and torchrl, used instead of "
                             "running the stock side")
    parser.add_argument("--timeout-per-function", type=float, default=300.0,
                        help="seconds per test function before its process group is killed (default 300)")
    parser.add_argument("--out", type=Path, help="save the JSON (with every case's outcome) to this file")
    parser.add_argument("--first-errors", action="store_true",
                        help="add each failing case of ours with its exception line")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory (each run's pytest.log)")
    parser.add_argument("--repeat", type=int, default=1,
                        help="run the selection this many times on each side, alternating; the JSON adds each "
                             "case's passes (a race in a test shows as passes below the runs)")
    args = parser.parse_args(argv)
    if not args.timeout_per_function > 0:
        parser.error(f"--timeout-per-function must be > 0, got {args.timeout_per_function}")
    if args.repeat < 1:
        parser.error(f"--repeat must be >= 1, got {args.repeat}")
    saved = None
    if args.stock_results is not None:
        if args.side == "stock":
            parser.error("--stock-results replaces the stock run: use it with --side ours or both")
        try:
            saved = json.loads(args.stock_results.read_text())
            saved["outcomes"]["stock"]  # noqa: B018 - the file must hold the stock outcomes
        except (OSError, ValueError, KeyError, TypeError) as err:
            parser.error(f"--stock-results must be a file written by --out of a stock run, got "
                         f"{str(args.stock_results)!r} ({type(err).__name__}: {err})")
    sides = [s for s in ("stock", "ours") if args.side in (s, "both") and not (s == "stock" and saved is not None)]

    installed = torchrl_version()
    unilab_commit, unilab_dirty = _unilab_state()
    with work_dir("torchrl_conformance_", args.keep) as workdir:
        try:
            root, commit = open_tests(args.rl_root.expanduser().resolve(), workdir)
        except ValueError as err:
            parser.error(str(err))
        if saved is not None and (saved.get("commit"), saved.get("torchrl")) != (commit, installed):
            parser.error(f"--stock-results {str(args.stock_results)!r} is of commit {saved.get('commit')} with torchrl "
                         f"{saved.get('torchrl')}; this run is of {commit} with torchrl {installed}")
        print(f"torchrl {installed}; checkout {args.rl_root} at commit {commit}; torchrl_unilab "
              f"{REPO_ROOT / 'torchrl_unilab'} at {unilab_commit}{' (modified)' if unilab_dirty else ''}",
              file=sys.stderr, flush=True)
        date = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        if args.out is not None:
            args.out.parent.mkdir(parents=True, exist_ok=True)
        selected, rebind, verify = {}, {}, {}
        for file in [f for f in TEST_FILES if (root / f).is_file()]:
            source = (root / file).read_text()
            selected |= {f"{file}::{t}": why for t, why in select_tests(source).items()}
            rebind[file], verify[file] = rebind_targets(source)
        tests = _match_only(list(selected), args.only)
        if not tests:
            parser.error(f"--only {args.only!r} matches none of the {len(selected)} selected tests: "
                         + ", ".join(selected))
        # The plugin as it is now: edits of this file during a long run do not reach its later functions.
        plugin_dir = workdir / "plugin"
        plugin_dir.mkdir()
        for name in (f"{PLUGIN}.py", "common.py"):
            shutil.copy2(BENCHMARKS / name, plugin_dir / name)
        cases, left_out = collect_cases(root, tests, workdir, max(args.timeout_per_function, 300.0), plugin_dir)
        tests = [t for t in tests if cases.get(t)]
        n_cases = sum(len(cases[t]) for t in tests)
        print(f"{len(tests)} test functions, {n_cases} cases ({left_out} MultiSyncCollector cases left out)",
              file=sys.stderr, flush=True)
        head = {"benchmark": "torchrl_conformance", "torchrl": installed, "commit": commit,
                "unilab_commit": unilab_commit, "unilab_dirty": unilab_dirty, "date": date,
                "selection": {"functions": len(tests), "cases": n_cases, "multisync_cases_left_out": left_out,
                              "files": {file: {"functions": sum(t.startswith(f"{file}::") for t in tests),
                                               "cases": sum(len(cases[t]) for t in tests if t.startswith(f"{file}::"))}
                                        for file in dict.fromkeys(t.split("::")[0] for t in tests)},
                              "by_class_decorator": [t for t in tests if selected[t] == "class decorator"],
                              "only": args.only, "timeout_per_function": args.timeout_per_function}}

        results: dict[str, dict[str, FunctionRun]] = {}
        wall: dict[str, float] = {}
        passes: dict[str, dict[str, int]] = {side: {} for side in sides}
        for number, side in [(number, side) for number in range(args.repeat) for side in sides]:
            results[side], start = {}, time.monotonic()
            for test in tests:
                file = test.split("::")[0]
                run = run_function(root, test, side, cases[test], workdir / f"run{number}", args.timeout_per_function,
                                   rebind=rebind[file], verify=verify[file], plugin_dir=plugin_dir)
                results[side][test] = run
                for case, outcome in run.outcomes.items():
                    passes[side][case] = passes[side].get(case, 0) + (outcome == "passed")
                c = counts(run.outcomes)
                print(f"[{side}] {test}: {c['passed']} passed, {c['failed']} failed, {c['skipped']} skipped "
                      f"({run.seconds:.0f} s)" + (f" CRASHED: {run.crashed}" if run.crashed else "")
                      + "".join(f" [{note}]" for note in run.notes), file=sys.stderr, flush=True)
                wall[side] = time.monotonic() - start
                if args.out is not None:  # what is done so far survives an interrupted run
                    _, partial = _summary(args, head, tests, cases, results, wall, saved)
                    args.out.write_text(json.dumps(partial | {"complete": False}, indent=1) + "\n")

        summary, full = _summary(args, head, tests, cases, results, wall, saved)
        if args.repeat > 1:  # the outcomes above are the last run's
            summary["repeats"] = full["repeats"] = {"runs": args.repeat, "passed": passes}
        print(json.dumps(summary), flush=True)
        if args.out is not None:
            args.out.write_text(json.dumps(full, indent=1) + "\n")
    return 0 if not summary["crashed"] and not summary["pass_stock_not_ours"] else 1


if __name__ == "__main__":
    sys.exit(main())
