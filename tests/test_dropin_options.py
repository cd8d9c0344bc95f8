"""TorchRL's multi-process collector options, as ``MultiAsyncCollector`` reads them, on ``OffPolicyCollector``.

``frames_per_batch`` as a list, a replay buffer that is not shared between processes
(or has an ``ndim=2`` storage), ``init_random_frames=-1``, ``trajs_per_batch`` and the
``state_dict`` layout of TorchRL's checkpoints. Real envs and real worker processes.
"""

from __future__ import annotations

import io

import pytest
import torch
from conftest import linear_policy
from torchrl.data import LazyMemmapStorage, LazyTensorStorage, ReplayBuffer

from torchrl_unilab import OffPolicyCollector, make_replay_buffer

TRAJ = ("collector", "traj_ids")


def pendulum(**kwargs) -> OffPolicyCollector:
    options = dict(num_workers=2, num_envs=2, frames_per_batch=32, total_frames=128, seed=0)
    options.update(kwargs)
    return OffPolicyCollector("Pendulum-v1", options.pop("policy", None), **options)


def assert_whole_trajectories(rows) -> None:
    """Each trajectory is one run of rows, its steps counted from 0, and its last step is done."""
    ids = rows[TRAJ]
    starts = torch.cat([torch.tensor([True]), ids[1:] != ids[:-1]])
    assert starts.sum() == ids.unique().numel(), "a trajectory's rows are contiguous"
    bounds = torch.cat([starts.nonzero().reshape(-1), torch.tensor([len(ids)])]).tolist()
    for start, stop in zip(bounds[:-1], bounds[1:]):
        steps = rows["step_count"][start:stop].reshape(-1)
        assert steps.tolist() == list(range(int(steps[0]), int(steps[0]) + stop - start))
        assert steps[0] == 0, "a whole trajectory starts at its first step"
        assert rows["next", "done"][stop - 1].all() and not rows["next", "done"][start:stop - 1].any()


# ---------------------------------------------------------------- frames_per_batch
def test_frames_per_batch_as_a_list_makes_each_batch_their_sum(no_leaks):
    """TorchRL takes one value per worker; MultiAsyncCollector's batches (one worker's each) hold their sum."""
    with pendulum(frames_per_batch=[8, 8], total_frames=64) as collector:
        shapes = [batch.shape for batch in collector]
        assert collector.frames_per_batch == collector.frames_per_batch_worker() == 16
    assert shapes == [torch.Size([2, 8])] * 4, "[envs, time], as TorchRL lays a batch out"


@pytest.mark.parametrize("value", [[8], [8, 0], [8, "8"]])
def test_a_bad_frames_per_batch_list_names_the_argument(value):
    with pytest.raises(ValueError, match=r"frames_per_batch must be an int >= 1 or a list of num_workers=2 of them"):
        pendulum(frames_per_batch=value)


# ------------------------------------------------------------------ init_random_frames
@pytest.mark.parametrize("value", [-1, None])
def test_init_random_frames_below_zero_or_none_means_none(value, no_leaks):
    """TorchRL reads them so (its own examples pass -1)."""
    with pendulum(policy=linear_policy(3, 1), init_random_frames=value, total_frames=64,
                  track_policy_version=True) as collector:
        rows = torch.cat(list(collector))
        assert collector.init_random_frames == 0 and collector.metrics()["random_frames"] == 0
    assert (rows["policy_version"] >= 1).all(), "no row acted at random"


# ---------------------------------------------------------------- a buffer of this process
def test_a_plain_replay_buffer_is_extended_by_this_process(unilab_log, no_leaks):
    """A buffer that is not shared: iteration yields None and each batch is in it, whole, as with TorchRL's
    collector."""
    rb = ReplayBuffer(storage=LazyTensorStorage(1000))
    with pendulum(policy=linear_policy(3, 1), replay_buffer=rb) as collector:
        seen = []
        for out in collector:
            seen.append(len(rb))
            assert out is None
        assert collector.frames_written == 128
    assert seen == [32, 64, 96, 128], "each yield finds its batch in the buffer"
    rows = rb[:]
    assert rows[TRAJ].unique().numel() >= 2 and set(rows["step_count"].reshape(-1).tolist()) >= set(range(16))
    messages = [r.getMessage() for r in unilab_log]
    assert any("replay_buffer is not shared between processes, so this process extends it" in m
               and "make_replay_buffer" in m for m in messages), messages


def test_a_plain_buffer_fills_in_the_background_and_gets_new_weights(no_leaks):
    """TorchRL's start() pattern on a plain buffer: rows arrive without iterating, pause() holds them still, and
    rows collected after update_policy_weights_ act with the new weights."""
    rb = ReplayBuffer(storage=LazyMemmapStorage(4096))
    policy = linear_policy(3, 1)
    torch.nn.init.zeros_(policy.module[0].weight)
    torch.nn.init.zeros_(policy.module[0].bias)
    with pendulum(policy=policy, replay_buffer=rb, total_frames=-1) as collector:
        collector.start()
        assert collector.wait_for_frames(256, timeout=120)
        with collector.pause():
            held = len(rb)
            assert held == collector.frames_written >= 256
            assert collector.metrics()["frames"] == held
            assert len(rb) == held, "no batch is written while paused"
        with torch.no_grad():
            policy.module[0].bias.fill_(1.0)
        collector.update_policy_weights_()
        version = collector.policy_version
        assert collector.wait_for_frames(held + 512, timeout=120)
        with collector.pause():
            rows = rb[: len(rb)]
    old, new = rows["policy_version"] < version, rows["policy_version"] == version
    assert new.sum() > 0 and (rows["action"][old] == 0).all()
    assert torch.allclose(rows["action"][new], torch.tanh(torch.tensor(1.0)))


