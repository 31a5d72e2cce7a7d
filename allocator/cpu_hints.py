"""The static policy's CPU topology hints (kubelet's generateCPUTopologyHints), exact.

Every non-empty set of the NUMA nodes that hold CPUs is tried, by size then in lexicographic order
(kubelet's bitmask.IterateBitMasks). A set becomes a hint when no reusable CPU lies outside it and its
reusable plus available CPUs cover the request. Afterwards a hint is preferred when its width equals
the narrowest width whose *capacity* (all its CPUs, free or not) could hold the request, i.e. the
narrowest that would fit on an empty node. With ``align-by-socket`` a hint is also preferred when the
sockets it spans are as few as that narrowest width needs.

NUMA nodes without CPUs never appear in CPU hints (kubelet iterates the CPUs' NUMA nodes only).
This walks all 2^N - 1 sets: fine up to 8-10 NUMA nodes; a compact variant for many NUMA nodes lives
with the topology manager.
"""

from __future__ import annotations

import itertools

from .cpuset import CPUSet
from .hints import TopologyHint
from .topology import Topology

__all__ = ["generate_cpu_hints"]


def generate_cpu_hints(
    topology: Topology,
    available: CPUSet,
    reusable: CPUSet,
    request: int,
    align_by_socket: bool = False,
) -> list[TopologyHint]:
    """kubelet's hint list for ``request`` CPUs given the ``available`` and ``reusable`` CPUs.

    ``available`` and ``reusable`` are counted separately (a CPU in both counts twice, as in kubelet);
    CPUs that are not on this machine are ignored.
    """
    nodes = topology.cpu_numa_nodes
    capacity = {n: len(topology.cpus_in_numa(n)) for n in nodes}
    free = {n: len(available & topology.cpus_in_numa(n)) for n in nodes}
    reusable_nodes: set[int] = set()
    reusable_count = 0
    for n in nodes:
        k = len(reusable & topology.cpus_in_numa(n))
        if k:
            reusable_nodes.add(n)
            reusable_count += k

    min_affinity = len(nodes)
    found: list[tuple[int, ...]] = []
    for size in range(1, len(nodes) + 1):
        for combo in itertools.combinations(nodes, size):
            if size < min_affinity and sum(capacity[n] for n in combo) >= request:
                min_affinity = size
            if not reusable_nodes.issubset(combo):
                continue
            if reusable_count + sum(free[n] for n in combo) < request:
                continue
            found.append(combo)

    min_sockets = 0
    numa_per_socket = len(nodes) // topology.num_sockets if topology.num_sockets else 0
    if align_by_socket and numa_per_socket:
        min_sockets = (min_affinity + numa_per_socket - 1) // numa_per_socket

    hints = []
    for combo in found:
        preferred = len(combo) == min_affinity
        if min_sockets and len(topology.sockets_of_numas(combo)) == min_sockets:
            preferred = True
        hints.append(TopologyHint(frozenset(combo), preferred))
    return hints
