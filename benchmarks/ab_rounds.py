"""One benchmark on two builds, in alternating rounds: another torch, or the code before a change.

Run::

    python benchmarks/ab_rounds.py --a PYTHON[@REPO] --b PYTHON[@REPO] --benchmark NAME --keys KEY,... [--out FILE] \\
        -- BENCHMARK_ARGS

See ``benchmarks/README.md``, section "One benchmark on two builds".
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from common import bootstrap_interval, run_captured

ROOT = Path(__file__).resolve().parents[1]


def parse_side(text: str) -> tuple[str, Path]:
    """``PYTHON`` or ``PYTHON@REPO`` as ``(python, repo)``.

    Examples:
        >>> parse_side("python@/tmp/before")
        ('python', PosixPath('/tmp/before'))
        >>> parse_side("python")[1] == ROOT
        True
    """
    python, _, repo = text.partition("@")
    return python, Path(repo).resolve() if repo else ROOT


def describe(python: str, repo: Path) -> dict[str, str]:
    """The torch version a side imports and the commit of its checkout."""
    torch_version = subprocess.run([python, "-c", "import torch; print(torch.__version__)"], capture_output=True,
                                   text=True, check=True, timeout=120).stdout.strip()
    commit = subprocess.run(["git", "-C", str(repo), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, timeout=30).stdout.strip() or "unknown"
    return {"torch": torch_version, "commit": commit, "repo": str(repo)}


def one_run(python: str, repo: Path, benchmark: str, args: list[str], timeout: float,
            script_repo: Path | None = None) -> dict:
    """The last JSON line of ``benchmarks/<benchmark>.py`` (``repo``'s, or ``script_repo``'s) under ``python``,
    with ``repo``'s package first on the path whatever the interpreter has installed."""
    script = (script_repo or repo) / "benchmarks" / f"{benchmark}.py"
    env = {**os.environ, "PYTHONPATH": str(repo)}
    result = run_captured([python, str(script), *args], timeout=timeout, cwd=repo, env=env)
    if result.returncode != 0:
        raise RuntimeError(f"{python}@{repo}: {benchmark}.py failed:\n{result.stderr[-2000:]}")
    return json.loads([line for line in result.stdout.splitlines() if line.startswith("{")][-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--a", required=True, help="the baseline side: PYTHON or PYTHON@REPO")
    parser.add_argument("--b", required=True, help="the other side: PYTHON or PYTHON@REPO")
    parser.add_argument("--benchmark", required=True, help="a script of benchmarks/, without .py")
    parser.add_argument("--keys", required=True, help="comma-separated JSON keys of the benchmark to compare")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--script-from", choices=("a", "b"), default=None,
                        help="run this side's benchmark script on both sides (default: each side its own); for "
                             "benchmark options that the other side's script lacks")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per benchmark run")
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON line to this file")
    parser.add_argument("args", nargs="*", help="after --: the benchmark's own arguments")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds must be >= 1, got {args.rounds}")
    keys = [key.strip() for key in args.keys.split(",") if key.strip()]
    sides = {"a": parse_side(args.a), "b": parse_side(args.b)}
    script_repo = sides[args.script_from][1] if args.script_from else None
    for name, (_, repo) in sides.items():
        checkout = script_repo or repo
        if not (checkout / "benchmarks" / f"{args.benchmark}.py").is_file():
            parser.error(f"--benchmark: no benchmarks/{args.benchmark}.py in side {args.script_from or name}'s "
                         f"checkout {checkout}")
    runs: dict[str, list[dict]] = {"a": [], "b": []}
    started = time.time()
    for round_idx in range(args.rounds):
        for side in ("a", "b") if round_idx % 2 == 0 else ("b", "a"):
            runs[side].append(one_run(*sides[side], args.benchmark, args.args, args.timeout, script_repo))
    out = {"benchmark": "ab_rounds", "measures": args.benchmark, "args": args.args, "rounds": args.rounds,
           "script_from": args.script_from or "each side",
           "a": describe(*sides["a"]), "b": describe(*sides["b"]), "minutes": round((time.time() - started) / 60, 1),
           "date": time.strftime("%Y-%m-%d")}
    for key in keys:
        missing = [side for side in runs if any(key not in run for run in runs[side])]
        if missing:
            raise SystemExit(f"--keys: {key!r} is not in {args.benchmark}.py's output (side {', '.join(missing)})")
        a, b = [float(run[key]) for run in runs["a"]], [float(run[key]) for run in runs["b"]]
        ratios = [y / x for x, y in zip(a, b)]
        out |= {f"{key}_a": round(statistics.median(a), 3), f"{key}_b": round(statistics.median(b), 3),
                f"ratio_{key}": round(statistics.median(ratios), 3), f"ratios_{key}": [round(r, 3) for r in ratios]}
        interval = bootstrap_interval(ratios, statistic=statistics.median)
        if interval is not None:
            out[f"ratio_{key}_interval"] = [round(end, 3) for end in interval]
    line = json.dumps(out)
    print(line)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
