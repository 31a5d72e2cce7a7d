"""The proxy's Memory Manager settings, as kubelet takes them: ``--memory-manager-policy``, ``--reserved-memory``
(``reservedMemory`` in the configuration file), ``--system-reserved``, ``--kube-reserved`` and the hard eviction
threshold of ``memory.available`` (``--eviction-hard``), and the node's ``MemoryConfig`` built from them and the
machine's memory in sysfs.

Every malformed value is a ``ConfigError`` with kubelet's own text where kubelet has one (allocator.memory.reserved),
prefixed with the flag; the reservations are checked against Node Allocatable when the node is built
(allocator.memory.config.build_memory_policy).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from allocator.errors import ConfigError
from allocator.memory.config import MEMORY_POLICIES, MemoryConfig
from allocator.memory.machine import read_machine_memory
from allocator.memory.reserved import (
    DEFAULT_EVICTION_HARD,
    MemoryReservation,
    node_allocatable_reservation,
    parse_reserved_memory,
    reserved_memory_from_config,
)

__all__ = ["MEMORY_SETTINGS", "coerce_memory_setting", "is_memory_setting", "memory_config_of"]

MEMORY_SETTINGS = ("memory_manager_policy", "reserved_memory", "system_reserved", "kube_reserved", "eviction_hard")
_SIGNAL = "memory.available"


def is_memory_setting(name: str) -> bool:
    return name in MEMORY_SETTINGS


def _options(value: Any, where: str) -> dict[str, str]:
    """``memory=1Gi,cpu=500m`` (a flag) or a mapping (the file): resource -> quantity text."""
    if value is None or value == "":
        return {}
    if isinstance(value, Mapping):
        return {str(k): str(v) for k, v in value.items()}
    if not isinstance(value, str):
        raise ConfigError(f"{where}: expected resource=quantity[,resource=quantity...], got {value!r}")
    out: dict[str, str] = {}
    for item in value.split(","):
        k, sep, v = item.partition("=")
        if not sep or not k.strip() or not v.strip():
            raise ConfigError(f"{where}: expected resource=quantity[,resource=quantity...], got {value!r}")
        out[k.strip()] = v.strip()
    return out


def _eviction_threshold(value: Any, where: str) -> str | None:
    """The ``memory.available`` threshold: ``memory.available<100Mi[,nodefs.available<10%]`` (a flag) or
    ``{memory.available: 100Mi}`` (the file). Given without ``memory.available``: no threshold ("0"), as kubelet
    has none for a signal its eviction-hard leaves out."""
    if value is None:
        return None
    if isinstance(value, Mapping):
        found = value.get(_SIGNAL)
        return "0" if found is None else str(found)
    if not isinstance(value, str):
        raise ConfigError(f"{where}: expected signal<threshold[,signal<threshold...], got {value!r}")
    for item in value.split(","):
        signal, sep, threshold = item.partition("<")
        if not sep or not signal.strip() or not threshold.strip():
            raise ConfigError(f"{where}: expected signal<threshold[,signal<threshold...] (e.g. "
                              f"memory.available<{DEFAULT_EVICTION_HARD}), got {value!r}")
        if signal.strip() == _SIGNAL:
            return threshold.strip()
    return "0"


def coerce_memory_setting(name: str, value: Any, where: str) -> Any:
    """A memory setting from a flag (text) or the configuration file (text, list or mapping); ConfigError."""
    if name == "memory_manager_policy":
        if value not in MEMORY_POLICIES:
            raise ConfigError(f'{where}: unknown policy: "{value}" (allowed: {", ".join(MEMORY_POLICIES)})')
        return value
    if name == "reserved_memory":
        if isinstance(value, tuple) and all(isinstance(r, MemoryReservation) for r in value):
            return value
        try:
            if isinstance(value, list):
                return reserved_memory_from_config(value)
            if value is None:
                return ()
            if not isinstance(value, str):
                raise ConfigError(f"expected numaNodeID:type=quantity[,type=quantity...][;...], got {value!r}")
            return parse_reserved_memory(value.strip())
        except ConfigError as e:
            raise ConfigError(f"{where}: {e}") from None
    if name in ("system_reserved", "kube_reserved"):
        return _options(value, where)
    if name == "eviction_hard":
        return _eviction_threshold(value, where)
    raise KeyError(name)


def memory_config_of(*, sysfs: str, policy: str, reserved: tuple[MemoryReservation, ...],
                     system_reserved: Mapping[str, str], kube_reserved: Mapping[str, str],
                     eviction_hard: str | None) -> MemoryConfig | None:
    """The node's memory configuration (None with policy ``None``: memory is not accounted and sysfs' memory is
    not read). TopologyError when the machine's memory cannot be read, ConfigError for a bad quantity."""
    if policy == "None":
        if reserved:
            raise ConfigError("reserved-memory: only used with --memory-manager-policy Static")
        return None
    machine = read_machine_memory(sysfs)
    allocatable = node_allocatable_reservation(
        memory_capacity=machine.capacity()["memory"], system_reserved=system_reserved, kube_reserved=kube_reserved,
        eviction_hard=DEFAULT_EVICTION_HARD if eviction_hard is None else eviction_hard)
    return MemoryConfig(machine=machine, policy=policy, reserved=reserved, node_allocatable=allocatable)
