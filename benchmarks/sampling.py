"""Batch sampling: ``rb.sample()`` and ``BufferSampler`` (uniform and prioritized) against a bare gather.

    python benchmarks/sampling.py [--blocks 15] [--block-samples 50] [--rows 100000] [--batch-size 256]

See ``benchmarks/README.md``, section "Batch sampling".
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import time

import torch
from common import provenance
from tensordict import TensorDict

from torchrl_unilab import make_replay_buffer
from torchrl_unilab.data.buffer_sampler import BufferSampler
from torchrl_unilab.data.prioritized_sampler import SharedPrioritizedSampler
from torchrl_unilab.data.replay_buffer import buffer_lock

OBS, ACT = 17, 6  # HalfCheetah-v5
KEYS = ["observation", "action", ("next", "observation"), ("next", "reward"), ("next", "done"),
        ("next", "terminated"), "policy_version"]


def collector_rows(rows: int, generator: torch.Generator | None = None, policy_outputs: bool = False) -> TensorDict:
    """``rows`` random transitions with the keys the collector writes (the exploration policy's ``loc`` and
    ``scale`` too with ``policy_outputs``, as TorchRL's rows hold them)."""
    flags = torch.zeros(rows, 1, dtype=torch.bool)
    values = {"observation": torch.randn(rows, OBS, generator=generator),
              "action": torch.rand(rows, ACT, generator=generator) * 2 - 1}
    if policy_outputs:
        values.update(loc=torch.randn(rows, ACT, generator=generator), scale=torch.rand(rows, ACT, generator=generator))
    values.update({
        ("next", "observation"): torch.randn(rows, OBS, generator=generator),
        ("next", "reward"): torch.randn(rows, 1, generator=generator),
        ("next", "done"): flags, ("next", "terminated"): flags, ("next", "truncated"): flags,
        ("collector", "traj_ids"): torch.zeros(rows, dtype=torch.int64),
        "step_count": torch.zeros(rows, 1, dtype=torch.int64),
        ("next", "step_count"): torch.ones(rows, 1, dtype=torch.int64),
        "policy_version": torch.ones(rows, dtype=torch.int64),
    })
    return TensorDict(values, [rows])


def filled(rows: int, batch: int, sampler=None):
    """A shared buffer of ``rows`` random rows with the collector's keys, every slot written."""
    rb = make_replay_buffer(rows, batch_size=batch, sampler=sampler)
    rb.extend(collector_rows(rows, policy_outputs=True))
    return rb


def gather(rb, batch: int):
    """The baseline: uniform indices, one index_select per key into reused tensors, under the buffer's lock."""
    data = rb.storage._storage  # noqa: SLF001
    sources = [data.get(key) for key in KEYS]
    targets = [torch.empty((batch, *s.shape[1:]), dtype=s.dtype) for s in sources]
    index = torch.empty(batch, dtype=torch.int64)
    lock = buffer_lock(rb)

    def step():
        with lock:
            torch.randint(len(rb.storage), (batch,), out=index)
            for source, target in zip(sources, targets):
                torch.index_select(source, 0, index, out=target)
    return step


def prioritized(sample, rb, batch: int):
    """A prioritized ``sample()`` and the ``update_priority`` of its rows that a prioritized update adds."""
    def step():
        _, info = sample()
        rb.update_priority(info["index"], torch.rand(batch))
    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=15)
    parser.add_argument("--block-samples", type=int, default=50)
    parser.add_argument("--rows", type=int, default=100_000, help="rows in the (full) buffer")
    parser.add_argument("--batch-size", type=int, default=256, help="rows per batch")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows, batch = args.rows, args.batch_size
    uniform, prb = filled(rows, batch), filled(rows, batch, SharedPrioritizedSampler(rows, alpha=0.7, beta=0.5))
    variants = {"gather": gather(uniform, batch), "rb_sample": uniform.sample,
                "buffer_sampler": BufferSampler(uniform, batch),
                "prb_rb_sample_and_update": prioritized(functools.partial(prb.sample, return_info=True), prb, batch),
                "prb_buffer_sampler_and_update": prioritized(BufferSampler(prb, batch), prb, batch)}
    times = {name: [] for name in variants}
    for _ in range(args.blocks):
        for name, step in variants.items():
            start = time.perf_counter()
            for _ in range(args.block_samples):
                step()
            times[name].append((time.perf_counter() - start) / args.block_samples * 1e3)
    ms = {name: statistics.median(t) for name, t in times.items()}
    print(json.dumps({
        **provenance("sampling"),
        "rows": rows, "batch_size": batch,
        **{f"{name}_ms": round(value, 3) for name, value in ms.items()},
        **{f"{name}_over_gather": round(ms[name] / ms["gather"], 2) for name in variants if name != "gather"},
        "load": os.getloadavg()[0],
    }))


if __name__ == "__main__":
    main()
