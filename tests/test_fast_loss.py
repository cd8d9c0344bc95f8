"""The tensor-level loss computes what TorchRL's SACLoss / TD3Loss compute: values and gradients."""

from __future__ import annotations

import pytest
import torch
from conftest import needs_extra
from omegaconf import OmegaConf
from tensordict import TensorDict
from torch import nn
from torchrl.modules import TanhNormal, ValueOperator
from torchrl.objectives import SACLoss, SoftUpdate, ValueEstimators

from torchrl_unilab.modules._tanh_normal import TanhNormalSampler
from torchrl_unilab.modules.models import make_actor, make_critic
from torchrl_unilab.objectives import ForeachSoftUpdate
from torchrl_unilab.objectives._fast_loss import tensor_loss
from torchrl_unilab.trainers.recipes_utils import EnvInfo, make_loss_module, make_networks, make_optimizer

OBS, PRIV, ACT, B = 5, 3, 2, 64


def config(layer_norm: bool):
    return OmegaConf.create({
        "network": {"hidden_sizes": [32, 32], "use_layer_norm": layer_norm, "obs_norm": False},
        "optim": {"gamma": 0.9, "loss_function": "l2", "alpha_init": 0.7, "target_update_polyak": 0.9,
                  "policy_noise": 0.2, "noise_clip": 0.5, "lr": 1e-2, "weight_decay": 0.0, "adam_eps": 1e-8},
    })


def batch(privileged: bool = False, seed: int = 0) -> TensorDict:
    g = torch.Generator().manual_seed(seed)
    terminated = torch.rand(B, 1, generator=g) < 0.3  # some rows must not bootstrap
    data = {
        "observation": torch.randn(B, OBS, generator=g), "action": torch.rand(B, ACT, generator=g) * 4 - 2,
        ("next", "observation"): torch.randn(B, OBS, generator=g), ("next", "reward"): torch.randn(B, 1, generator=g),
        ("next", "terminated"): terminated, ("next", "done"): terminated,
    }
    if privileged:
        data["privileged"] = torch.randn(B, PRIV, generator=g)
        data[("next", "privileged")] = torch.randn(B, PRIV, generator=g)
    return TensorDict(data, [B])


def losses_and_grads(loss, compute, seed: int = 1):
    """Runs ``compute()`` under a fixed seed; returns its scalar values and the gradient of every parameter."""
    params = [p for p in loss.parameters() if p.requires_grad]
    torch.manual_seed(seed)
    out = compute()
    total = sum(v for k, v in out.items() if k.startswith("loss_"))
    grads = torch.autograd.grad(total, params, allow_unused=True)
    values = {k: v.detach() for k, v in out.items() if v.ndim == 0}
    return values, [torch.zeros_like(p) if g is None else g for p, g in zip(params, grads)]


def assert_same(loss, fast, data, **kwargs):
    ref_values, ref_grads = losses_and_grads(loss, lambda: loss(data.clone()))
    values, grads = losses_and_grads(loss, lambda: fast(data.clone(), **kwargs))
    assert set(values) == set(ref_values)
    for key in ref_values:
        torch.testing.assert_close(values[key], ref_values[key], rtol=1e-5, atol=1e-5, msg=key)
    for ref, got in zip(ref_grads, grads):
        torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("algo", ["sac", "td3"])
@pytest.mark.parametrize("layer_norm", [False, True])
@pytest.mark.parametrize("n_step", [False, True])
def test_tensor_loss_matches_the_torchrl_loss(algo, layer_norm, n_step):
    torch.manual_seed(0)
    nets = make_networks(config(layer_norm), algo, EnvInfo(OBS, ACT, -2 * torch.ones(ACT), 2 * torch.ones(ACT)))
    loss, _ = make_loss_module(config(layer_norm), algo, nets)
    with torch.no_grad():  # targets that differ from the online networks, as after some updates
        for p in loss.parameters():
            p.add_(0.05 * torch.randn_like(p))
    fast = tensor_loss(loss)
    assert fast is not None
    data = batch()
    if n_step:  # collector.multi_step rows: TorchRL's estimator bootstraps with gamma ** steps_to_next_obs
        data["steps_to_next_obs"] = torch.randint(1, 4, (B,), generator=torch.Generator().manual_seed(3))
    assert_same(loss, fast, data)


