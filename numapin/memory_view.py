"""Memory and huge pages per NUMA node as ``numapin status`` and ``numapin plan`` show them: free and used per node
and resource, and who holds what where. Read from the Memory Manager's document
(``allocator.memory.report.memory_document``: the proxy's ``/status`` ``memory``, the state file, a plan's node)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from allocator.cpuset import CPUSet
from allocator.memory.quantity_text import ByteQuantity

__all__ = ["Holding", "MemoryView", "NodeMemoryRow", "ResourceRow"]


def _bytes(n: int) -> str:
    return str(ByteQuantity(n, True))


@dataclass(frozen=True)
class ResourceRow:
    resource: str            # memory | hugepages-<size>
    total: int
    system_reserved: int
    allocatable: int
    reserved: int            # held by containers
    free: int

    def text(self) -> str:
        return (f"{self.resource} {_bytes(self.free)} free of {_bytes(self.allocatable)} allocatable "
                f"({_bytes(self.reserved)} held, {_bytes(self.system_reserved)} reserved for the system, "
                f"{_bytes(self.total)} total)")


@dataclass(frozen=True)
class NodeMemoryRow:
    node: int
    assignments: int
    cells: tuple[int, ...]   # the node's group (kubelet's cells): more than itself when it serves a multi-node block
    resources: tuple[ResourceRow, ...]


@dataclass(frozen=True)
class Holding:
    pod_uid: str
    container: str
    resource: str
    size: int
    nodes: tuple[int, ...]
    pod: str = ""            # namespace/name when known


@dataclass(frozen=True)
class MemoryView:
    policy: str
    nodes: tuple[NodeMemoryRow, ...]
    holders: tuple[Holding, ...]

    @classmethod
    def from_document(cls, doc: Mapping[str, Any]) -> MemoryView:
        """From ``memory_document``'s shape; KeyError, TypeError or ValueError when it is not."""
        nodes = []
        for key, n in sorted(doc["nodes"].items(), key=lambda i: int(i[0])):
            rows = tuple(ResourceRow(str(r), int(t["total"]), int(t["systemReserved"]), int(t["allocatable"]),
                                     int(t["reserved"]), int(t["free"])) for r, t in n["resources"].items())
            nodes.append(NodeMemoryRow(int(key), int(n["assignments"]), tuple(int(c) for c in n["cells"]), rows))
        holders = tuple(Holding(str(h["podUID"]), str(h["container"]), str(h["type"]), int(h["size"]),
                                tuple(int(c) for c in h["numaNodes"]), str(h.get("pod") or ""))
                        for h in doc["holders"])
        return cls(str(doc["policy"]), tuple(nodes), holders)

    def with_pods(self, refs: Mapping[str, str]) -> MemoryView:
        """Pod names (uid -> namespace/name) filled in where known."""
        return replace(self, holders=tuple(h if h.pod else replace(h, pod=refs.get(h.pod_uid, ""))
                                           for h in self.holders))

    def to_dict(self) -> dict[str, Any]:
        return {"policy": self.policy,
                "nodes": {str(n.node): {"assignments": n.assignments, "cells": list(n.cells),
                                        "resources": {r.resource: {"total": r.total,
                                                                   "systemReserved": r.system_reserved,
                                                                   "allocatable": r.allocatable,
                                                                   "reserved": r.reserved, "free": r.free}
                                                      for r in n.resources}}
                          for n in self.nodes},
                "holders": [{"pod": h.pod or h.pod_uid, "podUID": h.pod_uid, "container": h.container,
                             "type": h.resource, "size": h.size, "numaNodes": list(h.nodes)} for h in self.holders]}

    def lines(self) -> list[str]:
        """The text: one line per NUMA node and resource it has, then one per container's block."""
        out = [f"memory per NUMA node (Memory Manager policy {self.policy}):"]
        for n in self.nodes:
            group = f", in the group of NUMA nodes {CPUSet(n.cells)}" if len(n.cells) > 1 else ""
            out.append(f"  node {n.node}: {n.assignments} container block(s){group}")
            for r in n.resources:
                if r.total or r.reserved:  # a huge-page size the node has none of is left out
                    out.append(f"    {r.text()}")
        if self.holders:
            out.append("memory held by containers:")
            for h in self.holders:
                out.append(f"  {h.pod or h.pod_uid} {h.container}: {h.resource} {_bytes(h.size)} on NUMA node(s) "
                           f"{CPUSet(h.nodes)}")
        else:
            out.append("memory held by containers: none")
        return out
