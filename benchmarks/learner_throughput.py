"""Learner throughput: the recipe's SAC update against TorchRL's loop and the machine's limit, and end to end.

Run::

    python benchmarks/learner_throughput.py [--blocks 12] [--block-updates 20] [--e2e-frames 3000] [--no-compile]
    python benchmarks/learner_throughput.py --device cuda [--block-updates 200] [--e2e-frames 20000]
    python benchmarks/learner_throughput.py --batch-sizes 256 512 1024 2048 [--buffer-rows 1000000]

See ``benchmarks/README.md``, section "Learner throughput". It lists every key and option.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import signal
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
from common import provenance, recipe_config, recipe_script, scalar_rows
from omegaconf import OmegaConf
from sampling import collector_rows
from torchrl.objectives import SACLoss, SoftUpdate

from torchrl_unilab import SharedWeights, make_replay_buffer
from torchrl_unilab.data import BufferSampler
from torchrl_unilab.objectives import tensor_loss
from torchrl_unilab.trainers.compile import compile_delayed_update, compile_update
from torchrl_unilab.trainers.device import cpu_computes_bf16, learner_device
from torchrl_unilab.trainers.recipes_utils import EnvInfo, make_loss_module, make_networks, make_optimizer
from torchrl_unilab.trainers.threads import machine_cores

ROOT = Path(__file__).resolve().parents[1]
OBS, ACT, BATCH, HIDDEN = 17, 6, 256, 256  # HalfCheetah-v5
START_FRAMES = 1000  # random frames before learning starts, in both end-to-end runs


def filled_buffer(rows: int = 50_000):
    """A shared buffer (capacity at least 100,000) holding ``rows`` random transitions with the collector's keys."""
    rb = make_replay_buffer(max(100_000, rows), batch_size=BATCH)
    rb.extend(collector_rows(rows, generator=torch.Generator().manual_seed(0)))
    return rb


def config(compile: bool = False, cudagraphs: bool = False):
    return OmegaConf.create({
        "network": {"hidden_sizes": [HIDDEN, HIDDEN], "use_layer_norm": False, "obs_norm": False},
        "optim": {"gamma": 0.99, "loss_function": "l2", "alpha_init": 1.0, "target_update_polyak": 0.995,
                  "lr": 3e-4, "weight_decay": 0.0, "adam_eps": 1e-8},
        "compile": {"compile": compile, "compile_mode": None, "cudagraphs": cudagraphs},
    })


def networks(device: torch.device | str = "cpu", cfg=None, algo: str = "sac"):
    """The recipe's networks for ``algo`` at HalfCheetah-v5's sizes (``cfg``: :func:`config` by default)."""
    torch.manual_seed(0)
    env = EnvInfo(OBS, ACT, -torch.ones(ACT), torch.ones(ACT))
    return make_networks(config() if cfg is None else cfg, algo, env, device=device)


def total_loss(losses):
    return losses["loss_actor"] + losses["loss_qvalue"] + losses["loss_alpha"]


def plain_loop(rb):
    """TorchRL's SOTA SAC update: rb.sample(), SACLoss, three Adams, SoftUpdate."""
    nets = networks()
    loss = SACLoss(nets.actor, nets.critic, num_qvalue_nets=2, loss_function="l2", delay_actor=False,
                   delay_qvalue=True, alpha_init=1.0)
    loss.make_value_estimator(gamma=0.99)
    target = SoftUpdate(loss, eps=0.995)
    optimizers = [torch.optim.Adam(list(loss.actor_network_params.flatten_keys().values()), lr=3e-4),
                  torch.optim.Adam(list(loss.qvalue_network_params.flatten_keys().values()), lr=3e-4),
                  torch.optim.Adam([loss.log_alpha], lr=3e-4)]

    def step():
        total_loss(loss(rb.sample())).backward()
        for opt in optimizers:
            opt.step()
            opt.zero_grad()
        target.step()
    return step


