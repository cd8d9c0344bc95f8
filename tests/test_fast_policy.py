"""The worker's tensor-level policy path computes exactly what the TensorDict path computes."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule
from torchrl.data import Bounded
from torchrl.envs.utils import ExplorationType, set_exploration_type

from torchrl_unilab.modules._fast_policy import tensor_policy
from torchrl_unilab.modules.exploration import make_exploration_policy
from torchrl_unilab.modules.models import make_actor
from torchrl_unilab.modules.normalization import ObservationNormalizer


@pytest.mark.parametrize("algo", ["sac", "td3"])
@pytest.mark.parametrize("normalise", [False, True])
def test_fast_path_matches_tensordict_path(algo, normalise):
    spec = Bounded(-2.0, 2.0, shape=(8, 3))
    actor = make_exploration_policy(make_actor(algo, 5, 3, hidden_dim=32, action_low=-2.0, action_high=2.0),
                                    algo, spec)
    if normalise:
        norm = ObservationNormalizer(5)
        norm.update(torch.randn(100, 5) * 3 + 1)
        from tensordict.nn import TensorDictSequential

        actor = TensorDictSequential(norm, actor)
    fast = tensor_policy(actor)
    assert fast is not None
    obs = torch.randn(8, 5)
    for step in range(3):
        is_init = torch.zeros(8, 1, dtype=torch.bool) if step else torch.ones(8, 1, dtype=torch.bool)
        with torch.no_grad(), set_exploration_type(ExplorationType.RANDOM):
            torch.manual_seed(step)
            expected = actor(TensorDict({"observation": obs, "is_init": is_init}, [8]))["action"]
            torch.manual_seed(step)
            got = fast({"observation": obs, "is_init": is_init})
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)
        assert (got.abs() <= 2.0).all()


def test_unknown_module_falls_back():
    class Custom(TensorDictModule):
        def forward(self, td):  # a user module with its own logic
            return super().forward(td)

    policy = Custom(torch.nn.Linear(3, 1), in_keys=["observation"], out_keys=["action"])
    assert tensor_policy(policy) is None
    plain = TensorDictModule(torch.nn.Linear(3, 1), in_keys=["observation"], out_keys=["action"])
    assert tensor_policy(plain) is not None


@pytest.mark.parametrize("algo", ["sac", "td3"])
def test_fast_path_covers_an_actor_reading_privileged_context(algo):
    spec = Bounded(-1.0, 1.0, shape=(8, 2))
    actor = make_actor(algo, 5 + 4, 2, hidden_dim=16, in_keys=["observation", "privileged"])
    policy = make_exploration_policy(actor, algo, spec)
    fast = tensor_policy(policy)
    assert fast is not None
    values = {"observation": torch.randn(8, 5), "privileged": torch.randn(8, 4),
              "is_init": torch.ones(8, 1, dtype=torch.bool)}
    with torch.no_grad(), set_exploration_type(ExplorationType.RANDOM):
        torch.manual_seed(0)
        expected = policy(TensorDict(dict(values), [8]))["action"]
        torch.manual_seed(0)
        got = fast(dict(values))
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)
    with torch.no_grad():  # the privileged input matters: the first layer reads it
        changed = dict(values, privileged=values["privileged"] + 5.0)
        with set_exploration_type(ExplorationType.RANDOM):
            torch.manual_seed(0)
            assert not torch.allclose(fast(changed), got)


@pytest.mark.parametrize("mapping", ["biased_softplus_1.0", "biased_softplus_0.5_0.05", "exp"])
def test_normal_params_step_equals_the_extractor_and_keeps_loc_and_scale(mapping):
    from tensordict.nn import NormalParamExtractor

    from torchrl_unilab.modules._mlp import normal_params

    extractor = NormalParamExtractor(scale_mapping=mapping, scale_lb=0.3)
    x = torch.randn(64, 6) * 4  # large negative inputs reach scale_lb
    for got, expected in zip(normal_params(extractor)(x), extractor(x), strict=True):
        assert torch.equal(got, expected)
    # the fast path writes the sota actor's loc and scale, as TorchRL's call does (rows hold them)
    from torchrl.modules import MLP, ProbabilisticActor, TanhNormal

    net = torch.nn.Sequential(MLP(in_features=5, out_features=6, num_cells=[16]), extractor)
    actor = ProbabilisticActor(TensorDictModule(net, in_keys=["observation"], out_keys=["loc", "scale"]),
                               in_keys=["loc", "scale"], distribution_class=TanhNormal,
                               distribution_kwargs={"low": -1.0, "high": 1.0})
    obs = torch.randn(8, 5)
    values = {"observation": obs}
    with torch.no_grad(), set_exploration_type(ExplorationType.RANDOM):
        tensor_policy(actor)(values)
        expected = actor(TensorDict({"observation": obs}, [8]))
    assert torch.equal(values["loc"], expected["loc"]) and torch.equal(values["scale"], expected["scale"])


def test_an_extractor_with_a_learned_scale_mapping_is_not_flattened(monkeypatch):
    # normal_params repeats the biased softplus' arithmetic; a mapping with parameters of its own must keep its
    # module call, or the fast path would act with stale (never trained) parameters
    from tensordict.nn import NormalParamExtractor, utils

    from torchrl_unilab.modules._mlp import mlp_steps

    class LearnedGainSoftplus(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.log_gain = torch.nn.Parameter(torch.zeros(()))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.softplus(x) * self.log_gain.exp()

    monkeypatch.setitem(utils._MAPPINGS, "learned_gain_softplus", LearnedGainSoftplus())
    learned = NormalParamExtractor(scale_mapping="learned_gain_softplus")
    assert [name for name, _ in learned.named_parameters()] == ["scale_mapping.log_gain"]
    assert mlp_steps(torch.nn.Sequential(torch.nn.Linear(3, 4), learned)) is None
    steps = mlp_steps(torch.nn.Sequential(torch.nn.Linear(3, 4), NormalParamExtractor()))
    assert [step[0] for step in steps] == ["linear", "call"]  # the stock mapping is flattened
