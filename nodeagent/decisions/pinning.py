"""The node agent's decisions (``Pinning``): CreateContainer (``create``), StopContainer, RemoveContainer,
StopPodSandbox and RemovePodSandbox, door-neutral, around the allocator's node facade and the state they share
(``allocation``): removals give CPUs back and widen the shared pool. The doors call them (``criproxy.intercept``).
"""

from __future__ import annotations

import logging

from nodeagent.decisions.create import _Creates

__all__ = ["Pinning"]

log = logging.getLogger("numapin.criproxy")


class Pinning(_Creates):
    """The node agent's decisions on a container's life: its creation (``create``) and, each given ids once the
    runtime has done it, its stop, its removal, its sandbox's stop and removal."""

    def container_stopped(self, container_id: str) -> None:
        """A stopped container never runs again (kubelet creates a new one): it leaves the shared pool's
        narrowing set; its CPUs stay with the pod until it is removed."""
        t = self.registry.containers.get(container_id)
        if t is not None:
            t.exited = True

    async def container_removed(self, container_id: str) -> None:
        """The container is gone: its CPUs go back (the pool widens) unless another instance of it exists."""
        t = self.registry.remove(container_id)
        self.kubelet_cfs.pop(container_id, None)
        if t is None or self.registry.instances(t.pod_uid, t.name):
            return
        pod = self.registry.pods.get(t.pod_uid)
        if pod is not None:
            pod.forget(t.name)  # gone from the pod model too (not allocated again)
        if t.pinned:
            async with self.lock:
                if self.allocator.container_cpus(t.pod_uid, t.name) is not None:
                    freed = self.allocator.release_container(t.pod_uid, t.name)
                    await self._after_release(f"pod={t.pod_ref} container={t.name}", freed)

    async def sandbox_stopped(self, sandbox_id: str) -> None:
        await self._release_pod_of(sandbox_id, "stopped")

    async def sandbox_removed(self, sandbox_id: str) -> None:
        await self._release_pod_of(sandbox_id, "removed")

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
