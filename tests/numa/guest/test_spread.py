"""restricted on a real multi-NUMA kernel: a container asking more CPUs than one node holds gets them from the
fewest nodes that can hold them (kubelet's preferred hint: the lowest such set of nodes), and its memory from
exactly those nodes. (best-effort makes the same choice for a preferred hint; what it does differently, admitting
a non-preferred one, is test_restricted_refuses.py's.)"""

from __future__ import annotations

from allocator.cpuset import CPUSet
from tests.numa.guest.node import GuestNode, NodeConfig
from tests.numa.shapes import Shape

# shape -> (CPUs asked, CPUs given, memory nodes); reserved CPU 0, nothing else pinned. Worked out by hand with
# kubelet's rules: the narrowest masks whose CPUs can hold the request are preferred, the lowest of them wins.
PREFERRED = {
    "2s4n": ("3", "1-3", "0-1"),        # nodes {0,1}: CPU 1 (0 is reserved) and 2-3
    "1s2n-nosmt": ("3", "1-3", "0-1"),
    "2s4c1t8n": ("3", "1-3", "1-3"),    # one CPU per node: node 0 has none free
}


def test_spread_over_the_fewest_nodes(node: GuestNode, shape: Shape) -> None:
    node.configure(NodeConfig("restricted", "0"))
    ask, cpus, mems = PREFERRED[shape.name]
    node.run("wide", ask, limit=ask)
    k = node.settled("wide", CPUSet.parse(cpus), CPUSet.parse(mems))
    assert (k.cpus, k.mems, k.cgroup_cpus, k.cgroup_mems) == (CPUSet.parse(cpus), CPUSet.parse(mems),
                                                              CPUSet.parse(cpus), CPUSet.parse(mems)), k
