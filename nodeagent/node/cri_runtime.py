"""The node agent's runtime ports (``nodeagent.ports``) over a CRI channel to the runtime: every read and record
write is a unary CRI call. The CRI proxy calls through its own channel to the runtime behind it, in the version the
runtime speaks; the NRI plugin reads containerd's CRI socket (read-only calls, which take no NRI lock: safe from
inside an NRI event) and never writes through it (its record writes ride in its answers to events)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

import grpc.aio

from nodeagent.ports import RuntimeCallError
from protos import cri_pb2

__all__ = ["Caller", "CriChannel", "CriRuntime", "runtime_v1"]

# (full method name, serialized request, timeout in seconds) -> serialized response; raises grpc.aio.AioRpcError
Caller = Callable[[str, bytes, float], Awaitable[bytes]]


def runtime_v1(name: str) -> str:
    """The full name of a RuntimeService method of CRI ``runtime.v1``."""
    return f"/runtime.v1.RuntimeService/{name}"


class CriRuntime:
    """``RuntimeReader`` and ``RecordWriter`` over ``call``; ``method`` names a RuntimeService method in the
    runtime's CRI version. A failed call raises RuntimeCallError with the runtime's status."""

    def __init__(self, call: Caller, method: Callable[[str], str] = runtime_v1) -> None:
        self.call = call
        self.method = method

    async def _call(self, name: str, request: bytes, timeout: float) -> bytes:
        try:
            return await self.call(self.method(name), request, timeout)
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


class CriChannel:
    """A gRPC channel of the agent's own to a CRI socket (``unix:///path``, ``unix:/path`` or ``/path``): raw
    bytes in and out, as ``CriRuntime`` calls. It reconnects by itself; a call fails fast while the runtime is
    down."""

    def __init__(self, endpoint: str) -> None:
        path = endpoint.removeprefix("unix://").removeprefix("unix:")
        if not path.startswith("/"):
            raise ValueError(f"runtime endpoint {endpoint!r}: expected unix:///path/to/socket")
        self.endpoint = endpoint
        self.channel = grpc.aio.insecure_channel(
            "unix:" + path, options=(("grpc.max_receive_message_length", 64 * 1024 * 1024),
                                     ("grpc.initial_reconnect_backoff_ms", 100),
                                     ("grpc.max_reconnect_backoff_ms", 2000), ("grpc.enable_retries", 0)))
        self._unary: dict[str, grpc.aio.UnaryUnaryMultiCallable[bytes, bytes]] = {}

    async def call(self, method: str, request: bytes, timeout: float) -> bytes:
        c = self._unary.get(method)
        if c is None:
            c = self._unary[method] = self.channel.unary_unary(method)
        return await c(request, timeout=timeout)

    async def close(self) -> None:
        await self.channel.close()
