"""``benchmarks/sota_dropin.py``'s own logic: the swap, the error line, the checkout, the process group.

The benchmark itself needs a pytorch/rl checkout and minutes per script; these
tests run its parts on small stand-ins: a fake ``sota-implementations`` folder
in a git repository (work tree and bare), and scripts that fail or hang. The
tests marked ``needs_rl_checkout`` run TorchRL's own scripts from the checkout
that ``RL_ROOT`` names (a work tree or a bare git dir, as ``--rl-root`` takes).
"""

from __future__ import annotations

import ast
import os
import subprocess
import time
from pathlib import Path

import pytest
import sota_dropin  # noqa: E402

RL_ROOT = os.environ.get("RL_ROOT")
needs_rl_checkout = pytest.mark.skipif(
    not RL_ROOT, reason="runs TorchRL's script from a pytorch/rl checkout: set RL_ROOT to a work tree or a bare git "
                        "dir (what benchmarks/sota_dropin.py --rl-root takes)")


def test_swap_rebinds_every_collector_class_and_keeps_line_numbers():
    source = (
        "import torch\n"
        "from torchrl.collectors import (\n"
        "    BaseCollector,\n"
        "    MultiaSyncDataCollector as MAC,\n"
        "    SyncDataCollector,\n"
        ")\n"
        "def f():\n"
        "    from torchrl.collectors import Collector  # inside a function\n"
        "    return Collector\n"
        "from torchrl.trainers.helpers import sync_async_collector, sync_sync_collector\n"
    )
    new, swapped = sota_dropin.swap_collector_imports(source)
    assert len(new.splitlines()) == len(source.splitlines())
    ast.parse(new)
    assert sorted(s.split(" ->")[0] for s in swapped) == [
        "Collector", "MAC", "SyncDataCollector", "sync_async_collector", "sync_sync_collector"]
    assert "OffPolicyCollector as MAC, OffPolicyCollector as SyncDataCollector" in new.splitlines()[5]
    assert new.splitlines()[7].startswith("    from torchrl.collectors import Collector; from torchrl_unilab")
    assert "BaseCollector as" not in new  # a type, not something built
    namespace: dict = {}
    exec(compile("\n".join(new.splitlines()[9:]), "utils.py", "exec"), namespace)  # the REDQ helpers
    assert namespace["sync_sync_collector"] is namespace["sync_async_collector"]
    assert namespace["sync_sync_collector"].args[0].__name__ == "OffPolicyCollector"


def test_swap_leaves_files_without_collectors_unchanged():
    source = "from torchrl.collectors import BaseCollector\nx = 1\n"
    assert sota_dropin.swap_collector_imports(source) == (source, [])
    with pytest.raises(ValueError, match="target must be 'module.Class'"):
        sota_dropin.swap_collector_imports(source, target="OffPolicyCollector")


def test_first_error_is_the_exception_line_of_the_last_traceback():
    output = (
        "Traceback (most recent call last):\n  File \"a.py\", line 1\nKeyError: 'first'\n\n"
        "During handling of the above exception, another exception occurred:\n\n"
        "Traceback (most recent call last):\n  File \"b.py\", line 2, in <module>\n    g()\n"
        "torchrl_unilab.collectors._processes.WorkerError: worker 0 failed\n"
        "Set the environment variable HYDRA_FULL_ERROR=1 for a complete stack trace.\n"
    )
    assert sota_dropin.first_error(output) == "torchrl_unilab.collectors._processes.WorkerError: worker 0 failed"
    assert sota_dropin.first_error("no error\n") is None


@pytest.fixture
def checkout(tmp_path):
    """A git work tree with a fake ``sota-implementations/sac`` whose script fails in its collector."""
    root = tmp_path / "rl"
    sac = root / "sota-implementations" / "sac"
    sac.mkdir(parents=True)
    (sac / "utils.py").write_text("from torchrl.collectors import AsyncCollector, Collector\n")
    (sac / "sac.py").write_text(
        "import sys, tempfile\nfrom utils import Collector\nprint(Collector.__module__, sys.argv[1:])\n"
        "print('tempdir', tempfile.gettempdir())\nraise RuntimeError('stop here')\n")
    git = ["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git[:3], "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "fake"], check=True)
    return root


