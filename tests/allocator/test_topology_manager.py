"""Topology manager: policy options and validation, scopes (container, pod, none), providers, messages."""

from __future__ import annotations

import pytest

from allocator.compact_hints import HintFamily
from allocator.cpuset import CPUSet
from allocator.device_hints import DeviceHintProvider, device_hints
from allocator.errors import AllocationError, ConfigError, SMTAlignmentError
from allocator.hints import TopologyHint
from allocator.memory_hints import MemoryHintProvider
from allocator.state import CPUState
from allocator.topology_manager import (
    POLICIES,
    TOPOLOGY_AFFINITY_MESSAGE,
    TopologyManager,
    new_policy,
    new_scope,
    parse_policy_options,
)
from tests.allocator.topomgr_helpers import SimpleCPUProvider, make_topology, pod


def H(nodes: list[int] | None, preferred: bool) -> TopologyHint:
    return TopologyHint(None if nodes is None else frozenset(nodes), preferred)


# -- options and validation ---------------------------------------------------------------------------
@pytest.mark.parametrize("value", ["true", "True", "TRUE", "t", "T", "1"])
def test_prefer_closest_true_spellings(value: str) -> None:
    assert parse_policy_options({"prefer-closest-numa-nodes": value}).prefer_closest_numa


@pytest.mark.parametrize("value", ["false", "False", "FALSE", "f", "F", "0"])
def test_prefer_closest_false_spellings(value: str) -> None:
    assert not parse_policy_options({"prefer-closest-numa-nodes": value}).prefer_closest_numa


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"prefer-closest-numa-nodes": "yes"}, "prefer-closest-numa-nodes"),
        ({"max-allowable-numa-nodes": "7"}, "minimum value is 8"),
        ({"max-allowable-numa-nodes": "eight"}, "max-allowable-numa-nodes"),
        ({"numa-allocation-strategy": "most-allocated"}, "unknown topology manager policy option"),
    ],
)
def test_bad_options(options: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        parse_policy_options(options)


def test_max_allowable_is_accepted_and_enforced_when_set() -> None:
    nodes = list(range(16))
    assert new_policy("best-effort", nodes).name == "best-effort"  # numapin default: no limit
    with pytest.raises(ConfigError, match="more than 8 NUMA Nodes"):
        new_policy("restricted", nodes, options={"max-allowable-numa-nodes": "8"})
    assert new_policy("restricted", nodes, options={"max-allowable-numa-nodes": "16"}).name == "restricted"
    assert new_policy("none", nodes, options={"max-allowable-numa-nodes": "8"}).name == "none"


def test_up_to_64_numa_nodes_and_no_further() -> None:
    assert new_policy("single-numa-node", list(range(64))).numa_nodes[-1] == 63
    with pytest.raises(ConfigError, match=r"0\.\.63"):
        new_policy("best-effort", [0, 64])


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"name": "strict"}, "unknown topology manager policy 'strict'"),
        ({"numa_nodes": [0, 0]}, "unique"),
        ({"options": {"prefer-closest-numa-nodes": "true"}}, "needs the NUMA distances"),
    ],
)
def test_bad_policy_config(kwargs: dict, match: str) -> None:
    args = {"name": "best-effort", "numa_nodes": [0, 1]} | kwargs
    name = args.pop("name")
    nodes = args.pop("numa_nodes")
    with pytest.raises(ConfigError, match=match):
        new_policy(name, nodes, **args)


def test_bad_scope() -> None:
    with pytest.raises(ConfigError, match="unknown topology manager scope 'node'"):
        new_scope("node", new_policy("best-effort", [0]))


def test_policies_merge_through_the_interface() -> None:
    providers = [{"cpu": [H([0], True), H([1], True), H([0, 1], False)]}, {"gpu": [H([1], True), H([0, 1], False)]}]
    for name in ("best-effort", "restricted", "single-numa-node"):
        assert new_policy(name, [0, 1]).merge(providers) == (H([1], True), True)
    assert new_policy("none", [0, 1]).merge(providers) == (H(None, False), True)


# -- scopes -------------------------------------------------------------------------------------------
TOPO = make_topology(sockets=2, numa_per_socket=1, cores_per_numa=4, threads=2)  # 16 CPUs, 8 per node


def fresh_state() -> CPUState:
    return CPUState(default_cpuset=TOPO.all_cpus)


def manager(policy: str, scope: str = "container", **kw: object) -> TopologyManager:
    return TopologyManager.from_config(numa_nodes=TOPO.numa_nodes, policy=policy, scope=scope,
                                       distances=TOPO.numa_distances, **kw)  # type: ignore[arg-type]


