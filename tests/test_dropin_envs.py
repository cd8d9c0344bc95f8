"""OffPolicyCollector steps the envs and policies TorchRL's collectors step, as they step them.

* The construction probe acts as the first step does: with the policy's own action,
  so an env that checks its actions (one-hot, here) accepts it.
* Rows keep what the policy writes (a recurrent state, ``("next", ...)`` entries,
  a distribution's ``loc``/``scale`` and log-probability), as TorchRL's rows do,
  whether the env keeps them in its transitions (TorchRL envs) or not (ours).
* An unbatched env's policy sees rows without a batch dimension, as in TorchRL's
  collectors: a ``RandomPolicy`` built from the env's own spec works.
* ``set_truncated=True`` marks the last step of each batch truncated and done,
  nested done keys included.
* TorchRL's threaded ``AsyncEnvPool`` (envs that wait, stepped at the same time)
  runs in a worker and is seeded, though it does not implement ``set_seed``.

Real TorchRL envs, modules and collectors (TorchRL's ``Collector`` is the oracle for
the keys), real worker processes.
"""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import NormalParamExtractor, TensorDictModule
from torchrl.collectors import Collector
from torchrl.data import Bounded, Composite, OneHot, Unbounded
from torchrl.envs import EnvBase, GymEnv, InitTracker, SerialEnv, TransformedEnv
from torchrl.envs.utils import RandomPolicy
from torchrl.modules import MLP, ProbabilisticActor, TanhNormal

from torchrl_unilab import OffPolicyCollector


class OneHotEnv(EnvBase):
    """An unbatched env with a one-hot action that it checks, as discrete envs do."""

    def __init__(self) -> None:
        super().__init__()
        self.observation_spec = Composite(observation=Unbounded((3,)))
        self.action_spec = OneHot(4)
        self.reward_spec = Unbounded((1,))

    def _reset(self, tensordict: TensorDictBase | None = None) -> TensorDictBase:
        return TensorDict({"observation": torch.zeros(3), "done": torch.zeros(1, dtype=torch.bool),
                           "terminated": torch.zeros(1, dtype=torch.bool)}, [])

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        action = tensordict.get("action")
        if action.sum() != 1:
            raise ValueError(f"action must be one-hot, got {action.tolist()}")
        obs = torch.randn(3)
        return TensorDict({"observation": obs, "reward": action[:1].float(), "done": torch.zeros(1, dtype=torch.bool),
                           "terminated": torch.zeros(1, dtype=torch.bool)}, [])

    def _set_seed(self, seed: int | None) -> None:
        torch.manual_seed(0 if seed is None else seed)


class BoxEnv(EnvBase):
    """An unbatched env with a ``[action_dim]`` action in [-1, 1], ending every 5 steps."""

    def __init__(self, action_dim: int = 7) -> None:
        super().__init__()
        self.observation_spec = Composite(observation=Unbounded((3,)))
        self.action_spec = Bounded(-1.0, 1.0, (action_dim,))
        self.reward_spec = Unbounded((1,))
        self.steps = 0

    def _reset(self, tensordict: TensorDictBase | None = None) -> TensorDictBase:
        self.steps = 0
        return TensorDict({"observation": torch.zeros(3), "done": torch.zeros(1, dtype=torch.bool),
                           "terminated": torch.zeros(1, dtype=torch.bool)}, [])

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        action = tensordict.get("action")
        assert action.shape == self.action_spec.shape, action.shape
        self.steps += 1
        done = torch.tensor([self.steps % 5 == 0])
        return TensorDict({"observation": torch.full((3,), float(self.steps)), "reward": action.sum(-1, keepdim=True),
                           "done": done, "terminated": done.clone()}, [])

    def _set_seed(self, seed: int | None) -> None:
        pass


def box_env_1() -> BoxEnv:
    return BoxEnv(1)


def box_env_7() -> BoxEnv:
    return BoxEnv(7)


def pendulum() -> GymEnv:
    return GymEnv("Pendulum-v1")


def two_pendulums() -> SerialEnv:
    return SerialEnv(2, pendulum)


