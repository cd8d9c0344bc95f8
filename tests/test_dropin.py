"""OffPolicyCollector as a drop-in for TorchRL's collectors, driven the way TorchRL's own scripts drive them.

Real TorchRL envs and transforms (GymEnv, SerialEnv/ParallelEnv, InitTracker, StepCounter,
DoubleToFloat, RewardSum), real TorchRL buffers and modules, real worker processes.
"""

from __future__ import annotations

import functools
import math
import subprocess
import sys
import textwrap
import time

import gymnasium as gym
import pytest
import torch
from conftest import linear_policy, rows_after_publish, sota_env, start_after_waits_that_could_never_end
from tensordict import TensorDict
from tensordict.nn import TensorDictModule, TensorDictSequential
from torchrl.collectors import MultiAsyncCollector
from torchrl.data import LazyMemmapStorage, LazyTensorStorage, ReplayBuffer
from torchrl.data.postprocs import MultiStep
from torchrl.envs import EnvCreator, GymEnv, GymWrapper, SerialEnv
from torchrl.envs.utils import ExplorationType
from torchrl.modules import MLP, AdditiveGaussianModule, ProbabilisticActor, TanhNormal
from torchrl.modules.distributions import NormalParamExtractor

from torchrl_unilab import OffPolicyCollector, WorkerError, make_actor, make_replay_buffer
from torchrl_unilab.weight_update.weight_sync_scheme import SeqlockWeightSyncScheme

TORCHRL_KEYS = {"observation", "action", "done", "terminated", "truncated", "is_init", "step_count",
                "episode_reward", ("next", "observation"), ("next", "reward"), ("next", "done"),
                ("next", "terminated"), ("next", "truncated"), ("next", "step_count"),
                ("next", "episode_reward"), ("collector", "traj_ids")}


def env_maker():
    return GymEnv("Pendulum-v1")


def make_train_env(num_envs: int = 2, parallel: bool = False, seed: int = 0):
    """The shape of TorchRL's sota ``make_environment``: a batched env with the sota transforms."""
    return sota_env(env_maker, num_envs, max_steps=200, parallel=parallel, seed=seed)


def flatten(td):
    return td.reshape(-1)


def td3_explore(env):
    actor = TensorDictModule(MLP(in_features=3, out_features=1, num_cells=[16], activation_class=torch.nn.Tanh),
                             in_keys=["observation"], out_keys=["action"])
    noise = AdditiveGaussianModule(spec=env.action_spec_unbatched, sigma_init=0.5, sigma_end=0.1,
                                   annealing_num_steps=1000)
    return actor, TensorDictSequential(actor, noise)


def sac_actor(env):
    """TorchRL's sota SAC actor: MLP -> NormalParamExtractor -> TanhNormal ProbabilisticActor."""
    net = torch.nn.Sequential(MLP(in_features=3, out_features=2, num_cells=[16]), NormalParamExtractor())
    module = TensorDictModule(net, in_keys=["observation"], out_keys=["loc", "scale"])
    spec = env.action_spec_unbatched
    return ProbabilisticActor(module, in_keys=["loc", "scale"], spec=spec, distribution_class=TanhNormal,
                              distribution_kwargs={"low": spec.space.low, "high": spec.space.high},
                              return_log_prob=False)


@pytest.mark.parametrize("parallel", [False, True], ids=["SerialEnv", "ParallelEnv"])
def test_sync_pattern_yields_torchrl_batches(parallel, no_leaks):
    """TorchRL's sota sac.py loop, with only the collector class changed."""
    train_env = make_train_env(parallel=parallel)
    actor, actor_model_explore = td3_explore(train_env)
    collector = OffPolicyCollector(train_env, actor_model_explore, init_random_frames=100, frames_per_batch=100,
                                   total_frames=400, device="cpu", compile_policy=False, cudagraph_policy=False,
                                   track_policy_version=True)
    assert collector._pool is None, "workers start lazily"  # noqa: SLF001
    assert collector.set_seed(42) == 44
    replay_buffer = ReplayBuffer(storage=LazyTensorStorage(1000))
    assert len(collector) == 4
    versions = []
    for i, tensordict in enumerate(collector):
        collector.update_policy_weights_()
        assert tensordict.numel() == 100 and tensordict.names == [None, "time"], "[envs, time], as TorchRL's"
        assert TORCHRL_KEYS <= set(tensordict.keys(include_nested=True, leaves_only=True))
        versions.append(tensordict["policy_version"].reshape(-1))
        replay_buffer.extend(tensordict.reshape(-1))
    with pytest.raises(RuntimeError, match="before collection starts"):
        collector.set_seed(0)
    collector.shutdown()
    assert collector.policy_version == 5, "one publish per batch, readable after shutdown"
    assert i == 3 and len(replay_buffer) == 400
    versions = torch.cat(versions)
    assert int((versions == -1).sum()) == 100, "init_random_frames is exact"
    assert versions.max() >= 2, "published weights reach the thread worker"
    rows = replay_buffer[:]
    # episode_reward (RewardSum) accumulates the rewards of the episode: the transform ran in the worker
    ep = rows[rows["collector", "traj_ids"] == rows["collector", "traj_ids"][0]]
    assert torch.allclose(ep["next", "episode_reward"][-1], ep["next", "reward"].sum(), atol=1e-4)
    assert train_env.is_closed


