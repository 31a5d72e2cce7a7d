"""The Memory Manager's static policy, table by table (allocator.memory.policy, allocator.memory.hints).

The cases are kubelet's policy_static tests (TestStaticPolicyGetTopologyHints, TestStaticPolicyAllocate,
TestStaticPolicyRemoveContainer, TestStaticPolicyStart), transcribed as facts into numapin's own tables: the
machine state before, the pod, the topology manager's hint, and what kubelet decides (hints, blocks, machine state
after, or its error)."""

from __future__ import annotations

import pytest

from allocator.errors import AllocationError, CheckpointError, ConfigError
from allocator.hints import TopologyHint
from allocator.memory import Block, MachineMemory, MemoryPolicy, MemoryState
from allocator.memory.policy import (
    DEFAULT_HINT_FAILED,
    DEFAULT_NOT_PREFERRED,
    EXTEND_FAILED,
    EXTENDED_NOT_PREFERRED,
    STATE_DIFFERS,
    VIOLATES_GROUPS,
)
from tests.allocator.memory_tables import GI, H1G, H2M, MI, blocks, container, guaranteed, node, pod, state

# kubelet's test machine: per node 2Gi of memory (512Mi reserved for the system) and one 1Gi huge page
FREE = (2 * GI, 512 * MI, 1536 * MI, 0, 1536 * MI)
PAGE = (GI, 0, GI, 0, GI)
PAGE_USED = (GI, 0, GI, GI, 0)


def _policy(nodes: int = 1, memory: int = 2 * GI, pages: int = 1) -> MemoryPolicy:
    machine = MachineMemory.uniform(range(nodes), memory, ((GI, pages),))
    return MemoryPolicy(machine, {n: {"memory": 512 * MI} for n in range(nodes)})


def H(*numa: int, preferred: bool = True) -> TopologyHint:
    return TopologyHint(frozenset(numa), preferred)


# -- construction ------------------------------------------------------------------------------------------------
def test_policy_needs_reserved_memory():
    with pytest.raises(ConfigError, match=r"\[memorymanager\] you should specify the system reserved memory"):
        MemoryPolicy(MachineMemory.uniform((0,), GI), {0: {}})
    MemoryPolicy(MachineMemory.uniform((0, 1), GI), {0: {}, 1: {"memory": 512 * MI}})  # one node is enough


# -- hints -------------------------------------------------------------------------------------------------------
HINT_CASES = {
    "no hints for a pod that is not Guaranteed": (
        state({0: node(0, (0,), memory=FREE, h1g=PAGE)}),
        pod("pod1", container(limit=2 * GI), qos="Burstable"),
        None,
    ),
    "hints from the blocks the container already holds": (
        state({0: node(2, (0,), memory=FREE, h1g=PAGE)}, {"pod1": {"container1": blocks((0,), GI, GI)}}),
        guaranteed(),
        {"memory": [H(0)], H1G: [H(0)]},
    ),
    "new container: single nodes outside the group preferred, their pair not": (
        state({
            0: node(2, (0, 1), memory=(2 * GI, 512 * MI, 1536 * MI, 1536 * MI, 0), h1g=PAGE_USED),
            1: node(2, (0, 1), memory=(2 * GI, 512 * MI, 1536 * MI, 512 * MI, GI), h1g=PAGE_USED),
            2: node(0, (2,), memory=FREE, h1g=PAGE),
            3: node(0, (3,), memory=FREE, h1g=PAGE),
        }, {"pod1": {"container1": blocks((0, 1), 2 * GI, 2 * GI)}}),
        guaranteed("pod2", "container2"),
        {"memory": [H(2), H(3), H(2, 3, preferred=False)], H1G: [H(2), H(3), H(2, 3, preferred=False)]},
    ),
    "no preference when the held blocks are fewer than the resources asked": (
        state({0: node(1, (0,), memory=FREE, h1g=PAGE)}, {"pod1": {"container1": blocks((0,), GI)}}),
        guaranteed(),
        None,
    ),
    "no preference when the held blocks are of other resources": (
        state({0: node(2, (0,), memory=FREE, h1g=PAGE)}, {"pod1": {"container1": blocks((0,), GI, h2m=GI)}}),
        guaranteed(),
        None,
    ),
    "no preference when a held block has another size": (
        state({0: node(2, (0,), memory=FREE, h1g=PAGE)}, {"pod1": {"container1": blocks((0,), 512 * MI, GI)}}),
        guaranteed(),
        None,
    ),
    "a pod one node could hold only gets the group, not preferred": (
        state({
            0: node(2, (0, 1), memory=(2 * GI, 512 * MI, 1536 * MI, 1536 * MI, 0),
                    h2m=(20 * MI, 0, 20 * MI, 20 * MI, 0)),
            1: node(2, (0, 1), memory=(2 * GI, 512 * MI, 1536 * MI, 512 * MI, GI),
                    h2m=(20 * MI, 0, 20 * MI, 4 * MI, 16 * MI)),
        }, {"pod1": {"container1": blocks((0, 1), 2 * GI, h2m=24 * MI)}}),
        guaranteed("pod2", "container2", h1g=None, h2m=16 * MI),
        {"memory": [H(0, 1, preferred=False)], H2M: [H(0, 1, preferred=False)]},
    ),
    "nothing fits anywhere: an empty answer (no preference, as kubelet's empty map)": (
        state({0: node(2, (0,), memory=(2 * GI, 512 * MI, 1536 * MI, GI, 512 * MI), h1g=PAGE_USED)}),
        guaranteed("pod2", "container2"),
        {},
    ),
}


