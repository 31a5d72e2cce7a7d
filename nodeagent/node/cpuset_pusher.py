"""Pushing cpusets to containers (narrowing and widening the shared pool, re-applying drifted cpusets): the
kernel first, containerd's record right after.

A running container whose cgroup is known (``cgroups``, learned by the convergence) gets its cgroup's
``cpuset.cpus``/``cpuset.mems`` written directly, as runc would write them: the kernel moves its processes at
once, and a narrowing of a hundred containers is a few hundred file writes instead of a hundred ``runc update``
processes. containerd's record is then brought up to date with ``UpdateContainerResources`` in the background
(``records``); the convergence is the backstop if containerd or runc later writes a stale record back into the
cgroup. A container that is not running (created, not started: containerd applies its record at the start), one
whose cgroup is not known yet, a write the kernel refuses, or a change of the CFS quota too goes through
``UpdateContainerResources`` and is waited for. Only containers whose cpuset changes are touched.

On the systemd cgroup driver (``systemd``: a container whose cgroup is a systemd scope on cgroup v2), systemd is
told first (nodeagent.node.systemd_cpusets: it writes the cgroup and re-applies that value on every
``daemon-reload``, instead of the stale one it would otherwise put back), then the files are written as above; a
container systemd refuses goes through ``UpdateContainerResources`` (runc tells systemd too).

Resizing the pool holds the pool gate exclusively (see ``gate``): no shared container starts meanwhile.

The runtime is reached only through the ``RecordWriter`` port (``nodeagent.ports``): the proxy's writer calls
``UpdateContainerResources``. A door that must not call the runtime while it answers an event (NRI: containerd
applies the updates a plugin returns with its answer, and a call from inside the handler deadlocks) supplies a writer
that collects the ``(container id, resources)`` it is given and returns at once, with ``layout`` None (nothing
written in the kernel directly); every push then goes to the writer, in order, and the door puts the collected
updates in its answer to the event (the pool's new cpusets before the new container's own)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import grpc

from allocator.cpuset import CPUSet
from nodeagent.decisions.gate import PoolGate
from nodeagent.decisions.registry import Registry, Tracked
from nodeagent.node.kernel import CgroupLayout, write_cpusets
from nodeagent.node.records import Record, RecordQueue
from nodeagent.node.systemd_cpusets import SystemdCpusets, unit_of
from nodeagent.ports import RecordWriter, RuntimeCallError
from protos import cri_pb2

__all__ = ["CpusetPusher", "PushResult"]

log = logging.getLogger("numapin.criproxy")

Item = tuple[Tracked, CPUSet, CPUSet | None, int | None]  # container, cpus, mems, CFS quota (None: unchanged)


@dataclass(frozen=True)
class PushResult:
    changed: int      # containers that have the cpuset now (in the kernel, or in containerd's spec if not running)
    failed: int
    seconds: float
    direct: int = 0   # of ``changed``, written in the kernel directly (containerd's record follows)


class CpusetPusher:
    def __init__(self, writer: RecordWriter, registry: Registry, *, layout: CgroupLayout | None = None,
                 timeout: float = 10.0, concurrency: int = 128, record_fanout: int = 4,
                 on_resized: Callable[[], None] | None = None,
                 memory_nodes: Callable[[str, str], CPUSet | None] | None = None,
                 systemd: SystemdCpusets | None = None) -> None:
        self.writer = writer            # the runtime's record of a container's resources
        self.systemd = systemd          # None: never through systemd (the cgroupfs driver, or cgroup v1)
        self.registry = registry
        self.layout = layout            # None: never write the kernel directly
        self.timeout = timeout
        self.gate = PoolGate()
        self.on_resized = on_resized or (lambda: None)
        # (pod uid, container) -> the Memory Manager's nodes (None: not accounted): they win over any mems pushed
        self.memory_nodes = memory_nodes or (lambda uid, name: None)
        # container id -> its cgroup (fixed for the container's life), filled by the convergence's locate
        self.cgroups: dict[str, str] = {}
        # updates waited for at once (each makes containerd run runc): a bound for nodes with thousands of
        # containers
        self._slots = asyncio.Semaphore(max(1, concurrency))
        # containerd's record after a direct write: a few at a time in the background (runc processes compete
        # with the node's work and with the creates and starts that wait for the narrowing)
        self.records = RecordQueue(self._record, fanout=record_fanout, timeout=timeout)

    async def _update(self, t: Tracked, cpus: CPUSet, mems: CPUSet | None, quota: int | None) -> bool | None:
        """``UpdateContainerResources``: True when applied, None when the container is gone, False on failure."""
        res = cri_pb2.LinuxContainerResources(cpuset_cpus=str(cpus), cpuset_mems=str(mems) if mems else "")
        if quota is not None:
            res.cpu_quota = quota
        try:
            async with self._slots:
                await self.writer.update_resources(t.id, res, timeout=self.timeout)
        except RuntimeCallError as e:
            if e.code() == grpc.StatusCode.NOT_FOUND:
                self.registry.remove(t.id)  # gone meanwhile: nothing to narrow
                return None
            log.warning("cpuset update failed: pod=%s container=%s id=%s cpus=%s: %s %s", t.pod_ref, t.name,
                        t.id[:13], cpus, e.code().name, e.details())
            return False
        return True

    async def _push(self, t: Tracked, cpus: CPUSet, mems: CPUSet | None, quota: int | None) -> bool:
        """Through containerd, waited for (no record update of the container may land after it)."""
        self.records.drop(t.id)
        await self.records.quiesce(t.id)
        ok = await self._update(t, cpus, mems, quota)
        if ok:
            t.cpus, t.mems = cpus, mems
        return ok is not False

    async def _record(self, r: Record) -> bool:
        """containerd's record of a container whose cgroup was written directly (``records``' sender)."""
        if r.container.id not in self.registry.containers:
            return True  # removed meanwhile
        ok = await self._update(r.container, r.cpus, r.mems, None)
        if ok is False:
            log.warning("containerd's record of pod=%s container=%s id=%s still says another cpuset than cpus=%s "
                        "(the kernel has it); sent again on the next convergence pass", r.container.pod_ref,
                        r.container.name, r.container.id[:13], r.cpus)
        return ok is not False

    async def _write_kernel(self, todo: list[Item], force: bool = False) -> tuple[list[Item], list[Item]]:
        """Write the cgroups of the running containers among ``todo`` whose cgroup is known (``cpuset.mems`` only
        where it changes by the last update, unless ``force``); returns (written, the rest)."""
        layout = self.layout
        if layout is None:
            return [], todo
        direct = [i for i in todo if i[3] is None and i[0].id in self.cgroups]
        if not direct:
            return [], todo
        # an older record update not sent yet is superseded; one still at containerd with another value would
        # put that value back when it lands after the write
        for t, _, _, _ in direct:
            self.records.drop(t.id)
        busy = [(t, c, m) for t, c, m, _ in direct if self.records.busy(t.id, c, m)]  # no task for the others
        if busy:
            await asyncio.gather(*(self.records.quiesce(t.id, c, m) for t, c, m in busy))
        rest = [i for i in todo if i[3] is not None or i[0].id not in self.cgroups]
        direct, refused = await self._tell_systemd(direct)
        rest += refused
        errors = await asyncio.to_thread(write_cpusets, layout,
                                         [(self.cgroups[t.id], c, m if force or m != t.mems else None)
                                          for t, c, m, _ in direct])
        written: list[Item] = []
        for item, error in zip(direct, errors, strict=True):
            if error is None:
                written.append(item)
            else:  # not started (no cgroup yet), gone, or refused: containerd does it
                log.debug("cgroup of container %s not written (%s); through the runtime", item[0].id[:13], error)
                rest.append(item)
        for t, c, m, _ in written:
            t.cpus, t.mems = c, m
            self.records.put(Record(t, c, m))
        return written, rest

    async def _tell_systemd(self, direct: list[Item]) -> tuple[list[Item], list[Item]]:
        """systemd's properties of the containers among ``direct`` that are its scopes, set first; returns (the
        items whose cgroup files are to be written, those systemd refused: through the runtime)."""
        systemd = self.systemd
        if systemd is None:
            return direct, []
        units = [(i, unit_of(self.cgroups[i[0].id])) for i in direct]
        told = [(i, u) for i, u in units if u is not None]
        if not told:
            return direct, []
        answers = await asyncio.gather(*(systemd.set(u, c, m) for (_, c, m, _), u in told))
        refused = {id(i) for (i, _), why in zip(told, answers, strict=True) if why is not None}
        for (i, u), why in zip(told, answers, strict=True):
            if why is not None:
                log.warning("systemd did not take cpus=%s for pod=%s container=%s (%s): %s; through the runtime",
                            i[1], i[0].pod_ref, i[0].name, u, why)
        return [i for i in direct if id(i) not in refused], [i for i in direct if id(i) in refused]

    async def push(self, items: Iterable[Item], *, force: bool = False) -> PushResult:
        """Apply ``(container, cpus, mems, quota or None)``, skipping containers that already have them by the
        last update (unless ``force``: the kernel showed otherwise). Returns once the kernel has them (running
        containers) or containerd took them (the others)."""
        t0 = time.perf_counter()
        held = self.memory_nodes
        todo = [(t, c, m, q) for t, c, m, q in ((t, c, held(t.pod_uid, t.name) or m, q) for t, c, m, q in items)
                if force or t.cpus != c or (m is not None and t.mems != m)]
        written, rest = await self._write_kernel(todo, force)
        results = await asyncio.gather(*(self._push(*i) for i in rest)) if rest else []
        failed = sum(1 for ok in results if not ok)
        return PushResult(len(todo) - failed, failed, time.perf_counter() - t0, len(written))

    async def resize_shared(self, pool: CPUSet, mems: CPUSet | None) -> PushResult:
        """Narrow (or widen) every container of the shared pool to ``pool``, with the pool gate held; the
        kernel is checked right after (``on_resized``)."""
        try:
            async with self.gate.exclusive():
                return await self.push((t, pool, mems, None) for t in self.registry.on_shared_pool())
        finally:
            self.on_resized()
