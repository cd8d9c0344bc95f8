"""Turn the saved results (``benchmarks/results/<topic>/*.json``) into README's and the docs' tables and plots.

Each figure lives in one results file, with the date, command, machine and torch
version of the run that measured it. This script is the only writer of:

* README.md's headline table, between ``<!-- report:headline -->`` and
  ``<!-- /report:headline -->``, and its main-job sentence (``report:main-job``);
* ``docs/results/generated/*.rst``: the tables that the results pages include,
  and ``figures.rst``, the substitutions (``|main_job_minutes|``) that any page may use;
* ``docs/_static/results/*.png``: the learning curves and bar charts.

Run::

    python benchmarks/report.py           # rewrite them all
    python benchmarks/report.py --check   # exit 1 and name each stale file; writes nothing

``tests/test_report.py`` regenerates the text in memory and fails on a stale file.
Results of topics not measured yet (``gpu/``, ``conformance/``) render as "not yet measured".

Examples:
    >>> import importlib.util, pathlib
    >>> spec = importlib.util.spec_from_file_location("report", pathlib.Path("benchmarks/report.py"))
    >>> report = importlib.util.module_from_spec(spec); spec.loader.exec_module(report)
    >>> sorted(p.name for p in report.outputs() if p.suffix == ".md")
    ['README.md']
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import wallclock
from common import figure, list_table

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
README = ROOT / "README.md"
GENERATED = ROOT / "docs" / "results" / "generated"
PLOTS = ROOT / "docs" / "_static" / "results"
NOT_MEASURED = "not yet measured"

Results = dict[str, dict]  # "topic/name.json" -> its content


# ------------------------------------------------------------------ loading
def load(results: Path = RESULTS) -> Results:
    """Every results file under ``results``, keyed by its path relative to it (``"ray/ray_scaling.json"``)."""
    return {p.relative_to(results).as_posix(): json.loads(p.read_text()) for p in sorted(results.glob("*/*.json"))}


def topic(res: Results, name: str) -> list[dict]:
    """The files of one topic directory, oldest first (by their ``date``, then name)."""
    files = [(key, data) for key, data in res.items() if key.split("/")[0] == name]
    return [data for _, data in sorted(files, key=lambda kd: (str(kd[1].get("date", "")), kd[0]))]


# ------------------------------------------------------------------ formatting
def fmt(x: float | int | None, digits: int = 0) -> str:
    """``12,345``, ``0.98``; ``-`` for a missing figure."""
    if x is None:
        return "-"
    if digits == 0:  # half up, as the tables these figures come from were rounded
        return f"{math.floor(x + 0.5):,}"
    return f"{x:,.{digits}f}"


def signed(x: float) -> str:
    """``+468``, ``-1,141``: a difference, rounded half up."""
    return f"{math.floor(x + 0.5):+,}"


def provenance_line(data: dict) -> str:
    """The line under each table: the command, date, machine and torch that ``common.provenance`` recorded."""
    return (f"``{data['command']}``; measured {data['date']} on a {data['machine']}; torch {data['torch']}. "
            f"Data: ``benchmarks/results/{data['_file']}``.\n")


def marks_header(marks: list[int]) -> list[str]:
    """``[10000, 20000]`` -> ``['10k', '20k']``."""
    return [f"{m // 1000}k" for m in marks]


def side_mean(data: dict, key: str) -> list[float]:
    """A side's mean curve as the benchmark printed it (from unrounded returns), else the mean over its seeds of
    their rounded returns at each mark."""
    return data.get("means", {}).get(key) or [statistics.mean(at_mark)
                                              for at_mark in zip(*(r["returns"] for r in data[key].values()))]


def groups(task: dict) -> dict[str, dict[str, dict]]:
    """A robot task's runs by variant (``"privileged"``, ``"symmetric"``; one group when it has none)."""
    return {name: {k: v for k, v in task["runs"].items() if k.startswith(name + ",") or "," not in k}
            for name in task["means"]}


# ------------------------------------------------------------------ collector speed
#: collector_throughput's configurations: (JSON key, the table's label, the plot's label)
COLLECTOR_ROWS = [
    ("raw", "raw single-process gymnasium loop, random actions", "raw gymnasium loop"),
    ("bare_mujoco", "bare MuJoCo: 16 ``MjData``, ``mj_step(nstep=5)`` in a Python loop", "bare MuJoCo"),
    ("envpool", "EnvPool alone, 16 envs, 1 thread, random actions", "EnvPool alone"),
    ("envpool_env", "``EnvPoolEnv`` alone, 16 envs, random actions", "EnvPoolEnv alone"),
    ("torchrl_collector", "TorchRL ``Collector`` over ``GymEnv(num_envs=16)``", "TorchRL Collector"),
    ("offpolicy_gymnasium", "``OffPolicyCollector``, 1 worker x 16 envs, ``engine=\"gymnasium\"``",
     "ours, 16 envs, gymnasium"),
    ("offpolicy_envpool_16", "``OffPolicyCollector``, 1 worker x 16 envs, EnvPool (default)", "ours, 16 envs"),
    ("offpolicy_envpool_64", "``OffPolicyCollector``, 1 worker x 64 envs, EnvPool", "ours, 64 envs"),
    ("offpolicy_lanes_16", "``OffPolicyCollector``, 1 worker x 16 envs, EnvPool, ``lanes=2``",
     "ours, 16 envs, lanes=2"),
    ("offpolicy_lanes_64", "``OffPolicyCollector``, 1 worker x 64 envs, EnvPool, ``lanes=2``",
     "ours, 64 envs, lanes=2"),
    ("offpolicy_envpool_2w", "``OffPolicyCollector``, 2 workers x 16 envs, EnvPool", "ours, 2 workers x 16 envs"),
]


def collector_tables(res: Results) -> str:
    """collector_throughput on HalfCheetah-v5: rates and ratios to the raw loop, then each worker's phases."""
    data = res["collector/halfcheetah.json"]
    rows = []
    for key, label, _ in COLLECTOR_ROWS:
        ratio = fmt(data["ratio_over_raw"][key], 2)
        if key == "offpolicy_envpool_16":
            low, high = data["ratio_envpool_16_over_raw_range"]
            ratio += f" (rounds {low:.2f} to {high:.2f})"
        if key == "offpolicy_envpool_2w":
            ratio += f" ({data['ratio_2w_over_1w']:.2f} x 1 worker)"
        rows.append([label, f"``{key}``", fmt(data["steps_per_s"][key]), ratio, data["targets"].get(key, "")])
    out = list_table(["configuration", "JSON key", "steps/s", "ratio to raw", "target"], rows, [40, 18, 10, 20, 12])
    out += "\n" + provenance_line(data) + "\n"
    phases = ("env_step", "policy", "buffer_write", "weight_sync", "pack", "other")
    labels = {key: label for key, label, _ in COLLECTOR_ROWS}
    rows = [[labels[k]] + [fmt(v.get(phase, 0.0), 1) for phase in phases]
            for k, v in data["breakdown_us_per_step"].items()]
    out += "A worker's time per batched step, in microseconds (``breakdown_us_per_step``):\n\n"
    out += list_table(["configuration", "env step", "policy", "buffer write", "weight sync", "pack", "other"], rows)
    return out