@pytest.mark.parametrize("algo", ["sac", "td3"])
@pytest.mark.parametrize("layer_norm", [False, True])
def test_bf16_matmuls_keep_the_losses_and_gradients_of_float32(algo, layer_norm):
    """optim.matmul_dtype=bf16: only the matmuls change precision. Losses within 2 %, each parameter's gradient
    within 5 % of its norm and pointing the same way (cosine > 0.99); what they return stays float32."""
    torch.manual_seed(0)
    nets = make_networks(config(layer_norm), algo, EnvInfo(OBS, ACT, -2 * torch.ones(ACT), 2 * torch.ones(ACT)))
    loss, _ = make_loss_module(config(layer_norm), algo, nets)
    fp32, bf16 = tensor_loss(loss), tensor_loss(loss, torch.bfloat16)
    data = batch()
    ref_values, ref_grads = losses_and_grads(loss, lambda: fp32(data.clone()))
    values, grads = losses_and_grads(loss, lambda: bf16(data.clone()))
    assert all(v.dtype == torch.float32 for v in values.values())
    assert any(not torch.equal(values[k], ref_values[k]) for k in ref_values), "the matmuls did not run in bf16"
    for key in ref_values:
        torch.testing.assert_close(values[key], ref_values[key], rtol=0.02, atol=0.02, msg=key)
    for ref, got in zip(ref_grads, grads):
        if ref.norm() > 0:
            assert (got - ref).norm() <= 0.05 * ref.norm()
            assert torch.nn.functional.cosine_similarity(got.flatten(), ref.flatten(), dim=0) > 0.99


def test_matmul_dtype_names_the_key_and_auto_follows_the_cpu():
    from torchrl_unilab.trainers.device import cpu_computes_bf16, learner_matmul_dtype

    cpu = torch.device("cpu")
    assert learner_matmul_dtype("bf16", cpu) == torch.bfloat16 and learner_matmul_dtype("fp32", cpu) == torch.float32
    assert learner_matmul_dtype("auto", cpu) == (torch.bfloat16 if cpu_computes_bf16() else torch.float32)
    with pytest.raises(ValueError, match="optim.matmul_dtype must be 'auto', 'fp32' or 'bf16', got 'half'"):
        learner_matmul_dtype("half", cpu)


@pytest.mark.parametrize("algo", ["sac", "td3"])
def test_tensor_loss_matches_the_torchrl_loss_with_the_recipes_asymmetric_critic(algo):
    """network.critic_input=privileged: the same values and gradients (TD3 through its PassThroughActor)."""
    torch.manual_seed(0)
    cfg = config(False)
    cfg.network.critic_input = "privileged"
    info = EnvInfo(OBS, ACT, -2 * torch.ones(ACT), 2 * torch.ones(ACT), privileged_dim=PRIV)
    nets = make_networks(cfg, algo, info)
    loss, _ = make_loss_module(cfg, algo, nets)
    with torch.no_grad():
        for p in loss.parameters():
            p.add_(0.05 * torch.randn_like(p))
    fast = tensor_loss(loss)
    assert fast is not None
    assert_same(loss, fast, batch(privileged=True))


def test_asymmetric_sac_critic_reads_privileged_keys():
    torch.manual_seed(0)
    actor = make_actor("sac", OBS, ACT, hidden_dim=16)
    critic = make_critic(OBS + PRIV, ACT, hidden_dim=16, in_keys=["observation", "privileged", "action"])
    loss = SACLoss(actor, critic, num_qvalue_nets=2, delay_qvalue=True, alpha_init=0.5)
    loss.make_value_estimator(gamma=0.95)
    assert_same(loss, tensor_loss(loss), batch(privileged=True))


def test_td3_critic_only_step_matches_value_loss():
    torch.manual_seed(0)
    nets = make_networks(config(False), "td3", EnvInfo(OBS, ACT, -2 * torch.ones(ACT), 2 * torch.ones(ACT)))
    loss, _ = make_loss_module(config(False), "td3", nets)
    data, fast = batch(), tensor_loss(loss)
    torch.manual_seed(3)
    ref, _ = loss.value_loss(data.clone())
    torch.manual_seed(3)
    got = fast(data.clone(), update_actor=False)
    assert set(got) == {"loss_qvalue"}
    torch.testing.assert_close(got["loss_qvalue"], ref)


