"""Return against wall-clock minutes: snapshot evaluation, mean curves with 90 % intervals, the two targets.

For ``benchmarks/learning.py --suite wallclock``. See ``benchmarks/README.md``, section "Learning".
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path

from common import bootstrap_interval, figure

#: The wall-clock seconds between two snapshots: the suite evaluates every minute.
SNAPSHOT_EVERY_S = 60

#: The targets: SB3's mean 100k-frame return reached in at most this share of SB3's wall-clock to it ...
TIME_SHARE_TARGET = 0.30
#: ... and at half of SB3's 100k wall-clock, a mean return at least this many times SB3's mean 100k return.
RETURN_RATIO_TARGET = 1.3


def evaluate_snapshots(run_dir: Path, cfg, algo: str, info_keys: tuple[str, ...] = ()) -> list[dict]:
    """The snapshots in ``run_dir/snapshots``, oldest first, as ``{"elapsed_s", "frames", "updates", "return",
    "episode_length", *info_keys}``: the mean of ``logger.num_eval_envs`` deterministic episodes on the recipe's
    ``EvalRunner`` from its evaluation seeds, each of ``info_keys`` (EnvPool info entries) as its mean per step."""
    import torch

    from torchrl_unilab.trainers.collection import env_kwargs
    from torchrl_unilab.trainers.evaluation import EvalRunner
    from torchrl_unilab.trainers.recipes_utils import env_info, make_networks

    nets = make_networks(cfg, algo, env_info(cfg), device="cpu")
    evaluator = EvalRunner(cfg.env.name, int(cfg.logger.num_eval_envs), seed=int(cfg.env.seed) + 10_000,
                           env_kwargs=env_kwargs(cfg), info_keys=info_keys)
    points = []
    try:
        for path in sorted((run_dir / "snapshots").glob("*.pt")):
            snapshot = torch.load(path, weights_only=True)  # written by this run's learner
            nets.policy.load_state_dict(snapshot["policy"])
            result = evaluator(nets.policy)
            points.append({"elapsed_s": float(snapshot["elapsed_s"]), "frames": int(snapshot["frames"]),
                           "updates": int(snapshot["updates"]), "return": result["eval/return"],
                           "episode_length": result["eval/episode_length"],
                           **{key: result[f"eval/{key}"] for key in info_keys}})
    finally:
        evaluator.close()
    return points


def value_at_minutes(points: list[dict], minutes: int, key: str = "return") -> list[float | None]:
    """A run's ``key`` at minutes ``1 .. minutes``: its last snapshot's by then, ``None`` before the first.

    Examples:
        >>> value_at_minutes([{"elapsed_s": 100.0, "return": 5.0}, {"elapsed_s": 120.4, "return": 9.0}], 3)
        [None, 9.0, 9.0]
    """
    out = []
    for minute in range(1, minutes + 1):
        # a snapshot is taken at the first update past each minute: allow it a second's lateness
        done = [p[key] for p in points if p["elapsed_s"] <= 60 * minute + 1.0]
        out.append(done[-1] if done else None)
    return out


def clock_minutes(points: list[dict], budget_minutes: float) -> int:
    """The whole minutes a run's clock reached in its budget: all of them for a recipe run, fewer for a TorchRL
    script's, whose clock leaves off its evaluations' seconds (:func:`evaluation_seconds`).

    Examples:
        >>> clock_minutes([{"elapsed_s": 30.0}], 12.5), clock_minutes([{"elapsed_s": 30.0, "eval_s": 45.0}] * 2, 20)
        (13, 18)
    """
    evaluating = evaluation_seconds(points)
    return math.floor(budget_minutes - evaluating / 60) if evaluating else math.ceil(budget_minutes)


def evaluation_seconds(points: list[dict]) -> float:
    """The seconds a TorchRL script spent in its own evaluations (the points' ``eval_s``), which its clock leaves off.

    Example:
        >>> evaluation_seconds([{"eval_s": 30.0}, {"eval_s": None}, {}])
        30.0
    """
    return sum(point.get("eval_s") or 0.0 for point in points)


def mean_with_interval(runs: dict[int, list[float | None]]) -> list[dict]:
    """Per minute over the seeds with a return by then: ``{"minute", "mean", "low", "high", "seeds"}``, the 90 %
    interval of the mean (``None`` below 3 seeds).

    Examples:
        >>> mean_with_interval({0: [None, 2.0], 1: [1.0, 4.0]})
        [{'minute': 1, 'mean': 1.0, 'low': None, 'high': None, 'seeds': 1}, \
{'minute': 2, 'mean': 3.0, 'low': None, 'high': None, 'seeds': 2}]
    """
    out = []
    for idx in range(max(len(curve) for curve in runs.values())):
        values = [curve[idx] for curve in runs.values() if idx < len(curve) and curve[idx] is not None]
        if values:
            interval = bootstrap_interval(values)
            out.append({"minute": idx + 1, "mean": statistics.fmean(values), "low": interval and interval[0],
                        "high": interval and interval[1], "seeds": len(values)})
    return out


def sb3_reference(sb3_runs: dict[int, dict], frames: int = 100_000) -> dict[str, float]:
    """SB3's mean return at ``frames`` and its mean wall-clock minutes to it, over ``learning.run_sb3``'s runs.

    Examples:
        >>> sb3_reference({0: {"curve": [(100000.0, 10.0)], "elapsed_at": {100000.0: 600.0}},
        ...                1: {"curve": [(100000.0, 20.0)], "elapsed_at": {100000.0: 1200.0}}})
        {'return': 15.0, 'minutes': 15.0}
    """
    returns = [dict(run["curve"])[float(frames)] for run in sb3_runs.values()]
    minutes = [run["elapsed_at"][float(frames)] / 60 for run in sb3_runs.values()]
    return {"return": statistics.fmean(returns), "minutes": statistics.fmean(minutes)}


def sb3_reference_missing(sb3_runs: dict[int, dict], frames: int = 100_000) -> str | None:
    """Why ``learning.run_sb3``'s runs give no :func:`sb3_reference` at ``frames``, or ``None`` when they all have an
    evaluation there: a run at a reduced ``--frames`` stops before it.

    Examples:
        >>> full = {"curve": [(100000.0, 10.0)], "elapsed_at": {100000.0: 600.0}}
        >>> sb3_reference_missing({0: full}) is None
        True
        >>> sb3_reference_missing({0: full, 3: {"curve": [(10000.0, 1.0)], "elapsed_at": {10000.0: 60.0}}})
        "SB3's run of seed 3 ends at 10000 frames, before the 100000-frame mark the reference is taken at \
(a reduced --frames)"
    """
    for seed, run in sb3_runs.items():
        if float(frames) not in dict(run["curve"]) or float(frames) not in run["elapsed_at"]:
            last = max((f for f, _ in run["curve"]), default=0.0)
            return (f"SB3's run of seed {seed} ends at {last:.0f} frames, before the {frames}-frame mark the reference "
                    "is taken at (a reduced --frames)")
    return None


def sb3_reference_from_results(saved: dict, source: str, algo: str = "sac") -> dict[str, float]:
    """:func:`sb3_reference` from a saved SB3 comparison (``sac_vs_sb3.json``, ``td3_vs_sb3.json`` with
    ``algo="td3"``): its ``sb3_<algo>`` holds per seed the returns at its marks and the minutes to the last.

    Examples:
        >>> saved = {"date": "2026-12-02", "torch": "2.13.0", "sb3_sac": {"0": {"returns": [1.0, 5.0], "minutes": 40.0},
        ...                                                             "1": {"returns": [2.0, 7.0], "minutes": 50.0}}}
        >>> sb3_reference_from_results(saved, "sac_vs_sb3.json")
        {'return': 6.0, 'minutes': 45.0, 'seeds': 2, 'source': 'sac_vs_sb3.json (2026-12-02, torch 2.13.0)'}
    """
    seeds = saved[f"sb3_{algo}"].values()
    return {"return": statistics.fmean(seed["returns"][-1] for seed in seeds),
            "minutes": statistics.fmean(seed["minutes"] for seed in seeds), "seeds": len(seeds),
            "source": results_source(saved, source)}


def results_source(saved: dict, path: str) -> str:
    """How a reference names the saved results it came from: their path, date and torch.

    Examples:
        >>> results_source({"date": "2026-12-05", "torch": "2.14.1"}, "wallclock.json")
        'wallclock.json (2026-12-05, torch 2.14.1)'
    """
    return f"{path} ({saved.get('date')}, torch {saved.get('torch')})"


def sb3_points(run: dict) -> list[dict]:
    """An SB3 run's evaluations (``curve``, ``elapsed_at``) as snapshot points for :func:`value_at_minutes`.

    Examples:
        >>> sb3_points({"curve": [(10000.0, 5.0)], "elapsed_at": {10000.0: 70.0}})
        [{'elapsed_s': 70.0, 'frames': 10000, 'return': 5.0}]
    """
    return [{"elapsed_s": run["elapsed_at"][frames], "frames": int(frames), "return": value}
            for frames, value in run["curve"]]


def wallclock_targets(curve: list[dict], reference: dict[str, float]) -> dict:
    """The two targets for one configuration's mean curve against SB3's ``reference`` (:func:`sb3_reference`).

    ``time_share``: the first minute the curve reaches SB3's mean return over SB3's minutes to it (``None`` if
    never); ``return_ratio_at_half``: the mean return at half of SB3's minutes over SB3's, its interval's low end above.

    Examples:
        >>> curve = [{"minute": m, "mean": 100.0 * m, "low": 90.0 * m, "high": 110.0 * m, "seeds": 5}
        ...          for m in range(1, 11)]
        >>> targets = wallclock_targets(curve, {"return": 400.0, "minutes": 20.0})
        >>> targets["time_share"], targets["return_ratio_at_half"], targets["low_above_sb3_at_half"]
        (0.2, 2.5, True)
    """
    reached = next((point["minute"] for point in curve if point["mean"] >= reference["return"]), None)
    half = math.floor(reference["minutes"] / 2)
    at_half = next((point for point in curve if point["minute"] == half), None)
    ratio = None if at_half is None else at_half["mean"] / reference["return"]
    low_above = None if at_half is None or at_half["low"] is None else at_half["low"] > reference["return"]
    return {
        "sb3_return": round(reference["return"], 1), "sb3_minutes": round(reference["minutes"], 1),
        "minute_reached": reached,
        "time_share": None if reached is None else round(reached / reference["minutes"], 3),
        "time_share_met": reached is not None and reached / reference["minutes"] <= TIME_SHARE_TARGET,
        "half_minute": half, "return_ratio_at_half": None if ratio is None else round(ratio, 3),
        "low_above_sb3_at_half": low_above,
        "return_ratio_met": bool(ratio is not None and ratio >= RETURN_RATIO_TARGET and low_above),
    }


def plot_against_minutes(path: Path, title: str, sides: dict[str, list[dict]],
                         reference: dict[str, float] | None = None) -> None:
    """Return against wall-clock minutes: each side's mean curve with its 90 % band, SB3's 100k mean as a line."""
    legend = {"fontsize": 8, "title": "config (seeds); band: 90 % interval of the mean", "title_fontsize": 7}
    with figure(path, title, "wall-clock minutes", "evaluation return (5 deterministic episodes)", size=(7, 4.2),
                dpi=110, legend=legend) as ax:
        for label, curve in sides.items():
            if not curve:
                continue
            minutes = [p["minute"] for p in curve]
            (line,) = ax.plot(minutes, [p["mean"] for p in curve], marker=".", label=f"{label} ({curve[-1]['seeds']})")
            banded = [p for p in curve if p["low"] is not None]
            if banded:
                ax.fill_between([p["minute"] for p in banded], [p["low"] for p in banded],
                                [p["high"] for p in banded], color=line.get_color(), alpha=0.2)
        if reference is not None:
            ax.axhline(reference["return"], color="grey", linestyle="--", linewidth=1)
            ax.axvline(reference["minutes"], color="grey", linestyle=":", linewidth=1)
            ax.annotate("SB3 mean at 100k frames", (reference["minutes"], reference["return"]), fontsize=8,
                        ha="right", va="bottom")


def markdown_table(sides: dict[str, dict]) -> list[str]:
    """One row per configuration: returns at chosen minutes, frames and updates done, and the targets."""
    lines = ["| config | seeds | minutes | return (mean, 90 % interval) by minute | frames | updates "
             f"| time share (<= {TIME_SHARE_TARGET}) | return ratio at half (>= {RETURN_RATIO_TARGET}) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for label, side in sides.items():
        curve, targets = side["curve"], side.get("targets") or {}
        marks = [p for p in curve if p["minute"] in (1, 2, 5, 10, 15, 20, 30) or p is curve[-1]]
        shown = ", ".join(f"{p['minute']}: {p['mean']:.0f}"
                          + (f" [{p['low']:.0f}, {p['high']:.0f}]" if p["low"] is not None else "") for p in marks)
        lines.append(f"| {label} | {side['seeds']} | {side['minutes']} | {shown} | {side['frames']} "
                     f"| {side['updates']} | {targets.get('time_share')} | {targets.get('return_ratio_at_half')} |")
    return lines
