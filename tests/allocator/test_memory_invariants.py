"""Seeded churn through the node facade with the Memory Manager: after every admission, refusal and release the
memory state adds up as kubelet checks it at a restart (allocator.memory.policy.start), no free count goes below
zero, the state file round-trips, and a refused pod changed nothing."""

from __future__ import annotations

import random

import pytest

from allocator import NodeAllocator, NodeConfig
from allocator.memory import MachineMemory, MemoryState, parse_memory_checkpoint, parse_reserved_memory
from allocator.memory.checkpoint import serialize_memory_checkpoint
from allocator.memory.config import MemoryConfig
from tests.allocator.memory_tables import GI, H1G, H2M, MI, container, pod
from tests.topologies import dual_socket_multi_numa_per_socket_ht

POLICIES = ("none", "best-effort", "restricted", "single-numa-node")


def _node(rng: random.Random) -> NodeAllocator:
    topo = dual_socket_multi_numa_per_socket_ht()  # 4 NUMA nodes
    machine = MachineMemory.uniform(topo.numa_nodes, 8 * GI, ((2 * MI, 512), (GI, 2)))
    return NodeAllocator(NodeConfig(
        topology=topo, num_reserved_cpus=2, topology_manager_policy=rng.choice(POLICIES),
        topology_manager_scope=rng.choice(("container", "pod")),
        memory=MemoryConfig(machine, "Static", parse_reserved_memory("0:memory=100Mi"))))


def _pod(rng: random.Random, uid: str):
    def one(name: str, role: str = "app"):
        pages = {}
        if rng.random() < 0.3:
            pages[H2M] = rng.choice((2, 64, 512)) * MI
        if rng.random() < 0.2:
            pages[H1G] = GI
        return container(name, rng.choice((256 * MI, GI, 3 * GI, 7 * GI, 12 * GI)), role=role,
                         cpu=rng.choice((500, 1000, 2000, 4000)), hugepages=pages)
    cs = [one(f"init{i}", "init") for i in range(rng.randint(0, 1))]
    cs += [one(f"side{i}", "sidecar") for i in range(rng.randint(0, 1))]
    cs += [one(f"app{i}") for i in range(rng.randint(1, 2))]
    qos = "Guaranteed" if rng.random() < 0.8 else "Burstable"
    return pod(uid, *cs, qos=qos, mode=rng.choice((None, None, "exclusive")))


def _check(n: NodeAllocator) -> None:
    st = n.memory_state
    assert st is not None and n.memory_policy is not None
    for node in st.machine.values():
        for t in node.memory.values():
            assert t.free >= 0 and t.reserved >= 0 and t.free + t.reserved == t.allocatable
    fresh = st.copy()
    n.memory_policy.start(fresh)  # adds up: a restart would accept it
    policy, loaded = parse_memory_checkpoint(serialize_memory_checkpoint(st))
    assert policy == "Static" and loaded == st


@pytest.mark.parametrize("seed", range(25))
def test_churn_keeps_the_memory_state_consistent(seed):
    rng = random.Random(seed)
    n = _node(rng)
    live: list[str] = []
    admitted = refused = 0
    for i in range(30):
        if live and rng.random() < 0.35:
            uid = live.pop(rng.randrange(len(live)))
            if rng.random() < 0.5:
                n.release_pod(uid)
            else:
                for name in sorted((n.memory_state or MemoryState()).assignments.get(uid, {})):
                    n.release_container(uid, name)
                n.release_pod(uid)
        else:
            p = _pod(rng, f"p{i}")
            before = (n.memory_state.copy() if n.memory_state else None, n.state.copy())
            d = n.admit_pod(p)
            if d.admitted:
                admitted += 1
                live.append(p.uid)
                for c in d.containers:
                    held = n.container_mems(p.uid, c.name)
                    assert c.mems == (held if held is not None else n.topology.numa_of(c.cpus))
            else:
                refused += 1
                assert (n.memory_state, n.state) == before
        _check(n)
    assert admitted  # the churn did something
