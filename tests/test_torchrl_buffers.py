"""TorchRL's newer replay-buffer targets, filled by the collector's worker processes.

* ``OfflineToOnlineReplayBuffer``: the workers write its online part, and its own
  ``sample()`` keeps TorchRL's exact offline fraction over the rows they wrote.
* ``PolicyAgeFilter`` on ``"policy_version"``, with ``lambda: collector.policy_version``
  as its live version: samples lose the rows older than its lag.

The offline datasets are rows of short runs of the collector on Pendulum-v1.
"""

from __future__ import annotations

import pytest
import torch
from conftest import linear_policy
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage, OfflineToOnlineReplayBuffer, ReplayBuffer
from torchrl.envs.transforms import DoubleToFloat, PolicyAgeFilter

from torchrl_unilab import OffPolicyCollector, make_replay_buffer
from torchrl_unilab.data.buffer_writer import CommitWriter

#: The keys of a D4RL or Minari dataset of Pendulum transitions, as TorchRL's dataset classes store them.
DATASET_KEYS = ["observation", "action", ("next", "observation"), ("next", "reward"), ("next", "done"),
                ("next", "terminated"), ("next", "truncated")]


def random_run(frames: int, seed: int) -> TensorDict:
    """The rows of a run of the collector with uniformly random actions (``"policy_version"`` -1), copied out."""
    rb = make_replay_buffer(frames)
    with OffPolicyCollector("Pendulum-v1", num_workers=1, num_envs=2, frames_per_batch=64, total_frames=frames,
                            init_random_frames=frames, replay_buffer=rb, seed=seed) as collector:
        for _ in collector:
            pass
    return rb[:].clone()


def offline_dataset(rows: TensorDict) -> ReplayBuffer:
    offline = ReplayBuffer(storage=LazyTensorStorage(len(rows)))
    offline.extend(rows)
    return offline


def fill(replay_buffer, total_frames: int, seed: int) -> OffPolicyCollector:
    """Collects ``total_frames`` into ``replay_buffer`` with a linear policy, publishing after each batch."""
    with OffPolicyCollector("Pendulum-v1", linear_policy(3, 1), num_workers=2, num_envs=2, frames_per_batch=64,
                            total_frames=total_frames, replay_buffer=replay_buffer, seed=seed) as collector:
        assert collector._workers_write  # noqa: SLF001 - the workers write the buffer, not this process
        for _ in collector:
            collector.update_policy_weights_()
    return collector


def rows_in(rows: torch.Tensor, pool: torch.Tensor) -> torch.Tensor:
    """Whether each row of ``rows`` equals some row of ``pool``."""
    return (rows[:, None] == pool[None]).all(-1).any(-1)


def test_an_offline_to_online_buffer_filled_by_workers_samples_its_exact_offline_fraction(no_leaks):
    offline = offline_dataset(random_run(256, seed=0))
    rb = OfflineToOnlineReplayBuffer(offline, online_capacity=1024, offline_fraction=0.75, batch_size=64)
    collector = fill(rb, 512, seed=1)
    online = rb.online_buffer
    assert collector.replay_buffer is online and online.shared and isinstance(online.writer, CommitWriter)
    assert (len(online), len(offline), len(rb)) == (512, 256, 768)
    assert (online[:]["policy_version"] >= 1).all()  # the policy's rows, not the offline ones
    for step, fraction in enumerate((0.75, 0.5, 0.25)):
        rb.anneal(step, 3)  # TorchRL's linear decay of the fraction: 0.75, then 0.5, then 0.25
        assert rb.offline_fraction == pytest.approx(fraction)
        for n in (64, 100, 7):
            batch = rb.sample(n)
            assert batch.batch_size == (n,)
            from_offline = int((batch["policy_version"] == -1).sum())
            assert from_offline == round(fraction * n)
            assert int((batch["policy_version"] >= 1).sum()) == n - from_offline