def test_a_storage_of_ndim_2_gets_steps_across_the_envs(unilab_log, no_leaks):
    """TorchRL lays each rollout out [envs, steps] into such a storage: a row per step, a column per env."""
    rb = ReplayBuffer(storage=LazyTensorStorage(512, ndim=2), shared=True)
    with pendulum(replay_buffer=rb) as collector:
        assert list(collector) == [None] * 4
    assert len(rb) == 128 and rb.storage._storage.shape == (256, 2)
    rows = rb.storage._storage[:64]  # TorchRL keeps the storage's data there
    for column in rows.unbind(1):  # one env's steps, in order, whichever worker's batch they came in
        same = column[TRAJ][1:] == column[TRAJ][:-1]
        steps = column["step_count"].reshape(-1)
        assert same.sum() >= 32 and (steps[1:][same] == steps[:-1][same] + 1).all()
    assert any("storage has ndim=2" in r.getMessage() for r in unilab_log)


class FailingExtend(ReplayBuffer):
    """A buffer whose second extend raises, as a full disk or a bad transform would."""

    def extend(self, data, *args, **kwargs):
        self.calls = getattr(self, "calls", 0) + 1
        if self.calls > 1:
            raise OSError("the disk is full")
        return super().extend(data, *args, **kwargs)


def test_a_failed_write_into_a_plain_buffer_raises_instead_of_hanging(no_leaks):
    """The thread that writes the batches dies; the wait for frames it will never write raises its error."""
    rb = FailingExtend(storage=LazyTensorStorage(1000))
    with pendulum(replay_buffer=rb, total_frames=512) as collector:
        collector.start()
        with pytest.raises(OSError, match="the disk is full"):
            collector.wait_for_frames(512, timeout=120)
        with pytest.raises(OSError, match="the disk is full"):
            collector.metrics()
        collector.shutdown(raise_on_error=False)


# ---------------------------------------------------------------- trajs_per_batch
@pytest.mark.parametrize("traj_format", ["padded", "cat"])
def test_trajs_per_batch_yields_whole_trajectories(traj_format, no_leaks):
    """As TorchRL's collectors: batches of trajs_per_batch complete trajectories, padded with a mask or flat."""
    with pendulum(trajs_per_batch=3, traj_format=traj_format, max_frames_per_traj=12, total_frames=512,
                  stagger_resets=False) as collector:
        batches = list(collector)
    assert len(batches) >= 8
    for batch in batches:
        if traj_format == "padded":
            assert batch.shape[0] == 3 and batch.shape[1] == 12
            mask = batch["collector", "mask"]
            rows = batch[mask]
        else:
            assert batch.ndim == 1 and ("collector", "mask") not in batch.keys(True)
            rows = batch
        assert rows["next", "done"].sum() == 3
        assert_whole_trajectories(rows)


@pytest.mark.parametrize("background", [False, True], ids=["iterate", "start"])
def test_trajs_per_batch_writes_only_whole_trajectories_into_the_buffer(background, unilab_log, no_leaks):
    """With a replay buffer (shared or not), each trajectory goes in flat once it is done; running episodes
    never do."""
    rb = ReplayBuffer(storage=LazyTensorStorage(2048), shared=True)
    # 16 steps per env and batch, 10 per episode: a worker's last episodes are unfinished, whatever its share
    with pendulum(replay_buffer=rb, trajs_per_batch=2, max_frames_per_traj=10, stagger_resets=False,
                  total_frames=384) as collector:
        if background:
            collector.start()
            assert collector.wait_for_frames(384, timeout=120)
        else:
            assert list(collector) == [None] * 12
        with collector.pause():
            assert collector.trajs_per_batch is None, "as TorchRL's: the buffer gets the trajectories"
            assert 0 < len(rb) < 384, "episodes still running are held back"
            rows = rb[: len(rb)]
    assert_whole_trajectories(rows)
    assert any("assembles whole trajectories" in r.getMessage() for r in unilab_log)


# ---------------------------------------------------------------- state_dict
def test_state_dict_has_torchrls_layout_and_a_resumed_run_numbers_new_trajectories(tmp_path, no_leaks):
    """TorchRL's checkpoints hold per-worker entries, frames, iter and traj_pool; a run resumed from one hands
    out trajectory ids above those already saved (a saved buffer's trajectories stay apart from the new ones);
    the parent's ``_frames`` and ``_iter``, which TorchRL's own tests read, follow the counts."""
    rb = make_replay_buffer(1000)
    with pendulum(replay_buffer=rb) as collector:
        for _ in zip(range(2), collector):
            pass
        state = collector.state_dict()
        # TorchRL's own test of reloading reads the parent's counters under their private names.
        assert (collector._frames, collector._iter) == (state["frames"], state["iter"]) == (64, 1)
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    state = torch.load(buffer, weights_only=False)
    assert {"worker0", "worker1", "frames", "iter", "traj_pool", "frames_written", "policy_version"} <= set(state)
    saved_ids = rb[:][TRAJ]
    first_free = int(state["traj_pool"]["traj_id"])
    assert int(saved_ids.max()) < first_free
    with pendulum(replay_buffer=rb, total_frames=256) as collector:
        collector.load_state_dict(state)
        restored = collector.state_dict()
        assert (restored["frames"], restored["iter"]) == (state["frames"], state["iter"])
        assert (collector._frames, collector._iter) == (state["frames"], state["iter"])
        assert int(collector.state_dict()["traj_pool"]["traj_id"]) > first_free
        for _ in collector:
            pass
    new_ids = rb[:][TRAJ][len(saved_ids):]
    assert len(new_ids) == 256 - 64 and int(new_ids.min()) >= first_free
