"""What a training run reports: TorchRL logger scalars, a tqdm bar and learning-curve plots.

:func:`make_logger` opens a TorchRL logger (CSV by default; TensorBoard or
W&B when selected and installed). :class:`RunLogger` turns the learner's
counters into the logged values -- losses, returns, achieved update-to-data
ratio, collector frames/s, learner updates/s, policy lag -- and
:class:`LearningCurve` keeps the evaluation returns and draws them against
frames and wall-clock time.
"""

from __future__ import annotations

import importlib.util
import math
import os
import time
from collections.abc import Mapping
from typing import Any

import torch
from tensordict import TensorDictBase
from torchrl.record.loggers import Logger, get_logger
from tqdm import tqdm

__all__ = ["LOGGER_BACKENDS", "LearningCurve", "RunLogger", "make_logger"]

#: Accepted values of ``logger.backend`` (``"none"`` logs nothing but the bar and plots).
LOGGER_BACKENDS: dict[str, str | None] = {"csv": None, "tensorboard": "tensorboard", "wandb": "wandb", "none": None}


def make_logger(
    backend: str, log_dir: str, exp_name: str, *, project_name: str | None = None,
    state_dict: Mapping[str, Any] | None = None,
) -> Logger | None:
    """Opens TorchRL's logger for ``backend`` (``csv``, ``tensorboard``, ``wandb`` or ``none``).

    CSV files go to ``<log_dir>/<exp_name>/scalars/<name>.csv``, one
    ``step,value`` line per call, appended to on resume.

    Args:
        backend: one of :data:`LOGGER_BACKENDS`.
        log_dir: the logger's directory.
        exp_name: the experiment name.

    Keyword Args:
        project_name: the W&B project.
        state_dict: a saved ``logger.state_dict()`` to resume (CSV, TensorBoard, W&B).

    Examples:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     logger = make_logger("csv", tmp, "run")
        ...     logger.log_scalar("eval/return", 1.5, step=100)
        ...     open(f"{tmp}/run/scalars/eval/return.csv").read()
        '100,1.5\\n'
    """
    if backend not in LOGGER_BACKENDS:
        raise ValueError(f"logger.backend must be one of {sorted(LOGGER_BACKENDS)}, got {backend!r}")
    package = LOGGER_BACKENDS[backend]
    if package is not None and importlib.util.find_spec(package) is None:
        raise ImportError(f"logger.backend={backend!r} needs the {package!r} package: pip install {package}")
    if backend == "none":
        return None
    kwargs: dict[str, Any] = {}
    if backend == "wandb":
        kwargs["wandb_kwargs"] = {"project": project_name, "dir": log_dir}
    return get_logger(backend, logger_name=log_dir, experiment_name=exp_name, state_dict=state_dict, **kwargs)


class LearningCurve:
    """Evaluation returns against frames and wall-clock time, drawn into a PNG.

    Examples:
        >>> import os, tempfile
        >>> curve = LearningCurve()
        >>> curve.add(frames=1000, seconds=10.0, value=-900.0)
        >>> curve.add(frames=2000, seconds=20.0, value=-300.0)
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     curve.plot(f"{tmp}/curve.png", title="SAC Pendulum-v1")
        ...     os.path.getsize(f"{tmp}/curve.png") > 0
        True
        >>> LearningCurve.from_state(curve.state()).points == curve.points
        True
    """

    def __init__(self) -> None:
        self.points: list[tuple[int, float, float]] = []

    def add(self, *, frames: int, seconds: float, value: float) -> None:
        """Appends one evaluation."""
        self.points.append((int(frames), float(seconds), float(value)))

    def state(self) -> list[list[float]]:
        """The points as plain lists, for a checkpoint."""
        return [list(p) for p in self.points]

    @classmethod
    def from_state(cls, state: list) -> LearningCurve:
        """Rebuilds a curve from :meth:`state`."""
        curve = cls()
        for frames, seconds, value in state:
            curve.add(frames=int(frames), seconds=float(seconds), value=float(value))
        return curve

    def plot(self, path: str | os.PathLike, *, title: str = "") -> None:
        """Writes a PNG: return against frames (left) and against wall-clock minutes (right)."""
        # The Agg canvas directly: no pyplot, no global backend switch in the caller's process.
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        fig = Figure(figsize=(10, 4), dpi=100)
        FigureCanvasAgg(fig)
        frames = [p[0] for p in self.points]
        minutes = [p[1] / 60 for p in self.points]
        values = [p[2] for p in self.points]
        for ax, xs, label in zip(fig.subplots(1, 2), (frames, minutes), ("frames", "wall-clock time (min)")):
            ax.plot(xs, values, marker="o", markersize=3)
            ax.set_xlabel(label)
            ax.set_ylabel("deterministic eval return")
            ax.grid(alpha=0.3)
        if title:
            fig.suptitle(title)
        fig.tight_layout()
        tmp = f"{os.fspath(path)}.tmp.png"
        fig.savefig(tmp)
        os.replace(tmp, path)


