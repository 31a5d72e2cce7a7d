"""A read-only look at a CRI runtime's pods and containers (containerd's socket or the proxy's): which containers
run, for which pod, with which cpuset, and their process id. Used by ``numapin status`` and ``numapin demo``.

Only ``ListPodSandbox``, ``ListContainers`` and ``ContainerStatus`` are called: nothing is changed."""

from __future__ import annotations

import json
from dataclasses import dataclass

import grpc
import grpc.aio

from allocator.cpuset import CPUSet
from allocator.pod import is_bypassed
from criproxy.relay.grpc_relay import CHANNEL_OPTIONS, normalize_endpoint
from protos import cri_pb2

__all__ = ["RuntimeContainer", "list_runtime_containers"]

_RT = "/runtime.v1.RuntimeService/"


@dataclass(frozen=True)
class RuntimeContainer:
    id: str
    sandbox_id: str
    pod_uid: str
    pod: str                 # namespace/name
    name: str
    running: bool
    sandbox_ready: bool
    bypass: bool             # the pod is annotated numapin.io/bypass: "true"
    cpuset_cpus: CPUSet | None   # what the runtime says it applied (None: unset or unreadable)
    cpuset_mems: CPUSet | None
    pid: int | None          # from ContainerStatus(verbose) when the runtime tells it


def _cpus(text: str) -> CPUSet | None:
    if not text:
        return None
    try:
        return CPUSet.parse(text)
    except ValueError:
        return None


def _pid(info: dict[str, str]) -> int | None:
    try:
        pid = json.loads(info.get("info", "{}")).get("pid")
    except (ValueError, AttributeError):
        return None
    return pid if isinstance(pid, int) and pid > 0 else None


async def list_runtime_containers(endpoint: str, *, timeout: float = 10.0, running_only: bool = True
                                  ) -> list[RuntimeContainer]:
    """Every container of the runtime at ``endpoint`` (only running ones unless ``running_only`` is False).
    Raises ``grpc.aio.AioRpcError`` when the runtime does not answer."""
    async with grpc.aio.insecure_channel(normalize_endpoint(endpoint), options=CHANNEL_OPTIONS) as channel:
        async def call(method: str, request, response_type):  # type: ignore[no-untyped-def]
            stub = channel.unary_unary(_RT + method, request_serializer=type(request).SerializeToString,
                                       response_deserializer=response_type.FromString)
            return await stub(request, timeout=timeout)

        sandboxes = {s.id: s for s in (await call("ListPodSandbox", cri_pb2.ListPodSandboxRequest(),
                                                  cri_pb2.ListPodSandboxResponse)).items}
        listed = (await call("ListContainers", cri_pb2.ListContainersRequest(),
                             cri_pb2.ListContainersResponse)).containers
        out: list[RuntimeContainer] = []
        for c in listed:
            running = c.state == cri_pb2.CONTAINER_RUNNING
            if running_only and not running:
                continue
            sb = sandboxes.get(c.pod_sandbox_id)
            try:
                st = await call("ContainerStatus", cri_pb2.ContainerStatusRequest(container_id=c.id, verbose=True),
                                cri_pb2.ContainerStatusResponse)
            except grpc.aio.AioRpcError as e:
                if e.code() == grpc.StatusCode.NOT_FOUND:
                    continue  # removed meanwhile
                raise
            res = st.status.resources.linux
            uid = sb.metadata.uid if sb is not None else c.labels.get("io.kubernetes.pod.uid", "")
            ref = (f"{sb.metadata.namespace}/{sb.metadata.name}" if sb is not None
                   else f"{c.labels.get('io.kubernetes.pod.namespace', '?')}/"
                        f"{c.labels.get('io.kubernetes.pod.name', '?')}")
            bypass = sb is not None and is_bypassed(sb.annotations)
            out.append(RuntimeContainer(
                id=c.id, sandbox_id=c.pod_sandbox_id, pod_uid=uid, pod=ref, name=c.metadata.name, running=running,
                sandbox_ready=sb is not None and sb.state == cri_pb2.SANDBOX_READY, bypass=bypass,
                cpuset_cpus=_cpus(res.cpuset_cpus), cpuset_mems=_cpus(res.cpuset_mems), pid=_pid(dict(st.info))))
        return sorted(out, key=lambda r: (r.pod, r.name, r.id))
