"""The topology-manager merge mechanism: kubelet's ``filterProvidersHints`` and ``HintMerger.Merge``, exact,
without walking the cross product. What a policy does with it (which hints it keeps, whether distances count,
whether the result admits the pod) lives in that policy's own module, allocator/topology_manager/policy_*.py.

kubelet (``HintMerger.Merge``) walks every permutation of the providers' hint lists, ANDs each
permutation's masks with the machine's NUMA mask, and keeps the best merged hint with ``compare``
(allocator.hint_order, a total order on the candidates; checked by the differential tests against the literal
reference in ``tests/allocator/merge_reference.py``). An empty merged mask is never a candidate; with no
candidate at all the result is the default mask, non-preferred.

So the result is the maximum of that order over the *set* of reachable (mask, preferred) pairs and the
order of permutations does not matter. ``best_hint`` finds it directly:

1. preferred: a merged hint is preferred iff every hint is preferred and every non-nil mask is the same
   mask ``X``. The candidates are the masks ``X`` every list offers as a preferred hint (or covers with a
   preferred "don't care"). That is an intersection of sets, linear in the number of hints.
2. otherwise every reachable non-empty AND is a (non-preferred) candidate: the reachable set is computed
   by a subset-sum (zeta/Möbius) transform over the NUMA subsets for small machines, or by a DP over the
   reachable masks, and the best one by the order above is taken.
3. ``HintFamily`` lists (allocator.compact_hints: every mask ⊇ R inside a universe whose weights reach a
   threshold) are never enumerated: their reachable ANDs form an up-set described by which nodes the
   families can drop, so only the best width has to be searched, with an exact feasibility oracle
   (allocator.family_merge).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from operator import add, mul

from .bitmask import bits_of
from .compact_hints import HintFamily
from .errors import ConfigError
from .family_merge import best_common_preferred, best_nonpreferred_with_families
from .hint_order import HintOrder
from .hints import TopologyHint

__all__ = [
    "ExplicitHints",
    "HintList",
    "Hints",
    "ProviderHints",
    "best_hint",
    "explicit_hints",
    "filter_providers_hints",
    "hint_of_mask",
]

Hints = Sequence[TopologyHint] | HintFamily
ProviderHints = Mapping[str, Hints | None] | None

# Largest machine on which the all-explicit merge uses the 2^N subset transform.
_ZETA_MAX_NODES = 12
# Largest machine on which families are listed when explicit lists are long too.
_LIST_FAMILIES_MAX_NODES = 8


@dataclass(frozen=True, slots=True)
class ExplicitHints:
    """One filtered hint list: what it can contribute to an AND and to a preferred merge."""

    masks: frozenset[int]  # non-zero masks ANDed with the default mask (nil -> default)
    raw_pref: frozenset[int]  # raw masks of its preferred non-nil hints
    nil_pref: bool  # offers {nil, preferred}
    narrowest: int  # bit count of its narrowest non-nil hint (an empty mask counts: 0), 0 when it has none
    size: int  # number of hints (0: the cross product is empty)


HintList = ExplicitHints | HintFamily


def explicit_hints(hints: Iterable[tuple[int | None, bool]], default: int) -> ExplicitHints:
    """A list of ``(mask or None, preferred)`` hints on a machine whose NUMA nodes are ``default``."""
    masks: set[int] = set()
    raw_pref: set[int] = set()
    nil_pref = False
    narrowest: int | None = None  # kubelet's narrowestHint: an empty (non-nil) mask counts, with 0 nodes
    size = 0
    for m, p in hints:
        size += 1
        if m is None:
            masks.add(default)
            nil_pref = nil_pref or p
            continue
        c = m.bit_count()
        if narrowest is None or c < narrowest:
            narrowest = c
        if m & default:
            masks.add(m & default)
        if p:
            raw_pref.add(m)
    return ExplicitHints(frozenset(masks), frozenset(raw_pref), nil_pref, narrowest or 0, size)


def filter_providers_hints(providers: Sequence[ProviderHints], default: int) -> list[HintList]:
    """kubelet's filterProvidersHints: nil/empty provider -> {nil, true}; nil resource -> {nil, true};
    empty resource list -> {nil, false}; otherwise the list (or family) as given."""
    out: list[HintList] = []
    for i, hints in enumerate(providers):
        if hints is not None and not isinstance(hints, Mapping):
            raise TypeError(f"provider {i}: hints must be a mapping of resource to hints or None")
        if not hints:
            out.append(explicit_hints([(None, True)], default))
            continue
        for resource, res_hints in hints.items():
            if res_hints is None:
                out.append(explicit_hints([(None, True)], default))
            elif isinstance(res_hints, HintFamily):
                if res_hints.is_empty():
                    out.append(explicit_hints([(None, False)], default))
                else:
                    if res_hints.universe & ~default:
                        raise ConfigError(
                            f"resource {resource!r}: hint family covers NUMA nodes that are not on this machine"
                        )
                    out.append(res_hints)
            elif len(res_hints) == 0:
                out.append(explicit_hints([(None, False)], default))
            else:
                out.append(explicit_hints(((None if h.numa is None else h.mask, h.preferred) for h in res_hints),
                                          default))
    return out


def hint_of_mask(mask: int, preferred: bool) -> TopologyHint:
    return TopologyHint(frozenset(bits_of(mask)), preferred)


def best_hint(lists: Sequence[HintList], *, numa_nodes: Sequence[int], default: int,
              distances: Mapping[int, Sequence[int]] | None, closest: bool) -> tuple[int, bool]:
    """kubelet's ``HintMerger.Merge``: the best merged (mask, preferred) over every permutation of the lists.

    ``default`` is the machine's NUMA mask (the nodes of ``numa_nodes``); ``closest``: compare equally wide
    masks by NUMA distance (``distances[n]`` in ``numa_nodes`` order) before comparing them as numbers."""
    if not default:
        return 0, False  # no NUMA node: nothing merges to a non-empty mask, the default hint is the answer
    if any(isinstance(lst, ExplicitHints) and lst.size == 0 for lst in lists):
        return default, False  # an empty list: no permutation at all
    best_count = 0
    for lst in lists:
        c = lst.narrowest if isinstance(lst, ExplicitHints) else lst.min_count()
        best_count = max(best_count, c)
    order = HintOrder(numa_nodes, distances, closest, best_count)
    explicit = [lst for lst in lists if isinstance(lst, ExplicitHints)]
    families = [lst for lst in lists if isinstance(lst, HintFamily)]
    if families and default.bit_count() <= _LIST_FAMILIES_MAX_NODES and any(len(e.masks) > 16 for e in explicit):
        # small machine, long explicit lists: listing the families and taking the subset-transform path is
        # cheaper than one family search per AND of the explicit lists
        explicit += [explicit_hints(((h.mask, h.preferred) for h in f.hints()), default) for f in families]
        families = []

    pref = _best_preferred(explicit, families, default, order)
    if pref is not None:
        return pref, True
    if families:
        best = best_nonpreferred_with_families(
            _reachable([e.masks for e in explicit], default), families, default, order)
    else:
        reach = _reachable([e.masks for e in explicit], default)
        best = min(reach, key=order.nonpreferred_key) if reach else None
    if best is None:
        return default, False
    return best, False


def _best_preferred(explicit: list[ExplicitHints], families: list[HintFamily], default: int,
                    order: HintOrder) -> int | None:
    constraining = [e for e in explicit if not e.nil_pref]
    candidates: set[int]
    if constraining:
        constraining.sort(key=lambda e: len(e.raw_pref))
        candidates = set(constraining[0].raw_pref)
        for e in constraining[1:]:
            candidates &= e.raw_pref
            if not candidates:
                return None
    else:
        candidates = set()
        for e in explicit:
            candidates |= e.raw_pref
        if not families:
            candidates.add(default)  # every list chooses its preferred "don't care"
    if families:
        candidates = {x for x in candidates if all(f.contains(x) and f.is_preferred(x) for f in families)}
    merged = {x & default for x in candidates}
    merged.discard(0)
    best = min(merged, key=order.preferred_key) if merged else None
    if families and not constraining:
        found = best_common_preferred(families, default, order)
        if found is not None and (best is None or order.preferred_key(found) < order.preferred_key(best)):
            best = found
    return best


def _reachable(mask_sets: list[frozenset[int]], default: int) -> set[int]:
    """Every non-zero AND of the default mask with one mask from each set."""
    if not mask_sets:
        return {default}
    if any(not ms for ms in mask_sets):
        return set()
    n = default.bit_count()
    ordered = sorted(mask_sets, key=len)
    dp_cost = 0
    states = 1
    for ms in ordered:
        dp_cost += states * len(ms)
        states = min(states * len(ms), 1 << n)
    if n <= _ZETA_MAX_NODES and dp_cost > 4 * (len(ordered) + 1) * n * (1 << n):
        return _reachable_zeta(ordered, default)
    reach = {default}
    for ms in ordered:
        reach = {r & m for r in reach for m in ms}
        reach.discard(0)
        if not reach:
            break
    return reach


def _reachable_zeta(mask_sets: list[frozenset[int]], default: int) -> set[int]:
    """Counting version: for each subset S of the machine's nodes, the number of permutations whose AND
    contains S is the product over lists of "hints containing S" (a superset-sum transform per list);
    Möbius inversion turns that into the number whose AND is exactly S."""
    nodes = bits_of(default)
    n = len(nodes)
    size = 1 << n
    pos = {node: i for i, node in enumerate(nodes)}

    def compress(mask: int) -> int:
        c = 0
        for b in bits_of(mask):
            c |= 1 << pos[b]
        return c

    def superset_sum(f: list[int]) -> None:
        bit = 1
        while bit < size:
            for base in range(0, size, bit << 1):
                f[base:base + bit] = map(add, f[base:base + bit], f[base + bit:base + (bit << 1)])
            bit <<= 1

    total = [1] * size
    for ms in mask_sets:
        f = [0] * size
        for m in ms:
            f[compress(m)] += 1
        superset_sum(f)
        total = list(map(mul, total, f))
    bit = 1
    while bit < size:
        for base in range(0, size, bit << 1):
            total[base:base + bit] = [a - b for a, b in zip(total[base:base + bit],
                                                             total[base + bit:base + (bit << 1)], strict=True)]
        bit <<= 1
    expand = [0] * size
    for s in range(1, size):
        low = s & -s
        expand[s] = expand[s ^ low] | (1 << nodes[low.bit_length() - 1])
    return {expand[s] for s in range(1, size) if total[s]}
