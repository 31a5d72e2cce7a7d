"""Memory reserved per NUMA node for the system: kubelet's ``--reserved-memory`` / ``reservedMemory``, and its
start-up check against Node Allocatable.

The flag's format is kubelet's: NUMA nodes separated by ``;``, each ``<node>:<type>=<quantity>[,<type>=<quantity>]``
with types ``memory`` and ``hugepages-<size>`` (``0:memory=1Gi,hugepages-2Mi=0;1:memory=2Gi``). The configuration
file form is KubeletConfiguration's list (``[{"numaNode": 0, "limits": {"memory": "1Gi"}}]``). Parse errors carry
kubelet's own texts (its spelling included), so an operator can search for them.

kubelet refuses to start (and so does numapin) when, for ``memory`` or any huge-page size, the reservations summed
over the NUMA nodes differ from what Node Allocatable reserves: ``system-reserved + kube-reserved`` plus, for
``memory``, the hard eviction threshold ``memory.available`` (100Mi unless set). A node id the machine does not have
is refused as well, and so is a configuration reserving no memory at all (the static policy needs some).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from ..errors import ConfigError
from .machine import MachineMemory
from .quantity_text import ByteQuantity, parse_bytes
from .resources import MEMORY, is_memory_resource

__all__ = [
    "DEFAULT_EVICTION_HARD",
    "NO_SYSTEM_RESERVED",
    "MemoryReservation",
    "node_allocatable_reservation",
    "parse_reserved_memory",
    "reserved_memory_from_config",
    "system_reserved_memory",
]

DEFAULT_EVICTION_HARD = "100Mi"
NO_SYSTEM_RESERVED = "[memorymanager] you should specify the system reserved memory"
_FORMAT = "the reserved memory has incorrect format, expected numaNodeID:type=quantity[,type=quantity...], got {}"


@dataclass(frozen=True, slots=True)
class MemoryReservation:
    """One entry: a NUMA node and what is reserved on it per resource (kubelet's MemoryReservation)."""

    numa_node: int
    limits: tuple[tuple[str, ByteQuantity], ...]

    def to_flag(self) -> str:
        return f"{self.numa_node}:" + ",".join(f"{r}={q}" for r, q in self.limits)


def _atoi(text: str) -> int | None:
    """Go's strconv.Atoi: an optional sign and decimal digits, nothing else."""
    body = text[1:] if text[:1] in ("+", "-") else text
    if not body or not body.isascii() or not body.isdigit():
        return None
    return int(text)


def parse_reserved_memory(text: str) -> tuple[MemoryReservation, ...]:
    """kubelet's ``--reserved-memory`` value (empty: nothing reserved). ConfigError with kubelet's message."""
    if text == "":
        return ()
    out: list[MemoryReservation] = []
    for reservation in text.split(";"):
        parts = reservation.split(":")
        if len(parts) != 2:
            raise ConfigError(_FORMAT.format(reservation))
        node = _atoi(parts[0])
        if node is None:
            raise ConfigError(f"failed to convert the NUMA node ID, exptected integer, got {parts[0]}")
        limits: dict[str, ByteQuantity] = {}
        for item in parts[1].split(","):
            kv = item.split("=")
            if len(kv) != 2:
                raise ConfigError(f"the reserved limit has incorrect value, expected type=quantatity, got {item}")
            name, value = kv
            if not is_memory_resource(name):
                raise ConfigError(f'memory type conversion error, unknown type: "{name}"')
            try:
                limits[name] = parse_bytes(value, f"{name}")
            except ConfigError:
                raise ConfigError(f"failed to parse the quantatity, expected quantatity, got {value}") from None
        out.append(MemoryReservation(node, tuple(limits.items())))
    return tuple(out)


def reserved_memory_from_config(items: object) -> tuple[MemoryReservation, ...]:
    """KubeletConfiguration's ``reservedMemory`` list (``numaNode``, ``limits``); ConfigError naming the field."""
    if items is None:
        return ()
    if not isinstance(items, list):
        raise ConfigError("reservedMemory must be a list of {numaNode, limits}")
    out: list[MemoryReservation] = []
    for i, item in enumerate(items):
        where = f"reservedMemory[{i}]"
        if not isinstance(item, Mapping):
            raise ConfigError(f"{where} must be an object with numaNode and limits")
        node = item.get("numaNode")
        if not isinstance(node, int) or isinstance(node, bool):
            raise ConfigError(f"{where}.numaNode must be an integer, got {node!r}")
        limits_doc = item.get("limits") or {}
        if not isinstance(limits_doc, Mapping):
            raise ConfigError(f"{where}.limits must map memory types to quantities")
        limits: dict[str, ByteQuantity] = {}
        for name, value in limits_doc.items():
            if not isinstance(name, str) or not is_memory_resource(name):
                raise ConfigError(f'{where}.limits: memory type conversion error, unknown type: "{name}"')
            if not isinstance(value, (str, int)) or isinstance(value, bool):
                raise ConfigError(f"{where}.limits.{name} must be a quantity, got {value!r}")
            limits[name] = parse_bytes(str(value), f"{where}.limits.{name}")
        out.append(MemoryReservation(node, tuple(limits.items())))
    return tuple(out)


def _threshold(text: str, capacity: int, where: str) -> ByteQuantity:
    """A hard eviction threshold for ``memory.available``: a quantity or a percentage of the node's memory."""
    t = text.strip()
    if t.startswith("memory.available<"):
        t = t[len("memory.available<"):]
    if t.endswith("%"):
        try:
            pct = Fraction(t[:-1])
        except (ValueError, ZeroDivisionError):
            raise ConfigError(f"{where}: {text!r} is not a percentage") from None
        if not 0 <= pct <= 100:
            raise ConfigError(f"{where}: {text!r} must be between 0% and 100%")
        return ByteQuantity(int(capacity * pct / 100), True)
    return parse_bytes(t, where)


def node_allocatable_reservation(
    *,
    memory_capacity: int,
    system_reserved: Mapping[str, str] | None = None,
    kube_reserved: Mapping[str, str] | None = None,
    eviction_hard: str | None = DEFAULT_EVICTION_HARD,
) -> dict[str, ByteQuantity]:
    """What Node Allocatable reserves per memory resource: system-reserved + kube-reserved (+ the hard eviction
    threshold of ``memory.available`` for ``memory``; None: no threshold), summed as kubelet sums quantities."""
    out: dict[str, ByteQuantity] = {}
    names: set[str] = set()
    for given in (system_reserved, kube_reserved):
        for name in given or {}:
            if is_memory_resource(name):
                names.add(name)
    if eviction_hard is not None:
        names.add(MEMORY)
    for name in names:
        total = ByteQuantity(0)
        for flag, given in (("system-reserved", system_reserved), ("kube-reserved", kube_reserved)):
            if given and name in given:
                total = total + parse_bytes(given[name], f"--{flag} {name}")
        if name == MEMORY and eviction_hard is not None:
            total = total + _threshold(eviction_hard, memory_capacity, "--eviction-hard memory.available")
        if total.value:
            out[name] = total
    return out


def system_reserved_memory(
    machine: MachineMemory,
    reservations: Iterable[MemoryReservation],
    node_allocatable: Mapping[str, ByteQuantity],
) -> dict[int, dict[str, int]]:
    """kubelet's check of ``reservedMemory`` against the machine and Node Allocatable, and the bytes reserved per
    NUMA node and resource it yields (every node listed; a later entry for the same node and type wins, as in
    kubelet). ConfigError with kubelet's message when the configuration would keep kubelet from starting."""
    items = tuple(reservations)
    nodes = set(machine.node_ids)
    totals: dict[str, ByteQuantity] = {}
    for r in items:
        if r.numa_node not in nodes:
            raise ConfigError(f"the reserved memory configuration references a NUMA node {r.numa_node} that does "
                              f"not exist on this machine")
        for name, q in r.limits:
            totals[name] = totals[name] + q if name in totals else q
    kinds = set(totals) | {k for k in node_allocatable if is_memory_resource(k)}
    for kind in sorted(kinds):
        allocatable = ByteQuantity(0) + node_allocatable[kind] if kind in node_allocatable else ByteQuantity(0)
        reserved = ByteQuantity(0) + totals[kind] if kind in totals else ByteQuantity(0)
        if allocatable.value != reserved.value:
            raise ConfigError(f'the total amount "{reserved}" of type "{kind}" is not equal to the value '
                              f'"{allocatable}" determined by Node Allocatable feature')
    out: dict[int, dict[str, int]] = {n: {} for n in machine.node_ids}
    for r in items:
        for name, q in r.limits:
            out[r.numa_node][name] = q.value
    if sum(per.get(MEMORY, 0) for per in out.values()) <= 0:
        raise ConfigError(NO_SYSTEM_RESERVED)
    return out


def reservations_to_json(reservations: Iterable[MemoryReservation]) -> list[dict[str, Any]]:
    return [{"numaNode": r.numa_node, "limits": {n: str(q) for n, q in r.limits}} for r in reservations]
