import pytest
import torch
from tensordict import TensorDict
from torch import nn
from torchrl.data import Bounded
from torchrl.envs.utils import ExplorationType, set_exploration_type
from torchrl.modules import ProbabilisticActor
from torchrl.objectives import SACLoss, SoftUpdate, TD3Loss

from torchrl_unilab.modules.models import ALGOS, make_actor, make_critic

OBS_DIM, ACT_DIM, BATCH = 5, 3, 8


def _obs_td(n: int = BATCH, obs_dim: int = OBS_DIM) -> TensorDict:
    return TensorDict({"observation": torch.randn(n, obs_dim)}, batch_size=[n])


def _transitions(action_spec: Bounded) -> TensorDict:
    return TensorDict(
        {
            "observation": torch.randn(BATCH, OBS_DIM),
            "action": action_spec.rand((BATCH,)),
            ("next", "observation"): torch.randn(BATCH, OBS_DIM),
            ("next", "reward"): torch.randn(BATCH, 1),
            ("next", "done"): torch.zeros(BATCH, 1, dtype=torch.bool),
            ("next", "terminated"): torch.zeros(BATCH, 1, dtype=torch.bool),
        },
        batch_size=[BATCH],
    )


@pytest.mark.parametrize("algo", ALGOS)
def test_actor_writes_action_of_right_shape_within_bounds(algo):
    low, high = torch.tensor([0.0, -3.0, -1.0]), torch.tensor([2.0, 1.0, 1.0])
    actor = make_actor(algo, OBS_DIM, ACT_DIM, hidden_dim=16, action_low=low, action_high=high)
    # Large inputs saturate the tanh, so this checks the rescaling onto [low, high].
    td = TensorDict({"observation": 100 * torch.randn(64, OBS_DIM)}, batch_size=[64])
    with set_exploration_type(ExplorationType.RANDOM):
        out = actor(td)
    assert out["action"].shape == (64, ACT_DIM)
    assert (out["action"] >= low).all() and (out["action"] <= high).all()
    assert torch.equal(actor.spec["action"].space.low, low)
    assert torch.equal(actor.spec["action"].space.high, high)
    if algo == "sac":
        assert isinstance(actor, ProbabilisticActor)
        assert {"loc", "scale"} <= set(out.keys())
    else:
        assert set(out.keys()) == {"observation", "action"}


def test_td3_actor_is_deterministic_and_reaches_both_bounds():
    torch.manual_seed(0)  # some initialisations send every input to one side of the tanh
    actor = make_actor("td3", OBS_DIM, 1, hidden_dim=16, action_low=-2.0, action_high=4.0)
    last = [m for m in actor.modules() if isinstance(m, nn.Linear)][-1]
    with torch.no_grad():
        # LayerNorm bounds the features, so saturate the tanh through the last layer.
        last.weight.mul_(1000)
    td = TensorDict({"observation": torch.randn(256, OBS_DIM)}, batch_size=[256])
    a1 = actor(td.clone())["action"]
    a2 = actor(td.clone())["action"]
    assert torch.equal(a1, a2)
    assert a1.min() < -1.9 and a1.max() > 3.9


@pytest.mark.parametrize("use_layer_norm", [True, False])
def test_hidden_layers_follow_linear_norm_activation(use_layer_norm):
    actor = make_actor(
        "td3", OBS_DIM, ACT_DIM, hidden_dim=8, num_layers=3,
        use_layer_norm=use_layer_norm, activation=nn.ELU,
    )
    modules = list(actor.modules())
    assert sum(isinstance(m, nn.LayerNorm) for m in modules) == (3 if use_layer_norm else 0)
    assert sum(isinstance(m, nn.ELU) for m in modules) == 3
    assert sum(isinstance(m, nn.Linear) for m in modules) == 4
    linears = [m for m in modules if isinstance(m, nn.Linear)]
    assert linears[0].in_features == OBS_DIM and linears[-1].out_features == ACT_DIM


def test_sac_actor_outputs_twice_the_action_dim_before_the_split():
    actor = make_actor("sac", OBS_DIM, ACT_DIM, hidden_dim=8, num_layers=1)
    linears = [m for m in actor.modules() if isinstance(m, nn.Linear)]
    assert linears[-1].out_features == 2 * ACT_DIM
    assert all(m.out_features == 8 for m in linears[:-1])


def test_actor_in_key_is_respected():
    actor = make_actor("td3", OBS_DIM, ACT_DIM, hidden_dim=8, in_key="obs_norm")
    td = TensorDict({"obs_norm": torch.randn(2, OBS_DIM)}, batch_size=[2])
    assert actor(td)["action"].shape == (2, ACT_DIM)