# ------------------------------------------------------------------ drop-in
#: dropin_speedup's configurations: JSON key -> (the table's label, the plot's label)
DROPIN_ROWS = {"pattern1": ("1: iterate over batches (``sac.py``)", "1: iterate over batches"),
               "pattern2": ("2: workers fill a shared ``ReplayBuffer`` (``sac-async.py``)", "2: shared buffer"),
               "fast_path": ("2, a gymnasium id instead of the stack (our fast path)", "2, gymnasium id")}


def dropin_tables(res: Results) -> str:
    """dropin_speedup: frames/s of TorchRL's collector and ours in TorchRL's two SAC patterns."""
    speed = next(d for d in topic(res, "dropin") if d["benchmark"] == "dropin_speedup")
    rows = []
    for key, (label, _) in DROPIN_ROWS.items():
        fps = speed["fps"][key]
        ratio = f"**{speed[f'ratio_{key}']:.2f}**"
        if key in speed["targets"]:
            low, high = speed["ratio_rounds"][key]
            ratio += f" (target {speed['targets'][key]}; rounds {low:.2f} to {high:.2f})"
        rows.append([label, fmt(fps["torchrl"]), fmt(fps["ours"]), ratio])
    out = list_table(["pattern", "TorchRL ``MultiAsyncCollector`` frames/s", "``OffPolicyCollector`` frames/s",
                      "ratio"], rows, [40, 18, 18, 24])
    return out + "\n" + provenance_line(speed)


def sota_table(res: Results) -> str:
    """sota_dropin: each TorchRL script's latest result (a later run of a script replaces its row)."""
    runs = [d for d in topic(res, "dropin") if d["benchmark"] == "sota_dropin"]
    latest: dict[str, tuple[dict, dict]] = {}
    for run in runs:  # oldest first
        for script, result in run["results"].items():
            latest[script] = (run, result)
    rows = []
    for script, (run, result) in latest.items():
        status = result["status"]
        if result.get("variant"):
            status += f" ({result['variant']})"
        if result.get("error"):
            status += f": ``{result['error']}``"
        if result.get("substituted"):
            status += f"; substituted: {result['substituted']}"
        rows.append([f"``{script}``", status, fmt(result["seconds"]), run["date"]])
    out = list_table(["script", "result", "seconds", "date"], rows, [26, 54, 8, 12])
    ok = sum(1 for _, r in latest.values() if r["status"] == "ok")
    out += f"\n{ok} of {len(latest)} rows ok. " + "".join(provenance_line(run).rstrip("\n") + " " for run in runs)
    return out.rstrip() + "\n"


def sota_exit_table(res: Results) -> str:
    """sota_dropin --exit-within: repeated runs of one script, each one's seconds and its exit after its last output."""
    runs = [d for d in topic(res, "dropin") if d["benchmark"] == "sota_dropin_exit"]
    if not runs:
        return f"Exit after the last update: **{NOT_MEASURED}**.\n"
    out = ""
    for data in runs:
        rows = [[str(i + 1), run["status"], fmt(run["seconds"]), fmt(run["exit_after_output_s"], 1)]
                for i, run in enumerate(data["runs"])]
        out += list_table(["run", "result", "seconds", "exit after the last output (s)"], rows)
        out += f"\n``{data['script']}``, limit {data['exit_within_s']} s. {data['note']} " + provenance_line(data)
    return out


def conformance_table(res: Results) -> str:
    """torchrl_conformance: passed/failed/skipped per side, or 'not yet measured' without a results file."""
    runs = topic(res, "conformance")
    if not runs:
        return (f"TorchRL's own collector tests (``test/test_collectors.py``) with ``OffPolicyCollector`` in place of "
                f"``MultiAsyncCollector``: **{NOT_MEASURED}** (``python benchmarks/torchrl_conformance.py --rl-root "
                f"<pytorch/rl checkout> --out benchmarks/results/conformance/<name>.json``).\n")
    rows = []
    for run in runs:
        for side in ("stock", "ours"):
            # a stock side reused from a saved stock run ("from") is that run's row already
            if isinstance(run.get(side), dict) and "from" not in run[side]:
                s = run[side]
                rows.append([run.get("date", "-"), side, *(str(s.get(k, "-")) for k in ("passed", "failed", "skipped")),
                             str(len(s.get("crashed") or []))])
        if run.get("pass_stock_not_ours") is not None and rows:
            rows[-1].append(str(len(run["pass_stock_not_ours"])))
    if not rows:
        return (f"TorchRL's own collector tests: **{NOT_MEASURED}** "
                "(no side's counts in ``benchmarks/results/conformance/``).\n")
    width = max(len(r) for r in rows)
    rows = [r + ["-"] * (width - len(r)) for r in rows]
    header = ["date", "collector", "passed", "failed", "skipped", "crashed", "pass with stock, not ours"][:width]
    last = runs[-1]
    out = (list_table(header, rows) + f"\nAgainst pytorch/rl ``{last.get('commit', '?')[:9]}``, torchrl "
           f"{last.get('torchrl', '?')}, torchrl_unilab ``{str(last.get('unilab_commit', '?'))[:7]}``. "
           "Data: ``benchmarks/results/conformance/``.\n")
    failing = last.get("pass_stock_not_ours") or []
    if failing:
        errors = last.get("first_errors") or {}
        out += "\nCases TorchRL's class passes and ours does not, with the first error:\n\n"
        for node in failing:
            error = " ".join(str(errors.get(node, "")).split())[:160].replace("`", "'")
            out += f"* ``{node.split('::', 1)[-1]}``" + (f": {error}" if error else "") + "\n"
    return out


