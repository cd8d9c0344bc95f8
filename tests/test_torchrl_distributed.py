"""TorchRL's torch.distributed collectors run OffPolicyCollector on their nodes, on one machine over gloo.

The runs are ``benchmarks/torchrl_distributed.py``'s: each in a process group of its own with a timeout, with
TorchRL's own ``launcher="mp"``, real worker processes and real envs.
"""

from __future__ import annotations

import json

import torchrl_distributed


def test_distributed_rpc_and_sync_collectors_collect_with_our_class_and_weights_reach_its_workers(capsys):
    """DistributedCollector and RPCCollector send the learner's weights through their schemes; the node's
    OffPolicyCollector publishes them to its workers. DistributedSyncCollector collects (TorchRL's class has no
    weight update of its own)."""
    assert torchrl_distributed.main(["--classes", "ours", "--timeout", "240"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert sum("with OffPolicyCollector: ok" in line for line in lines) == 3, lines
    results = json.loads(lines[-1])["results"]
    assert results["dist"]["ours"]["weights_reached"] is True
    assert results["rpc"]["ours"]["weights_reached"] is True
    assert results["sync"]["ours"]["frames"] == 64 * 9


def test_a_node_whose_collector_fails_at_construction_leaves_the_sync_driver_an_error_not_a_wait(capsys):
    """Each node's OffPolicyCollector refuses the policy in its probe, before its receiving scheme would connect;
    DistributedSyncCollector's driver raises (as with TorchRL's class, whose node fails at its first batch) instead
    of waiting at its rendezvous for the node."""
    assert torchrl_distributed.main(["--failing-node", "--only", "sync", "--classes", "ours", "--timeout", "300"]) == 0
    lines = capsys.readouterr().out.splitlines()
    result = json.loads(lines[-1])["results"]["sync"]["ours"]
    assert result["status"] == "ok" and result["raised"], result
