"""kubelet's Memory Manager (static policy) for numapin: memory and huge pages accounted per NUMA node.

One concept per module: ``resources`` (resource names), ``machine`` (memory per NUMA node from sysfs),
``quantity_text`` (quantities as kubelet prints them), ``reserved`` (``--reserved-memory`` and its check against
Node Allocatable), ``state`` (machine state and blocks), ``requests`` (who is managed, for how much), ``hints``
(NUMA hints), ``policy`` (allocation and release), ``provider`` (the topology-manager hint provider),
``checkpoint`` (``memory_manager_state``) and ``config`` (a node's memory configuration).
"""

from __future__ import annotations

from .checkpoint import (
    MemoryCheckpointStore,
    import_kubelet_memory_state,
    memory_checksum,
    parse_memory_checkpoint,
    serialize_memory_checkpoint,
)
from .machine import MachineMemory, NodeMemory, read_machine_memory
from .policy import MemoryPolicy
from .provider import MemoryProvider
from .requests import container_requests, pod_requests
from .reserved import (
    MemoryReservation,
    node_allocatable_reservation,
    parse_reserved_memory,
    reserved_memory_from_config,
    system_reserved_memory,
)
from .resources import MEMORY, hugepage_resource, hugepage_size
from .state import Block, MemoryState, MemoryTable, NodeState

__all__ = [
    "MEMORY",
    "Block",
    "MachineMemory",
    "MemoryCheckpointStore",
    "MemoryPolicy",
    "MemoryProvider",
    "MemoryReservation",
    "MemoryState",
    "MemoryTable",
    "NodeMemory",
    "NodeState",
    "container_requests",
    "hugepage_resource",
    "hugepage_size",
    "import_kubelet_memory_state",
    "memory_checksum",
    "node_allocatable_reservation",
    "parse_memory_checkpoint",
    "parse_reserved_memory",
    "pod_requests",
    "read_machine_memory",
    "reserved_memory_from_config",
    "serialize_memory_checkpoint",
    "system_reserved_memory",
]
