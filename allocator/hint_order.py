"""kubelet's ``HintMerger.compare`` as sort keys: which merged NUMA mask is the best (smaller key = better).

- preferred candidates: fewer NUMA nodes, then (``prefer-closest-numa-nodes``) the smaller sum of pairwise
  distances, then the numerically smaller mask;
- non-preferred candidates, with ``best_count`` = the largest "narrowest hint" width over the hint lists:
  width ``best_count`` first, then ``best_count - 1 .. 1``, then ``best_count + 1 ..``; within one width as
  above.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from .bitmask import bits_of

__all__ = ["HintOrder"]


class HintOrder:
    """The order of one merge (machine, distances, whether distances count, the best non-preferred width)."""

    __slots__ = ("best_count", "closest", "dist")

    def __init__(self, numa_nodes: Sequence[int], distances: Mapping[int, Sequence[int]] | None,
                 closest: bool, best_count: int) -> None:
        self.closest = closest
        self.best_count = best_count
        self.dist: dict[int, dict[int, int]] = {}
        if closest and distances is not None:
            for a in numa_nodes:
                row = distances[a]
                self.dist[a] = {b: int(row[i]) for i, b in enumerate(numa_nodes)}

    def dsum(self, mask: int) -> int:
        # kubelet compares average distances over all ordered pairs; at equal widths that is the sum.
        nodes = bits_of(mask)
        total = 0
        for a in nodes:
            row = self.dist[a]
            for b in nodes:
                total += row[b]
        return total

    def rank(self, count: int) -> int:
        b = self.best_count
        if count <= b:
            return b - count
        return count

    def preferred_key(self, mask: int) -> tuple[int, int, int]:
        return (mask.bit_count(), self.dsum(mask) if self.closest else 0, mask)

    def nonpreferred_key(self, mask: int) -> tuple[int, int, int]:
        return (self.rank(mask.bit_count()), self.dsum(mask) if self.closest else 0, mask)
