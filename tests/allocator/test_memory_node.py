"""The node facade with kubelet's Memory Manager (``memoryManagerPolicy: Static``): memory and huge pages as hint
providers in the topology manager's merge, cpuset.mems from the Memory Manager, transactional admission, release
and the memory resize entry (allocator.node with allocator.memory)."""

from __future__ import annotations

import pytest

from allocator import CPUSet, NodeAllocator, NodeConfig
from allocator.errors import ConfigError
from allocator.hints import TopologyHint
from allocator.memory import MachineMemory, NodeMemory, parse_reserved_memory
from allocator.memory.config import MemoryConfig
from allocator.memory.quantity_text import ByteQuantity
from tests.allocator.memory_tables import GI, H1G, container, pod
from tests.topologies import xeon_gold_6258r

MACHINE = MachineMemory.uniform((0, 1), 64 * GI, ((2 << 20, 0), (GI, 0)))
RESERVED = parse_reserved_memory("0:memory=100Mi")  # kubelet's default eviction threshold, nothing else reserved


def node(policy: str = "single-numa-node", *, machine: MachineMemory = MACHINE, scope: str = "container",
         memory_policy: str = "Static") -> NodeAllocator:
    return NodeAllocator(NodeConfig(
        topology=xeon_gold_6258r(), num_reserved_cpus=2, topology_manager_policy=policy,
        topology_manager_scope=scope, memory=MemoryConfig(machine, memory_policy, RESERVED)))


def big(uid: str, memory: int, cpu: int = 4000, **kw) -> object:
    return pod(uid, container("app", memory, cpu=cpu, **kw))


def test_single_numa_node_refuses_memory_no_node_holds():
    n = node()
    before = n.memory_state.copy() if n.memory_state else None
    d = n.admit_pod(big("p", 100 * GI))
    assert not d.admitted and d.reason == "TopologyAffinityError"
    assert d.message.startswith("Resources cannot be allocated with Topology locality")
    assert "memory 100Gi asked; free memory per NUMA node {0: 65436Mi, 1: 64Gi}" in d.message
    assert n.memory_state == before  # a refused pod leaves no trace


def test_restricted_refuses_it_too_as_kubelet_does_best_effort_spans_two_nodes():
    d = node("restricted").admit_pod(big("p", 100 * GI))
    assert not d.admitted and d.reason == "TopologyAffinityError"  # 4 CPUs fit one node: not a preferred merge
    n = node("best-effort")
    d = n.admit_pod(big("p", 100 * GI))
    assert d.admitted
    app = d.container("app")
    assert app.mems == CPUSet([0, 1])  # the memory was extended over both nodes
    assert len(app.cpus) == 4
    assert n.container_mems("p", "app") == CPUSet([0, 1])
    assert n.memory_state is not None and n.memory_state.machine[0].cells == (0, 1)


def test_restricted_spans_two_nodes_when_the_cpus_need_both_too():
    d = node("restricted").admit_pod(big("p", 100 * GI, cpu=60000))
    assert d.admitted and d.container("app").mems == CPUSet([0, 1])


def test_two_pods_that_each_fit_a_node_go_to_different_nodes():
    n = node()
    a = n.admit_pod(big("a", 40 * GI))
    b = n.admit_pod(big("b", 40 * GI))
    assert a.admitted and b.admitted
    assert a.container("app").mems == CPUSet([0]) and b.container("app").mems == CPUSet([1])
    assert n.topology.numa_of(b.container("app").cpus) == CPUSet([1])  # CPUs follow the memory
    c = n.admit_pod(big("c", 40 * GI))
    assert not c.admitted  # neither node has 40Gi left


def test_huge_pages_bring_the_cpus_to_the_node_that_has_them():
    machine = MachineMemory((NodeMemory(0, 64 * GI, ((GI, 0),)), NodeMemory(1, 64 * GI, ((GI, 4),))))
    n = node(machine=machine)
    d = n.admit_pod(pod("p", container("app", GI, cpu=2000, hugepages={H1G: 2 * GI})))
    assert d.admitted
    assert d.container("app").mems == CPUSet([1]) and n.topology.numa_of(d.container("app").cpus) == CPUSet([1])
    assert d.container("app").hints[H1G] == (TopologyHint(frozenset({1}), True), TopologyHint(frozenset({0, 1}), False))
    assert n.memory_state is not None and n.memory_state.machine[1].memory[H1G].free == 2 * GI


