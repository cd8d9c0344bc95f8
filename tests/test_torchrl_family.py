"""The drop-in across TorchRL's off-policy family, driven with TorchRL's own classes.

Each test stands for a script of TorchRL's ``sota-implementations`` whose run with the collector
class swapped depends on more than the class: ``sac-async.py``'s ``TensorDictReplayBuffer`` (an ``"index"``
entry in every row), ``ddpg.py``'s Ornstein-Uhlenbeck exploration (a zero-element buffer, state
carried in the TensorDict), and the config-driven trainers (one env instance for several workers,
the collector picked from TorchRL's config store). ``benchmarks/sota_dropin.py`` runs the scripts
themselves against a pytorch/rl checkout.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from pathlib import Path

import pytest
import torch
from conftest import sota_env, wait_until
from tensordict.nn import TensorDictModule, TensorDictSequential
from torchrl.data import Bounded, LazyMemmapStorage, LazyTensorStorage, ReplayBuffer, TensorDictReplayBuffer
from torchrl.envs import (
    Compose,
    DoubleToFloat,
    EnvCreator,
    GymEnv,
    ParallelEnv,
    SerialEnv,
    StepCounter,
    TransformedEnv,
)
from torchrl.modules import MLP, AdditiveGaussianModule, OrnsteinUhlenbeckProcessModule

from torchrl_unilab import OffPolicyCollector, SharedWeights
from torchrl_unilab.weight_update.weight_sync import layout_of


def pendulum():
    return GymEnv("Pendulum-v1")


def make_env(num_envs: int = 2):
    """The shape of TorchRL's sota ``make_train_environment``."""
    return sota_env(pendulum, num_envs, max_steps=200)


def flatten(td):
    return td.reshape(-1)


def actor_net():
    return TensorDictModule(MLP(in_features=3, out_features=1, num_cells=[16], activation_class=torch.nn.Tanh),
                            in_keys=["observation"], out_keys=["action"])


def to_cpu(td):
    return td.to("cpu")


@pytest.mark.parametrize(("storage", "pre_initialised"), [("LazyTensorStorage", True), ("LazyMemmapStorage", True),
                                                          ("LazyTensorStorage", False)])
def test_tensordict_replay_buffer_rows_carry_their_index(storage, pre_initialised, tmp_path, no_leaks):
    """sac-async.py's make_replay_buffer: TensorDictReplayBuffer(shared=True), which stamps "index" on each row."""
    if storage == "LazyMemmapStorage":
        replay_buffer = TensorDictReplayBuffer(pin_memory=False, prefetch=0, batch_size=64, shared=True,
                                               storage=LazyMemmapStorage(5_000, device="cpu",
                                                                         scratch_dir=tmp_path / "rb"))
        replay_buffer.append_transform(to_cpu)  # as the sota helper does with a scratch_dir
    else:
        replay_buffer = TensorDictReplayBuffer(pin_memory=False, prefetch=0, batch_size=64, shared=True,
                                               storage=LazyTensorStorage(5_000))
    if pre_initialised:
        replay_buffer.extend(make_env().rollout(1).view(-1))
        replay_buffer.empty()
    collector = OffPolicyCollector(functools.partial(make_env), TensorDictSequential(actor_net()),
                                   frames_per_batch=100, total_frames=-1, device="cpu", env_device="cpu",
                                   compile_policy=False, cudagraph_policy=False, replay_buffer=replay_buffer,
                                   extend_buffer=True, postproc=flatten, no_cuda_sync=True)
    try:
        collector.set_seed(0)
        collector.start()
        deadline = time.monotonic() + 120
        while replay_buffer.write_count < 600:
            assert time.monotonic() < deadline
            collector.metrics()  # raises a worker's error instead of waiting
            time.sleep(0.01)
        sample = replay_buffer.sample()
    finally:
        collector.shutdown()
    written = int(replay_buffer.write_count)
    stored = replay_buffer.storage[:written]
    # each stored row holds its own storage position, as the buffer's own extend writes it
    assert torch.equal(stored["index"], torch.arange(written))
    assert sample.shape == torch.Size([64])
    assert torch.equal(replay_buffer.storage[sample["index"]]["observation"], sample["observation"])
    obs = sample["next", "observation"]
    assert torch.allclose(obs[:, 0] ** 2 + obs[:, 1] ** 2, torch.ones(64), atol=1e-4), "real env data"
    del collector, replay_buffer  # the shared buffer's locks (semaphores in /dev/shm) go with it