def test_work_tree_and_bare_repository_give_the_same_scripts_and_commit(checkout, tmp_path):
    bare = tmp_path / "rl.git"
    subprocess.run(["git", "clone", "-q", "--bare", str(checkout), str(bare)], check=True)
    extract = tmp_path / "extract"
    extract.mkdir()
    tree, commit = sota_dropin.open_checkout(checkout, extract)
    from_bare, bare_commit = sota_dropin.open_checkout(bare, extract)
    assert commit == bare_commit != "unknown"
    assert (tree / "sac" / "sac.py").read_text() == (from_bare / "sac" / "sac.py").read_text()
    with pytest.raises(ValueError, match="--rl-root must be a pytorch/rl work tree"):
        sota_dropin.open_checkout(tmp_path / "nowhere", extract)


def test_a_run_reports_the_swapped_collector_failing_with_its_first_error(checkout, tmp_path, monkeypatch):
    sac = next(s for s in sota_dropin.SCRIPTS if s.name == "sac")
    budget = sota_dropin.Budget(600, 1, 0.25)
    result = sota_dropin.run_one(sac, checkout / "sota-implementations", tmp_path, budget, 60,
                                 trainer_collector=sota_dropin.SWAP_TARGET, trainer_import=None, stock=False)
    assert result.status == "failed"
    assert result.error == "RuntimeError: stop here"
    assert result.swaps == ["utils.py: AsyncCollector -> torchrl_unilab.OffPolicyCollector",
                            "utils.py: Collector -> torchrl_unilab.OffPolicyCollector"]
    log = (tmp_path / "sac" / "sota_dropin.log").read_text()
    assert log.startswith("torchrl_unilab.collectors.offpolicy_collector ['collector.total_frames=600'")
    # what the script leaves in its temporary directory goes with the work directory
    assert f"tempdir {tmp_path / 'sac' / 'tmp'}\n" in log


def test_a_hung_script_dumps_its_stacks_and_its_children_are_killed_at_the_timeout(checkout, tmp_path):
    script = checkout / "sota-implementations" / "sac" / "sac.py"
    # A child that ignores SIGTERM, in the script's group: only the group kill ends it.
    script.write_text(
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import signal, time; "
        "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)'])\n"
        "print(child.pid, flush=True)\ntime.sleep(600)\n")
    sac = next(s for s in sota_dropin.SCRIPTS if s.name == "sac")
    start = time.monotonic()
    result = sota_dropin.run_one(sac, checkout / "sota-implementations", tmp_path, sota_dropin.Budget(600, 1, 1.0),
                                 3, trainer_collector=sota_dropin.SWAP_TARGET, trainer_import=None, stock=True)
    assert time.monotonic() - start < 30
    assert result.status == "failed" and result.error.startswith("timeout after 3 s")
    log = (tmp_path / "sac" / "sota_dropin.log").read_text()
    # both processes dump into one log, and their lines may interleave: the dump is there and names the script
    assert "Fatal Python error: Aborted" in log
    assert "sac.py" in log.split("Fatal Python error: Aborted", 1)[1]
    assert "stacks of its 2 process(es)" in " ".join(result.notes)
    child = int(log.split()[0])
    assert not Path(f"/proc/{child}").exists() or "Z" in Path(f"/proc/{child}/stat").read_text().split(")")[1][:3]


def test_only_accepts_names_and_paths():
    assert [s.name for s in sota_dropin.select_scripts("ddpg_trainer, td3/td3.py")] == ["td3", "ddpg_trainer"]
    with pytest.raises(ValueError, match="accepted: sac, sac_prb, sac-async"):
        sota_dropin.select_scripts("sac,nope")


def test_set_overrides_come_last_and_malformed_ones_are_refused(capsys):
    td3 = next(s for s in sota_dropin.SCRIPTS if s.name == "td3")
    extra = ["collector.init_random_frames=10000", "+logger.extra=1", "~logger.video"]
    command = sota_dropin.command_for(td3, sota_dropin.Budget(3000, 2, 1.0), sota_dropin.SWAP_TARGET, None, False,
                                      extra)
    assert command[-3:] == extra  # after the budget's collector.init_random_frames=1000: hydra keeps the last
    assert "collector.init_random_frames=1000" in command
    for bad in ("logger.eval_iter", "=5"):
        with pytest.raises(SystemExit):
            sota_dropin.main(["--rl-root", ".", "--only", "td3", "--set", bad])
        assert f"--set takes hydra overrides KEY=VALUE, got ['{bad}']" in capsys.readouterr().err