@pytest.mark.parametrize("case", list(HINT_CASES))
def test_hints(case):
    st, p, expected = HINT_CASES[case]
    got = _policy(len(st.machine)).topology_hints(st, p, p.containers[0].name)
    assert got == expected


# -- allocate ----------------------------------------------------------------------------------------------------
GROUPED = {  # nodes 0 and 1 form a group; one node alone could hold 1Gi by allocatable, only both by free
    0: node(1, (0, 1), memory=(2 * GI, 512 * MI, 1536 * MI, GI, 512 * MI), h1g=PAGE),
    1: node(1, (0, 1), memory=FREE, h1g=PAGE),
}

ALLOCATE_CASES = {
    "nothing for a pod that is not Guaranteed": (
        state({0: node(0, (0,), memory=FREE, h1g=PAGE)}),
        pod("pod1", container(limit=2 * GI), qos="Burstable"), None,
        None, {},
    ),
    "nothing changes for a container already in the state": (
        state({0: node(1, (0,), memory=(2 * GI, 512 * MI, 1536 * MI, GI, 512 * MI), h1g=PAGE)},
              {"pod1": {"container1": blocks((0,), GI)}}),
        guaranteed(), None,
        {0: node(1, (0,), memory=(2 * GI, 512 * MI, 1536 * MI, GI, 512 * MI), h1g=PAGE)},
        {"container1": blocks((0,), GI)},
    ),
    "no affinity from the topology manager: the default hint": (
        state({0: node(0, (0,), memory=FREE, h1g=PAGE)}),
        guaranteed(), None,
        {0: node(2, (0,), memory=(2 * GI, 512 * MI, 1536 * MI, GI, 512 * MI), h1g=PAGE_USED)},
        {"container1": blocks((0,), GI, GI)},
    ),
    "no affinity and no node with room: the default hint fails": (
        state({0: node(2, (0,), memory=(2 * GI, 512 * MI, 1536 * MI, GI, 512 * MI), h1g=PAGE_USED)},
              {"pod1": {"container1": blocks((0,), GI, GI)}}),
        guaranteed("pod2", "container2"), None,
        DEFAULT_HINT_FAILED, None,
    ),
    "a preferred hint without NUMA nodes and a default hint that is not preferred": (
        state(dict(GROUPED)),
        guaranteed("pod2", "container2"), TopologyHint(None, True),
        DEFAULT_NOT_PREFERRED, None,
    ),
    "the hint cannot be extended": (
        state({0: node(1, (0,), memory=(2 * GI, 512 * MI, 1536 * MI, GI, 512 * MI), h1g=PAGE),
               1: node(1, (1,), memory=(2 * GI, 512 * MI, 1536 * MI, GI, 512 * MI), h1g=PAGE)}),
        guaranteed("pod2", "container2"), H(0),
        EXTEND_FAILED, None,
    ),
    "a preferred hint whose extension is not preferred": (
        state(dict(GROUPED)),
        guaranteed("pod2", "container2"), H(0),
        EXTENDED_NOT_PREFERRED, None,
    ),
    "a hint that is not preferred is extended to the group": (
        state(dict(GROUPED)),
        guaranteed("pod2", "container2"), H(0, preferred=False),
        {0: node(3, (0, 1), memory=(2 * GI, 512 * MI, 1536 * MI, 1536 * MI, 0), h1g=PAGE_USED),
         1: node(3, (0, 1), memory=(2 * GI, 512 * MI, 1536 * MI, 512 * MI, GI), h1g=PAGE)},
        {"container2": blocks((0, 1), GI, GI)},
    ),
    "memory from two NUMA nodes, filled in ascending order": (
        state({0: node(0, (0,), memory=FREE, h1g=PAGE), 1: node(0, (1,), memory=FREE, h1g=PAGE)}),
        guaranteed(memory=2 * GI, h1g=2 * GI), H(0, 1),
        {0: node(2, (0, 1), memory=(2 * GI, 512 * MI, 1536 * MI, 1536 * MI, 0), h1g=PAGE_USED),
         1: node(2, (0, 1), memory=(2 * GI, 512 * MI, 1536 * MI, 512 * MI, GI), h1g=PAGE_USED)},
        {"container1": blocks((0, 1), 2 * GI, 2 * GI)},
    ),
    "a multi-node hint over a node allocated alone violates the groups": (
        state({0: node(1, (0,), memory=(2 * GI, 512 * MI, 1536 * MI, 512 * MI, GI), h1g=PAGE),
               1: node(0, (1,), memory=FREE, h1g=PAGE)}, {"pod1": {"container1": blocks((0,), 512 * MI)}}),
        guaranteed("pod2", "container2", memory=GI, h1g=None), H(0, 1, preferred=False),
        VIOLATES_GROUPS, None,
    ),
}


