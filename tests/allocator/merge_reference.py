"""A straightforward, exhaustive merge that follows kubelet's topology manager step by step.

It walks the whole cross product of every provider's hints and keeps the best merged hint with kubelet's
``compare`` case analysis (HintMerger), written out literally. It is the oracle for the differential tests
of ``allocator.merge.merge_hints`` and is only usable where the cross product is small.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import product

from allocator.hints import TopologyHint

Providers = Sequence[Mapping[str, Sequence[TopologyHint] | None] | None]


def filter_providers(providers: Providers) -> list[list[tuple[int | None, bool]]]:
    """kubelet's filterProvidersHints, with masks as ints (None = no affinity)."""
    out: list[list[tuple[int | None, bool]]] = []
    for hints in providers:
        if not hints:
            out.append([(None, True)])
            continue
        for resource_hints in hints.values():
            if resource_hints is None:
                out.append([(None, True)])
            elif len(resource_hints) == 0:
                out.append([(None, False)])
            else:
                out.append([(None if h.numa is None else h.mask, h.preferred) for h in resource_hints])
    return out


def reference_merge(
    providers: Providers,
    *,
    policy: str,
    numa_nodes: Sequence[int],
    distances: Mapping[int, Sequence[int]] | None = None,
    options: Mapping[str, str] | None = None,
) -> tuple[TopologyHint, bool]:
    options = options or {}
    if policy == "none":
        return TopologyHint(None, False), True
    default = 0
    for n in numa_nodes:
        default |= 1 << n
    index = {n: i for i, n in enumerate(numa_nodes)}
    lists = filter_providers(providers)
    single = policy == "single-numa-node"
    if single:
        lists = [[(m, p) for (m, p) in lst if p and (m is None or m.bit_count() == 1)] for lst in lists]
    closest = (not single) and options.get("prefer-closest-numa-nodes") == "true"

    def avg_distance(mask: int) -> float:
        nodes = [n for n in numa_nodes if mask >> n & 1]
        total = 0.0
        cnt = 0.0
        for a in nodes:
            for b in nodes:
                total += float(distances[a][index[b]])  # type: ignore[index]
                cnt += 1
        return total / cnt if cnt else 0.0

    def narrower(a: int, b: int) -> bool:
        if a.bit_count() == b.bit_count():
            return a < b
        return a.bit_count() < b.bit_count()

    def compare_masks(current: tuple[int, bool], candidate: tuple[int, bool]) -> tuple[int, bool]:
        cur, cand = current[0], candidate[0]
        if cur == cand:
            return current
        if closest:
            if cur.bit_count() != cand.bit_count():
                best = cur if narrower(cur, cand) else cand
            else:
                dc, dn = avg_distance(cur), avg_distance(cand)
                if dc == dn:
                    best = cur if cur < cand else cand
                else:
                    best = cur if dc < dn else cand
        else:
            best = cur if narrower(cur, cand) else cand
        return current if best == cur else candidate

    # bestNonPreferredAffinityCount: max over lists of the narrowest non-nil hint's count.
    best_count = 0
    for lst in lists:
        narrowest: int | None = None
        for m, _ in lst:
            if m is None:
                continue
            if narrowest is None or narrower(m, narrowest):
                narrowest = m
        if narrowest is not None and narrowest.bit_count() > best_count:
            best_count = narrowest.bit_count()

    def compare(current: tuple[int, bool] | None, candidate: tuple[int, bool]) -> tuple[int, bool] | None:
        if candidate[0].bit_count() == 0:
            return current
        if current is None:
            return candidate
        if not current[1] and candidate[1]:
            return candidate
        if current[1] and not candidate[1]:
            return current
        if current[1] and candidate[1]:
            return compare_masks(current, candidate)
        cc, nc = current[0].bit_count(), candidate[0].bit_count()
        if cc > best_count:
            return compare_masks(current, candidate)
        if cc == best_count:
            if nc != best_count:
                return current
            return compare_masks(current, candidate)
        if nc > best_count:
            return current
        if nc == best_count:
            return candidate
        if nc > cc:
            return candidate
        if nc < cc:
            return current
        return compare_masks(current, candidate)

    best: tuple[int, bool] | None = None
    for perm in product(*lists):
        preferred = True
        merged = default
        first: int | None = None
        for m, p in perm:
            if m is not None:
                merged &= m
                if first is None:
                    first = m
                elif m != first:
                    preferred = False
            if not p:
                preferred = False
        best = compare(best, (merged, preferred))
    if best is None:
        best = (default, False)
    mask, preferred = best
    if single and mask == default:
        hint = TopologyHint(None, preferred)
    else:
        hint = TopologyHint(frozenset(n for n in range(64) if mask >> n & 1), preferred)
    admit = True if policy == "best-effort" else preferred
    return hint, admit
