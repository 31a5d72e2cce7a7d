"""CRI on the wire, as numapin uses it: API versions, method paths, the field numbers numapin edits, and the
runtime's API version the proxy's own calls use.

kubelet first calls ``runtime.v1``; a runtime answering UNIMPLEMENTED makes it switch to ``runtime.v1alpha2``,
whose messages numapin reads carry the same field numbers. The proxy's housekeeping calls (reconcile,
narrowing, listing a pod's containers) speak the version the runtime speaks: :class:`RuntimeApi` learns it
from kubelet's calls and, before kubelet made any, by asking the runtime.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import grpc
import grpc.aio

from protos import cri_pb2

__all__ = [
    "API_VERSIONS",
    "CPUSET_CPUS",
    "CPUSET_MEMS",
    "CPU_PERIOD",
    "CPU_QUOTA",
    "CREATE_RESOURCES",
    "STATUS_LINUX_RESOURCES",
    "UNLIMITED_QUOTA",
    "UPDATE_RESOURCES",
    "RuntimeApi",
    "api_of",
    "runtime_method",
]

API_VERSIONS = ("runtime.v1", "runtime.v1alpha2")

# field paths (upstream CRI): CreateContainerRequest.config=2 -> ContainerConfig.linux=15 ->
# LinuxContainerConfig.resources=1; UpdateContainerResourcesRequest.linux=2
CREATE_RESOURCES = (2, 15, 1)
UPDATE_RESOURCES = (2,)
# ContainerStatusResponse.status=1 -> ContainerStatus.resources=16 -> ContainerResources.linux=1
STATUS_LINUX_RESOURCES = (1, 16, 1)
# LinuxContainerResources fields
CPU_PERIOD, CPU_QUOTA, CPUSET_CPUS, CPUSET_MEMS = 1, 2, 6, 7
UNLIMITED_QUOTA = -1

_Caller = Callable[[str, bytes], Awaitable[bytes]]


def runtime_method(api: str, name: str) -> str:
    """``/runtime.v1.RuntimeService/<name>`` for ``api`` ``runtime.v1``."""
    return f"/{api}.RuntimeService/{name}"


def api_of(method: str) -> str | None:
    """The API version of a gRPC method path (``/runtime.v1alpha2.RuntimeService/X`` -> ``runtime.v1alpha2``),
    None for a method of another service."""
    service = method.lstrip("/").rpartition("/")[0]
    api = service.rpartition(".")[0]
    return api if api in API_VERSIONS else None


class RuntimeApi:
    """The CRI API version of the runtime behind the proxy (``runtime.v1`` until known otherwise)."""

    def __init__(self, version: str = "runtime.v1") -> None:
        self.version = version

    def method(self, name: str) -> str:
        return runtime_method(self.version, name)

    def learn(self, method: str) -> None:
        """Follow the version of a call kubelet made (it found out which one the runtime speaks)."""
        api = api_of(method)
        if api is not None:
            self.version = api

    async def detect(self, call: _Caller) -> str:
        """Ask the runtime (``Version`` on runtime.v1; UNIMPLEMENTED means runtime.v1alpha2). Raises
        AioRpcError when the runtime cannot be reached."""
        try:
            await call(runtime_method("runtime.v1", "Version"), cri_pb2.VersionRequest().SerializeToString())
            self.version = "runtime.v1"
        except grpc.aio.AioRpcError as e:
            if e.code() != grpc.StatusCode.UNIMPLEMENTED:
                raise
            self.version = "runtime.v1alpha2"
        return self.version