def test_shared_weights_take_any_state_a_policy_holds():
    """Zero-element, integer and bool tensors, tied parameters; non-persistent buffers stay per worker."""

    class Odd(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(3, 2)
            self.b = torch.nn.Linear(3, 2)
            self.b.weight = self.a.weight  # tied
            self.register_buffer("empty", torch.zeros(0))
            self.register_buffer("steps", torch.tensor(7, dtype=torch.int64))
            self.register_buffer("flags", torch.tensor([True, False, True]))
            self.register_buffer("per_env", torch.ones(4), persistent=False)

    learner, worker = Odd(), Odd()
    with torch.no_grad():
        worker.a.weight.zero_()
        worker.steps.zero_()
        worker.flags.zero_()
        worker.per_env.fill_(5.0)
    weights = SharedWeights.create(learner)
    reader = SharedWeights.attach(weights.name, layout_of(learner))
    try:
        assert reader.load_into(worker) == 1
        assert torch.equal(worker.a.weight, learner.a.weight) and worker.b.weight is worker.a.weight
        assert worker.steps.item() == 7 and worker.flags.tolist() == [True, False, True]
        assert worker.empty.shape == (0,)
        assert worker.per_env.tolist() == [5.0] * 4, "a non-persistent buffer is the worker's own state"
        with torch.no_grad():
            learner.steps.fill_(9)
            learner.a.weight.add_(1.0)
        assert weights.publish(learner) == 2
        assert reader.load_into(worker) == 2
        assert worker.steps.item() == 9 and torch.equal(worker.b.weight, learner.a.weight)
    finally:
        reader.close()
        weights.close()


def test_ddpg_ou_exploration_runs_anneals_and_keeps_its_noise_process(no_leaks):
    """ddpg.py: actor + OrnsteinUhlenbeckProcessModule, annealed by the learner, its noise state in the TensorDict."""
    actor = TensorDictModule(lambda obs: torch.zeros(*obs.shape[:-1], 1), in_keys=["observation"],
                             out_keys=["action"])
    ou = OrnsteinUhlenbeckProcessModule(spec=Bounded(-2.0, 2.0, shape=(1,)), annealing_num_steps=1_000, sigma=0.5)
    policy = TensorDictSequential(actor, ou)
    collector = OffPolicyCollector(make_env, policy, frames_per_batch=200, total_frames=1_000, device="cpu",
                                   init_random_frames=0, compile_policy=False, cudagraph_policy=False)
    collector.set_seed(0)
    batches = []
    for batch in collector:
        ou.step(200)  # what ddpg.py does after each batch
        collector.update_policy_weights_()
        batches.append(batch)
    assert collector.get_cached_weights("policy")["module", "1", "eps"] == ou.eps, "eps reached the shared block"
    collector.shutdown()
    rows = torch.cat(batches)
    # within an episode, OU noise is a slowly moving process: consecutive actions are strongly
    # correlated. Noise restarted at every step (state dropped) would be uncorrelated.
    traj = rows["collector", "traj_ids"]
    first = rows[traj == traj[0]]["action"].squeeze(-1)
    assert len(first) > 50
    corr = torch.corrcoef(torch.stack([first[:-1], first[1:]]))[0, 1]
    assert corr > 0.8, f"lag-1 correlation of OU actions {corr:.2f}"


def test_additive_gaussian_sigma_annealed_by_the_learner_reaches_the_workers(no_leaks):
    """td3.py: AdditiveGaussianModule's sigma is a persistent buffer and travels with the weights."""
    spec = Bounded(-2.0, 2.0, shape=(1,))
    actor = TensorDictModule(lambda obs: torch.zeros(*obs.shape[:-1], 1), in_keys=["observation"],
                             out_keys=["action"])
    noise = AdditiveGaussianModule(spec=spec, sigma_init=1.0, sigma_end=0.0, annealing_num_steps=100)
    collector = OffPolicyCollector(make_env, TensorDictSequential(actor, noise), frames_per_batch=100,
                                   total_frames=600, device="cpu")
    stds = []
    for i, batch in enumerate(collector):
        stds.append(float(batch["action"].std()))
        if i == 1:
            noise.step(100)  # sigma_end reached: 0
            collector.update_policy_weights_()
    collector.shutdown()
    assert stds[0] > 0.3 and stds[-1] < 1e-3, stds


def test_one_env_instance_serves_several_workers(no_leaks):
    """The trainers' pattern: one env instance with num_workers=N; each worker gets its own copy."""
    # SerialEnv: a ParallelEnv copy inside each worker leaves its semaphores in /dev/shm when the worker
    # is stopped; the copy path is the same for both.
    env = TransformedEnv(SerialEnv(2, EnvCreator(pendulum)), Compose(StepCounter(200), DoubleToFloat()))
    replay_buffer = ReplayBuffer(storage=LazyTensorStorage(10_000), shared=True)
    collector = OffPolicyCollector(env, actor_net(), num_workers=2, frames_per_batch=100, total_frames=-1,
                                   device="cpu", replay_buffer=replay_buffer)
    try:
        collector.set_seed(3)
        collector.start()
        metrics = collector.metrics
        assert wait_until(lambda: all(w["frames"] > 0 for w in metrics()["workers"]), timeout=120)
    finally:
        collector.shutdown()
    assert env.base_env.is_closed, "the instance itself never started: workers run copies"
    rows = replay_buffer[:]
    assert {int(t) % 2 for t in rows["collector", "traj_ids"].unique()} == {0, 1}, "both workers wrote rows"
    first_obs = rows[rows["step_count"].squeeze(-1) == 0]["observation"]
    assert len(first_obs) >= 4
    assert len(torch.unique(first_obs, dim=0)) == len(first_obs), "every env of every worker has its own seed"
    del collector, replay_buffer  # its locks' semaphores go with it


def test_a_started_env_instance_cannot_be_copied_and_says_what_to_pass(no_leaks):
    env = TransformedEnv(ParallelEnv(2, EnvCreator(pendulum)), StepCounter(200))
    env.set_seed(0)  # starts its processes
    try:
        with pytest.raises(ValueError, match="already started.*num_workers=2.*pass a factory"):
            OffPolicyCollector(env, actor_net(), num_workers=2, frames_per_batch=100, total_frames=200)
    finally:
        env.close(raise_if_closed=False)


def test_exploration_type_by_name_as_trainer_configs_give_it():
    with pytest.raises(ValueError, match="exploration_type must be .*'RANDOM'.*got 'sideways'"):
        OffPolicyCollector("Pendulum-v1", actor_net(), frames_per_batch=16, exploration_type="sideways")


def test_collector_is_registered_in_torchrl_config_store():
    from hydra.core.config_store import ConfigStore
    from hydra.core.plugins import Plugins

    Plugins.instance()  # Hydra's plugin discovery, as at the start of every Hydra app
    node = ConfigStore.instance().load("collector/off_policy.yaml").node
    assert node._target_ == "torchrl_unilab.OffPolicyCollector"
    multi_async = ConfigStore.instance().load("collector/multi_async.yaml").node
    assert set(multi_async) <= set(node), "every field of TorchRL's MultiAsyncCollectorConfig"


@pytest.mark.parametrize("collector", ["off_policy", "target"], ids=["by-name", "by-target"])
def test_torchrl_sac_trainer_built_from_its_config_classes(collector, tmp_path):
    # No no_leaks fixture: TorchRL's SACTrainer keeps its shared ReplayBuffer (and that buffer's
    # multiprocessing locks, semaphores in /dev/shm) alive past the test.
    """TorchRL's config-driven SACTrainer: one env instance for 2 workers, track_policy_version=true."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.utils import instantiate

    overrides = [f"logger.log_dir={tmp_path}", "collector.total_frames=800"]
    if collector == "target":  # the stock config's multi_async entry, pointed at our class
        overrides += ["collector=multi_async", "collector._target_=torchrl_unilab.OffPolicyCollector"]
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(Path(__file__).parent / "configs"), version_base="1.3"):
        cfg = compose(config_name="sac_trainer_pendulum", overrides=overrides)
    assert cfg.collector.track_policy_version and cfg.collector.num_workers == 2
    trainer = instantiate(cfg.trainer)
    try:
        assert isinstance(trainer.collector, OffPolicyCollector)
        trainer.train()
        assert trainer.collected_frames == 800
        assert len(trainer.replay_buffer) == 800
        versions = trainer.replay_buffer[:]["policy_version"]
        assert (versions == -1).sum() == 200, "init_random_frames is exact"
        assert versions.max() > 1, "the trainer's weight updates reached the workers"
    finally:
        trainer.collector.shutdown()
        GlobalHydra.instance().clear()
    assert not any(proc.is_alive() for proc in trainer.collector.procs), "every worker stopped"


def test_torchrl_td3_trainer_bounds_its_loss_from_collector_env(tmp_path):
    # No no_leaks fixture, for the reason given in the SAC trainer test above.
    """td3_trainer's config: `collector: sync` swapped by _target_; TD3Loss takes its bounds from collector.env."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.utils import instantiate

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(Path(__file__).parent / "configs"), version_base="1.3"):
        cfg = compose(config_name="td3_trainer_pendulum", overrides=[f"logger.log_dir={tmp_path}"])
    assert cfg.loss.get("action_spec") is None and cfg.loss.get("bounds") is None, "the bounds come from the env"
    trainer = instantiate(cfg.trainer)
    try:
        assert isinstance(trainer.collector, OffPolicyCollector)
        assert torch.equal(trainer.loss_module.max_action, torch.tensor([2.0])), "Pendulum's action bound"
        trainer.train()
        assert trainer.collected_frames == 800 and len(trainer.replay_buffer) == 800
        versions = trainer.replay_buffer[:]["policy_version"]
        assert (versions == -1).sum() == 200 and versions.max() > 1
    finally:
        trainer.collector.shutdown()
        GlobalHydra.instance().clear()
    assert not any(proc.is_alive() for proc in trainer.collector.procs), "every worker stopped"