class Recurrent(torch.nn.Module):
    """Reads its state from the row (``None`` at first) and writes the next one, as TorchRL's ``LSTMNet`` does."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(3 + 4, 1 + 4)

    def forward(self, observation: torch.Tensor, hidden: torch.Tensor | None):
        if hidden is None:
            hidden = torch.zeros(*observation.shape[:-1], 4)
        out = self.linear(torch.cat([observation, hidden], -1))
        return out[..., :1].tanh(), hidden, out[..., 1:]


def recurrent_policy() -> TensorDictModule:
    return TensorDictModule(Recurrent(), in_keys=["observation", "hidden"],
                            out_keys=["action", "hidden", ("next", "hidden")])


def sac_policy(return_log_prob: bool) -> ProbabilisticActor:
    net = torch.nn.Sequential(MLP(in_features=3, out_features=2, num_cells=[8]), NormalParamExtractor())
    return ProbabilisticActor(TensorDictModule(net, in_keys=["observation"], out_keys=["loc", "scale"]),
                              in_keys=["loc", "scale"], spec=Bounded(-2.0, 2.0, (1,)), distribution_class=TanhNormal,
                              distribution_kwargs={"low": -2.0, "high": 2.0}, return_log_prob=return_log_prob)


class OneHotPolicy(torch.nn.Module):
    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        index = (observation.sum(-1) > 0).long()
        return torch.nn.functional.one_hot(index, 4)


def first_batch(collector: OffPolicyCollector) -> TensorDictBase:
    try:
        return collector.next()
    finally:
        collector.shutdown()


def leaf_keys(td: TensorDictBase) -> set:
    return set(td.keys(True, True))


@pytest.mark.parametrize("policy", ["policy", "none"])
def test_the_probe_acts_with_the_policys_own_action(policy, no_leaks):
    """The probe at construction stepped the env with a zero action, which an env that checks its actions refuses
    (``action must be one-hot``): it acts with the policy's action, as the first step of collection does."""
    module = (TensorDictModule(OneHotPolicy(), in_keys=["observation"], out_keys=["action"])
              if policy == "policy" else None)
    collector = OffPolicyCollector([OneHotEnv, OneHotEnv], module, frames_per_batch=8, total_frames=16)
    batch = first_batch(collector)
    assert batch["action"].shape == (8, 4)
    assert (batch["action"].sum(-1) == 1).all()


@pytest.mark.parametrize("case", ["recurrent", "log_prob", "fast_sac"])
def test_rows_keep_what_the_policy_writes(case, no_leaks):
    """A policy's own outputs killed the worker (``KeyError: 'hidden'``) or were missing from the rows. Every key of
    TorchRL's rows is in ours, for a TorchRL env stack (the env keeps the outputs in its transitions), a batched one
    (the tensor-level SAC policy's outputs skip the env and are set once per batch) and for a gymnasium id (our env
    does not: the worker puts them in; its rows hold no root done flags, as before). Each row holds the outputs
    of its own observation."""
    policy = recurrent_policy() if case == "recurrent" else sac_policy(return_log_prob=case == "log_prob")
    stock = Collector(pendulum(), policy, frames_per_batch=8, total_frames=8)
    try:
        expected = {key for key in leaf_keys(next(iter(stock))) if not (isinstance(key, str) and key.startswith("_"))}
    finally:
        stock.shutdown()
    written = expected - leaf_keys(pendulum().rollout(1))
    assert written, "the policy writes keys beyond the env's"
    for source in ([pendulum, pendulum], [two_pendulums], "Pendulum-v1"):
        collector = OffPolicyCollector(source, policy, frames_per_batch=8, total_frames=16,
                                       **({"num_envs": 2} if isinstance(source, str) else {}))
        batch = first_batch(collector)
        wanted = written if isinstance(source, str) else expected
        assert wanted <= leaf_keys(batch), (source, wanted - leaf_keys(batch))
        if case == "recurrent":
            assert batch.numel() == 8 and batch["next", "hidden"].shape == (*batch.shape, 4)
            assert batch["next", "hidden"].abs().sum() > 0
        else:
            assert (batch["scale"] > 0).all()
            with torch.no_grad():
                again = policy(batch.select("observation").reshape(-1))
            torch.testing.assert_close(again["loc"], batch["loc"].reshape(-1, 1), msg=str(source))


