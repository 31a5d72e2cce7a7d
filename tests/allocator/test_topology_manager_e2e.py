"""End to end through the topology manager: random pods on random topologies (up to 8 NUMA nodes, some
without CPUs) get the same admit decisions, reasons, affinities and CPUs with the fast merge and with the
exhaustive reference merge, for every policy, both scopes and prefer-closest-numa-nodes."""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest

from allocator.cpuset import CPUSet
from allocator.device_hints import DeviceHintProvider
from allocator.hints import TopologyHint
from allocator.memory_hints import MemoryHintProvider
from allocator.merge import ProviderHints
from allocator.state import CPUState
from allocator.topology_manager import NonePolicy, Policy, TopologyManager, new_policy, new_scope
from tests.allocator.merge_reference import reference_merge
from tests.allocator.topomgr_helpers import SimpleCPUProvider, make_topology, pod


class ReferencePolicy(Policy):
    """Same policy, merged by the exhaustive reference (kubelet's literal cross product)."""

    def __init__(self, inner: Policy) -> None:
        object.__setattr__(self, "numa_nodes", inner.numa_nodes)
        object.__setattr__(self, "distances", inner.distances)
        object.__setattr__(self, "options", inner.options)
        object.__setattr__(self, "_inner", inner)

    @property
    def name(self) -> str:  # type: ignore[override]
        return self._inner.name  # type: ignore[attr-defined]

    def merge(self, providers_hints: Sequence[ProviderHints]) -> tuple[TopologyHint, bool]:
        closest = "true" if self.options.prefer_closest_numa else "false"
        return reference_merge(providers_hints, policy=self.name, numa_nodes=self.numa_nodes,
                               distances=self.distances, options={"prefer-closest-numa-nodes": closest})


def _reference(inner: Policy) -> Policy:
    """Policy none merges nothing (and takes the none scope): it is its own reference."""
    return inner if isinstance(inner, NonePolicy) else ReferencePolicy(inner)


