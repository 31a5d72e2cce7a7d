"""The topology manager's merge with kubelet's Memory Manager in it: prints one JSON document on stdout.

    python benchmarks/bench_memory_merge.py [--quick]

At 8 and 64 NUMA nodes (4 cores x 2 threads, 64Gi and huge pages of 2Mi and 1Gi on every node, 100Mi reserved),
on a node already holding random pods (some of them spread over several nodes, so groups exist), for a Guaranteed
pod asking CPUs, memory and both huge-page sizes (that fits one node, and that needs two), per topology-manager
policy:
- ``merge``: the merge of the CPU provider's hints with the memory provider's (memory, hugepages-2Mi,
  hugepages-1Gi): the target is a worst median under 5 ms;
- ``hints_and_merge``: the providers' hint generation plus the merge.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from allocator.errors import AllocationError
from allocator.hints import TopologyHint
from allocator.memory import MachineMemory, MemoryPolicy, MemoryState
from allocator.pod import ContainerInfo, PodInfo
from allocator.state import CPUState
from allocator.static_policy import StaticPolicy
from allocator.topology import Topology
from allocator.topology_manager import new_policy
from benchmarks.timing import stats as _stats
from benchmarks.timing import time_runs as _time

GI = 1 << 30
MI = 1 << 20
TARGET_MS = 5.0


def topology(nodes: int, cores: int = 4) -> Topology:
    cpus = []
    total = nodes * cores
    for core in range(total):
        for t in range(2):
            cpus.append({"cpu": t * total + core, "core": core, "socket": core // cores * 2 // nodes,
                         "numa": core // cores, "uncore": core // cores})
    return Topology.from_dict({"cpus": cpus, "numaNodes": list(range(nodes))})


def _pod(uid: str, cpus: int, memory: int, small: int, large: int) -> PodInfo:
    c = ContainerInfo("app", "app", cpus * 1000, cpus * 1000, memory, memory,
                      (("hugepages-1Gi", large), ("hugepages-2Mi", small)))
    return PodInfo(uid, "bench", uid, "Guaranteed", None, False, (c,))


def node(nodes: int, seed: int) -> tuple[StaticPolicy, CPUState, MemoryPolicy, MemoryState]:
    topo = topology(nodes)
    cpu_policy = StaticPolicy(topo, num_reserved_cpus=2)
    cpu_state = CPUState()
    cpu_policy.start(cpu_state)
    machine = MachineMemory.uniform(range(nodes), 64 * GI, ((2 * MI, 1024), (GI, 8)))
    mem_policy = MemoryPolicy(machine, {0: {"memory": 100 * MI}})
    mem_state = MemoryState()
    mem_policy.start(mem_state)
    rng = random.Random(seed)
    for i in range(nodes):  # about one pod per NUMA node, a few spread over 2-3 nodes
        p = _pod(f"fill-{i}", rng.choice((1, 2)), rng.choice((8, 16, 70)) * GI, rng.choice((0, 64)) * MI,
                 rng.choice((0, GI)))
        first = rng.randrange(nodes)
        width = 1 if (p.containers[0].memory_request or 0) <= 60 * GI else 2
        affinity = TopologyHint(frozenset(range(first, min(first + width, nodes))), False)
        try:
            mem_policy.allocate(mem_state, p, "app", affinity)
            cpu_policy.allocate(cpu_state, p, "app", affinity)
        except AllocationError:
            pass
    return cpu_policy, cpu_state, mem_policy, mem_state


def section(nodes: int, runs: int) -> dict[str, Any]:
    cpu_policy, cpu_state, mem_policy, mem_state = node(nodes, seed=nodes)
    out: dict[str, Any] = {}
    for label, pod in (("fits_one_node", _pod("probe", 2, 16 * GI, 64 * MI, GI)),
                       ("needs_two_nodes", _pod("probe", 2, 100 * GI, 64 * MI, GI))):
        cpu_hints = cpu_policy.topology_hints(cpu_state, pod, "app")
        mem_hints = mem_policy.topology_hints(mem_state, pod, "app")
        for tm in ("best-effort", "restricted", "single-numa-node"):
            policy = new_policy(tm, tuple(range(nodes)))
            providers = [cpu_hints, mem_hints]
            hint, admit = policy.merge(providers)

            def both(tm_policy: Any = policy, pod: PodInfo = pod) -> Any:
                return tm_policy.merge([cpu_policy.topology_hints(cpu_state, pod, "app"),
                                        mem_policy.topology_hints(mem_state, pod, "app")])

            out[f"{label}/{tm}"] = {
                "merge": _stats(_time(lambda p=policy, pr=providers: p.merge(pr), runs)),
                "hints_and_merge": _stats(_time(both, runs)),
                "result": {"numa": sorted(hint.numa or ()), "preferred": hint.preferred, "admit": admit},
                "memory_hints": type(mem_hints.get("memory")).__name__ if mem_hints else "none",
            }
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer runs")
    args = ap.parse_args()
    runs = 20 if args.quick else 200
    doc: dict[str, Any] = {"python": platform.python_version(), "machine": platform.machine(), "runs": runs,
                           "target_worst_median_ms": TARGET_MS}
    worst = 0.0
    for nodes in (8, 64):
        sec = section(nodes, runs)
        doc[f"numa_{nodes}"] = sec
        worst = max(worst, *(v["merge"]["p50_ms"] for v in sec.values()))
    doc["worst_merge_median_ms"] = worst
    doc["ok"] = worst < TARGET_MS
    print(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