def recipe_loop(rb, *, fast_loss: bool = True, compile: bool = False, cudagraphs: bool = False,
                device: torch.device | str = "cpu", serial: bool = False, prefetch: bool = False,
                trained: dict | None = None, batch_size: int = BATCH, matmul_dtype: torch.dtype = torch.float32):
    """The update of recipes/sac.py (BufferSampler, the tensor-level loss, one fused Adam, SoftUpdate) on ``device``,
    compiled as its ``compile`` section would.

    ``serial`` waits for the GPU after each update; ``prefetch`` samples the next batch in a thread, into a second
    sampler; ``trained``: the ``modules`` of a SAC recipe checkpoint to start from.
    """
    device = torch.device(device)
    cfg = config(compile, cudagraphs)
    loss, target = make_loss_module(cfg, "sac", networks(device))
    optimizer = make_optimizer(cfg, loss)
    if trained is not None:  # copies: the optimizer would update the checkpoint's own tensors in place
        loss.load_state_dict(copy.deepcopy(trained["loss"]))
        optimizer.load_state_dict(copy.deepcopy(trained["optimizer"]))
    loss_fn = tensor_loss(loss, matmul_dtype) if fast_loss else loss
    assert loss_fn is not None

    def update(batch):
        losses = loss_fn(batch)
        total_loss(losses).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        target.step()
        return {key: value.detach() for key, value in losses.items()}

    update = compile_update(update, cfg.compile, device)
    sample = BufferSampler(rb, batch_size, device=device)
    if prefetch:
        samplers, pool = [sample, BufferSampler(rb, batch_size, device=device)], ThreadPoolExecutor(1)
        pending = {"which": 0, "next": pool.submit(sample)}

        def step():
            batch = pending["next"].result()[0]
            pending["which"] ^= 1  # the other sampler's tensors: this batch stays intact while it fills them
            pending["next"] = pool.submit(samplers[pending["which"]])
            update(batch)
        return step

    def step():
        update(sample()[0])
        if serial:  # the next batch is sampled after the update, not during it
            torch.cuda.synchronize(device)
    return step


def denormal_fraction(state: dict) -> float:
    """The fraction of an optimizer state's float entries that are denormal (non-zero, below float32's ``tiny``)."""
    tensors = [t for entry in state["state"].values() for t in entry.values()
               if isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel() > 1]
    tiny = torch.finfo(torch.float32).tiny
    return sum(int(((t != 0) & (t.abs() < tiny)).sum()) for t in tensors) / sum(t.numel() for t in tensors)


def with_flush_denormal(step, flush: bool):
    """``step`` run with denormals flushed (``flush``) or not, on the calling thread (the one-thread blocks)."""
    def flagged():
        torch.set_flush_denormal(flush)
        step()
    return flagged


def td3_loop(rb, *, device: torch.device | str = "cpu", compile: bool = False, cudagraphs: bool = False,
             batch_size: int | None = None, hidden: tuple[int, ...] | None = None,
             matmul_dtype: torch.dtype = torch.float32):
    """The update of recipes/td3.py with its defaults, the actor and targets every ``optim.policy_update_delay``-th;
    ``hidden`` and ``batch_size`` replace the config's; the rest as :func:`recipe_loop`."""
    cfg = OmegaConf.load(ROOT / "recipes" / "config" / "td3.yaml")
    if hidden is not None:
        cfg.network.hidden_sizes = list(hidden)
    cfg.compile.compile, cfg.compile.cudagraphs = compile, cudagraphs
    device = torch.device(device)
    loss, target = make_loss_module(cfg, "td3", networks(device, cfg, "td3"))
    update = recipe_script("td3").make_update(loss, make_optimizer(cfg, loss), target, tensor_loss(loss, matmul_dtype))
    return delayed_actor_step(update, cfg, rb, device, batch_size)


def crossq_loop(rb, width: int):
    """The update of recipes/crossq.py with its defaults (TorchRL's ``CrossQLoss``), its critics ``width`` wide."""
    cfg = recipe_config("crossq", [f"network.critic_hidden_sizes=[{width},{width}]"])
    loss, _ = make_loss_module(cfg, "crossq", networks("cpu", cfg, "crossq"))
    update = recipe_script("crossq").make_update(loss, make_optimizer(cfg, loss))
    return delayed_actor_step(update, cfg, rb, torch.device("cpu"))


def delayed_actor_step(update, cfg, rb, device: torch.device, batch_size: int | None = None):
    """``step()``: a sampled batch through ``update(batch, update_actor)``, the actor's part every
    ``optim.policy_update_delay``-th call."""
    updates = compile_delayed_update(update, cfg.compile, device)
    sample = BufferSampler(rb, batch_size or int(cfg.optim.batch_size), device=device)
    delay, calls = int(cfg.optim.policy_update_delay), [0]

    def step():
        calls[0] += 1
        updates[calls[0] % delay == 0](sample()[0])
    return step


