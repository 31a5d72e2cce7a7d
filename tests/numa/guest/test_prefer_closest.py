"""prefer-closest-numa-nodes on a real kernel's distances (SLIT: 10 local, 12 within a socket, 20 across):
among equally narrow sets of nodes kubelet normally takes the lowest; with the option, the nearest."""

from __future__ import annotations

from allocator.cpuset import CPUSet
from allocator.topology import Topology
from tests.numa.guest.node import GuestNode, NodeConfig
from tests.numa.shapes import Shape

# shape -> (CPUs of the pods pinned first, one pod each; CPUs asked; memory nodes without the option (the lowest
# narrow set, across sockets); memory nodes with it (the nearest narrow set)). Restricted, CPU 0 reserved.
CASES = {
    # first pod takes node 1; 3 CPUs need 2 nodes: {0,2} (CPU 1 + node 2, distance 20) or {2,3} (distance 12)
    "2s4n": (("2",), "3", "0,2", "2-3"),
    # first pods take nodes 1 and 2; 2 CPUs: {3,4} (across sockets, 20) or {4,5} (within socket 1, 12)
    "2s4c1t8n": (("1", "1"), "2", "3-4", "4-5"),
}


def _place(node: GuestNode, shape: Shape, machine: Topology) -> tuple[CPUSet, CPUSet]:
    first, ask, _, _ = CASES[shape.name]
    for i, cpus in enumerate(first):
        node.run(f"first{i}", cpus, limit=cpus)
    node.run("wide", ask, limit=ask)
    k = node.kernel("wide")
    assert k.cgroup_cpus == k.cpus and k.cgroup_mems == k.mems, k
    assert machine.numa_of(k.cpus) == k.mems, k
    return k.cpus, k.mems


def test_without_the_option_the_lowest_nodes_win(node: GuestNode, shape: Shape, machine: Topology) -> None:
    node.configure(NodeConfig("restricted", "0"))
    cpus, mems = _place(node, shape, machine)
    assert mems == CPUSet.parse(CASES[shape.name][2]), (cpus, mems)


def test_prefer_closest_numa_nodes_picks_the_nearest(node: GuestNode, shape: Shape, machine: Topology) -> None:
    node.configure(NodeConfig("restricted", "0", topology_options="prefer-closest-numa-nodes=true"))
    cpus, mems = _place(node, shape, machine)
    want = CPUSet.parse(CASES[shape.name][3])
    assert mems == want, (cpus, mems)
    assert len(cpus) == int(CASES[shape.name][1]) and cpus.issubset(machine.cpus_in_numas(want)), cpus
    assert max(machine.distance(a, b) for a in want for b in want) == 12
