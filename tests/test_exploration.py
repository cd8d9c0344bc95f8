import copy
import warnings

import pytest
import torch
from tensordict import TensorDict
from torchrl.data import Bounded, Composite
from torchrl.envs.utils import ExplorationType, set_exploration_type
from torchrl.modules import TanhNormal

from torchrl_unilab.modules.exploration import (
    ActionProjection,
    PerEnvMixedNoise,
    make_exploration_policy,
    sample_offpolicy_actions,
)
from torchrl_unilab.modules.models import make_actor

OBS_DIM, ACT_DIM, N = 4, 3, 6
LOW = torch.tensor([-1.0, -2.0, 0.0])
HIGH = torch.tensor([1.0, 2.0, 4.0])
HALF_RANGE = (HIGH - LOW) / 2
MID = (HIGH + LOW) / 2
RANDOM = ExplorationType.RANDOM
DETERMINISTIC = ExplorationType.DETERMINISTIC


def _spec() -> Bounded:
    return Bounded(low=LOW, high=HIGH, shape=(ACT_DIM,))


def _actor(algo: str):
    return make_actor(algo, OBS_DIM, ACT_DIM, hidden_dim=16, action_low=LOW, action_high=HIGH)


def _td(n: int = N, is_init=True) -> TensorDict:
    flags = torch.full((n, 1), is_init, dtype=torch.bool) if isinstance(is_init, bool) else is_init
    return TensorDict(
        {"observation": torch.randn(n, OBS_DIM), "is_init": flags}, batch_size=[n]
    )


def _mid_action_td(n: int, is_init: bool = False) -> TensorDict:
    return TensorDict(
        {"action": MID.expand(n, ACT_DIM).clone(), "is_init": torch.full((n, 1), is_init)},
        batch_size=[n],
    )


# ---------------------------------------------------------------- TD3 per-env noise


def test_stds_redrawn_only_where_is_init():
    policy = make_exploration_policy(_actor("td3"), "td3", _spec(), td3_std_min=0.05, td3_std_max=0.4)
    noise = policy[-1]
    with set_exploration_type(RANDOM):
        policy(_td())
        first = noise.stds
        assert first.shape == (N, 1)
        assert ((first >= 0.05) & (first <= 0.4)).all()
        reset = torch.tensor([True, False, False, True, False, False])
        policy(_td(is_init=reset[:, None]))
    second = noise.stds
    assert torch.equal(second[~reset], first[~reset])
    assert (second[reset] != first[reset]).all()
    assert ((second >= 0.05) & (second <= 0.4)).all()


def test_std_constant_within_an_episode():
    policy = make_exploration_policy(_actor("td3"), "td3", _spec())
    noise = policy[-1]
    with set_exploration_type(RANDOM):
        policy(_td())
        first = noise.stds
        actions = []
        for _ in range(20):
            actions.append(policy(_td(is_init=False))["action"])
            assert torch.equal(noise.stds, first)
    # The noise itself is fresh every step, only its scale is kept.
    assert not torch.equal(actions[0], actions[1])


def test_done_key_replaces_is_init():
    noise = PerEnvMixedNoise(_spec(), done_key=("prev", "done"))
    td = _mid_action_td(N, is_init=True)
    td["prev", "done"] = torch.zeros(N, dtype=torch.bool)
    noise(td.clone())
    first = noise.stds
    noise(td.clone())  # is_init True everywhere but done False: nothing redrawn
    assert torch.equal(noise.stds, first)
    td["prev", "done"] = torch.tensor([False, True, False, False, False, False])
    noise(td.clone())
    changed = noise.stds != first
    assert changed.squeeze(-1).tolist() == [False, True, False, False, False, False]


def test_batch_shape_change_reallocates_stds():
    noise = PerEnvMixedNoise(_spec())
    noise(_mid_action_td(N))
    assert noise.stds.shape == (N, 1)
    noise(_mid_action_td(2 * N))
    assert noise.stds.shape == (2 * N, 1)


def test_missing_is_init_warns_once_and_keeps_stds():
    noise = PerEnvMixedNoise(_spec())
    td = _mid_action_td(N)
    del td["is_init"]
    noise(td.clone())
    first = noise.stds
    with pytest.warns(UserWarning, match="is_init"):
        noise(td.clone())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        noise(td.clone())
    assert torch.equal(noise.stds, first)


