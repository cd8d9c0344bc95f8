"""Prioritized replay on a buffer that a collector's worker process writes into (SharedPrioritizedSampler)."""

from __future__ import annotations

import pickle

import pytest
import torch
from tensordict import TensorDict
from torchrl.data.replay_buffers.samplers import RandomSampler

from torchrl_unilab import OffPolicyCollector, make_replay_buffer
from torchrl_unilab.data import BufferSampler
from torchrl_unilab.data.prioritized_sampler import SharedPrioritizedSampler
from torchrl_unilab.modules.models import make_actor


def test_priorities_live_in_torchrls_cpp_segment_trees():
    # The installed torch is the one torchrl 0.14.1's extension is built for: its trees load and hold the priorities.
    from torchrl import _torchrl

    sampler = SharedPrioritizedSampler(64, alpha=0.7, beta=0.5)
    assert isinstance(sampler._sum_tree, (_torchrl.SumSegmentTreeFp64, _torchrl.SumSegmentTreeFp32))  # noqa: SLF001
    assert isinstance(sampler._min_tree, (_torchrl.MinSegmentTreeFp64, _torchrl.MinSegmentTreeFp32))  # noqa: SLF001
    rb = make_replay_buffer(64, sampler=sampler)
    rb.extend(TensorDict({"observation": torch.arange(8.0)[:, None]}, [8]))
    rb.update_priority(torch.arange(8), torch.arange(1.0, 9.0))
    # sum over the rows of priority ** alpha (+ eps), as TorchRL's tree computes it
    expected = float(((torch.arange(1.0, 9.0) + 1e-8) ** 0.7).sum())
    assert sampler._sum_tree.query(0, 8) == pytest.approx(expected, rel=1e-5)  # noqa: SLF001


def test_a_missing_extension_is_named_with_the_torch_it_needs(monkeypatch):
    from torchrl.data.replay_buffers.samplers import prioritized

    monkeypatch.setattr(prioritized, "SumSegmentTreeFp32", None)
    with pytest.raises(ImportError, match=r"torchrl\._torchrl did not load.*built for torch 2\.14"):
        SharedPrioritizedSampler(64, alpha=0.7, beta=0.5)


def test_rows_written_by_a_worker_process_are_sampled_by_priority():
    capacity = 512
    sampler = SharedPrioritizedSampler(capacity, alpha=1.0, beta=0.5)
    rb = make_replay_buffer(capacity, sampler=sampler)
    actor = make_actor("sac", 3, 1, hidden_dim=8, action_low=-2.0, action_high=2.0)
    with OffPolicyCollector("Pendulum-v1", actor, num_workers=1, num_envs=2, frames_per_batch=64, total_frames=256,
                            replay_buffer=rb, init_random_frames=256, seed=0) as collector:
        collector.allow_frames(128)
        assert collector.wait_for_frames(128, timeout=120)
        # The worker wrote in its own process; the learner's sampler hears of the rows when it samples.
        _, info = rb.sample(256, return_info=True)
        assert int(info["index"].max()) < 128 and torch.as_tensor(info["priority_weight"]).eq(1).all()
        assert bool((sampler._sum_tree[torch.arange(128)] > 0).all())  # noqa: SLF001

        # A high priority on rows 0..7: they make up most of each batch, with small importance weights.
        priority = torch.full((128,), 0.01)
        priority[:8] = 10.0
        rb.update_priority(torch.arange(128), priority)
        _, info = rb.sample(256, return_info=True)
        top = info["index"] < 8
        assert top.float().mean() > 0.5, f"rows 0..7 make up {top.float().mean():.2f} of the batch"
        weight = torch.as_tensor(info["priority_weight"])
        # (p / p_min) ** -beta: (10 / 0.01) ** -0.5 for rows 0..7, 1 for the others
        torch.testing.assert_close(weight[top], torch.full_like(weight[top], 1000**-0.5), rtol=1e-4, atol=0)
        torch.testing.assert_close(weight[~top], torch.ones_like(weight[~top]), rtol=1e-4, atol=0)
        # The recipes' BufferSampler lets the same sampler pick the rows, and gathers exactly those.
        batch, info = BufferSampler(rb, 256, keys=["observation"])()
        assert (info["index"] < 8).float().mean() > 0.5
        assert torch.equal(batch["observation"], rb.storage[info["index"]]["observation"])

        # Rows written after the update arrive with the maximum priority, so they are sampled at once.
        collector.allow_frames(256)
        assert collector.wait_for_frames(256, timeout=120)
        _, info = rb.sample(1024, return_info=True)
        new = info["index"] >= 128
        assert new.float().mean() > 0.5
        assert sampler._sum_tree.query(128, 256) == pytest.approx(128 * 10.0, rel=1e-6)  # noqa: SLF001


def test_a_worker_gets_a_uniform_sampler_and_a_checkpoint_copy_keeps_the_priorities(tmp_path):
    from multiprocessing import popen_spawn_posix
    from multiprocessing.context import set_spawning_popen

    from torchrl_unilab.trainers.checkpoint import load_buffer

    sampler = SharedPrioritizedSampler(16, alpha=0.7, beta=0.5)
    rb = make_replay_buffer(16, sampler=sampler)
    rb.extend(TensorDict({"observation": torch.arange(6.0)[:, None]}, [6]))
    rb.update_priority(torch.arange(6), torch.arange(1.0, 7.0))
    # What a spawned process unpickles: a plain RandomSampler (workers only write).
    set_spawning_popen(object.__new__(popen_spawn_posix.Popen))
    try:
        assert type(pickle.loads(pickle.dumps(sampler))) is RandomSampler
    finally:
        set_spawning_popen(None)
    assert type(pickle.loads(pickle.dumps(sampler))) is SharedPrioritizedSampler  # elsewhere, itself

    rb.dumps(tmp_path / "rb")
    (tmp_path / "rb" / "prefetch.pkl").unlink()
    restored = make_replay_buffer(16, sampler=SharedPrioritizedSampler(16, alpha=0.7, beta=0.5))
    load_buffer(restored, tmp_path / "rb")
    before = sampler._sum_tree[torch.arange(16)]  # noqa: SLF001
    assert torch.equal(restored.sampler._sum_tree[torch.arange(16)], before)  # noqa: SLF001
    restored.extend(TensorDict({"observation": torch.ones(2, 1)}, [2]))
    restored.sample(4)
    # only the two new rows were marked: the restored priorities stand
    assert torch.equal(restored.sampler._sum_tree[torch.arange(6)], before[:6])  # noqa: SLF001
    assert bool((restored.sampler._sum_tree[torch.arange(6, 8)] > 0).all())  # noqa: SLF001
