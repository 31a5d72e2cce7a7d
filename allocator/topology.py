"""The machine's CPU topology: logical CPUs with their core, socket, NUMA node and uncore (L3) cache.

Built from a sysfs root (``Topology.from_sysfs``), or from / to a JSON-friendly dict. Ids follow
kubelet's conventions: a core id is a label unique across the machine (sysfs discovery uses the lowest logical
CPU id among the core's threads; a JSON document may number cores otherwise, as kubelet's own test machines
do), the uncore id is the L3 cache id (the socket id where no L3 is reported), and NUMA nodes without CPUs
(memory-only, GPU memory) are still NUMA nodes.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .cpu_info import CPUInfo
from .cpuset import CPUSet
from .errors import ConfigError, TopologyError
from .numa_distances import check_numa_distances
from .sysfs import read_sysfs

__all__ = ["CPUInfo", "Topology"]


def _group(cpus: Iterable[CPUInfo], key: str) -> dict[int, CPUSet]:
    masks: dict[int, int] = {}
    for c in cpus:
        k = getattr(c, key)
        masks[k] = masks.get(k, 0) | (1 << c.cpu)
    return {k: CPUSet.from_mask(m) for k, m in sorted(masks.items())}


@dataclass(frozen=True)
class Topology:
    """Immutable description of a node's CPUs and NUMA nodes.

    ``numa_distances[n]`` lists the distances from node ``n`` to every node of ``numa_nodes``, in that
    order (as sysfs ``nodeN/distance`` does); ``None`` when the machine did not report distances.
    """

    cpus: tuple[CPUInfo, ...]
    numa_nodes: tuple[int, ...]
    numa_distances: Mapping[int, tuple[int, ...]] | None = None

    # derived indexes (not part of equality)
    _by_id: dict[int, CPUInfo] = field(init=False, repr=False, compare=False, hash=False)
    _numa: dict[int, CPUSet] = field(init=False, repr=False, compare=False, hash=False)
    _socket: dict[int, CPUSet] = field(init=False, repr=False, compare=False, hash=False)
    _core: dict[int, CPUSet] = field(init=False, repr=False, compare=False, hash=False)
    _uncore: dict[int, CPUSet] = field(init=False, repr=False, compare=False, hash=False)
    _all: CPUSet = field(init=False, repr=False, compare=False, hash=False)
    _numa_index: dict[int, int] = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        cpus = tuple(sorted(self.cpus, key=lambda c: c.cpu))
        object.__setattr__(self, "cpus", cpus)
        by_id: dict[int, CPUInfo] = {}
        for c in cpus:
            if c.cpu in by_id:
                raise TopologyError(f"cpu {c.cpu} is listed twice")
            by_id[c.cpu] = c
        nodes = tuple(sorted(set(self.numa_nodes) | {c.numa for c in cpus}))
        object.__setattr__(self, "numa_nodes", nodes)
        object.__setattr__(self, "_by_id", by_id)
        object.__setattr__(self, "_numa", _group(cpus, "numa"))
        object.__setattr__(self, "_socket", _group(cpus, "socket"))
        object.__setattr__(self, "_core", _group(cpus, "core"))
        object.__setattr__(self, "_uncore", _group(cpus, "uncore"))
        object.__setattr__(self, "_all", CPUSet(by_id))
        object.__setattr__(self, "_numa_index", {n: i for i, n in enumerate(nodes)})
        first: dict[int, CPUInfo] = {}
        for c in cpus:  # a core id is a label, but one core's threads share a socket and a NUMA node
            other = first.setdefault(c.core, c)
            if (other.socket, other.numa) != (c.socket, c.numa):
                raise TopologyError(f"core {c.core}: cpu {other.cpu} (socket {other.socket}, NUMA node {other.numa}) "
                                    f"and cpu {c.cpu} (socket {c.socket}, NUMA node {c.numa}) cannot be threads "
                                    f"of one core")
        if self.numa_distances is not None:
            dist = {int(k): tuple(int(x) for x in v) for k, v in self.numa_distances.items()}
            try:
                check_numa_distances(nodes, dist)
            except ConfigError as e:
                raise TopologyError(f"numaDistances: {e}") from None
            object.__setattr__(self, "numa_distances", dist)

    # -- queries ------------------------------------------------------------------
    @property
    def all_cpus(self) -> CPUSet:
        return self._all

    @property
    def num_cpus(self) -> int:
        return len(self.cpus)

    @property
    def sockets(self) -> tuple[int, ...]:
        return tuple(self._socket)

    @property
    def cores(self) -> tuple[int, ...]:
        return tuple(self._core)

    @property
    def uncores(self) -> tuple[int, ...]:
        return tuple(self._uncore)

    @property
    def cpu_numa_nodes(self) -> tuple[int, ...]:
        """NUMA nodes that hold at least one CPU."""
        return tuple(self._numa)

    @property
    def num_sockets(self) -> int:
        return len(self._socket)

    @property
    def num_cores(self) -> int:
        return len(self._core)

    @property
    def num_numa_nodes(self) -> int:
        """All NUMA nodes, CPU-less ones included."""
        return len(self.numa_nodes)

    @property
    def threads_per_core(self) -> int:
        """kubelet's CPUsPerCore: logical CPUs / physical cores (0 on an empty topology)."""
        return len(self.cpus) // len(self._core) if self._core else 0

    def cpu(self, cpu_id: int) -> CPUInfo:
        try:
            return self._by_id[cpu_id]
        except KeyError:
            raise TopologyError(f"cpu {cpu_id} is not on this machine") from None

    def cpus_in_numa(self, node: int) -> CPUSet:
        return self._numa.get(node, _EMPTY)

    def cpus_in_numas(self, nodes: Iterable[int]) -> CPUSet:
        m = 0
        for n in nodes:
            m |= self._numa.get(n, _EMPTY).mask
        return CPUSet.from_mask(m)

    def cpus_in_socket(self, socket: int) -> CPUSet:
        return self._socket.get(socket, _EMPTY)

    def cpus_in_core(self, core: int) -> CPUSet:
        return self._core.get(core, _EMPTY)

    def cpus_in_uncore(self, uncore: int) -> CPUSet:
        return self._uncore.get(uncore, _EMPTY)

    def numa_of(self, cpus: CPUSet) -> CPUSet:
        """The NUMA nodes the given CPUs sit on."""
        return CPUSet(self._by_id[c].numa for c in cpus if c in self._by_id)

    def sockets_of(self, cpus: CPUSet) -> CPUSet:
        return CPUSet(self._by_id[c].socket for c in cpus if c in self._by_id)

    def sockets_of_numas(self, nodes: Iterable[int]) -> CPUSet:
        return self.sockets_of(self.cpus_in_numas(nodes))

    def numas_in_socket(self, socket: int) -> CPUSet:
        return self.numa_of(self.cpus_in_socket(socket))

    def core_siblings(self, cpus: CPUSet) -> CPUSet:
        """Every thread of every core that the given CPUs touch."""
        m = 0
        for c in cpus:
            info = self._by_id.get(c)
            if info is not None:
                m |= self._core[info.core].mask
        return CPUSet.from_mask(m)

    def distance(self, a: int, b: int) -> int:
        if self.numa_distances is None:
            raise TopologyError("this topology has no NUMA distances")
        return self.numa_distances[a][self._numa_index[b]]

    # -- (de)serialisation ----------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "cpus": [
                {"cpu": c.cpu, "core": c.core, "socket": c.socket, "numa": c.numa, "uncore": c.uncore}
                for c in self.cpus
            ]
        }
        out["numaNodes"] = list(self.numa_nodes)
        if self.numa_distances is not None:
            out["numaDistances"] = {str(n): list(self.numa_distances[n]) for n in self.numa_nodes}
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Topology:
        """Build from ``{"cpus": [{"cpu", "core", "socket", "numa", "uncore"?}, ...], "numaDistances"?: {...},
        "numaNodes"?: [...]}``. Raises TopologyError naming the bad field."""
        if not isinstance(data, Mapping):
            raise TopologyError("topology must be a mapping with a 'cpus' list")
        raw = data.get("cpus")
        if not isinstance(raw, list):
            raise TopologyError("topology.cpus must be a list")
        cpus: list[CPUInfo] = []
        for i, item in enumerate(raw):
            if not isinstance(item, Mapping):
                raise TopologyError(f"topology.cpus[{i}] must be a mapping")
            vals: dict[str, int] = {}
            for key in ("cpu", "core", "socket", "numa", "uncore"):
                v = item.get(key)
                if v is None and key == "uncore":
                    v = vals["socket"]
                if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                    raise TopologyError(f"topology.cpus[{i}].{key} must be a non-negative integer, got {v!r}")
                vals[key] = v
            cpus.append(CPUInfo(**vals))
        nodes_raw = data.get("numaNodes", [])
        if not isinstance(nodes_raw, list) or not all(
            isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in nodes_raw
        ):
            raise TopologyError("topology.numaNodes must be a list of non-negative integers")
        nodes = set(nodes_raw)
        dist_raw = data.get("numaDistances")
        distances: dict[int, tuple[int, ...]] | None = None
        if dist_raw is not None:
            if not isinstance(dist_raw, Mapping):
                raise TopologyError("topology.numaDistances must map NUMA node ids to lists of distances")
            distances = {}
            for k, row in dist_raw.items():
                try:
                    node = int(k)
                except (TypeError, ValueError):
                    raise TopologyError(f"topology.numaDistances key {k!r} is not a NUMA node id") from None
                if not isinstance(row, list) or not all(
                    isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in row
                ):
                    raise TopologyError(f"topology.numaDistances[{k!r}] must be a list of non-negative integers")
                distances[node] = tuple(row)
                nodes.add(node)
        return cls(cpus=tuple(cpus), numa_nodes=tuple(nodes), numa_distances=distances)

    @classmethod
    def from_sysfs(cls, root: str | os.PathLike[str] = "/sys") -> Topology:
        """Discover the topology under a sysfs root (``/sys`` on a node, a fixture tree in tests)."""
        found = read_sysfs(root)
        return cls(cpus=found.cpus, numa_nodes=found.numa_nodes, numa_distances=found.numa_distances)


_EMPTY = CPUSet()