def test_stds_survive_weight_sync_and_are_not_in_state_dict():
    learner = make_exploration_policy(_actor("td3"), "td3", _spec())
    worker = make_exploration_policy(_actor("td3"), "td3", _spec())
    with set_exploration_type(RANDOM):
        learner(_td(n=2))  # the learner's module holds stds of another batch shape
        worker(_td())
    worker_stds = worker[-1].stds
    state = learner.state_dict()
    assert not any("stds" in key for key in state)
    assert all(key.startswith("module.0.") for key in state)

    worker.load_state_dict(state)

    assert torch.equal(worker[-1].stds, worker_stds)
    for key, value in worker.state_dict().items():
        assert torch.equal(value, state[key])
    td = _td()
    with set_exploration_type(DETERMINISTIC):
        assert torch.equal(worker(td.clone())["action"], learner(td.clone())["action"])


def test_noise_std_is_per_env_fraction_of_half_range():
    std_min, std_max, n, steps = 0.05, 0.3, 8, 2000
    noise = PerEnvMixedNoise(_spec(), std_min, std_max, safe=False)
    noise(_mid_action_td(n, is_init=True))
    stds = noise.stds
    samples = torch.stack([noise(_mid_action_td(n))["action"] for _ in range(steps)])
    assert torch.equal(noise.stds, stds)
    per_env_dim = (samples - MID).std(dim=0) / HALF_RANGE  # [n, ACT_DIM]
    assert (per_env_dim > std_min * 0.9).all() and (per_env_dim < std_max * 1.1).all()
    torch.testing.assert_close(per_env_dim, stds.expand(n, ACT_DIM), rtol=0.1, atol=0.0)


def test_constant_noise_has_the_requested_std():
    policy = make_exploration_policy(_actor("td3"), "td3", _spec(), td3_noise="constant", td3_std=0.1)
    noise = policy[-1]
    samples = torch.stack([noise(_mid_action_td(64))["action"] for _ in range(200)])
    empirical = (samples - MID).reshape(-1, ACT_DIM).std(dim=0)
    torch.testing.assert_close(empirical, 0.1 * HALF_RANGE, rtol=0.05, atol=0.0)
    assert torch.equal(noise.stds, torch.full((64, 1), 0.1))


def test_deterministic_returns_the_actor_action_and_keeps_state():
    actor = _actor("td3")
    policy = make_exploration_policy(actor, "td3", _spec())
    td = _td()
    with set_exploration_type(DETERMINISTIC):
        out = policy(td.clone())["action"]
    assert torch.equal(out, actor(td.clone())["action"])
    assert policy[-1].stds.numel() == 0
    with set_exploration_type(RANDOM):
        assert not torch.equal(policy(td.clone())["action"], out)


def test_random_actions_are_clamped_to_the_spec():
    noise = PerEnvMixedNoise.constant(_spec(), std=2.0)
    action = noise(_mid_action_td(256))["action"]
    assert (action >= LOW).all() and (action <= HIGH).all()
    assert (action == LOW).any() and (action == HIGH).any()
    unsafe = PerEnvMixedNoise.constant(_spec(), std=2.0, safe=False)
    raw = unsafe(_mid_action_td(256))["action"]
    assert ((raw < LOW) | (raw > HIGH)).any()


def test_composite_spec_and_generator_are_accepted():
    spec = Composite(action=_spec())
    a = PerEnvMixedNoise(spec, generator=torch.Generator().manual_seed(3))
    b = PerEnvMixedNoise(spec, generator=torch.Generator().manual_seed(3))
    assert torch.equal(a(_mid_action_td(N, True))["action"], b(_mid_action_td(N, True))["action"])
    assert torch.equal(a.stds, b.stds)


def test_noise_arguments_are_validated():
    with pytest.raises(ValueError, match="std_min must be <= std_max, got std_min=0.5 and std_max=0.1"):
        PerEnvMixedNoise(_spec(), std_min=0.5, std_max=0.1)
    with pytest.raises(ValueError, match="std_min must be a number >= 0, got -0.1"):
        PerEnvMixedNoise(_spec(), std_min=-0.1)
    with pytest.raises(TypeError, match="Bounded"):
        PerEnvMixedNoise(Composite(action=Composite()))
    noise = PerEnvMixedNoise(_spec())
    td = _mid_action_td(N)
    td["is_init"] = torch.zeros(N, 2, dtype=torch.bool)
    noise(_mid_action_td(N))
    with pytest.raises(ValueError, match="one flag per env"):
        noise(td)