@pytest.mark.parametrize("make_env", [box_env_1, box_env_7], ids=["action_dim1", "action_dim7"])
def test_an_unbatched_envs_policy_sees_unbatched_rows(make_env, no_leaks):
    """TorchRL's collectors call an unbatched env's policy on unbatched rows: a ``RandomPolicy`` of the env's own
    spec writes ``[action_dim]``. The worker batched them ([1, ...]) and refused it (``action shape (1,) differs from
    (1, 1)``, or ``batch dimension mismatch``)."""
    spec = make_env().action_spec
    collector = OffPolicyCollector([make_env, make_env], RandomPolicy(spec), frames_per_batch=10, total_frames=20)
    batch = first_batch(collector)
    assert batch["action"].shape == (10, *spec.shape)
    assert (batch["action"].abs() <= 1).all() and batch["action"].std() > 0


def nested_counting_env() -> EnvBase:
    from torchrl.testing.mocking_classes import NestedCountingEnv

    return TransformedEnv(NestedCountingEnv(), InitTracker()).add_truncated_keys()


_POLICY_ENV: list = []


def nested_rand_action(tensordict: TensorDictBase) -> TensorDictBase:
    """TorchRL's test policy for this env: its own ``rand_action`` (the env built once per process)."""
    if not _POLICY_ENV:
        _POLICY_ENV.append(nested_counting_env())
    return _POLICY_ENV[0].rand_action(tensordict)


@pytest.mark.parametrize("nested", [False, True], ids=["root_keys", "nested_keys"])
def test_set_truncated_marks_the_last_step_of_each_batch(nested, no_leaks):
    """``set_truncated=True`` was taken and ignored (or refused, for an unbatched env's ``env.rand_action``): the last
    step of each batch ends truncated and done, as TorchRL's collectors mark it."""
    if nested:
        make, policy, prefix = nested_counting_env, nested_rand_action, ("next", "data")
    else:
        make, policy, prefix = pendulum, None, ("next",)
    collector = OffPolicyCollector([make, make], policy, frames_per_batch=8, total_frames=16, set_truncated=True)
    batch = first_batch(collector)
    truncated = batch.get((*prefix, "truncated")).reshape(8, -1).all(-1)
    done = batch.get((*prefix, "done")).reshape(8, -1).all(-1)
    assert truncated[-1] and done[-1]
    assert not truncated[:-1].any(), "only the batch's last step is marked (no episode ends within it)"


def test_set_truncated_needs_a_truncated_key(no_leaks):
    with pytest.raises(RuntimeError, match="add_truncated_keys"):
        OffPolicyCollector([OneHotEnv], None, frames_per_batch=8, total_frames=16, set_truncated=True)


def pendulum_pool():
    from torchrl.envs import AsyncEnvPool

    return AsyncEnvPool([lambda: GymEnv("Pendulum-v1")] * 3, backend="threading")


def test_a_threaded_async_env_pool_is_stepped_and_seeded_in_a_worker(no_leaks):
    """Each worker seeds its env; TorchRL's ``AsyncEnvPool`` has its sub-envs seeded one by one: two collectors with
    one seed start from the same states, another seed from others."""
    def first_batch(seed: int) -> TensorDictBase:
        collector = OffPolicyCollector(pendulum_pool, frames_per_batch=12, total_frames=12, seed=seed)
        try:
            return next(iter(collector))
        finally:
            collector.shutdown()

    a, b, other = first_batch(3), first_batch(3), first_batch(4)
    assert a.batch_size == torch.Size([3, 4])
    assert torch.equal(a["observation"][:, 0], b["observation"][:, 0])
    assert not torch.equal(a["observation"][:, 0], other["observation"][:, 0])
    # three sub-envs seeded apart, as a SerialEnv's are
    assert not torch.equal(a["observation"][0, 0], a["observation"][1, 0])
