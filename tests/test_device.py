"""A learner on ``network.device``: device plumbing, batches to the device, weights back, checkpoints across devices.

Everything that needs no GPU runs here on the CPU: the device key and its
errors, the CPU build of the workers' policy and the publish from a separate
learner policy (the layout a GPU run has, exercised with two CPU modules),
the staged publish path, pinned sampling where the build supports it,
checkpoints that hold only CPU tensors and load with ``map_location``, the
compile settings on a CPU, and the recipes with ``network.device=cpu``. The
tests marked ``cuda`` run the same on a GPU when one is present.
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from omegaconf import OmegaConf
from tensordict import TensorDict
from test_recipes import RECIPES, run_recipe, saved_counters

from torchrl_unilab import OffPolicyCollector, make_replay_buffer
from torchrl_unilab.collectors import _policy
from torchrl_unilab.data import BufferSampler
from torchrl_unilab.modules.models import make_actor
from torchrl_unilab.trainers import checkpoint
from torchrl_unilab.trainers.checkpoint import Checkpointer, cpu_state
from torchrl_unilab.trainers.compile import compile_update
from torchrl_unilab.trainers.device import learner_device, module_device
from torchrl_unilab.trainers.evaluation import EvalRunner
from torchrl_unilab.trainers.recipes_utils import (
    cpu_copy_of_policy,
    env_info,
    make_loss_module,
    make_networks,
    make_optimizer,
    make_replay_buffer as recipe_replay_buffer,
)
from torchrl_unilab.trainers.run import RecipeRun
from torchrl_unilab.weight_update import SharedWeights

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error raised where there is no GPU")

PENDULUM = OmegaConf.create({"env": {"name": "Pendulum-v1"}})


def tiny_cfg(algo: str = "sac", **overrides):
    """The recipe's config with tiny networks and budgets (no collection unless a test starts it)."""
    cfg = OmegaConf.load(RECIPES / "config" / f"{algo}.yaml")
    cfg.merge_with_dotlist([
        "env.name=Pendulum-v1", "network.hidden_sizes=[16]", "network.obs_norm=true", "optim.batch_size=8",
        "collector.env_per_collector=2", "collector.frames_per_batch=32", "collector.total_frames=64",
        "collector.init_random_frames=64", "replay_buffer.size=256", "logger.backend=none",
        "logger.progress_bar=false", "logger.num_eval_envs=1", *[f"{k}={v}" for k, v in overrides.items()],
    ])
    return cfg


# ------------------------------------------------------------------ device key
def test_network_device_resolves_null_and_refuses_what_it_cannot_run():
    expected = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    assert learner_device(None) == expected and learner_device("") == expected
    assert learner_device("cpu") == torch.device("cpu") == learner_device(torch.device("cpu"))
    for bad in ("mps", "gpu", 3.5):
        with pytest.raises(ValueError, match=r"network.device must be null \(cuda if available, else cpu\)"):
            learner_device(bad)


@no_cuda
def test_network_device_cuda_without_a_gpu_says_what_to_set():
    with pytest.raises(ValueError, match="network.device='cuda' but no CUDA device is available.*network.device=cpu"):
        learner_device("cuda")


def test_both_recipes_have_torchrl_device_key_and_cudagraphs_off_by_default():
    for algo in ("sac", "td3"):
        cfg = OmegaConf.load(RECIPES / "config" / f"{algo}.yaml")
        assert "device" in cfg.network and cfg.network.device is None
        assert cfg.compile.compile is False and cfg.compile.cudagraphs is False


# ----------------------------------------------------------------- networks
@pytest.mark.parametrize("algo", ["sac", "td3"])
def test_on_cpu_everything_is_one_set_of_modules_as_before(algo):
    cfg = tiny_cfg(algo)
    nets = make_networks(cfg, algo, env_info(PENDULUM), device=learner_device("cpu"))
    assert nets.worker_policy is nets.policy and module_device(nets.policy).type == "cpu"
    loss, _ = make_loss_module(cfg, algo, nets)
    optimizer = make_optimizer(OmegaConf.merge(cfg, {"compile": {"cudagraphs": True}}), loss)
    assert module_device(loss).type == "cpu"
    assert not optimizer.param_groups[0]["capturable"], "capturable is for CUDA-graph capture only"


