"""TorchRL's torch.distributed collectors with ``collector_class=OffPolicyCollector``, on one machine over gloo.

Run::

    python benchmarks/torchrl_distributed.py [--only dist,rpc,sync] [--classes ours,torchrl] [--timeout 150]
    python benchmarks/torchrl_distributed.py --failing-node [--only sync] [--classes ours,torchrl]

See ``benchmarks/README.md``, section "TorchRL's torch.distributed collectors, our class on the node".
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile
from pathlib import Path

import torch
from common import first_error, run_in_own_group, with_pythonpath
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModuleBase

REPO_ROOT = Path(__file__).resolve().parents[1]
KINDS = ("dist", "rpc", "sync")
CLASSES = ("ours", "torchrl")
LABELS = {"ours": "OffPolicyCollector", "torchrl": "MultiAsyncCollector"}
FRAMES_PER_BATCH, BATCHES, UPDATE_AFTER = 64, 9, 2


def pendulum():
    from torchrl.envs import GymEnv

    return GymEnv("Pendulum-v1")


#: Set to the driver's pid by a ``--failing-node`` run: processes with another pid are the nodes (and theirs).
DRIVER_PID = "TORCHRL_DISTRIBUTED_DRIVER_PID"


def counting_env():
    from torchrl.testing.mocking_classes import CountingEnv

    return CountingEnv()


class TwoElementsOnNodes(TensorDictModuleBase):
    """A policy whose action has the action spec's one element in the driver (whose pseudo-collector lays out
    the batches) and two on the nodes: both classes' nodes fail (ours in its probe at construction, TorchRL's
    when ``CountingEnv`` adds the action to its count), and the driver should raise."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.tensor(1.0))
        self.in_keys, self.out_keys = [], ["action"]

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        on_node = os.environ.get(DRIVER_PID) != str(os.getpid())
        shape = torch.Size([*tensordict.shape, *((2,) if on_node else ())])
        return tensordict.set("action", self.weight.expand(shape).clone())


def failing_child(kind: str, class_name: str, port: int) -> dict:
    """One ``--failing-node`` run, in this process: prints how long the driver took to raise, and its error."""
    import time

    from torchrl.collectors import MultiAsyncCollector
    from torchrl.collectors.distributed import DistributedCollector, DistributedSyncCollector, RPCCollector

    from torchrl_unilab import OffPolicyCollector

    os.environ[DRIVER_PID] = str(os.getpid())
    collector_cls = {"dist": DistributedCollector, "rpc": RPCCollector, "sync": DistributedSyncCollector}[kind]
    kwargs = dict(collector_class=OffPolicyCollector if class_name == "ours" else MultiAsyncCollector,
                  num_workers_per_collector=1, frames_per_batch=FRAMES_PER_BATCH,
                  total_frames=FRAMES_PER_BATCH * BATCHES, launcher="mp", tcp_port=str(port))
    start = time.monotonic()
    collector = None
    try:
        collector = collector_cls([counting_env], TwoElementsOnNodes(), **kwargs)
        result = {"raised": None, "batches": sum(1 for _ in collector)}
    except Exception as err:
        result = {"raised": " ".join(f"{type(err).__name__}: {err}".split())[:300]}
    # Printed before the shutdown: TorchRL's RPCCollector, whose constructor raised, leaves its RPC agent to the
    # interpreter's exit, which waits for the node.
    print(json.dumps(result | {"seconds": round(time.monotonic() - start, 1)}), flush=True)
    if collector is not None:
        collector.shutdown()
    return result


