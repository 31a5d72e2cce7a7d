"""The Memory Manager's state: the machine state per NUMA node and the memory blocks of each container.

Field for field kubelet's (``state.NUMANodeMap`` and ``ContainerMemoryAssignments``):

- per NUMA node: ``assignments`` (kubelet's numberOfAssignments: one per block touching the node), ``memory`` per
  resource (``memory``, ``hugepages-<size>``) as a ``MemoryTable`` (total, systemReserved, allocatable, reserved,
  free) and ``cells``: the node and every node grouped with it by a multi-node allocation (just the node itself
  when it holds none);
- per pod UID and container name, the container's blocks: ``Block(numa, resource, size)``.

``reuse_pod``/``reuse`` are the static policy's init-container memory reuse (kubelet's
``initContainersReusableMemory``: bytes per NUMA mask and resource, for one pod at a time): working state that
travels with each copy, so an admission rolled back (or a dry run) leaves none behind; never saved.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from .resources import resource_order

__all__ = ["Block", "MemoryState", "MemoryTable", "NodeState"]


@dataclass
class MemoryTable:
    """One resource on one NUMA node, in bytes (kubelet's MemoryTable)."""

    total: int = 0
    system_reserved: int = 0
    allocatable: int = 0
    reserved: int = 0
    free: int = 0

    def copy(self) -> MemoryTable:
        return MemoryTable(self.total, self.system_reserved, self.allocatable, self.reserved, self.free)


@dataclass
class NodeState:
    """One NUMA node (kubelet's NUMANodeState)."""

    assignments: int = 0
    memory: dict[str, MemoryTable] = field(default_factory=dict)
    cells: tuple[int, ...] = ()

    def copy(self) -> NodeState:
        return NodeState(self.assignments, {r: t.copy() for r, t in self.memory.items()}, self.cells)

    def table(self, resource: str) -> MemoryTable:
        """The resource's table; an empty one (nothing to give) when the node does not have the resource."""
        return self.memory.get(resource) or MemoryTable()


@dataclass(frozen=True, slots=True)
class Block:
    """Memory of one resource given to a container, on the NUMA nodes ``numa`` (ascending)."""

    numa: tuple[int, ...]
    resource: str
    size: int

    @property
    def mask(self) -> int:
        m = 0
        for n in self.numa:
            m |= 1 << n
        return m


@dataclass
class MemoryState:
    """The whole state (kubelet's state.State of the Memory Manager)."""

    machine: dict[int, NodeState] = field(default_factory=dict)
    assignments: dict[str, dict[str, tuple[Block, ...]]] = field(default_factory=dict)
    reuse_pod: str | None = field(default=None, compare=False)
    reuse: dict[int, dict[str, int]] = field(default_factory=dict, compare=False)

    def blocks(self, pod_uid: str, container: str) -> tuple[Block, ...] | None:
        return self.assignments.get(pod_uid, {}).get(container)

    def set_blocks(self, pod_uid: str, container: str, blocks: tuple[Block, ...]) -> None:
        self.assignments.setdefault(pod_uid, {})[container] = blocks

    def delete(self, pod_uid: str, container: str) -> None:
        pod = self.assignments.get(pod_uid)
        if pod is not None:
            pod.pop(container, None)
            if not pod:
                del self.assignments[pod_uid]

    def nodes_of(self, pod_uid: str, container: str) -> tuple[int, ...]:
        """The sorted union of the container's blocks' NUMA nodes (its cpuset.mems); () without blocks."""
        nodes: set[int] = set()
        for b in self.blocks(pod_uid, container) or ():
            nodes.update(b.numa)
        return tuple(sorted(nodes))

    def iter_blocks(self) -> Iterator[tuple[str, str, Block]]:
        for uid, containers in self.assignments.items():
            for name, blocks in containers.items():
                for b in blocks:
                    yield uid, name, b

    def resources(self) -> tuple[str, ...]:
        names: set[str] = set()
        for node in self.machine.values():
            names.update(node.memory)
        return tuple(sorted(names, key=resource_order))

    def free(self, resource: str) -> dict[int, int]:
        return {n: s.table(resource).free for n, s in sorted(self.machine.items())}

    def copy(self) -> MemoryState:
        return MemoryState(
            machine={n: s.copy() for n, s in self.machine.items()},
            assignments={u: dict(p) for u, p in self.assignments.items()},
            reuse_pod=self.reuse_pod,
            reuse={m: dict(r) for m, r in self.reuse.items()},
        )

    def same_machine(self, other: Mapping[int, NodeState]) -> bool:
        return dict(self.machine) == dict(other)
