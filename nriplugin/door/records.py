"""The NRI door's ``RecordWriter`` (``nodeagent.ports``): where the cpuset pusher's runtime writes go.

Inside an event (``event()``, entered by the handler around the core's work) a write is collected: containerd applies
the updates a plugin returns with its answer, the pool's new cpusets before the container being created
(nri.md §5.2), and calling the runtime from inside the handler would deadlock (§5.5). Outside an event (the pod watch's
mode changes, the convergence, the pusher's background record queue) nothing may call the runtime safely either
(containerd#13733: an unsolicited UpdateContainers racing an event can hang containerd 1.7/2.1 for good), so the write
is kept, the latest per container, and rides in the answer to the next event that can carry updates. The kernel is
never waiting for it: the pusher writes a running container's cgroup directly (its cgroup is known from NRI's
``cgroups_path``), and a created container that has not started is written at its StartContainer event, before its
process runs. What waits is containerd's record of the container, which matters only when runc applies it again:
on the container's next update, which numapin answers with its cpuset."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextvars import ContextVar

from protos import cri_pb2, nri_pb2

__all__ = ["EventRecords"]


class _Collector:
    def __init__(self) -> None:
        self.open = True
        self.updates: dict[str, cri_pb2.LinuxContainerResources] = {}  # insertion order is the pusher's order


class EventRecords:
    def __init__(self) -> None:
        self._current: ContextVar[_Collector | None] = ContextVar("nri_event_records", default=None)
        self._pending: dict[str, cri_pb2.LinuxContainerResources] = {}

    async def update_resources(self, container_id: str, resources: cri_pb2.LinuxContainerResources, *,
                               timeout: float = 10.0) -> None:
        collector = self._current.get()
        target = collector.updates if collector is not None and collector.open else self._pending
        target.pop(container_id, None)  # the latest goes last: the order the pusher made them in
        copy = cri_pb2.LinuxContainerResources()
        copy.CopyFrom(resources)
        target[container_id] = copy

    @contextlib.contextmanager
    def event(self) -> Iterator[_Collector]:
        """Collect the writes of the work done inside (tasks it starts inherit the collector but write to the
        pending ones once the event's answer is gone)."""
        collector = _Collector()
        token = self._current.set(collector)
        try:
            yield collector
        finally:
            collector.open = False
            self._current.reset(token)

    def answer(self, collector: _Collector, *, exclude: str | None = None,
               current: Callable[[str], tuple[str, str] | None] | None = None) -> list[nri_pb2.ContainerUpdate]:
        """The updates for the event's answer: the ones kept since the last answer, then the event's own; none for
        ``exclude`` (the container being created: containerd refuses an update of it, and it gets its cpuset in the
        adjustment). ``current``: each container's cpuset (cpus, mems) as the pusher last put it in the kernel, None
        for a container no longer tracked: an update kept from before says that, not what it said when it was made
        (a record of a widening kept while the pool narrowed again must not widen it back in containerd's runc
        update). Closes the collector: later writes wait for the next event."""
        collector.open = False
        merged = dict(self._pending)
        self._pending.clear()
        for cid, res in collector.updates.items():
            merged.pop(cid, None)
            merged[cid] = res
        merged.pop(exclude or "", None)
        out = []
        for cid, res in merged.items():
            if current is not None:
                now = current(cid)
                if now is None:
                    continue
                res.cpuset_cpus, res.cpuset_mems = now
            out.append(_update(cid, res))
        return out

    def forget(self, container_id: str) -> None:
        """The container is gone: nothing more to tell the runtime about it."""
        self._pending.pop(container_id, None)

    @property
    def pending(self) -> int:
        return len(self._pending)


def _update(container_id: str, res: cri_pb2.LinuxContainerResources) -> nri_pb2.ContainerUpdate:
    update = nri_pb2.ContainerUpdate(container_id=container_id, ignore_failure=True)
    cpu = update.linux.resources.cpu
    cpu.cpus = res.cpuset_cpus
    cpu.mems = res.cpuset_mems
    if res.cpu_quota > 0:  # a lift (-1) stays out of containerd's record: done in the kernel (door.quota)
        cpu.quota.value = res.cpu_quota
    return update
