"""Cpusets written through systemd, for nodes on the systemd cgroup driver (kubeadm's default).

There systemd owns the containers' cgroups: each container is a scope unit (runc's ``cri-containerd-<id>.scope``
under kubelet's ``kubepods-...-pod<uid>.slice``) whose ``AllowedCPUs``/``AllowedMemoryNodes`` systemd writes back
into the cgroup on every ``systemctl daemon-reload`` and unit change (package upgrades do both). A cpuset written
in the cgroup file behind systemd's back comes back as systemd last heard it: a shared container narrowed off an
exclusive CPU would be put back on it. So, as runc does, the proxy tells systemd first (``SetUnitProperties`` on
the scope, runtime, the CPUs and memory nodes as byte-array bitmasks); systemd writes the cgroup itself.

The connection: systemd's private socket ``/run/systemd/private`` (root; no message bus needed), else the system
bus. One connection, opened on first use and again after a loss; every call bounded in time; the event loop never
blocks (nodeagent.node.dbus_wire).

Which containers: those whose cgroup (cgroup v2) is a ``.scope`` (``driver="auto"``, the default), every scope
(``"systemd"``), none (``"cgroupfs"``).
"""

from __future__ import annotations

import asyncio
import logging

from allocator.cpuset import CPUSet
from nodeagent.node.dbus_wire import Bytes, DBusConnection, DBusError, Variant

__all__ = ["DRIVERS", "PRIVATE_SOCKET", "SYSTEM_BUS_SOCKET", "SystemdCpusets", "bitmask", "unit_of"]

log = logging.getLogger("numapin.criproxy")

PRIVATE_SOCKET = "/run/systemd/private"
SYSTEM_BUS_SOCKET = "/run/dbus/system_bus_socket"
DRIVERS = ("auto", "systemd", "cgroupfs")
MANAGER = "/org/freedesktop/systemd1"


def unit_of(cgroup: str) -> str | None:
    """The systemd unit a container's cgroup is (its last component when it is a ``.scope``), else None."""
    leaf = cgroup.rstrip("/").rsplit("/", 1)[-1]
    return leaf if leaf.endswith(".scope") and len(leaf) > len(".scope") else None


def bitmask(cpus: CPUSet) -> bytes:
    """systemd's D-Bus form of a CPU (or NUMA node) set: byte i bit j is member 8i+j; empty for the empty set."""
    if not cpus:
        return b""
    out = bytearray(cpus.max() // 8 + 1)
    for c in cpus:
        out[c // 8] |= 1 << (c % 8)
    return bytes(out)


class SystemdCpusets:
    """``await set(unit, cpus, mems)`` -> None, or why systemd did not take it; ``await close()``."""

    def __init__(self, *, sockets: tuple[tuple[str, bool], ...] = ((PRIVATE_SOCKET, False),
                                                                    (SYSTEM_BUS_SOCKET, True)),
                 timeout: float = 10.0) -> None:
        self.sockets = sockets  # (path, is a message bus), tried in order
        self.timeout = timeout
        self._conn: DBusConnection | None = None
        self._lock = asyncio.Lock()

    async def _connection(self) -> DBusConnection:
        async with self._lock:
            if self._conn is not None and not self._conn.closed:
                return self._conn
            errors = []
            for path, bus in self.sockets:
                try:
                    self._conn = await DBusConnection.open(path, bus=bus, timeout=self.timeout)
                    return self._conn
                except (TimeoutError, OSError, DBusError) as e:
                    errors.append(f"{path}: {e}")
            raise DBusError("", "systemd cannot be reached (" + "; ".join(errors) + ")")

    async def set(self, unit: str, cpus: CPUSet, mems: CPUSet | None) -> str | None:
        """Set the scope's ``AllowedCPUs`` (and ``AllowedMemoryNodes`` when ``mems`` is given), runtime only (as runc
        does: gone with the scope); systemd writes the cgroup. None when done, else why not."""
        props = [("AllowedCPUs", Variant("ay", Bytes(bitmask(cpus))))]
        if mems is not None:
            props.append(("AllowedMemoryNodes", Variant("ay", Bytes(bitmask(mems)))))
        for attempt in range(2):  # once more on a fresh connection when the old one was lost
            try:
                conn = await self._connection()
                await conn.call(path=MANAGER, interface="org.freedesktop.systemd1.Manager",
                                member="SetUnitProperties", destination="org.freedesktop.systemd1",
                                signature="sba(sv)", args=(unit, True, props), timeout=self.timeout)
                return None
            except DBusError as e:
                if e.name or attempt:
                    return str(e)
            except TimeoutError:
                return f"systemd did not answer within {self.timeout:g} s"
        return None  # not reached

    async def close(self) -> None:
        if self._conn is not None:
            await self._conn.close()
            self._conn = None