@pytest.mark.parametrize("algo", ["sac", "td3"])
def test_the_workers_cpu_policy_is_a_build_of_its_own_with_the_same_weights(algo):
    cfg = tiny_cfg(algo)
    info = env_info(PENDULUM)
    policy = make_networks(cfg, algo, info).policy
    worker = cpu_copy_of_policy(cfg, algo, info, policy)
    assert type(worker) is type(policy) and [type(m) for m in worker.modules()] == [type(m) for m in policy.modules()]
    assert all(torch.equal(a, b) for a, b in zip(worker.state_dict().values(), policy.state_dict().values()))
    shared = {p.data_ptr() for p in policy.parameters()} & {p.data_ptr() for p in worker.parameters()}
    assert not shared, "the workers' copy shares no storage with the learner's policy"
    # Every tensor it holds is on the CPU, the SAC actor's distribution bounds (no buffers) included.
    actor = worker[1] if algo == "td3" else worker[1][0]
    for value in getattr(getattr(actor, "module", [None])[-1], "distribution_kwargs", {}).values():
        assert not isinstance(value, torch.Tensor) or value.device.type == "cpu"


def test_a_learner_policy_apart_from_the_workers_is_what_each_publish_sends(tmp_path, no_leaks):
    """The layout of a GPU run (learner policy on the device, workers on a CPU build), here with two CPU modules."""
    cfg = tiny_cfg("sac", **{"logger.log_dir": str(tmp_path), "collector.sync_every": 1})
    info = env_info(cfg)
    nets = make_networks(cfg, "sac", info)
    worker_policy = cpu_copy_of_policy(cfg, "sac", info, nets.policy)
    run = RecipeRun(cfg, "SAC", nets.policy, recipe_replay_buffer(cfg), normalizer=nets.normalizer,
                    worker_policy=worker_policy, modules={"actor": nets.actor})
    with run:
        assert run.collector.policy is worker_policy or worker_policy in run.collector.policy.modules()
        with torch.no_grad():
            for param in nets.policy.parameters():
                param.fill_(0.25)
        nets.normalizer.update(torch.full((4, info.obs_dim), 3.0))
        version = run.collector.policy_version
        run.publish_weights()
        assert run.collector.policy_version == version + 1
        cached = run.collector.get_cached_weights("policy").flatten_keys(".")
        for name, value in nets.policy.state_dict().items():
            assert torch.equal(cached[name], value), f"{name} was not published from the learner's policy"
        assert not torch.equal(worker_policy[0].mean, nets.normalizer.mean), \
            "the local workers load from the shared block; the CPU build itself is only their template"
        while not run.utd.done:
            run.utd.wait()
            run.utd.step()
    run.finish()


def test_collector_publishes_the_original_of_a_policy_it_had_to_copy_to_cpu(monkeypatch, no_leaks):
    """A CUDA policy given to the collector: workers act on a CPU copy; a publish must read the trained original."""
    copies = []

    def always_copy(policy):  # what _on_cpu does to a policy with tensors off the CPU
        copies.append(copy.deepcopy(policy))
        return copies[-1]

    monkeypatch.setattr(_policy, "_on_cpu", always_copy)
    actor = make_actor("td3", 3, 1, hidden_dim=8)
    with OffPolicyCollector("Pendulum-v1", actor, num_envs=2, frames_per_batch=32, total_frames=64,
                            replay_buffer=make_replay_buffer(256)) as collector:
        assert copies and collector.policy is copies[0]
        with torch.no_grad():
            for param in actor.parameters():
                param.add_(1.0)  # training moves the original, not the workers' copy
        collector.update_policy_weights_()
        cached = collector.get_cached_weights("policy").flatten_keys(".")
        assert all(torch.equal(cached[name], value) for name, value in actor.state_dict().items())
        collector.update_policy_weights_(actor)  # the same, named explicitly
        assert collector.policy_version == 3


def test_what_module_to_leaves_behind_is_moved_too_and_the_actor_still_acts():
    actor = make_actor("sac", 3, 1, hidden_dim=8, action_low=-2.0, action_high=2.0)
    moved = _policy._attributes_to_cpu(copy.deepcopy(actor))  # noqa: SLF001
    kwargs = moved.module[-1].distribution_kwargs
    assert kwargs["tanh_loc"] is False and torch.equal(kwargs["high"], torch.tensor([2.0]))
    assert moved.spec["action"].space.low.device.type == "cpu"
    td = moved(TensorDict({"observation": torch.randn(4, 3)}, [4]))
    assert td["action"].abs().max() <= 2.0