def update_rates(variants: dict, blocks: int, block_updates: int, *, warmup_steps: int = 3,
                 sync=lambda: None, threads: dict[str, int] | None = None) -> dict:
    """Median updates/s over alternating blocks; ``sync`` waits for queued device work at each block's end;
    ``threads`` maps a variant to its torch thread count (default: one)."""
    threads = threads or {}

    def seconds(name: str, steps: int) -> float:
        torch.set_num_threads(threads.get(name, 1))
        start = time.perf_counter()
        for _ in range(steps):
            variants[name]()
        sync()
        return time.perf_counter() - start

    # the warm-up compiles the compiled variants (and captures CUDA graphs)
    warmup = {name: seconds(name, warmup_steps) for name in variants}
    rates = {name: [] for name in variants}
    for _ in range(blocks):
        for name in variants:
            rates[name].append(block_updates / seconds(name, block_updates))
    torch.set_num_threads(1)
    return {name: {"ups": statistics.median(r), "best_ups": max(r), "warmup_s": warmup[name]}
            for name, r in rates.items()}


def profile_update(rb, updates: int = 50, top: int = 12) -> dict[str, object]:
    """Milliseconds per recipe update (one thread) in each of its parts, in matrix products (``matmul``, self
    time), in total, and in the ``top`` ops by self time (``ops``, with calls per update), by torch.profiler."""
    from torch.autograd.profiler import record_function  # noqa: PLC0415
    from torch.profiler import ProfilerActivity, profile  # noqa: PLC0415

    torch.set_num_threads(1)
    cfg = config()
    loss, target = make_loss_module(cfg, "sac", networks())
    optimizer = make_optimizer(cfg, loss)
    loss_fn = tensor_loss(loss)
    sample = BufferSampler(rb, BATCH)

    def update():
        with record_function("update"):
            with record_function("sample"):
                batch = sample()[0]
            with record_function("loss"):
                total = total_loss(loss_fn(batch))
            with record_function("backward"):
                total.backward()
            with record_function("optimizer"):
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            with record_function("target_update"):
                target.step()

    labels = ("update", "sample", "loss", "backward", "optimizer", "target_update")  # the record_function names above
    for _ in range(10):
        update()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(updates):
            update()
    events = prof.key_averages()
    parts = {e.key: e.cpu_time_total / 1e3 / updates for e in events if e.key in labels}
    matmul = sum(e.self_cpu_time_total for e in events if e.key in ("aten::mm", "aten::addmm", "aten::bmm",
                                                                      "aten::baddbmm", "aten::matmul"))
    parts["matmul"] = matmul / 1e3 / updates
    parts["total"] = parts.pop("update")
    out: dict[str, object] = {key: round(value, 3) for key, value in parts.items()}
    ops = sorted((e for e in events if e.key not in labels), key=lambda e: e.self_cpu_time_total, reverse=True)[:top]
    out["ops"] = {e.key: {"ms": round(e.self_cpu_time_total / 1e3 / updates, 3), "calls": e.count / updates}
                  for e in ops}
    return out


def update_matmuls(algo: str = "sac", hidden: tuple[int, ...] = (HIDDEN, HIDDEN), batch: int = BATCH,
                   obs: int = OBS, act: int = ACT, policy_delay: int = 2) -> list[tuple[tuple[int, int, int], float]]:
    """The matrix products ``(m, k) @ (k, n)`` of one update of the recipe, as ``((m, k, n), times per update)``.

    A layer's backward is ``grad_out @ W`` for its input (none for a layer reading the batch) and
    ``input.T @ grad_out`` for its weight.
    """
    sizes = [*hidden]
    actor = list(zip([obs, *sizes], [*sizes, (2 if algo == "sac" else 1) * act]))
    critic = list(zip([obs + act, *sizes], [*sizes, 1]))

    def forward(layers, times):
        return [((batch, i, o), times) for i, o in layers]

    def backward(layers, times, weights: bool, first_input: bool):
        out = []
        for idx, (i, o) in enumerate(layers):
            if idx > 0 or first_input:
                out.append(((batch, o, i), times))  # grad of the layer's input
            if weights:
                out.append(((i, batch, o), times))  # grad of its weight
        return out

    if algo == "sac":
        return [*forward(actor, 2), *backward(actor, 1, weights=True, first_input=False),
                *forward(critic, 2 * 3),  # two Q-networks: actor loss, Q loss, target
                *backward(critic, 2, weights=False, first_input=True),  # actor loss: down to the action
                *backward(critic, 2, weights=True, first_input=False)]  # Q loss
    delayed = 1.0 / policy_delay
    return [*forward(actor, 1), *forward(critic, 2 * 2),  # target actor and Q-networks; both Q-networks
            *backward(critic, 2, weights=True, first_input=False),
            *forward(actor, delayed), *backward(actor, delayed, weights=True, first_input=False),
            *forward(critic, delayed), *backward(critic, delayed, weights=False, first_input=True)]