@pytest.mark.parametrize("case", list(ALLOCATE_CASES))
def test_allocate(case):
    st, p, hint, expected_machine, expected_blocks = ALLOCATE_CASES[case]
    before = st.copy()
    policy = _policy(len(st.machine))
    c = p.containers[0].name
    if isinstance(expected_machine, str):
        with pytest.raises(AllocationError) as e:
            policy.allocate(st, p, c, hint)
        assert str(e.value) == expected_machine
        return
    policy.allocate(st, p, c, hint)
    if expected_machine is None:
        assert st == before
        return
    assert st.machine == expected_machine
    assert st.assignments.get(p.uid, {}) == expected_blocks


def test_init_container_memory_is_reused_by_the_app_container():
    policy = MemoryPolicy(MachineMemory.uniform((0,), 2 * GI, ()), {0: {"memory": 512 * MI}})
    st = MemoryState()
    policy.start(st)
    p = pod("pod1", container("init", GI, role="init"), container("app", GI))
    policy.allocate(st, p, "init", H(0))
    policy.allocate(st, p, "app", H(0))
    t = st.machine[0].memory["memory"]
    assert (t.reserved, t.free, st.machine[0].assignments) == (GI, 512 * MI, 2)
    assert st.blocks("pod1", "app") == (Block((0,), "memory", GI),)
    assert st.blocks("pod1", "init") == (Block((0,), "memory", 0),)  # shrunk: the pod's blocks add up to 1Gi
    policy.start(st)  # and the shrunk blocks still add up to the machine state


def test_sidecars_are_not_reused_but_reuse_what_init_containers_left():
    st = state({0: node(0, (0,), memory=(4 * GI, 512 * MI, 3584 * MI, 0, 3584 * MI))})
    p = pod("pod1", container("sidecar", 512 * MI, role="sidecar"), container("init", GI, role="init"),
            container("app", GI))
    policy = MemoryPolicy(MachineMemory.uniform((0,), 4 * GI), {0: {"memory": 512 * MI}})
    for name in ("sidecar", "init", "app"):
        policy.allocate(st, p, name, H(0))
    assert st.machine[0].memory["memory"].reserved == 1536 * MI  # sidecar 512Mi + init 1Gi, reused by the app
    assert st.blocks("pod1", "sidecar") == (Block((0,), "memory", 512 * MI),)  # never a donor
    assert policy.pod_topology_hints(state({0: node(0, (0,), memory=(4 * GI, 512 * MI, 3584 * MI, 0, 3584 * MI))}),
                                     p) == {"memory": [H(0)]}