def test_make_exploration_policy_rejects_bad_choices():
    with pytest.raises(ValueError, match=r"algo must be one of \('sac', 'td3'\), got 'ppo'"):
        make_exploration_policy(_actor("td3"), "ppo", _spec())
    with pytest.raises(ValueError, match=r"td3_noise must be one of \('mixed', 'constant'\), got 'ou'"):
        make_exploration_policy(_actor("td3"), "td3", _spec(), td3_noise="ou")
    with pytest.raises(ValueError, match="must sample its actions for 'sac'"):
        make_exploration_policy(_actor("td3"), "sac", _spec())


# ---------------------------------------------------------------- SAC


def test_sac_random_samples_and_deterministic_is_the_tanh_normal_value():
    actor = _actor("sac")
    policy = make_exploration_policy(actor, "sac", _spec())
    assert isinstance(policy[-1], ActionProjection)
    td = _td(n=64)
    with set_exploration_type(RANDOM):
        a1 = policy(td.clone())["action"]
        a2 = policy(td.clone())["action"]
    assert not torch.equal(a1, a2)
    for a in (a1, a2):
        assert (a >= LOW).all() and (a <= HIGH).all()
    with set_exploration_type(DETERMINISTIC):
        d1 = policy(td.clone())
        d2 = policy(td.clone())
    assert torch.equal(d1["action"], d2["action"])
    expected = TanhNormal(d1["loc"], d1["scale"], low=LOW, high=HIGH).deterministic_sample
    assert torch.equal(d1["action"], expected)


def test_action_projection_clamps_only_out_of_bounds_values():
    proj = ActionProjection(_spec())
    action = torch.tensor([[1.5, -0.5, 4.0000005], [-1.0, 3.0, -1e-7]])
    out = proj(TensorDict({"action": action.clone()}, batch_size=[2]))["action"]
    assert torch.equal(out, torch.tensor([[1.0, -0.5, 4.0], [-1.0, 2.0, 0.0]]))


# ---------------------------------------------------------------- sample_offpolicy_actions


@pytest.mark.parametrize("algo", ["sac", "td3"])
def test_sample_offpolicy_actions_matches_module_api(algo):
    policy_a = make_exploration_policy(_actor(algo), algo, _spec())
    policy_b = copy.deepcopy(policy_a)
    obs = torch.randn(5, N, OBS_DIM)
    dones = torch.rand(5, N) < 0.3
    dones[0] = True
    for t in range(5):
        torch.manual_seed(t)
        via_function = sample_offpolicy_actions(policy_a, algo, obs[t], dones[t])
        torch.manual_seed(t)
        td = TensorDict({"observation": obs[t], "is_init": dones[t, :, None]}, batch_size=[N])
        with torch.no_grad(), set_exploration_type(RANDOM):
            via_module = policy_b(td)["action"]
        assert torch.equal(via_function, via_module)
        assert not via_function.requires_grad
    if algo == "td3":
        assert torch.equal(policy_a[-1].stds, policy_b[-1].stds)


def test_sample_offpolicy_actions_with_generator_is_reproducible():
    def run() -> torch.Tensor:
        torch.manual_seed(0)
        policy = make_exploration_policy(
            _actor("td3"), "td3", _spec(), generator=torch.Generator().manual_seed(7)
        )
        obs = torch.randn(N, OBS_DIM)
        return sample_offpolicy_actions(policy, "td3", obs, torch.ones(N, 1))

    assert torch.equal(run(), run())


def test_sample_offpolicy_actions_writes_privileged_info():
    actor = make_actor("td3", 2, ACT_DIM, hidden_dim=8, action_low=LOW, action_high=HIGH, in_key="privileged")
    policy = make_exploration_policy(actor, "td3", _spec())
    priv = torch.randn(N, 2)
    out = sample_offpolicy_actions(policy, "td3", torch.randn(N, OBS_DIM), torch.zeros(N), priv)
    assert out.shape == (N, ACT_DIM)
    with pytest.raises(KeyError):
        sample_offpolicy_actions(policy, "td3", torch.randn(N, OBS_DIM), torch.zeros(N))


def test_sample_offpolicy_actions_rejects_bad_inputs():
    policy = make_exploration_policy(_actor("td3"), "td3", _spec())
    obs, dones = torch.randn(N, OBS_DIM), torch.zeros(N)
    with pytest.raises(ValueError, match="sac") as err:
        sample_offpolicy_actions(policy, "ppo", obs, dones)
    assert "td3" in str(err.value) and "'ppo'" in str(err.value)
    with pytest.raises(ValueError, match="no PerEnvMixedNoise"):
        sample_offpolicy_actions(_actor("td3"), "td3", obs, dones)
    with pytest.raises(ValueError, match="one flag per env"):
        sample_offpolicy_actions(policy, "td3", obs, torch.zeros(N + 1))
