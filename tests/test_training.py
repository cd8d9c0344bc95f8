"""Learner-side pieces without worker processes: UTD pacing, sampling beside a writer, checkpoints."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf
from tensordict import TensorDict

from torchrl_unilab import make_replay_buffer
from torchrl_unilab.data import BufferSampler
from torchrl_unilab.modules.normalization import ObservationNormalizer
from torchrl_unilab.trainers.checkpoint import Checkpointer
from torchrl_unilab.trainers.recipes_utils import EnvInfo, make_loss_module, make_networks, make_optimizer
from torchrl_unilab.trainers.training import UTDController


class FakeCollector:
    """Records the caps the controller sets; frames arrive when the test says so."""

    frames_per_batch = 64

    def __init__(self) -> None:
        self.frames_written = 0
        self.caps: list[int] = []
        self.waits: list[int] = []

    def allow_frames(self, frames: int) -> None:
        self.caps.append(frames)

    def wait_for_frames(self, frames: int, timeout=None) -> bool:
        self.waits.append(frames)
        self.frames_written = max(self.frames_written, frames)
        return True


def test_utd_controller_waits_when_ahead_and_caps_the_collector_when_behind():
    col = FakeCollector()
    utd = UTDController(col, 0.5, learning_starts=1000, total_frames=3000, max_lead_frames=256)
    assert col.caps == [1000 + 256] and utd.total_updates == 1000
    utd.wait()  # no data yet: wait for the frames of update 1
    assert col.waits == [1002]
    col.frames_written = 1400
    assert utd.updates_available() == 200
    for _ in range(200):
        utd.wait()
        utd.step()
    assert col.waits == [1002] and col.caps[-1] == 1000 + 400 + 256
    assert utd.achieved() == pytest.approx(0.5)


def test_utd_controller_resumes_with_offsets():
    col = FakeCollector()
    utd = UTDController(col, 1.0, learning_starts=500, total_frames=2000, max_lead_frames=128,
                        frames_offset=1000, updates=500)
    assert utd.frames == 1000 and utd.updates_available() == 0
    assert col.caps == [500 + 500 + 128 - 1000]  # the new collector counts from 0


def test_lockstep_collects_whole_chunks():
    col = FakeCollector()
    utd = UTDController(col, 0.25, learning_starts=100, total_frames=1000, max_lead_frames=0, lockstep=True)
    assert col.caps == []  # nothing runs until the learner asks
    utd.wait()
    assert col.caps == [128] and col.waits == [128]  # 104 frames needed, rounded up to whole chunks
    utd.updates = 7  # all 0.25 * (128 - 100) updates done
    utd.wait()
    assert col.caps[-1] == 192


def test_max_lead_frames_must_leave_room_for_a_batch():
    with pytest.raises(ValueError, match=r"collector.max_lead_frames must be >= .* = 68"):
        UTDController(FakeCollector(), 0.25, learning_starts=0, total_frames=100, max_lead_frames=32)


def tiny(algo: str):
    torch.manual_seed(0)
    cfg = OmegaConf.create({
        "network": {"hidden_sizes": [16], "use_layer_norm": False, "obs_norm": True},
        "optim": {"gamma": 0.99, "loss_function": "l2", "alpha_init": 1.0, "target_update_polyak": 0.9,
                  "policy_noise": 0.2, "noise_clip": 0.5, "lr": 1e-2, "weight_decay": 0.0, "adam_eps": 1e-8},
    })
    nets = make_networks(cfg, algo, EnvInfo(3, 1, -torch.ones(1), torch.ones(1)))
    loss, target = make_loss_module(cfg, algo, nets)
    return nets, loss, make_optimizer(cfg, loss), target


def filled_buffer(rows: int = 64):
    rb = make_replay_buffer(256)
    flags = torch.zeros(rows, 1, dtype=torch.bool)
    rb.extend(TensorDict({"observation": torch.randn(rows, 3), "action": torch.rand(rows, 1) * 2 - 1,
                          ("next", "observation"): torch.randn(rows, 3), ("next", "reward"): torch.randn(rows, 1),
                          ("next", "done"): flags, ("next", "terminated"): flags,
                          "policy_version": torch.ones(rows, dtype=torch.int64)}, [rows]))
    return rb


def sac_update(loss, optimizer, target, batch) -> None:
    """The SAC recipe's gradient update."""
    losses = loss(batch)
    (losses["loss_actor"] + losses["loss_qvalue"] + losses["loss_alpha"]).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    target.step()