# ------------------------------------------------------------------ learning against SB3
def learning_table(data: dict, sides: list[tuple[str, str]]) -> str:
    """Each seed's return at every mark, then each side's mean, and the minutes per run."""
    rows = []
    for key, label in sides:
        runs = data[key]
        for seed, run in runs.items():
            rows.append([f"{label}, seed {seed}", *map(fmt, run["returns"]), fmt(run["minutes"], 1)])
        rows.append([f"**{label}, mean of {len(runs)}**", *map(fmt, side_mean(data, key)),
                     fmt(statistics.mean(r["minutes"] for r in runs.values()), 1)])
    return list_table(["run", *marks_header(data["marks"]), "min"], rows)


def sac_tables(res: Results) -> str:
    """SAC against SB3: the per-seed table and the wall-clock to SB3's 100k return."""
    data = res["learning/sac_vs_sb3.json"]
    out = learning_table(data, [("recipe", "``recipes/sac.py``"), ("sb3_sac", "SB3 SAC")])
    t = data["time_to_sb3_return"]
    out += (f"\nSB3's mean return at 100k frames, {fmt(t['sb3_return_100k'])}, is reached by the recipe's mean curve "
            f"at {t['recipe_frames'] // 1000}k frames in {t['recipe_min']} min, against SB3's {t['sb3_min']} min "
            f"(**{t['ratio']:.2f}** of SB3's wall-clock; target at most {data['targets']['time_ratio_at_most']}).\n\n")
    return out + provenance_line(data)


def td3_tables(res: Results) -> str:
    """TD3 against SB3: the means, their difference and its 90 % interval at each mark."""
    data = res["learning/td3_vs_sb3.json"]
    recipe, sb3 = side_mean(data, "recipe"), side_mean(data, "sb3_td3")
    rows = []
    for i, mark in enumerate(data["marks"]):
        low, high = data["interval_90"][str(mark)]
        rows.append([f"{mark // 1000}k", fmt(recipe[i]), fmt(sb3[i]), signed(data["difference"][i]),
                     f"{signed(low)} to {signed(high)}"])
    out = list_table(["frames", f"recipe mean ({len(data['recipe'])} seeds)",
                      f"SB3 mean ({len(data['sb3_td3'])} seeds)", "recipe - SB3", "90 % interval over seeds"], rows)
    p = data["pooled_seeds_0_2"]
    a = p["at_100k"]
    out += (f"\nSeeds 0-2, three runs pooled ({p['runs']} runs): "
            f"{signed(p['from_30k_to_90k'][0])} to {signed(p['from_30k_to_90k'][1])} against SB3 from 30k to 90k, "
            f"{fmt(a['recipe'])} against {fmt(a['sb3'])} at 100k ({a['percent']:+.1f} %).\n\n")
    return out + provenance_line(data)


def td3_seeds_table(res: Results) -> str:
    """TD3 against SB3: each seed's return at every mark."""
    return learning_table(res["learning/td3_vs_sb3.json"], [("recipe", "``recipes/td3.py``"), ("sb3_td3", "SB3 TD3")])


def learner_table(res: Results) -> str:
    """learner_throughput: updates/s against TorchRL's loop and the machine's limit, and end to end."""
    d = res["learning/learner_throughput.json"]
    td3 = d["td3"]
    rows = [
        ["TorchRL's sota SAC loop (``SACLoss``, three ``Adam``), one thread", "``plain_ups_1t``",
         fmt(d["plain_ups_1t"], 1)],
        ["the recipe's update (tensor-level loss), one / two threads", "``recipe_ups_1t`` / ``_2t``",
         f"{d['recipe_ups_1t']} / {d['recipe_ups_2t']}"],
        ["the limit: every matrix product at the best sgemm rate, one / two threads", "``limit_ups_1t`` / ``_2t``",
         f"{d['limit_ups_1t']} / {d['limit_ups_2t']}"],
        ["fraction of the limit, one thread", "``recipe_fraction_of_limit_1t``",
         f"**{d['recipe_fraction_of_limit_1t']}** (target {d['targets']['recipe_fraction_of_limit_1t']})"],
        ["TD3's update ([400, 300]): recipe, limit, fraction", "``td3_*``",
         f"{td3['recipe_ups_1t']}, {td3['limit_ups_1t']}, {td3['fraction']}"],
        ["the same SAC update under ``torch.compile`` (CPU)", "``recipe_compiled_ups``",
         fmt(d["recipe_compiled_ups"], 1)],
        ["``recipes/sac.py`` end to end, ``optim.num_threads=auto`` / ``1``: env frames/s",
         "``e2e_fps_auto`` / ``_1t``", f"{d['e2e_fps_auto']} / {d['e2e_fps_1t']} (**{d['e2e_auto_over_1t']:.2f}x**)"],
        ["Stable-Baselines3's SAC on both cores: env frames/s", "``sb3_fps``",
         f"{d['sb3_fps']} (the recipe: {d['e2e_auto_over_sb3']:.2f}x)"],
    ]
    out = list_table(["figure (updates/s unless said)", "JSON key", "value"], rows, [56, 24, 20])
    p = d["profile_ms"]
    out += (f"\nOne update's {p['total']} ms (``--profile``): loss forward {p['loss_forward']}, "
            f"backward {p['backward']}, optimiser {p['optimizer']}, target update {p['target_update']}, "
            f"sampling {p['sample']}; matrix products {p['matmul']} of it.\n\n")
    return out + provenance_line(d)


def learner_batch_table(res: Results) -> str:
    """learner_throughput --batch-sizes and sampling.py: what a larger batch costs the update on one and two
    threads, and what sampling it costs."""
    sweep = next((d for d in topic(res, "learning") if d.get("mode") == "batch_sizes"), None)
    if sweep is None:
        return f"The update at other batch sizes: **{NOT_MEASURED}**.\n"
    rows = [[f"{int(batch):,}", f"{row['ups_1t']} / {row['ups_2t']}",
             f"{fmt(row['rows_per_s_1t'])} / {fmt(row['rows_per_s_2t'])}", f"{row['two_threads_gain']:.2f}x",
             f"{row['fraction_of_limit_1t']:.2f} / {row['fraction_of_limit_2t']:.2f}",
             f"{row['sample_ms']:.2f} ({row['sample_share_1t'] * 100:.0f} %)"]
            for batch, row in sweep["by_batch_size"].items()]
    out = list_table(["batch", "updates/s, 1 / 2 threads", "rows trained on per s, 1 / 2 threads",
                      "second thread", "fraction of the sgemm limit, 1 / 2 threads",
                      "``BufferSampler`` ms per batch (share of a 1-thread update)"], rows, [8, 16, 18, 10, 16, 20])
    out += f"\nOn a buffer of {sweep['buffer_rows']:,} rows. " + provenance_line(sweep)
    for d in (d for d in topic(res, "learning") if d.get("benchmark") == "sampling"):
        out += (f"\n``benchmarks/sampling.py``, a full buffer of {d['rows']:,} rows, batch {d['batch_size']}: "
                f"``BufferSampler`` {d['buffer_sampler_ms']:.3f} ms, a bare gather of the same keys "
                f"{d['gather_ms']:.3f} ms ({d['buffer_sampler_over_gather']:.2f}x), ``rb.sample()`` "
                f"{d['rb_sample_ms']:.3f} ms ({d['rb_sample_over_gather']:.2f}x). " + provenance_line(d))
    return out


