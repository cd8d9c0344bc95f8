"""Weight sync as TorchRL's scripts and tests drive it: TorchRL's own schemes, policies without weights,
``policy_state_dict`` checkpoints, finalisers that run in any order, and scripts that end without a shutdown.

Real worker processes and envs throughout; the finaliser and exit checks run whole scripts in subprocesses, since
what they guard (a segfault, an interpreter that does not exit) would take the test process down with it.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import pytest
import torch
from conftest import linear_policy, publish_zero_weights, rows_after_publish
from tensordict import TensorDict
from torchrl.envs import GymEnv
from torchrl.envs.utils import RandomPolicy
from torchrl.weight_update import MultiProcessWeightSyncScheme, NoWeightSyncScheme, SharedMemWeightSyncScheme

from torchrl_unilab import OffPolicyCollector, make_replay_buffer

PENDULUM = dict(num_envs=2, frames_per_batch=64)


def _run_script(tmp_path, body: str, timeout: float) -> tuple[subprocess.CompletedProcess, float]:
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(body))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=timeout, cwd=tmp_path)
    return out, time.time()


@pytest.mark.parametrize("scheme_cls", [MultiProcessWeightSyncScheme, SharedMemWeightSyncScheme])
def test_torchrl_schemes_are_honoured_on_our_transport(scheme_cls, unilab_log, no_leaks):
    """TorchRL's own schemes: weights published with update_policy_weights_() reach every worker, and one log
    record says how."""
    rb = make_replay_buffer(8192)
    policy = linear_policy(3, 1)
    collector = OffPolicyCollector("Pendulum-v1", policy, replay_buffer=rb,
                                   weight_sync_schemes={"policy": scheme_cls()}, **PENDULUM)
    with collector:
        said = [r.getMessage() for r in unilab_log if scheme_cls.__name__ in r.getMessage()]
        assert len(said) == 1 and "update_policy_weights_() reaches every worker" in said[0], said
        collector.start()
        assert collector.wait_for_frames(256, timeout=120)
        publish_zero_weights(collector, policy)
        assert collector.policy_version == 2
        rows = rows_after_publish(collector, rb, 256, timeout=120, version=2)
    new = rows[rows["policy_version"] == 2]
    assert len(new) >= 128 and torch.equal(new["action"], torch.zeros_like(new["action"]))


def test_buffers_registered_with_torchrl_shared_mem_scheme_follow_each_publish(no_leaks):
    """A SharedMemWeightSyncScheme the user initialised with buffers of their own (TorchRL's
    test_update_weights_shared_mem shape): the buffers hold each published set of weights, as TorchRL's
    in-place update leaves them; NoWeightSyncScheme: the workers keep the weights they started with."""
    policy = linear_policy(3, 1)
    mirror = TensorDict.from_module(policy).data.clone().share_memory_()
    scheme = SharedMemWeightSyncScheme()
    scheme.init_on_sender(params_map={0: mirror, 1: mirror})
    with OffPolicyCollector("Pendulum-v1", policy, total_frames=256, weight_sync_schemes={"policy": scheme},
                            **PENDULUM) as collector:
        next(iter(collector))
        with torch.no_grad():
            policy.module[0].weight.add_(1.0)
        collector.update_policy_weights_()
        assert torch.equal(mirror["module", "0", "weight"], policy.module[0].weight)
    with OffPolicyCollector("Pendulum-v1", policy, total_frames=256,
                            weight_sync_schemes={"policy": NoWeightSyncScheme()}, **PENDULUM) as collector:
        next(iter(collector))
        collector.update_policy_weights_()
        assert collector.policy_version == 1


def test_a_policy_without_weights_has_nothing_to_sync(no_leaks):
    """TorchRL's RandomPolicy was refused ("SeqlockWeightSyncScheme syncs an nn.Module; model 'policy' is
    RandomPolicy"): nothing to sync is no error, and versions still count the publishes."""
    policy = RandomPolicy(GymEnv("Pendulum-v1").action_spec)
    with OffPolicyCollector(lambda: GymEnv("Pendulum-v1"), policy, total_frames=192, **PENDULUM) as collector:
        for batch in collector:
            assert batch["action"].abs().max() <= 2.0
            collector.update_policy_weights_()
        assert collector.policy_version == 4
        assert "policy_state_dict" not in collector.state_dict()["worker0"]


def test_state_dict_holds_policy_weights_and_load_state_dict_publishes_them(no_leaks):
    """TorchRL's multi collector checkpoints each worker's policy weights under "policy_state_dict"; ours had no
    such key. load_state_dict restores them into the policy and publishes them: the workers act with them."""
    policy = linear_policy(3, 1)
    with OffPolicyCollector("Pendulum-v1", policy, total_frames=128, **PENDULUM) as collector:
        next(iter(collector))
        state = collector.state_dict()
    assert {"frames", "iter", "policy_version", "worker0"} <= set(state)
    saved = state["worker0"]["policy_state_dict"]
    assert set(saved) == set(policy.state_dict())
    assert all(torch.equal(saved[name], value) for name, value in policy.state_dict().items())
    zeros = {name: torch.zeros_like(value) for name, value in saved.items()}
    fresh = linear_policy(3, 1, seed=1)
    rb = make_replay_buffer(4096)
    with OffPolicyCollector("Pendulum-v1", fresh, replay_buffer=rb, **PENDULUM) as collector:
        collector.load_state_dict({**state, "worker0": {**state["worker0"], "policy_state_dict": zeros}})
        assert all(torch.equal(value, torch.zeros_like(value)) for value in fresh.state_dict().values())
        collector.start()
        assert collector.wait_for_frames(128, timeout=120)
        rows = rb[: collector.frames_written]
    assert torch.equal(rows["action"], torch.zeros_like(rows["action"])), "the workers start from the restored weights"


