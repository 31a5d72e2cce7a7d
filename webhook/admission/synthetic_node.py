"""The machine the webhook's simulation rebuilds from a node's NodeResourceTopology (``allocator.nrt.NodeTopology``).

An NRT document carries counts, not CPU ids: the machine rebuilt here has the node's NUMA nodes, CPU counts,
sockets, SMT and distances, its reserved CPUs and (``occupied``) the CPUs other pods hold, each placed by the rules
in the functions' docstrings. ``synthetic_config`` is the node's kubelet configuration on that machine, for
``allocator.node.build_node``. Nothing here does I/O.
"""

from __future__ import annotations

from allocator.cpuset import CPUSet
from allocator.memory.policy import MemoryPolicy
from allocator.memory.state import MemoryState
from allocator.memory.synthetic import memory_from_nrt
from allocator.node import NodeAllocator, NodeConfig, NodeParts
from allocator.nrt import NodeTopology, NUMAZone
from allocator.state import CPUState
from allocator.topology import CPUInfo, Topology

__all__ = ["OCCUPIED_POD_UID", "copy_allocator", "synthetic_allocator", "synthetic_config", "synthetic_memory",
           "synthetic_reserved", "synthetic_state", "synthetic_topology"]

# pod uid under which synthetic_state() records CPUs other pods hold on the node
OCCUPIED_POD_UID = "numapin.io/occupied"


