"""The node agent's runtime ports (``nodeagent.ports``) over the proxy's own channel to the runtime: every read and
record write is a CRI call in the version the runtime speaks (``RuntimeApi``)."""

from __future__ import annotations

from collections.abc import Sequence

import grpc.aio

from criproxy.relay.cri_api import RuntimeApi
from criproxy.relay.grpc_relay import Upstream
from nodeagent.ports import RuntimeCallError
from protos import cri_pb2

__all__ = ["CriRuntime"]


class CriRuntime:
    """``RuntimeReader`` and ``RecordWriter`` of the proxy: calls on ``upstream``; a failed call raises
    RuntimeCallError with the runtime's status."""

    def __init__(self, upstream: Upstream, api: RuntimeApi) -> None:
        self.upstream = upstream
        self.api = api

    async def _call(self, name: str, request: bytes, timeout: float) -> bytes:
        try:
            return await self.upstream.call(self.api.method(name), request, timeout=timeout)
        except grpc.aio.AioRpcError as e:
            raise RuntimeCallError(e.code(), e.details()) from e

    async def list_sandboxes(self, filter: cri_pb2.PodSandboxFilter | None = None, *,
                             timeout: float = 10.0) -> Sequence[cri_pb2.PodSandbox]:
        req = cri_pb2.ListPodSandboxRequest(filter=filter) if filter is not None else cri_pb2.ListPodSandboxRequest()
        raw = await self._call("ListPodSandbox", req.SerializeToString(), timeout)
        items: Sequence[cri_pb2.PodSandbox] = cri_pb2.ListPodSandboxResponse.FromString(raw).items
        return items

    async def list_containers(self, filter: cri_pb2.ContainerFilter | None = None, *,
                              timeout: float = 10.0) -> Sequence[cri_pb2.Container]:
        req = cri_pb2.ListContainersRequest(filter=filter) if filter is not None else cri_pb2.ListContainersRequest()
        raw = await self._call("ListContainers", req.SerializeToString(), timeout)
        items: Sequence[cri_pb2.Container] = cri_pb2.ListContainersResponse.FromString(raw).containers
        return items

    async def container_status(self, container_id: str, *, verbose: bool = False,
                               timeout: float = 10.0) -> cri_pb2.ContainerStatusResponse:
        req = cri_pb2.ContainerStatusRequest(container_id=container_id, verbose=verbose)
        raw = await self._call("ContainerStatus", req.SerializeToString(), timeout)
        return cri_pb2.ContainerStatusResponse.FromString(raw)

    async def update_resources(self, container_id: str, resources: cri_pb2.LinuxContainerResources, *,
                               timeout: float = 10.0) -> None:
        req = cri_pb2.UpdateContainerResourcesRequest(container_id=container_id, linux=resources)
        await self._call("UpdateContainerResources", req.SerializeToString(), timeout)
