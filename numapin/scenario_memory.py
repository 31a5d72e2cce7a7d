"""A scenario's ``memory`` field: the node's Memory Manager for ``numapin plan`` (kubelet's ``memoryManagerPolicy``,
``reservedMemory``, what Node Allocatable reserves, and the machine's memory per NUMA node).

```yaml
memory:
  policy: Static                      # default Static (None: memory not accounted)
  perNUMANode: {memory: 64Gi, hugepages-1Gi: 4Gi}   # every NUMA node alike (huge pages in bytes), or:
  nodes: {0: {memory: 64Gi}, 1: {memory: 32Gi, hugepages-2Mi: 1Gi}}
  reservedMemory: "0:memory=100Mi"    # kubelet's flag, or KubeletConfiguration's list
  systemReserved: {memory: 1Gi}       # optional, as kubeReserved
  kubeReserved: {memory: 1Gi}
  evictionHard: 100Mi                 # memory.available's hard threshold (default 100Mi)
```
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from allocator.errors import AllocatorError
from allocator.memory.config import MEMORY_POLICIES, MemoryConfig
from allocator.memory.machine import MachineMemory, NodeMemory
from allocator.memory.quantity_text import parse_bytes
from allocator.memory.reserved import (
    DEFAULT_EVICTION_HARD,
    MemoryReservation,
    node_allocatable_reservation,
    parse_reserved_memory,
    reserved_memory_from_config,
)
from allocator.memory.resources import MEMORY, hugepage_size, is_hugepages

__all__ = ["MEMORY_FIELDS", "MemoryFieldError", "memory_config"]

MEMORY_FIELDS = ("policy", "perNUMANode", "nodes", "reservedMemory", "systemReserved", "kubeReserved",
                 "evictionHard")


class MemoryFieldError(ValueError):
    """A bad ``memory`` field (the message names it)."""


def _node(node: int, doc: Any, where: str) -> NodeMemory:
    if not isinstance(doc, Mapping) or MEMORY not in doc:
        raise MemoryFieldError(f"{where} must map memory (and hugepages-<size>) to quantities, e.g. "
                               "{memory: 64Gi, hugepages-1Gi: 4Gi}")
    memory, pages = 0, []
    for name, value in doc.items():
        try:
            size = parse_bytes(str(value), f"{where}.{name}").value
            if name == MEMORY:
                memory = size
            elif is_hugepages(str(name)):
                page = hugepage_size(str(name))
                if size % page:
                    raise MemoryFieldError(f"{where}.{name}: {value} is not a whole number of {name} pages")
                pages.append((page, size // page))
            else:
                raise MemoryFieldError(f"{where}.{name}: only memory and hugepages-<size> (got {name!r})")
        except AllocatorError as e:
            raise MemoryFieldError(f"{where}.{name}: {e}") from None
    return NodeMemory(node, memory, tuple(sorted(pages)))


def _options(value: Any, where: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise MemoryFieldError(f"{where} must map resources to quantities, e.g. {{memory: 1Gi}}")
    return {str(k): str(v) for k, v in value.items()}


def memory_config(doc: Any, numa_nodes: tuple[int, ...]) -> MemoryConfig | None:
    """The ``memory`` field as the node's MemoryConfig (None without it). MemoryFieldError names the part."""
    if doc is None:
        return None
    if not isinstance(doc, Mapping):
        raise MemoryFieldError("memory must be a mapping (policy, perNUMANode or nodes, reservedMemory, ...)")
    for key in doc:
        if key not in MEMORY_FIELDS:
            raise MemoryFieldError(f"memory.{key}: unknown field (known: {', '.join(MEMORY_FIELDS)})")
    policy = doc.get("policy", "Static")
    if policy not in MEMORY_POLICIES:
        raise MemoryFieldError(f'memory.policy: unknown policy: "{policy}" (allowed: {", ".join(MEMORY_POLICIES)})')
    if ("perNUMANode" in doc) == ("nodes" in doc):
        raise MemoryFieldError("memory: give the machine's memory as perNUMANode (every node alike) or nodes")
    if "perNUMANode" in doc:
        nodes = tuple(_node(n, doc["perNUMANode"], "memory.perNUMANode") for n in numa_nodes)
    else:
        raw = doc["nodes"]
        if not isinstance(raw, Mapping):
            raise MemoryFieldError("memory.nodes must map NUMA node ids to their memory")
        try:
            given = {int(k): v for k, v in raw.items()}
        except (TypeError, ValueError):
            raise MemoryFieldError(f"memory.nodes: NUMA node ids must be integers, got {list(raw)}") from None
        if sorted(given) != list(numa_nodes):
            raise MemoryFieldError(f"memory.nodes lists NUMA nodes {sorted(given)}, the topology has "
                                   f"{list(numa_nodes)}")
        nodes = tuple(_node(n, given[n], f"memory.nodes[{n}]") for n in sorted(given))
    machine = MachineMemory(nodes)
    try:
        raw_reserved = doc.get("reservedMemory")
        reserved: tuple[MemoryReservation, ...]
        if raw_reserved is None:
            reserved = ()
        elif isinstance(raw_reserved, list):
            reserved = reserved_memory_from_config(raw_reserved)
        else:
            reserved = parse_reserved_memory(str(raw_reserved))
        eviction = doc.get("evictionHard", DEFAULT_EVICTION_HARD)
        allocatable = node_allocatable_reservation(
            memory_capacity=machine.capacity()[MEMORY],
            system_reserved=_options(doc.get("systemReserved"), "memory.systemReserved"),
            kube_reserved=_options(doc.get("kubeReserved"), "memory.kubeReserved"),
            eviction_hard=None if eviction is None else str(eviction))
    except AllocatorError as e:
        raise MemoryFieldError(f"memory: {e}") from None
    return MemoryConfig(machine=machine, policy=str(policy), reserved=reserved, node_allocatable=allocatable)
