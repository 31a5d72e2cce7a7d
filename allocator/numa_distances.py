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


def check_numa_distances(numa_nodes: Sequence[int], distances: DistanceTable) -> dict[int, tuple[int, ...]]:
    """The table with int keys and tuple rows; ConfigError unless every node has one distance per node."""
    table: dict[int, tuple[int, ...]] = {}
    for k, row in distances.items():
        try:
            table[int(k)] = tuple(int(x) for x in row)
        except (TypeError, ValueError):
            raise ConfigError(f"NUMA distances of node {k!r} must be integers, got {row!r}") from None
    for n in numa_nodes:
        checked = table.get(n)
        if checked is None or len(checked) != len(numa_nodes):
            raise ConfigError(f"NUMA distances must give node {n} one distance per NUMA node ({len(numa_nodes)})")
    return table