def test_a_factory_holding_an_unstarted_parallel_env_serves_several_workers():
    # No no_leaks fixture: a ParallelEnv copied into workers leaves semaphores in /dev/shm.
    """td3_trainer's hydra partial: TransformedEnv over a ParallelEnv instance built once, for every worker.

    Looking at the env starts the instance in this process; each worker must get the unstarted copy.
    """
    base = ParallelEnv(1, EnvCreator(pendulum))
    factory = functools.partial(TransformedEnv, base, Compose(StepCounter(200), DoubleToFloat()))
    collector = OffPolicyCollector(factory, actor_net(), num_workers=2, frames_per_batch=100, total_frames=400)
    try:
        assert not base.is_closed, "the probe started the instance here"
        assert sum(batch.numel() for batch in collector) == 400
    finally:
        collector.shutdown()
    assert base.is_closed, "the probe's instance is closed with the collector"
    assert not any(proc.is_alive() for proc in collector.procs)


def test_collector_env_answers_specs_from_the_workers_envs(no_leaks):
    """TorchRL's Collector has .env; trainers and scripts read its specs."""
    with OffPolicyCollector(make_env, actor_net(), num_workers=2, frames_per_batch=100, total_frames=200) as collector:
        assert collector.env.action_spec_unbatched == collector.getattr_env("action_spec_unbatched")
        assert sum(batch.numel() for batch in collector) == 200
        assert collector.env.batch_size == collector.getattr_env("batch_size"), "still answers once workers run"
        with pytest.raises(NotImplementedError, match="live in the worker processes"):
            collector.env.rollout