def ab_table(res: Results, key: str, what: str) -> str:
    """An ``ab_rounds.py`` result: each compared figure on side A and side B, and B over A within rounds."""
    d = res.get(key)
    if d is None:
        return f"{what}: **{NOT_MEASURED}** (``python benchmarks/ab_rounds.py``, see ``benchmarks/README.md``).\n"
    names = [k[len("ratio_"):] for k in d if k.startswith("ratio_") and f"{k[len('ratio_'):]}_a" in d]
    side = {s: f"torch {d[s]['torch']}, ``{d[s]['commit']}``" for s in ("a", "b")}

    def ratio(n: str) -> str:
        interval = d.get(f"ratio_{n}_interval")
        return f"**{d[f'ratio_{n}']:.3f}**" + (f" [{interval[0]:.3f}, {interval[1]:.3f}]" if interval else "")

    rows = [[f"``{n}``", fmt(d[f"{n}_a"], 1), fmt(d[f"{n}_b"], 1), ratio(n)] for n in names]
    out = list_table(["figure", f"A: {side['a']}", f"B: {side['b']}",
                      "B / A (median over rounds, 90 % interval)"], rows)
    script_from = f" --script-from {d['script_from']}" if d.get("script_from") in ("a", "b") else ""
    return out + (f"\n{what}. ``python benchmarks/ab_rounds.py ...{script_from} --benchmark {d['measures']} -- "
                  f"{' '.join(d['args'])}``, {d['rounds']} alternating rounds, measured {d['date']} "
                  f"(A from ``{d['a']['repo']}``, B from ``{d['b']['repo']}``). Data: ``benchmarks/results/{key}``.\n")


def wallclock_table(data: dict) -> str:
    """One ``wallclock`` suite's file: each configuration's mean return by wall-clock minute, with its 90 % interval,
    what it did, and the two targets."""
    ref, algo = data.get("reference"), data.get("sb3_algo", data.get("algo", "sac")).upper()
    # with half of SB3's minutes and SB3's minutes themselves, where the targets are read
    marks = {2, 4, 6, 8, 10, 12, 15, 20, 23, 25, 30} | (
        {math.floor(ref["minutes"] / 2), math.ceil(ref["minutes"])} if ref else set())
    minutes = [m for m in sorted(marks) if any(m in c["minute"] for c in data["configs"].values())]

    def at(c: dict, minute: int) -> str:
        if minute not in c["minute"]:
            return "-"
        i = c["minute"].index(minute)
        interval = c["interval_by_minute"][i]
        return fmt(c["mean_by_minute"][i]) + ("" if interval is None else f" [{fmt(interval[0])}, {fmt(interval[1])}]")

    rows = []
    for label, c in data["configs"].items():
        t = c.get("targets") or {}
        rows.append([f"``{label}``", " ".join(f"``{o}``" for o in c.get("overrides") or []) or "(the defaults)",
                     str(c["seeds"]), *(at(c, m) for m in minutes), fmt(c["frames"]), fmt(c["updates"]),
                     fmt(t.get("time_share"), 2), fmt(t.get("return_ratio_at_half"), 2),
                     {True: "yes", False: "no", None: "-"}[t.get("low_above_sb3_at_half")]])
    out = list_table(["config", "overrides", "seeds", *[f"{m} min" for m in minutes], "frames", "updates",
                      f"time share (<= {wallclock.TIME_SHARE_TARGET})",
                      f"ratio at half (>= {wallclock.RETURN_RATIO_TARGET})", "interval above SB3 at half"], rows) + "\n"
    if ref:
        seeds = f"{ref['seeds']} seed{'s' * (ref['seeds'] != 1)}"
        out += (f"SB3's {algo}: mean return {fmt(ref['return'])} at 100k frames after {fmt(ref['minutes'], 1)} min "
                f"({seeds}; {ref['source']}). *Time share*: the first minute the mean curve reaches it, over SB3's "
                "minutes; *ratio at half*: the mean return at half of SB3's minutes over SB3's.\n\n")
    if data.get("sb3_runs"):  # what sets the pace on a CPU: gradient updates per minute on each side
        ours = ", ".join(f"``{label}`` {fmt(c['updates'] / c['minutes'])}" for label, c in data["configs"].items())
        sb3 = statistics.mean(run["updates"] / run["minutes"][-1] for run in data["sb3_runs"].values())
        out += (f"Gradient updates per minute: {ours}; SB3's {algo} {fmt(sb3)} (one per frame after its random "
                "frames, its evaluations in its minutes).\n\n")
    if data.get("note"):
        out += data["note"] + "\n\n"
    return out + provenance_line(data)


def wallclock_tables(res: Results, algo: str = "sac") -> str:
    """The wall-clock suite for one algorithm (a key of :data:`WALLCLOCK`): the finalists, then the screens, then the
    TorchRL script it is anchored to (:data:`WALLCLOCK_ANCHOR`)."""
    anchor = anchor_file(algo)
    files = {**WALLCLOCK[algo], **({anchor: WALLCLOCK_ANCHOR[algo][1]} if anchor else {})}
    parts = [f"**{title}**\n\n" + wallclock_table(res[key]) for key, title in files.items() if key in res]
    return "\n".join(parts) or (f"Return against wall-clock: **{NOT_MEASURED}** "
                                 f"(``python benchmarks/learning.py --suite wallclock --algo {algo} sb3_{algo}``).\n")


def wallclock_curves(res: Results, algo: str = "sac", screened: tuple[str, ...] | None = ("utd1", "crossq256")
                     ) -> dict[str, list[dict]]:
    """The curves of one algorithm's wall-clock plot: every finalist's, with its band, and of the screens' one-seed
    runs those in ``screened`` (``None``: all) that no finalist run, nor an earlier screen, measured."""
    final, *screens = WALLCLOCK[algo]
    curves = {}
    for key in (final, *screens):
        for label, c in res.get(key, {}).get("configs", {}).items():
            if key != final and (screened is not None and label not in screened or label in curves
                                 or f"{label}, screening" in curves):
                continue
            name = label if key == final else f"{label}, screening"
            curves[name] = minute_points(c)
    anchor = anchor_file(algo)
    for label, c in res.get(anchor, {}).get("configs", {}).items():
        curves[f"TorchRL's {label.rpartition('/')[2]}"] = minute_points(c)
    return curves