def best_matmul_s(m: int, k: int, n: int, threads: int, repeats: int = 200) -> float:
    """The fastest ``torch.mm`` of a contiguous ``(m, k) @ (k, n)`` float32 product on ``threads`` threads."""
    torch.set_num_threads(threads)
    a, b, out = torch.randn(m, k), torch.randn(k, n), torch.empty(m, n)
    for _ in range(20):
        torch.mm(a, b, out=out)
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        torch.mm(a, b, out=out)
        best = min(best, time.perf_counter() - start)
    torch.set_num_threads(1)
    return best


def sgemm_limit(threads: int, algo: str = "sac", hidden: tuple[int, ...] = (HIDDEN, HIDDEN),
                batch: int = BATCH) -> dict:
    """An update's matrix products alone (:func:`update_matmuls`), each at the best rate torch reaches on its
    shape on ``threads`` threads: updates/s, that rate in GFLOP/s, and the MFLOP of one update."""
    products = update_matmuls(algo, hidden, batch)
    best = {shape: best_matmul_s(*shape, threads) for shape in {shape for shape, _ in products}}
    seconds = sum(best[shape] * times for shape, times in products)
    flops = sum(2 * m * k * n * times for (m, k, n), times in products)
    return {"ups": 1.0 / seconds, "gflops": flops / seconds / 1e9, "update_mflop": flops / 1e6}


def device_sync(device: torch.device) -> Callable[[], None]:
    """A call that waits for the work queued on ``device`` (none to wait for on a CPU)."""
    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    return sync


