"""The Memory Manager stories of the VMs (tests/numa/guest/test_memory.py on 2s4n, test_hugepages_1g.py on
1s2n-nosmt, test_memory_spill.py on 2s4c1t8n) replayed on the host against the
allocator, on the VM's machine as tests.numa.shapes models it and 1 GiB nodes with what the guest kernel keeps for
itself taken off MemTotal: the CPUs and memory nodes the story expects from the kernel are the ones numapin decides,
so a change of the decisions shows here, without a VM."""

from __future__ import annotations

import pytest

from allocator import NodeAllocator, NodeConfig
from allocator.cpuset import CPUSet
from allocator.memory import MachineMemory, NodeMemory, parse_reserved_memory
from allocator.memory.config import MemoryConfig
from allocator.memory.reserved import node_allocatable_reservation
from allocator.pod import PodInfo
from tests.numa.guest import test_hugepages_1g as gigantic
from tests.numa.guest import test_memory as story
from tests.numa.guest import test_memory_spill as spill
from tests.numa.guest.node import Memory, pod_spec
from tests.numa.guest.node import NodeConfig as GuestConfig
from tests.numa.shapes import expected_topology

MI = 1 << 20
S = CPUSet.parse


def machine(node0_mib: int, others_mib: int) -> MachineMemory:
    return MachineMemory(tuple(
        NodeMemory(n, (node0_mib if n == 0 else others_mib) * MI,
                   ((2 * MI, story.PAGES if n == story.PAGES_NODE else 0),)) for n in range(4)))


def node(config: GuestConfig, memory: MachineMemory) -> NodeAllocator:
    return NodeAllocator(NodeConfig(
        topology=expected_topology("2s4n"), reserved_cpus=S(config.reserved),
        topology_manager_policy=config.policy,
        memory=MemoryConfig(memory, "Static", parse_reserved_memory(config.reserved_memory))))


def pod(name: str, cpu: str, memory: Memory) -> PodInfo:
    return PodInfo.from_pod(pod_spec(name, cpu, limit=cpu, memory=memory))


# MemTotal per node in MiB: node 0 keeps the kernel's image and tables; a little to a lot less, as a guest may show
MACHINES = [pytest.param(n0, rest, id=f"{n0}-{rest}") for n0, rest in ((990, 1010), (900, 1000), (760, 960))]


@pytest.mark.parametrize(("node0", "others"), MACHINES)
def test_single_numa_node_decisions_are_the_storys(node0: int, others: int) -> None:
    n = node(story.SINGLE, machine(node0, others))
    big = n.admit_pod(pod("big", "1", Memory(story.BIG_MIB)))
    assert not big.admitted and big.reason == "TopologyAffinityError"
    first = n.admit_pod(pod("first", "1", Memory(story.FITS_ONE_MIB))).container("app")
    second = n.admit_pod(pod("second", "1", Memory(story.FITS_ONE_MIB))).container("app")
    assert (first.cpus, first.mems, second.cpus, second.mems) == (S("0"), S("0"), S("2"), S("1"))
    pages = n.admit_pod(pod("pages", "1", Memory(64, hugepages_2m_mib=2 * story.PAGES_USED))).container("app")
    assert (pages.cpus, pages.mems) == (S("4"), S("2"))
    too_many = n.admit_pod(pod("too-many", "1", Memory(64, hugepages_2m_mib=2 * (story.PAGES + 2))))
    assert not too_many.admitted and too_many.reason == "UnexpectedAdmissionError"
    assert "failed to find NUMA nodes to extend the current topology hint" in too_many.message


@pytest.mark.parametrize(("node0", "others"), MACHINES)
def test_restricted_decision_is_the_storys(node0: int, others: int) -> None:
    n = node(story.RESTRICTED, machine(node0, others))
    wide = n.admit_pod(pod("wide", "4", Memory(story.BIG_MIB)))
    assert wide.admitted, wide.message
    assert (wide.container("app").cpus, wide.container("app").mems) == (S("0-3"), S("0-1"))


def test_1g_page_decisions_are_the_storys() -> None:
    """1s2n-nosmt (tests/numa/guest/test_hugepages_1g.py): nodes of 2 GiB, node 1's MemTotal with its 1 GiB page."""
    memory = MachineMemory((NodeMemory(0, 1900 * MI, ((2 * MI, 0), (gigantic.GIB, 0))),
                            NodeMemory(1, 2010 * MI, ((2 * MI, 0), (gigantic.GIB, 1)))))
    n = NodeAllocator(NodeConfig(
        topology=expected_topology("1s2n-nosmt"), reserved_cpus=S(gigantic.SINGLE.reserved),
        topology_manager_policy=gigantic.SINGLE.policy,
        memory=MemoryConfig(memory, "Static", parse_reserved_memory(gigantic.SINGLE.reserved_memory))))
    placed = n.admit_pod(pod("gigantic", "1", gigantic.PAGES)).container("app")
    assert (placed.cpus, placed.mems) == (S("2"), S(str(gigantic.PAGE_NODE)))
    too_many = n.admit_pod(pod("too-many", "1", gigantic.TOO_MANY))
    assert not too_many.admitted and too_many.reason == "UnexpectedAdmissionError"
    assert "failed to find NUMA nodes to extend the current topology hint" in too_many.message


# (MemTotal, MemFree) MiB per node as a 2s4c1t8n guest may show them: node 0 keeps the kernel
SPILL_MACHINES = [pytest.param(m, id=i) for i, m in (
    ("roomy", {n: (380, 300) if n == 0 else (490, 440) for n in range(8)}),
    ("busy", {n: (380, 200) if n == 0 else (490, 380) for n in range(8)}))]


@pytest.mark.parametrize("meminfo", SPILL_MACHINES)
def test_spill_decision_is_the_storys(meminfo: dict[int, tuple[int, int]]) -> None:
    """2s4c1t8n (tests/numa/guest/test_memory_spill.py): every node's reservation as the story computes it."""
    held = {n: total - free + spill.HEADROOM_MIB for n, (total, free) in meminfo.items()}
    reserved = ";".join(f"{k}:memory={v}Mi" for k, v in held.items())
    memory = MachineMemory(tuple(NodeMemory(k, total * MI) for k, (total, _) in meminfo.items()))
    allocatable = node_allocatable_reservation(
        memory_capacity=memory.capacity()["memory"],
        system_reserved={"memory": f"{sum(held.values()) - spill.EVICTION_MIB}Mi"})
    n = NodeAllocator(NodeConfig(
        topology=expected_topology("2s4c1t8n"), reserved_cpus=S("0"), topology_manager_policy="restricted",
        memory=MemoryConfig(memory, "Static", parse_reserved_memory(reserved), allocatable)))
    got = n.admit_pod(pod("spill", "2", Memory(spill.SPILL_MIB)))
    assert got.admitted, got.message
    nodes = S(",".join(map(str, spill.NODES)))
    assert (got.container("app").cpus, got.container("app").mems) == (nodes, nodes)
