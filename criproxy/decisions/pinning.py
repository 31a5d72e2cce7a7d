"""The proxy's decisions (``Pinning``): the interceptors of CreateContainer (``create``), UpdateContainerResources,
StopContainer, RemoveContainer, StopPodSandbox and RemovePodSandbox, around the allocator's node facade and the
state they share (``allocation``): removals give CPUs back and widen the shared pool.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from criproxy.decisions.create import _Creates
from criproxy.relay import wire
from criproxy.relay.cri_api import CPU_QUOTA, CPUSET_CPUS, CPUSET_MEMS, UNLIMITED_QUOTA, UPDATE_RESOURCES
from criproxy.relay.grpc_relay import Forward, Interceptor
from protos import cri_pb2

__all__ = ["Pinning"]

log = logging.getLogger("numapin.criproxy")


class Pinning(_Creates):
    """The interceptors, each a method: ``interceptors()`` names them by CRI method."""

    def interceptors(self) -> Mapping[str, Interceptor]:
        return {
            "CreateContainer": self.create_container,
            "UpdateContainerResources": self.update_container_resources,
            "StopContainer": self.stop_container,
            "RemoveContainer": self.remove_container,
            "StopPodSandbox": self.stop_pod_sandbox,
            "RemovePodSandbox": self.remove_pod_sandbox,
        }

    # -- UpdateContainerResources -------------------------------------------------------------------------
    async def update_container_resources(self, request: bytes, forward: Forward) -> bytes:
        if self.resize is not None:
            return await self.resize(request, forward)
        req = cri_pb2.UpdateContainerResourcesRequest.FromString(request)
        t = self.registry.containers.get(req.container_id)
        if t is None or t.mode == "bypass" or t.cpus is None:
            return await forward(request)
        # the cpuset numapin wants now (for a shared container: the current pool, even mid-narrowing)
        cpus, mems = (t.cpus, t.mems) if t.pinned else self.shared_pool()
        mems = self.allocator.container_mems(t.pod_uid, t.name) or mems
        updates = {CPUSET_CPUS: wire.encode_string(CPUSET_CPUS, str(cpus))}
        if mems is not None:
            updates[CPUSET_MEMS] = wire.encode_string(CPUSET_MEMS, str(mems))
        if t.pinned and self.options.lift_cfs_quota and req.linux.cpu_quota:
            updates[CPU_QUOTA] = wire.encode_int64(CPU_QUOTA, UNLIMITED_QUOTA)
        if (req.linux.cpuset_cpus, req.linux.cpuset_mems) != (str(cpus), str(mems or "")):
            log.info("update pod=%s container=%s: cpuset %r kept as %s (numapin owns cpusets)", t.pod_ref, t.name,
                     req.linux.cpuset_cpus, cpus)
        return await forward(wire.set_fields(request, UPDATE_RESOURCES, updates))

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
        self.kubelet_cfs.pop(cid, None)
        if t is None or self.registry.instances(t.pod_uid, t.name):
            return response
        pod = self.registry.pods.get(t.pod_uid)
        if pod is not None:
            pod.forget(t.name)  # gone from the pod model too (not allocated again)
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
        self.registry.pods.pop(uid, None)  # a new sandbox of the pod starts a new pod model
        async with self.lock:
            had = uid in self.allocator.state.assignments
            freed = self.allocator.release_pod(uid)
            if what == "removed":
                self.registry.forget_pod(uid)
            if had:
                await self._after_release(f"pod={ref} (sandbox {what})", freed)