def test_container_scope_aligns_each_container() -> None:
    state = fresh_state()
    p = pod("a", 4, 4)
    result = manager("single-numa-node").admit(state, p, [SimpleCPUProvider(TOPO), MemoryHintProvider()])
    assert result.admitted and result.reason is None
    assert [c.affinity for c in result.containers] == [H([0], True), H([0], True)]
    assert state.get(p.uid, "c0") | state.get(p.uid, "c1") == TOPO.cpus_in_numa(0)
    hints = result.containers[0].hints
    assert set(hints) == {"cpu"}
    assert H([0], True) in hints["cpu"]  # type: ignore[operator]


def test_container_scope_later_containers_see_earlier_allocations() -> None:
    state = fresh_state()
    p = pod("b", 6, 4)
    result = manager("single-numa-node").admit(state, p, [SimpleCPUProvider(TOPO)])
    assert result.admitted
    assert [c.affinity for c in result.containers] == [H([0], True), H([1], True)]


def test_container_scope_rejects_whole_pod_with_kubelet_reason() -> None:
    state = fresh_state()
    p = pod("c", 4, 10)
    result = manager("single-numa-node").admit(state, p, [SimpleCPUProvider(TOPO), MemoryHintProvider()])
    assert not result.admitted
    assert result.reason == "TopologyAffinityError"
    assert result.message.startswith(TOPOLOGY_AFFINITY_MESSAGE)
    assert "policy single-numa-node" in result.message and "container 'c1'" in result.message
    assert "cpu" in result.message
    assert result.failed_container == "c1"
    assert result.unaligned == ("cpu",)


def test_restricted_names_the_resource_that_breaks_alignment() -> None:
    state = fresh_state()
    p = pod("d", 4)
    devices = DeviceHintProvider({"c0": {"example.com/gpu": {1}, "example.com/nic": {0}}}, TOPO.numa_nodes)
    result = manager("restricted").admit(state, p, [SimpleCPUProvider(TOPO), devices])
    assert not result.admitted and result.reason == "TopologyAffinityError"
    assert set(result.unaligned) == {"example.com/gpu", "example.com/nic"}
    assert "could not be aligned" in result.message


def test_unsatisfiable_resource_is_reported() -> None:
    state = CPUState(default_cpuset=CPUSet.parse("0-1"))
    p = pod("e", 4)
    result = manager("best-effort").admit(state, p, [SimpleCPUProvider(TOPO)])
    # best-effort admits; the allocation itself then fails as kubelet's UnexpectedAdmissionError
    assert not result.admitted and result.reason == "UnexpectedAdmissionError"
    assert result.message.startswith("Allocate failed due to not enough cpus")
    result2 = manager("restricted").admit(CPUState(default_cpuset=CPUSet.parse("0-1")), p,
                                          [SimpleCPUProvider(TOPO)])
    assert result2.reason == "TopologyAffinityError" and "no NUMA placement can satisfy cpu" in result2.message


def test_best_effort_admits_unaligned_pod() -> None:
    state = fresh_state()
    p = pod("f", 12)
    result = manager("best-effort").admit(state, p, [SimpleCPUProvider(TOPO)])
    assert result.admitted
    assert result.containers[0].affinity == H([0, 1], True)  # 12 CPUs need both nodes: preferred


def test_pod_scope_merges_once_for_all_containers() -> None:
    state = fresh_state()
    p = pod("g", 3, 3, init=(2,))
    result = manager("single-numa-node", "pod").admit(state, p, [SimpleCPUProvider(TOPO)])
    assert result.admitted and result.scope == "pod"
    assert [c.name for c in result.containers] == ["init0", "c0", "c1"]
    assert {c.affinity for c in result.containers} == {H([0], True)}
    rejected = manager("single-numa-node", "pod").admit(fresh_state(), pod("h", 6, 6), [SimpleCPUProvider(TOPO)])
    assert not rejected.admitted and rejected.failed_container is None
    assert "the pod's resources" in rejected.message


class RecordingProvider:
    """A provider that records what it is asked and fails allocation on demand."""

    def __init__(self, fail: Exception | None = None) -> None:
        self.calls: list[tuple[str, TopologyHint | None]] = []
        self.fail = fail

    def topology_hints(self, state: object, pod: object, container_name: str) -> dict:
        return {"example.com/thing": [H([1], True), H([0, 1], False)]}

    def pod_topology_hints(self, state: object, pod: object) -> dict:
        return {"example.com/thing": [H([1], True)]}

    def allocate(self, state: object, pod: object, container_name: str, affinity: TopologyHint | None) -> None:
        self.calls.append((container_name, affinity))
        if self.fail is not None:
            raise self.fail


