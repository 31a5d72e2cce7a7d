"""The proxy's interceptors: each CRI call numapin handles, turned into the node agent's operation (``Pinning``,
``Resizer``, ``StartGuard``) and its answer into edited bytes and the forwarded call.

CreateContainer: ``admit`` (decided and committed: state on disk, the shared pool narrowed), the message edited
and forwarded, then ``register`` with the runtime's container id, or ``give_back`` when the runtime refuses it,
``abandon`` when kubelet gives up. The other calls are forwarded and the agent told (stops and removals), or the
agent runs the forward as its own step (``StartContainer`` under the pool gate, ``UpdateContainerResources`` between
the narrowing and the widening of the shared pool).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping

import grpc.aio

from criproxy.intercept.edits import container_id_of, with_resources
from criproxy.relay import wire
from criproxy.relay.cri_api import (
    CPU_PERIOD,
    CPU_QUOTA,
    CREATE_RESOURCES,
    STATUS_LINUX_RESOURCES,
    UPDATE_RESOURCES,
    RuntimeApi,
)
from criproxy.relay.grpc_relay import Forward, Interceptor, PassThrough
from nodeagent.decisions.pinning import Pinning
from nodeagent.decisions.resize import Resizer
from nodeagent.decisions.starts import StartGuard
from nodeagent.decisions.target import TargetResources
from protos import cri_pb2

__all__ = ["ProxyInterceptors"]

log = logging.getLogger("numapin.criproxy")


class ProxyInterceptors:
    """The interceptors over the node agent's decisions; ``api`` learns the runtime's CRI version from kubelet's
    calls (the proxy's own calls speak it)."""

    def __init__(self, pinning: Pinning, resizer: Resizer, starts: StartGuard, api: RuntimeApi) -> None:
        self.pinning = pinning
        self.resizer = resizer
        self.starts = starts
        self.api = api

    def table(self) -> Mapping[str, Interceptor]:
        """The interceptors by CRI method."""
        return {
            "CreateContainer": self.create_container,
            "UpdateContainerResources": self.update_container_resources,
            "StopContainer": self.stop_container,
            "RemoveContainer": self.remove_container,
            "StopPodSandbox": self.stop_pod_sandbox,
            "RemovePodSandbox": self.remove_pod_sandbox,
            "StartContainer": self.start_container,
            # what kubelet reads back of a pinned container's CPU limit (it runs without a CFS quota)
            "ContainerStatus": self.container_status,
        }

    def pass_through(self) -> Mapping[str, PassThrough]:
        """For the interceptors that need nothing of most calls: which calls go on unheld (``PassThrough``)."""
        return {"ContainerStatus": self.container_status_unchanged}

    async def create_container(self, request: bytes, forward: Forward) -> bytes:
        """Admitted and committed first; then, without the allocation lock, the cpuset put on the wire message and
        forwarded (creates of other pods go on meanwhile); a create the runtime refuses gives its CPUs back."""
        self.api.learn(forward.method)
        req = cri_pb2.CreateContainerRequest.FromString(request)
        admission = await self.pinning.admit(req, forward.timeout)
        target = admission.target
        created: str | None = None
        try:
            try:
                response = await forward(request if target is None
                                         else with_resources(request, CREATE_RESOURCES, target))
            except grpc.aio.AioRpcError as e:
                placement = admission.placement
                if placement is None:
                    raise
                await self.pinning.give_back(admission, "runtime refused the create")
                log.info("decision pod=%s container=%s: runtime refused the create (%s)%s", admission.ident.ref,
                         admission.name, e.code().name,
                         "; allocation released" if placement.pinned and not placement.had_cpus else "")
                raise
            created = cri_pb2.CreateContainerResponse.FromString(response).container_id
            await self.pinning.register(req, created, admission)
        except asyncio.CancelledError:
            self.pinning.abandon(req, admission, created)
            raise
        except BaseException:
            self.pinning.settle(admission)  # failed otherwise: nothing given back (the next reconcile decides)
            raise
        return response

    async def update_container_resources(self, request: bytes, forward: Forward) -> bytes:
        """kubelet's in-place resize (``Resizer.resize``): the call forwarded with the resources it decides."""
        async def apply(target: TargetResources | None) -> bytes:
            return await forward(request if target is None else with_resources(request, UPDATE_RESOURCES, target))

        return await self.resizer.resize(cri_pb2.UpdateContainerResourcesRequest.FromString(request), apply)

    async def start_container(self, request: bytes, forward: Forward) -> bytes:
        return await self.starts.start(container_id_of(request), lambda: forward(request))

    async def stop_container(self, request: bytes, forward: Forward) -> bytes:
        response = await forward(request)
        self.pinning.container_stopped(cri_pb2.StopContainerRequest.FromString(request).container_id)
        return response

    async def remove_container(self, request: bytes, forward: Forward) -> bytes:
        cid = cri_pb2.RemoveContainerRequest.FromString(request).container_id
        return await _then(forward(request), lambda: self.pinning.container_removed(cid))

    async def stop_pod_sandbox(self, request: bytes, forward: Forward) -> bytes:
        sid = cri_pb2.StopPodSandboxRequest.FromString(request).pod_sandbox_id
        return await _then(forward(request), lambda: self.pinning.sandbox_stopped(sid))

    async def remove_pod_sandbox(self, request: bytes, forward: Forward) -> bytes:
        sid = cri_pb2.RemovePodSandboxRequest.FromString(request).pod_sandbox_id
        return await _then(forward(request), lambda: self.pinning.sandbox_removed(sid))

    async def container_status(self, request: bytes, forward: Forward) -> bytes:
        """``ContainerStatus``: a pinned container runs without a CFS quota, and kubelet would show no (or its
        stale) CPU limit from the runtime's -1; the limit kubelet set goes back in ``resources.linux`` instead.
        Only the two fields change, and only when the runtime reports resources at all."""
        response = await forward(request)
        cfs = self._reported_cfs(container_id_of(request))
        if cfs is None:
            return response
        period, quota = cfs
        return wire.set_fields(response, STATUS_LINUX_RESOURCES,
                               {CPU_PERIOD: wire.encode_int64(CPU_PERIOD, period),
                                CPU_QUOTA: wire.encode_int64(CPU_QUOTA, quota)}, create=False)

    def container_status_unchanged(self, request: bytes) -> bool:
        """``ContainerStatus`` of a container with no CPU limit to report (not pinned, most of a node): the
        runtime's answer goes back as it is, so the frame relay need not hold the call. Decided when the request
        is read: a container pinned (or its limit changed) before the runtime answers is reported by kubelet's
        next call (docs/performance.md, issue 37)."""
        return self._reported_cfs(container_id_of(request)) is None

    def _reported_cfs(self, container_id: str) -> tuple[int, int] | None:
        """(cpu_period, cpu_quota) to report for ``container_id``; None: what the runtime says."""
        t = self.pinning.registry.containers.get(container_id)
        return None if t is None else self.resizer.reported_cfs(t)


async def _then(call: Awaitable[bytes], after: Callable[[], Awaitable[None]]) -> bytes:
    """The runtime's answer to ``call``, once the agent has been told (``after``, only when the call succeeded)."""
    response = await call
    await after()
    return response
