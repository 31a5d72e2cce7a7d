"""numapin's behaviour on containerd's NRI events: the node agent's operations (``nodeagent``), the same the CRI
proxy calls, answered as NRI answers.

- Synchronize (every connection): the containers' cgroups are noted, the updates kept since the last answer go
  back, and a reconcile with the runtime's lists runs in the background (it adopts what was created while no plugin
  was connected; the convergence then puts every running container where numapin decides, in the kernel).
- CreateContainer: ``admit`` (decided and committed: state on disk, the shared containers narrowed in the kernel)
  and ``register`` at once (NRI names the container before it exists); the answer carries the container's cpuset
  and the shared containers' new cpusets, which containerd applies first (nri.md §5.2). Never a CFS quota: a pinned
  container's quota is lifted in the kernel only (``quota``: containerd's record keeps kubelet's, which kubelet reads
  back as the CPU limit it shows). A refusal fails the creation with the same status and message the proxy gives.
- StartContainer (after containerd made the task, before its process runs): the start guard. An exclusive
  container's CPUs are taken back in the kernel from any other running container first; the container's own cgroup
  is checked and repaired (a shared container created before a narrowing that containerd applied too late); a pinned
  container's CFS quota is taken off its cgroup. CPUs not clear ``ANSWER_MARGIN`` before containerd's deadline fail
  the start (UNAVAILABLE, logged with what was not clear; kubelet retries it): a late answer would have the plugin
  dropped and the container started anyway.
- UpdateContainer (kubelet's in-place resize): ``Resizer.resize``; the container's own new cpuset is written in the
  kernel at once (the pool widens only after it), then answered for containerd's record; a refusal fails kubelet's
  call with numapin's message. PostUpdateContainer (runc wrote kubelet's new quota): a pinned container's quota is
  taken off its cgroup again.
- StopContainer, RemoveContainer, StopPodSandbox, RemovePodSandbox: the CPUs go back and the pool widens (in the
  kernel at once; containerd's records with the next answer).

containerd serialises the NRI events of a node behind one lock and drops a plugin that answers late (2 s by default):
every handler works within ``CallContext.deadline``; the slow parts of the core (state writes, kernel writes) run in
worker threads already."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any

from nodeagent.app import NodeAgent
from nodeagent.decisions.target import TargetResources
from nodeagent.node.devices import host_device_path
from nodeagent.node.kernel import cgroup_of_spec
from nodeagent.rejection import Rejection
from protos import nri_pb2

from ..events import Event
from ..handler import BaseHandler, CallContext, PluginError, RuntimeInfo
from ..wire.codes import Code
from .quota import QuotaKeeper
from .records import EventRecords
from .translate import DeviceKey, create_request, device_key, nri_resources, resize_request

__all__ = ["EVENTS", "NumapinHandler"]

log = logging.getLogger("numapin.nri")

# what numapin answers: pods' and containers' whole life (the mask nri-plugins' resource policies use too)
EVENTS = frozenset({Event.STOP_POD_SANDBOX, Event.REMOVE_POD_SANDBOX, Event.CREATE_CONTAINER, Event.START_CONTAINER,
                    Event.UPDATE_CONTAINER, Event.POST_UPDATE_CONTAINER, Event.STOP_CONTAINER,
                    Event.REMOVE_CONTAINER})

LANDING = 30.0  # seconds a created container may take to reach containerd's lists
ANSWER_MARGIN = 0.3  # seconds kept between the start guard's last check and containerd's deadline for the answer


def _refusal(e: Rejection) -> PluginError:
    return PluginError(Code(e.code.value[0]), e.message)


class NumapinHandler(BaseHandler):
    """The plugin's handler. ``reconcile``: the agent's reconcile with the runtime's lists, started in the
    background by every Synchronize; ``on_connected``/``on_disconnected``: told when a runtime comes and goes."""

    events = EVENTS

    def __init__(self, agent: NodeAgent, records: EventRecords, *,
                 reconcile: Callable[[], Coroutine[Any, Any, object]],
                 on_connected: Callable[[RuntimeInfo], None] | None = None,
                 on_disconnected: Callable[[str], None] | None = None,
                 quota: QuotaKeeper | None = None) -> None:
        self.agent = agent
        self.records = records
        self.quota = quota  # None: pinned containers keep their CFS quota (--keep-cfs-quota)
        self._reconcile = reconcile
        self._on_connected = on_connected or (lambda info: None)
        self._on_disconnected = on_disconnected or (lambda why: None)
        self._background: set[asyncio.Task[object]] = set()
        # containers answered but maybe not in containerd's lists yet (it stores a container after the plugin's
        # answer): a reconcile meanwhile must not take their CPUs back (``Pinning.creating``); until they start,
        # are removed, or LANDING seconds pass
        self._landing: dict[str, tuple[tuple[str, str], float]] = {}

    # -- connection --------------------------------------------------------------------------------------
    async def on_connected(self, runtime: RuntimeInfo) -> None:
        log.info("NRI: connected to %s %s (request timeout %.1f s)", runtime.name, runtime.version,
                 runtime.request_timeout)
        self._on_connected(runtime)

    async def on_disconnected(self, reason: str) -> None:
        log.warning("NRI: disconnected (%s): containers created meanwhile run without numapin's cpusets until the "
                    "plugin is back and has converged them", reason)
        self._on_disconnected(reason)

    async def synchronize(self, ctx: CallContext, request: Any) -> Any:
        self._note_cgroups(request.containers)
        with self.records.event() as collector:
            updates = self.records.answer(collector, current=self._current)
        task = asyncio.get_running_loop().create_task(self._reconcile_after_sync(len(request.containers)))
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return nri_pb2.SynchronizeResponse(update=updates)

    async def _reconcile_after_sync(self, containers: int) -> None:
        try:
            await self._reconcile()
        except Exception as e:  # the runtime's CRI socket unreachable: the periodic reconcile and convergence retry
            log.warning("NRI: reconcile after Synchronize (%d containers) failed: %s", containers, e)
            return
        self.agent.pusher.on_resized()  # the convergence checks every running container now

    async def stop(self) -> None:
        if self.quota is not None:
            await self.quota.stop()
        for task in list(self._background):
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)

    def _current(self, container_id: str) -> tuple[str, str] | None:
        """A container's cpuset as numapin last put it (None: not tracked, or not numapin's to set)."""
        t = self.agent.registry.containers.get(container_id)
        if t is None or t.cpus is None or t.mode == "bypass" or t.exited:
            return None
        return str(t.cpus), str(t.mems) if t.mems is not None else ""

    def _note_cgroups(self, containers: Any) -> None:
        """The containers' cgroups from NRI (their OCI ``cgroupsPath``): the pusher writes a running one's cpuset
        in the kernel without asking the runtime."""
        cgroups = self.agent.pusher.cgroups
        for c in containers:
            path = cgroup_of_spec(c.linux.cgroups_path)
            if path and c.id not in cgroups:
                cgroups[c.id] = path

    # -- creation ----------------------------------------------------------------------------------------
    async def create_container(self, ctx: CallContext, request: Any) -> Any:
        container = request.container
        req = create_request(request.pod, container, await self._host_paths(container))
        pinning = self.agent.pinning
        with self.records.event() as collector:
            try:
                admission = await pinning.admit(req, max(ctx.remaining(), 0.0))
            except Rejection as e:
                raise _refusal(e) from None
            try:
                await pinning.register(req, container.id, admission)
            except BaseException:
                pinning.settle(admission)
                raise
            self._note_cgroups([container])
            self._land(container.id, (admission.ident.uid, admission.name))
            updates = self.records.answer(collector, exclude=container.id, current=self._current)
            response = nri_pb2.CreateContainerResponse(update=updates)
        target = admission.target
        if target is not None:
            response.adjust.linux.resources.CopyFrom(_resources(target))
        return response

    async def _host_paths(self, container: Any) -> dict[DeviceKey, str]:
        """The host paths of the container's devices (NRI names them by their path inside the container)."""
        keys = {device_key(d) for d in container.linux.devices}
        if not keys:
            return {}
        sysfs = self.agent.pinning.options.sysfs

        def find() -> dict[DeviceKey, str]:
            return {k: p for k in keys if (p := host_device_path(*k, sysfs)) is not None}

        return await asyncio.to_thread(find)

    def _land(self, container_id: str, key: tuple[str, str]) -> None:
        now = time.monotonic()
        creating = self.agent.pinning.creating
        for cid, (_, until) in list(self._landing.items()):
            if until <= now:
                self._landed(cid)
        self._landing[container_id] = (key, now + LANDING)
        creating.add(key)

    def _landed(self, container_id: str) -> None:
        entry = self._landing.pop(container_id, None)
        if entry is not None and all(k != entry[0] for k, _ in self._landing.values()):
            self.agent.pinning.creating.discard(entry[0])

    async def state_change(self, ctx: CallContext, event: Any) -> None:
        kind = event.event
        if kind in (Event.START_CONTAINER, Event.REMOVE_CONTAINER):
            self._landed(event.container.id)
        if kind == Event.START_CONTAINER:
            await self._start(event.container, ctx)
            await self._lift(event.container.id)
        elif kind == Event.POST_UPDATE_CONTAINER:
            await self._lift(event.container.id)
        elif kind == Event.REMOVE_CONTAINER:
            await self._removed(event.container.id)
        elif kind == Event.STOP_POD_SANDBOX:
            await self.agent.pinning.sandbox_stopped(event.pod.id)
        elif kind == Event.REMOVE_POD_SANDBOX:
            await self.agent.pinning.sandbox_removed(event.pod.id)

    async def _start(self, container: Any, ctx: CallContext) -> None:
        self._note_cgroups([container])

        async def started() -> None:  # containerd starts the task once the event is answered
            return None

        try:  # a refusal answered in time (kubelet retries the start) rather than a plugin dropped for lateness
            await self.agent.starts.start(container.id, started, within=ctx.remaining() - ANSWER_MARGIN)
        except Rejection as e:
            raise _refusal(e) from None

    async def _lift(self, container_id: str) -> None:
        """The container's CFS quota off its cgroup if it is pinned; then a sweep of every pinned container in the
        background (record updates containerd applied since put kubelet's quota back)."""
        if self.quota is not None:
            await self.quota.lift([container_id])
            self.quota.sweep_soon()

    # -- resize ------------------------------------------------------------------------------------------
    async def update_container(self, ctx: CallContext, request: Any) -> Any:
        cid = request.container.id
        agent = self.agent

        async def apply(target: TargetResources | None) -> TargetResources | None:
            """The container takes its new cpuset in the kernel now (before the pool widens); containerd's record
            follows with the answer."""
            t = agent.registry.containers.get(cid)
            if target is not None and t is not None and cid in agent.pusher.cgroups:
                await agent.pusher.push([(t, target.cpus, target.mems, None)], force=True)
            return target

        with self.records.event() as collector:
            try:
                target = await agent.resizer.resize(resize_request(request), apply)
            except Rejection as e:
                raise _refusal(e) from None
            updates = self.records.answer(collector, exclude=cid, current=self._current)
        if target is not None:  # containerd takes the last update for the target as its resources (nri.md §5.3)
            own = nri_pb2.ContainerUpdate(container_id=cid)
            own.linux.resources.CopyFrom(_resources(target))
            updates.append(own)
        return nri_pb2.UpdateContainerResponse(update=updates)

    # -- the end of containers and pods ------------------------------------------------------------------
    async def stop_container(self, ctx: CallContext, request: Any) -> Any:
        self.agent.pinning.container_stopped(request.container.id)
        with self.records.event() as collector:
            return nri_pb2.StopContainerResponse(update=self.records.answer(collector, current=self._current))

    async def _removed(self, container_id: str) -> None:
        await self.agent.pinning.container_removed(container_id)
        self.records.forget(container_id)
        self.agent.converger.forget(container_id)


def _resources(target: TargetResources) -> Any:
    """The container's own cpuset for containerd's record; its CFS quota stays kubelet's there (``lift_quota`` is
    done in the kernel, ``quota``)."""
    return nri_resources(str(target.cpus), str(target.mems) if target.mems is not None else "")
