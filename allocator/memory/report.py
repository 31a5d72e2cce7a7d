"""How the Memory Manager's numbers read in numapin's messages: what a refused pod asked of memory and huge pages,
and what every NUMA node has free (binary units: ``62Gi``)."""

from __future__ import annotations

from typing import Any

from ..cpuset import CPUSet
from ..pod import PodInfo
from .quantity_text import ByteQuantity
from .requests import container_requests, pod_requests
from .resources import resource_order
from .state import MemoryState

__all__ = ["ASSIGNMENTS_ATTRIBUTE", "CELLS_ATTRIBUTE", "memory_detail", "memory_document", "nrt_memory",
           "nrt_memory_attributes"]


ASSIGNMENTS_ATTRIBUTE = "numapinMemoryAssignments"
CELLS_ATTRIBUTE = "numapinMemoryCells"


def memory_detail(pod: PodInfo, who: str | None, mem: MemoryState) -> str:
    """``"; memory 100Gi asked; free memory per NUMA node {0: 63Gi, 1: 63Gi}"`` for container ``who`` (None: the
    pod, kubelet's pod-level amounts); empty when the Memory Manager does not account the pod."""
    asked = container_requests(pod, pod.container(who)) if who else pod_requests(pod)
    if not asked:
        return ""
    parts = []
    for r, q in asked.items():
        free = ", ".join(f"{n}: {ByteQuantity(v, True)}" for n, v in mem.free(r).items())
        parts.append(f"{r} {ByteQuantity(q, True)} asked; free {r} per NUMA node {{{free}}}")
    return "; " + "; ".join(parts)


def nrt_memory(state: MemoryState) -> dict[int, dict[str, tuple[int, int, int]]]:
    """Per NUMA node and resource, (capacity, allocatable, available) bytes for the NodeResourceTopology zones
    (allocator.nrt.build_nrt ``memory``): the node's total, minus the system's reservation (and, for ``memory``,
    the huge pages), minus what containers hold."""
    return {n: {r: (t.total, t.allocatable, t.free) for r, t in ns.memory.items()}
            for n, ns in sorted(state.machine.items())}


def nrt_memory_attributes(state: MemoryState) -> dict[int, dict[str, str]]:
    """numapin's zone attributes for the group rule, for the NUMA nodes holding memory assignments:
    ``numapinMemoryAssignments`` (kubelet's numberOfAssignments) and ``numapinMemoryCells`` (the node's group as a
    list such as ``0-1``), so a reader can apply kubelet's rules to the published node."""
    return {n: {ASSIGNMENTS_ATTRIBUTE: str(ns.assignments), CELLS_ATTRIBUTE: str(CPUSet(ns.cells))}
            for n, ns in sorted(state.machine.items()) if ns.assignments > 0}


def memory_document(state: MemoryState, policy: str = "Static") -> dict[str, Any]:
    """The Memory Manager's view for people (``/status`` ``memory``, ``numapin status`` and ``numapin plan``): per
    NUMA node and resource the bytes (``total``, ``systemReserved``, ``allocatable``, ``reserved`` by containers,
    ``free``), the node's assignments and group, and every container's blocks (who holds what, where)."""
    nodes = {str(n): {"assignments": ns.assignments, "cells": list(ns.cells),
                      "resources": {r: {"total": t.total, "systemReserved": t.system_reserved,
                                        "allocatable": t.allocatable, "reserved": t.reserved, "free": t.free}
                                    for r, t in sorted(ns.memory.items(), key=lambda i: resource_order(i[0]))}}
             for n, ns in sorted(state.machine.items())}
    blocks = sorted(state.iter_blocks(), key=lambda i: (i[0], i[1], resource_order(i[2].resource)))
    holders = [{"podUID": uid, "container": name, "type": b.resource, "size": b.size, "numaNodes": list(b.numa)}
               for uid, name, b in blocks]
    return {"policy": policy, "nodes": nodes, "holders": holders}
