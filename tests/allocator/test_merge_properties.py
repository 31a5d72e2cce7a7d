"""Property tests (hypothesis) for the merge: the result is a reachable AND of one hint per list, and
kubelet's compare() is a total order, so neither the order of providers, of resources (a Go map) nor of
hints changes the reference's result."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from allocator.hints import TopologyHint
from allocator.topology_manager import POLICIES, merge_hints
from tests.allocator.merge_reference import reference_merge

N = 4
NODES = list(range(N))

hint = st.builds(
    TopologyHint,
    st.one_of(st.none(), st.frozensets(st.integers(0, N - 1), min_size=1)),
    st.booleans(),
)
resource_hints = st.one_of(st.none(), st.lists(hint, min_size=0, max_size=4))
provider = st.one_of(st.none(), st.dictionaries(st.sampled_from(["cpu", "gpu", "nic"]), resource_hints, max_size=2))
providers_st = st.lists(provider, max_size=3)
distances_st = st.lists(st.integers(11, 15), min_size=N * N, max_size=N * N).map(
    lambda xs: {a: [10 if a == b else xs[a * N + b] for b in NODES] for a in NODES})


def _lists(providers: list) -> list[set[int]]:
    default = (1 << N) - 1
    out = []
    for p in providers:
        if not p:
            continue
        for hints in p.values():
            if hints:
                out.append({default if h.numa is None else h.mask for h in hints})
    return out


@settings(max_examples=150, deadline=None)
@given(providers_st, st.sampled_from(POLICIES), st.booleans(), distances_st)
def test_result_is_a_reachable_and(providers: list, policy: str, closest: bool, distances: dict) -> None:
    opts = {"prefer-closest-numa-nodes": "true" if closest else "false"}
    hint_, admit = merge_hints(providers, policy=policy, numa_nodes=NODES, distances=distances, options=opts)
    default = (1 << N) - 1
    if policy == "none":
        assert (hint_, admit) == (TopologyHint(None, False), True)
        return
    reach = {default}
    for masks in _lists(providers):
        reach = {r & m for r in reach for m in masks}
    mask = default if hint_.numa is None else hint_.mask
    # either a reachable non-empty AND, or the non-preferred default when nothing better exists
    assert mask in reach or (mask == default and not hint_.preferred)
    if policy != "best-effort":
        assert admit == hint_.preferred
    if policy == "single-numa-node" and hint_.preferred and hint_.numa is not None:
        assert len(hint_.numa) == 1


@settings(max_examples=150, deadline=None)
@given(providers_st, st.sampled_from(POLICIES), st.booleans(), distances_st, st.integers(0, 2**32))
def test_order_of_providers_resources_and_hints_does_not_matter(providers: list, policy: str, closest: bool,
                                                               distances: dict, seed: int) -> None:
    rng = random.Random(seed)
    shuffled = []
    for p in providers:
        if p is None:
            shuffled.append(None)
            continue
        items = list(p.items())
        rng.shuffle(items)
        shuffled.append({k: (None if v is None else rng.sample(v, len(v))) for k, v in items})
    rng.shuffle(shuffled)
    opts = {"prefer-closest-numa-nodes": "true" if closest else "false"}
    want = reference_merge(providers, policy=policy, numa_nodes=NODES, distances=distances, options=opts)
    assert reference_merge(shuffled, policy=policy, numa_nodes=NODES, distances=distances, options=opts) == want
    assert merge_hints(shuffled, policy=policy, numa_nodes=NODES, distances=distances, options=opts) == want


@settings(max_examples=120, deadline=None)
@given(st.integers(1, 9), st.data())
def test_subset_transform_finds_exactly_the_reachable_ands(n: int, data: st.DataObject) -> None:
    """The zeta/Möbius path (used for long lists on small machines) against the plain DP over ANDs, on
    machines with possibly non-contiguous node ids."""
    from allocator.merge import _reachable_zeta

    ids = sorted(data.draw(st.sets(st.integers(0, 63), min_size=n, max_size=n)))
    default = sum(1 << i for i in ids)
    submask = st.lists(st.sampled_from(ids), min_size=1, max_size=n).map(lambda xs: sum(1 << i for i in set(xs)))
    mask_sets = data.draw(st.lists(st.frozensets(submask, min_size=1, max_size=12), min_size=1, max_size=4))
    reach = {default}
    for ms in mask_sets:
        reach = {r & m for r in reach for m in ms}
    reach.discard(0)
    assert _reachable_zeta(mask_sets, default) == reach