@pytest.mark.parametrize("update_at_each_batch", [False, True])
def test_workers_start_from_the_policy_as_it_is_when_collection_starts(update_at_each_batch, no_leaks):
    """Weights changed in place after construction (a checkpoint loaded into the policy, say) are what the workers
    act with from the first batch, as with TorchRL's collectors. They were the weights at construction until the
    first update_policy_weights_(). update_at_each_batch publishes before the first batch too, as TorchRL's
    iterator does."""
    policy = linear_policy(3, 1)
    collector = OffPolicyCollector("Pendulum-v1", policy, num_envs=2, frames_per_batch=64, total_frames=256,
                                   update_at_each_batch=update_at_each_batch, track_policy_version=True)
    with torch.no_grad():
        for weight in policy.parameters():
            weight.zero_()
    try:
        batches = [batch.clone() for batch in collector]
    finally:
        collector.shutdown()
    actions = torch.cat([batch["action"] for batch in batches])
    assert actions.numel() == 256 and bool((actions == 0).all()), "a worker acted with the weights at construction"
    assert int(batches[0]["policy_version"].max()) == 1 + update_at_each_batch


@pytest.mark.parametrize("storage_cls", [LazyTensorStorage, LazyMemmapStorage])
def test_async_pattern_fills_a_torchrl_buffer(storage_cls, tmp_path, no_leaks):
    """TorchRL's sota sac-async.py: a shared TorchRL buffer laid out by upstream's own pre-initialisation."""
    make_env = make_train_env
    storage = storage_cls(10_000, scratch_dir=tmp_path / "rb") if storage_cls is LazyMemmapStorage else \
        storage_cls(10_000)
    replay_buffer = ReplayBuffer(storage=storage, shared=True, batch_size=64)
    replay_buffer.extend(make_env().rollout(1).view(-1))
    replay_buffer.empty()
    actor = sac_actor(make_env())
    init_random_frames = 200
    collector = OffPolicyCollector(functools.partial(make_env), actor, init_random_frames=0, frames_per_batch=100,
                                   total_frames=-1, device="cpu", env_device="cpu", compile_policy=False,
                                   cudagraph_policy=False, replay_buffer=replay_buffer, extend_buffer=True,
                                   postproc=flatten, no_cuda_sync=True)
    try:
        collector.set_seed(42)
        collector.start()
        deadline = time.monotonic() + 120
        while replay_buffer.write_count <= init_random_frames:
            assert time.monotonic() < deadline
            collector.metrics()  # raises a worker's error instead of waiting forever
            time.sleep(0.01)
        params = TensorDict.from_module(actor).data
        collector.update_policy_weights_(params)
        sample = replay_buffer.sample()
        assert sample.shape == torch.Size([64])
        obs, next_obs = sample["observation"], sample["next", "observation"]
        # Pendulum's observation is (cos, sin, velocity): rows hold real env data, not zeros
        assert torch.allclose(next_obs[:, 0] ** 2 + next_obs[:, 1] ** 2, torch.ones(64), atol=1e-4)
        assert torch.allclose(obs[:, 0] ** 2 + obs[:, 1] ** 2, torch.ones(64), atol=1e-4)
        assert (sample["next", "step_count"] == sample["step_count"] + 1).all()
        assert collector.policy_version == 2
    finally:
        collector.shutdown()