def test_checkpoint_round_trip_restores_everything(tmp_path):
    nets, loss, opt, target = tiny("sac")
    rb = filled_buffer()
    for _ in range(3):
        sac_update(loss, opt, target, rb.sample(16))
    nets.normalizer.update_from_buffer(rb)
    ckpt = Checkpointer(tmp_path / "ckpt", modules={"loss": loss, "optimizer": opt, "target": target},
                        normalizer=nets.normalizer)
    ckpt.save(rb, counters={"frames": 64, "updates": 3, "curve": [[64, 1.0, -3.0]]})
    expected_rng = torch.rand(3)

    nets2, loss2, opt2, target2 = tiny("sac")
    rb2 = make_replay_buffer(256)
    counters = Checkpointer(tmp_path / "ckpt", modules={"loss": loss2, "optimizer": opt2, "target": target2},
                            normalizer=nets2.normalizer).load(rb2)
    assert counters == {"frames": 64, "updates": 3, "curve": [[64, 1.0, -3.0]]}
    assert torch.equal(torch.rand(3), expected_rng), "the torch RNG continues where it was saved"
    for (k, a), b in zip(loss.state_dict().items(), loss2.state_dict().values()):
        assert torch.equal(a, b), k
    assert opt2.state_dict()["state"][0]["step"] == 3
    assert torch.equal(nets2.normalizer.mean, nets.normalizer.mean) and nets2.normalizer._buffer_write_count == 64
    assert len(rb2) == 64 and rb2.write_count == 64 and torch.equal(rb2[:]["observation"], rb[:]["observation"])
    # the actor the workers run shares the restored weights
    assert all(torch.equal(a, b) for a, b in zip(nets.actor.parameters(), nets2.actor.parameters()))


def test_checkpoint_refuses_a_missing_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match="resume= takes the run directory"):
        Checkpointer(tmp_path / "nope", modules={}, normalizer=ObservationNormalizer(1)).load()


def test_sampling_beside_a_thread_extending_the_same_buffer_does_not_deadlock():
    """The Ray learner extends its buffer from a receive thread while the main thread samples.

    TorchRL's ``extend`` takes ``_replay_lock`` then ``_write_lock``; a sampler
    taking the write lock and then ``len(rb)`` (``_replay_lock``) deadlocked.
    """
    import threading

    from torchrl_unilab.trainers.training import update_normalizer

    rb = make_replay_buffer(512, lock_timeout=5.0)
    row = TensorDict({"observation": torch.ones(16, 3), "action": torch.ones(16, 1),
                      ("next", "observation"): torch.ones(16, 3), ("next", "reward"): torch.ones(16, 1),
                      ("next", "terminated"): torch.zeros(16, 1, dtype=torch.bool),
                      ("next", "done"): torch.zeros(16, 1, dtype=torch.bool)}, [16])
    rb.extend(row)
    sample = BufferSampler(rb, 8, keys=("observation", "action"))
    stop, errors, extends = threading.Event(), [], [0]

    def extend_forever():
        try:
            while not stop.is_set():
                rb.extend(row)
                extends[0] += 1
        except BaseException as err:  # noqa: BLE001 - reported below
            errors.append(err)

    thread = threading.Thread(target=extend_forever)
    thread.start()
    try:
        for _ in range(1000):
            sample()
            if _ % 50 == 0:
                update_normalizer(ObservationNormalizer(3), rb)
    finally:
        stop.set()
        thread.join(30)
    assert not thread.is_alive() and errors == [] and extends[0] > 0
