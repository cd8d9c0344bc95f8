"""The Python versions the package installs and passes on: a fresh venv each, README's install line, the quick start
and a subset of the tests.

Run: ``python benchmarks/python_versions.py --python 3.11 3.12 3.13 --out
benchmarks/results/install/python_versions.json``

See ``benchmarks/README.md``, section "Python versions", for what each venv runs and the JSON's keys. ``--out``
writes :func:`results_file`; ``benchmarks/report.py`` renders it into ``docs/install.rst``'s versions table.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path

from common import first_error, git, provenance, run_captured, work_dir

ROOT = Path(__file__).resolve().parents[1]
#: The collector, the shared buffer, the weights and a short recipe run (TD3 on Pendulum-v1, resumed).
SUBSET = (
    "tests/test_collector.py",
    "tests/test_worker_api.py",
    "tests/test_prioritized_sampler.py",
    "tests/test_dropin_weight_sync.py",
    "tests/test_recipes.py::test_td3_runs_end_to_end_and_resumes",
)
#: What ``--wheel`` runs in a fresh venv that has the wheel and torch only, from outside the checkout: a short
#: collection into ``make_replay_buffer`` with a weight publish per batch. Prints where the package came from, the
#: rows written, the policy version and a sampled action's shape.
WHEEL_RUN = """\
import torch
from tensordict.nn import TensorDictModule

import torchrl_unilab
from torchrl_unilab import OffPolicyCollector, make_replay_buffer

if __name__ == "__main__":
    policy = TensorDictModule(torch.nn.Linear(3, 1), in_keys=["observation"], out_keys=["action"])
    rb = make_replay_buffer(capacity=1024, batch_size=32)
    with OffPolicyCollector("Pendulum-v1", policy, num_workers=1, num_envs=4, frames_per_batch=64,
                            total_frames=256, replay_buffer=rb, seed=0) as collector:
        for _ in collector:
            collector.update_policy_weights_()
    print(torchrl_unilab.__file__, len(rb), collector.policy_version, tuple(rb.sample()["action"].shape))
