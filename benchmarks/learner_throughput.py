"""Learner throughput: the recipe's SAC update step against a plain TorchRL SACLoss loop, and end to end.

In one run, on one torch thread, batch 256, 256x256 networks, HalfCheetah-v5 sizes:

* ``plain``: the loop of TorchRL's ``sota-implementations/sac`` -- ``rb.sample()``,
  ``SACLoss``, three ``Adam`` optimizers (actor, critic, alpha), ``SoftUpdate``;
* ``recipe_loss_module``: the update of ``recipes/sac.py`` -- ``BufferSampler``, one fused Adam over
  every parameter, ``SoftUpdate`` -- calling ``SACLoss`` itself;
* ``recipe``: the same with the tensor-level loss (``fast_loss=True``, the default);
* ``recipe_compiled``: the same under ``torch.compile`` (``--no-compile`` skips it);
* ``e2e``: ``recipes/sac.py`` on HalfCheetah-v5 at ``utd_ratio=1``, env
  frames per second once learning has started;
* ``sb3``: Stable-Baselines3's SAC on the same task, sizes and thread count
  (``train_freq=1, gradient_steps=1``), frames per second once learning has
  started -- the baseline the end-to-end figure is compared with (skipped when
  ``stable-baselines3``, the ``bench`` extra, is not installed).

The update loops run in alternating blocks and report the median block rate,
so that other load on the machine weighs on every variant alike. Prints one
JSON line.

    python benchmarks/learner_throughput.py [--blocks 12] [--block-updates 20] [--e2e-frames 3000]
                                            [--e2e-threads 1] [--no-compile] [--no-sb3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from tensordict import TensorDict
from torchrl.objectives import SACLoss, SoftUpdate

from torchrl_unilab import make_replay_buffer
from torchrl_unilab.trainers.recipes_utils import EnvInfo, make_loss_module, make_networks, make_optimizer
from torchrl_unilab.data import BufferSampler
from torchrl_unilab.objectives import tensor_loss

ROOT = Path(__file__).resolve().parents[1]
OBS, ACT, BATCH, HIDDEN = 17, 6, 256, 256  # HalfCheetah-v5


def filled_buffer(rows: int = 50_000):
    """A shared buffer holding ``rows`` random transitions with the collector's keys."""
    rb = make_replay_buffer(100_000, batch_size=BATCH)
    g = torch.Generator().manual_seed(0)
    flags = torch.zeros(rows, 1, dtype=torch.bool)
    rb.extend(TensorDict({
        "observation": torch.randn(rows, OBS, generator=g), "action": torch.rand(rows, ACT, generator=g) * 2 - 1,
        ("next", "observation"): torch.randn(rows, OBS, generator=g), ("next", "reward"): torch.randn(rows, 1, generator=g),
        ("next", "done"): flags, ("next", "terminated"): flags, ("next", "truncated"): flags,
        ("collector", "traj_ids"): torch.zeros(rows, dtype=torch.int64), "step_count": torch.zeros(rows, 1, dtype=torch.int64),
        ("next", "step_count"): torch.ones(rows, 1, dtype=torch.int64), "policy_version": torch.ones(rows, dtype=torch.int64),
    }, [rows]))
    return rb


def config():
    return OmegaConf.create({
        "network": {"hidden_sizes": [HIDDEN, HIDDEN], "use_layer_norm": False, "obs_norm": False},
        "optim": {"gamma": 0.99, "loss_function": "l2", "alpha_init": 1.0, "target_update_polyak": 0.995,
                  "lr": 3e-4, "weight_decay": 0.0, "adam_eps": 1e-8},
    })


def networks():
    torch.manual_seed(0)
    return make_networks(config(), "sac", EnvInfo(OBS, ACT, -torch.ones(ACT), torch.ones(ACT)))


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
        losses = loss(rb.sample())
        (losses["loss_actor"] + losses["loss_qvalue"] + losses["loss_alpha"]).backward()
        for opt in optimizers:
            opt.step()
            opt.zero_grad()
        target.step()
    return step


def recipe_loop(rb, *, fast_loss: bool = True, compile: bool = False):
    """The update of recipes/sac.py: BufferSampler, the (tensor-level) loss, one fused Adam, SoftUpdate."""
    nets = networks()
    loss, target = make_loss_module(config(), "sac", nets)
    optimizer = make_optimizer(config(), loss)
    loss_fn = tensor_loss(loss) if fast_loss else loss
    assert loss_fn is not None

    def update(batch):
        losses = loss_fn(batch)
        (losses["loss_actor"] + losses["loss_qvalue"] + losses["loss_alpha"]).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        target.step()

    if compile:
        update = torch.compile(update)
    sample = BufferSampler(rb, BATCH)
    return lambda: update(sample()[0])