def test_td3_value_and_actor_losses_match_the_loss_module_methods():
    """``value_loss`` and ``actor_loss``, which the TD3 recipe steps one after the other, are TD3Loss's."""
    torch.manual_seed(0)
    nets = make_networks(config(True), "td3", EnvInfo(OBS, ACT, -2 * torch.ones(ACT), 2 * torch.ones(ACT)))
    loss, _ = make_loss_module(config(True), "td3", nets)
    with torch.no_grad():  # targets apart from the online networks
        for p in loss.parameters():
            p.add_(0.05 * torch.randn_like(p))
    fast, data = tensor_loss(loss), batch()
    for name in ("value_loss", "actor_loss"):
        ref_values, ref_grads = losses_and_grads(loss, lambda: {"loss_": getattr(loss, name)(data.clone())[0]})
        values, grads = losses_and_grads(loss, lambda: {"loss_": getattr(fast, name)(data.clone())})
        torch.testing.assert_close(values["loss_"], ref_values["loss_"], rtol=1e-5, atol=1e-5, msg=name)
        for ref, got in zip(ref_grads, grads):
            torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-5, msg=name)


def _sb3_linears(net: nn.Module) -> list[nn.Linear]:
    return [m for m in net.modules() if isinstance(m, nn.Linear)]


def _linears(params) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(weight, bias) of each Linear layer of an MLP's parameter TensorDict, input layer first."""
    flat = params.flatten_keys(".")
    weights = sorted((k for k in flat.keys() if k.endswith("weight")),
                     key=lambda k: [int(part) if part.isdigit() else part for part in k.split(".")])
    return [(flat[k], flat[k.removesuffix("weight") + "bias"]) for k in weights]


@pytest.mark.parametrize("fast_loss", [True, False])
def test_td3_recipe_update_follows_stable_baselines3(fast_loss):
    """recipes/td3.py's update and SB3's ``TD3.train`` from the same weights on the same batches stay together.

    The critics step, then every second update the actor climbs the updated Q1 and the targets follow. An
    update computing the actor loss on the critic before its step (one backward of both losses) leaves the
    actor apart by up to 2 * lr after one step (Adam's first step moves each weight by lr).
    """
    sb3 = needs_extra("stable_baselines3", "bench")
    import gymnasium as gym
    from stable_baselines3.common.logger import Logger
    from stable_baselines3.common.type_aliases import ReplayBufferSamples
    from test_recipes import load_recipe

    lr, n, width = 1e-3, 64, 32
    cfg = OmegaConf.merge(config(False), {"network": {"hidden_sizes": [width, width]},
                                          "optim": {"gamma": 0.99, "target_update_polyak": 0.995, "lr": lr,
                                                    "policy_noise": 0.0}})  # no smoothing noise: RNGs apart
    env = gym.make("MountainCarContinuous-v0")  # actions in [-1, 1], where SB3's actor and ours agree
    obs_dim, act_dim = env.observation_space.shape[0], env.action_space.shape[0]
    torch.manual_seed(0)
    nets = make_networks(cfg, "td3", EnvInfo(obs_dim, act_dim, -torch.ones(act_dim), torch.ones(act_dim)))
    loss, target = make_loss_module(cfg, "td3", nets)
    update = load_recipe("td3").make_update(loss, make_optimizer(cfg, loss), target,
                                            tensor_loss(loss) if fast_loss else None)
    model = sb3.TD3("MlpPolicy", env, learning_rate=lr, batch_size=n, target_policy_noise=0.0, seed=0,
                    policy_kwargs={"net_arch": [width, width]}, device="cpu")
    model.set_logger(Logger(folder=None, output_formats=[]))  # configure() makes a /tmp/SB3-<date> folder
    model._n_updates = -1  # SB3 counts before it checks the delay: its update i then moves the actor when i is even
    policy = model.policy
    pairs = [(loss.actor_network_params, [policy.actor.mu]),
             (loss.target_actor_network_params, [policy.actor_target.mu]),
             (loss.qvalue_network_params, policy.critic.q_networks),
             (loss.target_qvalue_network_params, policy.critic_target.q_networks)]
    with torch.no_grad():
        for params, nets_sb3 in pairs:
            for i, net in enumerate(nets_sb3):
                for (w, b), layer in zip(_linears(params), _sb3_linears(net)):
                    layer.weight.copy_(w if len(nets_sb3) == 1 else w[i])
                    layer.bias.copy_(b if len(nets_sb3) == 1 else b[i])
    g = torch.Generator().manual_seed(1)
    for i in range(6):
        done = torch.rand(n, 1, generator=g) < 0.1
        data = TensorDict({"observation": torch.randn(n, obs_dim, generator=g),
                           "action": torch.rand(n, act_dim, generator=g) * 2 - 1,
                           ("next", "observation"): torch.randn(n, obs_dim, generator=g),
                           ("next", "reward"): torch.randn(n, 1, generator=g),
                           ("next", "terminated"): done, ("next", "done"): done}, [n])
        model.replay_buffer.sample = lambda *args, data=data, **kwargs: ReplayBufferSamples(
            data["observation"], data["action"], data["next", "observation"], data["next", "terminated"].float(),
            data["next", "reward"])
        model.train(gradient_steps=1, batch_size=n)
        assert sorted(update(data.clone(), i % 2 == 0)) == ["loss_actor", "loss_qvalue"][i % 2:]
        for params, nets_sb3 in pairs:
            for j, net in enumerate(nets_sb3):
                for (w, b), layer in zip(_linears(params), _sb3_linears(net)):
                    ours = (w, b) if len(nets_sb3) == 1 else (w[j], b[j])
                    torch.testing.assert_close(ours[0], layer.weight, rtol=0, atol=1e-5, msg=f"update {i}")
                    torch.testing.assert_close(ours[1], layer.bias, rtol=0, atol=1e-5, msg=f"update {i}")


