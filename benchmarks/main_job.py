"""Main job: README's ``python recipes/sac.py``, timed on a fresh clone.

    python benchmarks/main_job.py --seeds 0 1                       # writes benchmarks/results/main_job/sac.json

See ``benchmarks/README.md``, section "The main job".
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

from common import git, provenance, run_captured, with_pythonpath

ROOT = Path(__file__).resolve().parents[1]
#: The recipe's last line (trainers/run.py ``RecipeRun.finish``).
FINAL_LINE = re.compile(r"(?P<env>\S+): final eval return (?P<ret>-?[\d.]+) after (?P<frames>\d+) frames, "
                        r"(?P<updates>\d+) updates")


def clone_head(repo: Path, into: Path) -> str:
    """``git clone`` of ``repo``'s committed ``HEAD`` into ``into``; returns its commit."""
    git(["clone", "--quiet", "--no-hardlinks", str(repo), str(into)])
    return git(["-C", str(into), "rev-parse", "--short", "HEAD"])


def run_recipe(clone: Path, config_name: str, seed: int, overrides: list[str], timeout: float) -> dict:
    """One ``python recipes/sac.py`` in ``clone``: its wall-clock minutes, final return, frames and updates."""
    env = with_pythonpath(clone)
    command = [sys.executable, "recipes/sac.py", *(["--config-name", config_name] if config_name != "sac" else []),
               f"env.seed={seed}", *overrides]
    start = time.perf_counter()
    done = run_captured(command, cwd=clone, env=env, timeout=timeout)
    minutes = (time.perf_counter() - start) / 60
    match = FINAL_LINE.search(done.stdout)
    if done.returncode != 0 or match is None:
        raise RuntimeError(f"{' '.join(command)} exited with {done.returncode} and no final line:\n"
                           f"{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
    return {"minutes": round(minutes, 2), "final_return": round(float(match["ret"]), 1), "task": match["env"],
            "frames": int(match["frames"]), "updates": int(match["updates"])}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--config-name", default="sac", help="recipes/config/<name>.yaml (default: sac)")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", dest="overrides",
                        help="Hydra overrides after env.seed (a try on a smaller budget)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "main_job" / "sac.json")
    parser.add_argument("--timeout-min", type=float, default=30.0, help="per run")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="main_job_") as tmp:
        clone = Path(tmp) / "repo"
        commit = clone_head(ROOT, clone)
        runs = {seed: run_recipe(clone, args.config_name, seed, args.overrides, args.timeout_min * 60)
                for seed in args.seeds}
    minutes = statistics.fmean(r["minutes"] for r in runs.values())
    command = " ".join(["python recipes/sac.py", *(["--config-name", args.config_name] * (args.config_name != "sac")),
                        *args.overrides])
    summary = {
        **provenance("main_job", note="a fresh clone, one run after the other", argv=argv),
        "recipe_command": f"{command} env.seed=<seed>", "commit": commit,
        "task": runs[args.seeds[0]]["task"], "frames": runs[args.seeds[0]]["frames"],
        **{field: {str(s): r[field] for s, r in runs.items()} for field in ("minutes", "final_return", "updates")},
        "mean_minutes": round(minutes, 2),
        "mean_return": round(statistics.fmean(r["final_return"] for r in runs.values()), 1),
        "stated_minutes": round(minutes, 1),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps(summary), flush=True)
    return summary


if __name__ == "__main__":
    main()