def test_dry_run_and_release_leave_the_state_as_it_was():
    n = node()
    empty = n.memory_state.copy() if n.memory_state else None
    assert n.admit_pod(big("p", 10 * GI), dry_run=True).admitted
    assert n.memory_state == empty
    n.admit_pod(big("p", 10 * GI))
    assert n.memory_state != empty
    n.release_pod("p")
    assert n.memory_state is not None and empty is not None
    assert n.memory_state.machine == empty.machine and n.memory_state.assignments == {}
    n.admit_pod(big("q", 10 * GI))
    n.release_container("q", "app")
    assert n.memory_state.machine == empty.machine


def test_containers_the_memory_manager_leaves_alone_keep_the_mems_of_their_cpus():
    n = node()
    d = n.admit_pod(pod("p", container("app", GI, cpu=500, limit=2 * GI), qos="Burstable"))
    assert d.admitted and d.container("app").mems == n.topology.numa_of(d.container("app").cpus) == CPUSet([0, 1])
    assert n.memory_state is not None and n.memory_state.assignments == {}


def test_a_guaranteed_pod_with_fractional_cpus_gets_memory_nodes_as_in_kubelet():
    n = node()
    d = n.admit_pod(pod("p", container("app", GI, cpu=500)))
    app = d.container("app")
    assert app.mode == "shared" and app.mems == CPUSet([0])  # shared-pool CPUs, memory pinned to node 0


def test_crane_exclusive_on_a_burstable_pod_places_its_memory_limit():
    n = node()
    d = n.admit_pod(pod("p", container("app", GI, cpu=2000, limit=8 * GI), qos="Burstable", mode="exclusive"))
    assert d.admitted and d.container("app").mode == "exclusive" and d.container("app").mems == CPUSet([0])
    assert n.memory_state is not None and n.memory_state.blocks("p", "app")[0].size == 8 * GI


def test_pod_scope_and_init_container_reuse():
    n = node(scope="pod")
    p = pod("p", container("init", 30 * GI, role="init", cpu=2000), container("side", 4 * GI, role="sidecar",
            cpu=1000), container("app", 30 * GI, cpu=2000))
    d = n.admit_pod(p)
    assert d.admitted and {c.name: c.mems for c in d.containers} == {n: CPUSet([0]) for n in ("init", "side", "app")}
    assert n.memory_state is not None
    assert n.memory_state.machine[0].memory["memory"].reserved == 34 * GI  # the app reused the init container's 30Gi


def test_resize_grows_in_place_then_extends_then_refuses():
    n = node("best-effort")
    n.admit_pod(big("p", 10 * GI))
    out = n.resize_memory(big("p", 20 * GI), "app")
    assert out.admitted and out.mems_before == out.mems_after == (0,) and (out.bytes_before, out.bytes_after) == (
        10 * GI, 20 * GI)
    dry = n.resize_memory(big("p", 70 * GI), "app", dry_run=True)
    assert dry.admitted and dry.mems_after == (0, 1) and n.container_mems("p", "app") == CPUSet([0])
    n.admit_pod(big("q", 10 * GI))  # another container alone on node 0: node 0 can no longer join a group
    assert n.container_mems("q", "app") == CPUSet([0])
    refused = n.resize_memory(big("p", 70 * GI), "app")
    assert not refused.admitted and refused.reason == "Deferred"
    assert "memory 20Gi -> 70Gi does not fit its NUMA nodes [0]" in refused.message
    never = n.resize_memory(big("p", 200 * GI), "app")
    assert not never.admitted and never.reason == "Infeasible"
    assert n.container_mems("p", "app") == CPUSet([0])
    shrink = n.resize_memory(big("p", 5 * GI), "app")
    assert shrink.admitted and n.memory_state is not None
    assert n.memory_state.machine[0].memory["memory"].reserved == 15 * GI


