"""The merge searches for hint families (allocator.compact_hints.HintFamily), never enumerating 2^N masks.

A family ``F_i`` holds every mask ``m`` with ``R_i ⊆ m ⊆ U_i`` and ``w_i(m) >= t_i``. Choosing a member is
choosing which nodes of ``U_i`` to *drop*: any set ``E ⊆ U_i \\ R_i`` with ``w_i(E) <= slack_i`` where
``slack_i = w_i(U_i) - t_i``. With ``X`` the AND reached by the explicit lists and ``V = X ∩ ⋂ U_i``, the
reachable merged masks are exactly ``V \\ (E_1 ∪ ... ∪ E_k)``. Droppable sets are closed under taking
subsets, so the reachable masks form an up-set of ``V``: every width from the narrowest reachable one up
to ``|V|`` is reachable, and the winning width under kubelet's order is known in advance. Within that
width the best mask is found bit by bit (numerically smallest) or by branch and bound (closest NUMA
distances), asking an exact oracle: "can the families drop all of these nodes, and how many more?".
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import reduce
from typing import Any

from .bitmask import bits_of
from .compact_hints import HintFamily
from .hint_order import HintOrder

__all__ = ["best_common_preferred", "best_nonpreferred_with_families"]


@dataclass(frozen=True, slots=True)
class _Fam:
    required: int
    weights: dict[int, int]
    slack: int


def _fams(families: list[HintFamily]) -> list[_Fam]:
    out = []
    for f in families:
        wm = f.weight_map()
        out.append(_Fam(f.required, wm, sum(wm.values()) - f.threshold))
    return out


# -- preferred: the best mask every family holds as a preferred member --------------------------------
def best_common_preferred(families: list[HintFamily], default: int, order: HintOrder) -> int | None:
    universe = reduce(lambda a, f: a & f.universe, families, default)
    required = reduce(lambda a, f: a | f.required, families, 0)
    if required & ~universe:
        return None
    lo = max(required.bit_count(), 1)
    hi = universe.bit_count()
    for size in range(lo, hi + 1):
        needs_span = [f for f in families if f.preferred_size != size]
        if needs_span and any(f.preferred_sockets is None for f in needs_span):
            continue
        leaf: Callable[[int], bool] | None = None
        if needs_span:
            def leaf(mask: int, fs: list[HintFamily] = needs_span) -> bool:
                return all(f.sockets_spanned(mask) == f.preferred_sockets for f in fs)
        found = _best_member_of_size(families, universe, required, size, leaf, order)
        if found is not None:
            return found
    return None


def _best_member_of_size(families: list[HintFamily], universe: int, required: int, size: int,
                         leaf: Callable[[int], bool] | None, order: HintOrder) -> int | None:
    """The best (numerically smallest, or closest then smallest) mask of ``size`` nodes in every family."""
    free = bits_of(universe & ~required)  # ascending
    k = size - required.bit_count()
    if k < 0 or k > len(free):
        return None
    wmaps = [f.weight_map() for f in families]
    base = [sum(wm.get(n, 0) for n in bits_of(required)) for wm in wmaps]
    thresholds = [f.threshold for f in families]
    # top[i][j][r]: the r largest weights of family i among free[:j]
    top: list[list[list[int]]] = []
    for wm in wmaps:
        rows = []
        ws: list[int] = []
        for j in range(len(free) + 1):
            srt = sorted(ws, reverse=True)
            acc = [0]
            for r in range(k):
                acc.append(acc[-1] + (srt[r] if r < len(srt) else 0))
            rows.append(acc)
            if j < len(free):
                ws.append(wm.get(free[j], 0))
        top.append(rows)

    def ok(chosen: int, j: int, r: int) -> bool:
        # can r more nodes of free[:j] lift every family's weight to its threshold?
        for i, wm in enumerate(wmaps):
            w = base[i] + sum(wm.get(n, 0) for n in bits_of(chosen))
            if w + top[i][j][r] < thresholds[i]:
                return False
        return True

    return _colex_search(free, k, required, ok, leaf, order)


def _colex_search(cands: list[int], k: int, fixed: int, ok: Callable[[int, int, int], bool],
                  leaf: Callable[[int], bool] | None, order: HintOrder) -> int | None:
    """Best ``fixed ∪ S`` over k-subsets S of ``cands`` (ascending ids) under kubelet's mask order.

    Subsets are visited in colex order (the highest node as low as possible, recursively), which is
    ascending mask order. ``ok(chosen, j, r)`` must say exactly whether ``chosen`` can be completed with r
    more nodes of ``cands[:j]``. Without distances the first complete subset wins. With
    prefer-closest-numa-nodes: branch and bound on the distance sum; since masks come in ascending order
    the first subset met at a given sum is the one kubelet keeps on a tie."""
    if k < 0 or k > len(cands) or not ok(0, len(cands), k):
        return None
    if not order.closest:

        def first(r: int, hi: int, chosen: int) -> int | None:
            if r == 0:
                mask = fixed | chosen
                return mask if leaf is None or leaf(mask) else None
            for j in range(r - 1, hi):
                c = chosen | 1 << cands[j]
                if ok(c, j, r - 1):
                    found = first(r - 1, j, c)
                    if found is not None:
                        return found
            return None

        return first(k, len(cands), 0)

    dist = order.dist
    fixed_nodes = bits_of(fixed)
    # link[u]: distances both ways between u and the nodes chosen so far; pair_min[u]: u's cheapest pair
    link = {u: sum(dist[u][y] + dist[y][u] for y in fixed_nodes) for u in cands}
    pair_min = {u: min((dist[u][x] + dist[x][u] for x in cands if x != u), default=0) for u in cands}
    self_d = {u: dist[u][u] for u in cands}
    # best = [mask, distance sum, found, found by the ordered search]. A greedy guess seeds the bound; a
    # subset of the ordered search then replaces it on a smaller sum, or on an equal sum and smaller mask.
    best: list[Any] = [0, 0, False, False]
    _greedy_seed(cands, k, fixed, ok, leaf, order, link, self_d, pair_min, best)

    def lower_bound(cur_d: int, j: int, r: int) -> int:
        # each further node adds its self distance and its links to the chosen nodes, and shares the r - 1
        # pairs it forms with the other new nodes: at least half its cheapest pair each
        if r == 0:
            return cur_d
        marg = sorted(2 * (self_d[u] + link[u]) + (r - 1) * pair_min[u] for u in cands[:j])
        return cur_d + (sum(marg[:r]) + 1) // 2

    def hopeless(bound: int) -> bool:
        if not best[2]:
            return False
        return bool(bound > best[1] or (bound == best[1] and best[3]))

    def visit(r: int, hi: int, chosen: int, cur_d: int) -> None:
        if r == 0:
            mask = fixed | chosen
            if leaf is not None and not leaf(mask):
                return
            # (meeting the greedy guess itself also counts: nothing later can beat it at this sum)
            if not best[2] or cur_d < best[1] or (cur_d == best[1] and mask <= best[0]):
                best[0], best[1], best[2], best[3] = mask, cur_d, True, True
            return
        for j in range(r - 1, hi):
            v = cands[j]
            nd = cur_d + self_d[v] + link[v]
            if hopeless(nd):
                continue
            c = chosen | 1 << v
            if not ok(c, j, r - 1):
                continue
            lower = cands[:j]
            for u in lower:
                link[u] += dist[u][v] + dist[v][u]
            if not hopeless(lower_bound(nd, j, r - 1)):
                visit(r - 1, j, c, nd)
            for u in lower:
                link[u] -= dist[u][v] + dist[v][u]

    visit(k, len(cands), 0, order.dsum(fixed))
    return best[0] if best[2] else None


def _greedy_seed(cands: list[int], k: int, fixed: int, ok: Callable[[int, int, int], bool],
                 leaf: Callable[[int], bool] | None, order: HintOrder, link: dict[int, int], self_d: dict[int, int],
                 pair_min: dict[int, int], best: list[Any]) -> None:
    """A quick valid subset with a small distance sum (nearest-neighbour growth from a few starts)."""
    if k == 0:
        return
    dist = order.dist
    starts = sorted(cands, key=lambda u: (pair_min[u], u))[:6]
    for start in starts:
        chosen = 1 << start
        total = order.dsum(fixed) + self_d[start] + link[start]
        extra = {u: link[u] + dist[u][start] + dist[start][u] for u in cands}
        for _ in range(k - 1):
            u = min((x for x in cands if not chosen >> x & 1), key=lambda x: (self_d[x] + extra[x], x),
                    default=None)
            if u is None:
                break
            total += self_d[u] + extra[u]
            chosen |= 1 << u
            for x in cands:
                extra[x] += dist[x][u] + dist[u][x]
        if chosen.bit_count() != k or not ok(chosen, 0, 0):
            continue
        mask = fixed | chosen
        if leaf is not None and not leaf(mask):
            continue
        if not best[2] or total < best[1] or (total == best[1] and mask < best[0]):
            best[0], best[1], best[2], best[3] = mask, total, True, False


# -- non-preferred: the best reachable AND -----------------------------------------------------------
def best_nonpreferred_with_families(explicit_ands: set[int], families: list[HintFamily], default: int,
                                    order: HintOrder) -> int | None:
    universe = reduce(lambda a, f: a & f.universe, families, default)
    dropper = _Dropper(_fams(families), universe)
    best: int | None = None
    for x in explicit_ands:
        v = x & universe
        if not v:
            continue
        m = _best_reachable_in(v, dropper, order)
        if m is not None and (best is None or order.nonpreferred_key(m) < order.nonpreferred_key(best)):
            best = m
    return best


def _best_reachable_in(v: int, dropper: _Dropper, order: HintOrder) -> int | None:
    n = v.bit_count()
    most = dropper.maxcover(0, v)  # nodes the families can drop at most
    narrowest = max(n - most, 1)
    target = min(order.best_count, n)
    width = target if narrowest <= target else narrowest
    drop = n - width  # how many nodes of v to drop

    def feasible(forced: int, optional: int) -> bool:
        if forced.bit_count() > drop:
            return False
        return dropper.maxcover(forced, optional) >= drop

    nodes = sorted(bits_of(v), reverse=True)
    if not order.closest:
        # numerically smallest: drop the highest nodes first whenever a completion exists
        dropped = 0
        undecided = v
        for node in nodes:
            undecided &= ~(1 << node)
            if feasible(dropped | 1 << node, undecided):
                dropped |= 1 << node
        return v & ~dropped

    cands = sorted(nodes)
    prefix = [0]
    for node in cands:
        prefix.append(prefix[-1] | 1 << node)

    def ok(chosen: int, j: int, r: int) -> bool:
        # the nodes above cands[j] that were not chosen are dropped; cands[:j] may still be either
        return feasible(v & ~chosen & ~prefix[j], prefix[j])

    return _colex_search(cands, width, 0, ok, None, order)


class _Dropper:
    """Answers "can the families drop these nodes, and how many more?" (exact). Which family may drop
    which node, and at what weight, is worked out once per merge."""

    def __init__(self, fams: list[_Fam], nodes: int) -> None:
        self.fams = fams
        self.free = 0  # droppable at no cost (a family that does not require it and gives it weight 0)
        self.bad = 0  # droppable by no family
        self.constrained = 0
        self.ways: dict[int, list[tuple[int, int]]] = {}
        involved: set[int] = set()
        for node in bits_of(nodes):
            ways = []
            free = False
            for i, f in enumerate(fams):
                if f.required >> node & 1:
                    continue
                w = f.weights.get(node, 0)
                if w == 0:
                    free = True
                    break
                if w <= f.slack:
                    ways.append((i, w))
            if free:
                self.free |= 1 << node
            elif ways:
                self.constrained |= 1 << node
                self.ways[node] = ways
                involved.update(i for i, _ in ways)
            else:
                self.bad |= 1 << node
        self.single: int | None = next(iter(involved)) if len(involved) == 1 else None
        self.by_weight: list[tuple[int, int]] = []
        if self.single is not None:
            self.by_weight = sorted((ways[0][1], node) for node, ways in self.ways.items())

    def maxcover(self, forced: int, optional: int) -> int:
        """Largest E with forced ⊆ E ⊆ forced ∪ optional the families can drop together (each node by one
        family that does not require it, within that family's weight slack); -1 if forced cannot be."""
        if forced & self.bad:
            return -1
        total = ((forced | optional) & self.free).bit_count()
        need = forced & self.constrained
        opt = optional & self.constrained & ~forced
        if not need and not opt:
            return total
        if self.single is not None:
            slack = self.fams[self.single].slack
            for node in bits_of(need):
                slack -= self.ways[node][0][1]
            if slack < 0:
                return -1
            extra = 0
            for w, node in self.by_weight:
                if opt >> node & 1:
                    if w > slack:
                        break
                    slack -= w
                    extra += 1
            return total + need.bit_count() + extra
        got = _assign([self.ways[n] for n in bits_of(need)], [self.ways[n] for n in bits_of(opt)],
                      [f.slack for f in self.fams])
        return -1 if got < 0 else total + need.bit_count() + got


def _assign(need: list[list[tuple[int, int]]], opt: list[list[tuple[int, int]]], slack: list[int]) -> int:
    """Exact search: place every needed node, then as many optional nodes as possible. -1 if impossible."""
    opt = sorted(opt, key=lambda ways: min(w for _, w in ways))
    memo: dict[tuple[int, tuple[int, ...]], int] = {}

    def place_opt(k: int) -> int:
        if k == len(opt):
            return 0
        key = (k, tuple(slack))
        hit = memo.get(key)
        if hit is not None:
            return hit
        best = place_opt(k + 1)
        if best < len(opt) - k:
            for i, w in opt[k]:
                if slack[i] >= w:
                    slack[i] -= w
                    best = max(best, 1 + place_opt(k + 1))
                    slack[i] += w
                    if best == len(opt) - k:
                        break
        memo[key] = best
        return best

    def place_need(k: int) -> int:
        if k == len(need):
            return place_opt(0)
        best = -1
        for i, w in need[k]:
            if slack[i] >= w:
                slack[i] -= w
                best = max(best, place_need(k + 1))
                slack[i] += w
        return best

    return place_need(0)
