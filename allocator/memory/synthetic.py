"""The Memory Manager of a node rebuilt from its NodeResourceTopology document (for the webhook's simulation).

Each zone's ``memory`` and ``hugepages-<size>`` resources give the machine state directly: total = capacity,
systemReserved = capacity - allocatable (for ``memory`` also minus the node's huge pages, as numapin publishes
``memory`` allocatable without them; never below 0), allocatable, reserved = allocatable - available,
free = available. The
group rule needs each node's assignments and group, which numapin's documents publish as zone attributes
(``numapinMemoryAssignments``, ``numapinMemoryCells``); for other exporters' documents a node holding memory is
taken as allocated alone (one assignment, its own group), which can only make the simulation stricter about
multi-node placements than the node, never looser about bytes.
"""

from __future__ import annotations

from ..errors import ConfigError
from ..nrt import NodeTopology
from .machine import MachineMemory, NodeMemory
from .policy import MemoryPolicy
from .resources import MEMORY, hugepage_size, is_hugepages
from .state import MemoryState, MemoryTable, NodeState

__all__ = ["memory_from_nrt"]


def memory_from_nrt(node: NodeTopology) -> tuple[MemoryPolicy, MemoryState] | None:
    """The policy and state of the published node, None when its zones carry no memory. ConfigError for a zone
    whose huge-page capacity is not a whole number of pages."""
    if not node.zones or not all(MEMORY in z.memory for z in node.zones):
        return None
    nodes: list[NodeMemory] = []
    reserved: dict[int, dict[str, int]] = {}
    state = MemoryState()
    for z in node.zones:
        pages: list[tuple[int, int]] = []
        tables: dict[str, MemoryTable] = {}
        for r, (capacity, allocatable, available) in z.memory.items():
            if is_hugepages(r):
                size = hugepage_size(r)
                if capacity % size:
                    raise ConfigError(f"{node.name} node-{z.numa}: {r} capacity {capacity} is not a whole number "
                                      f"of pages")
                pages.append((size, capacity // size))
            tables[r] = MemoryTable(capacity, capacity - allocatable, allocatable, allocatable - available, available)
        huge = sum(size * count for size, count in pages)
        mem = tables[MEMORY]
        mem.system_reserved = max(mem.system_reserved - huge, 0)
        nodes.append(NodeMemory(z.numa, z.memory[MEMORY][0], tuple(sorted(pages))))
        reserved[z.numa] = {r: t.system_reserved for r, t in tables.items()}
        used = any(t.reserved for t in tables.values())
        assignments = z.memory_assignments if z.memory_assignments is not None else (1 if used else 0)
        cells = tuple(z.memory_cells) if z.memory_cells is not None and assignments else (z.numa,)
        state.machine[z.numa] = NodeState(assignments, tables, cells)
    policy = MemoryPolicy(MachineMemory(tuple(nodes)), reserved, require_reserved=False)
    return policy, state
