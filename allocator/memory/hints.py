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
reach and each resource gets a ``HintFamily`` instead (allocator.compact_hints): the masks of nodes outside
multi-node groups whose free bytes of that resource reach the request, preferred at the narrowest width whose
allocatable bytes could hold every resource. That family misses kubelet's step 3 for nodes allocated alone (the
allocation checks it, see allocator.memory.policy) and judges each resource on its own: docs/memory.md.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..bitmask import bits_of, iterate_masks, mask_of
from ..compact_hints import HintFamily
from ..hints import TopologyHint
from .requests import Requests
from .state import Block, MemoryState

__all__ = ["LIST_MAX_NODES", "Reusable", "calculate_hints", "feasible", "min_width", "regenerate_hints"]

LIST_MAX_NODES = 8
Reusable = Mapping[int, Mapping[str, int]]  # NUMA mask -> resource -> reusable bytes

MemoryHints = dict[str, list[TopologyHint] | HintFamily]


def _sum(state: MemoryState, bits: list[int], resource: str, attr: str) -> int:
    return sum(getattr(state.machine[n].table(resource), attr) for n in bits)


def min_width(state: MemoryState, requested: Requests) -> int:
    """Narrowest mask width whose allocatable bytes hold every resource (kubelet's minAffinitySize; the node count
    when none does). Exact by enumeration on small machines, by the greedy per-resource bound above."""
    nodes = sorted(state.machine)
    if len(nodes) <= LIST_MAX_NODES:
        for m in iterate_masks(nodes):
            bits = bits_of(m)
            if all(_sum(state, bits, r, "allocatable") >= q for r, q in requested.items()):
                return len(bits)
        return len(nodes)
    width = 1
    for r, q in requested.items():
        alloc = sorted((state.machine[n].table(r).allocatable for n in nodes), reverse=True)
        total, k = 0, 0
        for a in alloc:
            if total >= q and k:
                break
            total += a
            k += 1
        width = max(width, k if total >= q else len(nodes))
    return width


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
        return _families(state, requested)
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


def _families(state: MemoryState, requested: Requests) -> MemoryHints:
    nodes = sorted(state.machine)
    universe = mask_of(n for n in nodes if len(state.machine[n].cells) <= 1)
    width = min_width(state, requested)
    out: MemoryHints = {}
    for r, q in requested.items():
        fam = HintFamily(universe=universe, weights=tuple((n, state.machine[n].table(r).free) for n in nodes),
                         threshold=q, preferred_size=width)
        if fam.is_empty():
            return {}
        out[r] = fam
    return out


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