"""
#: what :data:`WHEEL_RUN` prints after the package's path: 256 rows, version 5 (1 + 4 publishes), (32, 1)
WHEEL_EXPECTED = "256 5 (32, 1)"
#: The distributions whose resolved versions each venv records.
RECORDED = ("torch", "torchrl", "tensordict", "envpool", "mujoco", "gymnasium", "numpy", "ray", "sphinx")


def install_line(readme: Path = ROOT / "README.md") -> str:
    """README's set-up command: its first line that starts with ``pip install torch``.

    Example::

        >>> install_line().startswith("pip install torch==")
        True
    """
    for line in readme.read_text(encoding="utf-8").splitlines():
        if line.startswith("pip install torch"):
            return line.strip()
    raise ValueError(f"{readme}: no line starts with 'pip install torch' (README's set-up command)")


def quick_start(page: Path = ROOT / "docs" / "install.rst") -> tuple[str, str]:
    """``(code, expected output)`` of the install page's quick start (``.. testcode:: quickstart`` and its
    ``.. testoutput::``), as Sphinx's doctest builder runs them.

    Example::

        >>> code, expected = quick_start()
        >>> "OffPolicyCollector" in code and expected.split()[0].isdigit()
        True
    """
    text = page.read_text(encoding="utf-8")

    def block(directive: str) -> str:
        match = re.search(rf"^\.\. {directive}:: quickstart\n\n((?:   .*\n|\n)+)", text, flags=re.M)
        if match is None:
            raise ValueError(f"{page}: no '.. {directive}:: quickstart' block")
        return "\n".join(line[3:] for line in match.group(1).splitlines()).strip() + "\n"

    return block("testcode"), block("testoutput")


def find_python(version: str) -> str:
    """The interpreter for ``version`` (``3.12``): ``python3.12`` on ``PATH``, else pyenv's.

    Example::

        >>> find_python(f"{sys.version_info[0]}.{sys.version_info[1]}").endswith(
        ...     f"python{sys.version_info[0]}.{sys.version_info[1]}")
        True
    """
    if not re.fullmatch(r"3\.\d+", version):
        raise ValueError(f"--python takes versions such as 3.12, got {version!r}")
    for candidate in [shutil.which(f"python{version}"),
                      *sorted(glob.glob(os.path.expanduser(f"~/.pyenv/versions/{version}.*/bin/python{version}")))]:
        if candidate and subprocess.run([candidate, "-c", "pass"], capture_output=True).returncode == 0:
            return candidate
    raise ValueError(f"--python {version}: no working python{version} on PATH or under ~/.pyenv/versions")


def junit_counts(path: Path) -> dict:
    """``{"passed", "failed", "skipped"}`` from pytest's ``--junitxml`` file (errors count as failed), and
    ``failures``: each failed test's id and the first line of its message.

    Example::

        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     xml = Path(tmp) / "r.xml"
        ...     _ = xml.write_text('<testsuites><testsuite tests="5" failures="1" errors="1" skipped="1">'
        ...                        '<testcase classname="tests.test_a" name="test_b"><failure message="assert 1 == 0'
        ...                        '&#10;more"/></testcase></testsuite></testsuites>')
        ...     junit_counts(xml)
        {'passed': 2, 'failed': 2, 'skipped': 1, 'failures': ['tests.test_a::test_b: assert 1 == 0']}
    """
    suite = ElementTree.parse(path).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    tests, failures, errors, skipped = (int(suite.get(key, 0)) for key in ("tests", "failures", "errors", "skipped"))
    failed = [f"{case.get('classname')}::{case.get('name')}: {(child.get('message') or '').partition(chr(10))[0][:300]}"
              for case in suite.iter("testcase") for child in case if child.tag in ("failure", "error")]
    return {"passed": tests - failures - errors - skipped, "failed": failures + errors, "skipped": skipped,
            "failures": failed}


class Venv:
    """A fresh venv of one Python version, and the steps run in it: each step's ``ok``, ``seconds`` and ``error``
    (the exception line or pip's last ``ERROR``) go into :attr:`run`."""

    def __init__(self, version: str, path: Path) -> None:
        subprocess.run([find_python(version), "-m", "venv", str(path)], check=True)
        self.bin = path / "bin"
        self.env = {**os.environ, "VIRTUAL_ENV": str(path), "PATH": f"{self.bin}{os.pathsep}{os.environ['PATH']}"}
        self.env.pop("PYTHONPATH", None)
        self.env.setdefault("MUJOCO_GL", "disable")  # as .ci/run: no display here
        self.run = {"python": subprocess.run([str(self.bin / "python"), "-c",
                                              "import platform; print(platform.python_version())"],
                                             capture_output=True, text=True, check=True).stdout.strip()}

    def step(self, name: str, cmd: list[str], limit: float, cwd: Path = ROOT) -> subprocess.CompletedProcess | None:
        """Runs ``cmd`` with the venv first on ``PATH``; the completed process, or ``None`` when it timed out."""
        begin = time.monotonic()
        try:
            proc = run_captured(cmd, timeout=limit, cwd=cwd, env=self.env)
        except subprocess.TimeoutExpired:
            self.run[name] = {"ok": False, "seconds": round(time.monotonic() - begin, 1),
                              "error": f"timed out ({limit:.0f} s)"}
            return None
        output = proc.stdout + proc.stderr
        error = None if proc.returncode == 0 else (
            first_error(output) or next((line for line in reversed(output.splitlines()) if "ERROR" in line),
                                        output.strip().splitlines()[-1:] or [f"exit code {proc.returncode}"])[0])
        self.run[name] = {"ok": proc.returncode == 0, "seconds": round(time.monotonic() - begin, 1), "error": error}
        return proc

    def versions(self) -> dict[str, str | None]:
        """The :data:`RECORDED` distributions' versions in this venv."""
        freeze = subprocess.run([str(self.bin / "pip"), "freeze"], capture_output=True, text=True, env=self.env).stdout
        pins = {name.lower(): version for name, version in (line.split("==", 1) for line in freeze.splitlines()
                                                             if "==" in line)}
        return {name: pins.get(name) for name in RECORDED}


def check_wheel(version: str, path: Path, timeout: float) -> dict:
    """``python -m build`` of the checkout, then a fresh venv with torch and the wheel alone, running
    :data:`WHEEL_RUN` from outside the checkout."""
    venv = Venv(version, path / "venv")
    dist = path / "dist"
    venv.step("build", [sys.executable, "-m", "build", "--outdir", str(dist), str(ROOT)], timeout)
    if venv.run["build"]["ok"]:
        venv.run["files"] = sorted(p.name for p in dist.iterdir())
        torch_pin = install_line().split("&&")[0].split()[-1]  # README's torch==X
        venv.step("install", ["bash", "-c", f"pip install {torch_pin} && pip install {next(dist.glob('*.whl'))}"],
                  timeout)
    if venv.run.get("install", {}).get("ok"):
        venv.run["versions"] = venv.versions()
        (path / "wheel_run.py").write_text(WHEEL_RUN)
        proc = venv.step("collect", [str(venv.bin / "python"), str(path / "wheel_run.py")], 600, cwd=path)
        if proc is not None and proc.returncode == 0:
            where, _, printed = proc.stdout.strip().splitlines()[-1].partition(" ")
            venv.run["collect"]["printed"] = printed
            if "site-packages" not in where or printed != WHEEL_EXPECTED:
                venv.run["collect"].update(ok=False, error=f"imported {where}; printed {printed!r}, expected "
                                                           f"{WHEEL_EXPECTED!r} from site-packages")
    venv.run["passes"] = all(venv.run.get(name, {}).get("ok") for name in ("build", "install", "collect"))
    return venv.run


def check_version(version: str, path: Path, timeout: float) -> dict:
    """One Python version in a fresh venv at ``path``: README's install line, the quick start, :data:`SUBSET`."""
    started = time.monotonic()
    venv = Venv(version, path)
    run, step, bin_dir = venv.run, venv.step, venv.bin
    if step("install", ["bash", "-c", install_line()], timeout) and run["install"]["ok"]:
        run["versions"] = venv.versions()
        code, expected = quick_start()
        script = path / "quick_start.py"
        script.write_text(code)
        proc = step("quick_start", [str(bin_dir / "python"), str(script)], 600)
        wanted = expected.strip().splitlines()
        printed = proc.stdout.strip().splitlines()[-len(wanted):] if proc is not None else []
        if proc is not None and run["quick_start"]["ok"] and printed != wanted:
            run["quick_start"].update(ok=False, error=f"printed {printed!r}, expected {wanted!r}")
        report = path / "junit.xml"
        step("tests", [str(bin_dir / "python"), "-m", "pytest", "-q", "-p", "no:cacheprovider",
                       f"--junitxml={report}", *SUBSET], timeout)
        if report.exists():
            run["tests"].update(junit_counts(report))
    run["seconds"] = round(time.monotonic() - started, 1)
    run["passes"] = all(run.get(name, {}).get("ok") for name in ("install", "quick_start", "tests"))
    return run


def results_file(runs: dict[str, dict], wheel: dict | None, load_start: float, argv: list[str] | None = None) -> dict:
    """``--out``'s file: provenance, the install line, the subset, per version what :func:`check_version` gave, and
    :func:`check_wheel`'s run (``None`` without ``--wheel``).

    Example::

        >>> data = results_file({"3.11": {"passes": True}}, None, 0.5, argv=["--python", "3.11"])
        >>> data["passing"], data["install_line"].startswith("pip install torch")
        (['3.11'], True)
    """
    return {**provenance("python_versions", round(load_start, 2), round(os.getloadavg()[0], 2), argv=argv),
            "commit": git(["rev-parse", "--short", "HEAD"], cwd=ROOT), "install_line": install_line(),
            "subset": list(SUBSET), "runs": runs,
            "passing": [version for version, run in runs.items() if run.get("passes")], "wheel": wheel}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", nargs="+", default=["3.11", "3.12", "3.13"],
                        help="the versions to check, each in a fresh venv (default: 3.11 3.12 3.13)")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds for the install and for the tests")
    parser.add_argument("--wheel", metavar="VERSION",
                        help="also build the wheel and run a short collection from it in a fresh venv of this Python")
    parser.add_argument("--keep", action="store_true", help="keep the venvs (their path goes to stderr)")
    parser.add_argument("--out", type=Path, help="write the results file here")
    args = parser.parse_args(argv)
    for version in [*args.python, *([args.wheel] if args.wheel else [])]:
        find_python(version)  # a missing interpreter fails before any install
    load_start, runs, wheel = os.getloadavg()[0], {}, None
    with work_dir("tul_pyversions_", args.keep) as workdir:
        if args.wheel:
            wheel = check_wheel(args.wheel, workdir / "wheel", args.timeout)
            print(f"wheel on python {args.wheel}: {json.dumps(wheel)}", file=sys.stderr, flush=True)
        for version in args.python:
            runs[version] = check_version(version, workdir / f"venv{version}", args.timeout)
            print(f"python {version}: {json.dumps(runs[version])}", file=sys.stderr, flush=True)
    data = results_file(runs, wheel, load_start, argv=sys.argv[1:] if argv is None else argv)
    print(json.dumps({key: data[key] for key in ("benchmark", "passing", "runs", "wheel")}))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(data, indent=2) + "\n")


if __name__ == "__main__":
    main()