def test_weights_by_name_under_algo_and_obs_norm_wrappers(no_leaks):
    actor = make_actor("td3", 3, 1, hidden_dim=16)
    rb = make_replay_buffer(20_000)
    with OffPolicyCollector("Pendulum-v1", actor, algo="td3", obs_norm=True, num_envs=4, frames_per_batch=64,
                            replay_buffer=rb, exploration_type=ExplorationType.DETERMINISTIC,
                            seed=0) as collector:
        with pytest.raises(KeyError, match="not in it.*'bogus'"):
            collector.update_policy_weights_({"bogus": torch.zeros(1)})
        collector.start()
        assert collector.wait_for_frames(256, timeout=60)
        weights = TensorDict.from_module(actor).data.clone().zero_()
        collector.update_policy_weights_(weights)  # the bare actor's names, under two wrappers
        assert collector.policy_version == 2
        # the whole exploration policy's TensorDict (what TorchRL's Ray scheme sends) also holds TD3's
        # per-env noise stds, a non-persistent buffer: state, not weights, so it is left out
        exploration = collector.policy.module[1]
        collector.update_policy_weights_(TensorDict.from_module(exploration).data.clone())
        assert collector.policy_version == 3
        collector.update_policy_weights_(weights)
        assert collector.policy_version == 4
        rows = rows_after_publish(collector, rb, 256, timeout=60, version=4)
    new = rows[rows["policy_version"] == 4]
    old = rows[rows["policy_version"] == 1]
    assert len(new) > 0 and len(old) > 0
    assert torch.count_nonzero(new["action"]) == 0, "zero weights give zero actions (deterministic, tanh(0))"
    assert torch.count_nonzero(old["action"]) > 0


def test_inherited_api_works_or_says_why(no_leaks):
    rb = make_replay_buffer(4096)
    policy = linear_policy(3, 1)
    collector = OffPolicyCollector("Pendulum-v1", policy, num_envs=4, frames_per_batch=64, total_frames=512,
                                   replay_buffer=rb, weight_sync_schemes={"policy": SeqlockWeightSyncScheme()})
    try:
        # before start: hooks and seed are settable, specs are readable
        collector.pre_collect_hook = None
        assert collector.getattr_env("action_spec").shape == torch.Size([4, 1])
        assert collector.getattr_policy("in_keys") == ["observation"]
        assert collector.getattr_rb("write_count") == 0
        assert set(collector.fake_tensordict().keys(True, True)) >= {"observation", ("next", "reward")}
        assert collector.get_model("policy") is collector.policy
        assert collector.frames_per_batch_worker() == 64
        assert collector.worker_idx is None and collector.weight_updater is None
        assert collector.profile_config is None
        collector.init_updater()
        assert collector.cascade_execute("get_policy_version") == 1
        collector.increment_version()
        assert collector.get_policy_version() == 2
        cached = collector.get_cached_weights("policy")
        assert torch.equal(cached["module", "0", "weight"], policy.module[0].weight)
        batch = collector.next()
        assert batch is None and collector.frames_written >= 64  # with a buffer, the data goes there
        # the envs now live in the worker: specs still answer, from the snapshot taken at construction
        assert collector.getattr_env("action_spec_unbatched").shape == torch.Size([1])
        assert collector.getattr_env("observation_spec")["observation"].shape == torch.Size([4, 3])
        with pytest.raises(RuntimeError, match="before collection starts"):
            collector.post_collect_hook = print
        with collector.pause():
            frozen = collector.frames_written
            time.sleep(0.2)
            assert collector.frames_written == frozen
        stats = collector.stats("both")
        assert stats["workers"] == 1 and stats["frames"] == 64 and "worker_0/frames" in stats
        assert stats["workers_alive"] == 1
        state = collector.state_dict()
        assert state["frames"] == 64 and state["iter"] == 0 and "worker0" in state
        collector.load_state_dict({**state, "frames": 128, "iter": 1})
        assert collector.stats()["frames"] == 128
        for call, name in [(collector.reset, "reset"),
                           (collector.enable_profile, "profile"), (collector.receive_weights, "receive"),
                           (lambda: collector.getattr_env("unwrapped_envs"), "getattr_env")]:
            with pytest.raises(NotImplementedError):
                call()
        # no public name of MultiAsyncCollector fails for want of a parent field
        for name in dir(MultiAsyncCollector):
            if not name.startswith("_"):
                getattr(collector, name)
    finally:
        collector.async_shutdown()
    assert collector.closed
    # 3: load_state_dict published the policy_state_dict it restored
    assert collector.get_policy_version() == 3, "the version stays readable after shutdown"
    with pytest.raises(RuntimeError, match="shut down"):
        collector.update_policy_weights_()


