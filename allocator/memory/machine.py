"""A machine's memory per NUMA node: total memory and huge pages reserved per page size.

Read from sysfs (``devices/system/node/nodeN/meminfo``'s ``MemTotal`` and
``devices/system/node/nodeN/hugepages/hugepages-<size>kB/nr_hugepages``), the files kubelet's Memory Manager takes
its machine information from (through cAdvisor), or loaded from / dumped to JSON (``numapin plan`` scenarios, NRT).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ConfigError, TopologyError
from .resources import MEMORY, hugepage_resource, hugepage_size, resource_order

__all__ = ["MachineMemory", "NodeMemory", "read_machine_memory"]

_NODE_DIR = re.compile(r"^node(\d+)$")
_HUGE_DIR = re.compile(r"^hugepages-(\d+)kB$")
_MEMTOTAL = re.compile(r"^Node\s+\d+\s+MemTotal:\s+(\d+)\s*kB\s*$", re.MULTILINE)


@dataclass(frozen=True, slots=True)
class NodeMemory:
    """One NUMA node: ``memory`` bytes in total (MemTotal) and ``hugepages`` as (page size in bytes, pages)."""

    node: int
    memory: int
    hugepages: tuple[tuple[int, int], ...] = ()

    def totals(self) -> dict[str, int]:
        """Bytes per resource: ``memory`` (MemTotal, huge pages included) and every huge-page size."""
        out = {MEMORY: self.memory}
        for size, count in self.hugepages:
            out[hugepage_resource(size)] = size * count
        return out


@dataclass(frozen=True, slots=True)
class MachineMemory:
    """Every NUMA node's memory, by ascending node id."""

    nodes: tuple[NodeMemory, ...]

    def __post_init__(self) -> None:
        ids = [n.node for n in self.nodes]
        if len(set(ids)) != len(ids):
            raise ConfigError(f"machine memory: NUMA node ids repeat: {ids}")
        object.__setattr__(self, "nodes", tuple(sorted(self.nodes, key=lambda n: n.node)))

    @property
    def node_ids(self) -> tuple[int, ...]:
        return tuple(n.node for n in self.nodes)

    def node(self, node: int) -> NodeMemory:
        for n in self.nodes:
            if n.node == node:
                return n
        raise KeyError(node)

    def resources(self) -> tuple[str, ...]:
        """Every resource some node has: ``memory`` and the huge-page sizes (even with 0 pages), in output order."""
        names = {MEMORY}
        for n in self.nodes:
            names.update(hugepage_resource(size) for size, _ in n.hugepages)
        return tuple(sorted(names, key=resource_order))

    def capacity(self) -> dict[str, int]:
        """Bytes per resource over the whole machine."""
        out: dict[str, int] = {}
        for n in self.nodes:
            for r, v in n.totals().items():
                out[r] = out.get(r, 0) + v
        return out

    @classmethod
    def uniform(cls, nodes: Iterable[int], memory: int, hugepages: Iterable[tuple[int, int]] = ()) -> MachineMemory:
        """Every node alike (tests, scenarios)."""
        pages = tuple(hugepages)
        return cls(tuple(NodeMemory(n, memory, pages) for n in nodes))

    def to_dict(self) -> dict[str, Any]:
        return {"nodes": [{"node": n.node, "memory": n.memory,
                           "hugepages": {hugepage_resource(s): c for s, c in n.hugepages}} for n in self.nodes]}

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> MachineMemory:
        """``{"nodes": [{"node": 0, "memory": bytes, "hugepages": {"hugepages-2Mi": pages}}]}``; ConfigError."""
        if not isinstance(doc, Mapping) or not isinstance(doc.get("nodes"), list):
            raise ConfigError("machine memory must be an object with a 'nodes' list")
        nodes = []
        for i, item in enumerate(doc["nodes"]):
            where = f"machine memory nodes[{i}]"
            if not isinstance(item, Mapping):
                raise ConfigError(f"{where} must be an object")
            node, memory = item.get("node"), item.get("memory")
            if not isinstance(node, int) or not isinstance(memory, int) or not _uint(node) or not _uint(memory):
                raise ConfigError(f"{where}: 'node' and 'memory' must be non-negative integers")
            pages_doc = item.get("hugepages") or {}
            if not isinstance(pages_doc, Mapping):
                raise ConfigError(f"{where}.hugepages must map hugepages-<size> to a page count")
            pages = []
            for name, count in pages_doc.items():
                if not _uint(count):
                    raise ConfigError(f"{where}.hugepages[{name!r}] must be a non-negative page count")
                pages.append((hugepage_size(name), count))
            nodes.append(NodeMemory(node, memory, tuple(sorted(pages))))
        return cls(tuple(nodes))


def _uint(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError as e:
        raise TopologyError(f"cannot read {path}: {e.strerror or e}") from None


def read_machine_memory(root: str | os.PathLike[str] = "/sys") -> MachineMemory:
    """Every NUMA node's memory from a sysfs root. TopologyError when the tree has no NUMA node directories or a
    node's files cannot be read or understood."""
    node_root = Path(root) / "devices/system/node"
    if not node_root.is_dir():
        raise TopologyError(f"{node_root} does not exist: cannot read the memory of the NUMA nodes")
    nodes: list[NodeMemory] = []
    for entry in node_root.iterdir():
        m = _NODE_DIR.match(entry.name)
        if not m:
            continue
        node = int(m.group(1))
        meminfo = entry / "meminfo"
        found = _MEMTOTAL.search(_read(meminfo))
        if found is None:
            raise TopologyError(f"{meminfo}: no 'Node {node} MemTotal: <n> kB' line")
        pages: list[tuple[int, int]] = []
        huge_root = entry / "hugepages"
        if huge_root.is_dir():
            for hp in huge_root.iterdir():
                hm = _HUGE_DIR.match(hp.name)
                if not hm:
                    continue
                text = _read(hp / "nr_hugepages").strip()
                if not text.isdigit():
                    raise TopologyError(f"{hp / 'nr_hugepages'}: expected a page count, got {text!r}")
                pages.append((int(hm.group(1)) * 1024, int(text)))
        nodes.append(NodeMemory(node, int(found.group(1)) * 1024, tuple(sorted(pages))))
    if not nodes:
        raise TopologyError(f"no NUMA node directories (nodeN) under {node_root}")
    return MachineMemory(tuple(nodes))