def test_update_steps_follow_the_same_trajectory_with_and_without_the_tensor_loss():
    """Ten updates (Adam, target updates) from the same start end at the same parameters, also after a reload."""

    def run(fast_loss: bool, state=None):
        torch.manual_seed(0)
        nets = make_networks(config(True), "sac", EnvInfo(OBS, ACT, -torch.ones(ACT), torch.ones(ACT)))
        loss, target = make_loss_module(config(True), "sac", nets)
        opt = make_optimizer(config(True), loss)
        loss_fn = tensor_loss(loss) if fast_loss else loss  # as recipes/sac.py chooses
        if state is not None:  # the tensor loss keeps reading the parameters load_state_dict fills in
            loss.load_state_dict(state)
        assert (loss_fn is not loss) is fast_loss
        torch.manual_seed(1)
        for i in range(10):  # recipes/sac.py's update
            losses = loss_fn(batch(seed=i))
            (losses["loss_actor"] + losses["loss_qvalue"] + losses["loss_alpha"]).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            target.step()
        return loss.state_dict()

    reference, fast = run(False), run(True)
    for key in reference:
        torch.testing.assert_close(fast[key], reference[key], rtol=1e-4, atol=1e-5, msg=key)
    reloaded, fast_reloaded = run(False, state=reference), run(True, state=reference)
    for key in reloaded:
        torch.testing.assert_close(fast_reloaded[key], reloaded[key], rtol=1e-4, atol=1e-5, msg=key)


