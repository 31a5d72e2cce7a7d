"""Clusters of NodeResourceTopology documents for the tests, made with allocator.nrt.build_nrt (as the proxy
publishes them) from regular synthetic machines."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from allocator.cpuset import CPUSet
from allocator.nrt import build_nrt
from allocator.topology import CPUInfo, Topology


def machine(numa_nodes: int, cores_per_numa: int, threads: int = 2) -> Topology:
    """NUMA node n = socket n; cores numbered across the machine; thread t of core k is cpu k + t * total cores."""
    total_cores = numa_nodes * cores_per_numa
    cpus = []
    for t in range(threads):
        for k in range(total_cores):
            n = k // cores_per_numa
            cpus.append(CPUInfo(cpu=k + t * total_cores, core=k, socket=n, numa=n, uncore=n))
    dist = {a: tuple(10 if a == b else 21 for b in range(numa_nodes)) for a in range(numa_nodes)}
    return Topology(cpus=tuple(cpus), numa_nodes=tuple(range(numa_nodes)), numa_distances=dist)


def nrt(name: str, topo: Topology, *, policy: str = "single-numa-node", scope: str = "container",
        reserved: str = "0", busy: str = "", cpu_options: dict[str, str] | None = None,
        labels: dict[str, str] | None = None, version: str | None = None) -> dict[str, Any]:
    reserved_set = CPUSet.parse(reserved) if reserved else CPUSet()
    busy_set = CPUSet.parse(busy) if busy else CPUSet()
    return build_nrt(name, topo, free_cpus=topo.all_cpus - reserved_set - busy_set, reserved_cpus=reserved_set,
                     topology_manager_policy=policy, topology_manager_scope=scope,
                     cpu_manager_policy_options=cpu_options, labels=labels,
                     attributes={"numapinStateVersion": version} if version else None)


def node_doc(name: str, labels: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}}


def write_docs(path: Path, docs: list[dict[str, Any]]) -> None:
    tmp = path.with_name("." + path.name + ".tmp")
    tmp.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    tmp.replace(path)


def write_cluster(directory: Path) -> None:
    """w-0: 2 NUMA x 14 cores x 2 threads (28 CPUs per NUMA node; CPUs 0 and 28, both threads of core 0, reserved:
    26 allocatable on NUMA 0, 28 on NUMA 1), single-numa-node; w-1: same machine, best-effort, pod scope; w-2:
    4 NUMA x 4 cores x 2 threads, restricted with full-pcpus-only, CPUs 0 and 16 reserved, 1-3 busy."""
    big = machine(2, 14)
    small = machine(4, 4)
    write_docs(directory / "w-0.yaml", [nrt("w-0", big, reserved="0,28"), node_doc("w-0", {"pool": "big"})])
    write_docs(directory / "w-1.yaml", [nrt("w-1", big, policy="best-effort", scope="pod", reserved="0,28"),
                                        node_doc("w-1", {"pool": "big"})])
    write_docs(directory / "w-2.json.yaml", [nrt("w-2", small, policy="restricted", reserved="0,16", busy="1-3",
                                                 cpu_options={"full-pcpus-only": "true"}),
                                             node_doc("w-2", {"pool": "small"})])
