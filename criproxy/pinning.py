"""The proxy's decisions: the interceptors of CreateContainer, UpdateContainerResources, RemoveContainer,
StopPodSandbox and RemovePodSandbox, around the allocator's node facade.

Every change of the allocation happens under one asyncio lock (the relay of other methods never takes it),
is written to the checkpoint before anything is forwarded, and is undone and written again when the runtime
refuses the container. Before an exclusive container is created every container of the shared pool has
been narrowed; released CPUs widen the pool again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import grpc
import grpc.aio

from allocator.checkpoint import CheckpointStore
from allocator.cpuset import CPUSet
from allocator.devices import devices_numa_nodes
from allocator.errors import AllocatorError, PodSpecError
from allocator.intent import INTENT_ANNOTATION
from allocator.node import NodeAllocator, NodeConfig, PodDecision
from protos import cri_pb2

from . import wire
from .cri_intent import PodIdentity, identity_of, pod_from_cri
from .narrowing import CpusetPusher
from .registry import Registry, Tracked
from .relay import Forward, Interceptor, Rejection

__all__ = ["Pinning", "PinningOptions"]

log = logging.getLogger("numapin.criproxy")

# field numbers (upstream CRI): CreateContainerRequest.config=2 -> ContainerConfig.linux=15 ->
# LinuxContainerConfig.resources=1; UpdateContainerResourcesRequest.linux=2; LinuxContainerResources
# cpu_quota=2, cpuset_cpus=6, cpuset_mems=7
_CREATE_RESOURCES = (2, 15, 1)
_UPDATE_RESOURCES = (2,)
_QUOTA, _CPUS, _MEMS = 2, 6, 7
UNLIMITED_QUOTA = -1


@dataclass(frozen=True)
class PinningOptions:
    lift_cfs_quota: bool = True          # pinned containers run without a CFS quota (kubelet >= 1.32)
    sysfs: str = "/sys"                  # for device NUMA nodes
    self_pod: tuple[str, str] | None = None   # (namespace, name) of the proxy's own pod: passed through
    self_pod_uid: str | None = None


class Pinning:
    def __init__(self, config: NodeConfig, allocator: NodeAllocator, store: CheckpointStore, pusher: CpusetPusher,
                 registry: Registry, options: PinningOptions = PinningOptions(), *,
                 on_change: Callable[[], None] | None = None,
                 on_decision: Callable[[str, str], None] | None = None,
                 on_narrow: Callable[[float], None] | None = None) -> None:
        self.allocator = allocator
        self.store = store
        self.pusher = pusher
        self.registry = registry
        self.options = options
        self.lock = asyncio.Lock()
        self.on_change = on_change or (lambda: None)
        self.on_decision = on_decision or (lambda mode, outcome: None)
        self.on_narrow = on_narrow or (lambda seconds: None)
        self.config = config
        self.policy = config.topology_manager_policy
        self.scope = config.topology_manager_scope
        self.topology = config.topology

    def interceptors(self) -> Mapping[str, Interceptor]:
        return {
            "CreateContainer": self.create_container,
            "UpdateContainerResources": self.update_container_resources,
            "StopContainer": self.stop_container,
            "RemoveContainer": self.remove_container,
            "StopPodSandbox": self.stop_pod_sandbox,
            "RemovePodSandbox": self.remove_pod_sandbox,
        }

    # -- helpers ------------------------------------------------------------------------------------------
    def _mems_of(self, cpus: CPUSet) -> CPUSet:
        return self.topology.numa_of(cpus)

    def shared_pool(self) -> tuple[CPUSet, CPUSet]:
        pool = self.allocator.shared_pool()
        return pool, self._mems_of(pool)

    async def save(self) -> None:
        await asyncio.to_thread(self.store.save, self.allocator.state)

    def _is_bypass(self, ident: PodIdentity) -> bool:
        if ident.bypass:
            return True
        if self.options.self_pod_uid and ident.uid == self.options.self_pod_uid:
            return True
        return self.options.self_pod is not None and (ident.namespace, ident.name) == self.options.self_pod

    async def _resize_shared(self) -> None:
        pool, mems = self.shared_pool()
        result = await self.pusher.resize_shared(pool, mems)
        if result.changed or result.failed:
            self.on_narrow(result.seconds)
            log.info("shared pool -> cpus=%s mems=%s: %d containers updated, %d failed in %.1f ms", pool, mems,
                     result.changed, result.failed, result.seconds * 1000)

    # -- CreateContainer ------------------------------------------------------------------------------------
    async def create_container(self, request: bytes, forward: Forward) -> bytes:
        req = cri_pb2.CreateContainerRequest.FromString(request)
        ident = identity_of(req.sandbox_config)
        name = req.config.metadata.name
        if self._is_bypass(ident):
            response = await forward(request)
            cid = cri_pb2.CreateContainerResponse.FromString(response).container_id
            self.registry.add(Tracked(cid, req.pod_sandbox_id, ident.uid, ident.ref, name, "bypass"))
            log.info("decision pod=%s container=%s mode=bypass (passed through untouched)", ident.ref, name)
            return response
        known = self.registry.pod_containers.get(ident.uid, {})
        exited = await self._exited_containers(req.pod_sandbox_id, forward) if set(known) - {name} else frozenset()
        try:
            pod = pod_from_cri(req, known, exited)
        except PodSpecError as e:
            self.on_decision("InvalidIntent", "rejected")
            raise Rejection(grpc.StatusCode.INVALID_ARGUMENT,
                            f"numapin: pod {ident.ref} container {name}: {e}") from None
        paths = [d.host_path for d in req.config.devices]
        devices = await asyncio.to_thread(devices_numa_nodes, paths, self.options.sysfs) if paths else {}
        async with self.lock:
            had_cpus = self.allocator.container_cpus(ident.uid, name) is not None
            before = self.allocator.state.copy()
            try:
                decision = await asyncio.to_thread(self.allocator.admit_pod, pod,
                                                   devices={name: devices} if devices else None)
            except AllocatorError as e:
                self.on_decision(getattr(e, "reason", type(e).__name__), "rejected")
                raise Rejection(grpc.StatusCode.FAILED_PRECONDITION,
                                f"numapin: pod {ident.ref} container {name}: {e}") from None
            if not decision.admitted:
                self._reject(decision, ident, name)
            cd = next((c for c in decision.containers if c.name == name), None)
            if cd is None:
                raise Rejection(grpc.StatusCode.INTERNAL,
                                f"numapin: pod {ident.ref}: the allocator made no decision for container {name}")
            if pod.has_container(name) and ident.annotations.get(INTENT_ANNOTATION) is None:
                self.registry.pod_containers.setdefault(ident.uid, {})[name] = pod.container(name)
            # what the state says wins: a container holding CPUs runs on them (kubelet keeps an existing
            # assignment even if the container's request changed), anything else on the shared pool
            own = self.allocator.container_cpus(ident.uid, name)
            pinned = own is not None
            mode = self.allocator.state.mode(ident.uid, name) if pinned else "shared"
            if pinned:
                cpus, mems = own, self._mems_of(own)
            else:
                cpus, mems = self.shared_pool()
            if self.allocator.state != before:
                await self.save()  # the allocation is on disk before the runtime hears of the container
                self.on_change()
            if mode == "exclusive":
                await self._resize_shared()
            updates = {_CPUS: wire.encode_string(_CPUS, str(cpus)), _MEMS: wire.encode_string(_MEMS, str(mems))}
            if pinned and self.options.lift_cfs_quota:
                updates[_QUOTA] = wire.encode_int64(_QUOTA, UNLIMITED_QUOTA)
            edited = wire.set_fields(request, _CREATE_RESOURCES, updates)
            try:
                response = await forward(edited)
            except grpc.aio.AioRpcError as e:
                if pinned and not had_cpus:
                    self.allocator.release_container(ident.uid, name)
                    await self.save()
                    self.on_change()
                    await self._resize_shared()
                log.info("decision pod=%s container=%s: runtime refused the create (%s); allocation released",
                         ident.ref, name, e.code().name)
                raise
            cid = cri_pb2.CreateContainerResponse.FromString(response).container_id
            self.registry.add(Tracked(cid, req.pod_sandbox_id, ident.uid, ident.ref, name, mode, cpus, mems))
            self.on_decision(mode, "admitted")
            log.info("decision pod=%s container=%s id=%s mode=%s cpus=%s mems=%s reason=%s", ident.ref, name,
                     cid[:13], mode, cpus, mems, "reused" if had_cpus else "allocated" if pinned else "shared pool")
            return response

    async def _exited_containers(self, sandbox_id: str, forward: Forward) -> frozenset[str]:
        """Names of the sandbox's containers that have exited (for the CRI-only pod model); empty when the
        runtime cannot tell."""
        api = forward.method.lstrip("/").split(".RuntimeService/")[0]
        req = cri_pb2.ListContainersRequest(filter=cri_pb2.ContainerFilter(pod_sandbox_id=sandbox_id))
        try:
            raw = await self.pusher.upstream.call(f"/{api}.RuntimeService/ListContainers", req.SerializeToString(),
                                                  timeout=10.0)
        except grpc.aio.AioRpcError:
            return frozenset()
        items = cri_pb2.ListContainersResponse.FromString(raw).containers
        running = {c.metadata.name for c in items if c.state != cri_pb2.CONTAINER_EXITED}
        return frozenset(c.metadata.name for c in items if c.state == cri_pb2.CONTAINER_EXITED) - running

    def _reject(self, decision: PodDecision, ident: PodIdentity, name: str) -> None:
        self.on_decision(decision.reason or "Rejected", "rejected")
        code = (grpc.StatusCode.RESOURCE_EXHAUSTED if decision.reason == "UnexpectedAdmissionError"
                else grpc.StatusCode.FAILED_PRECONDITION)
        msg = (f"numapin: pod {ident.ref} container {name} rejected ({decision.reason}) by topology manager "
               f"policy {self.policy} scope {self.scope}: {decision.message}")
        log.info("decision pod=%s container=%s mode=rejected reason=%s message=%s", ident.ref, name,
                 decision.reason, decision.message)
        raise Rejection(code, msg)

    # -- UpdateContainerResources -------------------------------------------------------------------------
    async def update_container_resources(self, request: bytes, forward: Forward) -> bytes:
        req = cri_pb2.UpdateContainerResourcesRequest.FromString(request)
        t = self.registry.containers.get(req.container_id)
        if t is None or t.mode == "bypass" or t.cpus is None:
            return await forward(request)
        # the cpuset numapin wants now (for a shared container: the current pool, even mid-narrowing)
        cpus, mems = (t.cpus, t.mems) if t.pinned else self.shared_pool()
        updates = {_CPUS: wire.encode_string(_CPUS, str(cpus))}
        if mems is not None:
            updates[_MEMS] = wire.encode_string(_MEMS, str(mems))
        if t.pinned and self.options.lift_cfs_quota and req.linux.cpu_quota:
            updates[_QUOTA] = wire.encode_int64(_QUOTA, UNLIMITED_QUOTA)
        if (req.linux.cpuset_cpus, req.linux.cpuset_mems) != (str(cpus), str(mems or "")):
            log.info("update pod=%s container=%s: cpuset %r kept as %s (numapin owns cpusets)", t.pod_ref, t.name,
                     req.linux.cpuset_cpus, cpus)
        return await forward(wire.set_fields(request, _UPDATE_RESOURCES, updates))

    # -- removal --------------------------------------------------------------------------------------------
    async def stop_container(self, request: bytes, forward: Forward) -> bytes:
        """A stopped container never runs again (kubelet creates a new one): it leaves the shared pool's
        narrowing set; its CPUs stay with the pod until RemoveContainer."""
        response = await forward(request)
        t = self.registry.containers.get(cri_pb2.StopContainerRequest.FromString(request).container_id)
        if t is not None:
            t.exited = True
        return response

    async def remove_container(self, request: bytes, forward: Forward) -> bytes:
        cid = cri_pb2.RemoveContainerRequest.FromString(request).container_id
        response = await forward(request)
        t = self.registry.remove(cid)
        if t is None or self.registry.instances(t.pod_uid, t.name):
            return response
        self.registry.pod_containers.get(t.pod_uid, {}).pop(t.name, None)  # gone from the pod model too
        if t.pinned:
            async with self.lock:
                if self.allocator.container_cpus(t.pod_uid, t.name) is not None:
                    freed = self.allocator.release_container(t.pod_uid, t.name)
                    await self._after_release(f"pod={t.pod_ref} container={t.name}", freed)
        return response

    async def stop_pod_sandbox(self, request: bytes, forward: Forward) -> bytes:
        sid = cri_pb2.StopPodSandboxRequest.FromString(request).pod_sandbox_id
        response = await forward(request)
        await self._release_pod_of(sid, "stopped")
        return response

    async def remove_pod_sandbox(self, request: bytes, forward: Forward) -> bytes:
        sid = cri_pb2.RemovePodSandboxRequest.FromString(request).pod_sandbox_id
        response = await forward(request)
        await self._release_pod_of(sid, "removed")
        return response

    async def _release_pod_of(self, sandbox_id: str, what: str) -> None:
        uid = self.registry.sandboxes.get(sandbox_id)
        if uid is None:
            return
        ref = next((t.pod_ref for t in self.registry.of_pod(uid)), uid)
        for t in self.registry.of_pod(uid):
            t.exited = True  # a stopped sandbox's containers are dead: never narrowed again
        self.registry.pod_containers.pop(uid, None)  # a new sandbox of the pod starts a new pod model
        async with self.lock:
            had = uid in self.allocator.state.assignments
            freed = self.allocator.release_pod(uid)
            if what == "removed":
                self.registry.forget_pod(uid)
            if had:
                await self._after_release(f"pod={ref} (sandbox {what})", freed)

    async def _after_release(self, what: str, freed: CPUSet) -> None:
        await self.save()
        self.on_change()
        log.info("release %s cpus=%s", what, freed)
        await self._resize_shared()