class RunLogger:
    """The run's reporting: averaged losses, rates, evaluations, the progress bar and the plot.

    Between two :meth:`log_training` calls it sums the losses of each update
    (:meth:`add_losses`); each call logs their means and the window's rates at
    ``step=frames``. Wall-clock time continues across resumes (``elapsed``).

    Args:
        logger: a TorchRL logger, or ``None``.
        plot_path: where the learning-curve PNG goes.
        total_frames: the run's frame budget (the bar's length).

    Keyword Args:
        frames: frames already collected (resumed runs).
        updates: updates already done (resumed runs).
        elapsed: wall-clock seconds already spent (resumed runs).
        curve: the evaluations so far (resumed runs).
        title: the plot's title.
        progress_bar: show a tqdm bar.

    Examples:
        >>> import tempfile, torch
        >>> from tensordict import TensorDict
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     run = RunLogger(None, f"{tmp}/curve.png", total_frames=1000, progress_bar=False)
        ...     run.add_losses(TensorDict({"loss_qvalue": torch.tensor(2.0)}))
        ...     values = run.log_training(frames=500, updates=1, extra={"utd/achieved": 1.0})
        ...     run.log_eval(frames=500, values={"eval/return": -10.0})
        ...     run.close()
        >>> values["train/loss_qvalue"], run.last_eval
        (2.0, -10.0)
    """

    def __init__(
        self,
        logger: Logger | None,
        plot_path: str | os.PathLike,
        total_frames: int,
        *,
        frames: int = 0,
        updates: int = 0,
        elapsed: float = 0.0,
        curve: LearningCurve | None = None,
        title: str = "",
        progress_bar: bool = True,
    ) -> None:
        self.logger = logger
        self.plot_path = os.fspath(plot_path)
        self.curve = curve or LearningCurve()
        self.title = title
        self._elapsed0 = float(elapsed)
        self._start = time.perf_counter()
        self._sums: dict[str, torch.Tensor] = {}
        self._count = 0
        self._window = (time.perf_counter(), int(frames), int(updates))
        self.last_eval = self.curve.points[-1][2] if self.curve.points else math.nan
        # No tqdm object at all when disabled: its first instance creates a
        # process-wide multiprocessing lock (a /dev/shm semaphore) that lives until exit.
        self.bar = (tqdm(total=int(total_frames), initial=int(frames), unit="frame", dynamic_ncols=True)
                    if progress_bar else None)

    @property
    def elapsed(self) -> float:
        """Wall-clock seconds of the run, resumed runs included."""
        return self._elapsed0 + time.perf_counter() - self._start

    def add_losses(self, losses: TensorDictBase) -> None:
        """Adds one update's scalar losses (``loss_*``, ``alpha``, ``entropy``) to the window."""
        for key, value in losses.items():
            if isinstance(key, str) and value.ndim == 0:
                self._sums[key] = self._sums[key] + value if key in self._sums else value.clone()
        self._count += 1

    def log_training(self, *, frames: int, updates: int, extra: Mapping[str, float] | None = None) -> dict[str, float]:
        """Logs the window's mean losses, learner updates/s, collector frames/s and ``extra``; returns them."""
        now = time.perf_counter()
        t0, frames0, updates0 = self._window
        dt = max(now - t0, 1e-9)
        values = {f"train/{k}": float(v) / self._count for k, v in self._sums.items()} if self._count else {}
        values["learner/updates_per_s"] = (updates - updates0) / dt
        values["collector/frames_per_s"] = (frames - frames0) / dt
        values["time/elapsed_s"] = self.elapsed
        values.update(extra or {})
        self._sums, self._count = {}, 0
        self._window = (now, frames, updates)
        self._write(values, frames)
        if self.bar is not None:
            self.bar.update(max(0, frames - self.bar.n))
            self.bar.set_postfix(
                {"updates/s": f"{values['learner/updates_per_s']:.0f}",
                 "frames/s": f"{values['collector/frames_per_s']:.0f}", "eval": f"{self.last_eval:.1f}"},
                refresh=False,
            )
        return values

    def log_eval(self, *, frames: int, values: Mapping[str, float]) -> None:
        """Logs an evaluation, adds it to the curve and redraws the PNG."""
        self.last_eval = float(values["eval/return"])
        self._write(dict(values), frames)
        self.curve.add(frames=frames, seconds=self.elapsed, value=self.last_eval)
        self.curve.plot(self.plot_path, title=self.title)

    def _write(self, values: Mapping[str, float], step: int) -> None:
        if self.logger is None:
            return
        for key, value in values.items():
            if not math.isnan(value):
                self.logger.log_scalar(key, value, step=step)

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps: elapsed time, the curve and the logger's own state."""
        out: dict[str, Any] = {"elapsed": self.elapsed, "curve": self.curve.state()}
        if self.logger is not None and hasattr(self.logger, "state_dict"):
            try:
                out["logger"] = _plain(self.logger.state_dict())
            except (NotImplementedError, TypeError):
                pass
        return out

    def close(self) -> None:
        """Closes the bar (the logger writes as it goes)."""
        if self.bar is not None:
            self.bar.close()


def _plain(value: Any) -> Any:
    # Checkpoints are read with weights_only=True: keep to dicts, lists and scalars.
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    raise TypeError(f"cannot keep a {type(value).__name__} in a checkpoint")
