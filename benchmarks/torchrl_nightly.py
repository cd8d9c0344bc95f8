"""TorchRL's and tensordict's nightly builds, with the torch they resolve, run against this package in a scratch venv.

Run::

    python benchmarks/torchrl_nightly.py --rl-root ~/src/rl --out benchmarks/results/nightly/<name>.json

See ``benchmarks/README.md``, section "The next TorchRL: nightly builds". It lists the options, what each venv runs
and the JSON's keys; ``benchmarks/report.py`` renders the results file into ``docs/install.rst`` (:func:`rst`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from unittest import mock

if str(Path(__file__).resolve().parent) not in sys.path:
    sys.path.append(str(Path(__file__).resolve().parent))
from common import git, list_table, provenance, run_captured, run_in_own_group, work_dir  # noqa: E402
from torchrl_conformance import _unilab_state, compare, counts, outcomes_from_events, run_pytest  # noqa: E402

BENCHMARKS = Path(__file__).resolve().parent
REPO_ROOT = BENCHMARKS.parent
RESULTS = BENCHMARKS / "results"
#: The distributions that pyproject.toml pins to one TorchRL release; the nightly stack replaces them.
PINNED = ("torch", "torchrl", "tensordict")
NIGHTLY = ("torchrl-nightly", "tensordict-nightly")
#: The collector, the drop-in, TorchRL's weight-sync schemes on our transport, and the buffer's C++ segment trees.
DEFAULT_TESTS = ("tests/test_collector.py", "tests/test_dropin.py", "tests/test_dropin_weight_sync.py",
                 "tests/test_prioritized_sampler.py")
#: What the stable stack on the newer torch runs: the C++ extension's trees, and one collector run.
QUICK_TESTS = ("tests/test_prioritized_sampler.py", "tests/test_collector.py::test_integrity_and_ring_wraparound")
#: pip's environment for every install: an empty constraints file replaces any that pip's configuration names (a
#: machine-wide cap on torch would force the old stack back); the rest of the configuration still applies.
PIP_ENV = {"PIP_CONSTRAINT": os.devnull}
STACKS = ("nightly", "stable")
#: Run in each venv: the versions its modules report, and whether torchrl's C++ extension loads and builds a sampler.
PROBE = """
import json
out = {}
try:
    import tensordict, torch, torchrl
    out["versions"] = {"torch": torch.__version__, "torchrl": torchrl.__version__,
                       "tensordict": tensordict.__version__}
    out["cuda"] = torch.version.cuda
    from torchrl import _torchrl
    from torchrl.data import PrioritizedSampler
    PrioritizedSampler(8, alpha=0.6, beta=0.4)
    out["extension"] = {"loaded": True, "error": None}
except Exception as err:
    out["extension"] = {"loaded": False, "error": f"{type(err).__name__}: {err}"[:500]}