def anchor_file(algo: str) -> str | None:
    """The results file of the TorchRL script ``algo``'s wall-clock suite is anchored to, ``None`` where it has none.

    Example:
        >>> anchor_file("sac"), anchor_file("td3")
        ('learning/wallclock_anchor.json', None)
    """
    return WALLCLOCK_ANCHOR.get(algo, (None, None))[0]


def minute_points(config: dict) -> list[dict]:
    """A saved configuration's mean curve (``minute``, ``mean_by_minute``, ``interval_by_minute``) as
    :func:`wallclock.plot_against_minutes` takes it."""
    return [{"minute": minute, "mean": mean, "low": None if iv is None else iv[0],
             "high": None if iv is None else iv[1], "seeds": config["seeds"]}
            for minute, mean, iv in zip(config["minute"], config["mean_by_minute"], config["interval_by_minute"])]


# ------------------------------------------------------------------ robot tasks
def robot_tables(res: Results) -> str:
    """The robot suite: each task's per-seed returns and each variant's mean."""
    data = res["robot/learning.json"]
    out = ""
    for task, t in data["tasks"].items():
        rows = [[name, *map(fmt, run["returns"]), fmt(run["minutes"])] for name, run in t["runs"].items()]
        rows += [[f"**{group}, mean of {len(runs)}**", *map(fmt, t["means"][group]),
                  fmt(statistics.mean(r["minutes"] for r in runs.values()))] for group, runs in groups(t).items()]
        ref = f"; reference return at 100k: {t['reference']}" if "reference" in t else ""
        out += f"``{task}``, ``recipes/{t['algo']}.py``{ref}:\n\n"
        out += list_table(["run", *marks_header(data["marks"]), "min"], rows) + "\n"
        if "mean_episode_steps_30k_100k" in t:
            steps = ", ".join(f"{k} {v}" for k, v in t["mean_episode_steps_30k_100k"].items())
            out += f"Mean evaluation episode length from 30k to 100k frames, in steps: {steps}.\n\n"
    return out + provenance_line(data)


def robot_speed_table(res: Results) -> str:
    """collector_throughput --task: the collector against EnvPool alone on the robot tasks."""
    data = res["robot/collector_speed.json"]
    rows = []
    for task, t in data["tasks"].items():
        b = t["breakdown_us_per_step"]
        lanes = t.get("ratio_offpolicy_64_lanes2_over_envpool_64")
        rows.append([f"``{task}``", fmt(t["envpool"]), fmt(t["envpool_env"]), fmt(t["offpolicy"]),
                     f"**{t['ratio_offpolicy_over_envpool']:.2f}** (target {t['target']})",
                     "" if lanes is None else f"**{lanes:.2f}**",
                     f"{b['env_step']} / {b['policy']} / {b['buffer_write']}"])
    out = list_table(["task", "EnvPool alone", "``EnvPoolEnv`` alone", "collector", "collector / EnvPool",
                      "64 envs in 2 lanes / EnvPool on 64", "us per env step: physics / policy / buffer"], rows)
    return out + "\n" + provenance_line(data)


# ------------------------------------------------------------------ faults
RESIDUE = {"dev_shm": "``/dev/shm`` blocks", "fds": "file descriptors", "threads": "threads",
           "children": "child processes", "temp_dirs": "temp dirs"}


def fault_tables(res: Results) -> str:
    """faults: the injected faults and what the learner saw, then the recipe soaks."""
    f = res["faults/faults.json"]
    b, w, c = f["buffer_kills"], f["worker_kills"], f["cycles"]
    lk, st = f["learner_kill"], f["recipe_sigterm"]
    # a key the hand-typed faults.json lacks counts as the outcome it states (passed)
    rows = [
        [f"{b['kills']} SIGKILLs of a process writing {fmt(b['batch_rows'])}-row batches into a full buffer "
         f"({b['inside_write']} inside a write), the learner sampling",
         f"longest ``sample()`` {b['max_sample_s']} s (limit {b['limit_s']} s); torn rows {b['torn_rows']} in "
         f"{fmt(b['samples'])} samples"],
        [f"{w['kills']} SIGKILLs of an ``OffPolicyCollector`` worker, the learner sampling",
         f"hangs {w['hangs']}; ``WorkerError`` within {w['max_error_s']} s; longest ``sample()`` "
         f"{w['max_sample_s']} s; torn rows {w['torn_rows']}"],
        [f"{c['cycles']} create / collect / shutdown cycles",
         "residue: " + ", ".join(f"{v} {RESIDUE.get(k, k)}" for k, v in c["residue"].items())],
        ["SIGKILL of the learner during collection",
         f"workers gone {lk['workers_gone_s']} s later; its leftovers "
         + ("removed" if lk.get("residue_removed_by_next_collector", True) else "**not removed**")
         + " when the next collector starts"],
        ["SIGTERM of ``recipes/sac.py``",
         f"exit {st['exit_code']} after {st['exit_s']} s "
         + ("with a checkpoint" if st.get("checkpoint", True) else "**without a checkpoint**") + ", "
         + ("no residue" if not st.get("residue") else f"**residue {st['residue']}**") + "; ``resume=`` "
         + ("restores the buffer exactly" if st.get("resume_buffer_exact", True)
            else "**does not restore the buffer**")],
    ]
    out = list_table(["fault", "result"], rows, [50, 50]) + "\n" + provenance_line(f) + "\n"
    s = res["faults/soak.json"]
    r, y = s["recipe_soak"], s["ray_soak"]
    rows = [
        [f"local, {r['workers']} workers, {fmt(r['frames'])} frames, {r['minutes']} min "
         f"(undisturbed {r['undisturbed_minutes']})", f"{r['kills']} / {r['restarts']}", str(r["frames_lost"]),
         str(r["torn_rows"]), f"{r['max_stall_s']} s (undisturbed {r['undisturbed_max_stall_s']})",
         f"{fmt(r['final_return'])} (undisturbed {fmt(r['undisturbed_final_return'])})", r["residue"]],
        [f"Ray, {y['nodes']} nodes, {fmt(y['frames'])} frames, {y['minutes']} min", f"{y['kills']} / {y['restarts']}",
         str(y["frames_lost"]), str(y["torn_rows"]), f"{y['max_stall_s']} s", fmt(y["final_return"]), y["residue"]],
    ]
    out += "The SAC recipe with a worker (or a Ray node actor) SIGKILLed again and again, restarts on:\n\n"
    out += list_table(["soak", "kills / restarts", "frames lost", "torn rows", "longest learner stall", "final return",
                       "residue"], rows)
    return out + "\n" + provenance_line(s)


