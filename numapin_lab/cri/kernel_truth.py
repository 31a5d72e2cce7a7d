"""The oracle of the churn harness: what every running container of a containerd really runs on, read from
the kernel (its processes' ``/proc/<pid>/status`` and its cgroup's cpuset files), independently of the
proxy's own code. Containers are listed from containerd itself (never through the proxy)."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from pathlib import Path

import grpc
import grpc.aio

from allocator.cpuset import CPUSet

from .client import CRIClient, pb

__all__ = ["ContainerTruth", "KernelTruth"]


@dataclass(frozen=True)
class ContainerTruth:
    id: str
    pod_uid: str
    pod: str
    name: str
    attempt: int
    pid: int
    cgroup_cpus: CPUSet
    cgroup_mems: CPUSet
    tasks: tuple[tuple[int, CPUSet, CPUSet, str], ...]   # (pid, Cpus_allowed_list, Mems_allowed_list, Name)
    cgroup: str = ""

    @property
    def cpus(self) -> CPUSet:
        """Every CPU any of its processes, or its cgroup, allows."""
        out = self.cgroup_cpus
        for _, c, _, _ in self.tasks:
            out = out | c
        return out

    @property
    def mems(self) -> CPUSet:
        out = self.cgroup_mems
        for _, _, m, _ in self.tasks:
            out = out | m
        return out

    def describe(self) -> str:
        """The kernel's view in words (for violation reports)."""
        tasks = ", ".join(f"pid {p} {n} cpus {c} mems {m}" for p, c, m, n in self.tasks)
        return f"cgroup {self.cgroup} cpuset.cpus {self.cgroup_cpus} mems {self.cgroup_mems}; {tasks}"

    def exactly(self) -> tuple[CPUSet, CPUSet] | None:
        """(cpus, mems) when the cgroup and every process agree, else None."""
        if all(c == self.cgroup_cpus and m == self.cgroup_mems for _, c, m, _ in self.tasks):
            return self.cgroup_cpus, self.cgroup_mems
        return None


def _parse(text: str) -> CPUSet:
    return CPUSet.parse(text.strip()) if text.strip() else CPUSet()


def _status(proc: Path, pid: int) -> tuple[CPUSet, CPUSet, str] | None:
    try:
        text = (proc / str(pid) / "status").read_text()
    except OSError:
        return None
    cpus = mems = None
    name = ""
    for line in text.splitlines():
        if line.startswith("Name:"):
            name = line.split(":", 1)[1].strip()
        elif line.startswith("Cpus_allowed_list:"):
            cpus = _parse(line.split(":", 1)[1])
        elif line.startswith("Mems_allowed_list:"):
            mems = _parse(line.split(":", 1)[1])
    return (cpus, mems, name) if cpus is not None and mems is not None else None


def read_container(proc: Path, cgroup_root: Path, pid: int, cid: str) -> tuple[CPUSet, CPUSet, tuple, str] | None:
    """(cgroup cpus, cgroup mems, tasks, cgroup) of container ``cid`` whose first process is ``pid``; None if it
    is gone (also when ``pid`` now belongs to another process: pids are reused, the container's cgroup is named
    after its id)."""
    try:
        lines = (proc / str(pid) / "cgroup").read_text().splitlines()
    except OSError:
        return None
    d = None
    where = ""
    for line in lines:
        _, ctrls, path = line.split(":", 2)
        if "cpuset" in ctrls.split(","):
            d, where = cgroup_root / "cpuset" / path.lstrip("/"), path
            break
        if ctrls == "":
            d, where = cgroup_root / path.lstrip("/"), path
    if d is None or cid not in where:
        return None
    v2 = not (d / "cpuset.cpus").exists() or (cgroup_root / "cgroup.controllers").exists()
    try:
        cpus = _parse((d / ("cpuset.cpus.effective" if v2 else "cpuset.cpus")).read_text())
        mems = _parse((d / ("cpuset.mems.effective" if v2 else "cpuset.mems")).read_text())
        pids = [int(p) for p in (d / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return None
    tasks = []
    for p in pids:
        st = _status(proc, p)
        if st is not None:
            tasks.append((p, *st))
    if not tasks:
        return None
    return cpus, mems, tuple(tasks), where


class KernelTruth:
    """``await truth.running()``: every running (non-sandbox) container of ``runtime_socket`` with its real
    cpuset. Pids are cached per container id (a container keeps its first process)."""

    def __init__(self, runtime_socket: str, *, proc: str = "/proc", cgroup_root: str = "/sys/fs/cgroup") -> None:
        self.client = CRIClient(runtime_socket, timeout=10.0)
        self.proc = Path(proc)
        self.cgroup_root = Path(cgroup_root)
        self._pids: dict[str, int] = {}

    async def close(self) -> None:
        await self.client.close()

    async def _pid(self, cid: str) -> int:
        if cid not in self._pids:
            st = await self.client.container_status(cid, verbose=True)
            pid = int(json.loads(st.info.get("info", "{}")).get("pid", 0))
            if pid <= 0:
                return 0
            self._pids[cid] = pid
        return self._pids[cid]

    async def running(self) -> list[ContainerTruth] | None:
        """None when containerd does not answer."""
        try:
            sandboxes = {s.id: s for s in await self.client.list_pod_sandbox()}
            items = [c for c in await self.client.list_containers() if c.state == pb.CONTAINER_RUNNING]
            pids = await asyncio.gather(*(self._pid(c.id) for c in items), return_exceptions=True)
        except grpc.aio.AioRpcError:
            return None
        live = {c.id for c in items}
        for cid in [c for c in self._pids if c not in live]:
            del self._pids[cid]
        todo = [(c, p) for c, p in zip(items, pids, strict=True) if isinstance(p, int) and p > 0]
        read = await asyncio.to_thread(lambda: [read_container(self.proc, self.cgroup_root, p, c.id) for c, p in todo])
        out = []
        for (c, pid), r in zip(todo, read, strict=True):
            if r is None:
                continue
            sb = sandboxes.get(c.pod_sandbox_id)
            uid = sb.metadata.uid if sb is not None else ""
            pod = f"{sb.metadata.namespace}/{sb.metadata.name}" if sb is not None else "?"
            out.append(ContainerTruth(c.id, uid, pod, c.metadata.name, c.metadata.attempt, pid, *r))
        return out

    async def one(self, cid: str) -> ContainerTruth | None:
        """Re-read one container (to confirm a suspected violation)."""
        pid = self._pids.get(cid)
        if not pid:
            return None
        r = await asyncio.to_thread(read_container, self.proc, self.cgroup_root, pid, cid)
        if r is None:
            return None
        return ContainerTruth(cid, "", "", "", 0, pid, *r)
