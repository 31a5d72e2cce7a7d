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
