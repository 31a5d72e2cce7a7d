"""Reading the CPU topology from a sysfs tree (the only I/O the allocator does, besides its state file).

Files read, relative to the root (``/sys``):
- ``devices/system/cpu/online``: online CPUs (offline CPUs are left out of the topology);
- ``devices/system/cpu/cpuN/topology/{physical_package_id,thread_siblings_list}``;
- ``devices/system/cpu/cpuN/cache/indexK/{level,id}``: the L3 cache id is the uncore id;
- ``devices/system/node/nodeN/{cpulist,distance}``: NUMA nodes, with or without CPUs.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from .cpu_info import CPUInfo
from .cpuset import CPUSet
from .errors import TopologyError

__all__ = ["SysfsMachine", "read_sysfs"]


@dataclass(frozen=True, slots=True)
class SysfsMachine:
    """What the sysfs tree says; ``Topology.from_sysfs`` checks it and builds the topology."""

    cpus: tuple[CPUInfo, ...]
    numa_nodes: tuple[int, ...]
    numa_distances: dict[int, tuple[int, ...]] | None

_CPU_DIR = re.compile(r"^cpu(\d+)$")
_NODE_DIR = re.compile(r"^node(\d+)$")


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError as e:
        raise TopologyError(f"cannot read {path}: {e.strerror or e}") from None


def _read_cpuset(path: Path) -> CPUSet:
    text = _read(path)
    try:
        return CPUSet.parse(text)
    except ValueError as e:
        raise TopologyError(f"{path}: {e}") from None


def _read_int(path: Path) -> int:
    text = _read(path).strip()
    try:
        return int(text)
    except ValueError:
        raise TopologyError(f"{path}: expected an integer, got {text!r}") from None


def _l3_id(cpu_dir: Path) -> int | None:
    cache = cpu_dir / "cache"
    if not cache.is_dir():
        return None
    for index in sorted(cache.iterdir()):
        if not index.name.startswith("index"):
            continue
        level = index / "level"
        if level.exists() and _read(level).strip() == "3" and (index / "id").exists():
            return _read_int(index / "id")
    return None


def read_sysfs(root: str | os.PathLike[str] = "/sys") -> SysfsMachine:
    base = Path(root)
    cpu_root = base / "devices/system/cpu"
    node_root = base / "devices/system/node"
    if not cpu_root.is_dir():
        raise TopologyError(f"{cpu_root} does not exist: is {base} a sysfs root?")

    present = sorted(int(m.group(1)) for e in cpu_root.iterdir() if (m := _CPU_DIR.match(e.name)))
    online_file = cpu_root / "online"
    online = _read_cpuset(online_file) if online_file.exists() else CPUSet(present)

    numa_of: dict[int, int] = {}
    nodes: list[int] = []
    distances: dict[int, tuple[int, ...]] = {}
    if node_root.is_dir():
        for entry in node_root.iterdir():
            m = _NODE_DIR.match(entry.name)
            if not m:
                continue
            node = int(m.group(1))
            nodes.append(node)
            cpulist = entry / "cpulist"
            if cpulist.exists():
                for c in _read_cpuset(cpulist):
                    numa_of[c] = node
            dist = entry / "distance"
            if dist.exists():
                text = _read(dist).split()
                try:
                    distances[node] = tuple(int(x) for x in text)
                except ValueError:
                    raise TopologyError(f"{dist}: expected integers, got {' '.join(text)!r}") from None
    nodes.sort()

    cpus: list[CPUInfo] = []
    for cpu in present:
        if cpu not in online:
            continue
        d = cpu_root / f"cpu{cpu}"
        topo = d / "topology"
        socket = _read_int(topo / "physical_package_id")
        if socket < 0:  # some arm64 kernels report -1 when the firmware gives no package: one socket
            socket = 0
        siblings_file = topo / "thread_siblings_list"
        if not siblings_file.exists():
            siblings_file = topo / "core_cpus_list"
        siblings = _read_cpuset(siblings_file) & online
        core = siblings.min() if siblings else cpu
        l3 = _l3_id(d)
        uncore = socket if l3 is None else l3
        cpus.append(CPUInfo(cpu=cpu, core=core, socket=socket, numa=numa_of.get(cpu, 0), uncore=uncore))
    if not cpus:
        raise TopologyError(f"no online CPUs found under {cpu_root}")
    if not nodes:
        nodes = [0]
    dist_arg: dict[int, tuple[int, ...]] | None = distances if distances and set(distances) == set(nodes) else None
    return SysfsMachine(cpus=tuple(cpus), numa_nodes=tuple(nodes), numa_distances=dist_arg)