def synthetic_topology(node: NodeTopology) -> Topology:
    """A machine with the node's NUMA nodes and CPU counts, rebuilt from counts alone.

    Approximations (an NRT carries counts, not the CPU ids): NUMA node ``n`` gets ``capacity`` consecutive CPU ids;
    every ``threads_per_core`` consecutive ids form a core (one thread per core when a NUMA node's count is not a
    multiple of it); a NUMA node sits on its ``numapinSocket`` socket (its own socket when absent); the L3 (uncore)
    id is the socket id; NUMA distances come from the zones' costs (none when any is missing).
    """
    tpc = node.threads_per_core if node.threads_per_core > 0 else 1
    if any(z.capacity % tpc for z in node.zones):
        tpc = 1
    cpus: list[CPUInfo] = []
    base = 0
    for z in node.zones:
        socket = z.numa if z.socket is None else z.socket
        for i in range(z.capacity):
            cpu = base + i
            core = base + (i // tpc) * tpc
            cpus.append(CPUInfo(cpu=cpu, core=core, socket=socket, numa=z.numa, uncore=socket))
        base += z.capacity
    nodes = tuple(z.numa for z in node.zones)
    distances: dict[int, tuple[int, ...]] | None = None
    if node.zones and all(z.distances is not None and set(z.distances) >= set(nodes) for z in node.zones):
        distances = {z.numa: tuple(z.distances[m] for m in nodes) for z in node.zones}  # type: ignore[index]
    return Topology(cpus=tuple(cpus), numa_nodes=nodes, numa_distances=distances)


def synthetic_reserved(node: NodeTopology, topology: Topology) -> CPUSet:
    """Reserved CPUs of the synthetic machine: per NUMA node, its lowest CPU ids (kubelet takes reserved CPUs by
    ascending core id)."""
    mask = 0
    for z in node.zones:
        for cpu in list(topology.cpus_in_numa(z.numa))[: z.reserved]:
            mask |= 1 << cpu
    return CPUSet.from_mask(mask)


def synthetic_config(node: NodeTopology, topology: Topology, *, pod_level_managers: bool = False) -> NodeConfig:
    """The node's CPU- and topology-manager configuration, as published, on the synthetic machine ``topology``;
    ``pod_level_managers``: the kubelets' ``PodLevelResourceManagers`` gate (the webhook's ``--feature-gates``)."""
    return NodeConfig(
        topology=topology,
        reserved_cpus=synthetic_reserved(node, topology),
        cpu_manager_policy_options=dict(node.cpu_manager_policy_options),
        topology_manager_policy=node.topology_manager_policy,
        topology_manager_scope=node.topology_manager_scope,
        topology_manager_policy_options=dict(node.topology_manager_policy_options),
        pod_level_resource_managers=pod_level_managers,
    )


def synthetic_state(node: NodeTopology, topology: Topology, *, occupied: bool = True) -> CPUState:
    """The CPU state of the synthetic machine: CPUs other pods hold are assigned to the pseudo pod
    ``OCCUPIED_POD_UID`` (one pseudo container per NUMA node), the rest is the shared (default) pool.

    Which CPUs are taken is an approximation: per NUMA node, from its highest ids down, leaving
    ``numapinAvailableCores`` whole free cores (all free CPUs as whole cores when the attribute is absent) and the
    remaining free CPUs as lone threads of otherwise busy cores. With ``occupied=False`` the node is empty (for
    "could this node ever admit the pod").
    """
    reserved = synthetic_reserved(node, topology)
    assignments: dict[str, CPUSet] = {}
    if occupied:
        for z in node.zones:
            taken = _occupied_cpus(topology, z, reserved)
            if taken:
                assignments[f"numa-{z.numa}"] = taken
    assigned = 0
    for cpus in assignments.values():
        assigned |= cpus.mask
    state = CPUState(default_cpuset=CPUSet.from_mask(topology.all_cpus.mask & ~assigned))
    for name, cpus in assignments.items():
        state.set(OCCUPIED_POD_UID, name, cpus, "exclusive")
    return state


def _occupied_cpus(topology: Topology, z: NUMAZone, reserved: CPUSet) -> CPUSet:
    if z.occupied <= 0:
        return CPUSet()
    allocatable = topology.cpus_in_numa(z.numa) - reserved
    # cores of the NUMA node that hold no reserved CPU, highest first
    cores: list[CPUSet] = []
    seen: set[int] = set()
    for cpu in sorted(allocatable, reverse=True):
        core = topology.cpu(cpu).core
        if core in seen:
            continue
        seen.add(core)
        cores.append(topology.cpus_in_core(core) & allocatable)
    cores.reverse()  # ascending: free whole cores come first, busy ones at the top
    free_total = z.available
    whole = free_total // topology.threads_per_core if topology.threads_per_core else free_total
    if z.available_cores is not None:
        whole = min(whole, z.available_cores)
    free = 0
    left = free_total
    idx = 0
    for _ in range(whole):
        if idx >= len(cores) or left < len(cores[idx]):
            break
        free |= cores[idx].mask
        left -= len(cores[idx])
        idx += 1
    # the remaining free CPUs: one thread of each following core, then fill up
    extra = []
    for threads in cores[idx:]:
        extra.append(threads.min())
    for threads in cores[idx:]:
        extra.extend(c for c in threads if c != threads.min())
    for cpu in extra[:left]:
        free |= 1 << cpu
    return CPUSet.from_mask(allocatable.mask & ~free)


def synthetic_memory(node: NodeTopology) -> tuple[MemoryPolicy, MemoryState] | None:
    """The node's Memory Manager rebuilt from its zones' memory and huge pages (allocator.memory.synthetic), None
    when the zones carry no memory or the node publishes ``memoryManagerPolicy: None`` (kubelet does not judge
    memory there). ConfigError for a zone that cannot be read as memory."""
    if node.memory_manager_policy == "None":
        return None
    return memory_from_nrt(node)


def synthetic_allocator(node: NodeTopology, *, occupied: bool, pod_level_managers: bool = False) -> NodeAllocator:
    """The node's allocator on the synthetic machine: its CPUs (``synthetic_state``) and, when it publishes memory,
    its Memory Manager, with the memory its containers hold (``occupied``) or none. The published memory state is
    taken as it is: it has no entries to check it against (its containers are counted, not listed)."""
    from allocator.node import build_node

    topology = synthetic_topology(node)
    parts = build_node(synthetic_config(node, topology, pod_level_managers=pod_level_managers))
    memory = synthetic_memory(node)
    if memory is not None:
        parts = NodeParts(parts.config, parts.static_policy, parts.topology_manager, memory[0])
    alloc = NodeAllocator(parts, synthetic_state(node, topology, occupied=occupied))
    if memory is not None and occupied:
        alloc.memory_state = memory[1].copy()
    return alloc


def copy_allocator(alloc: NodeAllocator) -> NodeAllocator:
    """Another allocator of the same synthetic node on copies of its states (``NodeAllocator.copy`` would check the
    memory state against its entries, which a published state does not list)."""
    out = NodeAllocator(alloc.parts, alloc.state)
    out.memory_state = None if alloc.memory_state is None else alloc.memory_state.copy()
    return out