@cuda
def test_a_cuda_policy_given_to_the_collector_is_copied_to_the_cpu_bounds_and_specs_included(no_leaks):
    with torch.device("cuda"):  # bounds and spec made on the GPU, as make_networks does for a GPU learner
        actor = make_actor("sac", 3, 1, hidden_dim=8, action_low=-2.0, action_high=2.0)
    cpu = _policy._on_cpu(actor)
    tensors = [*cpu.parameters(), *cpu.buffers(), *cpu.module[-1].distribution_kwargs.values()]
    assert all(t.device.type == "cpu" for t in tensors if isinstance(t, torch.Tensor))
    assert cpu.spec["action"].space.low.device.type == "cpu"
    with OffPolicyCollector("Pendulum-v1", actor, algo="sac", num_envs=2, frames_per_batch=32, total_frames=64,
                            replay_buffer=make_replay_buffer(256), init_random_frames=0) as collector:
        collector.start()
        assert collector.wait_for_frames(64, timeout=120)
        collector.update_policy_weights_()


# ------------------------------------------------------------------ sampling
def filled_buffer(rows: int = 64):
    rb = make_replay_buffer(128)
    rb.extend(TensorDict({"observation": torch.arange(rows, dtype=torch.float32)[:, None].expand(rows, 3).clone(),
                          "flag": torch.arange(rows) % 2 == 0}, [rows]))
    return rb


def test_sampling_for_a_cpu_learner_is_the_gather_it_always_was():
    rb = filled_buffer()
    default = BufferSampler(rb, 8, keys=["observation", "flag"])
    on_cpu = BufferSampler(rb, 8, keys=["observation", "flag"], device="cpu")
    assert on_cpu.device == torch.device("cpu") and not on_cpu.pin_memory
    batch, info = on_cpu()
    pointer = batch["observation"].data_ptr()
    assert torch.equal(batch["observation"][:, 0].long(), info["index"])
    assert torch.equal(batch["flag"], info["index"] % 2 == 0)
    again, _ = on_cpu()
    assert again is batch and again["observation"].data_ptr() == pointer
    assert default()[0]["observation"].device.type == "cpu"


@no_cuda
def test_pinned_sampling_needs_a_cuda_build_and_says_so():
    with pytest.raises(ValueError, match="pin_memory=True needs a CUDA build with a GPU present"):
        BufferSampler(filled_buffer(), 8, keys=["observation"], pin_memory=True)


@cuda
def test_pinned_sampling_gathers_into_page_locked_memory():
    sample = BufferSampler(filled_buffer(), 8, keys=["observation", "flag"], pin_memory=True)
    batch, info = sample()
    assert batch["observation"].is_pinned() and batch["flag"].is_pinned()
    assert torch.equal(batch["observation"][:, 0].long(), info["index"])


@cuda
def test_batches_cross_to_the_device_in_buffers_allocated_once():
    sample = BufferSampler(filled_buffer(), 16, keys=["observation", "flag"], device="cuda")
    assert sample.pin_memory
    seen = set()
    for _ in range(20):
        batch, info = sample()
        assert batch["observation"].device.type == "cuda" and info["index"].device.type == "cpu"
        index = info["index"].to("cuda")
        assert torch.equal(batch["observation"][:, 0].long(), index) and torch.equal(batch["flag"], index % 2 == 0)
        seen.add(batch["observation"].data_ptr())
    assert len(seen) == 1


# ------------------------------------------------------------------- publish
def mixed_state() -> dict[str, torch.Tensor]:
    return {"w": torch.randn(5, 3), "count": torch.tensor(7), "mask": torch.tensor([True, False, True]),
            "anchor": torch.empty(0), "bias": torch.randn(3, dtype=torch.float64)}


