"""The Memory Manager story of the 2s4n VM (tests/numa/guest/test_memory.py) replayed on the host against the
allocator, on the VM's machine as tests.numa.shapes models it and 1 GiB nodes with what the guest kernel keeps for
itself taken off MemTotal: the CPUs and memory nodes the story expects from the kernel are the ones numapin decides,
so a change of the decisions shows here, without a VM."""

from __future__ import annotations

import pytest

from allocator import NodeAllocator, NodeConfig
from allocator.cpuset import CPUSet
from allocator.memory import MachineMemory, NodeMemory, parse_reserved_memory
from allocator.memory.config import MemoryConfig
from allocator.pod import PodInfo
from tests.numa.guest import test_memory as story
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
