"""A node's Memory Manager configuration (KubeletConfiguration's ``memoryManagerPolicy`` and ``reservedMemory``)
and its start-up checks.

``policy`` is kubelet's ``None`` (memory is not accounted; cpuset.mems follow the CPUs) or ``Static``. With
``Static`` the reservations are checked against Node Allocatable as kubelet checks them (allocator.memory.reserved);
``node_allocatable`` is what system-reserved + kube-reserved + the hard eviction threshold reserve
(``node_allocatable_reservation``), by default only kubelet's default eviction threshold (100Mi of memory).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ..errors import ConfigError
from .machine import MachineMemory
from .policy import MemoryPolicy
from .quantity_text import ByteQuantity
from .reserved import MemoryReservation, node_allocatable_reservation, system_reserved_memory

__all__ = ["MEMORY_POLICIES", "MemoryConfig", "build_memory_policy"]

MEMORY_POLICIES = ("None", "Static")


@dataclass(frozen=True)
class MemoryConfig:
    machine: MachineMemory
    policy: str = "None"
    reserved: tuple[MemoryReservation, ...] = ()
    node_allocatable: Mapping[str, ByteQuantity] | None = None


def build_memory_policy(config: MemoryConfig | None, numa_nodes: tuple[int, ...]) -> MemoryPolicy | None:
    """The static policy for a ``Static`` configuration, None otherwise. ConfigError naming the kubelet setting."""
    if config is None or config.policy == "None":
        return None
    if config.policy not in MEMORY_POLICIES:
        raise ConfigError(f'memoryManagerPolicy: unknown policy: "{config.policy}" (allowed: '
                          f'{", ".join(MEMORY_POLICIES)})')
    if config.machine.node_ids != tuple(numa_nodes):
        raise ConfigError(f"memory: the machine's memory lists NUMA nodes {list(config.machine.node_ids)}, the "
                          f"topology {list(numa_nodes)}")
    allocatable = config.node_allocatable
    if allocatable is None:
        allocatable = node_allocatable_reservation(memory_capacity=config.machine.capacity()["memory"])
    try:
        reserved = system_reserved_memory(config.machine, config.reserved, allocatable)
        return MemoryPolicy(config.machine, reserved)
    except ConfigError as e:
        raise ConfigError(f"reservedMemory: {e}") from None