def test_bad_arguments_raise_value_error_naming_them():
    with pytest.raises(ValueError, match=r"algo must be one of \('sac', 'td3'\), got 'ppo'"):
        make_actor("ppo", OBS_DIM, ACT_DIM)
    with pytest.raises(ValueError, match="hidden_dim must be an int >= 1, got 0"):
        make_actor("sac", OBS_DIM, ACT_DIM, hidden_dim=0)
    with pytest.raises(ValueError, match="num_layers must be an int >= 1, got 0"):
        make_actor("td3", OBS_DIM, ACT_DIM, num_layers=0)
    with pytest.raises(ValueError, match="action_high must be > action_low"):
        make_actor("td3", OBS_DIM, ACT_DIM, action_low=1.0, action_high=1.0)
    with pytest.raises(ValueError, match="action_low and action_high"):
        make_actor("td3", OBS_DIM, ACT_DIM, action_low=torch.zeros(2))
    with pytest.raises(ValueError, match="num_layers must be an int >= 1, got 0"):
        make_critic(OBS_DIM, ACT_DIM, num_layers=0)


def test_critic_concatenates_in_keys():
    critic = make_critic(OBS_DIM + 2, ACT_DIM, hidden_dim=8, in_keys=("observation", "privileged", "action"))
    td = _obs_td()
    td["privileged"] = torch.randn(BATCH, 2)
    td["action"] = torch.randn(BATCH, ACT_DIM)
    assert critic(td)["state_action_value"].shape == (BATCH, 1)
    assert not any(isinstance(m, nn.LayerNorm) for m in critic.modules())


def test_same_build_gives_loadable_state_dicts():
    a = make_actor("sac", OBS_DIM, ACT_DIM, hidden_dim=8)
    b = make_actor("sac", OBS_DIM, ACT_DIM, hidden_dim=8)
    b.load_state_dict(a.state_dict())
    td = _obs_td()
    with set_exploration_type(ExplorationType.DETERMINISTIC):
        assert torch.equal(a(td.clone())["action"], b(td.clone())["action"])


def _assert_backward_reaches(loss_td: TensorDict, *modules: nn.Module) -> None:
    total = sum(v for k, v in loss_td.items() if k.startswith("loss_"))
    total.backward()
    for module in modules:
        grads = [p.grad for p in module.parameters() if p.requires_grad]
        assert grads and all(g is not None and torch.isfinite(g).all() for g in grads)
        assert any(g.abs().sum() > 0 for g in grads)


def test_sac_loss_runs_backward():
    actor = make_actor("sac", OBS_DIM, ACT_DIM, hidden_dim=16)
    critic = make_critic(OBS_DIM, ACT_DIM, hidden_dim=16)
    loss = SACLoss(actor, critic, num_qvalue_nets=2, action_spec=actor.spec)
    SoftUpdate(loss, tau=0.005)
    out = loss(_transitions(actor.spec["action"]))
    assert {"loss_actor", "loss_qvalue", "loss_alpha"} <= set(out.keys())
    _assert_backward_reaches(out, loss.actor_network_params, loss.qvalue_network_params)


def test_td3_loss_runs_backward():
    actor = make_actor("td3", OBS_DIM, ACT_DIM, hidden_dim=16, action_low=-2.0, action_high=2.0)
    critic = make_critic(OBS_DIM, ACT_DIM, hidden_dim=16)
    loss = TD3Loss(actor, critic, action_spec=actor.spec, num_qvalue_nets=2)
    SoftUpdate(loss, tau=0.005)
    out = loss(_transitions(actor.spec["action"]))
    assert {"loss_actor", "loss_qvalue"} <= set(out.keys())
    _assert_backward_reaches(out, loss.actor_network_params, loss.qvalue_network_params)


def test_hidden_sizes_set_each_hidden_width_on_torchrls_mlp():
    from torchrl.modules import MLP

    actor = make_actor("td3", OBS_DIM, ACT_DIM, hidden_sizes=[32, 16], use_layer_norm=True)
    critic = make_critic(OBS_DIM, ACT_DIM, hidden_sizes=[24, 8, 4])
    assert [m.out_features for m in actor.modules() if isinstance(m, nn.Linear)] == [32, 16, ACT_DIM]
    assert [m.normalized_shape for m in actor.modules() if isinstance(m, nn.LayerNorm)] == [(32,), (16,)]
    assert [m.out_features for m in critic.modules() if isinstance(m, nn.Linear)] == [24, 8, 4, 1]
    assert isinstance(critic.module, MLP)  # TorchRL's MLP concatenates observation and action itself
    with pytest.raises(ValueError, match=r"hidden_sizes must be a non-empty sequence of ints >= 1, got \[\]"):
        make_actor("sac", OBS_DIM, ACT_DIM, hidden_sizes=[])
