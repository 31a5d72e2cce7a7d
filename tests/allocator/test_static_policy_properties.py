"""Property tests on random topologies: take-by-topology and the static policy keep kubelet's invariants."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from allocator import AllocationError, CPUSet, CPUState, TopologyHint
from allocator.cpu_assignment import CPUTaker, take_by_topology
from allocator.pod import PodInfo
from allocator.policy_options import OPTION_NAMES, StaticPolicyOptions
from allocator.static_policy import StaticPolicy
from tests.allocator.podspec import container, make_multi_container_pod, pod
from tests.topologies import random_topologies as topologies

SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])


VALID_OPTION_SETS = [
    {},
    {"full-pcpus-only": "true"},
    {"distribute-cpus-across-numa": "true"},
    {"distribute-cpus-across-numa": "true", "full-pcpus-only": "true"},
    {"distribute-cpus-across-cores": "true"},
    {"prefer-align-cpus-by-uncorecache": "true"},
    {"prefer-align-cpus-by-uncorecache": "true", "full-pcpus-only": "true"},
]


@SETTINGS
@given(data=st.data(), topo=topologies(), opts=st.sampled_from(VALID_OPTION_SETS))
def test_take_by_topology_takes_exactly_from_available(data, topo, opts):
    available = CPUSet(data.draw(st.sets(st.sampled_from(topo.all_cpus.sorted()))))
    count = data.draw(st.integers(0, topo.num_cpus + 1))
    try:
        got = take_by_topology(topo, available, count, opts)
    except AllocationError as e:
        assert count > len(available), str(e)
        assert "not enough cpus available" in str(e)
        return
    assert len(got) == count
    assert got <= available


@SETTINGS
@given(data=st.data(), topo=topologies(offline=False))
def test_packed_result_does_not_depend_on_reusing_the_taker(data, topo):
    taker = CPUTaker(topo)
    available = CPUSet(data.draw(st.sets(st.sampled_from(topo.all_cpus.sorted()), min_size=1)))
    count = data.draw(st.integers(1, len(available)))
    first = taker.take(available, count)
    assert taker.take(available, count) == first == take_by_topology(topo, available, count)


@dataclass
class Step:
    kind: str  # "add" or "remove"
    pod: int
    cpus: int  # requested CPUs for add (0 = shared pool)
    affinity: int  # index into the hints, -1 = none
    mode: str  # "" (kubelet rule), "exclusive" or "share"


steps = st.lists(
    st.builds(
        Step,
        kind=st.sampled_from(["add", "add", "remove"]),
        pod=st.integers(0, 5),
        cpus=st.integers(0, 6),
        affinity=st.integers(-1, 3),
        mode=st.sampled_from(["", "", "exclusive", "share"]),
    ),
    max_size=14,
)


def make(uid: str, cpus: int, mode: str) -> PodInfo:
    req = str(cpus) if cpus else "500m"
    annotations = {"qos.gocrane.io/cpu-manager": mode} if mode else None
    return PodInfo.from_pod(pod(uid, [container("c", req, req)], annotations=annotations))


def check_invariants(policy: StaticPolicy, state: CPUState, requested: dict[str, int]) -> None:
    policy.start(state)  # kubelet's validateState must accept every state the policy produces
    seen = 0
    for uid, containers in state.assignments.items():
        for cpus in containers.values():
            assert seen & cpus.mask == 0, "assignments of different pods overlap"
            seen |= cpus.mask
            assert cpus.isdisjoint(policy.reserved)
            assert len(cpus) == requested[uid]
    assert state.default_cpuset.isdisjoint(CPUSet.from_mask(seen))
    assert state.shared_pool() >= state.default_cpuset


@SETTINGS
@given(
    topo=topologies(),
    seq=steps,
    strict=st.booleans(),
    opts=st.sampled_from(VALID_OPTION_SETS),
    nres=st.integers(1, 3),
)
def test_random_allocate_remove_sequences_keep_the_state_consistent(topo, seq, strict, opts, nres):
    options = dict(opts)
    if strict:
        options["strict-cpu-reservation"] = "true"
    nres = min(nres, topo.num_cpus)
    policy = StaticPolicy(topo, num_reserved_cpus=nres, options=options)
    state = CPUState()
    policy.start(state)
    initial = state.default_cpuset
    requested: dict[str, int] = {}
    for step in seq:
        uid = f"pod-{step.pod}"
        if step.kind == "remove":
            policy.remove(state, uid, "c")
            requested.pop(uid, None)
        else:
            p = make(uid, step.cpus, step.mode)
            hints = policy.topology_hints(state, p, "c")
            affinity: TopologyHint | None = None
            if hints and hints["cpu"] and step.affinity >= 0:
                affinity = hints["cpu"][step.affinity % len(hints["cpu"])]
            before = state.copy()
            try:
                got = policy.allocate(state, p, "c", affinity)
            except AllocationError:
                assert state == before, "a failed allocation changed the state"
                continue
            if step.cpus:
                requested[uid] = len(got)
                if uid in before.assignments:
                    assert got == before.get(uid, "c"), "allocate is not idempotent"
                else:
                    assert len(got) == step.cpus and state.get(uid, "c") == got
                if affinity is not None and affinity.numa is not None and uid not in before.assignments:
                    # a hint from the generator fits: the whole allocation lies inside its NUMA nodes
                    assert got <= topo.cpus_in_numas(affinity.numa)
            else:
                assert got == CPUSet()
        check_invariants(policy, state, requested)
    for uid in list(state.assignments):
        policy.remove(state, uid, "c")
    assert state.default_cpuset == initial and state.assignments == {}


@SETTINGS
@given(topo=topologies(offline=False), seq=st.lists(st.integers(1, 3), max_size=8))
def test_full_pcpus_only_hands_out_whole_cores(topo, seq):
    per_core = topo.threads_per_core
    policy = StaticPolicy(topo, num_reserved_cpus=per_core, options={"full-pcpus-only": "true"})
    state = CPUState()
    policy.start(state)
    for i, cores in enumerate(seq):
        try:
            got = policy.allocate(state, make(f"p{i}", cores * per_core, ""), "c")
        except AllocationError:
            continue
        assert topo.core_siblings(got) == got


@SETTINGS
@given(topo=topologies(), init=st.lists(st.integers(1, 4), min_size=1, max_size=3),
       apps=st.lists(st.integers(1, 4), min_size=1, max_size=3))
def test_init_container_reuse_round_trip(topo, init, apps):
    policy = StaticPolicy(topo, num_reserved_cpus=1)
    state = CPUState()
    policy.start(state)
    initial = state.default_cpuset
    p = PodInfo.from_pod(make_multi_container_pod([(str(n), str(n)) for n in init],
                                                  [(str(n), str(n)) for n in apps]))
    for c in p.containers:
        with contextlib.suppress(AllocationError):
            policy.allocate(state, p, c.name)
        policy.start(state)
    for c in p.containers:
        policy.remove(state, p.uid, c.name)
        policy.start(state)
    assert state.default_cpuset == initial and state.assignments == {}


def test_option_sets_used_above_are_valid():
    for opts in VALID_OPTION_SETS:
        StaticPolicyOptions.parse(opts)
    assert set().union(*VALID_OPTION_SETS) <= set(OPTION_NAMES)
