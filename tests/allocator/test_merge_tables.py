"""The topology manager merge on hand-checked tables, for every policy (fast merge and reference agree)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from allocator.errors import ConfigError
from allocator.hints import TopologyHint
from allocator.topology_manager import merge_hints, new_policy
from tests.allocator.merge_reference import reference_merge


def H(nodes: list[int] | None, preferred: bool) -> TopologyHint:
    return TopologyHint(None if nodes is None else frozenset(nodes), preferred)


POLICIES = ("best-effort", "restricted", "single-numa-node")


@dataclass(frozen=True)
class MergeCase:
    """One hand-checked merge: the machine's NUMA nodes, the providers' hints, and per policy the expected
    (merged hint, admit)."""

    name: str
    numa_nodes: list[int]
    providers: list
    expected: dict[str, tuple[TopologyHint, bool]]


def case(name: str, numa_nodes: list[int], providers: list, expected: dict[str, tuple[TopologyHint, bool]]) -> Any:
    return pytest.param(MergeCase(name, numa_nodes, providers, expected), id=name)


TABLE = [
    case("no providers", [0, 1], [],
         {"best-effort": (H([0, 1], True), True), "restricted": (H([0, 1], True), True),
          "single-numa-node": (H(None, True), True)}),
    case("provider without preference", [0, 1], [None],
         {"best-effort": (H([0, 1], True), True), "restricted": (H([0, 1], True), True),
          "single-numa-node": (H(None, True), True)}),
    case("empty provider map", [0, 1], [{}],
         {"best-effort": (H([0, 1], True), True), "single-numa-node": (H(None, True), True)}),
    case("resource without preference", [0, 1], [{"r": None}],
         {"best-effort": (H([0, 1], True), True), "single-numa-node": (H(None, True), True)}),
    case("resource that cannot be satisfied", [0, 1], [{"r": []}],
         {"best-effort": (H([0, 1], False), True), "restricted": (H([0, 1], False), False),
          "single-numa-node": (H(None, False), False)}),
    case("two providers, same single-node choices", [0, 1],
         [{"a": [H([0], True), H([1], True)]}, {"b": [H([0], True), H([1], True)]}],
         {p: (H([0], True), True) for p in POLICIES}),
    case("two providers, one common node", [0, 1],
         [{"a": [H([0], True), H([1], True)]}, {"b": [H([1], True)]}],
         {p: (H([1], True), True) for p in POLICIES}),
    case("disjoint nodes: nothing reachable", [0, 1],
         [{"a": [H([0], True)]}, {"b": [H([1], True)]}],
         {"best-effort": (H([0, 1], False), True), "restricted": (H([0, 1], False), False),
          "single-numa-node": (H(None, False), False)}),
    case("non-preferred fallback picks the narrowest at the best count", [0, 1],
         [{"a": [H([0], True), H([0, 1], False)]}, {"b": [H([1], True), H([0, 1], False)]}],
         {"best-effort": (H([0], False), True), "restricted": (H([0], False), False),
          "single-numa-node": (H(None, False), False)}),
    case("best non-preferred count comes from the widest narrowest hint", [0, 1],
         [{"a": [H([0, 1], True)]}, {"b": [H([0], True), H([0, 1], False)]}],
         {"best-effort": (H([0, 1], False), True), "restricted": (H([0, 1], False), False),
          "single-numa-node": (H(None, False), False)}),
    case("preferred wide hint beats non-preferred narrow ones", [0, 1, 2, 3],
         [{"a": [H([0], False), H([0, 1], True)]}, {"b": [H([0, 1], True), H([0], False)]}],
         {"best-effort": (H([0, 1], True), True), "restricted": (H([0, 1], True), True),
          "single-numa-node": (H(None, False), False)}),
    case("hints with different masks are never preferred together", [0, 1, 2, 3],
         [{"a": [H([0, 1], True)]}, {"b": [H([0, 1, 2], True)]}],
         {"best-effort": (H([0, 1], False), True), "restricted": (H([0, 1], False), False)}),
    case("single-numa-node keeps the one-node preferred hint", [0, 1],
         [{"a": [H([0], True), H([1], True), H([0, 1], False)]}, {"b": [H([1], True), H([0, 1], False)]}],
         {"single-numa-node": (H([1], True), True), "restricted": (H([1], True), True)}),
    case("single-numa-node drops multi-node preferred hints", [0, 1],
         [{"a": [H([0, 1], True)]}],
         {"single-numa-node": (H(None, False), False), "best-effort": (H([0, 1], True), True)}),
    case("one-node machine: affinity of the whole machine", [0],
         [{"a": [H([0], True)]}],
         {"single-numa-node": (H(None, True), True), "best-effort": (H([0], True), True)}),
    case("nodes not on the machine merge to nothing", [0, 2],
         [{"a": [H([1], True)]}],
         {"best-effort": (H([0, 2], False), True)}),
    case("non-contiguous machine", [0, 2],
         [{"a": [H([2], True), H([0, 2], False)]}, None],
         {"best-effort": (H([2], True), True), "single-numa-node": (H([2], True), True)}),
    case("several resources of one provider are separate lists", [0, 1],
         [{"cpu": [H([0], True), H([1], True)], "gpu": [H([1], True)]}],
         {p: (H([1], True), True) for p in POLICIES}),
    # kubelet's HintMerger: the empty mask {} is the narrowest hint of its list (0 nodes), so it does not raise
    # the best non-preferred width to 2 (issue 12: numapin used to answer {0,1} here).
    case("an empty, non-nil mask in a list does not change the answer", [0, 1],
         [{"gpu": [H(None, False)]},
          {"gpu": [H([1], True), H([1], True), H([], True), H([0, 1], False)]},
          {"hugepages-1Gi": [H([0], True), H([0, 1], False)], "memory": [H([1], True), H([0, 1], False)]},
          {"nic": [H([0], True), H([1], True), H([0, 1], False)], "fpga": [H([1], False), H([0, 1], True)]}],
         {"best-effort": (H([0], False), True), "restricted": (H([0], False), False),
          "single-numa-node": (H(None, False), False)}),
    # kubelet: with no NUMA node the default affinity is the empty mask and it is the answer, not preferred
    case("no NUMA node at all: the default hint", [],
         [{"a": [H([0], True)]}],
         {"best-effort": (H([], False), True), "restricted": (H([], False), False),
          "single-numa-node": (H(None, False), False)}),
    case("no NUMA node and no providers: the default hint", [], [],
         {"best-effort": (H([], False), True), "restricted": (H([], False), False),
          "single-numa-node": (H(None, False), False)}),
]


@pytest.mark.parametrize("c", TABLE)
def test_table(c: MergeCase) -> None:
    for policy, (hint, admit) in c.expected.items():
        got = new_policy(policy, c.numa_nodes).merge(c.providers)
        assert got == (hint, admit), (policy, got)
        assert reference_merge(c.providers, policy=policy, numa_nodes=c.numa_nodes) == (hint, admit), policy
        assert merge_hints(c.providers, policy=policy, numa_nodes=c.numa_nodes) == got


def test_policy_none_never_merges() -> None:
    providers = [{"a": [H([0], True)]}, {"b": [H([1], True)]}]
    assert merge_hints(providers, policy="none", numa_nodes=[0, 1]) == (H(None, False), True)


DIST = {0: [10, 30, 40, 40], 1: [30, 10, 11, 40], 2: [40, 11, 10, 40], 3: [40, 40, 40, 10]}


def test_prefer_closest_picks_lower_average_distance() -> None:
    providers = [{"a": [H([0, 1], True), H([1, 2], True)]}, None]
    nodes = [0, 1, 2, 3]
    assert merge_hints(providers, policy="best-effort", numa_nodes=nodes) == (H([0, 1], True), True)
    opts = {"prefer-closest-numa-nodes": "true"}
    got = merge_hints(providers, policy="best-effort", numa_nodes=nodes, distances=DIST, options=opts)
    assert got == (H([1, 2], True), True)
    assert reference_merge(providers, policy="best-effort", numa_nodes=nodes, distances=DIST, options=opts) == got
    # narrower still wins over closer
    providers2 = [{"a": [H([3], True), H([1, 2], True)]}]
    assert merge_hints(providers2, policy="restricted", numa_nodes=nodes, distances=DIST,
                       options=opts) == (H([3], True), True)


def test_prefer_closest_ignored_by_single_numa_node() -> None:
    providers = [{"a": [H([2], True), H([1], True)]}]
    got = merge_hints(providers, policy="single-numa-node", numa_nodes=[0, 1, 2, 3], distances=None,
                      options={"prefer-closest-numa-nodes": "true"})
    assert got == (H([1], True), True)


def test_prefer_closest_distance_tie_takes_smaller_mask() -> None:
    nodes = [0, 1, 2, 3]
    dist = {n: [10 if m == n else 20 for m in nodes] for n in nodes}
    providers = [{"a": [H([2, 3], True), H([0, 3], True)]}]
    got = merge_hints(providers, policy="best-effort", numa_nodes=nodes, distances=dist,
                      options={"prefer-closest-numa-nodes": "true"})
    assert got == (H([0, 3], True), True)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"policy": "strict"}, "policy"),
        ({"numa_nodes": [64]}, "NUMA node id"),
        ({"numa_nodes": [0, 0]}, "unique"),
        ({"options": {"closest": "true"}}, "unknown topology manager policy option"),
        ({"options": {"prefer-closest-numa-nodes": "yes"}}, "prefer-closest-numa-nodes"),
        ({"options": {"prefer-closest-numa-nodes": "true"}}, "distances"),
        ({"options": {"prefer-closest-numa-nodes": "true"}, "distances": {0: [10]}}, "distances"),
    ],
)
def test_bad_input(kwargs: dict, field: str) -> None:
    args = {"policy": "best-effort", "numa_nodes": [0, 1]} | kwargs
    with pytest.raises(ConfigError, match=field):
        merge_hints([None], **args)
