"""A kubelet-like CRI client over grpc.aio, built on the fuller test proto (``cri_full.proto``).

It calls methods by their real names (``/runtime.v1.RuntimeService/...``), so it talks to containerd,
to the proxy or to the in-process runtime alike. Like kubelet it removes a pod's cgroup (the sandbox's
``cgroup_parent``, in every hierarchy) once the pod's sandbox is removed: runc creates it and never removes it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, TypeVar

import grpc
import grpc.aio
from google.protobuf.message import Message

from criproxy.relay.grpc_relay import CHANNEL_OPTIONS, normalize_endpoint

from . import cri_full_pb2 as pb
from . import ledger
from .cgroups import existing_cgroup_dirs, remove_cgroup

__all__ = ["CRIClient", "pb"]

M = TypeVar("M", bound=Message)

BUSYBOX = "localhost/busybox:latest"

# Each client stands for a process of its own (kubelet, crictl, a second kubelet after a restart), so it keeps its
# connections to itself: by default gRPC shares a target's connection ("subchannel") among all channels of a process
# with the same options, and a new client then inherits another's failed connect and its back-off. Seen: a client
# made right after the proxy came back failed at once with the "connection refused" an older client had met while
# the proxy was down.
LAB_CHANNEL_OPTIONS = (*CHANNEL_OPTIONS, ("grpc.use_local_subchannel_pool", 1))


class CRIClient:
    def __init__(self, endpoint: str, *, api: str = "runtime.v1", timeout: float | None = 30.0) -> None:
        self.channel = grpc.aio.insecure_channel(normalize_endpoint(endpoint), options=LAB_CHANNEL_OPTIONS)
        self.api = api
        self.timeout = timeout
        self.cgroup_parents: dict[str, str] = {}  # sandbox id -> the pod cgroup it was run in (removed with it)

    async def close(self) -> None:
        await self.channel.close()

    async def __aenter__(self) -> CRIClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def path(self, method: str, service: str = "RuntimeService") -> str:
        return f"/{self.api}.{service}/{method}"

    async def call(self, method: str, request: Message, response_type: type[M], *,
                   service: str = "RuntimeService", timeout: float | str | None = "default",
                   metadata: Sequence[tuple[str, str | bytes]] | None = None) -> M:
        stub = self.channel.unary_unary(self.path(method, service), request_serializer=type(request).SerializeToString,
                                        response_deserializer=response_type.FromString)
        t = self.timeout if timeout == "default" else timeout
        return await stub(request, timeout=t, metadata=metadata)

    # -- runtime service ------------------------------------------------------------------------------
    async def version(self) -> pb.VersionResponse:
        return await self.call("Version", pb.VersionRequest(version="v1"), pb.VersionResponse)

    @staticmethod
    def sandbox_config(name: str, uid: str, *, namespace: str = "default", qos: str = "guaranteed",
                       annotations: Mapping[str, str] | None = None, cgroup_parent: str | None = None,
                       labels: Mapping[str, str] | None = None) -> pb.PodSandboxConfig:
        """A host-network pod like kubelet's, its cgroup parent following the cgroupfs QoS layout."""
        if cgroup_parent is None:
            cgroup_parent = f"/kubepods/pod{uid}" if qos == "guaranteed" else f"/kubepods/{qos}/pod{uid}"
        lab = {"io.kubernetes.pod.name": name, "io.kubernetes.pod.namespace": namespace,
               "io.kubernetes.pod.uid": uid, **(labels or {})}
        return pb.PodSandboxConfig(
            metadata=pb.PodSandboxMetadata(name=name, uid=uid, namespace=namespace, attempt=0),
            labels=lab, annotations=dict(annotations or {}),
            linux=pb.LinuxPodSandboxConfig(
                cgroup_parent=cgroup_parent,
                security_context=pb.LinuxSandboxSecurityContext(namespace_options=pb.NamespaceOption(network=2))))

    async def run_pod_sandbox(self, config: pb.PodSandboxConfig) -> str:
        parent = config.linux.cgroup_parent.rstrip("/")
        try:
            r = await self.call("RunPodSandbox", pb.RunPodSandboxRequest(config=config), pb.RunPodSandboxResponse)
        finally:  # a runtime that made the pod's cgroup (not the in-process one), even for a failed call
            made = bool(parent) and bool(await asyncio.to_thread(existing_cgroup_dirs, parent))
            if made:
                ledger.note("cgroup", parent)
        if made:
            self.cgroup_parents[r.pod_sandbox_id] = parent
        return r.pod_sandbox_id

    @staticmethod
    def container_config(name: str, *, cpu_milli: int | None = None, limit_milli: int | None = None,
                         command: Sequence[str] = ("sleep", "3600"), image: str = BUSYBOX, attempt: int = 0,
                         devices: Sequence[pb.Device] = (), cpuset_cpus: str = "") -> pb.ContainerConfig:
        """A container config as kubelet sends it (no cpuset with cpuManagerPolicy none)."""
        from nodeagent.node.cfs import milli_cpu_to_quota, milli_cpu_to_shares
        shares = milli_cpu_to_shares(cpu_milli or 0)
        period = 100000
        quota = milli_cpu_to_quota(limit_milli, period) if limit_milli else 0
        return pb.ContainerConfig(
            metadata=pb.ContainerMetadata(name=name, attempt=attempt),
            image=pb.ImageSpec(image=image), command=list(command), devices=list(devices),
            labels={"io.kubernetes.container.name": name},
            linux=pb.LinuxContainerConfig(resources=pb.LinuxContainerResources(
                cpu_shares=shares, cpu_period=period if quota else 0, cpu_quota=quota, oom_score_adj=1000,
                cpuset_cpus=cpuset_cpus)))

    async def create_container(self, sandbox_id: str, config: pb.ContainerConfig,
                               sandbox_config: pb.PodSandboxConfig) -> str:
        r = await self.call("CreateContainer", pb.CreateContainerRequest(
            pod_sandbox_id=sandbox_id, config=config, sandbox_config=sandbox_config), pb.CreateContainerResponse)
        return r.container_id

    async def start_container(self, container_id: str) -> None:
        await self.call("StartContainer", pb.StartContainerRequest(container_id=container_id),
                        pb.StartContainerResponse)

    async def stop_container(self, container_id: str, timeout: int = 0) -> None:
        await self.call("StopContainer", pb.StopContainerRequest(container_id=container_id, timeout=timeout),
                        pb.StopContainerResponse)

    async def remove_container(self, container_id: str) -> None:
        await self.call("RemoveContainer", pb.RemoveContainerRequest(container_id=container_id),
                        pb.RemoveContainerResponse)

    async def stop_pod_sandbox(self, sandbox_id: str) -> None:
        await self.call("StopPodSandbox", pb.StopPodSandboxRequest(pod_sandbox_id=sandbox_id),
                        pb.StopPodSandboxResponse)

    async def remove_pod_sandbox(self, sandbox_id: str, *, cgroup_parent: str | None = None) -> None:
        """Remove the sandbox, then its pod cgroup as kubelet does: the one it was run with by this client, else
        ``cgroup_parent``, else the one the runtime says. A cgroup still in use is left (see ``remove_cgroup``)."""
        parent = self.cgroup_parents.pop(sandbox_id, None) or cgroup_parent or await self.sandbox_cgroup(sandbox_id)
        await self.call("RemovePodSandbox", pb.RemovePodSandboxRequest(pod_sandbox_id=sandbox_id),
                        pb.RemovePodSandboxResponse)
        if parent and parent.strip("/"):
            await asyncio.to_thread(remove_cgroup, parent, settle=0.5)

    async def sandbox_cgroup(self, sandbox_id: str) -> str | None:
        """The sandbox's ``cgroup_parent`` as the runtime keeps it (containerd's verbose PodSandboxStatus); None when
        the runtime does not say (the in-process runtime, an unknown sandbox)."""
        try:
            r = await self.call("PodSandboxStatus", pb.PodSandboxStatusRequest(pod_sandbox_id=sandbox_id, verbose=True),
                                pb.PodSandboxStatusResponse)
            parent = json.loads(r.info["info"])["config"]["linux"]["cgroup_parent"]
        except (grpc.aio.AioRpcError, KeyError, TypeError, ValueError):
            return None
        return parent if isinstance(parent, str) and parent.strip("/") else None

    async def list_containers(self, **filter_: Any) -> list[pb.Container]:
        req = pb.ListContainersRequest(filter=pb.ContainerFilter(**filter_)) if filter_ else pb.ListContainersRequest()
        return list((await self.call("ListContainers", req, pb.ListContainersResponse)).containers)

    async def list_pod_sandbox(self) -> list[pb.PodSandbox]:
        return list((await self.call("ListPodSandbox", pb.ListPodSandboxRequest(), pb.ListPodSandboxResponse)).items)

    async def container_status(self, container_id: str, verbose: bool = False) -> pb.ContainerStatusResponse:
        return await self.call("ContainerStatus", pb.ContainerStatusRequest(container_id=container_id,
                                                                            verbose=verbose),
                               pb.ContainerStatusResponse)

    async def update_container_resources(self, container_id: str, resources: pb.LinuxContainerResources) -> None:
        await self.call("UpdateContainerResources",
                        pb.UpdateContainerResourcesRequest(container_id=container_id, linux=resources),
                        pb.UpdateContainerResourcesResponse)

    async def exec_sync(self, container_id: str, cmd: Sequence[str], timeout: int = 10) -> pb.ExecSyncResponse:
        return await self.call("ExecSync", pb.ExecSyncRequest(container_id=container_id, cmd=list(cmd),
                                                              timeout=timeout), pb.ExecSyncResponse)

    def container_events(self, *, metadata: Sequence[tuple[str, str]] | None = None,
                         timeout: float | None = None) -> AsyncIterator[pb.ContainerEventResponse]:
        stub = self.channel.unary_stream(self.path("GetContainerEvents"),
                                         request_serializer=pb.GetEventsRequest.SerializeToString,
                                         response_deserializer=pb.ContainerEventResponse.FromString)
        return stub(pb.GetEventsRequest(), metadata=metadata, timeout=timeout)

    # -- image service --------------------------------------------------------------------------------
    async def list_images(self) -> list[pb.Image]:
        return list((await self.call("ListImages", pb.ListImagesRequest(), pb.ListImagesResponse,
                                     service="ImageService")).images)