def test_split_trajs_then_multistep_postproc_as_redq_uses_them(no_leaks):
    """redq.py's collector: split_trajs=True with TorchRL's MultiStep as postproc."""
    from torchrl.data.postprocs import MultiStep

    collector = OffPolicyCollector(make_env, actor_net(), frames_per_batch=400, total_frames=800, device="cpu",
                                   split_trajs=True, postproc=MultiStep(gamma=0.99, n_steps=3),
                                   max_frames_per_traj=150)
    batches = list(collector)
    collector.shutdown()
    batch = batches[-1]
    mask = batch["collector", "mask"]
    assert batch.ndim == 2 and mask.shape == batch.shape
    traj = batch["collector", "traj_ids"]
    # one trajectory per row, its valid steps first and in order
    for ids, valid, steps in zip(traj, mask, batch["step_count"].squeeze(-1)):
        assert (ids[valid] == ids[0]).all()
        assert torch.equal(steps[valid], steps[valid][0] + torch.arange(int(valid.sum())))
    assert int(mask.sum()) == 400
    assert "steps_to_next_obs" in batch.keys(), "MultiStep ran on the split batch"


@pytest.mark.parametrize("config", ["CollectorConfig", "MultiAsyncCollectorConfig"])
def test_every_field_of_torchrl_collector_configs_is_taken_at_its_default(config, no_leaks):
    """td3_trainer/ddpg_trainer configs use TorchRL's `collector: sync` entry, with Collector's own fields."""
    from dataclasses import MISSING, fields

    from torchrl.trainers.algorithms.configs import collectors

    defaults = {
        f.name: f.default
        for f in fields(getattr(collectors, config))
        if f.default is not MISSING and not f.name.startswith("_") and f.name not in ("create_env_fn", "policy")
    }
    assert "backend" in defaults or config != "CollectorConfig"
    defaults.update(frames_per_batch=100, total_frames=200)
    with OffPolicyCollector(make_env, actor_net(), **defaults) as collector:
        assert sum(batch.numel() for batch in collector) == 200
    with pytest.raises(ValueError, match="'backend' only as one of .*RayOffPolicyCollector"):
        OffPolicyCollector(make_env, actor_net(), frames_per_batch=100, backend="ray")