def test_reuse_is_forgotten_when_the_next_pod_comes():
    st = state({0: node(0, (0,), memory=FREE)})
    p1 = pod("pod1", container("init", GI, role="init"), container("app", GI))
    policy = MemoryPolicy(MachineMemory.uniform((0,), 2 * GI, ()), {0: {"memory": 512 * MI}})
    policy.allocate(st, p1, "init", H(0))
    p2 = pod("pod2", container("app", 512 * MI))
    policy.allocate(st, p2, "app", H(0))
    assert st.reuse_pod == "pod2" and st.reuse == {}
    assert policy.topology_hints(st, p1, "app") == {}  # pod1's init memory is no longer counted


# -- remove ------------------------------------------------------------------------------------------------------
def test_remove_a_single_node_container():
    st = state({0: node(2, (0,), memory=(2 * GI, 512 * MI, 1536 * MI, GI, 512 * MI), h1g=PAGE_USED)},
               {"pod1": {"container1": blocks((0,), GI, GI)}})
    _policy().remove(st, "pod1", "container1")
    assert st.assignments == {} and st.machine == {0: node(0, (0,), memory=FREE, h1g=PAGE)}
    assert _policy().remove(st, "pod1", "container1") == ()  # idempotent


def test_remove_a_cross_numa_container_ungroups_the_nodes():
    st = state({
        0: node(2, (0, 1), memory=(GI, 512 * MI, 512 * MI, 512 * MI, 0), h1g=PAGE_USED),
        1: node(2, (0, 1), memory=(GI, 512 * MI, 512 * MI, 512 * MI, 0), h1g=PAGE),
    }, {"pod1": {"container1": blocks((0, 1), GI, GI)}})
    _policy(2, memory=GI).remove(st, "pod1", "container1")
    half = (GI, 512 * MI, 512 * MI, 0, 512 * MI)
    assert st.machine == {0: node(0, (0,), memory=half, h1g=PAGE), 1: node(0, (1,), memory=half, h1g=PAGE)}


# -- start -------------------------------------------------------------------------------------------------------
START_CASES = {
    "a node of the machine is missing": (
        {0: node(0, (0,), memory=FREE, h1g=PAGE)}, {}, 2),
    "the memory resource is missing": (
        {0: node(0, (0,), h1g=PAGE)}, {}, 1),
    "the total memory changed": (
        {0: node(0, (0,), memory=(1536 * MI, 512 * MI, 1536 * MI, 0, 1536 * MI), h1g=PAGE)}, {}, 1),
    "the system reservation changed": (
        {0: node(0, (0,), memory=(2 * GI, 1024, 1536 * MI, 0, 1536 * MI), h1g=PAGE)}, {}, 1),
    "reserved memory that no assignment explains": (
        {0: node(1, (0,), memory=FREE, h1g=PAGE)}, {"pod": {"container1": blocks((0,), 512 * MI)}}, 1),
    "the number of assignments differs": (
        {0: node(1, (0,), memory=(2 * GI, 512 * MI, 1536 * MI, GI, 512 * MI), h1g=PAGE_USED)},
        {"pod1": {"container1": blocks((0,), GI, GI)}}, 1),
}


@pytest.mark.parametrize("case", list(START_CASES))
def test_start_refuses(case):
    machine, entries, nodes = START_CASES[case]
    with pytest.raises(CheckpointError, match=STATE_DIFFERS.replace("[", r"\[").replace("]", r"\]")):
        _policy(nodes).start(state(machine, entries))


def test_start_accepts_cross_numa_assignments_that_add_up():
    total = 2176 * MI  # 512Mi reserved + 1Gi of pages leaves 640Mi of memory per node
    machine = MachineMemory.uniform((0, 1), total, ((GI, 1),))
    policy = MemoryPolicy(machine, {0: {"memory": 512 * MI}, 1: {"memory": 512 * MI}})
    st = state({
        0: node(4, (0, 1), memory=(total, 512 * MI, 640 * MI, 640 * MI, 0), h1g=PAGE_USED),
        1: node(4, (0, 1), memory=(total, 512 * MI, 640 * MI, 384 * MI, 256 * MI), h1g=PAGE_USED),
    }, {"pod1": {"container1": blocks((0, 1), 768 * MI, GI)}, "pod2": {"container2": blocks((0, 1), 256 * MI, GI)}})
    before = st.copy()
    policy.start(st)
    assert st == before
