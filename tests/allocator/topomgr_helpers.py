"""Helpers for the topology-manager tests: synthetic topologies, a kubelet-style CPU hint enumerator
(the literal 2^N loop, to check hint families against) and a small real CPU provider."""

from __future__ import annotations

from typing import Any

from allocator.bitmask import bits_of, iterate_masks
from allocator.compact_hints import HintFamily, cpu_hint_family
from allocator.cpuset import CPUSet
from allocator.hints import TopologyHint
from allocator.pod import ContainerInfo, PodInfo, guaranteed_cpus, pod_guaranteed_cpus
from allocator.state import CPUState
from allocator.topology import Topology


def make_topology(sockets: int, numa_per_socket: int, cores_per_numa: int, threads: int = 2,
                  cpu_less: int = 0, distances: bool = True) -> Topology:
    """CPUs numbered thread-major (cpu = t * ncores + core), like most x86 machines. ``cpu_less`` extra
    NUMA nodes without CPUs (memory-only / GPU memory) are appended after the CPU nodes."""
    ncores = sockets * numa_per_socket * cores_per_numa
    cpus = []
    for core in range(ncores):
        numa = core // cores_per_numa
        socket = numa // numa_per_socket
        for t in range(threads):
            cpus.append({"cpu": t * ncores + core, "core": core, "socket": socket, "numa": numa,
                         "uncore": numa})
    nnodes = sockets * numa_per_socket + cpu_less
    data: dict[str, Any] = {"cpus": cpus, "numaNodes": list(range(nnodes))}
    if distances:
        data["numaDistances"] = {
            str(a): [10 if a == b else (12 if a // max(numa_per_socket, 1) == b // max(numa_per_socket, 1)
                                        else 32) for b in range(nnodes)]
            for a in range(nnodes)
        }
    return Topology.from_dict(data)


def kubelet_cpu_hints(topology: Topology, available: CPUSet, reusable: CPUSet, request: int,
                      align_by_socket: bool = False) -> list[TopologyHint]:
    """kubelet's generateCPUTopologyHints, literally: every CPU-NUMA mask by size then lexicographically."""
    nodes = topology.cpu_numa_nodes
    min_affinity = len(nodes)
    hints: list[int] = []
    for mask in iterate_masks(nodes):
        in_mask = topology.cpus_in_numas(bits_of(mask))
        if len(in_mask) >= request and mask.bit_count() < min_affinity:
            min_affinity = mask.bit_count()
        matching = 0
        ok = True
        for c in reusable:
            if not mask >> topology.cpu(c).numa & 1:
                ok = False
                break
            matching += 1
        if not ok:
            continue
        matching += sum(1 for c in available if mask >> topology.cpu(c).numa & 1)
        if matching >= request:
            hints.append(mask)
    out = []
    for m in hints:
        preferred = m.bit_count() == min_affinity
        if align_by_socket and not preferred:
            per_socket = len(topology.cpu_numa_nodes) // topology.num_sockets
            if per_socket:
                min_sockets = (min_affinity + per_socket - 1) // per_socket
                sockets = {topology.cpu(topology.cpus_in_numa(n).min()).socket for n in bits_of(m)}
                preferred = len(sockets) == min_sockets
        out.append(TopologyHint(frozenset(bits_of(m)), preferred))
    return out


class SimpleCPUProvider:
    """A real (small) CPU hint provider over CPUState: hints from ``cpu_hint_family`` (materialised on
    small machines), allocation of the lowest free CPUs inside the affinity (anywhere without one)."""

    def __init__(self, topology: Topology, *, compact: bool = False) -> None:
        self.topology = topology
        self.compact = compact

    def _hints(self, state: CPUState, request: int) -> dict[str, Any] | None:
        if request == 0:
            return None
        fam = cpu_hint_family(self.topology, state.default_cpuset, CPUSet(), request)
        assert fam is not None
        if self.compact:
            return {"cpu": fam}
        return {"cpu": fam.hints()}

    def topology_hints(self, state: CPUState, pod: PodInfo, container_name: str) -> dict[str, Any] | None:
        c = pod.container(container_name)
        if state.get(pod.uid, c.name) is not None:
            return None
        return self._hints(state, guaranteed_cpus(pod, c))

    def pod_topology_hints(self, state: CPUState, pod: PodInfo) -> dict[str, Any] | None:
        return self._hints(state, pod_guaranteed_cpus(pod))

    def allocate(self, state: CPUState, pod: PodInfo, container_name: str, affinity: TopologyHint | None) -> CPUSet:
        from allocator.errors import AllocationError

        c = pod.container(container_name)
        n = guaranteed_cpus(pod, c)
        if n == 0:
            return state.default_cpuset
        free = state.default_cpuset
        if affinity is not None and affinity.numa is not None:
            aligned = free & self.topology.cpus_in_numas(affinity.numa)
            if len(aligned) >= n:
                free = aligned
        if len(free) < n:
            raise AllocationError(f"not enough cpus available to satisfy request: requested={n}, "
                                  f"available={len(free)}")
        cpus = CPUSet(free.sorted()[:n])
        state.default_cpuset = state.default_cpuset - cpus
        state.set(pod.uid, c.name, cpus)
        return cpus


def pod(name: str, *cpus: int, init: tuple[int, ...] = ()) -> PodInfo:
    containers = tuple(ContainerInfo(f"init{i}", "init", n * 1000, n * 1000, 1 << 30, 1 << 30)
                       for i, n in enumerate(init))
    containers += tuple(ContainerInfo(f"c{i}", "app", n * 1000, n * 1000, 1 << 30, 1 << 30)
                        for i, n in enumerate(cpus))
    return PodInfo(uid=f"uid-{name}", namespace="default", name=name, qos_class="Guaranteed", cpu_manager=None,
                   bypass=False, containers=containers)


def family_of(hints: Any) -> HintFamily:
    assert isinstance(hints, HintFamily)
    return hints
