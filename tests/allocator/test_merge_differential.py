"""Differential tests: the fast merge agrees with the exhaustive kubelet reference on random inputs.

10,000+ random provider sets up to 6 NUMA nodes, all four policies, with and without
prefer-closest-numa-nodes over random distances; plus hint families against their full lists.
"""

from __future__ import annotations

import random

import pytest

from allocator.bitmask import bits_of
from allocator.compact_hints import HintFamily
from allocator.device_hints import device_hints
from allocator.hints import TopologyHint
from allocator.topology_manager import POLICIES, merge_hints
from tests.allocator.merge_reference import reference_merge

MAX_PERMUTATIONS = 600


def _random_hint(rng: random.Random, nodes: list[int], outside: list[int]) -> TopologyHint:
    if rng.random() < 0.08:
        return TopologyHint(None, rng.random() < 0.5)
    if rng.random() < 0.03:  # an empty, non-nil mask: kubelet counts it as the narrowest hint (0 nodes)
        return TopologyHint(frozenset(), rng.random() < 0.5)
    pool = nodes + (outside if rng.random() < 0.1 or not nodes else [])
    k = rng.randint(1, len(pool))
    if rng.random() < 0.6:
        k = rng.randint(1, min(2, len(pool)))
    return TopologyHint(frozenset(rng.sample(pool, k)), rng.random() < 0.5)


def _random_case(rng: random.Random) -> tuple[list, list[int], dict[int, list[int]]]:
    n = rng.randint(1, 6) if rng.random() < 0.98 else 0  # no NUMA node at all: kubelet's default hint
    if rng.random() < 0.2:
        nodes = sorted(rng.sample(range(8), n))
    else:
        nodes = list(range(n))
    outside = [x for x in range(8) if x not in nodes]
    providers: list = []
    perms = 1
    for _ in range(rng.randint(0, 4)):
        r = rng.random()
        if r < 0.08:
            providers.append(None)
            continue
        if r < 0.12:
            providers.append({})
            continue
        res: dict = {}
        for j in range(rng.randint(1, 2)):
            q = rng.random()
            if q < 0.07:
                res[f"r{j}"] = None
            elif q < 0.12:
                res[f"r{j}"] = []
            else:
                size = rng.randint(1, 7)
                if perms * size > MAX_PERMUTATIONS:
                    size = 1
                perms *= size
                res[f"r{j}"] = [_random_hint(rng, nodes, outside) for _ in range(size)]
        providers.append(res)
    lo = rng.choice([10, 11, 20])
    distances = {}
    for a in nodes:
        distances[a] = [10 if a == b else rng.randint(lo, lo + rng.choice([1, 3, 30])) for b in nodes]
    if rng.random() < 0.5:  # symmetric, as sysfs usually reports
        for i, a in enumerate(nodes):
            for j, b in enumerate(nodes):
                if j < i:
                    distances[a][j] = distances[b][i]
    return providers, nodes, distances


@pytest.mark.parametrize("seed", range(8))
def test_fast_merge_equals_reference(seed: int) -> None:
    rng = random.Random(1000 + seed)
    for case in range(1300):
        providers, nodes, distances = _random_case(rng)
        for policy in POLICIES:
            for closest in ("false", "true"):
                opts = {"prefer-closest-numa-nodes": closest}
                want = reference_merge(providers, policy=policy, numa_nodes=nodes, distances=distances,
                                       options=opts)
                got = merge_hints(providers, policy=policy, numa_nodes=nodes, distances=distances, options=opts)
                assert got == want, (seed, case, policy, closest, nodes, providers, distances)


def _random_family(rng: random.Random, nodes: list[int]) -> HintFamily:
    universe_nodes = [n for n in nodes if rng.random() < 0.85] or [nodes[0]]
    universe = 0
    for n in universe_nodes:
        universe |= 1 << n
    required = 0
    for n in universe_nodes:
        if rng.random() < 0.15:
            required |= 1 << n
    weights = tuple((n, rng.choice([0, 1, 2, 4, 4, 8])) for n in universe_nodes)
    total = sum(w for _, w in weights)
    threshold = rng.randint(0, max(total, 1)) if rng.random() < 0.8 else 0
    pref = rng.randint(1, len(universe_nodes))
    sockets = ()
    pref_sockets = None
    if rng.random() < 0.15:
        sockets = tuple((n, n // 2) for n in universe_nodes)
        pref_sockets = rng.randint(1, 3)
    return HintFamily(universe=universe, required=required, weights=weights, threshold=threshold,
                      preferred_size=pref, socket_of=sockets, preferred_sockets=pref_sockets)


@pytest.mark.parametrize("seed", range(3))
def test_families_equal_their_full_lists(seed: int) -> None:
    rng = random.Random(5000 + seed)
    for case in range(700):
        n = rng.randint(1, 6)
        nodes = list(range(n))
        distances = {a: [10 if a == b else rng.randint(11, 14) for b in nodes] for a in nodes}
        compact: list = []
        full: list = []
        for _ in range(rng.randint(1, 3)):
            r = rng.random()
            if r < 0.2:
                hints = [_random_hint(rng, nodes, []) for _ in range(rng.randint(1, 3))]
                compact.append({"x": hints})
                full.append({"x": hints})
            elif r < 0.3:  # a long explicit list (a device's supersets): families get listed on small machines
                dev = device_hints("dev", {rng.choice(nodes)}, nodes)
                compact.append({"d": dev})
                full.append({"d": dev})
            else:
                fam = _random_family(rng, nodes)
                compact.append({"f": fam})
                full.append({"f": fam.hints()})
        for policy in POLICIES:
            for closest in ("false", "true"):
                opts = {"prefer-closest-numa-nodes": closest}
                want = reference_merge(full, policy=policy, numa_nodes=nodes, distances=distances, options=opts)
                got = merge_hints(compact, policy=policy, numa_nodes=nodes, distances=distances, options=opts)
                assert got == want, (seed, case, policy, closest, compact, distances)


def test_merge_result_is_a_reachable_and() -> None:
    """Property: a merged affinity other than the default is the AND of one hint per list."""
    rng = random.Random(77)
    for _ in range(400):
        providers, nodes, _ = _random_case(rng)
        default = sum(1 << n for n in nodes)
        lists = []
        for p in providers:
            if not p:
                continue
            for hints in p.values():
                if hints:
                    lists.append({default if h.numa is None else h.mask & default for h in hints})
        reach = {default}
        for masks in lists:
            reach = {r & m for r in reach for m in masks}
        for policy in ("best-effort", "restricted"):
            hint, _ = merge_hints(providers, policy=policy, numa_nodes=nodes)
            assert hint.numa is not None
            assert hint.mask in reach or (hint.mask == default and not hint.preferred)
            assert set(bits_of(hint.mask)) <= set(nodes)
