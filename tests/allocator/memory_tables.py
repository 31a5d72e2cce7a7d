"""Helpers for the memory tables: machine states written compactly, pods with memory and huge pages."""

from __future__ import annotations

from allocator.memory import Block, MemoryState, MemoryTable, NodeState
from allocator.pod import ContainerInfo, PodInfo

MI = 1 << 20
GI = 1 << 30
H1G = "hugepages-1Gi"
H2M = "hugepages-2Mi"


def node(assignments: int, cells: tuple[int, ...], **tables: tuple[int, int, int, int, int]) -> NodeState:
    """``memory=(total, systemReserved, allocatable, reserved, free)``; huge pages as ``h1g=`` / ``h2m=``."""
    names = {"memory": "memory", "h1g": H1G, "h2m": H2M}
    return NodeState(assignments, {names[k]: MemoryTable(*v) for k, v in tables.items()}, cells)


def state(machine: dict[int, NodeState], entries: dict[str, dict[str, tuple[Block, ...]]] | None = None
          ) -> MemoryState:
    return MemoryState(machine=machine, assignments={u: dict(c) for u, c in (entries or {}).items()})


def blocks(numa: tuple[int, ...], memory: int | None = None, h1g: int | None = None,
           h2m: int | None = None) -> tuple[Block, ...]:
    out = []
    for name, size in (("memory", memory), (H1G, h1g), (H2M, h2m)):
        if size is not None:
            out.append(Block(numa, name, size))
    return tuple(out)


def container(name: str = "container1", memory: int = GI, *, role: str = "app", cpu: int = 1000,
              limit: int | None = None, hugepages: dict[str, int] | None = None) -> ContainerInfo:
    return ContainerInfo(name, role, cpu, cpu, memory, memory if limit is None else limit,  # type: ignore[arg-type]
                         tuple(sorted((hugepages or {}).items())))


def pod(uid: str, *containers: ContainerInfo, qos: str = "Guaranteed", mode: str | None = None) -> PodInfo:
    return PodInfo(uid, "default", uid, qos, mode, False, containers)  # type: ignore[arg-type]


def guaranteed(uid: str = "pod1", name: str = "container1", memory: int = GI, h1g: int | None = GI,
               h2m: int | None = None) -> PodInfo:
    pages = {k: v for k, v in ((H1G, h1g), (H2M, h2m)) if v is not None}
    return pod(uid, container(name, memory, hugepages=pages))