class Bilinear(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Bilinear(OBS, ACT, 1)

    def forward(self, observation, action):
        return self.layer(observation, action)


def test_unsupported_networks_and_estimators_fall_back_to_the_loss_module():
    torch.manual_seed(0)
    actor = make_actor("sac", OBS, ACT, hidden_dim=16)
    other_critic = ValueOperator(Bilinear(), in_keys=["observation", "action"])
    loss = SACLoss(actor, other_critic, num_qvalue_nets=2)
    assert tensor_loss(loss) is None
    loss = SACLoss(actor, make_critic(OBS, ACT, hidden_dim=16), num_qvalue_nets=2)
    loss.make_value_estimator(ValueEstimators.TDLambda, gamma=0.99, lmbda=0.9)
    assert tensor_loss(loss) is None


def test_a_value_estimator_changed_after_construction_is_refused():
    torch.manual_seed(0)
    loss = SACLoss(make_actor("sac", OBS, ACT, hidden_dim=16), make_critic(OBS, ACT, hidden_dim=16), num_qvalue_nets=2)
    fast = tensor_loss(loss)  # the default estimator, TD(0)
    assert fast is not None
    loss.make_value_estimator(ValueEstimators.TDLambda, gamma=0.99, lmbda=0.9)
    with pytest.raises(ValueError, match="TD\\(0\\) targets.*compile.fast_loss=false"):
        fast(batch())


def test_prioritized_batches_are_refused_by_the_tensor_loss():
    torch.manual_seed(0)
    nets = make_networks(config(False), "sac", EnvInfo(OBS, ACT, -torch.ones(ACT), torch.ones(ACT)))
    loss, _ = make_loss_module(config(False), "sac", nets)
    data = batch()
    data["priority_weight"] = torch.ones(B)
    with pytest.raises(ValueError, match="priority weights"):
        tensor_loss(loss)(data)


@pytest.mark.parametrize("algo", ["sac", "td3"])
def test_foreach_soft_update_moves_every_target_as_soft_update(algo):
    """The fused target update gives SoftUpdate's targets, also after load_state_dict refills the parameters."""

    def targets_after(updater_class, state=None):
        torch.manual_seed(0)
        nets = make_networks(config(True), algo, EnvInfo(OBS, ACT, -torch.ones(ACT), torch.ones(ACT)))
        loss, _ = make_loss_module(config(True), algo, nets)
        updater = updater_class(loss, eps=0.9)
        if state is not None:
            loss.load_state_dict(state)
        torch.manual_seed(1)
        for _ in range(5):  # as after optimizer steps: the sources move in place
            with torch.no_grad():
                for p in loss.parameters():
                    p.add_(0.1 * torch.randn_like(p))
            updater.step()
        return {k: v.clone() for k, v in loss.state_dict().items() if "target_" in k}

    reference, fused = targets_after(SoftUpdate), targets_after(ForeachSoftUpdate)
    assert len(reference) >= (2 if algo == "sac" else 4)  # TD3: the target actor's tensors too
    for key in reference:
        torch.testing.assert_close(fused[key], reference[key], rtol=1e-6, atol=1e-6, msg=key)
    start = {k: torch.full_like(v, 0.5) if "target_" in k else v for k, v in make_loss_module(
        config(True), algo, make_networks(config(True), algo, EnvInfo(OBS, ACT, -torch.ones(ACT), torch.ones(ACT))),
    )[0].state_dict().items()}
    reference, fused = targets_after(SoftUpdate, start), targets_after(ForeachSoftUpdate, start)
    for key in reference:
        torch.testing.assert_close(fused[key], reference[key], rtol=1e-6, atol=1e-6, msg=key)


@pytest.mark.parametrize("box", [(-1.0, 1.0), (-2.0, 3.0)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_tanh_normal_sampler_gives_tanh_normals_samples_log_probs_and_gradients(box, dtype):
    """Against TorchRL's TanhNormal on the same random numbers, saturated preimages (|loc| = 30) included."""
    low, high = (torch.tensor([box[0], -1.0], dtype=dtype), torch.tensor([box[1], 1.0], dtype=dtype))
    loc = torch.cat([torch.randn(63, 2, dtype=dtype), torch.tensor([[30.0, -30.0]], dtype=dtype)])
    scale = torch.rand(64, 2, dtype=dtype) + 0.05

    def draw(fn):
        loc_, scale_ = loc.clone().requires_grad_(), scale.clone().requires_grad_()
        torch.manual_seed(3)
        action, log_prob = fn(loc_, scale_)
        grads = torch.autograd.grad((action * torch.arange(1.0, 3.0, dtype=dtype)).sum() + log_prob.sum(),
                                    [loc_, scale_])
        return action.detach(), log_prob.detach(), grads

    reference = draw(lambda loc, scale: TanhNormal(loc, scale, low=low, high=high).rsample_and_log_prob())
    sampler = TanhNormalSampler(low, high)
    for ours, ref in zip(draw(sampler.rsample_and_log_prob), reference):
        torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)
    torch.manual_seed(3)
    torch.testing.assert_close(sampler.sample(loc, scale), reference[0])
    assert (reference[0] < high).all() and (reference[0] > low).all()
    with pytest.raises(ValueError, match="high > low"):
        TanhNormalSampler(1.0, -1.0)
