"""Allocator benchmarks: prints one JSON document on stdout.

    python benchmarks/allocator.py [--quick]

Sections:
- ``static_policy``: allocate + hints on a 2-socket, 8-NUMA, 384-CPU node (owned by the static-policy
  engineer: fill in ``section_static_policy``).
- ``merge_8numa_4x255``: one topology-manager merge at 8 NUMA nodes with 4 providers each offering every
  NUMA subset (255 hints, kubelet's 4.2 billion permutations), fast merge per policy; the exhaustive
  reference merge only where it can finish (3 and 4 NUMA nodes), with its per-permutation cost
  extrapolated to 8.
- ``scale``: 16, 34 (GB200-like: 2 CPU nodes + 32 GPU-memory nodes, and all-CPU) and 64 NUMA nodes, CPU +
  memory + device providers, requests that fit 1 to 4 NUMA nodes: p50/p99 of a whole pod admission through
  StaticPolicy + topology manager when StaticPolicy is available, else of hints + merge.
- ``growth``: how the time grows with the NUMA count.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from allocator.bitmask import bits_of, iterate_masks
from allocator.compact_hints import cpu_hint_family
from allocator.cpuset import CPUSet
from allocator.device_hints import device_hints
from allocator.hints import TopologyHint
from allocator.topology import Topology
from allocator.topology_manager import merge_hints
from benchmarks.timing import stats as _stats
from benchmarks.timing import time_runs as _time


def topology(cpu_nodes: int, cores_per_node: int, threads: int = 2, sockets: int = 2, cpu_less: int = 0) -> Topology:
    ncores = cpu_nodes * cores_per_node
    per_socket = max(cpu_nodes // sockets, 1)
    cpus = []
    for core in range(ncores):
        numa = core // cores_per_node
        for t in range(threads):
            cpus.append({"cpu": t * ncores + core, "core": core, "socket": min(numa // per_socket, sockets - 1),
                         "numa": numa, "uncore": numa})
    n = cpu_nodes + cpu_less

    def dist(a: int, b: int) -> int:
        if a == b:
            return 10
        if a >= cpu_nodes or b >= cpu_nodes:
            return 80
        return 12 if a // per_socket == b // per_socket else 32

    return Topology.from_dict({"cpus": cpus, "numaNodes": list(range(n)),
                               "numaDistances": {str(a): [dist(a, b) for b in range(n)] for a in range(n)}})


# -- static policy: allocate + hints on 2 sockets, 8 NUMA nodes, 384 CPUs ------------------------------
# (this section may be replaced by the static-policy engineer's own; it only uses StaticPolicy's public API)
def _pod(uid: str, cpus: int, name: str = "c") -> Any:
    from allocator.pod import ContainerInfo, PodInfo

    c = ContainerInfo(name, "app", cpus * 1000, cpus * 1000, 1 << 30, 1 << 30)
    return PodInfo(uid=uid, namespace="bench", name=uid, qos_class="Guaranteed", cpu_manager=None, bypass=False,
                   containers=(c,))


def section_static_policy(quick: bool) -> dict[str, Any]:
    """StaticPolicy on the 2-socket, 8-NUMA, 384-CPU machine (8-core L3 groups): CPU topology hints and
    allocate, per option set, filling the machine with random 1-48 CPU containers, then a whole admission
    (hints + merge + allocate) through the topology manager."""
    import copy

    from allocator.memory_hints import MemoryHintProvider
    from allocator.state import CPUState
    from allocator.static_policy import StaticPolicy
    from allocator.topology_manager import TopologyManager
    from tests.topologies import large_384

    topo = large_384()
    rng = random.Random(1)
    pods = 30 if quick else 120
    out: dict[str, Any] = {"topology": "2 sockets x 4 NUMA x 24 cores x 2 threads = 384 CPUs, 8-core L3 groups",
                           "reserved_cpus": 2, "by_options": {}}
    option_sets = {
        "default": {},
        "full-pcpus-only": {"full-pcpus-only": "true"},
        "distribute-cpus-across-numa": {"distribute-cpus-across-numa": "true"},
        "prefer-align-cpus-by-uncorecache": {"prefer-align-cpus-by-uncorecache": "true"},
    }
    for label, options in option_sets.items():
        policy = StaticPolicy(topo, num_reserved_cpus=2, options=options)
        state = CPUState()
        policy.start(state)
        hints_t: list[float] = []
        alloc_t: list[float] = []
        for i in range(pods):
            n = rng.choice([2, 4, 8, 16, 24, 48])
            pod = _pod(f"p{i}", n)
            t = time.perf_counter()
            hints = policy.topology_hints(state, pod, "c")
            hints_t.append(time.perf_counter() - t)
            if len(state.default_cpuset) < n + 2:
                break
            t = time.perf_counter()
            affinity = next((h for h in (hints or {}).get("cpu") or () if h.preferred), None)
            policy.allocate(state, pod, "c", affinity)
            alloc_t.append(time.perf_counter() - t)
        out["by_options"][label] = {"topology_hints": _stats(hints_t), "allocate": _stats(alloc_t)}
    rows = {}
    for tm_policy in ("best-effort", "single-numa-node"):
        policy = StaticPolicy(topo, num_reserved_cpus=2, topology_manager_policy=tm_policy)
        tm = TopologyManager.from_config(numa_nodes=topo.numa_nodes, policy=tm_policy, distances=topo.numa_distances)
        state = CPUState()
        policy.start(state)
        samples: list[float] = []
        for i in range(pods):
            pod = _pod(f"q{i}", rng.choice([2, 4, 8, 16, 24]))
            work, sp = state.copy(), copy.copy(policy)
            t = time.perf_counter()
            r = tm.admit(work, pod, [sp, MemoryHintProvider()])
            samples.append(time.perf_counter() - t)
            if r.admitted:
                state, policy = work, sp
        rows[tm_policy] = _stats(samples)
    out["admission_through_topology_manager"] = rows
    return out


# -- one merge at 8 NUMA nodes, 4 providers x 255 hints ----------------------------------------------
def _all_subsets(n: int, preferred: Callable[[int], bool]) -> list[TopologyHint]:
    return [TopologyHint(frozenset(bits_of(m)), preferred(m)) for m in iterate_masks(range(n))]


def _providers_8(n: int, variant: str) -> list[Any]:
    if variant == "cpu-like (narrowest preferred)":
        return [{f"r{i}": _all_subsets(n, lambda m: m.bit_count() == 1)} for i in range(4)]
    if variant == "no common preferred (widths 1,2,3,1)":
        widths = (1, 2, 3, 1)
        return [{f"r{i}": _all_subsets(n, lambda m, w=w: m.bit_count() == w)} for i, w in enumerate(widths)]
    return [{f"r{i}": _all_subsets(n, lambda m: False)} for i in range(4)]


VARIANTS = ("cpu-like (narrowest preferred)", "no common preferred (widths 1,2,3,1)", "none preferred")


def section_merge_8(quick: bool) -> dict[str, Any]:
    n = 8
    runs = 5 if quick else 30
    dist = {a: [10 if a == b else (12 if a // 4 == b // 4 else 32) for b in range(n)] for a in range(n)}
    out: dict[str, Any] = {"numa_nodes": n, "providers": 4, "hints_per_provider": 255,
                           "kubelet_permutations": 255 ** 4, "fast": {}}
    for variant in VARIANTS:
        providers = _providers_8(n, variant)
        rows = {}
        for policy in ("best-effort", "restricted", "single-numa-node"):
            for closest in ("false", "true"):
                if policy == "single-numa-node" and closest == "true":
                    continue
                opts = {"prefer-closest-numa-nodes": closest}
                hint, admit = merge_hints(providers, policy=policy, numa_nodes=list(range(n)), distances=dist,
                                          options=opts)
                key = policy + (" +prefer-closest" if closest == "true" else "")
                rows[key] = {**_stats(_time(lambda p=policy, o=opts, pr=providers: merge_hints(
                    pr, policy=p, numa_nodes=list(range(n)), distances=dist, options=o), runs)),
                    "result": str(hint), "admit": admit}
        out["fast"][variant] = rows
    out["reference"] = _reference_costs(quick)
    return out


def _reference_costs(quick: bool) -> dict[str, Any]:
    from tests.allocator.merge_reference import reference_merge

    res: dict[str, Any] = {}
    per_perm = 0.0
    for n in (3, 4):
        providers = _providers_8(n, "none preferred")
        perms = (2 ** n - 1) ** 4
        samples = _time(lambda pr=providers, k=n: reference_merge(pr, policy="best-effort",
                                                                  numa_nodes=list(range(k))), 1 if quick else 2)
        fast = _time(lambda pr=providers, k=n: merge_hints(pr, policy="best-effort", numa_nodes=list(range(k))),
                     10)
        per_perm = min(samples) / perms
        res[f"{n}_numa"] = {"permutations": perms, "reference_ms": round(min(samples) * 1000, 2),
                            "fast_ms": round(min(fast) * 1000, 3),
                            "same_result": reference_merge(providers, policy="best-effort",
                                                           numa_nodes=list(range(n)))
                            == merge_hints(providers, policy="best-effort", numa_nodes=list(range(n)))}
    res["8_numa"] = {"status": "not run: 255^4 = 4,228,250,625 permutations",
                     "extrapolated_s": round(per_perm * 255 ** 4, 1)}
    return res


# -- large machines ----------------------------------------------------------------------------------
SHAPES = {
    "16 NUMA (2 sockets x 8, 8 cores x 2 threads each)": dict(cpu_nodes=16, cores_per_node=8),
    "34 NUMA GB200-like (2 Grace nodes x 72 cores + 32 GPU-memory nodes)": dict(
        cpu_nodes=2, cores_per_node=72, threads=1, cpu_less=32),
    "34 NUMA (all with CPUs, 8 cores x 2 threads)": dict(cpu_nodes=34, cores_per_node=8),
    "64 NUMA (2 sockets x 32, 8 cores x 2 threads)": dict(cpu_nodes=64, cores_per_node=8),
}


def _one_admission(topo: Topology, rng: random.Random, fits: int, policy: str,
                   closest: bool) -> Callable[[], tuple[TopologyHint, bool]]:
    """hints (CPU family over the free CPUs, device hints for one GPU, memory None) + merge."""
    cpu_nodes = topo.cpu_numa_nodes
    per_node = len(topo.cpus_in_numa(cpu_nodes[0]))
    taken = CPUSet(c for c in topo.all_cpus if rng.random() < 0.25)
    available = topo.all_cpus - taken
    request = max(1, min(fits, len(cpu_nodes)) * per_node - per_node // 2)
    gpu_node = rng.choice(cpu_nodes)
    options = {"prefer-closest-numa-nodes": "true" if closest else "false"}

    def run() -> tuple[TopologyHint, bool]:
        cpu = cpu_hint_family(topo, available, CPUSet(), request)
        gpu = device_hints("nvidia.com/gpu", {gpu_node}, topo.numa_nodes)
        return merge_hints([{"cpu": cpu}, None, {"nvidia.com/gpu": gpu}], policy=policy,
                           numa_nodes=topo.numa_nodes, distances=topo.numa_distances, options=options)

    return run


def _prefilled(topo: Topology, rng: random.Random, policy_name: str) -> tuple[Any, Any]:
    """A StaticPolicy and its state with about a quarter of the CPUs already given to 1-8 CPU containers."""
    from allocator.state import CPUState
    from allocator.static_policy import StaticPolicy

    policy = StaticPolicy(topo, num_reserved_cpus=2, topology_manager_policy=policy_name)
    state = CPUState()
    policy.start(state)
    target = len(state.default_cpuset) * 3 // 4
    i = 0
    while len(state.default_cpuset) > target:
        free = sorted(state.default_cpuset)
        n = min(rng.randint(1, 8), len(free) - target)
        numa = topo.cpu(rng.choice(free)).numa
        policy.allocate(state, _pod(f"fill{i}", max(n, 1)), "c", TopologyHint(frozenset({numa}), True))
        i += 1
    return policy, state


def section_scale(quick: bool) -> dict[str, Any]:
    """Whole pod admissions: StaticPolicy (CPU hints as a family beyond 8 NUMA nodes) + memory + a GPU
    already bound on one NUMA node, merged and allocated through the topology manager."""
    import copy

    from allocator.device_hints import DeviceHintProvider
    from allocator.memory_hints import MemoryHintProvider
    from allocator.topology_manager import TopologyManager

    rng = random.Random(7)
    runs = 8 if quick else 80
    out: dict[str, Any] = {"measured": "whole pod admission: StaticPolicy + memory + device providers, topology "
                                       "manager merge, allocation (state copy excluded)", "shapes": {}}
    for name, shape in SHAPES.items():
        topo = topology(**shape)
        per_node = len(topo.cpus_in_numa(topo.cpu_numa_nodes[0]))
        rows: dict[str, Any] = {}
        for policy in ("best-effort", "restricted", "single-numa-node"):
            for closest in (False, True):
                if closest and policy == "single-numa-node":
                    continue
                base_policy, base_state = _prefilled(topo, rng, policy)
                tm = TopologyManager.from_config(
                    numa_nodes=topo.numa_nodes, policy=policy, distances=topo.numa_distances,
                    options={"prefer-closest-numa-nodes": "true" if closest else "false"})
                samples: list[float] = []
                results: dict[int, str] = {}
                sizes = range(1, min(4, len(topo.cpu_numa_nodes)) + 1)
                for fits in sizes:
                    request = fits * per_node - per_node // 2  # needs `fits` NUMA nodes by capacity
                    for i in range(runs // len(sizes) or 1):
                        pod = _pod(f"s{fits}-{i}", request)
                        gpu = {"c": {"nvidia.com/gpu": {rng.choice(topo.numa_nodes)}}}
                        work, sp = base_state.copy(), copy.copy(base_policy)
                        t = time.perf_counter()
                        r = tm.admit(work, pod, [sp, MemoryHintProvider(), DeviceHintProvider(gpu, topo.numa_nodes)])
                        samples.append(time.perf_counter() - t)
                        aff = r.containers[0].affinity if r.containers else None
                        results[fits] = f"{request} CPUs: {aff} admitted={r.admitted}"
                key = policy + (" +prefer-closest" if closest else "")
                rows[key] = {**_stats(samples), "example_by_nodes_needed": results}
        out["shapes"][name] = rows
    return out


def section_growth(quick: bool) -> dict[str, Any]:
    rng = random.Random(3)
    runs = 8 if quick else 40
    out: dict[str, Any] = {"measured": "p50 of CPU hint family + device hints + merge, request fitting 2 NUMA nodes"}
    for n in (2, 4, 8, 16, 24, 32, 48, 64):
        topo = topology(cpu_nodes=n, cores_per_node=8)
        row = {}
        for policy, closest in (("best-effort", False), ("best-effort", True), ("single-numa-node", False)):
            samples = []
            for _ in range(runs):
                fn = _one_admission(topo, rng, 2, policy, closest)
                samples.extend(_time(fn, 1))
            row[policy + (" +prefer-closest" if closest else "")] = _stats(samples)["p50_ms"]
        out[f"{n}_numa_p50_ms"] = row
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer runs (CI smoke)")
    parser.add_argument("--section", action="append", choices=("static_policy", "merge", "scale", "growth"),
                        help="run only these sections")
    args = parser.parse_args(argv)
    sections: dict[str, Callable[[bool], dict[str, Any]]] = {
        "static_policy": section_static_policy,
        "merge": section_merge_8,
        "scale": section_scale,
        "growth": section_growth,
    }
    report: dict[str, Any] = {"python": platform.python_version(), "machine": platform.machine(),
                              "cpus": os.cpu_count()}
    for name, fn in sections.items():
        if args.section and name not in args.section:
            continue
        t = time.perf_counter()
        report[name] = fn(args.quick)
        report[name]["section_seconds"] = round(time.perf_counter() - t, 2)
    json.dump(report, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
