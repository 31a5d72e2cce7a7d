"""The static policy's NUMA hints for memory (kubelet's calculateHints and regenerateHints).

A NUMA mask is a hint for a request when, in this order (kubelet's):
1. its summed *allocatable* bytes reach the request for every resource (else skipped); the narrowest width that
   passes this step is remembered for ``preferred``;
2. a single-node mask whose node belongs to a multi-node group is skipped;
3. a multi-node mask is skipped when one of its nodes holding assignments is allocated alone, or in another group;
4. its summed *free* bytes (plus the pod's reusable init-container bytes on exactly that mask) reach the request
   for every resource.
Every requested resource gets the same list; a hint is preferred when its width equals the width of step 1. No
mask at all gives an empty mapping (the topology manager reads it as "no preference", as kubelet's empty map).

Masks are visited as kubelet visits them (every subset, by size, then lexicographically), on machines up to
``LIST_MAX_NODES`` NUMA nodes (kubelet's own limit by default is 8). Above that, listing 2^N masks is out of
reach, and so is merging per-resource hint families of different weights with the CPU family (the merge's exact
family search explodes with several weighted families): every resource gets the same bounded list instead
(``_large_hints``): the feasible single nodes (exactly kubelet's single-node hints, so ``single-numa-node`` decides
as kubelet would), the feasible existing groups, and narrowest covers among the nodes holding no assignment.
Wider masks kubelet would also list are left out; the allocation extends a hint as kubelet does when needed
(docs/memory.md).
"""

from __future__ import annotations

from collections.abc import Mapping

from ..bitmask import bits_of, iterate_masks, mask_of
from ..hints import TopologyHint
from .cover import narrowest_cover
from .requests import Requests
from .state import Block, MemoryState

__all__ = ["LIST_MAX_NODES", "Reusable", "calculate_hints", "feasible", "min_width", "regenerate_hints"]

LIST_MAX_NODES = 8
Reusable = Mapping[int, Mapping[str, int]]  # NUMA mask -> resource -> reusable bytes

MemoryHints = dict[str, list[TopologyHint]]


def _sum(state: MemoryState, bits: list[int], resource: str, attr: str) -> int:
    return sum(getattr(state.machine[n].table(resource), attr) for n in bits)


def min_width(state: MemoryState, requested: Requests) -> int:
    """Narrowest mask width whose allocatable bytes hold every resource (kubelet's minAffinitySize; the node count
    when none does): by enumeration on small machines, by the narrowest cover (allocator.memory.cover) on large
    ones; the same number either way."""
    nodes = sorted(state.machine)
    if len(nodes) <= LIST_MAX_NODES:
        for m in iterate_masks(nodes):
            bits = bits_of(m)
            if all(_sum(state, bits, r, "allocatable") >= q for r, q in requested.items()):
                return len(bits)
        return len(nodes)
    amounts = {r: {n: state.machine[n].table(r).allocatable for n in nodes} for r in requested}
    found = narrowest_cover(nodes, (), amounts, requested)
    return found.bit_count() if found else len(nodes)


def feasible(state: MemoryState, bits: list[int], requested: Requests, reusable: Reusable) -> bool:
    """Steps 2-4 of the module doc for one mask (step 1 is checked by the caller)."""
    single = len(bits) == 1
    if single and len(state.machine[bits[0]].cells) > 1:
        return False
    if not single:
        for n in bits:
            ns = state.machine[n]
            if ns.assignments > 0 and (len(ns.cells) == 1 or sorted(ns.cells) != bits):
                return False
    mask = mask_of(bits)
    extra = reusable.get(mask, {})
    return all(_sum(state, bits, r, "free") + extra.get(r, 0) >= q for r, q in requested.items())


def calculate_hints(state: MemoryState, requested: Requests, reusable: Reusable) -> MemoryHints:
    """kubelet's calculateHints (module doc). ``requested`` must not be empty."""
    nodes = sorted(state.machine)
    if len(nodes) > LIST_MAX_NODES:
        return _large_hints(state, requested, reusable)
    width = len(nodes)
    found: list[list[int]] = []
    for m in iterate_masks(nodes):
        bits = bits_of(m)
        if any(_sum(state, bits, r, "allocatable") < q for r, q in requested.items()):
            continue
        width = min(width, len(bits))
        if feasible(state, bits, requested, reusable):
            found.append(bits)
    if not found:
        return {}
    hints = [TopologyHint(frozenset(b), len(b) == width) for b in found]
    return {r: list(hints) for r in requested}


def _large_hints(state: MemoryState, requested: Requests, reusable: Reusable) -> MemoryHints:
    """A bounded list on machines too large to enumerate (module doc): the feasible single nodes, the feasible
    existing groups, and among nodes holding no assignment, for every such node the narrowest set containing it
    whose free bytes hold the request, plus all of those nodes together. Preferred = as narrow as the narrowest
    mask by allocatable (exact)."""
    nodes = sorted(state.machine)
    width = min_width(state, requested)
    masks: list[int] = []

    def fits_allocatable(bits: list[int]) -> bool:
        return all(_sum(state, bits, r, "allocatable") >= q for r, q in requested.items())

    for n in nodes:
        if fits_allocatable([n]) and feasible(state, [n], requested, reusable):
            masks.append(1 << n)
    groups = sorted({tuple(sorted(ns.cells)) for ns in state.machine.values()
                     if ns.assignments > 0 and len(ns.cells) > 1})
    for g in groups:
        if fits_allocatable(list(g)) and feasible(state, list(g), requested, reusable):
            masks.append(mask_of(g))
    unused = [n for n in nodes if state.machine[n].assignments == 0]
    if len(unused) >= 2:
        amounts = {r: {n: state.machine[n].table(r).free for n in unused} for r in requested}
        covers = {narrowest_cover(unused, (a,), amounts, requested, min_size=2) for a in unused}
        everything = mask_of(unused)
        if all(_sum(state, unused, r, "free") >= q for r, q in requested.items()):
            covers.add(everything)
        covers.discard(0)
        masks.extend(sorted(covers, key=lambda m: (m.bit_count(), m)))
    if not masks:
        return {}
    seen: set[int] = set()
    hints: list[TopologyHint] = []
    for m in sorted(masks, key=lambda m: (m.bit_count(), m)):
        if m not in seen:
            seen.add(m)
            hints.append(TopologyHint(frozenset(bits_of(m)), m.bit_count() == width))
    return {r: list(hints) for r in requested}


def regenerate_hints(blocks: tuple[Block, ...], requested: Requests) -> dict[str, list[TopologyHint]] | None:
    """kubelet's regenerateHints for a container that already has blocks: each block's mask as a preferred hint of
    its resource; None (no preference) when the blocks do not match the request (count, type or size)."""
    hints: dict[str, list[TopologyHint]] = {r: [] for r in requested}
    if len(blocks) != len(requested):
        return None
    for b in blocks:
        if b.resource not in requested or b.size != requested[b.resource]:
            return None
        hints[b.resource].append(TopologyHint(frozenset(b.numa), True))
    return hints