def test_publish_stages_every_tensor_in_one_host_buffer_then_writes_the_block_once():
    state = mixed_state()
    weights = SharedWeights.create(state)
    reader = SharedWeights.attach(weights.name, weights.layout)
    try:
        staging = weights._staging  # noqa: SLF001
        start, end = staging.flat.data_ptr(), staging.flat.data_ptr() + staging.flat.numel()
        assert all(start <= view.data_ptr() <= end for view in staging.views if view.numel())
        assert not staging.pinned, "pinned memory is for CUDA sources only"
        new = {key: (value + 1 if value.dtype not in (torch.bool,) else ~value) for key, value in state.items()}
        assert weights.publish(new) == 2
        version, tensors = reader.read()
        assert version == 2
        for (key, value), read in zip(new.items(), tensors):
            assert torch.equal(read, value), key
    finally:
        reader.close()
        weights.close()


@cuda
def test_publish_from_cuda_crosses_once_into_pinned_staging():
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.LayerNorm(8), torch.nn.Linear(8, 2))
    weights = SharedWeights.create(net)  # a CPU first publish: unpinned staging
    reader = SharedWeights.attach(weights.name, weights.layout)
    try:
        on_gpu = copy.deepcopy(net).cuda()
        with torch.no_grad():
            for param in on_gpu.parameters():
                param.mul_(2)
        state = dict(on_gpu.state_dict())
        state["0.bias"] = state["0.bias"].cpu()  # a CPU entry among CUDA ones
        assert weights.publish(state) == 2
        assert weights._staging.pinned  # noqa: SLF001
        _, tensors = reader.read()
        for (key, value), read in zip(state.items(), tensors):
            assert torch.equal(read, value.cpu()), key
    finally:
        reader.close()
        weights.close()


# --------------------------------------------------------------- checkpoints
def trained(module: torch.nn.Module) -> torch.optim.Adam:
    optimizer = torch.optim.Adam(module.parameters(), lr=1e-2, fused=True)
    for _ in range(3):
        module(torch.randn(4, 3)).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
    return optimizer


def test_checkpoints_hold_cpu_tensors_only_and_load_with_map_location(tmp_path, monkeypatch):
    net = torch.nn.Linear(3, 2)
    optimizer = trained(net)
    rb = make_replay_buffer(16)
    rb.extend(TensorDict({"observation": torch.ones(3, 2)}, [3]))
    Checkpointer(tmp_path / "ckpt", modules={"net": net, "optimizer": optimizer}).save(rb, counters={"frames": 3})

    loads = []
    real_load = torch.load
    monkeypatch.setattr(checkpoint.torch, "load", lambda *a, **k: loads.append(k) or real_load(*a, **k))
    fresh = torch.nn.Linear(3, 2)
    fresh_optimizer = torch.optim.Adam(fresh.parameters(), lr=1e-2, fused=True)
    counters = Checkpointer(tmp_path / "ckpt", modules={"net": fresh, "optimizer": fresh_optimizer}).load()
    assert counters == {"frames": 3} and loads == [{"weights_only": True, "map_location": "cpu"}]
    assert all(torch.equal(a, b) for a, b in zip(fresh.state_dict().values(), net.state_dict().values()))
    assert fresh_optimizer.state_dict()["state"][0]["step"] == optimizer.state_dict()["state"][0]["step"]

    saved = real_load(tmp_path / "ckpt" / "state.pt", weights_only=True, map_location="cpu")
    devices, stack = set(), [saved]
    while stack:
        item = stack.pop()
        if isinstance(item, torch.Tensor):
            devices.add(item.device.type)
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    assert devices == {"cpu"}


def test_cpu_state_keeps_containers_and_state_dict_metadata():
    state = torch.nn.Linear(2, 2).state_dict()
    out = cpu_state({"net": state, "pair": (torch.ones(1), 2)})
    assert type(out["net"]) is type(state) and out["net"]._metadata == state._metadata  # noqa: SLF001
    assert isinstance(out["pair"], tuple) and out["pair"][1] == 2