@dataclasses.dataclass
class ActorFactoryConfig:
    """A hydra config of a policy factory, as TorchRL's collector configs take one (``_partial_`` set by them)."""

    _target_: str = "torchrl_unilab.modules.models.make_actor"
    algo: str = "td3"
    obs_dim: int = 3
    action_dim: int = 1
    hidden_sizes: tuple = (16,)
    _partial_: bool = False


@pytest.mark.parametrize("factory", [None, "policy_factory", "policy_factory+weight_updater"])
def test_torchrl_multi_async_config_pointed_at_our_class_builds_and_collects(factory, no_leaks):
    """TorchRL's MultiAsyncCollectorConfig with its _target_ on our class, as a config-driven trainer instantiates
    it: with a policy factory (a partial, called in the workers) and TorchRL's remote-module weight updater."""
    from hydra.utils import instantiate
    from omegaconf import OmegaConf
    from torchrl.collectors.weight_update import RemoteModuleWeightUpdater
    from torchrl.trainers.algorithms.configs.collectors import MultiAsyncCollectorConfig
    from torchrl.trainers.algorithms.configs.envs_libs import GymEnvConfig
    from torchrl.trainers.algorithms.configs.weight_update import RemoteModuleWeightUpdaterConfig

    extra = {}
    if factory is not None:
        extra["policy_factory"] = ActorFactoryConfig()
    if factory == "policy_factory+weight_updater":
        extra["weight_updater"] = RemoteModuleWeightUpdaterConfig()
    cfg = MultiAsyncCollectorConfig(create_env_fn=[GymEnvConfig(env_name="Pendulum-v1")], num_workers=1,
                                    frames_per_batch=64, total_frames=128, **extra)
    cfg._target_ = "torchrl_unilab.OffPolicyCollector"
    collector = instantiate(OmegaConf.structured(cfg))
    with collector:
        assert isinstance(collector, OffPolicyCollector)
        assert isinstance(collector.weight_updater, RemoteModuleWeightUpdater) == ("weight_updater" in extra)
        batches = list(collector)
    assert sum(batch.numel() for batch in batches) == 128
    assert all(torch.isfinite(batch["action"]).all() for batch in batches)


def test_a_block_whose_first_publish_fails_is_removed(no_leaks):
    """A policy the block cannot take must not leave its block in /dev/shm (ddpg.py's first failure did)."""
    with pytest.raises(NotImplementedError):
        SharedWeights.create({"weight": torch.empty(3, device="meta")})  # meta tensors hold no data to copy


def test_max_frames_per_traj_at_or_below_zero_means_no_limit_as_in_torchrl(no_leaks):
    with OffPolicyCollector(make_env, actor_net(), frames_per_batch=100, total_frames=100,
                            max_frames_per_traj=-1) as collector:
        assert collector.max_frames_per_traj == 0
        assert next(iter(collector)).numel() == 100


def test_a_started_instance_of_a_recognised_stack_serves_several_workers_on_envpool(no_leaks):
    """No copy is needed when the stack is rebuilt on EnvPool: a started ParallelEnv of HalfCheetah is fine."""
    env = TransformedEnv(ParallelEnv(2, EnvCreator(functools.partial(GymEnv, "HalfCheetah-v5"))),
                         Compose(StepCounter(1000), DoubleToFloat()))
    env.set_seed(0)  # starts its processes
    try:
        with OffPolicyCollector(env, None, num_workers=2, frames_per_batch=100, total_frames=200) as collector:
            assert collector.metrics()["engine"] == "envpool"
            assert sum(batch.numel() for batch in collector) == 200
    finally:
        env.close(raise_if_closed=False)


def test_exploration_module_without_spec_takes_the_envs_as_in_torchrl(no_leaks):
    """td3_trainer's config builds AdditiveGaussianModule(spec=None); TorchRL's collectors set it from the env."""
    noise = AdditiveGaussianModule(spec=None, sigma_init=0.5)
    with OffPolicyCollector(make_env, TensorDictSequential(actor_net(), noise), frames_per_batch=100,
                            total_frames=100) as collector:
        assert noise.spec is not None
        assert next(iter(collector))["action"].abs().max() <= 2.0