def test_resize_refuses_huge_page_changes_and_is_a_no_op_without_the_static_policy():
    machine = MachineMemory((NodeMemory(0, 64 * GI, ((GI, 4),)), NodeMemory(1, 64 * GI, ((GI, 4),))))
    n = node(machine=machine)
    n.admit_pod(pod("p", container("app", GI, cpu=2000, hugepages={H1G: GI})))
    out = n.resize_memory(pod("p", container("app", GI, cpu=2000, hugepages={H1G: 2 * GI})), "app")
    assert not out.admitted and out.reason == "Infeasible" and "huge pages" in out.message
    off = node(memory_policy="None")
    assert off.memory_state is None
    assert off.resize_memory(big("p", GI), "app").admitted


def test_memory_policy_none_keeps_todays_decisions():
    d = node(memory_policy="None").admit_pod(big("p", 100 * GI))
    assert d.admitted and d.container("app").mems == CPUSet([0])


@pytest.mark.parametrize(("config", "match"), [
    (MemoryConfig(MACHINE, "static", RESERVED), 'memoryManagerPolicy: unknown policy: "static"'),
    (MemoryConfig(MachineMemory.uniform((0,), GI), "Static", RESERVED), "lists NUMA nodes"),
    (MemoryConfig(MACHINE, "Static", parse_reserved_memory("0:memory=1Gi")),
     'reservedMemory: the total amount "1Gi" of type "memory" is not equal to the value "100Mi"'),
    (MemoryConfig(MACHINE, "Static", (), {"memory": ByteQuantity(0)}), "you should specify the system reserved"),
])
def test_configuration_errors(config, match):
    with pytest.raises(ConfigError, match=match):
        NodeAllocator(NodeConfig(topology=xeon_gold_6258r(), memory=config))


def test_a_machine_with_more_nodes_than_hint_lists_enumerate(sysfs_machine):
    """16 NUMA nodes of 8Gi: the bounded hint list and the cover search, end to end."""
    from allocator import Topology
    from tests.fixtures.make_sysfs import MACHINES

    topo = Topology.from_sysfs(sysfs_machine("numa-16"))
    assert MACHINES["numa-16"].num_nodes == 16
    machine = MachineMemory.uniform(range(16), 8 * GI, ((2 << 20, 0), (GI, 0)))

    def make(policy: str) -> NodeAllocator:
        return NodeAllocator(NodeConfig(topology=topo, num_reserved_cpus=2, topology_manager_policy=policy,
                                        memory=MemoryConfig(machine, "Static", RESERVED)))

    assert not make("single-numa-node").admit_pod(big("p", 20 * GI)).admitted
    n = make("best-effort")
    d = n.admit_pod(big("p", 20 * GI))
    assert d.admitted and len(d.container("app").mems) == 3  # the narrowest set of nodes holding 20Gi
    small = n.admit_pod(big("q", 4 * GI))
    assert small.admitted and len(small.container("app").mems) == 1
    assert not small.container("app").mems & d.container("app").mems  # grouped nodes take no single allocation
    out = n.resize_memory(big("q", 12 * GI), "app")
    assert out.admitted and len(out.mems_after) == 2


def test_mode_changes_move_memory_by_the_same_rules():
    from dataclasses import replace

    n = node()
    p = pod("p", container("app", GI, cpu=2000, limit=8 * GI), qos="Burstable", mode="none")
    assert n.admit_pod(p).admitted and n.container_mems("p", "app") is None  # Burstable, shared pool: unmanaged
    assert n.change_mode(p, "exclusive").admitted
    assert n.container_mems("p", "app") == CPUSet([0])  # pinned by Crane: its 8Gi limit placed on node 0
    assert n.memory_state is not None and n.memory_state.machine[0].memory["memory"].reserved == 8 * GI
    moved = replace(p, cpu_manager="exclusive")
    assert n.change_mode(moved, "share").admitted and n.container_mems("p", "app") == CPUSet([0])  # kept
    assert n.change_mode(moved, "none").admitted
    assert n.container_mems("p", "app") is None and n.memory_state.machine[0].memory["memory"].reserved == 0
    huge = pod("h", container("app", GI, cpu=2000, limit=100 * GI), qos="Burstable", mode="none")
    assert n.admit_pod(huge).admitted
    before = n.memory_state.copy()
    refused = n.change_mode(huge, "exclusive")  # 100Gi fits no single node under single-numa-node
    assert not refused.admitted and refused.reason == "TopologyAffinityError"
    assert n.memory_state == before