def call_times_ms(call, repeats: int = 50, sync=lambda: None) -> list[float]:
    """Milliseconds of each of ``repeats`` calls of ``call()`` (``sync`` after each, outside the timing)."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append((time.perf_counter() - start) * 1e3)
        sync()
    return times


def median_ms(call, repeats: int = 50, sync=lambda: None) -> float:
    """Median milliseconds of ``call()`` (``sync`` after each, outside the timing)."""
    return statistics.median(call_times_ms(call, repeats, sync))


def publish_times_ms(device: torch.device, repeats: int = 50) -> dict[str, list[float]]:
    """Milliseconds of each weight publish of the SAC exploration policy from ``device``: ``"batched"`` (the
    recipes' way) and ``"per_tensor"`` (one ``.cpu()`` per tensor first)."""
    nets = networks(device)
    weights = SharedWeights.create(nets.worker_policy)
    try:
        state = nets.policy.state_dict()
        return {"batched": call_times_ms(lambda: weights.publish(state), repeats),
                "per_tensor": call_times_ms(lambda: weights.publish({k: v.cpu() for k, v in state.items()}), repeats)}
    finally:
        weights.close()


def batch_size_sweep(batch_sizes: list[int], rows: int, blocks: int, block_updates: int) -> dict:
    """``--batch-sizes``: the SAC recipe's update at each batch size on one and two torch threads, on a buffer of
    ``rows`` rows, against the sgemm limit, with ``sample_ms`` (one batch) and its share of an update."""
    rb = filled_buffer(rows)
    variants, threads = {}, {}
    for batch in batch_sizes:
        for count in (1, 2):
            variants[f"{batch}_{count}t"], threads[f"{batch}_{count}t"] = recipe_loop(rb, batch_size=batch), count
    rates = update_rates(variants, blocks, block_updates, threads=threads)
    table = {}
    for batch in batch_sizes:
        ups = {count: rates[f"{batch}_{count}t"]["ups"] for count in (1, 2)}
        limit = {count: sgemm_limit(count, batch=batch)["ups"] for count in (1, 2)}
        sample_ms = median_ms(BufferSampler(rb, batch))
        table[str(batch)] = {
            **{f"ups_{count}t": round(ups[count], 1) for count in (1, 2)},
            **{f"rows_per_s_{count}t": round(ups[count] * batch) for count in (1, 2)},
            "two_threads_gain": round(ups[2] / ups[1], 3),
            **{f"fraction_of_limit_{count}t": round(ups[count] / limit[count], 3) for count in (1, 2)},
            "sample_ms": round(sample_ms, 3), "sample_share_1t": round(sample_ms * ups[1] / 1e3, 3)}
    return {**provenance("learner_throughput", load_end=round(os.getloadavg()[0], 2)), "mode": "batch_sizes",
            "buffer_rows": rows, "hidden": [HIDDEN, HIDDEN], "by_batch_size": table}


def rate_keys(rates: dict) -> dict:
    """Each variant's ``<name>_ups`` and ``<name>_best_ups``, rounded."""
    return {**{f"{name}_ups": round(r["ups"], 1) for name, r in rates.items()},
            **{f"{name}_best_ups": round(r["best_ups"], 1) for name, r in rates.items()}}


def device_suite(args) -> dict:
    """``--device cuda``: the recipe's update eager, compiled and compiled with CUDA graphs; sampling, publish, e2e."""
    device = learner_device(args.device)
    sync = device_sync(device)
    rb = filled_buffer()
    variants = {
        "eager": recipe_loop(rb, device=device),
        "eager_serial": recipe_loop(rb, device=device, serial=True),
        "compiled": recipe_loop(rb, device=device, compile=True),
        "compiled_cudagraphs": recipe_loop(rb, device=device, compile=True, cudagraphs=True),
        "compiled_cudagraphs_serial": recipe_loop(rb, device=device, compile=True, cudagraphs=True, serial=True),
    }
    if args.no_compile:
        variants = {name: step for name, step in variants.items() if not name.startswith("compiled")}
    # CUDA graphs capture after 5 eager calls (trainers/compile.py); a few more settle the allocator.
    rates = update_rates(variants, args.blocks, args.block_updates, warmup_steps=10, sync=sync)
    out = {"benchmark": "learner_throughput", "device": str(device), "gpu": torch.cuda.get_device_name(device),
           "batch_size": BATCH, "hidden": [HIDDEN, HIDDEN], "threads": 1, **rate_keys(rates),
           **{f"{name}_warmup_s": round(r["warmup_s"], 1) for name, r in rates.items() if name.startswith("compiled")}}
    for name in ("compiled", "compiled_cudagraphs"):
        if name in rates:
            out[f"{name}_over_eager"] = round(rates[name]["ups"] / rates["eager"]["ups"], 2)
    for name in ("eager", "compiled_cudagraphs"):
        if f"{name}_serial" in rates:
            out[f"overlap_gain_{name}"] = round(rates[name]["ups"] / rates[f"{name}_serial"]["ups"], 3)
    for key, pin_memory in (("sample_ms", None), ("sample_pageable_ms", False)):  # None: pinned on a GPU
        out[key] = round(median_ms(BufferSampler(rb, BATCH, device=device, pin_memory=pin_memory), sync=sync), 3)
    times = publish_times_ms(device)
    out["publish_ms"] = round(statistics.median(times["batched"]), 3)
    out["publish_per_tensor_ms"] = round(statistics.median(times["per_tensor"]), 3)
    if args.e2e_frames:
        compiled = [] if args.no_compile else ["compile.compile=true", "compile.cudagraphs=true"]
        for workers in (1, 2):
            e2e = end_to_end(args.e2e_frames, args.e2e_threads,
                             [f"network.device={device}", f"collector.num_workers={workers}", *compiled])
            out[f"e2e_frames_per_s_{workers}_workers"] = round(e2e["frames_per_s"], 1)
            out[f"e2e_utd_achieved_{workers}_workers"] = round(e2e["utd_achieved"], 3)
    out["anchor_leanrl_h100_sac_fps"] = {"cleanrl": 127, "leanrl_compile_cudagraphs": 725}
    return out


def end_to_end(frames: int, threads: int | str, overrides: list[str] | tuple[str, ...] = (), *, recipe: str = "sac",
               seconds: float | None = None, start_frames: int = START_FRAMES, log_every: int = 250) -> dict:
    """recipes/sac.py (or ``recipe``) on HalfCheetah-v5 at utd_ratio=1 (plus ``overrides``): env frames/s once
    learning has started.

    With ``seconds`` the run is stopped by SIGTERM (the recipe's Ctrl-C) ``seconds`` after its first log past
    ``start_frames`` and two log windows (where a compiled update compiles); the figures cover that window.
    """
    module = recipe_script(recipe)

    measured_from = start_frames + (2 * log_every if seconds is not None else log_every)
    with tempfile.TemporaryDirectory() as tmp:
        cfg = recipe_config(recipe, [
            f"collector.total_frames={frames if seconds is None else 10**12}",
            f"collector.init_random_frames={start_frames}", "optim.utd_ratio=1.0", f"optim.num_threads={threads}",
            f"logger.log_dir={tmp}", f"logger.log_every={log_every}", "logger.eval_iter=0",
            "logger.checkpoint_every=0", "logger.progress_bar=false", "logger.num_eval_envs=1", *overrides,
        ])
        exp = Path(tmp) / cfg.logger.exp_name / "scalars"
        finished = threading.Event()
        if seconds is not None:
            threading.Thread(target=_stop_after, daemon=True,
                             args=(exp / "time" / "elapsed_s.csv", measured_from, seconds, finished)).start()
        try:
            summary = module.main(cfg)
        finally:
            finished.set()
        elapsed = scalar_rows(exp / "time" / "elapsed_s.csv")
        ups = dict(scalar_rows(exp / "learner" / "updates_per_s.csv"))
        stalls = dict(scalar_rows(exp / "learner" / "longest_stall_s.csv"))
    # Frames per second between the first log after learning started and the last log.
    after = [(f, t) for f, t in elapsed if f >= measured_from]
    (f0, t0), (f1, t1) = after[0], after[-1]
    out = {"frames": summary["frames"], "updates": summary["updates"], "frames_per_s": (f1 - f0) / (t1 - t0),
           "utd_achieved": summary["utd_achieved"], "threads": summary["learner_threads"],
           "thread_changes": summary["learner_thread_changes"]}
    if seconds is not None:
        # each log's updates/s covers the time since the previous log
        updates = sum(ups[f] * (t - t_prev) for (_, t_prev), (f, t) in zip(after, after[1:]) if f in ups)
        out.update({"window_s": t1 - t0, "updates_per_s": updates / (t1 - t0),
                    "num_workers": int(cfg.collector.num_workers),
                    "envs_per_worker": int(cfg.collector.env_per_collector),
                    "longest_stall_s": summary["longest_stall_s"],
                    "longest_stall_before_window_s": stalls.get(f0)})
    return out


def _stop_after(elapsed_csv: Path, from_frames: int, seconds: float, finished: threading.Event) -> None:
    """SIGTERMs this process ``seconds`` after ``elapsed_csv`` logs ``from_frames`` frames (if not ``finished``)."""
    started = None
    while not finished.wait(0.2):
        if started is None and any(f >= from_frames for f, _ in scalar_rows(elapsed_csv)):
            started = time.monotonic()
        if started is not None and time.monotonic() - started >= seconds:
            os.kill(os.getpid(), signal.SIGTERM)  # the recipe's graceful stop, as a Ctrl-C
            return


def stable_baselines3(frames: int, threads: int) -> dict | None:
    """Stable-Baselines3 SAC on HalfCheetah-v5, one gradient step per env step: frames/s once learning has started."""
    try:
        import gymnasium as gym  # noqa: PLC0415
        from stable_baselines3 import SAC  # noqa: PLC0415
        from stable_baselines3.common.callbacks import BaseCallback  # noqa: PLC0415
        from stable_baselines3.common.logger import Logger  # noqa: PLC0415
    except ImportError:
        return None

    class Clock(BaseCallback):
        def __init__(self) -> None:
            super().__init__()
            self.marks: dict[int, float] = {}

        def _on_step(self) -> bool:
            if self.num_timesteps in (START_FRAMES + 250, frames):  # the window the recipe's figure uses
                self.marks[self.num_timesteps] = time.perf_counter()
            return True

    torch.set_num_threads(threads)
    env = gym.make("HalfCheetah-v5")
    model = SAC("MlpPolicy", env, batch_size=BATCH, learning_starts=START_FRAMES, train_freq=1, gradient_steps=1,
                policy_kwargs={"net_arch": [HIDDEN, HIDDEN]}, device="cpu", seed=0)
    model.set_logger(Logger(folder=None, output_formats=[]))  # its default logger leaves a /tmp/SB3-<date> folder
    clock = Clock()
    model.learn(frames, callback=clock)
    env.close()
    (f0, t0), (f1, t1) = sorted(clock.marks.items())
    return {"frames_per_s": (f1 - f0) / (t1 - t0)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--blocks", type=int, default=12)
    parser.add_argument("--block-updates", type=int, default=20)
    parser.add_argument("--e2e-frames", type=int, default=3000, help="0 skips the end-to-end run")
    parser.add_argument("--e2e-rounds", type=int, default=2, help="end-to-end runs of num_threads=auto and =1 each")
    parser.add_argument("--e2e-threads", default="1", help="optim.num_threads of the --device cuda end-to-end runs")
    parser.add_argument("--profile", action="store_true", help="add profile_ms: where an update's time goes")
    parser.add_argument("--no-compile", action="store_true", help="skip the compiled update (saves ~1 min)")
    parser.add_argument("--no-sb3", action="store_true", help="skip the Stable-Baselines3 baseline")
    parser.add_argument("--prefetch", action="store_true",
                        help="add recipe_prefetch (the next batch sampled by a thread) and sample_ms")
    parser.add_argument("--checkpoint", type=Path, default=None,
                        help="a SAC recipe run's checkpoint directory: adds trained_*, with denormals flushed or not")
    parser.add_argument("--device", default="cpu", help="the learner's device: cpu (default) or cuda")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=None, metavar="N",
                        help="only the update at these batch sizes on 1 and 2 threads, and sampling's share")
    parser.add_argument("--matmul-dtype", choices=("bf16",), default=None,
                        help="also the SAC and TD3 updates with optim.matmul_dtype=bf16: *_bf16_*")
    parser.add_argument("--crossq-widths", type=int, nargs="+", default=None, metavar="W",
                        help="also recipes/crossq.py's update with critics W wide: crossq_<W>_*")
    parser.add_argument("--buffer-rows", type=int, default=50_000,
                        help="rows in the buffer --batch-sizes samples from")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.batch_sizes:
        print(json.dumps(batch_size_sweep(args.batch_sizes, args.buffer_rows, args.blocks, args.block_updates)))
        return
    if learner_device(args.device).type != "cpu":
        print(json.dumps(device_suite(args)))
        return
    rb = filled_buffer()
    variants = {"plain": plain_loop(rb), "recipe_loss_module": recipe_loop(rb, fast_loss=False),
                "recipe": recipe_loop(rb), "recipe_2t": recipe_loop(rb), "td3_recipe": td3_loop(rb)}
    if not args.no_compile:
        variants["recipe_compiled"] = recipe_loop(rb, compile=True)
    if args.prefetch:
        variants["recipe_prefetch"] = recipe_loop(rb, prefetch=True)
    if args.matmul_dtype:
        variants.update(recipe_bf16=recipe_loop(rb, matmul_dtype=torch.bfloat16),
                        recipe_bf16_2t=recipe_loop(rb, matmul_dtype=torch.bfloat16),
                        td3_recipe_bf16=td3_loop(rb, matmul_dtype=torch.bfloat16))
    for width in args.crossq_widths or ():
        variants[f"crossq_{width}"] = crossq_loop(rb, width)
    rates = update_rates(variants, args.blocks, args.block_updates, threads={"recipe_2t": 2, "recipe_bf16_2t": 2})
    ups = {name: r["ups"] for name, r in rates.items()}
    limits = {n: sgemm_limit(n) for n in (1, 2)}
    td3_hidden = tuple(OmegaConf.load(ROOT / "recipes" / "config" / "td3.yaml").network.hidden_sizes)
    td3_limit = sgemm_limit(1, "td3", td3_hidden)
    out = {
        "benchmark": "learner_throughput", "batch_size": BATCH, "hidden": [HIDDEN, HIDDEN], "threads": 1,
        **rate_keys(rates), **{f"{name}_ratio": round(ups[name] / ups["plain"], 2) for name in ups if name != "plain"},
        # the update against the sgemm limit on 1 and 2 threads
        "update_mflop": round(limits[1]["update_mflop"], 1),
        "sgemm_gflops_1t": round(limits[1]["gflops"], 1), "sgemm_gflops_2t": round(limits[2]["gflops"], 1),
        "limit_ups_1t": round(limits[1]["ups"], 1), "limit_ups_2t": round(limits[2]["ups"], 1),
        "plain_ups_1t": round(ups["plain"], 1),
        "recipe_ups_1t": round(ups["recipe"], 1), "recipe_ups_2t": round(ups["recipe_2t"], 1),
        "recipe_fraction_of_limit_1t": round(ups["recipe"] / limits[1]["ups"], 3),
        "recipe_fraction_of_limit_2t": round(ups["recipe_2t"] / limits[2]["ups"], 3),
        # the same for recipes/td3.py's update, with its own sizes and policy delay
        "td3_hidden": list(td3_hidden), "td3_update_mflop": round(td3_limit["update_mflop"], 1),
        "td3_limit_ups_1t": round(td3_limit["ups"], 1), "td3_recipe_ups_1t": round(ups["td3_recipe"], 1),
        "td3_fraction_of_limit_1t": round(ups["td3_recipe"] / td3_limit["ups"], 3),
    }
    if "recipe_compiled" in rates:
        out["compile_warmup_s"] = round(rates["recipe_compiled"]["warmup_s"], 1)
    if args.matmul_dtype:
        out.update({"cpu_computes_bf16": cpu_computes_bf16(), "recipe_bf16_ups_1t": round(ups["recipe_bf16"], 1),
                    "recipe_bf16_ups_2t": round(ups["recipe_bf16_2t"], 1),
                    "td3_recipe_bf16_ups_1t": round(ups["td3_recipe_bf16"], 1),
                    "recipe_bf16_over_fp32_1t": round(ups["recipe_bf16"] / ups["recipe"], 3),
                    "recipe_bf16_over_fp32_2t": round(ups["recipe_bf16_2t"] / ups["recipe_2t"], 3),
                    "td3_bf16_over_fp32_1t": round(ups["td3_recipe_bf16"] / ups["td3_recipe"], 3)})
    for width in args.crossq_widths or ():
        out.update({f"crossq_{width}_ups_1t": round(ups[f"crossq_{width}"], 1),
                    f"crossq_{width}_over_recipe_1t": round(ups[f"crossq_{width}"] / ups["recipe"], 3)})
    if args.prefetch:
        out["sample_ms"] = round(median_ms(BufferSampler(rb, BATCH)), 3)
    if args.profile:
        out["profile_ms"] = profile_update(rb)
    if args.checkpoint is not None:
        # weights_only: tensors and plain values only, nothing that runs code
        trained = torch.load(args.checkpoint / "state.pt", weights_only=True, map_location="cpu")["modules"]
        fraction = denormal_fraction(trained["optimizer"])
        trained_rates = update_rates({"trained": with_flush_denormal(recipe_loop(rb, trained=trained), False),
                                      "trained_flush": with_flush_denormal(recipe_loop(rb, trained=trained), True)},
                                     args.blocks, args.block_updates)
        torch.set_flush_denormal(False)
        trained_ups, flush_ups = trained_rates["trained"]["ups"], trained_rates["trained_flush"]["ups"]
        out.update({"trained_denormal_fraction": round(fraction, 4), "trained_ups_1t": round(trained_ups, 1),
                    "trained_flush_ups_1t": round(flush_ups, 1),
                    "trained_flush_ratio": round(flush_ups / trained_ups, 3)})
    if args.e2e_frames:
        # optim.num_threads auto (the default) against 1, alternating (auto, 1, 1, auto, ...): frames/s each
        fps, changes = {"auto": [], "1": []}, []
        for threads in [t for r in range(args.e2e_rounds) for t in (("auto", "1"), ("1", "auto"))[r % 2]]:
            e2e = end_to_end(args.e2e_frames, threads)
            fps[threads].append(round(e2e["frames_per_s"], 1))
            if threads == "auto":
                changes.append(e2e["thread_changes"])
        auto, one = statistics.median(fps["auto"]), statistics.median(fps["1"])
        out.update({"e2e_fps_auto": round(auto, 1), "e2e_fps_1t": round(one, 1),
                    "e2e_auto_over_1t": round(auto / one, 3), "e2e_fps_rounds": fps,
                    "e2e_auto_thread_changes": changes})
        sb3 = None if args.no_sb3 else stable_baselines3(args.e2e_frames, machine_cores())
        if sb3 is not None:
            out.update({"sb3_fps": round(sb3["frames_per_s"], 1), "sb3_threads": machine_cores(),
                        "e2e_auto_over_sb3": round(auto / sb3["frames_per_s"], 2)})
    print(json.dumps(out))


if __name__ == "__main__":
    main()
