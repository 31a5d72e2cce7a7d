"""The NUMA distance table check, defined once (a topology's ``numaDistances``, the distances a topology-manager
policy uses for ``prefer-closest-numa-nodes``).

``distances[n]`` lists the distances from NUMA node ``n`` to every node of ``numa_nodes``, in that order (as
sysfs ``nodeN/distance`` does).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from .errors import ConfigError

__all__ = ["DistanceTable", "check_numa_distances"]

DistanceTable = Mapping[int, Sequence[int]]


def check_numa_distances(numa_nodes: Sequence[int], distances: DistanceTable) -> None:
    """ConfigError unless every node of ``numa_nodes`` has one distance per node (O(nodes): it runs per merge)."""
    for n in numa_nodes:
        row = distances.get(n)
        if row is None or len(row) != len(numa_nodes):
            raise ConfigError(f"NUMA distances must give node {n} one distance per NUMA node ({len(numa_nodes)})")