@cuda
def test_a_run_saved_on_the_gpu_resumes_on_the_cpu_and_back(tmp_path):
    rb = make_replay_buffer(16)
    rb.extend(TensorDict({"observation": torch.ones(3, 2)}, [3]))
    gpu = torch.nn.Linear(3, 2).cuda()
    gpu_optimizer = torch.optim.Adam(gpu.parameters(), lr=1e-2, fused=True)
    gpu(torch.randn(4, 3, device="cuda")).sum().backward()
    gpu_optimizer.step()
    Checkpointer(tmp_path / "gpu", modules={"net": gpu, "optimizer": gpu_optimizer}).save(rb, counters={})
    cpu = torch.nn.Linear(3, 2)
    cpu_optimizer = torch.optim.Adam(cpu.parameters(), lr=1e-2, fused=True)
    Checkpointer(tmp_path / "gpu", modules={"net": cpu, "optimizer": cpu_optimizer}).load()
    assert torch.equal(cpu.weight, gpu.weight.cpu())
    assert cpu_optimizer.state_dict()["state"][0]["exp_avg"].device.type == "cpu"

    Checkpointer(tmp_path / "cpu", modules={"net": cpu, "optimizer": cpu_optimizer}).save(rb, counters={})
    back = torch.nn.Linear(3, 2).cuda()
    back_optimizer = torch.optim.Adam(back.parameters(), lr=1e-2, fused=True)
    Checkpointer(tmp_path / "cpu", modules={"net": back, "optimizer": back_optimizer}).load()
    assert torch.equal(back.weight, gpu.weight)
    assert back_optimizer.state_dict()["state"][0]["exp_avg"].device.type == "cuda"


# ------------------------------------------------------------------ compile
def test_compile_settings_on_a_cpu_learner():
    def step(batch):
        return {"loss": batch["x"].sum()}

    assert compile_update(step, {"compile": False, "cudagraphs": False, "compile_mode": None}, "cpu") is step
    with pytest.warns(UserWarning, match="compile.cudagraphs=true is ignored on network.device=cpu"):
        assert compile_update(step, {"compile": False, "cudagraphs": True}, "cpu") is step
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compiled = compile_update(step, {"compile": True, "compile_mode": None}, "cpu")
    assert not [w for w in caught if "cudagraphs" in str(w.message)]
    assert compiled is not step and getattr(compiled, "_torchdynamo_orig_callable", None) is step


# ------------------------------------------------------------------ evaluation
@cuda
def test_evaluation_runs_the_policy_on_its_device():
    actor = make_actor("td3", 3, 1, hidden_dim=8).cuda()
    evaluator = EvalRunner("Pendulum-v1", 2, seed=0)
    try:
        result = evaluator(actor)
    finally:
        evaluator.close()
    assert result["eval/episode_length"] == 200.0


# -------------------------------------------------------------------- recipes
@pytest.mark.parametrize("algo", ["sac", "td3"])
def test_recipes_with_network_device_cpu(tmp_path, algo, no_leaks):
    """network.device=cpu (and null here, where there is no GPU) runs the CPU recipe; cudagraphs is ignored there."""
    device = "null" if not torch.cuda.is_available() else "cpu"
    with pytest.warns(UserWarning, match="compile.cudagraphs=true is ignored"):
        summary = run_recipe(algo, tmp_path, f"network.device={device}", "compile.cudagraphs=true",
                             "collector.total_frames=384", "logger.eval_iter=384")
    assert summary["frames"] == 384 and summary["updates"] == 384 - 256


@cuda
@pytest.mark.parametrize(("algo", "overrides"), [
    ("sac", []),
    ("sac", ["compile.cudagraphs=true", "network.obs_norm=true"]),
    ("td3", ["compile.cudagraphs=true"]),
    ("sac", ["compile.compile=true", "compile.cudagraphs=true"]),
])
def test_recipes_train_on_cuda_and_resume_on_cpu(tmp_path, algo, overrides, no_leaks):
    run_dir = tmp_path / "run"
    first = run_recipe(algo, run_dir, "network.device=cuda", *overrides, "collector.total_frames=704",
                       "logger.eval_iter=352")
    assert first["frames"] == 704 and first["updates"] == 704 - 256  # a few hundred updates on the GPU
    assert saved_counters(run_dir)["updates"] == 704 - 256
    # the checkpoint names no device: the CPU learner picks up where the GPU one stopped
    second = run_recipe(algo, run_dir, f"resume={run_dir}", "network.device=cpu",
                        *[o for o in overrides if o.startswith("network.")], "collector.total_frames=768")
    assert second["frames"] == 768 and second["updates"] == 768 - 256