def test_env_specs_of_an_unbatched_env_have_no_batch_dimension(no_leaks):
    """As with TorchRL's collectors: a script that sizes its networks from ``collector.env`` specs gets the env's
    own shapes, though the workers step an unbatched env with a batch dimension of one."""
    with OffPolicyCollector(env_maker, linear_policy(3, 1), frames_per_batch=64, total_frames=128) as collector:
        for started in (False, True):
            assert collector.getattr_env("batch_size") == torch.Size([])
            assert collector.env.observation_spec["observation"].shape == torch.Size([3]), started
            assert collector.env.action_spec.shape == collector.env.action_spec_unbatched.shape == torch.Size([1])
            assert collector.next()["observation"].shape == torch.Size([64, 3])
        # read in the workers only: absent here, as hasattr() and getattr() with a default expect
        assert not hasattr(collector.env, "unwrapped_envs")
        assert getattr(collector.env, "unwrapped_envs", "default") == "default"
        with pytest.raises(NotImplementedError, match="live in the worker processes"):
            collector.getattr_env("unwrapped_envs")


@pytest.mark.parametrize("into_buffer", [False, True], ids=["iterate", "replay_buffer"])
def test_multistep_postproc_sums_rewards_along_each_envs_trajectory(into_buffer, no_leaks):
    """TorchRL's MultiStep reads time along the last dimension, as TorchRL's collectors lay batches out: it gets
    [envs, steps], not the flat step-major rows (which summed the rewards of other envs: 99 of 100 rows wrong), in
    the worker before a buffer write (which it never reached: an empty buffer is falsy) and in this process."""
    gamma = 0.9
    rb = make_replay_buffer(1024) if into_buffer else None
    with OffPolicyCollector("Pendulum-v1", linear_policy(3, 1), num_envs=2, frames_per_batch=64, total_frames=256,
                            replay_buffer=rb, postproc=MultiStep(gamma=gamma, n_steps=3),
                            max_frames_per_traj=200) as collector:  # Pendulum's own limit; rows get step_count
        batches = [batch for batch in collector]
    rows = rb[:] if into_buffer else torch.cat([batch.reshape(-1) for batch in batches])
    assert rows.shape == torch.Size([256])
    reward = {(int(t), int(s)): float(r) for t, s, r in zip(rows["collector", "traj_ids"], rows["step_count"],
                                                           rows["next", "original_reward"])}
    steps = rows["steps_to_next_obs"].reshape(-1)
    assert int((steps == 3).sum()) >= 200, "n-step targets within each batch of 32 steps per env"
    for t, s, k, got in zip(rows["collector", "traj_ids"], rows["step_count"], steps, rows["next", "reward"]):
        expected = sum(gamma**j * reward[(int(t), int(s) + j)] for j in range(int(k)))
        assert float(got) == pytest.approx(expected, abs=1e-4)


def test_load_state_dict_continues_a_run_from_its_restored_frames(no_leaks):
    """TorchRL's Trainer resumes a collector with load_state_dict: iteration goes on from the restored frames to
    total_frames, and the restored frames count against init_random_frames. Before, the first iteration waited
    for the restored count again and the resumed run collected all of total_frames and its random frames."""
    def collector_into(rb):
        return OffPolicyCollector("Pendulum-v1", linear_policy(3, 1), num_envs=2, frames_per_batch=64,
                                  total_frames=640, init_random_frames=256, replay_buffer=rb)

    with collector_into(make_replay_buffer(2048)) as collector:
        for _ in zip(range(3), collector):
            pass
        state = collector.state_dict()
    assert state["frames"] == 192
    rb = make_replay_buffer(2048)
    with collector_into(rb) as collector:
        collector.load_state_dict(state)
        written_at_yield = [collector.frames_written for _ in collector]
        assert collector.state_dict()["frames"] == 640
    assert len(written_at_yield) == 7 and written_at_yield[0] < 192, written_at_yield
    assert len(rb) == 448, "the resumed run writes total_frames less the restored frames"
    assert int((rb[:]["policy_version"] == -1).sum()) == 64, "random frames: 256 less the 192 restored"


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(preemptive_threshold=0.7), "asynchronous"),
        (dict(traj_format="cat"), "unless trajs_per_batch is set"),
        (dict(weight_updater=object()), "weight_updater must be a torchrl.collectors.WeightUpdaterBase"),
        (dict(weight_sync_schemes={"policy": object()}), "must be a torchrl.weight_update.WeightSyncScheme"),
        (dict(weight_recv_schemes={"policy": object()}), r"weight_recv_schemes\['policy'\] must be a torchrl"),
        (dict(policy_device="gpu0"), "policy_device must be a torch device"),
        (dict(static_seed=True), "unexpected keyword argument 'static_seed'"),
    ],
)
def test_rejected_parameters_say_why(kwargs, match):
    error = TypeError if "static_seed" in kwargs else ValueError
    with pytest.raises(error, match=match):
        OffPolicyCollector("Pendulum-v1", linear_policy(3, 1), num_envs=2, frames_per_batch=2, **kwargs)


