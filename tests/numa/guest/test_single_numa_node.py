"""single-numa-node on a real multi-NUMA kernel, as one story (CPU 0 reserved): a shared pod runs everywhere;
an exclusive pod gets the CPUs and the memory of one whole node, and the memory it touches lands there; the
shared pod is narrowed off that node (its memory nodes too) but keeps a node that is only partly pinned; a pod
that fits no single node is refused with kubelet's reason and takes nothing; deleting the pinned pods widens the
shared pod back to every CPU and node."""

from __future__ import annotations

import time
from collections.abc import Mapping

from allocator.cpuset import CPUSet
from allocator.topology import Topology
from tests.numa.guest.node import GuestNode, NodeConfig, node_meminfo

RESERVED = CPUSet([0])
MIB = 48  # what the exclusive pod writes to its tmpfs /dev/shm


def largest_node(machine: Topology) -> tuple[int, int]:
    """(size, node): the most CPUs one node can pin, and the lowest node that has that many."""
    free = {n: len(machine.cpus_in_numa(n) - RESERVED) for n in machine.cpu_numa_nodes}
    k = max(free.values())
    return k, min(n for n, f in free.items() if f == k)


def assert_everywhere(node: GuestNode, name: str, machine: Topology) -> None:
    """The container runs on every CPU and memory node (its process and its cpuset cgroup), once settled."""
    everything, all_nodes = machine.all_cpus, CPUSet(machine.numa_nodes)
    k = node.settled(name, everything, all_nodes)
    assert (k.cpus, k.mems, k.cgroup_cpus, k.cgroup_mems) == (everything, all_nodes, everything, all_nodes), k


def assert_off_node(node: GuestNode, name: str, machine: Topology, n: int) -> None:
    """The shared container runs on every CPU but node ``n``'s pinned ones, with those CPUs' memory nodes."""
    rest = machine.all_cpus - (machine.cpus_in_numa(n) - RESERVED)
    k = node.settled(name, rest, machine.numa_of(rest))
    assert (k.cpus, k.mems, k.cgroup_cpus, k.cgroup_mems) == (rest, machine.numa_of(rest), rest,
                                                              machine.numa_of(rest)), k
    assert n not in k.mems


def assert_memory_landed(n: int, before: Mapping[int, int], machine: Topology) -> None:
    """The MIB a container wrote to its /dev/shm shows in node ``n``'s Shmem (``before``: each node's, kB), and
    not in the other nodes'."""
    deadline = time.monotonic() + 120  # dd under emulation
    while node_meminfo(n, "Shmem") - before[n] < MIB * 1024 * 0.9 and time.monotonic() < deadline:
        time.sleep(0.5)
    grown = {m: node_meminfo(m, "Shmem") - before[m] for m in machine.numa_nodes}
    assert grown[n] >= MIB * 1024 * 0.9, f"node {n} Shmem grew by {grown[n]} kB only (all nodes, kB: {grown})"
    assert all(g < 8 * 1024 for m, g in grown.items() if m != n), f"memory landed on other nodes (kB): {grown}"


SHMEM_BEFORE: dict[int, int] = {}


def test_shared_pod_runs_on_every_cpu_and_node(node: GuestNode, machine: Topology) -> None:
    node.configure(NodeConfig("single-numa-node", str(RESERVED)))
    node.run("web", "250m")
    assert_everywhere(node, "web", machine)


def test_exclusive_container_gets_one_whole_node(node: GuestNode, machine: Topology) -> None:
    size, n = largest_node(machine)
    SHMEM_BEFORE.update({m: node_meminfo(m, "Shmem") for m in machine.numa_nodes})
    node.run("db", str(size), limit=str(size),
             command=("sh", "-c", f"dd if=/dev/zero of=/dev/shm/fill bs=1M count={MIB} && exec sleep 86400"))
    want = machine.cpus_in_numa(n) - RESERVED
    k = node.settled("db", want, CPUSet([n]))
    assert (k.cpus, k.mems, k.cgroup_cpus, k.cgroup_mems) == (want, CPUSet([n]), want, CPUSet([n])), k


def test_shared_pod_narrowed_off_that_node_with_its_memory(node: GuestNode, machine: Topology) -> None:
    assert_off_node(node, "web", machine, largest_node(machine)[1])


def test_memory_the_exclusive_container_touches_lands_on_its_node(node: GuestNode, machine: Topology) -> None:
    assert_memory_landed(largest_node(machine)[1], SHMEM_BEFORE, machine)


def test_partly_pinned_node_stays_in_the_shared_pools_memory(node: GuestNode, machine: Topology) -> None:
    _, n = largest_node(machine)
    node.run("one", "1", limit="1")
    # the lowest node with a free CPU left: on 2s4n and 1s2n node 0 (CPU 1 next to the reserved CPU 0)
    taken = machine.cpus_in_numa(n) | RESERVED
    first = min(m for m in machine.cpu_numa_nodes if machine.cpus_in_numa(m) - taken)
    want = CPUSet([(machine.cpus_in_numa(first) - taken).min()])
    one = node.settled("one", want, CPUSet([first]))
    assert (one.cpus, one.mems) == (want, CPUSet([first])), one
    rest = machine.all_cpus - (machine.cpus_in_numa(n) - RESERVED) - want
    web = node.settled("web", rest, machine.numa_of(rest))
    assert (web.cpus, web.mems) == (rest, machine.numa_of(rest)), web


def test_pod_fitting_no_single_node_is_refused_with_kubelets_reason(node: GuestNode, machine: Topology) -> None:
    size, _ = largest_node(machine)
    before = node.kernel("web")
    refusal = node.refuse("big", str(size + 1), limit=str(size + 1))
    assert refusal.code == "FAILED_PRECONDITION", refusal
    assert "TopologyAffinityError" in refusal.message and "single-numa-node" in refusal.message, refusal
    assert node.kernel("web").cpus == before.cpus, "the refused pod took CPUs from the shared pool"


def test_deleting_the_pinned_pods_widens_the_shared_pod_back(node: GuestNode, machine: Topology) -> None:
    node.delete("db", "one")
    assert_everywhere(node, "web", machine)