def child(kind: str, class_name: str, port: int) -> dict:
    """One run, in this process: what it collected and whether the published weights reached the workers."""
    import time

    import torch
    from tensordict.nn import TensorDictModule
    from torchrl.collectors import MultiAsyncCollector
    from torchrl.collectors.distributed import DistributedCollector, DistributedSyncCollector, RPCCollector

    from torchrl_unilab import OffPolicyCollector

    torch.manual_seed(0)
    policy = TensorDictModule(torch.nn.Sequential(torch.nn.Linear(3, 1), torch.nn.Tanh()), ["observation"],
                              ["action"])
    collector_cls = {"dist": DistributedCollector, "rpc": RPCCollector, "sync": DistributedSyncCollector}[kind]
    kwargs = dict(collector_class=OffPolicyCollector if class_name == "ours" else MultiAsyncCollector,
                  num_workers_per_collector=1, frames_per_batch=FRAMES_PER_BATCH,
                  total_frames=FRAMES_PER_BATCH * BATCHES, launcher="mp", tcp_port=str(port))
    if kind == "dist":
        kwargs["sync"] = False
    start = time.monotonic()
    collector = collector_cls([pendulum], policy, **kwargs)
    actions = []
    updates = kind != "sync"
    try:
        for batch in collector:
            actions.append(batch["action"].clone())
            if len(actions) == UPDATE_AFTER and updates:
                with torch.no_grad():
                    for p in policy.parameters():
                        p.zero_()
                    policy.module[0].bias.fill_(0.5)
                collector.update_policy_weights_()
    finally:
        collector.shutdown()
    target = torch.tanh(torch.tensor(0.5))
    reached = any(torch.allclose(a, target) for a in actions[UPDATE_AFTER:]) if updates else None
    return {"batches": len(actions), "frames": sum(a.numel() for a in actions), "weights_reached": reached,
            "seconds": round(time.monotonic() - start, 1)}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run(kind: str, class_name: str, timeout: float, workdir: Path, failing_node: bool = False) -> dict:
    """One run in its own process group: the child's figures, or how it failed. With ``failing_node``, ``ok``
    means that the driver raised."""
    log = workdir / f"{kind}_{class_name}.log"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--failing-child" if failing_node else "--child", kind,
           class_name, str(free_port())]
    env = with_pythonpath(REPO_ROOT)
    outcome = run_in_own_group(cmd, workdir, env, log, timeout)
    output = log.read_text(errors="replace")
    lines = [line for line in output.splitlines() if line.startswith("{")]
    if failing_node and lines:  # the driver's error came; its process may still hang at exit (TorchRL's RPC shutdown)
        figures = json.loads(lines[-1])
        exit_note = f"hung at exit, killed after {timeout:.0f} s" if outcome.timed_out else "exited"
        return {"status": "ok" if figures["raised"] else "failed", **figures, "exit": exit_note}
    if outcome.timed_out:
        return {"status": "failed", "error": f"timeout after {timeout:.0f} s (a hang; killed)"}
    if outcome.returncode != 0 or not lines:
        return {"status": "failed", "error": first_error(output) or f"exit {outcome.returncode}"}
    figures = json.loads(lines[-1])
    ok = figures["batches"] == BATCHES and figures["weights_reached"] is not False
    return {"status": "ok" if ok else "failed", **figures}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=",".join(KINDS), help=f"comma-separated, of {', '.join(KINDS)}")
    parser.add_argument("--classes", default=",".join(CLASSES), help=f"comma-separated, of {', '.join(CLASSES)}")
    parser.add_argument("--timeout", type=float, default=150.0, help="seconds per run before its group is killed")
    parser.add_argument("--failing-node", action="store_true",
                        help="each node's collector fails (its policy's action has two elements where CountingEnv's "
                             "spec has one; the driver's has one): a run is ok when the driver raises")
    parser.add_argument("--child", nargs=3, metavar=("KIND", "CLASS", "PORT"), help=argparse.SUPPRESS)
    parser.add_argument("--failing-child", nargs=3, metavar=("KIND", "CLASS", "PORT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child[0], args.child[1], int(args.child[2]))), flush=True)
        return 0
    if args.failing_child:
        failing_child(args.failing_child[0], args.failing_child[1], int(args.failing_child[2]))
        return 0
    kinds = [k for k in args.only.split(",") if k]
    classes = [c for c in args.classes.split(",") if c]
    for name, given, accepted in (("--only", kinds, KINDS), ("--classes", classes, CLASSES)):
        unknown = sorted(set(given) - set(accepted))
        if unknown:
            parser.error(f"{name}: unknown {unknown}; accepted: {', '.join(accepted)}")
    results: dict[str, dict[str, dict]] = {}
    weights = {True: "weights reached", None: "no update (TorchRL's collector has none)"}
    with tempfile.TemporaryDirectory(prefix="torchrl_distributed_") as tmp:
        for kind in kinds:
            for class_name in classes:
                result = run(kind, class_name, args.timeout, Path(tmp), args.failing_node)
                results.setdefault(kind, {})[class_name] = result
                if args.failing_node:
                    outcome = (f"ok, the driver raised after {result['seconds']:.0f} s ({result['exit']}): "
                               f"{result['raised'][:160]}" if result["status"] == "ok"
                               else f"FAILED: {result.get('error') or result}")
                else:
                    outcome = (f"ok (batches {result['batches']}, {weights[result['weights_reached']]}, "
                               f"{result['seconds']:.0f} s)" if result["status"] == "ok"
                               else f"FAILED: {result.get('error') or result}")
                print(f"{kind} with {LABELS[class_name]}: {outcome}", flush=True)
    print(json.dumps({"benchmark": "torchrl_distributed", "failing_node": args.failing_node, "results": results}),
          flush=True)
    ours_ok = all(r["ours"]["status"] == "ok" or r.get("torchrl", {}).get("status") == "failed"
                  for r in results.values() if "ours" in r)
    return 0 if ours_ok else 1


if __name__ == "__main__":
    sys.exit(main())