print(json.dumps(out))
"""


# ------------------------------------------------------------------ what to install
def project_requirements(pyproject: Path = REPO_ROOT / "pyproject.toml",
                         extras: Sequence[str] = ("test",)) -> tuple[list[str], list[str]]:
    """``(pinned, others)``: pyproject.toml's requirements on :data:`PINNED`, and the rest of its dependencies with
    those of ``extras``.

    Example::

        >>> pinned, others = project_requirements()
        >>> sorted(re.match(r"[\\w-]+", r).group() for r in pinned)
        ['tensordict', 'torch', 'torchrl']
        >>> any(r.startswith("pytest") for r in others), any(r.startswith("torch") for r in others)
        (True, False)
    """
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    project = tomllib.loads(pyproject.read_text())["project"]
    requirements = list(project["dependencies"])
    for extra in extras:
        requirements += project.get("optional-dependencies", {})[extra]
    pinned = [r for r in requirements if _name(r) in PINNED]
    return pinned, [r for r in requirements if _name(r) not in PINNED]


def _name(requirement: str) -> str:
    return re.match(r"[A-Za-z0-9._-]+", requirement).group().lower().replace("_", "-")


def stack_requirements(stack: str, torch: str | None, pinned: Sequence[str]) -> list[str]:
    """What a stack installs: the nightlies (``"nightly"``) or pyproject's pins of torchrl and tensordict
    (``"stable"``), with ``torch`` (a version such as ``2.15.0``; ``None``: what they resolve, nightly only).

    Examples:
        >>> stack_requirements("nightly", None, ["torch>=2.14,<2.15", "torchrl==0.14.1"])
        ['torchrl-nightly', 'tensordict-nightly']
        >>> stack_requirements("stable", "2.15.0", ["torch>=2.14,<2.15", "torchrl==0.14.1", "tensordict<0.15"])
        ['torchrl==0.14.1', 'tensordict<0.15', 'torch==2.15.0']
    """
    if stack == "nightly":
        base = list(NIGHTLY)
    elif torch is None:
        raise ValueError("the stable stack needs a torch version (the nightly's, or --stable-torch)")
    else:
        base = [r for r in pinned if _name(r) != "torch"]
    return base + ([f"torch=={torch}"] if torch else [])


def pip_commands(python: Path, requirements: Sequence[str], others: Sequence[str],
                 repo: Path = REPO_ROOT) -> list[list[str]]:
    """The pip commands that fill a venv (run with :data:`PIP_ENV`): the stack and this package's other
    requirements in one resolve, then this checkout without its dependencies, whose pins would force the stack back.

    Example::

        >>> for command in pip_commands(Path("v/bin/python"), ["torchrl-nightly"], ["numpy"], Path("/repo")):
        ...     print(" ".join(command))
        v/bin/python -m pip install torchrl-nightly numpy
        v/bin/python -m pip install --no-deps -e /repo
    """
    pip = [str(python), "-m", "pip"]
    return [[*pip, "install", *requirements, *others], [*pip, "install", "--no-deps", "-e", str(repo)]]


# ------------------------------------------------------------------ the venv
def venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


@contextlib.contextmanager
def activated(venv: Path) -> Iterator[None]:
    """``os.environ`` as in ``venv`` activated (its ``bin`` first on ``PATH``), for what starts a process in it."""
    with mock.patch.dict(os.environ, {"VIRTUAL_ENV": str(venv),
                                      "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"}):
        os.environ.pop("PYTHONHOME", None)
        yield


def _step(command: Sequence[str], log: Path, timeout: float, env: dict | None = None) -> tuple[int, str]:
    """Runs ``command``, appends its output to ``log``: ``(exit code, the output's last lines)``; a timeout is
    exit code 124."""
    start = time.monotonic()
    try:
        proc = run_captured(command, timeout=timeout, env=env, cwd=REPO_ROOT)
        code, output = proc.returncode, proc.stdout + proc.stderr
    except FileNotFoundError as err:
        code, output = 127, str(err)
    except subprocess.TimeoutExpired:
        code, output = 124, f"timed out after {timeout:.0f} s"
    with log.open("a") as f:
        f.write(f"$ {' '.join(command)}  # exit {code}, {time.monotonic() - start:.0f} s\n{output}\n")
    return code, "\n".join(output.strip().splitlines()[-12:])


def install(venv: Path, requirements: Sequence[str], others: Sequence[str], log: Path, timeout: float) -> dict:
    """Makes ``venv`` (kept if it is one already) and installs ``requirements`` with this package into it:
    ``{"seconds", "error", "freeze", "pip_check"}``."""
    start = time.monotonic()
    out: dict = {"error": None}
    if not venv_python(venv).exists():
        code, tail = _step([sys.executable, "-m", "venv", str(venv)], log, timeout)
        if code:
            return out | {"error": f"python -m venv failed: {tail}", "seconds": round(time.monotonic() - start, 1)}
    env = {**os.environ, **PIP_ENV}
    for command in pip_commands(venv_python(venv), requirements, others):
        code, tail = _step(command, log, timeout, env)
        if code:
            out["error"] = f"{' '.join(command[3:])} failed (exit {code}): {tail[-1500:]}"
            break
    freeze = run_captured([str(venv_python(venv)), "-m", "pip", "freeze"], timeout=120, env=env)
    out["freeze"] = [line for line in freeze.stdout.splitlines() if line.strip()]
    check = run_captured([str(venv_python(venv)), "-m", "pip", "check"], timeout=120, env=env)
    out["pip_check"] = [line for line in check.stdout.splitlines() if line.strip()]
    out["seconds"] = round(time.monotonic() - start, 1)
    return out


def probe(python: Path) -> dict:
    """What :data:`PROBE` prints in the venv of ``python``."""
    proc = run_captured([str(python), "-c", PROBE], timeout=300, cwd=REPO_ROOT)
    try:
        return json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        return {"extension": {"loaded": False, "error": (proc.stderr.strip().splitlines() or ["no output"])[-1]}}


# ------------------------------------------------------------------ the runs
def by_file(tests: Sequence[str]) -> dict[str, list[str]]:
    """``tests`` (files and node ids) grouped by their file, in order.

    Example::

        >>> by_file(["tests/a.py::t1", "tests/b.py", "tests/a.py::t2"])
        {'tests/a.py': ['tests/a.py::t1', 'tests/a.py::t2'], 'tests/b.py': ['tests/b.py']}
    """
    files: dict[str, list[str]] = {}
    for test in tests:
        files.setdefault(test.split("::")[0], []).append(test)
    return files


def _pytest(python: Path, targets: Sequence[str], rundir: Path, timeout: float,
            root: Path) -> tuple[dict, dict, str | None, float]:
    """``targets`` in one pytest process under ``python`` in ``root`` (the conformance runner's ``run_pytest``, whose
    plugin records each case by its node id): ``(outcomes, errors, crash, seconds)``."""
    # tmp_path in a short folder, as under pytest's default: a test that makes it TMPDIR gets its fork server's
    # socket there, and an AF_UNIX path has at most 107 bytes
    with tempfile.TemporaryDirectory(prefix="tnb_", ignore_cleanup_errors=True) as basetemp:
        events, crash, seconds, _ = run_pytest(root, [*targets, "--basetemp", basetemp], "unilab", rundir, timeout,
                                               python=python)
    outcomes, errors = outcomes_from_events(events, [], crash)
    return outcomes, errors, crash, seconds


def run_tests(python: Path, tests: Sequence[str], workdir: Path, timeout: float, rerun: bool = True,
              root: Path = REPO_ROOT) -> tuple[dict, dict, dict]:
    """Each file of ``tests`` (paths under ``root``) in its own pytest process under ``python``, then (``rerun``) its
    failed cases once more, together in another: ``(per file {"passed", "failed", "skipped", "seconds",
    "crashed"}, {node id: its error} of each failed case, {node id: "passed", "failed", "skipped" or "not run"} of
    each case run again)``. The counts are the first run's."""
    files, failures, reruns = {}, {}, {}
    for file, targets in by_file(tests).items():
        rundir = workdir / file.replace("/", ".")
        outcomes, errors, crash, seconds = _pytest(python, targets, rundir, timeout, root)
        files[file] = counts(outcomes) | {"seconds": round(seconds, 1), "crashed": crash}
        failed = {case: errors[case] for case, outcome in outcomes.items() if outcome == "failed"}
        failures |= failed
        c = files[file]
        print(f"  {file}: {c['passed']} passed, {c['failed']} failed, {c['skipped']} skipped ({seconds:.0f} s)"
              + (f" CRASHED: {crash}" if crash else ""), file=sys.stderr, flush=True)
        if rerun and failed:
            again, _, _, _ = _pytest(python, list(failed), rundir.with_name(rundir.name + ".rerun"), timeout, root)
            reruns |= {case: again.get(case, "not run") for case in failed}
            print(f"  {file}, its failed cases again: " + ", ".join(f"{case.split('::', 1)[-1]} {reruns[case]}"
                                                                     for case in failed), file=sys.stderr, flush=True)
    return files, failures, reruns


def reference_conformance(files: Sequence[str], results: Path = RESULTS / "conformance") -> tuple[str | None, dict]:
    """The latest full run of our class in ``results`` (no ``--only``, no ``--repeat``) that ran each test file of
    ``files``: ``(its file name, its outcome per case)``; ``(None, {})`` without one."""
    runs = []
    for path in sorted(results.glob("*.json")):
        data = json.loads(path.read_text())
        if data.get("ours") and not data.get("repeats") and not (data.get("selection") or {}).get("only"):
            outcomes = (data.get("outcomes") or {}).get("ours") or {}
            if set(files) <= {case.split("::")[0] for case in outcomes}:
                runs.append((str(data.get("date", "")), path.name, outcomes))
    if not runs:
        return None, {}
    _, name, outcomes = max(runs)
    return name, outcomes


def run_conformance(python: Path, rl_root: Path, workdir: Path, side: str, only: str | None,
                    timeout_per_function: float) -> dict:
    """``benchmarks/torchrl_conformance.py`` under ``python`` (``--side``, ``--first-errors``): its saved JSON, with
    the cases that pass in the reference run of :func:`reference_conformance` and fail here."""
    out = workdir / "conformance.json"
    command = [str(python), str(BENCHMARKS / "torchrl_conformance.py"), "--rl-root", str(rl_root), "--side", side,
               "--first-errors", "--timeout-per-function", str(timeout_per_function), "--out", str(out)]
    command += ["--only", only] if only else []
    run = run_in_own_group(command, REPO_ROOT, dict(os.environ), workdir / "conformance.log", 6 * 3600)
    if not out.exists():
        log = (workdir / "conformance.log").read_text(errors="replace").strip().splitlines()
        return {"error": f"exit code {run.returncode}: {(log or ['no output'])[-1]}", "seconds": round(run.seconds)}
    data = json.loads(out.read_text())
    mine = data["outcomes"].get("ours", {})
    reference, outcomes = reference_conformance(sorted({case.split("::")[0] for case in mine}))
    data["reference"] = reference
    data["pass_reference_not_here"], data["pass_here_not_reference"] = compare(outcomes, mine)
    return data


def run_stack(stack: str, requirements: list[str], others: list[str], venv: Path, workdir: Path,
              tests: Sequence[str], args: argparse.Namespace) -> dict:
    """One stack in its venv: the install, the probe, ``tests`` and (``rl_root`` given, nightly only) the
    conformance selection."""
    start = time.monotonic()
    workdir.mkdir(parents=True, exist_ok=True)
    print(f"[{stack}] installing {' '.join(requirements)} into {venv}", file=sys.stderr, flush=True)
    entry: dict = {"requirements": requirements, "venv_reused": venv_python(venv).exists()}
    entry["install"] = install(venv, requirements, others, workdir / "pip.log", args.install_timeout)
    if entry["install"]["error"]:
        print(f"[{stack}] install failed: {entry['install']['error']}", file=sys.stderr, flush=True)
        return entry | {"seconds": round(time.monotonic() - start, 1)}
    python = venv_python(venv)
    with activated(venv):
        entry |= probe(python)
        print(f"[{stack}] {json.dumps(entry.get('versions'))}, extension: {entry['extension']}", file=sys.stderr,
              flush=True)
        entry["tests"], entry["failures"], entry["reruns"] = run_tests(python, tests, workdir / "tests",
                                                                       args.timeout_per_file, rerun=args.rerun)
        if stack == "nightly" and args.rl_root is not None:
            print(f"[{stack}] TorchRL's collector tests from {args.rl_root}", file=sys.stderr, flush=True)
            entry["conformance"] = run_conformance(python, args.rl_root, workdir, args.conformance_side,
                                                   args.conformance_only, args.timeout_per_function)
    entry["seconds"] = round(time.monotonic() - start, 1)
    return entry


def passes(entry: dict) -> bool:
    """Whether a stack installed, its extension loaded, no test file crashed and each case that failed passed when
    run again.

    Examples:
        >>> ok = {"install": {"error": None}, "extension": {"loaded": True},
        ...       "tests": {"tests/a.py": {"failed": 1, "crashed": None}}, "failures": {"tests/a.py::t": "E"}}
        >>> passes(ok | {"reruns": {"tests/a.py::t": "passed"}}), passes(ok | {"reruns": {"tests/a.py::t": "failed"}})
        (True, False)
    """
    reruns = entry.get("reruns") or {}
    return (not entry.get("install", {}).get("error") and entry.get("extension", {}).get("loaded", False)
            and bool(entry.get("tests")) and not any(f["crashed"] for f in entry["tests"].values())
            and all(reruns.get(case) == "passed" for case in entry.get("failures") or {}))


# ------------------------------------------------------------------ the results file and its page
def rl_state(rl_root: Path | None) -> dict | None:
    """The pytorch/rl checkout's commit and commit date (``None`` without one)."""
    if rl_root is None:
        return None
    try:
        spec = ["-C", str(rl_root)] if (rl_root / ".git").exists() else ["--git-dir", str(rl_root)]
        commit, date = git([*spec, "log", "-1", "--format=%H %cs"]).split()
    except (OSError, ValueError, subprocess.CalledProcessError):
        return {"commit": "unknown", "date": None}
    return {"commit": commit, "date": date}


def summary(data: dict) -> dict:
    """The JSON line printed: versions, each stack's counts and whether it passes, the wall time.

    Example::

        >>> summary({"benchmark": "torchrl_nightly", "date": "d", "wall_seconds": 5.0, "stacks": {"nightly": {
        ...     "versions": {"torch": "2.15.0"}, "extension": {"loaded": True}, "install": {"error": None},
        ...     "tests": {"tests/a.py": {"passed": 2, "failed": 0, "skipped": 1, "crashed": None}}}}})["stacks"]
        ... # doctest: +NORMALIZE_WHITESPACE
        {'nightly': {'versions': {'torch': '2.15.0'}, 'extension': True, 'passes': True,
                     'tests': {'tests/a.py': [2, 0, 1]}, 'reruns': {}}}
    """
    stacks = {}
    for name, entry in data["stacks"].items():
        s = {"versions": entry.get("versions"), "extension": entry.get("extension", {}).get("loaded"),
             "passes": passes(entry),
             "tests": {f: [c["passed"], c["failed"], c["skipped"]] for f, c in entry.get("tests", {}).items()},
             "reruns": entry.get("reruns") or {}}
        if entry.get("install", {}).get("error"):
            s["install_error"] = entry["install"]["error"][:300]
        conformance = entry.get("conformance")
        if conformance:
            s["conformance"] = conformance.get("ours") or conformance.get("error")
            s["conformance_pass_reference_not_here"] = conformance.get("pass_reference_not_here")
        stacks[name] = s
    return {key: data[key] for key in ("benchmark", "date", "wall_seconds")} | {"stacks": stacks}


STACK_LABELS = {"nightly": "``torchrl-nightly``, ``tensordict-nightly``",
                "stable": "this package's pins of torchrl and tensordict"}


def rst(runs: list[dict]) -> str:
    """The install page's section from the nightly results files (oldest first): one column per stack, from the
    latest file that ran it, with its versions, its verdict and each test file's counts; then the failing cases,
    the conformance selection against its reference run, and each file's command.

    Example::

        >>> run = {"benchmark": "torchrl_nightly", "date": "2026-01-02", "_file": "nightly/x.json", "machine": "CPU",
        ...        "command": "python benchmarks/torchrl_nightly.py --out /tmp/x.json", "stacks": {"nightly": {
        ...        "versions": {"torch": "2.15.0", "torchrl": "2026.1.1", "tensordict": "2026.1.1"},
        ...        "install": {"error": None}, "extension": {"loaded": True}, "failures": {},
        ...        "tests": {"tests/a.py": {"passed": 3, "failed": 0, "skipped": 1, "crashed": None}}}}}
        >>> text = rst([run])
        >>> "torchrl 2026.1.1" in text and "3 passed, 0 failed, 1 skipped" in text and "**passes**" in text
        True
        >>> rst([]).startswith("**not yet measured**")
        True
    """
    if not runs:
        return ("**not yet measured** (``python benchmarks/torchrl_nightly.py --rl-root <pytorch/rl checkout> --out "
                "benchmarks/results/nightly/<name>.json``).\n")
    latest = {name: run for run in runs for name in run["stacks"]}  # each stack from the latest file that ran it
    stacks = {name: run["stacks"][name] for name, run in latest.items()}
    files = list(dict.fromkeys(f for entry in stacks.values() for f in entry.get("tests", {})))
    conformance = stacks.get("nightly", {}).get("conformance")
    rows = [["resolved", *(", ".join(f"{k} {(e.get('versions') or {})[k]}" for k in PINNED
                                     if (e.get("versions") or {}).get(k)) or "-" for e in stacks.values())],
            ["install, C++ extension, our tests", *(_verdict(entry) for entry in stacks.values())],
            *([f"``{f}``", *(_counts(entry.get("tests", {}).get(f)) for entry in stacks.values())] for f in files)]
    if conformance and "error" not in conformance:
        c = conformance["ours"]
        rows.append(["TorchRL's collector tests, our class", *(
            f"{c['passed']} passed, {c['failed']} failed, {c['skipped']} skipped" if name == "nightly" else "not run"
            for name in stacks)])
    rows.append(["measured", *(f"{run['date']}, ``{run['_file']}``" for run in latest.values())])
    out = list_table(["stack", *(STACK_LABELS.get(name, name) for name in stacks)], rows)
    failures = [(name, case, error) for name, entry in stacks.items()
                for case, error in entry.get("failures", {}).items()]
    if failures:
        again = {"passed": " (passed when run again)", "failed": " (failed again)"}
        out += "\nFailing cases:\n\n" + "".join(
            f"* {name}: ``{case}``: {_cell(error)}{again.get(stacks[name].get('reruns', {}).get(case), '')}\n"
            for name, case, error in failures)
    if conformance and "error" not in conformance:
        rl = latest["nightly"].get("rl") or {}
        tested = ", ".join(f"``{f}``" for f in conformance.get("selection", {}).get("files") or
                           ["test/test_collectors.py"])
        committed = f", committed {rl['date']}" if rl.get("date") else ""
        out += (f"\nTorchRL's collector tests: those of {tested} that take ``MultiAsyncCollector``, run with "
                f"``OffPolicyCollector`` in its place (pytorch/rl ``{str(conformance.get('commit', '?'))[:9]}``"
                f"{committed}; {len(c.get('crashed') or [])} crashed).")
        lost = conformance.get("pass_reference_not_here") or []
        if conformance.get("reference"):
            out += (f" Against the run of the pinned release (``benchmarks/results/conformance/"
                    f"{conformance['reference']}``), {len(lost)} case{'s' * (len(lost) != 1)} that passed there "
                    f"fail{'s' * (len(lost) == 1)} on the nightly" + (":" if lost else "."))
        out += "\n" + ("\n" if lost else "")
        errors = conformance.get("first_errors") or {}
        out += "".join(f"* ``{case.split('::', 1)[-1]}``: {_cell(errors.get(case, ''))}\n" for case in lost)
    elif conformance:
        out += f"\nTorchRL's collector tests on the nightly stack did not run: {_cell(conformance['error'])}\n"
    out += "\nMeasured with:\n\n"
    for run in {id(run): run for run in latest.values()}.values():  # each file once
        command = re.sub(r"--rl-root\s+\S+", "--rl-root <pytorch/rl checkout>", run["command"])
        command = re.sub(r"\s*--venv\s+\S+", "", command)  # where the venvs were kept
        command = re.sub(r"--out\s+\S+", f"--out benchmarks/results/{run['_file']}", command)
        out += f"* ``{command}``; measured {run['date']} on a {run['machine']}.\n"
    return out


def _verdict(entry: dict) -> str:
    if entry.get("install", {}).get("error"):
        return f"install fails: {_cell(entry['install']['error'])}"
    if not entry.get("extension", {}).get("loaded"):
        return f"C++ extension fails: {_cell(entry['extension'].get('error'))}"
    again = sum(outcome == "passed" for outcome in (entry.get("reruns") or {}).values())
    return ("**passes**" if passes(entry) else "**fails**") + (
        f" ({again} failed case{'s' * (again != 1)} passed when run again)" if again else "")


def _counts(c: dict | None) -> str:
    if c is None:
        return "not run"
    crashed = " (crashed)" if c["crashed"] else ""
    return f"{c['passed']} passed, {c['failed']} failed, {c['skipped']} skipped{crashed}"


def _cell(text: str | None) -> str:
    """``text`` on one line, at most 160 characters, an absolute path as its last part, with no reST markup of its own.

    Example::

        >>> _cell("OSError: `x` missing in /tmp/tcf_1/a.py\\nsecond line")
        "OSError: 'x' missing in a.py second line"
    """
    text = re.sub(r"(?<![\w.~<-])/(?:[^\s/:'\"]+/)+", "", " ".join(str(text or "").split()))
    return text[:160].replace("`", "'").replace("*", "\\*").replace("|", "\\|")


# ------------------------------------------------------------------ the command line
def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line, checked.

    Example::

        >>> args = parse_args(["--stacks", "nightly"])
        >>> args.tests == list(DEFAULT_TESTS), args.rl_root, args.keep
        (True, None, False)
    """
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--venv", type=Path,
                        help="the folder of the venvs, one per stack (<venv>/nightly, <venv>/stable), made if "
                             "missing and reused if there, never removed (default: a temporary folder, removed "
                             "at the end unless --keep)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder (venvs and logs)")
    parser.add_argument("--rl-root", type=Path,
                        help="a pytorch/rl work tree or bare git dir: run its test/test_collectors.py's selection "
                             "(benchmarks/torchrl_conformance.py) on the nightly stack; none: not run")
    parser.add_argument("--tests", nargs="+", default=list(DEFAULT_TESTS),
                        help="this package's tests on the nightly stack, files or node ids (default: "
                             + " ".join(DEFAULT_TESTS) + ")")
    parser.add_argument("--quick-tests", nargs="+", default=list(QUICK_TESTS),
                        help="the tests on the stable stack (default: " + " ".join(QUICK_TESTS) + ")")
    parser.add_argument("--stacks", nargs="+", choices=STACKS, default=list(STACKS),
                        help="nightly: torchrl-nightly and tensordict-nightly; stable: pyproject's torchrl and "
                             "tensordict pins on the torch the nightly resolved (or --stable-torch)")
    parser.add_argument("--torch", help="a torch version for the nightly stack (default: what pip resolves)")
    parser.add_argument("--stable-torch", help="the torch version of the stable stack (default: the nightly's)")
    parser.add_argument("--conformance-side", choices=("ours", "both"), default="ours",
                        help="ours: our class only; both: TorchRL's class too (about four times longer)")
    parser.add_argument("--conformance-only", help="torchrl_conformance.py's --only")
    parser.add_argument("--timeout-per-file", type=float, default=1200.0,
                        help="seconds per test file's pytest process (default 1200)")
    parser.add_argument("--timeout-per-function", type=float, default=300.0,
                        help="torchrl_conformance.py's --timeout-per-function (default 300)")
    parser.add_argument("--install-timeout", type=float, default=1800.0, help="seconds per pip command")
    parser.add_argument("--no-rerun", dest="rerun", action="store_false",
                        help="do not run a file's failed cases again (by default they run once more, together, and a "
                             "stack passes when each of them passed then)")
    parser.add_argument("--out", type=Path, help="write the results file here (benchmarks/results/nightly/)")
    args = parser.parse_args(argv)
    if args.stacks == ["stable"] and args.stable_torch is None:
        parser.error("--stacks stable alone needs --stable-torch (the default is the torch the nightly resolves)")
    if args.rl_root is not None:
        args.rl_root = args.rl_root.expanduser().resolve()
        if not args.rl_root.exists():
            parser.error(f"--rl-root must be a pytorch/rl work tree or bare git dir, got {str(args.rl_root)!r}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    pinned, others = project_requirements()
    load_start, start = round(os.getloadavg()[0], 2), time.monotonic()
    commit, dirty = _unilab_state()
    data: dict = {"pip_env": PIP_ENV, "rl": rl_state(args.rl_root), "unilab": {"commit": commit, "dirty": dirty},
                  "pinned": pinned, "others": others, "stacks": {}}
    with work_dir("torchrl_nightly_", args.keep) as workdir:
        root = args.venv.expanduser().resolve() if args.venv else workdir / "venv"
        stable_torch = args.stable_torch
        for stack in args.stacks:
            if stack == "stable" and stable_torch is None:
                stable_torch = (data["stacks"].get("nightly", {}).get("versions") or {}).get("torch")
                if stable_torch is None:
                    data["stacks"]["stable"] = {"install": {"error": "no torch version: the nightly stack did not "
                                                                     "install (give --stable-torch)"}}
                    continue
                stable_torch = stable_torch.split("+")[0]
            requirements = stack_requirements(stack, args.torch if stack == "nightly" else stable_torch, pinned)
            tests = args.tests if stack == "nightly" else args.quick_tests
            data["stacks"][stack] = run_stack(stack, requirements, others, root / stack, workdir / stack, tests, args)
    data = provenance("torchrl_nightly", load_start, round(os.getloadavg()[0], 2),
                      argv=None if argv is None else list(argv)) | data
    nightly = data["stacks"].get("nightly", {}).get("versions") or {}
    data["torch"] = nightly.get("torch", data["torch"])  # the nightly stack's, not this process's
    data["wall_seconds"] = round(time.monotonic() - start, 1)
    print(json.dumps(summary(data)), flush=True)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(data, indent=1) + "\n")
    return 0 if all(passes(entry) for entry in data["stacks"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
