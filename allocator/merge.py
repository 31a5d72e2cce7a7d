"""kubelet's topology-manager hint merge, exact, without walking the cross product.

kubelet (``HintMerger.Merge``) walks every permutation of the providers' hint lists, ANDs each
permutation's masks with the machine's NUMA mask, and keeps the best merged hint with ``compare``.
``compare`` is a total order on the candidates (checked by the differential tests against the literal
reference in ``tests/allocator/merge_reference.py``):

- a preferred candidate beats every non-preferred one;
- preferred candidates: fewer NUMA nodes, then (``prefer-closest-numa-nodes``) the smaller sum of pairwise
  distances, then the numerically smaller mask;
- non-preferred candidates, with ``B`` = the largest "narrowest hint" width over the lists: width ``B``
  first, then widths ``B-1 .. 1``, then ``B+1 ..``; within one width as above;
- an empty merged mask is never a candidate; with no candidate at all the result is the default mask,
  non-preferred.

So the result is the maximum of that order over the *set* of reachable (mask, preferred) pairs and the
order of permutations does not matter. This module finds it directly:

1. preferred: a merged hint is preferred iff every hint is preferred and every non-nil mask is the same
   mask ``X``. The candidates are the masks ``X`` every list offers as a preferred hint (or covers with a
   preferred "don't care"). That is an intersection of sets, linear in the number of hints.
2. otherwise every reachable non-empty AND is a (non-preferred) candidate: the reachable set is computed
   by a subset-sum (zeta/Möbius) transform over the NUMA subsets for small machines, or by a DP over the
   reachable masks, and the best one by the order above is taken.
3. ``HintFamily`` lists (allocator.compact_hints: every mask ⊇ R inside a universe whose weights reach a
   threshold) are never enumerated: their reachable ANDs form an up-set described by which nodes the
   families can drop, so only the best width has to be searched, with an exact feasibility oracle.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from operator import add, mul

from .bitmask import MAX_NUMA_ID, bits_of
from .compact_hints import HintFamily
from .errors import ConfigError
from .hints import TopologyHint

__all__ = ["POLICIES", "ProviderHints", "merge_hints"]

POLICIES = ("none", "best-effort", "restricted", "single-numa-node")

Hints = Sequence[TopologyHint] | HintFamily
ProviderHints = Mapping[str, Hints | None] | None

# kubelet parses boolean options with Go's strconv.ParseBool.
_TRUE = ("1", "t", "T", "TRUE", "true", "True")
_FALSE = ("0", "f", "F", "FALSE", "false", "False")

# Largest machine on which the all-explicit merge uses the 2^N subset transform.
_ZETA_MAX_NODES = 12
# Largest machine on which families are listed when explicit lists are long too.
_LIST_FAMILIES_MAX_NODES = 8


@dataclass(frozen=True, slots=True)
class _Explicit:
    """One filtered hint list: what it can contribute to an AND and to a preferred merge."""

    masks: frozenset[int]  # non-zero masks ANDed with the default mask (nil -> default)
    raw_pref: frozenset[int]  # raw masks of its preferred non-nil hints
    nil_pref: bool  # offers {nil, preferred}
    narrowest: int  # bit count of its narrowest non-nil hint, 0 when it has none
    size: int  # number of hints (0: the cross product is empty)


_List = _Explicit | HintFamily


def _explicit(hints: Iterable[tuple[int | None, bool]], default: int) -> _Explicit:
    masks: set[int] = set()
    raw_pref: set[int] = set()
    nil_pref = False
    narrowest = 0
    size = 0
    for m, p in hints:
        size += 1
        if m is None:
            masks.add(default)
            nil_pref = nil_pref or p
            continue
        c = m.bit_count()
        if narrowest == 0 or c < narrowest:
            narrowest = c
        if m & default:
            masks.add(m & default)
        if p:
            raw_pref.add(m)
    return _Explicit(frozenset(masks), frozenset(raw_pref), nil_pref, narrowest, size)


def _filter(providers: Sequence[ProviderHints], default: int) -> list[_List]:
    """kubelet's filterProvidersHints: nil/empty provider -> {nil, true}; nil resource -> {nil, true};
    empty resource list -> {nil, false}; otherwise the list (or family) as given."""
    out: list[_List] = []
    for i, hints in enumerate(providers):
        if hints is not None and not isinstance(hints, Mapping):
            raise TypeError(f"provider {i}: hints must be a mapping of resource to hints or None")
        if not hints:
            out.append(_explicit([(None, True)], default))
            continue
        for resource, res_hints in hints.items():
            if res_hints is None:
                out.append(_explicit([(None, True)], default))
            elif isinstance(res_hints, HintFamily):
                if res_hints.is_empty():
                    out.append(_explicit([(None, False)], default))
                else:
                    if res_hints.universe & ~default:
                        raise ConfigError(
                            f"resource {resource!r}: hint family covers NUMA nodes that are not on this machine"
                        )
                    out.append(res_hints)
            elif len(res_hints) == 0:
                out.append(_explicit([(None, False)], default))
            else:
                out.append(_explicit(((None if h.numa is None else h.mask, h.preferred) for h in res_hints),
                                     default))
    return out


def _single_numa_filter(lst: _List, default: int) -> _Explicit:
    """single-numa-node: keep only {nil, preferred} and preferred one-node hints."""
    if isinstance(lst, HintFamily):
        keep = [(1 << n, True) for n in bits_of(lst.universe)
                if lst.contains(1 << n) and lst.is_preferred(1 << n)]
        return _explicit(keep, default)
    keep2: list[tuple[int | None, bool]] = [(m, True) for m in lst.raw_pref if m.bit_count() == 1]
    if lst.nil_pref:
        keep2.append((None, True))
    return _explicit(keep2, default)


class _Order:
    """kubelet's compare() as sort keys (smaller key = better)."""

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