def _case(rng: random.Random) -> tuple:
    sockets = rng.randint(1, 2)
    per_socket = rng.randint(1, 4 // sockets * 2 if sockets == 1 else 4)
    cpu_less = rng.randint(0, 2) if sockets * per_socket <= 6 else 0
    topo = make_topology(sockets, per_socket, rng.randint(1, 3), rng.randint(1, 2), cpu_less=cpu_less)
    small = topo.num_numa_nodes <= 5
    taken = CPUSet(c for c in topo.all_cpus if rng.random() < 0.3)
    pods = []
    for i in range(rng.randint(1, 3)):
        cpus = tuple(rng.randint(1, max(1, topo.num_cpus // 3)) for _ in range(rng.randint(1, 3)))
        init = tuple(rng.randint(1, 3) for _ in range(rng.randint(0, 1)))
        p = pod(f"p{i}", *cpus, init=init)
        devices = {}
        if small:
            for c in p.containers:
                if rng.random() < 0.4:
                    devices[c.name] = {"example.com/gpu": {rng.choice(topo.numa_nodes)}}
        pods.append((p, devices))
    return topo, taken, pods


@pytest.mark.parametrize("seed", range(4))
def test_fast_and_reference_admit_the_same(seed: int) -> None:
    rng = random.Random(9000 + seed)
    for _ in range(30):
        topo, taken, pods = _case(rng)
        for policy in ("none", "best-effort", "restricted", "single-numa-node"):
            for scope in ("container", "pod"):
                closest = rng.choice(["false", "true"])
                fast = TopologyManager.from_config(numa_nodes=topo.numa_nodes, policy=policy, scope=scope,
                                                   options={"prefer-closest-numa-nodes": closest},
                                                   distances=topo.numa_distances)
                ref_policy = _reference(new_policy(policy, topo.numa_nodes, distances=topo.numa_distances,
                                                        options={"prefer-closest-numa-nodes": closest}))
                ref = TopologyManager(policy=ref_policy, scope=new_scope(scope, ref_policy))
                states = [CPUState(default_cpuset=topo.all_cpus - taken) for _ in range(2)]
                for p, devices in pods:
                    results = []
                    for tm, state in zip((fast, ref), states, strict=True):
                        providers = [SimpleCPUProvider(topo), MemoryHintProvider(),
                                     DeviceHintProvider(devices, topo.numa_nodes)]
                        results.append(tm.admit(state, p, providers))
                    a, b = results
                    assert (a.admitted, a.reason, a.message, a.failed_container) == \
                        (b.admitted, b.reason, b.message, b.failed_container), (policy, scope, p)
                    assert [c.affinity for c in a.containers] == [c.affinity for c in b.containers]
                    assert states[0] == states[1]


# -- through the real static policy and the node facade -------------------------------------------------
def _static_case(rng: random.Random) -> tuple:
    sockets = rng.randint(1, 2)
    per_socket = rng.randint(1, 4)
    cpu_less = rng.randint(0, 2) if sockets * per_socket <= 6 else 0
    topo = make_topology(sockets, per_socket, rng.randint(1, 3), rng.randint(1, 2), cpu_less=cpu_less)
    options = rng.choice([{}, {}, {"full-pcpus-only": "true"}, {"distribute-cpus-across-numa": "true"}])
    reserved = rng.randint(1, 2)
    small = topo.num_numa_nodes <= 5
    pods = []
    for i in range(rng.randint(2, 4)):
        cpus = tuple(rng.randint(1, max(1, topo.num_cpus // 3)) for _ in range(rng.randint(1, 3)))
        init = tuple(rng.randint(1, 3) for _ in range(rng.randint(0, 1)))
        p = pod(f"p{i}", *cpus, init=init)
        devices = {}
        if small:
            for c in p.containers:
                if rng.random() < 0.3:
                    devices[c.name] = {"example.com/gpu": {rng.choice(topo.numa_nodes)}}
        pods.append((p, devices))
    return topo, options, reserved, pods


@pytest.mark.parametrize("seed", range(4))
def test_static_policy_admissions_fast_vs_reference_and_node_facade(seed: int) -> None:
    """Random pods on random topologies up to 8 NUMA nodes: the StaticPolicy admitted through the topology
    manager with the fast merge and with the exhaustive reference give the same decisions and CPUs, and so
    does the node facade (NodeAllocator, transactional: a rejected pod leaves the state as it was)."""
    import copy

    from allocator.node import NodeAllocator, NodeConfig
    from allocator.static_policy import StaticPolicy

    rng = random.Random(4242 + seed)
    compared = 0
    for _ in range(12):
        topo, options, reserved, pods = _static_case(rng)
        for policy in ("best-effort", "restricted", "single-numa-node"):
            for scope in ("container", "pod"):
                closest = rng.choice(["false", "true"])
                tm_opts = {"prefer-closest-numa-nodes": closest}
                node = NodeAllocator(NodeConfig(topology=topo, num_reserved_cpus=reserved,
                                                cpu_manager_policy_options=options,
                                                topology_manager_policy=policy, topology_manager_scope=scope,
                                                topology_manager_policy_options=tm_opts))
                fast = TopologyManager.from_config(numa_nodes=topo.numa_nodes, policy=policy, scope=scope,
                                                   options=tm_opts, distances=topo.numa_distances)
                ref_policy = _reference(new_policy(policy, topo.numa_nodes, distances=topo.numa_distances,
                                                        options=tm_opts))
                ref = TopologyManager(policy=ref_policy, scope=new_scope(scope, ref_policy))
                static = StaticPolicy(topo, num_reserved_cpus=reserved, options=options,
                                      topology_manager_policy=policy)
                states = {"fast": node.state.copy(), "ref": node.state.copy()}
                policies = {"fast": static, "ref": copy.copy(static)}
                for p, devices in pods:
                    results = {}
                    for name, tm in (("fast", fast), ("ref", ref)):
                        work = states[name].copy()
                        sp = copy.copy(policies[name])
                        r = tm.admit(work, p, [sp, MemoryHintProvider(), DeviceHintProvider(devices, topo.numa_nodes)])
                        results[name] = r
                        if r.admitted:  # transactional, like the node facade
                            states[name], policies[name] = work, sp
                    a, b = results["fast"], results["ref"]
                    assert (a.admitted, a.reason, a.message) == (b.admitted, b.reason, b.message)
                    assert [c.affinity for c in a.containers] == [c.affinity for c in b.containers]
                    assert states["fast"] == states["ref"]
                    d = node.admit_pod(p, devices=devices)
                    assert (d.admitted, d.reason) == (b.admitted, b.reason), (policy, scope, p, d.message)
                    if d.admitted:
                        assert [c.affinity for c in d.containers] == [c.affinity for c in b.containers]
                        for c in p.containers:
                            assert node.container_cpus(p.uid, c.name) == states["ref"].get(p.uid, c.name)
                    compared += 1
    assert compared > 200
