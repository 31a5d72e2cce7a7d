"""NUMA node of a device file, read from sysfs (the device hint provider's input).

``/dev/...`` host paths (what CRI's ``ContainerConfig.devices`` carries) are mapped through their major and
minor numbers to ``<sysfs>/dev/{char,block}/M:m``, whose device (or the first parent that has one) tells its
``numa_node``. VFIO groups (``/dev/vfio/N``) map through ``<sysfs>/kernel/iommu_groups/N/devices``.

A runtime that names a device by its path inside the container and its numbers (NRI's ``LinuxDevice``: the OCI
spec's device) has its host path found the other way (``host_device_path``): the kernel's name of the device node,
``DEVNAME`` in ``<sysfs>/dev/{char,block}/M:m/uevent``, under ``/dev``.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from pathlib import Path

__all__ = ["device_numa_node", "devices_numa_nodes", "host_device_path"]

_MAX_PARENTS = 8


def _numa_of_dir(d: Path) -> int | None:
    """``numa_node`` of a sysfs device directory or its nearest parent that has one; -1 means none."""
    try:
        d = d.resolve(strict=True)
    except OSError:
        return None
    for _ in range(_MAX_PARENTS):
        f = d / "numa_node"
        try:
            text = f.read_text().strip()
        except FileNotFoundError:
            if d.parent == d:
                return None
            d = d.parent
            continue
        except OSError:
            return None
        try:
            node = int(text)
        except ValueError:
            return None
        return node if node >= 0 else None
    return None


def device_numa_node(host_path: str, sysfs: str | os.PathLike[str] = "/sys") -> int | None:
    """The NUMA node of the device at ``host_path``, or None when it has none (or cannot be found)."""
    root = Path(sysfs)
    name = os.path.basename(host_path)
    if os.path.dirname(host_path) == "/dev/vfio" and name.isdigit():
        nodes = {n for dev in (root / "kernel" / "iommu_groups" / name / "devices").glob("*")
                 if (n := _numa_of_dir(dev)) is not None}
        return min(nodes) if len(nodes) == 1 else None
    try:
        st = os.stat(host_path)
    except OSError:
        return None
    if stat.S_ISCHR(st.st_mode):
        kind = "char"
    elif stat.S_ISBLK(st.st_mode):
        kind = "block"
    else:
        return None
    return _numa_of_dir(root / "dev" / kind / f"{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}" / "device")


def devices_numa_nodes(host_paths: Iterable[str], sysfs: str | os.PathLike[str] = "/sys") -> dict[str, frozenset[int]]:
    """``{host path: NUMA nodes}`` for the devices that have a NUMA node (others give no hint)."""
    out: dict[str, frozenset[int]] = {}
    for p in host_paths:
        node = device_numa_node(p, sysfs)
        if node is not None:
            out[p] = frozenset({node})
    return out


def host_device_path(kind: str, major: int, minor: int, sysfs: str | os.PathLike[str] = "/sys") -> str | None:
    """The host path of the device with these numbers (``kind``: the OCI device type, ``b`` a block device,
    anything else a character device), from the kernel's name of it; None when sysfs does not know it."""
    if major < 0 or minor < 0:
        return None
    uevent = Path(sysfs) / "dev" / ("block" if kind == "b" else "char") / f"{major}:{minor}" / "uevent"
    try:
        text = uevent.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition("=")
        if key == "DEVNAME" and value and ".." not in value.split("/"):
            return "/dev/" + value.lstrip("/")
    return None
