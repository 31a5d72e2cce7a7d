"""CPU topology hints, against kubelet's topology_hints_test.go tables (TestGetTopologyHints,
TestGetPodTopologyHints, TestGetPodTopologyHintsWithPolicyOptions), plus numapin's edge cases."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from allocator import CPUSet, CPUState, TopologyHint
from allocator.cpu_hints import generate_cpu_hints
from allocator.static_policy import StaticPolicy
from tests import topologies as T
from tests.allocator.podspec import make_multi_container_pod, make_pod
from tests.topologies import random_topologies

S = CPUSet.parse


def hints_machine():
    """returnMachineInfo(): NUMA 0 holds cores {0,6} {1,7} {2,8}, NUMA 1 cores {3,9} {4,10} {5,11}."""
    rows = [(c, c % 6, (c % 6) // 3, (c % 6) // 3, 0) for c in range(12)]
    return T.build(rows)


def H(*spec: tuple[tuple[int, ...], bool]) -> list[TopologyHint]:
    return [TopologyHint(frozenset(n), p) for n, p in spec]


def as_tuples(hints):
    return [(tuple(sorted(h.numa)), h.preferred) for h in hints]


FIRST, SECOND, CROSS = (0,), (1,), (0, 1)

@dataclass(frozen=True)
class HintsCase:
    """A TestGetTopologyHints case: ``request`` CPUs asked, the default cpuset, the CPUs the container already
    holds (or None) and the expected (NUMA nodes, preferred) hints."""

    name: str
    request: int
    default: str
    assigned: str | None
    expect: list[tuple[tuple[int, ...], bool]]


def hints_case(*args: Any) -> Any:
    return pytest.param(HintsCase(*args), id=args[0])


TABLE = [
    hints_case("Request 2 CPUs, 4 available on NUMA 0, 6 available on NUMA 1", 2, "2-11", None,
               [(FIRST, True), (SECOND, True), (CROSS, False)]),
    hints_case("Request 5 CPUs, 4 available on NUMA 0, 6 available on NUMA 1", 5, "2-11", None,
               [(SECOND, True), (CROSS, False)]),
    hints_case("Request 7 CPUs, 4 available on NUMA 0, 6 available on NUMA 1", 7, "2-11", None, [(CROSS, True)]),
    hints_case("Request 11 CPUs, 4 available on NUMA 0, 6 available on NUMA 1", 11, "2-11", None, []),
    hints_case("Request 2 CPUs, 1 available on NUMA 0, 1 available on NUMA 1", 2, "0,3", None, [(CROSS, False)]),
    hints_case("Request more CPUs than available", 5, "0-3", None, []),
    hints_case("Regenerate Single-Node NUMA Hints if already allocated 1/2", 2, "", "0,6",
               [(FIRST, True), (CROSS, False)]),
    hints_case("Regenerate Single-Node NUMA Hints if already allocated 2/2", 2, "", "3,9",
               [(SECOND, True), (CROSS, False)]),
    hints_case("Regenerate Cross-NUMA Hints if already allocated", 11, "", "0-10", [(CROSS, True)]),
    hints_case("Requested less than already allocated", 2, "", "0,3,6,9", []),
    hints_case("Requested more than already allocated", 11, "", "0,3,6,9", []),
]


def policy() -> StaticPolicy:
    # kubelet's table runs without reserved CPUs; CPU 1 is reserved here, outside every default cpuset that
    # matters (in "Request more CPUs than available" it only lowers the available count further).
    return StaticPolicy(hints_machine(), reserved_cpus=S("1"))


def _state_and_pod(c: HintsCase) -> tuple[CPUState, Any]:
    st = CPUState(default_cpuset=S(c.default))
    if c.assigned:
        st.set("fakePod", "fakeContainer", S(c.assigned))
    return st, make_pod("fakePod", "fakeContainer", str(c.request), str(c.request))


@pytest.mark.parametrize("c", TABLE)
def test_get_topology_hints(c: HintsCase) -> None:
    st, p = _state_and_pod(c)
    got = policy().topology_hints(st, p, "fakeContainer")
    assert got is not None and as_tuples(got["cpu"]) == c.expect


@pytest.mark.parametrize("c", TABLE)
def test_get_pod_topology_hints(c: HintsCase) -> None:
    st, p = _state_and_pod(c)
    got = policy().pod_topology_hints(st, p)
    assert got is not None and as_tuples(got["cpu"]) == c.expect


ALL_WITH_0 = [(0,), (0, 1), (0, 2), (0, 3), (0, 1, 2), (0, 1, 3), (0, 2, 3), (0, 1, 2, 3)]


@pytest.mark.parametrize(
    ("name", "request_", "default", "align", "expect"),
    [
        ("AlignBySocket:false, Preferred hints does not contains socket aligned hints", 2, "2-3,11", "false",
         [(m, m == (0,)) for m in ALL_WITH_0]),
        ("AlignBySocket:true Preferred hints contains socket aligned hints", 2, "2-3,11", "true",
         [(m, m in ((0,), (0, 1))) for m in ALL_WITH_0]),
        ("AlignBySocket:true Preferred hints are spread across socket since 2 sockets are required", 41,
         "0-28,40-57", "true", [((0, 1, 2), True), ((0, 1, 2, 3), True)]),
    ],
)
def test_get_pod_topology_hints_with_policy_options(name, request_, default, align, expect):
    p = StaticPolicy(T.dual_socket_multi_numa_per_socket_ht(), reserved_cpus=S("79"),
                     options={"align-by-socket": align})
    got = p.pod_topology_hints(CPUState(default_cpuset=S(default)), make_pod("fakePod", "c", str(request_),
                                                                             str(request_)))
    assert got is not None and as_tuples(got["cpu"]) == expect


def test_no_preference_for_shared_pool_containers():
    st = CPUState(default_cpuset=S("0-11"))
    assert policy().topology_hints(st, make_pod("p", "c", "1500m", "1500m"), "c") is None
    assert policy().pod_topology_hints(st, make_pod("p", "c", "1500m", "1500m")) is None
    assert policy().topology_hints(st, make_pod("p", "c", "1", "2"), "c") is None  # Burstable


def test_hints_are_ordered_by_width_then_lexicographically():
    t = T.dual_socket_multi_numa_per_socket_ht()
    got = generate_cpu_hints(t, t.all_cpus, CPUSet(), 1)
    assert [tuple(sorted(h.numa)) for h in got] == [
        (0,), (1,), (2,), (3,), (0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3),
        (0, 1, 2), (0, 1, 3), (0, 2, 3), (1, 2, 3), (0, 1, 2, 3),
    ]
    assert [h.preferred for h in got] == [True] * 4 + [False] * 11


def test_preferred_width_comes_from_capacity_not_availability():
    # 25 CPUs need 2 NUMA nodes of the 6230 even on an empty node: every 2-wide hint is preferred, although
    # only NUMA 2 and 3 are free.
    t = T.dual_socket_multi_numa_per_socket_ht()
    got = generate_cpu_hints(t, S("20-39,60-79"), CPUSet(), 25)
    assert as_tuples(got) == [((2, 3), True), ((0, 2, 3), False), ((1, 2, 3), False), ((0, 1, 2, 3), False)]


def test_reusable_cpus_outside_a_mask_drop_it():
    t = hints_machine()
    got = generate_cpu_hints(t, S("1-2,4,7-8"), S("3"), 2)
    # the reusable CPU 3 sits on NUMA 1: NUMA 0 alone is dropped although it has 4 free CPUs
    assert as_tuples(got) == [((1,), True), ((0, 1), False)]


def test_init_container_cpus_are_reusable_in_the_app_containers_hints():
    p = StaticPolicy(hints_machine(), reserved_cpus=S("1"))
    st = CPUState(default_cpuset=S("0-11"))
    pod = make_multi_container_pod([("2", "2")], [("4", "4")])
    init = p.allocate(st, pod, "initContainer-0")
    assert init == S("0,6")  # NUMA 0 has fewer free CPUs (CPU 1 is reserved) and sorts first
    got = p.topology_hints(st, pod, "appContainer-0")
    # the reusable CPUs 0,6 sit on NUMA 0: hints without NUMA 0 are dropped; 2 reusable + 3 free fit there
    assert got is not None and as_tuples(got["cpu"]) == [((0,), True), ((0, 1), False)]


def test_cpu_less_numa_nodes_never_appear():
    base = T.dual_socket_ht()
    t = T.build(((c.cpu, c.core, c.socket, c.numa, c.uncore) for c in base.cpus), numa_nodes=(0, 1, 2))
    assert t.numa_nodes == (0, 1, 2)
    got = generate_cpu_hints(t, t.all_cpus, CPUSet(), 8)
    assert as_tuples(got) == [((0, 1), True)]


def test_available_and_reusable_are_counted_separately_like_kubelet():
    t = hints_machine()
    # CPU 0 is both available and reusable: kubelet counts it twice, so two CPUs "fit" on NUMA 0.
    assert as_tuples(generate_cpu_hints(t, S("0"), S("0"), 2)) == [((0,), True), ((0, 1), False)]


def _reference_hints(topo, available, reusable, request, align_by_socket):
    """kubelet's generateCPUTopologyHints written the slow, literal way: CPU by CPU for every mask."""
    nodes = topo.cpu_numa_nodes
    min_affinity = len(nodes)
    found = []
    for k in range(1, len(nodes) + 1):
        for combo in itertools.combinations(nodes, k):
            if len(topo.cpus_in_numas(combo)) >= request and k < min_affinity:
                min_affinity = k
            matching = 0
            ok = True
            for c in reusable:
                if topo.cpu(c).numa not in combo:
                    ok = False
                    break
                matching += 1
            if not ok:
                continue
            matching += sum(1 for c in available if topo.cpu(c).numa in combo)
            if matching >= request:
                found.append(combo)
    per_socket = len(nodes) // topo.num_sockets
    out = []
    for combo in found:
        preferred = len(combo) == min_affinity
        if align_by_socket and per_socket:
            min_sockets = (min_affinity + per_socket - 1) // per_socket
            if len({topo.cpu(c).socket for c in topo.cpus_in_numas(combo)}) == min_sockets:
                preferred = True
        out.append((combo, preferred))
    return out


@settings(max_examples=150, deadline=None)
@given(data=st.data(), topo=random_topologies(offline=False), align=st.booleans())
def test_hints_match_a_literal_transcription(data, topo, align):
    cpus = topo.all_cpus.sorted()
    available = CPUSet(data.draw(st.sets(st.sampled_from(cpus))))
    reusable = CPUSet(data.draw(st.sets(st.sampled_from(cpus), max_size=3))) - available
    request = data.draw(st.integers(1, topo.num_cpus))
    got = generate_cpu_hints(topo, available, reusable, request, align)
    assert as_tuples(got) == _reference_hints(topo, available, reusable, request, align)
