"""Seeded differential: numapin's memory hints and hint extension against the plain reference
(tests/allocator/memory_reference.py) on machine states reached by random admissions and removals."""

from __future__ import annotations

import random

import pytest

from allocator.bitmask import mask_of
from allocator.errors import AllocationError
from allocator.hints import TopologyHint
from allocator.memory import MachineMemory, MemoryPolicy, MemoryState
from allocator.memory.hints import calculate_hints
from tests.allocator.memory_reference import reference_best, reference_hints
from tests.allocator.memory_tables import GI, H2M, MI, container, pod

SEEDS = range(40)


def _machine(rng: random.Random) -> tuple[MemoryPolicy, MemoryState]:
    n = rng.randint(1, 5)
    machine = MachineMemory.uniform(range(n), rng.choice((2, 3, 4)) * GI, ((2 * MI, rng.choice((0, 256, 512))),))
    reserved = {i: {"memory": rng.choice((256, 512)) * MI} for i in range(n)}
    policy = MemoryPolicy(machine, reserved)
    st = MemoryState()
    policy.start(st)
    return policy, st


def _random_pod(rng: random.Random, uid: str):
    pages = {H2M: rng.choice((2, 64, 256)) * MI} if rng.random() < 0.4 else {}
    return pod(uid, container("c", rng.choice((256, 512, 1024, 1536, 3072)) * MI, hugepages=pages))


def _churn(rng: random.Random, policy: MemoryPolicy, st: MemoryState) -> None:
    nodes = sorted(st.machine)
    live: list[str] = []
    for i in range(rng.randint(0, 12)):
        if live and rng.random() < 0.3:
            policy.remove(st, live.pop(rng.randrange(len(live))), "c")
            continue
        p = _random_pod(rng, f"p{i}")
        k = rng.randint(1, len(nodes))
        affinity = TopologyHint(frozenset(rng.sample(nodes, k)), rng.random() < 0.5)
        try:
            policy.allocate(st, p, "c", affinity)
            live.append(p.uid)
        except AllocationError:
            pass


@pytest.mark.parametrize("seed", SEEDS)
def test_hints_match_the_reference(seed):
    rng = random.Random(seed)
    policy, st = _machine(rng)
    _churn(rng, policy, st)
    for _ in range(6):
        p = _random_pod(rng, "probe")
        req = policy.requested(p, p.containers[0])
        mine = calculate_hints(st, req, {})
        ref = reference_hints(st.machine, req, {})
        as_tuples = {r: [(tuple(sorted(h.numa or ())), h.preferred) for h in hs] for r, hs in mine.items()}
        assert as_tuples == ref, (seed, req)
        within = tuple(sorted(rng.sample(sorted(st.machine), rng.randint(0, len(st.machine)))))
        best = policy.best_hint(st, p, req, within=mask_of(within))
        expected = reference_best(next(iter(ref.values())), within) if ref else None
        got = None if best is None else (tuple(sorted(best.numa or ())), best.preferred)
        assert got == expected, (seed, req, within)


@pytest.mark.parametrize("seed", SEEDS)
def test_reuse_on_exact_masks_matches_the_reference(seed):
    rng = random.Random(1000 + seed)
    policy, st = _machine(rng)
    _churn(rng, policy, st)
    nodes = sorted(st.machine)
    combo = tuple(sorted(rng.sample(nodes, rng.randint(1, len(nodes)))))
    reusable = {combo: {"memory": rng.choice((256, 1024)) * MI}}
    req = {"memory": rng.choice((512, 1024, 2048)) * MI}
    mine = calculate_hints(st, req, {mask_of(combo): reusable[combo]})
    ref = reference_hints(st.machine, req, reusable)
    assert {r: [(tuple(sorted(h.numa or ())), h.preferred) for h in hs] for r, hs in mine.items()} == ref


@pytest.mark.parametrize("seed", SEEDS)
def test_the_large_machine_search_matches_the_reference_on_small_machines(seed):
    """``best_hint_large`` (no 2^N walk) run where the reference can still enumerate: the same answers."""
    rng = random.Random(2000 + seed)
    policy, st = _machine(rng)
    _churn(rng, policy, st)
    for _ in range(6):
        p = _random_pod(rng, "probe")
        req = policy.requested(p, p.containers[0])
        ref = reference_hints(st.machine, req, {})
        within = tuple(sorted(rng.sample(sorted(st.machine), rng.randint(0, min(2, len(st.machine))))))
        best = policy.best_hint_large(st, p, req, within=mask_of(within))
        expected = reference_best(next(iter(ref.values())), within) if ref else None
        got = None if best is None else (tuple(sorted(best.numa or ())), best.preferred)
        assert got == expected, (seed, req, within)


@pytest.mark.parametrize("seed", SEEDS)
def test_narrowest_cover_is_the_narrowest(seed):
    from itertools import combinations

    from allocator.memory.cover import narrowest_cover

    rng = random.Random(3000 + seed)
    nodes = list(range(rng.randint(1, 9)))
    amounts = {r: {n: rng.choice((0, 1, 2, 5, 8)) for n in nodes} for r in ("a", "b")}
    need = {"a": rng.randint(0, 20), "b": rng.randint(0, 12)}
    required = rng.sample(nodes, rng.randint(0, min(2, len(nodes))))
    expected = 0
    for k in range(1, len(nodes) + 1):
        found = [sum(1 << n for n in c) for c in combinations(nodes, k) if set(required) <= set(c)
                 and all(sum(amounts[r][n] for n in c) >= q for r, q in need.items())]
        if found:
            expected = min(found)
            break
    assert narrowest_cover(nodes, required, amounts, need) == expected


@pytest.mark.parametrize("seed", SEEDS)
def test_the_large_machine_list_is_a_part_of_kubelets_with_every_single_node(seed):
    """The bounded list used above LIST_MAX_NODES, computed on small machines: every hint in it is one of the
    reference's (same preferred flag), and its single-node hints are exactly the reference's."""
    from allocator.memory.hints import _large_hints

    rng = random.Random(4000 + seed)
    policy, st = _machine(rng)
    _churn(rng, policy, st)
    for _ in range(4):
        p = _random_pod(rng, "probe")
        req = policy.requested(p, p.containers[0])
        ref = reference_hints(st.machine, req, {})
        mine = _large_hints(st, req, {})
        ref_list = next(iter(ref.values())) if ref else []
        mine_list = [(tuple(sorted(h.numa or ())), h.preferred) for h in next(iter(mine.values()))] if mine else []
        assert set(mine_list) <= set(ref_list), (seed, req)
        assert [h for h in mine_list if len(h[0]) == 1] == [h for h in ref_list if len(h[0]) == 1]
        assert bool(mine) == bool(ref)