def test_redq_and_sac_prb_run_on_torchrls_prioritized_buffer():
    # The pinned torch loads TorchRL's segment trees: REDQ keeps its stock prioritized buffer, sac_prb asks for one.
    budget = sota_dropin.Budget(3000, 2, 0.1)
    sac, sac_prb, redq = sota_dropin.select_scripts("redq,sac,sac_prb")  # in table order
    assert not any("prb" in arg for arg in sota_dropin.command_for(redq, budget, sota_dropin.SWAP_TARGET, None, False))
    assert not any("prb" in arg for arg in sota_dropin.command_for(sac, budget, sota_dropin.SWAP_TARGET, None, False))
    assert "replay_buffer.prb=1" in sota_dropin.command_for(sac_prb, budget, sota_dropin.SWAP_TARGET, None, False)
    assert (sac.label, sac_prb.label) == ("sac/sac.py", "sac/sac.py (replay_buffer.prb=1)")
    assert [s.name for s in sota_dropin.select_scripts("sac/sac.py")] == ["sac"]


def test_a_rendering_script_runs_on_egl_unless_the_user_chose_a_gl(checkout, tmp_path, monkeypatch):
    script = checkout / "sota-implementations" / "sac" / "sac.py"
    script.write_text("import os\nprint('GL', os.environ.get('MUJOCO_GL'), os.environ.get('PYOPENGL_PLATFORM'))\n")
    renders = sota_dropin.Script("sac", "sac/sac.py", lambda b: [], renders=True)
    budget = sota_dropin.Budget(600, 1, 1.0)
    monkeypatch.delenv("MUJOCO_GL", raising=False)
    monkeypatch.delenv("PYOPENGL_PLATFORM", raising=False)
    for chosen, expected in [(None, "GL egl egl"), ("osmesa", "GL osmesa osmesa")]:
        if chosen:
            monkeypatch.setenv("MUJOCO_GL", chosen)
        out = tmp_path / (chosen or "default")
        out.mkdir()
        result = sota_dropin.run_one(renders, checkout / "sota-implementations", out, budget, 60,
                                     trainer_collector=sota_dropin.SWAP_TARGET, trainer_import=None, stock=True)
        assert result.status == "ok"
        assert expected in (out / "sac" / "sota_dropin.log").read_text()


@pytest.mark.parametrize("compile_on", [False, True])
def test_scripts_keep_their_own_devices_and_compile_turns_on_their_compile(compile_on):
    """No override names a device (the scripts pick cuda:0 on a GPU machine, as their users run them), but for the
    td3 trainer's stock Apple-only ``mps``; --compile turns on compile.compile wherever the script has it."""
    budget = sota_dropin.Budget(3000, 2, 0.1, compile=compile_on)
    for script in sota_dropin.SCRIPTS:
        overrides = script.overrides(budget)
        devices = [o for o in overrides if "device=" in o and o != "collector.device="]
        assert devices == ([] if script.name != "td3_trainer" else
                           ["networks.policy_network.device=cpu", "networks.qvalue_network.device=cpu"]), script.name
        assert not any(o.startswith(("compile.compile=false", "compile.cudagraphs")) for o in overrides)
        has_compile = script.name not in ("redq", "offline_to_online") and not script.trainer
        assert ("compile.compile=true" in overrides) == (compile_on and has_compile), script.name


@needs_rl_checkout
def test_torchrls_offline_to_online_script_runs_to_its_end_with_our_collector_on_a_dataset_of_ours(tmp_path,
                                                                                                   no_leaks):
    """TorchRL's ``offline_to_online/train.py`` with only the collector class swapped (and its two bugs that fail
    with TorchRL's own collector too), on an offline dataset of our run that its ``minari:`` loader finds."""
    sota, _ = sota_dropin.open_checkout(Path(RL_ROOT).expanduser().resolve(), tmp_path)
    script, = sota_dropin.select_scripts("offline_to_online")
    budget = sota_dropin.Budget(600, 1, 0.1)  # batches of 100 frames, 10 updates each
    result = sota_dropin.run_one(script, sota, tmp_path, budget, 300, trainer_collector=sota_dropin.SWAP_TARGET,
                                 trainer_import=None, stock=False)
    log = (tmp_path / "offline_to_online" / "sota_dropin.log").read_text()
    assert result.status == "ok", f"{result.error}\n{log[-3000:]}"
    assert result.swaps == ["train.py: Collector -> torchrl_unilab.OffPolicyCollector"]
    assert [edit.split(" x")[0].split(": ", 1)[0] for edit in result.edits] == ["train.py", "train.py"]
    assert "600/600" in log  # the trainer's progress bar at total_frames
    dataset = tmp_path / "offline_to_online" / "home" / ".cache" / "torchrl" / "minari" / sota_dropin.OFFLINE_DATASET
    assert (dataset / "env_metadata.json").exists()