def merge_hints(
    providers: Sequence[ProviderHints],
    *,
    policy: str,
    numa_nodes: Sequence[int],
    distances: Mapping[int, Sequence[int]] | None = None,
    options: Mapping[str, str] | None = None,
) -> tuple[TopologyHint, bool]:
    """Merge the providers' hints as kubelet's topology manager does; returns (best hint, admit).

    ``providers``: one entry per hint provider, None (no preference) or {resource: None | hints}, where
    hints is a list of TopologyHint (``[]`` = cannot be satisfied) or a ``HintFamily``. ``numa_nodes``:
    the machine's NUMA node ids (the default mask). ``distances[n]``: distances from node n to every node
    of ``numa_nodes`` in that order (needed with ``prefer-closest-numa-nodes``).
    """
    options = options or {}  # other options (max-allowable-numa-nodes) do not change the merge
    if policy not in POLICIES:
        raise ConfigError(f"unknown topology manager policy {policy!r}: expected one of {', '.join(POLICIES)}")
    default = 0
    for n in numa_nodes:
        if not isinstance(n, int) or isinstance(n, bool) or n < 0 or n > MAX_NUMA_ID:
            raise ConfigError(f"NUMA node id {n!r} is out of range: ids must be 0..{MAX_NUMA_ID}")
        default |= 1 << n
    if not default:
        raise ConfigError("numa_nodes must list at least one NUMA node")
    if policy == "none":
        return TopologyHint(None, False), True
    closest_opt = str(options.get("prefer-closest-numa-nodes", "false")).strip()
    if closest_opt not in _TRUE and closest_opt not in _FALSE:
        raise ConfigError(f"prefer-closest-numa-nodes must be true or false, got {closest_opt!r}")
    single = policy == "single-numa-node"
    closest = closest_opt in _TRUE and not single
    if closest:
        _check_distances(numa_nodes, distances)

    lists = _filter(providers, default)
    if single:
        lists = [_single_numa_filter(lst, default) for lst in lists]
    mask, preferred = _merge(lists, default, numa_nodes, distances, closest)
    if single and mask == default:
        hint = TopologyHint(None, preferred)
    else:
        hint = TopologyHint(frozenset(bits_of(mask)), preferred)
    admit = True if policy == "best-effort" else preferred
    return hint, admit


def _check_distances(numa_nodes: Sequence[int], distances: Mapping[int, Sequence[int]] | None) -> None:
    if distances is None:
        raise ConfigError("prefer-closest-numa-nodes needs the NUMA distances of the machine")
    for n in numa_nodes:
        row = distances.get(n)
        if row is None or len(row) != len(numa_nodes):
            raise ConfigError(f"NUMA distances must give node {n} one distance per NUMA node ({len(numa_nodes)})")


def _merge(lists: list[_List], default: int, numa_nodes: Sequence[int],
           distances: Mapping[int, Sequence[int]] | None, closest: bool) -> tuple[int, bool]:
    if any(isinstance(lst, _Explicit) and lst.size == 0 for lst in lists):
        return default, False  # an empty list: no permutation at all
    best_count = 0
    for lst in lists:
        c = lst.narrowest if isinstance(lst, _Explicit) else lst.min_count()
        best_count = max(best_count, c)
    order = _Order(numa_nodes, distances, closest, best_count)
    explicit = [lst for lst in lists if isinstance(lst, _Explicit)]
    families = [lst for lst in lists if isinstance(lst, HintFamily)]
    if families and default.bit_count() <= _LIST_FAMILIES_MAX_NODES and any(len(e.masks) > 16 for e in explicit):
        # small machine, long explicit lists: listing the families and taking the subset-transform path is
        # cheaper than one family search per AND of the explicit lists
        explicit += [_explicit(((h.mask, h.preferred) for h in f.hints()), default) for f in families]
        families = []

    pref = _best_preferred(explicit, families, default, order)
    if pref is not None:
        return pref, True
    if families:
        from .family_merge import best_nonpreferred_with_families

        best = best_nonpreferred_with_families(
            _reachable([e.masks for e in explicit], default), families, default, order)
    else:
        reach = _reachable([e.masks for e in explicit], default)
        best = min(reach, key=order.nonpreferred_key) if reach else None
    if best is None:
        return default, False
    return best, False


def _best_preferred(explicit: list[_Explicit], families: list[HintFamily], default: int,
                    order: _Order) -> int | None:
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
        from .family_merge import best_common_preferred

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
