"""full-pcpus-only on a real SMT kernel (CPU 0 reserved): exclusive CPUs come as whole cores (both SMT siblings
as the kernel lists them) and the half core next to the reserved CPU is never handed out; a request that is not a
multiple of the threads per core is refused with kubelet's SMTAlignmentError, after the topology manager has
judged it (kubelet's order: an odd request no NUMA node can hold fails single-numa-node first)."""

from __future__ import annotations

from allocator.cpuset import CPUSet
from allocator.topology import Topology
from tests.numa.guest.node import GuestNode, NodeConfig

FULL = "full-pcpus-only=true"


def test_odd_request_refused_with_smt_alignment_error(node: GuestNode) -> None:
    node.configure(NodeConfig("single-numa-node", "0", cpu_options=FULL))
    refusal = node.refuse("odd1", "1", limit="1")  # fits a node, but not as whole cores
    assert refusal.code == "FAILED_PRECONDITION", refusal
    assert "SMTAlignmentError" in refusal.message, refusal


def test_odd_request_no_node_holds_fails_the_topology_manager_first(node: GuestNode) -> None:
    refusal = node.refuse("odd3", "3", limit="3")
    assert "TopologyAffinityError" in refusal.message, refusal


def test_whole_cores_only(node: GuestNode, machine: Topology) -> None:
    node.configure(NodeConfig("single-numa-node", "0", cpu_options=FULL))
    whole = [core for core in machine.cores if not (machine.cpus_in_core(core) & CPUSet([0]))]
    for i, core in enumerate(whole):
        node.run(f"core{i}", "2", limit="2")
        k = node.kernel(f"core{i}")
        assert k.cpus == machine.cpus_in_core(core), (core, k)
        assert k.mems == machine.numa_of(k.cpus) and len(k.mems) == 1, k
    refusal = node.refuse("half", "2", limit="2")  # only CPU 1 is left: half a core
    assert refusal.code == "FAILED_PRECONDITION", refusal
