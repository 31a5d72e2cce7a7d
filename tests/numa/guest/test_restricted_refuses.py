"""Where only a non-preferred alignment exists (the free CPUs are scattered so that more nodes than the
narrowest possible are needed), restricted refuses the pod with kubelet's reason and best-effort admits it on
the lowest of the narrowest such sets of nodes."""

from __future__ import annotations

from allocator.cpuset import CPUSet
from tests.numa.guest.node import GuestNode, NodeConfig
from tests.numa.shapes import Shape

# shape -> (reserved CPUs, CPUs asked, CPUs best-effort gives, its memory nodes)
SCATTERED = {
    # free: node0 {1}, node1 {3}, node2 {5}, node3 {6,7}; 4 CPUs fit 2 nodes of this machine, never 2 free ones
    "2s4n": ("0,2,4", "4", "1,3,6-7", "0-1,3"),
    # free: node0 {1}, node1 {3}; 2 CPUs fit one node, but no node has 2 free
    "1s2n-nosmt": ("0,2", "2", "1,3", "0-1"),
}


def test_restricted_refuses_a_non_preferred_alignment(node: GuestNode, shape: Shape) -> None:
    reserved, ask, _cpus, _mems = SCATTERED[shape.name]
    node.configure(NodeConfig("restricted", reserved))
    refusal = node.refuse("scattered", ask, limit=ask)
    assert refusal.code == "FAILED_PRECONDITION", refusal
    assert "TopologyAffinityError" in refusal.message and "restricted" in refusal.message, refusal


def test_best_effort_admits_it_across_nodes(node: GuestNode, shape: Shape) -> None:
    reserved, ask, cpus, mems = SCATTERED[shape.name]
    node.configure(NodeConfig("best-effort", reserved))
    node.run("scattered", ask, limit=ask)
    k = node.settled("scattered", CPUSet.parse(cpus), CPUSet.parse(mems))
    assert (k.cpus, k.mems, k.cgroup_cpus, k.cgroup_mems) == (CPUSet.parse(cpus), CPUSet.parse(mems),
                                                              CPUSet.parse(cpus), CPUSet.parse(mems)), k
