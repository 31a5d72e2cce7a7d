"""The narrowest set of NUMA nodes whose amounts cover a request, without visiting 2^N masks.

Used on machines with more NUMA nodes than the hint lists enumerate (allocator.memory.hints.LIST_MAX_NODES):
among the masks holding ``required`` and otherwise made of ``candidates``, the one with the fewest nodes, and of
those the numerically smallest (kubelet's ``IsNarrowerThan``), whose summed amounts reach the request for every
resource. Sizes are tried upwards from a lower bound; within one size the subsets are walked in increasing
numeric order (colexicographic: the largest node first), pruning every branch whose best possible sums fall short,
so the first subset found is the answer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import cache

__all__ = ["narrowest_cover"]


def narrowest_cover(
    candidates: Sequence[int],
    required: Sequence[int],
    amounts: Mapping[str, Mapping[int, int]],
    need: Mapping[str, int],
    min_size: int = 1,
) -> int:
    """The mask (0 if none): ``required`` plus the fewest ``candidates`` (then the numerically smallest choice)
    whose ``amounts[resource][node]`` sum to at least ``need[resource]`` for every resource, with at least
    ``min_size`` nodes in all."""
    req = sorted(set(required))
    rest = sorted(set(candidates) - set(req))
    resources = list(need)
    base = [need[r] - sum(amounts[r].get(n, 0) for n in req) for r in resources]
    values = [[amounts[r].get(n, 0) for r in resources] for n in rest]
    if any(b > sum(v[i] for v in values) for i, b in enumerate(base)):
        return 0

    @cache
    def top(prefix: int, j: int, i: int) -> int:
        """The largest sum of ``j`` amounts of resource ``i`` among the first ``prefix`` candidates."""
        return sum(sorted((values[x][i] for x in range(prefix)), reverse=True)[:j])

    def search(prefix: int, j: int, short: list[int]) -> list[int] | None:
        """The numerically smallest ``j``-subset of rest[:prefix] covering ``short`` (indices ascending)."""
        if j == 0:
            return [] if all(s <= 0 for s in short) else None
        if any(s > 0 and top(prefix, j, i) < s for i, s in enumerate(short)):
            return None
        for last in range(j - 1, prefix):  # the largest member, smallest first: increasing numeric order
            left = [s - values[last][i] for i, s in enumerate(short)]
            found = search(last, j - 1, left)
            if found is not None:
                return [*found, last]
        return None

    lower = max(min_size - len(req), 0)
    for i, b in enumerate(base):  # the per-resource greedy bound: fewer candidates cannot reach it
        k, total = 0, 0
        for v in sorted((v[i] for v in values), reverse=True):
            if total >= b:
                break
            total += v
            k += 1
        lower = max(lower, k)
    for j in range(lower, len(rest) + 1):
        if j == 0 and not req:
            continue
        found = search(len(rest), j, list(base))
        if found is not None:
            mask = 0
            for n in req:
                mask |= 1 << n
            for x in found:
                mask |= 1 << rest[x]
            return mask
    return 0