# ------------------------------------------------------------------ Ray
def ray_table(res: Results) -> str:
    """ray_scaling: the Ray path against the local collector at each batch size."""
    d = res["ray/ray_scaling.json"]
    rows = [[fpb, fmt(r["local_fps"]), fmt(r["ray_fps"]),
             f"**{r['ray_over_local']:.2f}** (rounds {r['ray_rounds'][0]:.2f}-{r['ray_rounds'][1]:.2f})",
             f"{r['ray_buffer_over_local']:.2f}", str(r["receive_us_per_frame"]), str(r["wire_bytes_per_frame"])]
            for fpb, r in d["by_frames_per_batch"].items()]
    out = list_table(["``--frames-per-batch``", "local frames/s", "Ray frames/s (learner receives)",
                      f"Ray / local (target {d['target_ray_over_local']})",
                      "Ray, nodes write a ``RayReplayBuffer``, / local", "learner receive, us/frame",
                      "bytes/frame on the wire"], rows)
    return out + "\n" + provenance_line(d)


# ------------------------------------------------------------------ GPU
def flatten(data: dict, prefix: str = "") -> list[tuple[str, object]]:
    """``{"a": {"b": 1}}`` -> ``[("a.b", 1)]``: the scalar leaves of a results file, private keys left out."""
    out = []
    for key, value in data.items():
        if key.startswith("_"):
            continue
        if isinstance(value, dict):
            out += flatten(value, f"{prefix}{key}.")
        elif isinstance(value, (int, float, str)):
            out.append((f"{prefix}{key}", value))
    return out


def gpu_table(res: Results) -> str:
    """gpu_check's results (its ``--quick`` dry runs left out), or 'not yet measured' without a results file."""
    runs = [run for run in topic(res, "gpu") if not run.get("quick")]
    if not runs:
        return (f"**No GPU figures: {NOT_MEASURED}.** No GPU has been lent to this project yet. On a machine with "
                "one, ``python benchmarks/gpu_check.py`` measures them and saves its results to "
                "``benchmarks/results/gpu/``; ``python benchmarks/report.py`` then fills this table.\n")
    return "".join(list_table(["key", "value"], [[f"``{k}``", str(v)] for k, v in flatten(run)])
                   + f"\nData: ``benchmarks/results/{run['_file']}``.\n\n" for run in runs)


# ------------------------------------------------------------------ README
def headline_rows(res: Results) -> list[tuple[str, str, str, str]]:
    """README's headline table: (measure, figure, command, date), at most eight rows."""
    c = res["collector/halfcheetah.json"]
    r, s = c["ratio_over_raw"], c["steps_per_s"]
    d = res["dropin/dropin_speedup.json"]
    sac = res["learning/sac_vs_sb3.json"]
    t = sac["time_to_sb3_return"]
    td3 = res["learning/td3_vs_sb3.json"]
    rec, sb3 = side_mean(td3, "recipe"), side_mean(td3, "sb3_td3")
    f, soak = res["faults/faults.json"], res["faults/soak.json"]["recipe_soak"]
    ray = res["ray/ray_scaling.json"]
    robot, rspeed = res["robot/learning.json"], res["robot/collector_speed.json"]
    cheetah = robot["tasks"]["CheetahRun-v1"]["means"]["recipes/sac.py"][-1]
    walker = robot["tasks"]["WalkerWalk-v1"]["means"]["recipes/sac.py"][-1]
    go1 = rspeed["tasks"]["Go1JoystickFlatTerrain-v1"]["ratio_offpolicy_over_envpool"]
    return [
        ("Collector vs a raw gymnasium loop (HalfCheetah-v5)",
         f"**{r['offpolicy_envpool_64']:.2f}x** (1 worker x 64 envs), {r['offpolicy_envpool_2w']:.2f}x (2 workers)",
         c["command"], c["date"]),
        ("Collector vs TorchRL's `Collector` (16 envs, same run)",
         f"**{s['offpolicy_envpool_16'] / s['torchrl_collector']:.1f}x** ({fmt(s['offpolicy_envpool_16'])} against "
         f"{fmt(s['torchrl_collector'])} steps/s)", c["command"], c["date"]),
        ("Drop-in: TorchRL's SAC scripts, only the class changed",
         f"**{d['ratio_pattern1']:.2f}x** (batches), **{d['ratio_pattern2']:.2f}x** (shared buffer)",
         d["command"], d["date"]),
        wallclock_headline(res)
        or ("SAC: wall-clock to SB3's 100k return",
            f"**{t['ratio']:.2f}** of SB3's ({t['recipe_min']} against {t['sb3_min']} min, 3 seeds)",
            sac["command"], sac["date"]),
        wallclock_headline(res, "td3")
        or (f"TD3 vs SB3's TD3, {len(td3['recipe'])} seeds, 100k frames",
            f"{fmt(rec[-1])} against {fmt(sb3[-1])} ({(rec[-1] / sb3[-1] - 1) * 100:+.1f} %)",
            "python benchmarks/learning.py --suite td3 --seeds 0 1 2 3 4 5 6 7 8 9", td3["date"]),
        ("Faults survived",
         f"{f['worker_kills']['kills']} worker and {f['buffer_kills']['kills']} writer SIGKILLs: 0 hangs, 0 torn rows; "
         f"SAC soak: {soak['kills']} kills, {soak['restarts']} restarts, {soak['frames_lost']} frames lost",
         f["command"] + " (and --soak-minutes)", f"{f['date']}, soak {res['faults/soak.json']['date']}"),
        ("Ray vs local collector (2 nodes, same cores)",
         f"**{ray['by_frames_per_batch']['512']['ray_over_local']:.2f}** at 512 frames per batch",
         ray["command"], ray["date"]),
        ("Robot tasks (Control Suite, Playground)",
         f"SAC 100k: CheetahRun {fmt(cheetah)}, WalkerWalk {fmt(walker)}; Go1 collector {go1:.2f} of EnvPool",
         "python benchmarks/learning.py --suite robot (and collector_throughput.py --task)",
         f"{robot['date']}, collector {rspeed['date']}"),
    ]


