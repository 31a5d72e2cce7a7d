"""The static policy's CPU topology hints (kubelet's generateCPUTopologyHints), exact.

Every non-empty set of the NUMA nodes that hold CPUs is tried, by size then in lexicographic order
(kubelet's bitmask.IterateBitMasks). A set becomes a hint when no reusable CPU lies outside it and its
reusable plus available CPUs cover the request. Afterwards a hint is preferred when its width equals
the narrowest width whose *capacity* (all its CPUs, free or not) could hold the request, i.e. the
narrowest that would fit on an empty node. With ``align-by-socket`` a hint is also preferred when the
sockets it spans are as few as that narrowest width needs.

NUMA nodes without CPUs never appear in CPU hints (kubelet iterates the CPUs' NUMA nodes only).
All 2^N - 1 sets are walked (their CPU totals come from a dynamic programme over the subset bitmask):
fine up to ~16 NUMA nodes; a compact variant for many more lives with the topology manager.
"""

from __future__ import annotations

import functools
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
    n = len(nodes)
    if n == 0:
        return []
    cap = [len(topology.cpus_in_numa(node)) for node in nodes]
    free = [len(available & topology.cpus_in_numa(node)) for node in nodes]
    reusable_mask = 0
    reusable_count = 0
    for i, node in enumerate(nodes):
        k = len(reusable & topology.cpus_in_numa(node))
        if k:
            reusable_mask |= 1 << i
            reusable_count += k

    # per-subset totals by dynamic programming over the subset bitmask (bit i = i-th CPU NUMA node)
    size = 1 << n
    cap_sum = [0] * size
    free_sum = [0] * size
    for mask in range(1, size):
        low = mask & -mask
        i = low.bit_length() - 1
        rest = mask ^ low
        cap_sum[mask] = cap_sum[rest] + cap[i]
        free_sum[mask] = free_sum[rest] + free[i]

    # minAffinitySize: the narrowest subset whose capacity (free or not) could hold the request
    min_affinity = n
    for mask in range(1, size):
        width = mask.bit_count()
        if width < min_affinity and cap_sum[mask] >= request:
            min_affinity = width

    min_sockets = 0
    numa_per_socket = n // topology.num_sockets if topology.num_sockets else 0
    if align_by_socket and numa_per_socket:
        min_sockets = (min_affinity + numa_per_socket - 1) // numa_per_socket

    hints = []
    need = request - reusable_count
    for mask, members in _subsets(nodes):
        if mask & reusable_mask != reusable_mask or free_sum[mask] < need:
            continue
        preferred = len(members) == min_affinity
        if min_sockets and len(topology.sockets_of_numas(members)) == min_sockets:
            preferred = True
        hints.append(TopologyHint(members, preferred))
    return hints


@functools.lru_cache(maxsize=16)
def _subsets(nodes: tuple[int, ...]) -> tuple[tuple[int, frozenset[int]], ...]:
    """Every non-empty subset of the NUMA nodes, by size then lexicographically (kubelet's IterateBitMasks),
    as (bitmask over positions in ``nodes``, node ids)."""
    out: list[tuple[int, frozenset[int]]] = []
    for k in range(1, len(nodes) + 1):
        for combo in itertools.combinations(range(len(nodes)), k):
            m = 0
            for i in combo:
                m |= 1 << i
            out.append((m, frozenset(nodes[i] for i in combo)))
    return tuple(out)