def test_the_online_part_takes_the_offline_datasets_keys(no_leaks):
    """A dataset with only the standard transition keys, stored as float64 (as D4RL stores them) and read through
    TorchRL's DoubleToFloat (as TorchRL's offline_to_online script reads it): the workers write those keys, and
    ``sample()`` concatenates offline and online rows."""
    rows = random_run(128, seed=0).select(*DATASET_KEYS)
    for key in ("observation", ("next", "observation")):
        rows[key] = rows[key].double()
    offline = offline_dataset(rows)
    rb = OfflineToOnlineReplayBuffer(offline, online_capacity=512, offline_fraction=0.5)
    with pytest.raises(ValueError, match=r"holds \('next', 'observation'\) as torch.float64 of shape \[3\] per "
                                         r"row \(laid out from the OfflineToOnlineReplayBuffer's offline dataset\); "
                                         r"the collector's rows hold torch.float32 of shape \[3\].*DoubleToFloat"):
        OffPolicyCollector("Pendulum-v1", num_envs=2, frames_per_batch=64, replay_buffer=rb)
    offline.append_transform(DoubleToFloat())
    rb = OfflineToOnlineReplayBuffer(offline, online_capacity=512, offline_fraction=0.5)
    fill(rb, 256, seed=1)
    online = rb.online_buffer[:]
    assert sorted(online.keys(True, True), key=str) == sorted(rows.keys(True, True), key=str)
    assert len(online) == 256
    batch = rb.sample(50)
    assert sorted(batch.keys(True, True), key=str) == sorted(rows.keys(True, True), key=str)
    assert batch["observation"].dtype == torch.float32
    # TorchRL's sample() puts the offline rows first.
    assert rows_in(batch["observation"][:25], rows["observation"].float()).all()
    assert rows_in(batch["observation"][25:], online["observation"]).all()
    assert not rows_in(batch["observation"][25:], rows["observation"].float()).any()


def test_an_offline_dataset_with_keys_the_rows_lack_and_a_buffer_of_another_kind_are_refused(no_leaks):
    rows = random_run(64, seed=0).select(*DATASET_KEYS)
    rows["info_cost"] = torch.zeros(len(rows))
    rb = OfflineToOnlineReplayBuffer(offline_dataset(rows), online_capacity=256)
    with pytest.raises(ValueError, match=r"laid out from the OfflineToOnlineReplayBuffer's offline dataset, whose "
                                         r"keys the collector's rows do not all have: \['info_cost'\]"):
        OffPolicyCollector("Pendulum-v1", num_envs=2, frames_per_batch=64, replay_buffer=rb)
    with pytest.raises(TypeError, match="replay_buffer must be a torchrl ReplayBuffer .*, an "
                                        "OfflineToOnlineReplayBuffer, or None; got dict"):
        OffPolicyCollector("Pendulum-v1", num_envs=2, frames_per_batch=64, replay_buffer={})


def test_policy_age_filter_drops_the_rows_older_than_its_lag_from_a_worker_filled_buffer(no_leaks):
    """Lock-step chunks of 128 frames, one published version each (the worker waits at the cap while this process
    publishes): chunk ``k`` holds version ``k``, and the first one also the 64 random rows (version -1). One
    worker: of two, the one that owns the random frames may write them in any chunk, whenever it gets a batch."""
    rb = make_replay_buffer(2048)
    lag = 2
    with OffPolicyCollector("Pendulum-v1", linear_policy(3, 1), num_workers=1, num_envs=2, frames_per_batch=64,
                            init_random_frames=64, replay_buffer=rb, seed=0) as collector:
        rb.append_transform(PolicyAgeFilter(lambda: collector.policy_version, max_policy_lag=lag))
        for chunk in range(1, 5):
            collector.allow_frames(chunk * 128)
            assert collector.wait_for_frames(chunk * 128, timeout=120)
            collector.update_policy_weights_()
        # The workers write every row; the filter reads the version where the buffer is sampled.
        written = rb.storage[: len(rb)]["policy_version"]
        assert len(rb) == 512 and sorted(written.unique().tolist()) == [-1, 1, 2, 3, 4]
        assert int((written == -1).sum()) == 64
        for kept_versions in ([3, 4], [4]):
            if kept_versions == [4]:
                collector.update_policy_weights_()  # no new rows: the live version alone moves the cut
            assert collector.policy_version - lag == kept_versions[0]
            kept = rb[:]["policy_version"]  # every row, through the buffer's transforms
            assert len(kept) == 128 * len(kept_versions) and sorted(kept.unique().tolist()) == kept_versions
            sample = rb.sample(256)["policy_version"]
            assert 0 < len(sample) <= 256 and set(sample.unique().tolist()) <= set(kept_versions)