FINALISERS = """
import atexit, gc
import torch
from tensordict.nn import TensorDictModule
from torchrl_unilab import OffPolicyCollector, make_replay_buffer


def started():
    policy = TensorDictModule(torch.nn.Linear(3, 1), in_keys=["observation"], out_keys=["action"])
    collector = OffPolicyCollector("Pendulum-v1", policy, num_envs=2, frames_per_batch=64,
                                   replay_buffer=make_replay_buffer(1024))
    collector.start()
    assert collector.wait_for_frames(128, timeout=120)
    collector.update_policy_weights_()
    return collector


def finalisers_in_a_bad_order():
    # What the garbage collector may do with a cycle: run its objects' finalisers in any order. Here the
    # shared-memory block's own first, then the scheme's (TorchRL's WeightSyncScheme.__del__), then the collector's.
    collector = started()
    scheme = collector._weight_sync_schemes["policy"]  # the scheme as given: ours by default
    scheme.shared._shm.__del__()
    scheme.__del__()
    collector.__del__()
    print("version after the finalisers:", scheme.version, flush=True)


def error_with_the_collector_in_its_frame():
    collector = started()
    try:
        raise RuntimeError("the user's error")
    except RuntimeError as err:
        return err  # its traceback holds this frame, and the collector in it


if __name__ == "__main__":
    finalisers_in_a_bad_order()
    held = [error_with_the_collector_in_its_frame()]
    # At exit, before the collector's own exit handler: the error and the collector become garbage in one cycle.
    atexit.register(lambda: (held.clear(), gc.collect()))
    print("script done", flush=True)
"""


def test_finalisers_in_any_order_never_touch_unmapped_memory(tmp_path):
    """A finaliser read the weights block after SharedMemory's own __del__ had unmapped it: 'Fatal Python error:
    Segmentation fault' instead of the user's traceback. Every view now keeps the mapping alive."""
    out, _ = _run_script(tmp_path, FINALISERS, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "version after the finalisers: 2" in out.stdout and "script done" in out.stdout, out.stdout
    for sign in ("Segmentation fault", "Fatal Python error", "Exception ignored", "Traceback"):
        assert sign not in out.stderr, out.stderr[-3000:]


SAC_ASYNC_SHAPE = """
import time
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule
from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
from torchrl.envs import GymEnv
from torchrl.weight_update import SharedMemWeightSyncScheme
from torchrl_unilab import OffPolicyCollector

TORCHRL_SCHEME = {torchrl_scheme}


def make_env():
    return GymEnv("Pendulum-v1")


def main():
    # sac-async.py's shape: a shared TorchRL buffer filled in the background from start(), weights sent as
    # TensorDict.from_module(model).data, the buffer sampled, and no shutdown: the script just ends.
    model = TensorDictModule(torch.nn.Linear(3, 1), in_keys=["observation"], out_keys=["action"])
    explore = TensorDictModule(torch.nn.Linear(3, 1), in_keys=["observation"], out_keys=["action"])
    kwargs = {{}}
    if TORCHRL_SCHEME:
        # Initialised by the user with buffers of their own: the scheme holds multiprocessing queues.
        scheme = SharedMemWeightSyncScheme()
        scheme.init_on_sender(params_map={{0: TensorDict.from_module(explore).data.clone().share_memory_()}})
        kwargs["weight_sync_schemes"] = {{"policy": scheme}}
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(4096), batch_size=32, shared=True, prefetch=0)
    collector = OffPolicyCollector(make_env, explore, num_workers=2, frames_per_batch=64, total_frames=-1,
                                   replay_buffer=rb, extend_buffer=True, **kwargs)
    collector.set_seed(0)
    collector.start()
    while rb.write_count <= 256:
        time.sleep(0.01)
    params = TensorDict.from_module(model).data
    for i in range(20):
        rb.sample()
        if i % 5 == 0:
            collector.update_policy_weights_(params)
    print(f"last call at {{time.time():.3f}}", flush=True)


if __name__ == "__main__":
    main()
"""


@pytest.mark.parametrize("torchrl_scheme", [False, True], ids=["default-scheme", "torchrl-shared-mem-scheme"])
def test_a_script_that_ends_without_shutdown_exits_within_30s(torchrl_scheme, tmp_path):
    """A user-initialised SharedMemWeightSyncScheme's own __del__, left to the interpreter's final garbage
    collection, starts a queue feeder thread that cannot run then, and the script would hang after its last line:
    the collector shuts the scheme down with itself, at exit while threads still run. Its exit takes
    a few seconds (workers stopped within 2 s, then the interpreter's teardown); 30 s leaves room for a loaded
    machine and still tells a hang."""
    out, exited = _run_script(tmp_path, SAC_ASYNC_SHAPE.format(torchrl_scheme=torchrl_scheme), timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    last = float(out.stdout.split("last call at")[-1].split()[0])
    assert exited - last < 30, f"exited {exited - last:.1f}s after the script's last call"