def wallclock_headline(res: Results, algo: str = "sac") -> tuple[str, str, str, str] | None:
    """The wall-clock suite's row for one recipe's defaults (its 5-seed finalists), once they are measured."""
    data = res.get(next(iter(WALLCLOCK[algo])))
    side = data and data["configs"].get("defaults")
    if not side or not side.get("targets"):
        return None
    t, ref = side["targets"], data["reference"]
    reached = (f"**{t['time_share']:.2f}** of SB3's wall-clock ({t['minute_reached']} against "
               f"{fmt(t['sb3_minutes'], 1)} min)" if t["minute_reached"] else "not reached")
    half = t["return_ratio_at_half"]
    at_half = "" if half is None else f"; at half SB3's time, **{half:.2f}x** SB3's return"
    anchor = anchor_file(algo)
    script = res.get(anchor)
    against = "" if script is None else "; " + anchor_clause(t["minute_reached"], script)
    return (f"{algo.upper()}: wall-clock to SB3's 100k return",
            f"{reached}{at_half} ({side['seeds']} seeds; SB3 {ref['seeds']}){against}",
            data["command"] + ("" if script is None else f"; {script['command']}"), data["date"]
            + ("" if script is None else f", TorchRL's {script['date']}"))


def anchor_clause(ours_minute: int | None, script: dict) -> str:
    """How the recipe's minute to SB3's return compares with the TorchRL script's (a ``wallclock_anchor`` file).

    Examples:
        >>> saved = {"configs": {"sota-implementations/sac/sac.py": {"seeds": 5, "minute": [1, 2, 3],
        ...          "targets": {"minute_reached": None}}}}
        >>> anchor_clause(8, saved)
        "TorchRL's sac.py does not reach it in 3 min (5 seeds): **< 2.67** of its wall-clock"
        >>> saved["configs"]["sota-implementations/sac/sac.py"]["targets"]["minute_reached"] = 16
        >>> anchor_clause(8, saved)
        "**0.50** of TorchRL's sac.py's wall-clock (8 against 16 min, 5 seeds)"
    """
    label, side = next(iter(script["configs"].items()))
    name, minute = label.rpartition("/")[2], side["targets"]["minute_reached"]
    if ours_minute is None:
        return f"TorchRL's {name} reaches it at minute {minute}" if minute else f"TorchRL's {name} does not either"
    if minute is None:
        budget = side["minute"][-1]
        return (f"TorchRL's {name} does not reach it in {budget} min ({side['seeds']} seeds): "
                f"**< {ours_minute / budget:.2f}** of its wall-clock")
    return (f"**{ours_minute / minute:.2f}** of TorchRL's {name}'s wall-clock ({ours_minute} against {minute} min, "
            f"{side['seeds']} seeds)")


def readme_headline(res: Results) -> str:
    """README's headline table in Markdown."""
    lines = ["| measure | figure | command | date |", "| --- | --- | --- | --- |"]
    lines += [f"| {m} | {fig} | `{cmd}` | {date} |" for m, fig, cmd, date in headline_rows(res)]
    return "\n".join(lines) + "\n"


def readme_main_job(res: Results) -> str:
    """README's main-job clause: the stated minutes and where they were measured."""
    m = res["main_job/sac.json"]
    return (f"about {m['stated_minutes']} minutes on a 2-core CPU ({m['frames'] // 1000}k frames; measured "
            f"{m['date']} on a fresh clone)")


README_BLOCKS: dict[str, Callable[[Results], str]] = {"headline": readme_headline, "main-job": readme_main_job}


def render_readme(text: str, res: Results) -> str:
    """``text`` with each ``<!-- report:NAME -->...<!-- /report:NAME -->`` block regenerated."""
    for name, make in README_BLOCKS.items():
        start, end = f"<!-- report:{name} -->", f"<!-- /report:{name} -->"
        if start not in text or end not in text:
            raise ValueError(f"README.md: the marked block {start} ... {end} is missing; accepted blocks: "
                             f"{sorted(README_BLOCKS)}")
        head, rest = text.split(start, 1)
        _, tail = rest.split(end, 1)
        body = make(res)
        text = head + start + ("\n" if body.endswith("\n") else "") + body + end + tail
    return text


# ------------------------------------------------------------------ docs
def figures_rst(res: Results) -> str:
    """Substitutions for figures quoted in prose; ``docs/conf.py`` puts them in every page's prolog."""
    m = res["main_job/sac.json"]
    return f".. |main_job_minutes| replace:: {m['stated_minutes']}\n.. |main_job_date| replace:: {m['date']}\n"


#: ab_rounds.py's comparisons: generated file -> (results file, what it compares)
AB_TABLES = {
    "torch_versions.rst": ("learning/torch_2.13_vs_2.14.1.json",
                           "The learner's update rates on torch 2.13.0 (CPU build) and 2.14.1"),
    "collector_before_after.rst": ("collector/before_after_issue43_final.json", "Each collector's env steps per "
                                   "second at two commits of the package, one benchmark script measuring both"),
    "dropin_before_after.rst": ("dropin/before_after_issue43_final.json", "Our collector's frames/s in the three "
                                "configurations of ``dropin_speedup.py`` at two commits of the package, one "
                                "benchmark script measuring both"),
    "dropin_torch_versions.rst": ("dropin/torch_2.13_vs_2.14.1.json",
                                  "Pattern 1's frames/s on torch 2.13.0 (CPU build) and 2.14.1"),
}
DOCS_TABLES: dict[str, Callable[[Results], str]] = {
    "collector.rst": collector_tables,
    "dropin.rst": dropin_tables,
    "sota_dropin.rst": sota_table,
    "sota_exit.rst": sota_exit_table,
    "conformance.rst": conformance_table,
    "sac_vs_sb3.rst": sac_tables,
    "td3_vs_sb3.rst": td3_tables,
    "td3_seeds.rst": td3_seeds_table,
    "learner.rst": learner_table,
    "learner_batch_sizes.rst": learner_batch_table,
    **{name: functools.partial(ab_table, key=key, what=what) for name, (key, what) in AB_TABLES.items()},
    "wallclock.rst": wallclock_tables,
    "wallclock_td3.rst": functools.partial(wallclock_tables, algo="td3"),
    "robot_learning.rst": robot_tables,
    "robot_speed.rst": robot_speed_table,
    "faults.rst": fault_tables,
    "ray.rst": ray_table,
    "gpu.rst": gpu_table,
    "figures.rst": figures_rst,
}
#: The wall-clock suite (benchmarks/learning.py --suite wallclock), per algorithm: its finalists on 5 seeds (first), and
#: its screening runs, one file per machine and session, each with its own run of the defaults.
WALLCLOCK = {"sac": {"learning/wallclock.json": "Finalists", "learning/wallclock_screen.json": "Screening",
                     "learning/wallclock_screen_batch.json": "Screening: batch size, learning rate and buffer size",
                     "learning/wallclock_crossq_screen.json": "Screening: CrossQ (recipes/crossq.py)"},
             "td3": {"learning/wallclock_td3.json": "Finalists", "learning/wallclock_td3_screen.json": "Screening"}}
