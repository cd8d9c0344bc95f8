"""Policy call in the worker loop: TensorDict call against the tensor-level fast path.

    python benchmarks/policy_call.py [--envs 16] [--rounds 7] [--seconds 1.0] [--cold]

See ``benchmarks/README.md``, section "Policy call in the worker loop".
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from tensordict import TensorDict
from torchrl.data import Bounded
from torchrl.envs.utils import ExplorationType, set_exploration_type

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # this checkout's package, whatever the interpreter has installed
    sys.path.insert(0, str(ROOT))

from torchrl_unilab import make_actor, make_exploration_policy  # noqa: E402
from torchrl_unilab.modules._fast_policy import tensor_policy  # noqa: E402

OBS_DIM, ACTION_DIM = 17, 6


def make_policy(algo: str):
    spec = Bounded(low=-torch.ones(ACTION_DIM), high=torch.ones(ACTION_DIM), shape=(ACTION_DIM,))
    actor = make_actor(algo, OBS_DIM, ACTION_DIM)  # the collector's default: 2 x 512, LayerNorm
    return make_exploration_policy(actor, algo, spec)


def rate(call, seconds: float, evict: torch.Tensor | None) -> float:
    calls, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        if evict is not None:
            evict.add_(1.0)  # cold caches, as after a batch of MuJoCo steps
        call()
        calls += 1
    return calls / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--seconds", type=float, default=1.0)
    parser.add_argument("--cold", action="store_true", help="evict the caches before each call")
    args = parser.parse_args()
    torch.set_num_threads(1)
    evict = torch.zeros(4 * 1024 * 1024) if args.cold else None  # 16 MiB
    out = {"benchmark": "policy_call", "envs": args.envs, "cold": args.cold, "rounds": args.rounds}
    obs = torch.randn(args.envs, OBS_DIM)
    for algo in ("sac", "td3"):
        policy = make_policy(algo)
        fast = tensor_policy(policy)
        assert fast is not None, f"the fast path does not cover the {algo} exploration policy"
        td = TensorDict({"observation": obs, "is_init": torch.zeros(args.envs, 1, dtype=torch.bool)}, [args.envs])
        values = {"observation": obs, "is_init": torch.zeros(args.envs, 1, dtype=torch.bool)}
        variants = {"tensordict": lambda: policy(td.clone(False)), "fast": lambda: fast(dict(values))}
        rates: dict[str, list[float]] = {name: [] for name in variants}
        with torch.no_grad(), set_exploration_type(ExplorationType.RANDOM):
            for call in variants.values():
                rate(call, 0.2, evict)  # warm-up
            for _ in range(args.rounds):
                for name, call in variants.items():
                    rates[name].append(rate(call, args.seconds, evict))
        medians = {name: statistics.median(values) for name, values in rates.items()}
        ratio = medians["fast"] / medians["tensordict"]
        print(f"{algo}: TensorDict call {medians['tensordict']:.0f}/s, fast path {medians['fast']:.0f}/s, "
              f"ratio {ratio:.2f}")
        out[algo] = {"tensordict_calls_s": round(medians["tensordict"], 1),
                     "fast_calls_s": round(medians["fast"], 1), "ratio": round(ratio, 3)}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
