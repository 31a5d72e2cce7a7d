"""Devices already bound to a container (GPUs, NICs...) as a topology hint provider.

numapin does not allocate devices: the device plugin already chose them, and the proxy learns each
device's NUMA node(s) from sysfs. kubelet's device manager, for devices already allocated to a container,
regenerates hints from exactly those devices (generateDeviceTopologyHints with available = the allocated
devices): a NUMA mask is a hint iff every device has at least one of its NUMA nodes in the mask, and a hint
is preferred iff its width is the narrowest such width. A device without NUMA information has no
preference (nil). On machines with more than ``compact_above`` NUMA nodes, devices on single NUMA nodes are
described by a ``HintFamily`` (every mask holding the devices' nodes) instead of listing 2^N masks.

``devices`` maps a container name to ``{resource: nodes}``. ``nodes`` is either a set of ints, the NUMA
nodes of that resource's devices (each node holds at least one of them: a hint must contain them all, as
``NodeAllocator`` does), or a list of sets, one per device, where a device listed with several NUMA nodes
counts as present in a mask holding any one of them (kubelet's rule for such devices).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .bitmask import bits_of, iterate_masks, mask_of
from .compact_hints import HintFamily
from .errors import ConfigError
from .hints import TopologyHint
from .merge import ProviderHints
from .pod import PodInfo

__all__ = ["DeviceHintProvider", "device_hints"]

DeviceNodes = Iterable[int] | Sequence[Iterable[int]]
# Largest machine on which hints for devices spanning several NUMA nodes are listed in full.
_LIST_MAX_NODES = 16


def _groups(nodes: Any) -> list[list[int]]:
    """One list of NUMA nodes per device: a flat set of ints is one single-node device per node."""
    items = list(nodes)
    if items and not isinstance(items[0], int):
        return [list(g) for g in items]
    return [[n] for n in items]


def _device_masks(resource: str, nodes: Any, machine: int) -> list[int]:
    """One mask per device; 0 for a device without NUMA information."""
    groups = _groups(nodes)
    masks = []
    for g in groups:
        m = mask_of(g)
        if m & ~machine:
            raise ConfigError(f"device {resource!r}: NUMA node(s) {bits_of(m & ~machine)} are not on this machine")
        masks.append(m)
    return masks


def device_hints(resource: str, nodes: DeviceNodes, numa_nodes: Sequence[int], *,
                 compact_above: int = 8) -> list[TopologyHint] | HintFamily | None:
    """kubelet's hints for devices already allocated to a container (one resource)."""
    machine = mask_of(numa_nodes)
    masks = _device_masks(resource, nodes, machine)
    if not masks or all(m == 0 for m in masks):
        return None  # no topology information: no preference
    masks = [m for m in masks if m]
    single = all(m.bit_count() == 1 for m in masks)
    if single:
        required = 0
        for m in masks:
            required |= m
        if len(numa_nodes) > compact_above:
            return HintFamily(universe=machine, required=required, preferred_size=required.bit_count())
        return [TopologyHint(frozenset(bits_of(m)), m.bit_count() == required.bit_count())
                for m in iterate_masks(numa_nodes) if m & required == required]
    if len(numa_nodes) > _LIST_MAX_NODES:
        raise ConfigError(f"device {resource!r} spans several NUMA nodes: supported on machines with at most "
                          f"{_LIST_MAX_NODES} NUMA nodes")
    hits = [m for m in iterate_masks(numa_nodes) if all(m & d for d in masks)]
    narrowest = min(m.bit_count() for m in hits)
    return [TopologyHint(frozenset(bits_of(m)), m.bit_count() == narrowest) for m in hits]


class DeviceHintProvider:
    """HintProvider over the devices bound to each container of one pod."""

    def __init__(self, devices: Mapping[str, Mapping[str, DeviceNodes]] | None, numa_nodes: Sequence[int], *,
                 compact_above: int = 8) -> None:
        self.devices = {c: dict(d) for c, d in (devices or {}).items()}
        self.numa_nodes = tuple(numa_nodes)
        self.compact_above = compact_above

    def _hints(self, per_resource: Mapping[str, list[Any]]) -> ProviderHints:
        if not per_resource:
            return None
        out: dict[str, list[TopologyHint] | HintFamily | None] = {}
        for resource, groups in per_resource.items():
            out[resource] = device_hints(resource, groups, self.numa_nodes, compact_above=self.compact_above)
        return out

    def topology_hints(self, state: Any, pod: PodInfo, container_name: str) -> ProviderHints:
        devs = self.devices.get(container_name) or {}
        return self._hints({r: _groups(n) for r, n in devs.items()})

    def pod_topology_hints(self, state: Any, pod: PodInfo) -> ProviderHints:
        merged: dict[str, list[Any]] = {}
        for c in pod.containers:
            for r, n in (self.devices.get(c.name) or {}).items():
                merged.setdefault(r, []).extend(_groups(n))
        return self._hints(merged)

    def allocate(self, state: Any, pod: PodInfo, container_name: str, affinity: TopologyHint | None) -> None:
        return None  # the device plugin already allocated the devices
