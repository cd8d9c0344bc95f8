import copy

import numpy as np
import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictSequential
from torchrl.data import ReplayBuffer, TensorStorage
from torchrl.envs.utils import ExplorationType, set_exploration_type

from torchrl_unilab.modules.exploration import make_exploration_policy
from torchrl_unilab.modules.models import make_actor
from torchrl_unilab.modules.normalization import ObservationNormalizer, normalize_batch

OBS_DIM = 4


def _data(seed: int, *shape: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    # Large offset and spread: a naive float32 sum-of-squares would lose precision.
    return 1000.0 + 50.0 * torch.randn(*shape, OBS_DIM, generator=gen) * torch.arange(1, OBS_DIM + 1)


def test_update_matches_numpy_over_several_batches():
    norm = ObservationNormalizer(OBS_DIM)
    batches = [_data(0, 7), _data(1, 3, 5), _data(2, 1), _data(3, 200)]
    for batch in batches:
        norm.update(batch)
    all_rows = np.concatenate([b.reshape(-1, OBS_DIM).double().numpy() for b in batches])
    assert norm.mean.dtype == norm.var.dtype == norm.count.dtype == torch.float64
    assert norm.count.item() == all_rows.shape[0]
    np.testing.assert_allclose(norm.mean.numpy(), all_rows.mean(0), rtol=1e-12)
    np.testing.assert_allclose(norm.var.numpy(), all_rows.var(0), rtol=1e-10)


def test_empty_batch_is_a_no_op_and_bad_shape_raises():
    norm = ObservationNormalizer(OBS_DIM)
    norm.update(_data(0, 10))
    before = copy.deepcopy(norm.state_dict())
    norm.update(torch.empty(0, OBS_DIM))
    for key, value in norm.state_dict().items():
        assert torch.equal(value, before[key])
    with pytest.raises(ValueError, match=r"obs must have shape \[\.\.\., 4\], got \(10, 3\)"):
        norm.update(torch.zeros(10, 3))


def test_normalize_uses_mean_var_eps_and_clip():
    norm = ObservationNormalizer(OBS_DIM, eps=1e-3, clip=2.0)
    norm.update(_data(0, 500))
    obs = _data(1, 20)
    expected = ((obs.double() - norm.mean) / torch.sqrt(norm.var + 1e-3)).clamp(-2.0, 2.0)
    out = norm.normalize(obs)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, expected.float(), rtol=1e-5, atol=1e-5)
    assert out.abs().max() <= 2.0
    far = norm.normalize(torch.full((1, OBS_DIM), 1e6))
    assert torch.equal(far, torch.full((1, OBS_DIM), 2.0))
    constant = ObservationNormalizer(1, eps=0.25)
    constant.update(torch.full((10, 1), 3.0))  # zero variance: only eps is left
    assert torch.equal(constant.normalize(torch.tensor([[4.0]])), torch.tensor([[2.0]]))
    unclipped = ObservationNormalizer(OBS_DIM, clip=None)
    assert unclipped.normalize(torch.full((1, OBS_DIM), 1e6)).min() > 2.0


def test_forward_normalizes_keys_and_never_updates_stats():
    norm = ObservationNormalizer(OBS_DIM, out_keys=("obs_norm",))
    norm.update(_data(0, 50))
    before = copy.deepcopy(norm.state_dict())
    obs = _data(1, 8)
    td = norm(TensorDict({"observation": obs.clone()}, batch_size=[8]))
    assert torch.equal(td["observation"], obs)
    assert torch.equal(td["obs_norm"], norm.normalize(obs))
    for key, value in norm.state_dict().items():
        assert torch.equal(value, before[key])
    in_place = ObservationNormalizer(OBS_DIM)
    in_place.load_state_dict(norm.state_dict())
    td = in_place(TensorDict({"observation": obs.clone()}, batch_size=[8]))
    assert torch.equal(td["observation"], norm.normalize(obs))


def test_state_dict_round_trip_is_exact():
    src = ObservationNormalizer((2, OBS_DIM))
    src.update(_data(0, 13, 2))
    dst = ObservationNormalizer((2, OBS_DIM))
    dst.load_state_dict(copy.deepcopy(src.state_dict()))
    assert set(dst.state_dict()) == {"mean", "var", "count"}
    for key, value in src.state_dict().items():
        assert torch.equal(dst.state_dict()[key], value)
    assert dst.count.item() == 13


def test_weight_sync_of_policy_state_dict_carries_the_stats():
    def policy() -> TensorDictSequential:
        actor = make_actor("td3", OBS_DIM, 2, hidden_dim=8)
        return TensorDictSequential(
            ObservationNormalizer(OBS_DIM), make_exploration_policy(actor, "td3", actor.spec)
        )

    learner, worker = policy(), policy()
    learner[0].update(_data(0, 100))
    assert not torch.equal(worker[0].mean, learner[0].mean)

    worker.load_state_dict(learner.state_dict())

    for key in ("mean", "var", "count"):
        assert torch.equal(getattr(worker[0], key), getattr(learner[0], key))
    obs = _data(1, 5)
    td = TensorDict({"observation": obs, "is_init": torch.ones(5, 1, dtype=torch.bool)}, [5])
    with set_exploration_type(ExplorationType.DETERMINISTIC):
        assert torch.equal(worker(td.clone())["action"], learner(td.clone())["action"])


def test_normalize_batch_handles_observation_and_next_observation():
    norm = ObservationNormalizer(OBS_DIM)
    norm.update(_data(0, 100))
    obs, nxt = _data(1, 6), _data(2, 6)
    batch = TensorDict({"observation": obs, ("next", "observation"): nxt}, batch_size=[6])
    normalize_batch(batch, norm)
    assert torch.equal(batch["observation"], norm.normalize(obs))
    assert torch.equal(batch["next", "observation"], norm.normalize(nxt))


def test_update_from_buffer_reads_only_new_rows():
    capacity = 8
    storage = TensorStorage(TensorDict({"observation": torch.zeros(capacity, OBS_DIM)}, [capacity]))
    rb = ReplayBuffer(storage=storage)
    norm, reference = ObservationNormalizer(OBS_DIM), ObservationNormalizer(OBS_DIM)

    first = _data(0, 5)
    rb.extend(TensorDict({"observation": first}, [5]))
    assert norm.update_from_buffer(rb) == 5
    reference.update(first)

    second = _data(1, 6)  # wraps around the end of the storage
    rb.extend(TensorDict({"observation": second}, [6]))
    assert norm.update_from_buffer(rb) == 6
    reference.update(second)
    assert norm.update_from_buffer(rb) == 0

    third = _data(2, 20)  # more than the capacity: only the last 8 rows remain
    rb.extend(TensorDict({"observation": third}, [20]))
    assert norm.update_from_buffer(rb) == capacity
    reference.update(third[-capacity:])

    for key in ("mean", "var", "count"):
        torch.testing.assert_close(getattr(norm, key), getattr(reference, key), rtol=1e-12, atol=0)


def test_constructor_validates_arguments():
    with pytest.raises(ValueError, match="clip must be > 0 or None, got 0"):
        ObservationNormalizer(OBS_DIM, clip=0)
    with pytest.raises(ValueError, match="out_keys must match"):
        ObservationNormalizer(OBS_DIM, out_keys=("a", "b"))
    with pytest.raises(ValueError, match="shape must have dims >= 1"):
        ObservationNormalizer(0)
