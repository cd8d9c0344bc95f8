"""TorchRL's own off-policy scripts and trainers, run with ``OffPolicyCollector`` swapped in.

Run::

    python benchmarks/sota_dropin.py --rl-root ~/src/rl                      # a work tree of pytorch/rl
    python benchmarks/sota_dropin.py --rl-root ~/src/rl --only sac,td3,sac_trainer --frames 3000 -v

See ``benchmarks/README.md``, section "TorchRL's own scripts, collector swapped". It lists every substitution and
override (:func:`prepare`, :data:`SCRIPTS`).
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import json
import shutil
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from common import (
    first_error,
    open_rl,
    provenance,
    run_in_own_group,
    shm_entries,
    shm_left,
    torchrl_version,
    with_pythonpath,
    work_dir,
)

REPO_ROOT = Path(__file__).resolve().parents[1]
SWAP_TARGET = "torchrl_unilab.OffPolicyCollector"
#: Collector classes of ``torchrl.collectors`` that scripts construct (current and legacy names).
COLLECTOR_CLASSES = frozenset({
    "Collector", "SyncDataCollector", "AsyncCollector", "aSyncDataCollector",
    "MultiSyncCollector", "MultiSyncDataCollector", "MultiAsyncCollector", "MultiaSyncDataCollector",
})
#: The collector helpers of ``torchrl.trainers.helpers`` (REDQ), rebound to ``_make_collector``.
HELPERS = frozenset({"sync_sync_collector", "sync_async_collector"})
SWAP_MARK = "  # sota_dropin: collector swapped"


# ------------------------------------------------------------------ the swap
def swap_collector_imports(source: str, target: str = SWAP_TARGET) -> tuple[str, list[str]]:
    """``source`` (a Python file's text) made to build ``target`` (``"module.Class"``) wherever it builds one of
    TorchRL's collectors, and one description per swapped name. Line numbers are kept, so tracebacks point at the
    checkout's lines.

    Examples:
        >>> new, swapped = swap_collector_imports(
        ...     "from torchrl.collectors import BaseCollector, Collector  # why\\nx = Collector(env)\\n")
        >>> print(new)  # doctest: +NORMALIZE_WHITESPACE
        from torchrl.collectors import BaseCollector, Collector;
        from torchrl_unilab import OffPolicyCollector as Collector  # sota_dropin: collector swapped  # why
        x = Collector(env)
        <BLANKLINE>
        >>> swapped
        ['Collector -> torchrl_unilab.OffPolicyCollector']
    """
    module, _, cls = target.rpartition(".")
    if not module:
        raise ValueError(f"target must be 'module.Class', got {target!r}")
    lines = source.splitlines(keepends=True)
    inserts: list[tuple[int, int, str]] = []  # (line index, byte column, text)
    swapped: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.ImportFrom) or node.level:
            continue
        bound = [alias.asname or alias.name for alias in node.names
                 if (node.module == "torchrl.collectors" and alias.name in COLLECTOR_CLASSES)
                 or (node.module == "torchrl.trainers.helpers" and alias.name in HELPERS)]
        if not bound:
            continue
        if node.module == "torchrl.collectors":
            text = f"; from {module} import " + ", ".join(f"{cls} as {name}" for name in bound)
        else:
            text = (f"; from functools import partial as _sota_dropin_partial"
                    f"; from torchrl.trainers.helpers.collectors import _make_collector as _sota_dropin_make"
                    f"; from {module} import {cls} as _SotaDropinCollector"
                    f"; {' = '.join(bound)} = _sota_dropin_partial(_sota_dropin_make, _SotaDropinCollector)")
        inserts.append((node.end_lineno - 1, node.end_col_offset, text + SWAP_MARK))
        swapped += [f"{name} -> {target}" for name in bound]
    # end_col_offset counts UTF-8 bytes; inserting from the end keeps earlier offsets valid.
    for index, column, text in sorted(inserts, reverse=True):
        raw = lines[index].encode()
        body, newline = raw.rstrip(b"\r\n"), raw[len(raw.rstrip(b"\r\n")):]
        rest = body[column:].decode()
        # A statement that goes on after a ';' must not be commented out by the mark.
        text = text.replace(SWAP_MARK, "") if rest.strip() and not rest.lstrip().startswith("#") else text
        lines[index] = (body[:column].decode() + text + rest).rstrip() + newline.decode()
    return "".join(lines), swapped


@dataclasses.dataclass(frozen=True)
class TextEdit:
    """A literal substitution in one file of a script's folder, for what no override reaches."""

    file: str
    old: str
    new: str
    why: str

    def apply(self, folder: Path) -> str | None:
        """Applies the edit in ``folder``; returns its description, or ``None`` if ``old`` is absent."""
        path = folder / self.file
        text = path.read_text()
        count = text.count(self.old)
        if not count:
            return None
        path.write_text(text.replace(self.old, self.new))
        return f"{self.file}: {self.old!r} -> {self.new!r} x{count} ({self.why})"


# --------------------------------------------------------------- the scripts
@dataclasses.dataclass(frozen=True)
class Budget:
    """What each run may spend, turned into each script's hydra overrides."""

    frames: int
    envs: int
    utd: float
    compile: bool = False  # --compile: the scripts' own compile.compile=true

    @property
    def compile_overrides(self) -> list[str]:
        return ["compile.compile=true"] if self.compile else []

    @property
    def frames_per_batch(self) -> int:
        return max(self.frames // 6, 1)

    @property
    def random_frames(self) -> int:
        return self.frames // 3

    @property
    def eval_every(self) -> int:
        return max(self.frames // 2, 1)

    @property
    def buffer(self) -> int:
        return 2 * self.frames


@dataclasses.dataclass(frozen=True)
class Script:
    """One of TorchRL's scripts: where it is, and how to run it small on CPU."""

    name: str  # the --only key
    path: str  # relative to sota-implementations/
    overrides: Callable[[Budget], list[str]]
    trainer: bool = False
    edits: tuple[TextEdit, ...] = ()
    renders: bool = False  # builds a pixel env whatever its config says (REDQ's recorder)
    variant: str = ""  # what sets this run apart from the script's plain one, e.g. "replay_buffer.prb=1"
    #: makes what the script loads (an offline dataset) in its folder before it runs, and returns the environment
    #: entries that point the script at it
    setup: Callable[[Path, Budget], dict[str, str]] | None = None

    @property
    def folder(self) -> str:
        return self.path.split("/")[0]

    @property
    def label(self) -> str:
        """How the run is named in the output: the path, and the variant if any ("sac/sac.py (replay_buffer.prb=1)")."""
        return f"{self.path} ({self.variant})" if self.variant else self.path


def _frames(b: Budget) -> list[str]:
    """The first overrides of the off-policy scripts: the frames in all, the random ones, those of a batch."""
    return [f"collector.total_frames={b.frames}", f"collector.init_random_frames={b.random_frames}",
            f"collector.frames_per_batch={b.frames_per_batch}"]


def _off_policy(b: Budget, *, envs: bool = False, eval_key: str = "eval_iter",
                extra: Sequence[str] = ()) -> list[str]:
    """The overrides of a plain off-policy script; ``envs``: its stock config batches several envs (a single env
    stays single); ``eval_key``: its ``logger.`` key of the evaluation interval."""
    return [*_frames(b), f"optim.utd_ratio={b.utd}", "logger.backend=", *b.compile_overrides,
            *([f"collector.env_per_collector={b.envs}"] if envs else []), f"replay_buffer.size={b.buffer}",
            f"logger.{eval_key}={b.eval_every}", *extra]


def _sac_async(b: Budget) -> list[str]:
    # log_freq counts updates (1,000 in all once total_iter is 1): two evals; update_freq: four weight pushes.
    # collector.device: its config's "cuda:1" emptied, so that the script's own device choice runs.
    return [*_frames(b), "collector.device=", f"collector.env_per_collector={b.envs}", "collector.update_freq=250",
            f"replay_buffer.size={b.buffer}", "logger.backend=", "logger.log_freq=500", *b.compile_overrides]


def _redq(b: Budget) -> list[str]:
    # steps_per_batch is REDQ's updates per batch; record_frames the length of its eval rollouts (10,000 steps
    # each in its config, run once at start-up too, rendering pixels); init_env_steps the observation-statistics
    # rollout. Its stock buffer is prioritized (buffer.prb=1), on TorchRL's C++ segment trees: kept.
    return [*_frames(b), f"optim.steps_per_batch={max(int(b.frames_per_batch * b.utd), 1)}",
            f"buffer.size={b.buffer}", "env.init_env_steps=1000", "logger.backend=", "logger.record_frames=250",
            "logger.record_interval=2"]


def _trainer(b: Budget, *extra: str) -> list[str]:
    return [f"collector.total_frames={b.frames}", f"collector.frames_per_batch={b.frames_per_batch}",
            f"replay_buffer.storage.max_size={b.buffer}", "trainer.logger=null",
            f"collector.init_random_frames={b.random_frames}", *extra]


SAC_ASYNC_EDITS = (
    TextEdit("sac-async.py", '"cuda:1"', '("cuda:1" if torch.cuda.device_count() > 1 else "cpu")',
             "TorchRL's hard-coded device for the exploration policy, kept where the machine has it; no override "
             "reaches it"),
    TextEdit("sac-async.py", "total_iter = 1000", "total_iter = 1",
             "TorchRL's hard-coded 1000 x 1000 updates; 1000 remain"),
    TextEdit("sac-async.py", "    compile_mode = None\n", "    compile_mode = compile_mode_collector = None\n",
             "TorchRL's bug: compile_mode_collector is only set when compile.compile is true"),
    TextEdit("sac-async.py", "    _, eval_env = make_environment(cfg, logger=logger)\n",
             "    _, eval_env = make_environment(cfg, logger=logger); _.close()\n",
             "TorchRL's bug: the seeded ParallelEnv it discards is never closed, and the interpreter waits for its "
             "processes at exit, with any collector"),
)

SAC_PRB_EDITS = (
    TextEdit("sac.py", "replay_buffer.update_priority(sampled_tensordict)",
             "replay_buffer.update_tensordict_priority(sampled_tensordict)",
             "TorchRL's bug: TensorDictPrioritizedReplayBuffer.update_priority takes (index, priority), and "
             "sac.py's prb path fails with TorchRL's own collector too (--stock)"),
)

OFFLINE_TO_ONLINE_EDITS = (
    TextEdit("train.py", "clip_grad_norm=False,", "clip_grad_norm=False, enable_logging=False,",
             "TorchRL's bug: SACTrainer's logging hooks read (\"next\", \"reward_sum\"), which the script's env does "
             "not write, and the replay buffer's write_count, which OfflineToOnlineReplayBuffer does not have; the "
             "script fails at its first batch with TorchRL's own collector too (--stock)"),
    TextEdit("train.py", "    offline.append_transform(DoubleToFloat())\n",
             "    offline.append_transform(DoubleToFloat()); "
             "offline.sample = lambda n=None, _sample=offline.sample: _sample(n).exclude(\"index\")\n",
             "TorchRL's bug: a TorchRL dataset's sample() adds \"index\", which the online rows never have, and "
             "OfflineToOnlineReplayBuffer.sample() fails to concatenate the two (with TorchRL's own collector too, "
             "--stock)"),
)
#: The offline dataset of offline_to_online/train.py: rows of a run of ours, in TorchRL's Minari cache.
OFFLINE_ENV, OFFLINE_DATASET = "Pendulum-v1", "unilab/pendulum/random-v0"
#: The keys TorchRL's Minari datasets hold, taken from the rows of our run.
OFFLINE_KEYS = ("observation", "action", ("next", "observation"), ("next", "reward"), ("next", "done"),
                ("next", "terminated"), ("next", "truncated"))


def _box(space) -> dict:
    """A gymnasium Box as TorchRL's MinariExperienceReplay reads it from its ``env_metadata.json``."""
    return {"type": "Box", "low": space.low.tolist(), "high": space.high.tolist(), "dtype": str(space.dtype),
            "shape": list(space.shape)}


def make_offline_dataset(folder: Path, budget: Budget) -> dict[str, str]:
    """Collects ``budget.frames`` transitions of :data:`OFFLINE_ENV` with uniformly random actions (our collector,
    one worker) and stores them where TorchRL's ``load_dataset("minari:<id>")`` finds a dataset it downloaded
    before: ``$HOME/.cache/torchrl/minari/<id>/``, a memory-mapped TensorDict and ``env_metadata.json``. Returns
    ``HOME``, the script's home (``<folder>/home``), so that the script's own ``--dataset`` loader reads it."""
    import gymnasium

    from torchrl_unilab import OffPolicyCollector, make_replay_buffer

    rb = make_replay_buffer(budget.frames)
    with OffPolicyCollector(OFFLINE_ENV, num_envs=2, frames_per_batch=max(budget.frames // 6, 2),
                            total_frames=budget.frames, init_random_frames=budget.frames, replay_buffer=rb,
                            seed=0) as collector:
        for _ in collector:
            pass
    home = folder / "home"
    dataset = home / ".cache" / "torchrl" / "minari" / OFFLINE_DATASET
    rb[:].select(*OFFLINE_KEYS).clone().memmap(dataset)
    env = gymnasium.make(OFFLINE_ENV)
    (dataset / "env_metadata.json").write_text(json.dumps({"observation_space": _box(env.observation_space),
                                                           "action_space": _box(env.action_space)}))
    env.close()
    return {"HOME": str(home)}


def _offline_to_online(b: Budget) -> list[str]:
    # Its own argparse options, not hydra's. Its --utd counts updates per batch; the benchmark's, per frame.
    return ["--env", OFFLINE_ENV, "--dataset", f"minari:{OFFLINE_DATASET}", "--total-frames", str(b.frames),
            "--frames-per-batch", str(b.frames_per_batch), "--utd", str(max(int(b.frames_per_batch * b.utd), 1)),
            "--online-capacity", str(b.buffer)]


# crossq's and discrete_sac's stock env.library is "gym", the pre-gymnasium package: gymnasium runs the same tasks.
GYMNASIUM = ["env.library=gymnasium"]

SCRIPTS: tuple[Script, ...] = (
    Script("sac", "sac/sac.py", lambda b: _off_policy(b, envs=True)),
    # The same script on TorchRL's prioritized replay (its C++ segment trees), which our workers' rows must reach.
    Script("sac_prb", "sac/sac.py", lambda b: _off_policy(b, envs=True, extra=["replay_buffer.prb=1"]),
           variant="replay_buffer.prb=1", edits=SAC_PRB_EDITS),
    Script("sac-async", "sac/sac-async.py", _sac_async, edits=SAC_ASYNC_EDITS),
    Script("td3", "td3/td3.py", lambda b: _off_policy(b, envs=True)),
    Script("ddpg", "ddpg/ddpg.py", _off_policy),
    Script("tqc", "tqc/tqc.py", lambda b: _off_policy(b, envs=True)),
    Script("crossq", "crossq/crossq.py", lambda b: _off_policy(b, extra=GYMNASIUM)),
    Script("redq", "redq/redq.py", _redq, renders=True),
    Script("iql", "iql/iql_online.py", _off_policy),
    Script("cql", "cql/cql_online.py", lambda b: _off_policy(b, eval_key="log_interval")),
    Script("discrete_sac", "discrete_sac/discrete_sac.py", lambda b: _off_policy(b, extra=GYMNASIUM)),
    # Offline dataset plus online fine-tuning (OfflineToOnlineTrainer); the dataset is made by a run of ours.
    Script("offline_to_online", "offline_to_online/train.py", _offline_to_online, edits=OFFLINE_TO_ONLINE_EDITS,
           setup=make_offline_dataset),
    # The trainers: 2 collector workers (stock 4) keep the multi-worker path on 2 cores.
    Script("sac_trainer", "sac_trainer/train.py",
           lambda b: _trainer(b, "collector.num_workers=2", f"training_env.num_workers={b.envs}"), trainer=True),
    Script("td3_trainer", "td3_trainer/train.py",
           lambda b: _trainer(b, "networks.policy_network.device=cpu", "networks.qvalue_network.device=cpu",  # mps
                              f"training_env.base_env.num_workers={b.envs}"), trainer=True),
    Script("ddpg_trainer", "ddpg_trainer/train.py", _trainer, trainer=True),
)


def select_scripts(only: str | None) -> list[Script]:
    """The scripts named by ``--only`` (names or paths, comma-separated), in table order; all for ``None``.
    :class:`ValueError` names the accepted ones if one is unknown."""
    if only is None:
        return list(SCRIPTS)
    wanted = [item.strip() for item in only.split(",") if item.strip()]
    # a path names the first script run from it (sac/sac.py: "sac", not its "sac_prb" variant)
    known = {s.path: s for s in reversed(SCRIPTS)} | {s.name: s for s in SCRIPTS}
    for item in wanted:
        if item not in known:
            raise ValueError(f"--only: unknown script {item!r}; accepted: {', '.join(s.name for s in SCRIPTS)} "
                             f"(or their paths, e.g. {SCRIPTS[0].path})")
    chosen = {known[item].name for item in wanted}
    return [s for s in SCRIPTS if s.name in chosen]


# ------------------------------------------------------------- the checkout
def open_checkout(rl_root: Path, workdir: Path) -> tuple[Path, str]:
    """``(sota-implementations directory, commit)`` of a work tree, or of a bare repository's HEAD (extracted under
    ``workdir``)."""
    checkout = open_rl(rl_root, "sota-implementations/")
    if not checkout.bare:
        return rl_root / "sota-implementations", checkout.commit
    checkout.copy(["sota-implementations"], workdir)
    return workdir / "sota-implementations", checkout.commit


@dataclasses.dataclass
class Result:
    status: str  # "ok" or "failed"
    seconds: float
    error: str | None = None
    notes: list[str] = dataclasses.field(default_factory=list)
    swaps: list[str] = dataclasses.field(default_factory=list)  # the collector swap, file by file
    edits: list[str] = dataclasses.field(default_factory=list)  # the TextEdits applied (sac-async.py)
    command: str = ""
    exit_after_output_s: float | None = None  # seconds from its last output to its exit

    def line(self, path: str) -> str:
        exited = "" if self.exit_after_output_s is None else f"; exit {self.exit_after_output_s:.1f} s after output"
        head = f"{path}: ok ({self.seconds:.0f} s{exited})" if self.status == "ok" else f"{path}: FAILED: {self.error}"
        return head + "".join(f" [{note}]" for note in self.notes)


def prepare(script: Script, sota: Path, workdir: Path, stock: bool) -> tuple[Path, list[str], list[str]]:
    """Copies the script's folder under ``workdir`` and substitutes there: ``(folder, swaps, edits)``.

    ``swaps``: the collector imports swapped (:func:`swap_collector_imports`; none with ``stock`` or for a trainer,
    which swaps through :func:`command_for`'s override); ``edits``: the :class:`TextEdit` descriptions applied.
    :class:`RuntimeError` if a script's folder has no collector import to swap. Every substitution is listed in
    ``benchmarks/README.md``, section "TorchRL's own scripts, collector swapped".
    """
    folder = workdir / script.name
    shutil.copytree(sota / script.folder, folder)
    edits = [done for done in (edit.apply(folder) for edit in script.edits) if done]
    swaps: list[str] = []
    if stock or script.trainer:  # the trainers swap through a hydra override
        return folder, swaps, edits
    for path in sorted(folder.rglob("*.py")):
        new, swapped = swap_collector_imports(path.read_text())
        if swapped:
            path.write_text(new)
            swaps += [f"{path.relative_to(folder)}: {item}" for item in swapped]
    if not swaps:  # never report a stock run as ours
        raise RuntimeError(f"{script.path}: no collector import to swap in {script.folder}/*.py (looked for "
                           f"'from torchrl.collectors import' {sorted(COLLECTOR_CLASSES)} and "
                           f"'from torchrl.trainers.helpers import' {sorted(HELPERS)})")
    return folder, swaps, edits


def command_for(script: Script, budget: Budget, trainer_collector: str, trainer_import: str | None,
                stock: bool, extra: Sequence[str] = ()) -> list[str]:
    """The command line of one run (its cwd is the script's temporary folder); ``extra`` (``--set``) comes after the
    budget's overrides, so hydra lets it win.

    Examples:
        >>> td3 = select_scripts("td3")[0]
        >>> command_for(td3, Budget(3000, 2, 1.0), SWAP_TARGET, None, False, ["logger.eval_iter=1000"])[-2:]
        ['logger.eval_iter=1500', 'logger.eval_iter=1000']
    """
    file = script.path.split("/", 1)[1]
    overrides = [*script.overrides(budget), *extra]
    if not script.trainer or stock:
        return [sys.executable, file, *overrides]
    if "." in trainer_collector:  # a class path: the override of the stock config's target
        return [sys.executable, file, f"collector._target_={trainer_collector}", *overrides]
    if not trainer_import:  # a config-store name registered by TorchRL itself or by a hydra plugin
        return [sys.executable, file, f"collector={trainer_collector}", *overrides]
    # A name that only an import registers: it must run before hydra composes the config.
    boot = (f"import importlib, runpy, sys; importlib.import_module({trainer_import!r}); "
            "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')")
    return [sys.executable, "-c", boot, file, f"collector={trainer_collector}", *overrides]


def run_one(script: Script, sota: Path, workdir: Path, budget: Budget, timeout: float, *,
            trainer_collector: str, trainer_import: str | None, stock: bool, extra: Sequence[str] = (),
            exit_within: float | None = None) -> Result:
    """Runs one script in its own process group (:func:`common.run_in_own_group`), its output into
    ``<workdir>/<name>/sota_dropin.log``; never raises for the script's failures.

    A run whose exit comes more than ``exit_within`` seconds after its last output fails; a ``/dev/shm`` entry it
    leaves is reported in the result's notes, not removed.
    """
    try:
        folder, swaps, edits = prepare(script, sota, workdir, stock)
    except (OSError, RuntimeError, SyntaxError) as err:
        return Result("failed", 0.0, error=f"{type(err).__name__}: {err}")
    cmd = command_for(script, budget, trainer_collector, trainer_import, stock, extra)
    env = with_pythonpath(REPO_ROOT, HYDRA_FULL_ERROR="1", WANDB_MODE="disabled", PYTHONFAULTHANDLER="1")
    if script.renders:  # headless: EGL unless the user chose a GL backend
        env.setdefault("MUJOCO_GL", "egl")
        env.setdefault("PYOPENGL_PLATFORM", env["MUJOCO_GL"])
    # What the scripts leave in the temporary directory (multiprocessing's pymp-* folders, sac-async's memmapped
    # buffer) goes with the work directory.
    env["TMPDIR"] = str(folder / "tmp")
    (folder / "tmp").mkdir(exist_ok=True)
    if script.setup is not None:
        try:
            env.update(script.setup(folder, budget))
        except Exception as err:  # noqa: BLE001 - reported as the run's failure, as the script's own would be
            return Result("failed", 0.0, error=f"setup {script.setup.__name__}: {type(err).__name__}: {err}",
                          swaps=swaps, edits=edits)
    log_path = folder / "sota_dropin.log"
    shm_before = shm_entries()
    run = run_in_own_group(cmd, folder, env, log_path, timeout)
    # What the script printed, without the stack dumps of a timeout.
    output = log_path.read_text(errors="replace").split("Fatal Python error: Aborted")[0]
    result = Result("ok", run.seconds, swaps=swaps, edits=edits, command=" ".join(cmd),
                    exit_after_output_s=None if run.exit_after_output_s is None else round(run.exit_after_output_s, 1))
    error = first_error(output)
    last = next((line.strip() for line in reversed(output.splitlines()) if line.strip()), "")
    if run.timed_out:
        result.status = "failed"
        if error:  # it failed, then hung on the way out: the failure is the error
            result.error = error
            result.notes.append(f"then hung until the --timeout of {timeout:.0f} s (killed)")
        else:
            result.error = f"timeout after {timeout:.0f} s (killed; last output: {last[-300:]!r})"
        result.notes.append(f"the stacks of its {run.dumped} process(es) at the timeout are in its log (--keep)")
    elif run.returncode != 0:
        result.status = "failed"
        result.error = error or f"exit code {run.returncode} (last output: {last[-300:]!r})"
    elif error:
        result.notes.append(f"exit 0, but the output holds a traceback: {error[:300]}")
    elif exit_within is not None and run.exit_after_output_s > exit_within:
        result.status = "failed"
        result.error = (f"exited {run.exit_after_output_s:.1f} s after its last output (its last update), "
                        f"more than --exit-within {exit_within:g} s")
    if run.leftovers and not run.timed_out:
        shown = "; ".join(f"{pid}: {cmd[:120]}" for pid, cmd in sorted(run.leftovers.items()))
        result.notes.append(f"{len(run.leftovers)} process(es) of its group alive 10 s after it exited, killed: "
                            f"{shown}")
    left = shm_left(shm_before)
    if left:
        result.notes.append(f"left in /dev/shm (made during the run, held by no live process; on a shared "
                            f"machine another job's cannot be told apart): {left}")
    return result


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rl-root", type=Path, required=True,
                        help="a pytorch/rl work tree (holding sota-implementations/) or a bare git dir (HEAD is used)")
    parser.add_argument("--only", help="comma-separated names or paths: " + ",".join(s.name for s in SCRIPTS))
    parser.add_argument("--frames", type=int, default=3000, help="total frames per script (>= 600)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per script before its group is killed")
    parser.add_argument("--envs", type=int, default=2, help="envs per batched env where the stock config has more")
    parser.add_argument("--utd", type=float, default=0.1, help="optim.utd_ratio where the script has one")
    parser.add_argument("--trainer-collector", default=SWAP_TARGET,
                        help="the trainers' collector: a class path (collector._target_=...) or a config-store "
                             "name (collector=NAME)")
    parser.add_argument("--trainer-import", default=None,
                        help="with a --trainer-collector name: a module whose import registers it, imported "
                             "before the trainer runs (not needed for names registered by a hydra plugin)")
    parser.add_argument("--set", nargs="+", default=[], metavar="KEY=VALUE", dest="extra",
                        help="hydra overrides applied after the budget's, e.g. for a learning run: "
                             "collector.init_random_frames=10000 logger.eval_iter=10000 logger.backend=csv")
    parser.add_argument("--stock", action="store_true", help="control run: TorchRL's collectors, no swap")
    parser.add_argument("--out", type=Path, default=None,
                        help="also write the JSON summary, with the run's provenance, to this results file")
    parser.add_argument("--compile", action="store_true",
                        help="turn on each script's compile.compile (its compile_policy reaches the collector)")
    parser.add_argument("--exit-within", type=float, default=None, metavar="S",
                        help="fail a script that exits more than S seconds after its last output (e.g. 10)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directories (logs included)")
    parser.add_argument("-v", "--verbose", action="store_true", help="print each command line and substitution")
    args = parser.parse_args(argv)
    if args.frames < 600:
        parser.error(f"--frames must be >= 600 (a third random, batches of a sixth), got {args.frames}")
    if args.envs < 1:
        parser.error(f"--envs must be >= 1, got {args.envs}")
    if not args.utd > 0:
        parser.error(f"--utd must be > 0, got {args.utd}")
    # KEY=VALUE, +KEY=VALUE (add), ~KEY or ~KEY=VALUE (delete): hydra's override grammar.
    malformed = [item for item in args.extra
                 if not item.split("=", 1)[0].lstrip("+~") or ("=" not in item and not item.startswith("~"))]
    if malformed:
        parser.error(f"--set takes hydra overrides KEY=VALUE, got {malformed}")
    try:
        scripts = select_scripts(args.only)
    except ValueError as err:
        parser.error(str(err))

    budget = Budget(args.frames, args.envs, args.utd, compile=args.compile)
    results: dict[str, Result] = {}
    with work_dir("sota_dropin_", args.keep) as workdir:
        try:
            sota, commit = open_checkout(args.rl_root.expanduser().resolve(), workdir)
        except ValueError as err:
            parser.error(str(err))
        version = torchrl_version()
        print(f"torchrl {version}; checkout {args.rl_root} at commit {commit}", flush=True)
        print(f"torchrl_unilab under test: {REPO_ROOT / 'torchrl_unilab'}"
              + ("; --stock: TorchRL's own collectors (control)" if args.stock else ""), flush=True)
        for script in scripts:
            result = run_one(script, sota, workdir, budget, args.timeout, trainer_collector=args.trainer_collector,
                             trainer_import=args.trainer_import, stock=args.stock, extra=args.extra,
                             exit_within=args.exit_within)
            label = script.label + (" (compile.compile=true)" if args.compile else "")
            results[label] = result
            for line in result.edits + (result.swaps if args.verbose else []):
                print(f"  {script.label}: substituted {line}", flush=True)
            if args.verbose:
                print(f"  $ cd {workdir / script.name} && {result.command}", flush=True)
            print(result.line(label), flush=True)
        summary = {
            "benchmark": "sota_dropin", "torchrl": version, "commit": commit,
            "collector": "stock" if args.stock else SWAP_TARGET, "trainer_collector": args.trainer_collector,
            "frames": args.frames, "compile": args.compile, "set": args.extra,
            "results": {path: {k: v for k, v in dataclasses.asdict(r).items() if v not in ([], None, "")}
                        | {"seconds": round(r.seconds, 1)} for path, r in results.items()},
        }
        print(json.dumps(summary), flush=True)
        if args.out is not None:  # with the run's provenance (date, command, machine, torch), where report.py reads
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps({**provenance("sota_dropin"), **summary}, indent=1) + "\n")
    return 0 if results and all(r.status == "ok" for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