def test_frames_per_batch_is_rounded_up_like_torchrl():
    with pytest.warns(UserWarning, match="updated to 66"):
        collector = OffPolicyCollector("Pendulum-v1", linear_policy(3, 1), num_envs=6, frames_per_batch=64)
    assert collector.frames_per_batch == 66
    collector.shutdown()


def test_num_workers_from_a_list_of_factories_and_module_ids(tmp_path, monkeypatch, no_leaks):
    (tmp_path / "third_party_envs.py").write_text(textwrap.dedent("""
        import gymnasium as gym
        gym.register(id="ThirdPartyPendulum-v0", entry_point="gymnasium.envs.classic_control.pendulum:PendulumEnv",
                     max_episode_steps=20)
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    with OffPolicyCollector(["third_party_envs:ThirdPartyPendulum-v0", make_train_env], linear_policy(3, 1),
                            num_envs=2, frames_per_batch=40, total_frames=160, init_random_frames=80,
                            create_env_kwargs=[{}, {"num_envs": 2}]) as collector:
        assert collector.num_workers == 2
        batches = list(collector)
    ids = torch.cat([b["collector", "traj_ids"].reshape(-1) for b in batches])
    # each worker owns one random batch, reserved for it: both deliver
    assert len(batches) == 4 and {int(i) % 2 for i in ids} == {0, 1}, "both workers delivered batches"


class NaNRewardAt(gym.Wrapper):
    """A gymnasium wrapper whose env returns a NaN reward at one step."""

    def __init__(self, env, step):
        super().__init__(env)
        self.nan_step, self.t = step, 0

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.t += 1
        return obs, (math.nan if self.t == self.nan_step else reward), terminated, truncated, info


def nan_env():
    return GymWrapper(NaNRewardAt(gym.make("Pendulum-v1"), step=30))


def test_nonfinite_values_raise_or_are_dropped(no_leaks):
    with OffPolicyCollector(nan_env, linear_policy(3, 1), frames_per_batch=20, total_frames=100) as collector:
        with pytest.raises(WorkerError, match=r"non-finite value in key \('next', 'reward'\) from env 0 of worker 0, "
                                              r"step 9 of the batch"):
            list(collector)
    rb = make_replay_buffer(1000)
    with OffPolicyCollector(nan_env, linear_policy(3, 1), frames_per_batch=20, total_frames=100, replay_buffer=rb,
                            nonfinite="drop") as collector:
        list(collector)
        assert collector.metrics()["nonfinite_dropped"] == 1
    assert len(rb) == 99 and torch.isfinite(rb[:]["next", "reward"]).all()


def slow_pendulum(delay):
    time.sleep(delay)
    return BatchedPendulum()


def BatchedPendulum():  # noqa: N802 - an env factory
    return SerialEnv(4, EnvCreator(env_maker))


def test_random_frames_exact_when_a_worker_starts_late(no_leaks):
    """Worker 1 starts seconds after worker 0; its share of the random frames is still collected."""
    rb = make_replay_buffer(4096)
    with OffPolicyCollector([BatchedPendulum, functools.partial(slow_pendulum, 4.0)], linear_policy(3, 1),
                            frames_per_batch=64, total_frames=1024, init_random_frames=300, replay_buffer=rb,
                            seed=1) as collector:
        collector.start()
        assert collector.wait_for_frames(1024, timeout=120)
        rows = rb[:]
    assert int((rows["policy_version"] == -1).sum()) == 300
    assert int((rows["collector", "traj_ids"] % 2 == 1).sum()) >= 128, "the late worker got its reserved batches"


def test_waits_that_could_never_end_raise(no_leaks):
    rb = make_replay_buffer(1000)
    with OffPolicyCollector("Pendulum-v1", linear_policy(3, 1), num_envs=2, frames_per_batch=32, total_frames=256,
                            replay_buffer=rb) as collector:
        start_after_waits_that_could_never_end(collector, 256, timeout=60)
    with OffPolicyCollector("Pendulum-v1", linear_policy(3, 1), num_envs=2, frames_per_batch=32) as collector:
        with pytest.raises(RuntimeError, match="iterate over it instead"):
            collector.start()


FAILING_SCRIPT = """
import sys, time, torch
from tensordict.nn import TensorDictModule
from torchrl_unilab import OffPolicyCollector, make_replay_buffer

def main():
    policy = TensorDictModule(torch.nn.Linear(3, 1), in_keys=["observation"], out_keys=["action"])
    collector = OffPolicyCollector("Pendulum-v1", policy, num_envs=2, frames_per_batch=64, num_workers=2,
                                   replay_buffer=make_replay_buffer(1000))
    if "with" in sys.argv:
        with collector:
            collector.start(); collector.wait_for_frames(128, timeout=60)
            fail()
    collector.start(); collector.wait_for_frames(128, timeout=60)
    fail()

def fail():
    print("raising at", time.time(), flush=True)
    raise ValueError("user error after construction")
"""

HYDRA_MAIN = """
import hydra
@hydra.main(version_base="1.3", config_path=None)
def hydra_main(cfg):
    main()
if __name__ == "__main__":
    hydra_main()
"""


@pytest.mark.parametrize("runner", ["plain", "plain-with", "hydra"])
def test_a_failing_script_exits_promptly(runner, tmp_path):
    body = FAILING_SCRIPT + (HYDRA_MAIN if runner == "hydra" else '\nif __name__ == "__main__":\n    main()\n')
    script = tmp_path / "failing.py"
    script.write_text(body)
    args = [sys.executable, str(script)] + (["with"] if runner.endswith("with") else [])
    if runner == "hydra":
        args.append(f"hydra.run.dir={tmp_path / 'out'}")
    out = subprocess.run(args, capture_output=True, text=True, timeout=180, cwd=tmp_path)
    exited = time.time()
    assert out.returncode != 0 and "user error after construction" in out.stderr, out.stderr[-2000:]
    raised = float(out.stdout.split("raising at")[-1].split()[0])
    # from the user's error to the end of the interpreter: workers stopped, nothing hangs
    assert exited - raised < 15, f"exited {exited - raised:.1f}s after the error"


NO_MAIN_GUARD = """
import torch
from tensordict.nn import TensorDictModule
from torchrl_unilab import OffPolicyCollector
policy = TensorDictModule(torch.nn.Linear(3, 1), in_keys=["observation"], out_keys=["action"])
collector = OffPolicyCollector("Pendulum-v1", policy, num_envs=2, frames_per_batch=64, total_frames=128,
                               start_method=START_METHOD)
for batch in collector:
    pass
"""


@pytest.mark.parametrize("start_method", ["forkserver", "spawn"])
def test_startup_failure_names_the_main_guard_and_shows_worker_stderr(tmp_path, start_method):
    script = tmp_path / "no_guard.py"
    script.write_text(f"START_METHOD = {start_method!r}\n{NO_MAIN_GUARD}")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode != 0
    assert "WorkerError" in out.stderr and 'if __name__ == "__main__":' in out.stderr, out.stderr[-3000:]
    if start_method == "spawn":  # its stderr is kept until it reaches its entry point, and shown in the WorkerError
        assert "worker stderr while starting" in out.stderr
    # the worker's own error text (forked, it printed on the script's stderr, which the fork server shares)
    assert "bootstrapping phase" in out.stderr, out.stderr[-3000:]


class DictObsEnv(gym.Env):
    """A gymnasium env with a Dict observation space, which the gymnasium-id fast path cannot store."""

    observation_space = gym.spaces.Dict({"x": gym.spaces.Box(-1, 1, (2,))})
    action_space = gym.spaces.Box(-1, 1, (1,))


class ImageObsEnv(gym.Env):
    observation_space = gym.spaces.Box(0, 1, (4, 4))
    action_space = gym.spaces.Box(-1, 1, (1,))


@pytest.mark.parametrize(("env_cls", "what"), [(DictObsEnv, "observation"), (ImageObsEnv, "observation")])
def test_unsupported_spaces_are_refused_at_construction(env_cls, what):
    env_id = f"{env_cls.__name__}-v0"
    if env_id not in gym.registry:
        gym.register(id=env_id, entry_point=env_cls)
    with pytest.raises(TypeError, match=f"supports 1-D Box {what} spaces.*{env_id}"):
        OffPolicyCollector(env_id, linear_policy(2, 1), num_envs=2, frames_per_batch=2)
