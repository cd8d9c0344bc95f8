"""One pacing for both collectors: the same cases against the local collector and the Ray collector.

``start``, ``allow_frames``, ``pause``, ``wait_for_frames`` and ``frames_written`` are one implementation
(:class:`~torchrl_unilab.collectors._pacing.Pacing`) over two frame sources: the workers' shared memory and the
batches Ray nodes deliver. Each case runs on both, with real workers, a real Ray cluster and real envs.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

import pytest
from conftest import linear_policy, needs_extra

from torchrl_unilab import OffPolicyCollector, make_replay_buffer

FRAMES_PER_BATCH = 32  # 16 steps of 2 envs: the local workers' and the Ray nodes' batches alike
TIMEOUT = 180  # seconds for a wait that should return, on a loaded 2-core machine


@pytest.fixture(scope="module")
def ray_session() -> Iterator[object]:
    """A Ray cluster for the module's Ray cases, started on first use."""
    ray = needs_extra("ray", "ray")
    ray.init(num_cpus=2, include_dashboard=False)
    yield ray
    ray.shutdown()


@pytest.fixture(params=["local", "ray"])
def make_collector(request):
    """Builds the collector under test, with a local replay buffer, and shuts it down at the end."""
    if request.param == "ray":
        request.getfixturevalue("ray_session")
    built = []

    def make(total_frames: int) -> OffPolicyCollector:
        rb = make_replay_buffer(4096)
        if request.param == "local":
            collector = OffPolicyCollector("Pendulum-v1", linear_policy(3, 1), num_workers=1, num_envs=2,
                                           frames_per_batch=FRAMES_PER_BATCH, total_frames=total_frames,
                                           replay_buffer=rb, seed=0)
        else:
            from torchrl_unilab.collectors.ray_collector import RayOffPolicyCollector

            collector = RayOffPolicyCollector("Pendulum-v1", linear_policy(3, 1), num_nodes=1, num_workers=1,
                                              num_envs=2, frames_per_batch=FRAMES_PER_BATCH,
                                              total_frames=total_frames, replay_buffer=rb, seed=0,
                                              remote_configs={"num_cpus": 1})
        built.append(collector)
        return collector

    yield make
    for collector in built:
        with contextlib.suppress(Exception):
            collector.shutdown()


def stays(collector, frames: int, seconds: float = 1.0) -> bool:
    """Whether ``frames_written`` is ``frames`` now and ``seconds`` later."""
    if collector.frames_written != frames:
        return False
    time.sleep(seconds)
    return collector.frames_written == frames


def test_allow_frames_caps_what_is_collected_and_waits_end_or_say_why(make_collector):
    """A wait that could never end raises at once; ``allow_frames`` collects up to its cap and holds there; a
    wait past the cap returns False on timeout; ``start`` collects to ``total_frames``."""
    collector = make_collector(256)
    with pytest.raises(ValueError, match="total_frames is 256"):
        collector.wait_for_frames(288)
    with pytest.raises(ValueError, match=r"call start\(\) or allow_frames\(\) first"):
        collector.wait_for_frames(FRAMES_PER_BATCH)
    collector.allow_frames(2 * FRAMES_PER_BATCH)
    assert collector.wait_for_frames(2 * FRAMES_PER_BATCH, timeout=TIMEOUT)
    assert stays(collector, 2 * FRAMES_PER_BATCH), "collection went past the cap"
    assert not collector.wait_for_frames(3 * FRAMES_PER_BATCH, timeout=0.5)
    collector.start()
    assert collector.wait_for_frames(256, timeout=TIMEOUT)
    assert collector.frames_written == 256


def test_pause_holds_collection_until_it_ends_or_until_allowed_again(make_collector):
    """Inside ``pause()`` nothing is collected, the batches in flight already in; on exit collection goes on.
    ``pause(resume=False)`` keeps it held until ``allow_frames``; ``timeout=None`` waits as long as it takes."""
    collector = make_collector(1 << 20)
    collector.start()
    assert collector.wait_for_frames(2 * FRAMES_PER_BATCH, timeout=TIMEOUT)
    with collector.pause(timeout=TIMEOUT):
        held = collector.frames_written
        assert held % FRAMES_PER_BATCH == 0 and stays(collector, held), "collected inside pause()"
    assert collector.wait_for_frames(held + 2 * FRAMES_PER_BATCH, timeout=TIMEOUT), "did not resume"
    with collector.pause(timeout=None, resume=False):
        held = collector.frames_written
    assert stays(collector, held), "resumed after pause(resume=False)"
    collector.allow_frames(held + FRAMES_PER_BATCH)
    assert collector.wait_for_frames(held + FRAMES_PER_BATCH, timeout=TIMEOUT)
    assert stays(collector, held + FRAMES_PER_BATCH)
