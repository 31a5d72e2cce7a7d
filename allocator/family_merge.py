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
from typing import TYPE_CHECKING

from .bitmask import bits_of
from .compact_hints import HintFamily

if TYPE_CHECKING:
    from .merge import _Order

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
def best_common_preferred(families: list[HintFamily], default: int, order: _Order) -> int | None:
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
                         leaf: Callable[[int], bool] | None, order: _Order) -> int | None:
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

    best: list[int | None] = [None]
    best_d: list[int] = [0]

    def bound_ok(weights: list[int], j: int, r: int) -> bool:
        return all(weights[i] + top[i][j][r] >= thresholds[i] for i in range(len(families)))

    def visit(r: int, hi: int, chosen: int, weights: list[int]) -> bool:
        """Choose r more nodes among free[:hi]; colex order = ascending masks. True = stop (first found)."""
        if r == 0:
            mask = required | chosen
            if leaf is not None and not leaf(mask):
                return False
            if not order.closest:
                best[0] = mask
                return True
            d = order.dsum(mask)
            if best[0] is None or d < best_d[0]:
                best[0], best_d[0] = mask, d
            return False
        for j in range(r - 1, hi):
            v = free[j]
            nw = [weights[i] + wmaps[i].get(v, 0) for i in range(len(families))]
            if not bound_ok(nw, j, r - 1):
                continue
            if order.closest and best[0] is not None and _member_lb(order, required | chosen | 1 << v,
                                                                    free[:j], r - 1) >= best_d[0]:
                continue
            if visit(r - 1, j, chosen | 1 << v, nw):
                return True
        return False

    if bound_ok(base, len(free), k):
        visit(k, len(free), 0, base)
    return best[0]


def _member_lb(order: _Order, current: int, allowed: list[int], r: int) -> int:
    """Lower bound of the distance sum of ``current`` plus ``r`` nodes of ``allowed``."""
    cur = bits_of(current)
    total = order.dsum(current)
    if r == 0:
        return total
    marg = sorted(order.dist[v][v] + sum(order.dist[v][y] + order.dist[y][v] for y in cur) for v in allowed)
    total += sum(marg[:r])
    if r > 1 and allowed:
        dmin = min(order.dist[a][b] for a in allowed for b in allowed if a != b) if len(allowed) > 1 else 0
        total += r * (r - 1) * dmin
    return total


# -- non-preferred: the best reachable AND -----------------------------------------------------------
def best_nonpreferred_with_families(explicit_ands: set[int], families: list[HintFamily], default: int,
                                    order: _Order) -> int | None:
    fams = _fams(families)
    universe = reduce(lambda a, f: a & f.universe, families, default)
    best: int | None = None
    for x in explicit_ands:
        v = x & universe
        if not v:
            continue
        m = _best_reachable_in(v, fams, order)
        if m is not None and (best is None or order.nonpreferred_key(m) < order.nonpreferred_key(best)):
            best = m
    return best


def _best_reachable_in(v: int, fams: list[_Fam], order: _Order) -> int | None:
    n = v.bit_count()
    most = _maxcover(0, v, fams)  # nodes the families can drop at most
    narrowest = max(n - most, 1)
    target = min(order.best_count, n)
    width = target if narrowest <= target else narrowest
    drop = n - width  # how many nodes of v to drop

    def feasible(forced: int, optional: int) -> bool:
        if forced.bit_count() > drop:
            return False
        return _maxcover(forced, optional, fams) >= drop

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

    best: list[int | None] = [None]
    best_d = [0]
    dmin = 0
    if n > 1:
        dmin = min(order.dist[a][b] for a in nodes for b in nodes if a != b)

    def lb(kept: int, undecided: int, r: int) -> int:
        total = order.dsum(kept)
        if r <= 0:
            return total
        cur = bits_of(kept)
        marg = sorted(order.dist[u][u] + sum(order.dist[u][y] + order.dist[y][u] for y in cur)
                      for u in bits_of(undecided))
        return total + sum(marg[:r]) + r * (r - 1) * dmin

    def visit(i: int, kept: int, dropped: int) -> None:
        undecided = v & ~kept & ~dropped
        r = width - kept.bit_count()
        if r < 0 or r > undecided.bit_count():
            return
        if not feasible(dropped, undecided):
            return
        if best[0] is not None and lb(kept, undecided, r) >= best_d[0]:
            return
        if i == len(nodes):
            best[0], best_d[0] = kept, order.dsum(kept)
            return
        bit = 1 << nodes[i]
        visit(i + 1, kept, dropped | bit)  # dropping high nodes first visits smaller masks first
        visit(i + 1, kept | bit, dropped)

    visit(0, 0, 0)
    return best[0]


def _maxcover(forced: int, optional: int, fams: list[_Fam]) -> int:
    """Largest set E with forced ⊆ E ⊆ forced ∪ optional that the families can drop together
    (each node to one family that does not require it, within that family's weight slack); -1 if the
    forced nodes cannot all be dropped."""
    total = 0
    need: list[list[tuple[int, int]]] = []
    opt: list[list[tuple[int, int]]] = []
    for is_forced, mask in ((True, forced), (False, optional)):
        for node in bits_of(mask):
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
                total += 1
            elif ways:
                (need if is_forced else opt).append(ways)
            elif is_forced:
                return -1
    if not need and not opt:
        return total
    involved = {i for ways in need + opt for i, _ in ways}
    if len(involved) == 1:
        (i,) = involved
        slack = fams[i].slack - sum(ways[0][1] for ways in need)
        if slack < 0:
            return -1
        return total + len(need) + _count_fitting(sorted(ways[0][1] for ways in opt), slack)
    got = _assign(need, opt, [f.slack for f in fams])
    return -1 if got < 0 else total + len(need) + got


def _count_fitting(weights_sorted: list[int], slack: int) -> int:
    n = 0
    for w in weights_sorted:
        if w > slack:
            break
        slack -= w
        n += 1
    return n


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
