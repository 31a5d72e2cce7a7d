"""An independent, deliberately plain reference of kubelet's memory hint rules, for the differential tests.

Written from kubelet's rules (docs: ../shared/reference/kubelet-memory.md, "Hints"), not from numapin's code: masks
as sorted tuples from itertools.combinations, sums recomputed every time, no shared helpers with allocator.memory.
"""

from __future__ import annotations

from itertools import combinations
from typing import Any


def _table(machine: Any, node: int, resource: str, field: str) -> int:
    t = machine[node].memory.get(resource)
    return 0 if t is None else getattr(t, field)


def reference_hints(machine: Any, requested: dict[str, int], reusable: dict[tuple[int, ...], dict[str, int]]
                    ) -> dict[str, list[tuple[tuple[int, ...], bool]]]:
    nodes = sorted(machine)
    every = [combo for k in range(1, len(nodes) + 1) for combo in combinations(nodes, k)]

    def enough(combo: tuple[int, ...], field: str, extra: dict[str, int]) -> bool:
        return all(sum(_table(machine, n, r, field) for n in combo) + extra.get(r, 0) >= q
                   for r, q in requested.items())

    by_allocatable = [c for c in every if enough(c, "allocatable", {})]
    smallest = min((len(c) for c in by_allocatable), default=len(nodes))
    kept = []
    for combo in by_allocatable:
        if len(combo) == 1:
            if len(machine[combo[0]].cells) > 1:
                continue
        else:
            broken = False
            for n in combo:
                if machine[n].assignments > 0:
                    cells = tuple(sorted(machine[n].cells))
                    if len(cells) == 1 or cells != combo:
                        broken = True
            if broken:
                continue
        if enough(combo, "free", reusable.get(combo, {})):
            kept.append((combo, len(combo) == smallest))
    if not kept:
        return {}
    return {r: list(kept) for r in requested}


Hint = tuple[tuple[int, ...], bool]


def reference_best(hints: list[Hint], within: tuple[int, ...]) -> Hint | None:
    """kubelet's findBestHint over the hints containing ``within``: preferred first, then fewer nodes, then the
    numerically smaller mask."""
    candidates = [h for h in hints if set(within) <= set(h[0])]
    if not candidates:
        return None
    return min(candidates, key=lambda h: (not h[1], len(h[0]), sum(1 << n for n in h[0])))
