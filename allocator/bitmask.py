"""NUMA affinity masks as plain ints (bit n = NUMA node n), with kubelet's BitMask rules.

kubelet keeps NUMA affinities in a 64-bit mask; numapin uses Python ints with the same meaning and the same
limit (NUMA ids 0..63). Ordering rules follow kubelet's ``bitmask`` package:

- ``is_narrower_than(a, b)``: fewer bits set wins; on equal counts the numerically smaller mask wins
  ("more lower-numbered bits").
- ``iterate_masks(nodes)``: every non-empty subset of ``nodes``, by increasing size, and within one size in
  lexicographic order of the (ascending) node lists, exactly as kubelet's ``IterateBitMasks`` emits them.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from itertools import combinations

from .errors import ConfigError

__all__ = [
    "MAX_NUMA_ID",
    "bits_of",
    "count",
    "is_narrower_than",
    "iterate_masks",
    "mask_of",
    "masks_of_size",
]

MAX_NUMA_ID = 63


def mask_of(nodes: Iterable[int]) -> int:
    """The mask of ``nodes``; ConfigError for an id outside 0..63 (kubelet's BitMask limit). The one NUMA-id
    check of the allocator."""
    m = 0
    for n in nodes:
        if not isinstance(n, int) or isinstance(n, bool) or n < 0 or n > MAX_NUMA_ID:
            raise ConfigError(f"NUMA node id {n!r} is out of range: ids must be 0..{MAX_NUMA_ID}")
        m |= 1 << n
    return m


def count(mask: int) -> int:
    """Number of NUMA nodes in ``mask``."""
    return mask.bit_count()


def bits_of(mask: int) -> list[int]:
    """The node ids in ``mask``, ascending."""
    out: list[int] = []
    while mask:
        low = mask & -mask
        out.append(low.bit_length() - 1)
        mask ^= low
    return out


def is_narrower_than(a: int, b: int) -> bool:
    """kubelet's ``IsNarrowerThan``: fewer nodes, or as many nodes and numerically smaller."""
    ca, cb = a.bit_count(), b.bit_count()
    if ca == cb:
        return a < b
    return ca < cb


def masks_of_size(nodes: Iterable[int], size: int) -> Iterator[int]:
    """Every subset of ``nodes`` with ``size`` members, in lexicographic order of the sorted node lists."""
    ordered = sorted(set(nodes))
    for combo in combinations(ordered, size):
        m = 0
        for n in combo:
            m |= 1 << n
        yield m


def iterate_masks(nodes: Iterable[int]) -> Iterator[int]:
    """Every non-empty subset of ``nodes``: by size, then lexicographically (kubelet's IterateBitMasks)."""
    ordered = sorted(set(nodes))
    for size in range(1, len(ordered) + 1):
        yield from masks_of_size(ordered, size)
