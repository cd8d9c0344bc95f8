"""Batch sampling: ``rb.sample()`` and ``BufferSampler`` (uniform and prioritized) against a bare gather.

The recipes draw each batch with :class:`~torchrl_unilab.data.buffer_sampler.BufferSampler`:
the buffer's own sampler picks the rows (``replay_buffer.prb=true``:
prioritized), and only the keys the losses read are copied. The baseline is
the lower bound: ``torch.randint`` and one ``index_select`` per key into
tensors allocated once, under the buffer's lock. On a 100,000-row
buffer with the collector's keys (HalfCheetah-v5 sizes), batch 256, one torch
thread, in alternating blocks (median). ``prb`` includes the
``update_priority`` of the batch that a prioritized update adds. Prints one
JSON line.

    python benchmarks/sampling.py [--blocks 15] [--block-samples 50]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch
from tensordict import TensorDict

from torchrl_unilab import make_replay_buffer
from torchrl_unilab.data.buffer_sampler import BufferSampler
from torchrl_unilab.data.prioritized_sampler import SharedPrioritizedSampler
from torchrl_unilab.data.replay_buffer import buffer_lock

OBS, ACT, BATCH, ROWS = 17, 6, 256, 100_000
KEYS = ["observation", "action", ("next", "observation"), ("next", "reward"), ("next", "done"),
        ("next", "terminated"), "policy_version"]


def filled(sampler=None):
    rb = make_replay_buffer(ROWS, batch_size=BATCH, sampler=sampler)
    flags = torch.zeros(ROWS, 1, dtype=torch.bool)
    rb.extend(TensorDict({
        "observation": torch.randn(ROWS, OBS), "action": torch.rand(ROWS, ACT),
        ("next", "observation"): torch.randn(ROWS, OBS), ("next", "reward"): torch.randn(ROWS, 1),
        ("next", "done"): flags, ("next", "terminated"): flags, ("next", "truncated"): flags,
        ("collector", "traj_ids"): torch.zeros(ROWS, dtype=torch.int64),
        "step_count": torch.zeros(ROWS, 1, dtype=torch.int64), ("next", "step_count"): torch.ones(ROWS, 1, dtype=torch.int64),
        "policy_version": torch.ones(ROWS, dtype=torch.int64),
    }, [ROWS]))
    return rb


def gather(rb):
    """The baseline: uniform indices, one index_select per key into reused tensors, under the buffer's lock."""
    data = rb.storage._storage  # noqa: SLF001
    sources = [data.get(key) for key in KEYS]
    targets = [torch.empty((BATCH, *s.shape[1:]), dtype=s.dtype) for s in sources]
    index = torch.empty(BATCH, dtype=torch.int64)
    lock = buffer_lock(rb)

    def step():
        with lock:
            torch.randint(len(rb.storage), (BATCH,), out=index)
            for source, target in zip(sources, targets):
                torch.index_select(source, 0, index, out=target)
    return step


def prioritized(sample, rb):
    def step():
        _, info = sample()
        rb.update_priority(info["index"], torch.rand(BATCH))
    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=15)
    parser.add_argument("--block-samples", type=int, default=50)
    args = parser.parse_args()
    torch.set_num_threads(1)
    uniform, prb = filled(), filled(SharedPrioritizedSampler(ROWS, alpha=0.7, beta=0.5))
    variants = {"gather": gather(uniform), "rb_sample": uniform.sample, "buffer_sampler": BufferSampler(uniform, BATCH),
                "prb_rb_sample_and_update": prioritized(lambda: prb.sample(return_info=True), prb),
                "prb_buffer_sampler_and_update": prioritized(BufferSampler(prb, BATCH), prb)}
    times = {name: [] for name in variants}
    for _ in range(args.blocks):
        for name, step in variants.items():
            start = time.perf_counter()
            for _ in range(args.block_samples):
                step()
            times[name].append((time.perf_counter() - start) / args.block_samples * 1e3)
    ms = {name: statistics.median(t) for name, t in times.items()}
    print(json.dumps({
        **{f"{name}_ms": round(value, 3) for name, value in ms.items()},
        **{f"{name}_over_gather": round(ms[name] / ms["gather"], 2) for name in variants if name != "gather"},
        "load": os.getloadavg()[0],
    }))


if __name__ == "__main__":
    main()