def update_rates(variants: dict, blocks: int, block_updates: int) -> dict:
    warmup = {}
    for name, step in variants.items():
        start = time.perf_counter()
        for _ in range(3):  # compiles the compiled variant
            step()
        warmup[name] = time.perf_counter() - start
    rates = {name: [] for name in variants}
    for _ in range(blocks):
        for name, step in variants.items():
            start = time.perf_counter()
            for _ in range(block_updates):
                step()
            rates[name].append(block_updates / (time.perf_counter() - start))
    return {name: {"ups": statistics.median(r), "best_ups": max(r), "warmup_s": warmup[name]}
            for name, r in rates.items()}


START_FRAMES = 1000  # random frames before learning starts, in both end-to-end runs


def end_to_end(frames: int, threads: int) -> dict:
    """recipes/sac.py on HalfCheetah-v5 at utd_ratio=1: env frames/s once learning has started."""
    sys.path.insert(0, str(ROOT / "recipes"))
    import sac  # noqa: PLC0415 - the recipe script, imported as a module

    start_frames = START_FRAMES
    with tempfile.TemporaryDirectory() as tmp:
        with initialize_config_dir(config_dir=str(ROOT / "recipes" / "config"), version_base="1.3"):
            cfg = compose(config_name="sac", overrides=[
                f"collector.total_frames={frames}", f"collector.init_random_frames={start_frames}",
                "optim.utd_ratio=1.0", f"optim.num_threads={threads}", f"logger.log_dir={tmp}", "logger.log_every=250", "logger.eval_iter=0",
                "logger.checkpoint_every=0", "logger.progress_bar=false", "logger.num_eval_envs=1",
            ])
        summary = sac.main(cfg)
        exp = Path(tmp) / cfg.logger.exp_name / "scalars"
        elapsed = [tuple(map(float, line.split(","))) for line in open(exp / "time" / "elapsed_s.csv")]
    # Frames per second between the first log after learning started and the last log.
    after = [(f, t) for f, t in elapsed if f >= start_frames + 250]
    (f0, t0), (f1, t1) = after[0], after[-1]
    return {"frames": summary["frames"], "updates": summary["updates"], "frames_per_s": (f1 - f0) / (t1 - t0),
            "utd_achieved": summary["utd_achieved"]}


def stable_baselines3(frames: int, threads: int) -> dict | None:
    """Stable-Baselines3 SAC on HalfCheetah-v5, one gradient step per env step: frames/s once learning has started."""
    try:
        import gymnasium as gym  # noqa: PLC0415
        from stable_baselines3 import SAC  # noqa: PLC0415
        from stable_baselines3.common.callbacks import BaseCallback  # noqa: PLC0415
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
    parser.add_argument("--e2e-threads", type=int, default=1, help="optim.num_threads of the end-to-end run")
    parser.add_argument("--no-compile", action="store_true", help="skip the compiled update (saves ~1 min)")
    parser.add_argument("--no-sb3", action="store_true", help="skip the Stable-Baselines3 baseline")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rb = filled_buffer()
    variants = {"plain": plain_loop(rb), "recipe_loss_module": recipe_loop(rb, fast_loss=False),
                "recipe": recipe_loop(rb)}
    if not args.no_compile:
        variants["recipe_compiled"] = recipe_loop(rb, compile=True)
    rates = update_rates(variants, args.blocks, args.block_updates)
    out = {"benchmark": "learner_throughput", "batch_size": BATCH, "hidden": [HIDDEN, HIDDEN], "threads": 1,
           **{f"{name}_ups": round(r["ups"], 1) for name, r in rates.items()},
           **{f"{name}_best_ups": round(r["best_ups"], 1) for name, r in rates.items()},
           **{f"{name}_ratio": round(r["ups"] / rates["plain"]["ups"], 2) for name, r in rates.items() if name != "plain"}}
    if "recipe_compiled" in rates:
        out["compile_warmup_s"] = round(rates["recipe_compiled"]["warmup_s"], 1)
    if args.e2e_frames:
        e2e = end_to_end(args.e2e_frames, args.e2e_threads)
        out.update({"e2e_threads": args.e2e_threads, "e2e_frames_per_s": round(e2e["frames_per_s"], 1),
                    "e2e_utd_achieved": round(e2e["utd_achieved"], 3)})
        sb3 = None if args.no_sb3 else stable_baselines3(args.e2e_frames, args.e2e_threads)
        if sb3 is not None:
            out.update({"sb3_frames_per_s": round(sb3["frames_per_s"], 1),
                        "e2e_over_sb3": round(e2e["frames_per_s"] / sb3["frames_per_s"], 2)})
    print(json.dumps(out))


if __name__ == "__main__":
    main()