#: The TorchRL script each algorithm's wall-clock suite is anchored to (``--algo torchrl_sac``): its file and title.
WALLCLOCK_ANCHOR = {"sac": ("learning/wallclock_anchor.json", "TorchRL's own sota-implementations/sac/sac.py, its "
                                                               "defaults (the anchor)")}
HEADER = ".. Generated by benchmarks/report.py from benchmarks/results/: do not edit, run the script.\n\n"


def outputs(results: Path = RESULTS, readme: Path = README) -> dict[Path, str]:
    """Every generated text file and its content, computed from ``results`` (nothing is written)."""
    res = load(results)
    for key, data in res.items():
        data["_file"] = key
    out = {GENERATED / name: HEADER + make(res) for name, make in DOCS_TABLES.items()}
    out[readme] = render_readme(readme.read_text(), res)
    return out


def stale(results: Path = RESULTS, readme: Path = README) -> list[Path]:
    """The generated files whose content on disk differs from what ``results`` gives."""
    return [p for p, text in outputs(results, readme).items() if not p.exists() or p.read_text() != text]


# ------------------------------------------------------------------ plots
def plot_learning(path: Path, title: str, sides: list[tuple[str, dict, list[float]]], marks: list[int]) -> None:
    """Mean deterministic eval return against frames, one line per side, its band from its lowest to highest seed."""
    with figure(path, title, "frames", "deterministic eval return", legend={}) as ax:
        for label, runs, mean in sides:
            curves = [r["returns"] for r in runs.values()]
            ax.plot(marks, mean, marker=".", label=f"{label} (mean of {len(runs)})")
            ax.fill_between(marks, [min(c) for c in zip(*curves)], [max(c) for c in zip(*curves)], alpha=0.2)


def plot_bars(path: Path, title: str, labels: list[str], groups: dict[str, list[float]], xlabel: str) -> None:
    """Horizontal bars: one row per label, one bar per group (``{"TorchRL": [...], "ours": [...]}``)."""
    with figure(path, title, xlabel, size=(7, 0.45 * len(labels) * max(1, len(groups)) + 1.2), grid_axis="x",
                legend={} if len(groups) > 1 else None) as ax:
        height = 0.8 / len(groups)
        for g, (name, values) in enumerate(groups.items()):
            ax.barh([i + g * height for i in range(len(labels))], values, height=height,
                    label=name if len(groups) > 1 else None)
        ax.set_yticks([i + height * (len(groups) - 1) / 2 for i in range(len(labels))], labels)
        ax.invert_yaxis()


def plots(results: Path = RESULTS) -> list[Path]:
    """Writes the learning curves and bar charts under ``docs/_static/results/``; returns their paths."""
    res = load(results)
    for algo in ("sac", "td3"):
        data = res[f"learning/{algo}_vs_sb3.json"]
        plot_learning(PLOTS / f"{algo}_vs_sb3.png", f"{algo.upper()} HalfCheetah-v5: recipe against SB3",
                      [(f"recipes/{algo}.py", data["recipe"], side_mean(data, "recipe")),
                       (f"SB3 {algo.upper()}", data[f"sb3_{algo}"], side_mean(data, f"sb3_{algo}"))], data["marks"])
    robot = res["robot/learning.json"]
    for task, t in robot["tasks"].items():
        sides = [(name, runs, t["means"][name]) for name, runs in groups(t).items()]
        plot_learning(PLOTS / f"robot_{task}.png", f"{t['algo'].upper()} {task}", sides, robot["marks"])
    made = [PLOTS / f"{name}.png" for name in ("sac_vs_sb3", "td3_vs_sb3", *(f"robot_{t}" for t in robot["tasks"]))]

    c = res["collector/halfcheetah.json"]
    plot_bars(PLOTS / "collector.png", f"HalfCheetah-v5 env steps/s ({c['date']})", [s for *_, s in COLLECTOR_ROWS],
              {"steps/s": [c["steps_per_s"][k] for k, *_ in COLLECTOR_ROWS]}, "env steps per second")
    d = res["dropin/dropin_speedup.json"]
    plot_bars(PLOTS / "dropin.png", f"TorchRL's SAC patterns, frames/s ({d['date']})",
              [s for _, s in DROPIN_ROWS.values()],
              {"TorchRL MultiAsyncCollector": [d["fps"][k]["torchrl"] for k in DROPIN_ROWS],
               "OffPolicyCollector": [d["fps"][k]["ours"] for k in DROPIN_ROWS]}, "collected frames per second")
    r = res["ray/ray_scaling.json"]["by_frames_per_batch"]
    plot_bars(PLOTS / "ray.png", f"Ray against the local collector ({res['ray/ray_scaling.json']['date']})",
              [f"{k} frames per batch" for k in r],
              {"local": [v["local_fps"] for v in r.values()], "Ray": [v["ray_fps"] for v in r.values()]},
              "frames per second")
    made += [PLOTS / "collector.png", PLOTS / "dropin.png", PLOTS / "ray.png"]
    for algo, name in (("sac", "wallclock"), ("td3", "wallclock_td3")):
        curves = wallclock_curves(res, algo)
        if curves:
            w = next(res[key] for key in WALLCLOCK[algo] if key in res)
            wallclock.plot_against_minutes(PLOTS / f"{name}.png", f"{w['algo'].upper()} HalfCheetah-v5: return "
                                           f"against wall-clock ({w['date']})", curves, w.get("reference"))
            made.append(PLOTS / f"{name}.png")
    return made


def main(argv: list[str] | None = None) -> int:
    """The command line: rewrite every generated file (and the plots), or ``--check`` them."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="name the stale files and exit 1; write nothing")
    parser.add_argument("--no-plots", action="store_true", help="skip the PNGs (they need matplotlib)")
    args = parser.parse_args(argv)
    if args.check:
        bad = stale()
        for path in bad:
            print(f"stale: {path.relative_to(ROOT)} (run python benchmarks/report.py)")
        return 1 if bad else 0
    for path, text in outputs().items():
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
            print(f"wrote {path.relative_to(ROOT)}")
    if not args.no_plots:
        for path in plots():
            print(f"plotted {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