def test_policy_none_allocates_without_affinity() -> None:
    rec = RecordingProvider()
    result = manager("none", "pod").admit(fresh_state(), pod("i", 2, 2), [rec])
    assert result.admitted and result.scope == "none"
    assert rec.calls == [("c0", None), ("c1", None)]
    assert all(c.affinity is None and c.hints == {} for c in result.containers)


def test_allocate_errors_keep_their_kubelet_reason() -> None:
    smt = RecordingProvider(SMTAlignmentError(3, 2))
    result = manager("best-effort").admit(fresh_state(), pod("j", 2), [smt])
    assert result.reason == "SMTAlignmentError"
    assert result.message == "SMT Alignment Error: requested 3 cpus not multiple cpus per core = 2"
    other = RecordingProvider(AllocationError("boom"))
    result = manager("none").admit(fresh_state(), pod("k", 2), [other])
    assert result.reason == "UnexpectedAdmissionError"
    assert result.message == "Allocate failed due to boom, which is unexpected"
    assert result.failed_container == "c0"


def test_allocate_receives_the_merged_hint() -> None:
    rec = RecordingProvider()
    manager("restricted").admit(fresh_state(), pod("l", 2, 2), [rec])
    assert rec.calls == [("c0", H([1], True)), ("c1", H([1], True))]


# -- providers ----------------------------------------------------------------------------------------
def test_memory_provider_has_no_preference() -> None:
    m = MemoryHintProvider()
    p = pod("m", 2)
    assert m.topology_hints(None, p, "c0") is None
    assert m.pod_topology_hints(None, p) is None
    assert m.allocate(None, p, "c0", H([0], True)) is None


def test_device_hints_for_allocated_devices() -> None:
    hints = device_hints("gpu", {2}, [0, 1, 2, 3])
    assert isinstance(hints, list)
    assert [h for h in hints if h.preferred] == [H([2], True)]
    assert len(hints) == 8 and all(2 in h.numa for h in hints)  # type: ignore[operator]
    two = device_hints("gpu", [{0}, {2}], [0, 1, 2, 3])
    assert isinstance(two, list)
    assert [h for h in two if h.preferred] == [H([0, 2], True)] and len(two) == 4
    both = device_hints("gpu", {0, 1}, [0, 1, 2])  # devices on nodes 0 and 1: masks holding both
    assert both == [H([0, 1], True), H([0, 1, 2], False)]
    spanning = device_hints("gpu", [{0, 1}], [0, 1, 2])  # one device on two nodes: any mask touching it
    assert isinstance(spanning, list)
    assert [h for h in spanning if h.preferred] == [H([0], True), H([1], True)]
    assert len(spanning) == 6
    assert device_hints("nic", [], [0, 1]) is None  # no NUMA information: no preference


def test_device_hints_compact_on_large_machines() -> None:
    fam = device_hints("gpu", {20}, list(range(34)))
    assert isinstance(fam, HintFamily)
    assert fam.contains(1 << 20) and fam.is_preferred(1 << 20)
    assert fam.contains(1 << 20 | 1) and not fam.is_preferred(1 << 20 | 1)
    assert not fam.contains(1)
    with pytest.raises(ConfigError, match="not on this machine"):
        device_hints("gpu", {40}, list(range(34)))


def test_device_provider_pod_level_hints_union_containers() -> None:
    prov = DeviceHintProvider({"c0": {"gpu": {1}}, "c1": {"gpu": {1}, "nic": {0}}}, [0, 1])
    p = pod("n", 1, 1)
    assert prov.topology_hints(None, p, "nope") is None
    pod_hints = prov.pod_topology_hints(None, p)
    assert pod_hints is not None and set(pod_hints) == {"gpu", "nic"}
    assert prov.allocate(None, p, "c0", None) is None


def test_distances_needed_at_start_up_whatever_the_policy() -> None:
    """kubelet reads the NUMA distances whenever prefer-closest-numa-nodes is set (NewNUMAInfo, before it picks the
    policy); single-numa-node then ignores them in its merge."""
    for name in POLICIES:
        with pytest.raises(ConfigError, match="needs the NUMA distances"):
            new_policy(name, [0, 1], options={"prefer-closest-numa-nodes": "true"})
    with pytest.raises(ConfigError, match="one distance per NUMA node"):
        new_policy("best-effort", [0, 1], distances={0: [10], 1: [10]}, options={"prefer-closest-numa-nodes": "1"})
    policy = new_policy("single-numa-node", [0, 1], distances={0: [10], 1: [10]},
                        options={"prefer-closest-numa-nodes": "1"})
    assert policy.merge([{"a": [H([1], True), H([0], True)]}]) == (H([0], True), True)
