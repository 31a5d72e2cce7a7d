"""A small, real CRI runtime served over a unix socket, keeping pods and containers in memory.

Used by the protocol tests and the benchmark in place of containerd where no processes are needed. It
records every call (method, raw request bytes, metadata, remaining deadline) so tests can check exactly
what the proxy forwarded.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import grpc
import grpc.aio

from criproxy.relay.socket_server import start_server

from . import cri_full_pb2 as pb

__all__ = ["MemoryRuntime", "RecordedCall"]


@dataclass(frozen=True)
class RecordedCall:
    method: str
    request: bytes
    metadata: tuple[tuple[str, str | bytes], ...]
    time_remaining: float | None


@dataclass
class _Container:
    id: str
    sandbox_id: str
    config: pb.ContainerConfig
    state: int = pb.CONTAINER_CREATED
    resources: pb.LinuxContainerResources = field(default_factory=pb.LinuxContainerResources)
    created_at: int = 0
    started_at: int = 0
    finished_at: int = 0
    exit_code: int = 0


class MemoryRuntime:
    """``runtime.v1`` (and ``runtime.v1alpha2`` unless ``v1alpha2=False``) RuntimeService + ImageService.

    Extras for tests: ``/runtime.v1.RuntimeService/Echo`` (an unknown-to-the-proxy unary method that echoes
    its request bytes), ``GetContainerEvents`` streams one event per container created, ``fail_next`` makes
    the next call of a method fail with a given status.
    """

    def __init__(self, socket_path: str, *, v1alpha2: bool = True) -> None:
        self.socket_path = socket_path
        self.v1alpha2 = v1alpha2
        self.calls: list[RecordedCall] = []
        self.sandboxes: dict[str, pb.PodSandboxConfig] = {}
        self.sandbox_state: dict[str, int] = {}
        self.containers: dict[str, _Container] = {}
        # method -> (code, message[, trailing metadata]): the next call of that method fails so
        self.fail_next: dict[str, tuple] = {}
        self.hooks: dict[str, Callable[[bytes], None]] = {}  # called with the raw request before handling
        # (method, predicate on the raw request, event): a matching call waits for the event (a slow runtime)
        self.holds: list[tuple[str, Callable[[bytes], bool], asyncio.Event]] = []
        self.record = True
        self._ids = itertools.count(1)
        self._events: list[asyncio.Queue[pb.ContainerEventResponse]] = []
        self._server: grpc.aio.Server | None = None

    # -- lifecycle -------------------------------------------------------------------------------------
    async def start(self) -> MemoryRuntime:
        handlers: list[grpc.GenericRpcHandler] = []
        services = ["runtime.v1"] + (["runtime.v1alpha2"] if self.v1alpha2 else [])
        for api in services:
            handlers.append(grpc.method_handlers_generic_handler(f"{api}.RuntimeService", self._runtime_handlers()))
            handlers.append(grpc.method_handlers_generic_handler(f"{api}.ImageService", {
                "ListImages": self._unary("ListImages", pb.ListImagesRequest, self.list_images),
                "ImageFsInfo": grpc.unary_unary_rpc_method_handler(self._opaque("ImageFsInfo", lambda rt: 1))}))
        self._server = await start_server(self.socket_path, handlers)
        return self

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(0)
            self._server = None

    def add_containers(self, sandbox_id: str, n: int) -> None:
        """Add ``n`` running containers to ``sandbox_id`` directly (benchmark set-up)."""
        sb = self.sandboxes[sandbox_id]
        for i in range(n):
            cid = f"c{next(self._ids):06d}"
            cfg = pb.ContainerConfig(metadata=pb.ContainerMetadata(name=f"bulk-{i}"),
                                     image=pb.ImageSpec(image="localhost/busybox:latest"),
                                     labels={"io.kubernetes.container.name": f"bulk-{i}",
                                             "io.kubernetes.pod.uid": sb.metadata.uid})
            self.containers[cid] = _Container(cid, sandbox_id, cfg, pb.CONTAINER_RUNNING, created_at=time.time_ns())

    def exit(self, container_id: str, code: int) -> None:
        """The container's process ends by itself with ``code`` (it completed, or it crashed)."""
        c = self.containers[container_id]
        c.state, c.exit_code, c.finished_at = pb.CONTAINER_EXITED, code, time.time_ns()

    def requests(self, method: str) -> list[bytes]:
        return [c.request for c in self.calls if c.method == method]

    # -- plumbing ---------------------------------------------------------------------------------------
    def _unary(self, name: str, req_type, fn: Callable):
        async def behavior(raw: bytes, context: grpc.aio.ServicerContext) -> bytes:
            if self.record:
                md = tuple((m.key, m.value) for m in (context.invocation_metadata() or ()))
                self.calls.append(RecordedCall(name, raw, md, context.time_remaining()))
            hook = self.hooks.get(name)
            if hook is not None:
                hook(raw)
            for method, matches, event in list(self.holds):
                if method == name and matches(raw):
                    await event.wait()
            fail = self.fail_next.pop(name, None)
            if fail is not None:
                await context.abort(fail[0], fail[1], tuple(fail[2]) if len(fail) > 2 else ())
            try:
                resp = await fn(req_type.FromString(raw), context)
            except _NotFound as e:
                await context.abort(grpc.StatusCode.NOT_FOUND, str(e))
            return resp.SerializeToString()
        return grpc.unary_unary_rpc_method_handler(behavior)

    def _runtime_handlers(self) -> dict[str, grpc.RpcMethodHandler]:
        h = {
            "Version": (pb.VersionRequest, self.version),
            "Status": (pb.StatusRequest, self.status),
            "RunPodSandbox": (pb.RunPodSandboxRequest, self.run_pod_sandbox),
            "StopPodSandbox": (pb.StopPodSandboxRequest, self.stop_pod_sandbox),
            "RemovePodSandbox": (pb.RemovePodSandboxRequest, self.remove_pod_sandbox),
            "ListPodSandbox": (pb.ListPodSandboxRequest, self.list_pod_sandbox),
            "CreateContainer": (pb.CreateContainerRequest, self.create_container),
            "StartContainer": (pb.StartContainerRequest, self.start_container),
            "StopContainer": (pb.StopContainerRequest, self.stop_container),
            "RemoveContainer": (pb.RemoveContainerRequest, self.remove_container),
            "ListContainers": (pb.ListContainersRequest, self.list_containers),
            "ContainerStatus": (pb.ContainerStatusRequest, self.container_status),
            "UpdateContainerResources": (pb.UpdateContainerResourcesRequest, self.update_container_resources),
            "Echo": (pb.VersionRequest, None),
        }
        out = {name: self._unary(name, t, fn) for name, (t, fn) in h.items() if fn is not None}
        out["Echo"] = grpc.unary_unary_rpc_method_handler(self._echo)
        for name, size in _OPAQUE.items():
            out[name] = grpc.unary_unary_rpc_method_handler(self._opaque(name, size))
        out["GetContainerEvents"] = grpc.unary_stream_rpc_method_handler(
            self._events_stream, request_deserializer=pb.GetEventsRequest.FromString,
            response_serializer=pb.ContainerEventResponse.SerializeToString)
        return out

    def _opaque(self, name: str, size: Callable[[MemoryRuntime], int]):
        """A method this runtime does not model (stats, sandbox status, image file systems): it answers a
        well-formed message of a plausible size (a repeated field of 256-byte entries), for relay benchmarks."""
        async def behavior(raw: bytes, context: grpc.aio.ServicerContext) -> bytes:
            if self.record:
                self.calls.append(RecordedCall(name, raw, (), context.time_remaining()))
            n = size(self)
            return _ENTRY * n
        return behavior

    async def _echo(self, raw: bytes, context: grpc.aio.ServicerContext) -> bytes:
        md = tuple((m.key, m.value) for m in (context.invocation_metadata() or ()))
        self.calls.append(RecordedCall("Echo", raw, md, context.time_remaining()))
        await context.send_initial_metadata((("x-echo-initial", "yes"),))
        context.set_trailing_metadata((("x-echo-trailing", "done"),))
        return raw

    async def _events_stream(self, request: pb.GetEventsRequest,
                             context: grpc.aio.ServicerContext) -> AsyncIterator[pb.ContainerEventResponse]:
        q: asyncio.Queue[pb.ContainerEventResponse] = asyncio.Queue()
        self._events.append(q)
        try:
            while True:
                yield await q.get()
        finally:
            self._events.remove(q)

    def _emit(self, cid: str, kind: int) -> None:
        ev = pb.ContainerEventResponse(container_id=cid, container_event_type=kind, created_at=time.time_ns())
        for q in self._events:
            q.put_nowait(ev)

    def _container(self, cid: str) -> _Container:
        c = self.containers.get(cid)
        if c is None:
            raise _NotFound(f"container {cid!r} not found")
        return c

    # -- methods ----------------------------------------------------------------------------------------
    async def version(self, req: pb.VersionRequest, ctx) -> pb.VersionResponse:
        return pb.VersionResponse(version="0.1.0", runtime_name="memory", runtime_version="1",
                                  runtime_api_version="v1")

    async def status(self, req: pb.StatusRequest, ctx) -> pb.StatusResponse:
        return pb.StatusResponse(status=pb.RuntimeStatus(conditions=[
            pb.RuntimeCondition(type="RuntimeReady", status=True)]))

    async def run_pod_sandbox(self, req: pb.RunPodSandboxRequest, ctx) -> pb.RunPodSandboxResponse:
        sid = f"s{next(self._ids):06d}"
        self.sandboxes[sid] = req.config
        self.sandbox_state[sid] = pb.SANDBOX_READY
        return pb.RunPodSandboxResponse(pod_sandbox_id=sid)

    async def stop_pod_sandbox(self, req: pb.StopPodSandboxRequest, ctx) -> pb.StopPodSandboxResponse:
        if req.pod_sandbox_id in self.sandboxes:
            self.sandbox_state[req.pod_sandbox_id] = pb.SANDBOX_NOTREADY
            for c in self.containers.values():
                if c.sandbox_id == req.pod_sandbox_id and c.state != pb.CONTAINER_EXITED:
                    self.exit(c.id, 137)
        return pb.StopPodSandboxResponse()

    async def remove_pod_sandbox(self, req: pb.RemovePodSandboxRequest, ctx) -> pb.RemovePodSandboxResponse:
        self.sandboxes.pop(req.pod_sandbox_id, None)
        self.sandbox_state.pop(req.pod_sandbox_id, None)
        for cid in [c.id for c in self.containers.values() if c.sandbox_id == req.pod_sandbox_id]:
            del self.containers[cid]
        return pb.RemovePodSandboxResponse()

    async def list_pod_sandbox(self, req: pb.ListPodSandboxRequest, ctx) -> pb.ListPodSandboxResponse:
        items = [pb.PodSandbox(id=sid, metadata=cfg.metadata, state=self.sandbox_state[sid], labels=cfg.labels,
                               annotations=cfg.annotations) for sid, cfg in self.sandboxes.items()]
        return pb.ListPodSandboxResponse(items=items)

    async def create_container(self, req: pb.CreateContainerRequest, ctx) -> pb.CreateContainerResponse:
        if req.pod_sandbox_id not in self.sandboxes:
            raise _NotFound(f"sandbox {req.pod_sandbox_id!r} not found")
        cid = f"c{next(self._ids):06d}"
        res = pb.LinuxContainerResources()
        res.CopyFrom(req.config.linux.resources)
        self.containers[cid] = _Container(cid, req.pod_sandbox_id, req.config, resources=res,
                                          created_at=time.time_ns())
        self._emit(cid, pb.CONTAINER_CREATED_EVENT)
        return pb.CreateContainerResponse(container_id=cid)

    async def start_container(self, req: pb.StartContainerRequest, ctx) -> pb.StartContainerResponse:
        c = self._container(req.container_id)
        c.state, c.started_at = pb.CONTAINER_RUNNING, time.time_ns()
        self._emit(req.container_id, pb.CONTAINER_STARTED_EVENT)
        return pb.StartContainerResponse()

    async def stop_container(self, req: pb.StopContainerRequest, ctx) -> pb.StopContainerResponse:
        c = self._container(req.container_id)
        if c.state != pb.CONTAINER_EXITED:
            self.exit(c.id, 137)  # killed
        return pb.StopContainerResponse()

    async def remove_container(self, req: pb.RemoveContainerRequest, ctx) -> pb.RemoveContainerResponse:
        self.containers.pop(req.container_id, None)
        return pb.RemoveContainerResponse()

    async def list_containers(self, req: pb.ListContainersRequest, ctx) -> pb.ListContainersResponse:
        f = req.filter
        out = []
        for c in self.containers.values():
            if f.id and c.id != f.id:
                continue
            if f.pod_sandbox_id and c.sandbox_id != f.pod_sandbox_id:
                continue
            if f.HasField("state") and c.state != f.state.state:
                continue
            out.append(pb.Container(id=c.id, pod_sandbox_id=c.sandbox_id, metadata=c.config.metadata,
                                    image=c.config.image, image_ref="sha256:0", state=c.state,
                                    created_at=c.created_at, labels=c.config.labels,
                                    annotations=c.config.annotations))
        return pb.ListContainersResponse(containers=out)

    async def container_status(self, req: pb.ContainerStatusRequest, ctx) -> pb.ContainerStatusResponse:
        c = self._container(req.container_id)
        return pb.ContainerStatusResponse(status=pb.ContainerStatus(
            id=c.id, metadata=c.config.metadata, state=c.state, created_at=c.created_at, started_at=c.started_at,
            finished_at=c.finished_at, exit_code=c.exit_code, labels=c.config.labels,
            annotations=c.config.annotations, resources=pb.ContainerResources(linux=c.resources)))

    async def update_container_resources(self, req: pb.UpdateContainerResourcesRequest,
                                         ctx) -> pb.UpdateContainerResourcesResponse:
        c = self._container(req.container_id)
        # like containerd: only the fields that are set replace the current ones
        for fd, value in req.linux.ListFields():
            if not isinstance(value, (int, str, bytes)):
                c.resources.ClearField(fd.name)
                getattr(c.resources, fd.name).MergeFrom(value)
            else:
                setattr(c.resources, fd.name, value)
        return pb.UpdateContainerResourcesResponse()

    async def list_images(self, req: pb.ListImagesRequest, ctx) -> pb.ListImagesResponse:
        return pb.ListImagesResponse(images=[pb.Image(id="sha256:0", repo_tags=["localhost/busybox:latest"])])


# field 1, length 253, 253 bytes: one entry of an opaque answer
_ENTRY = b"\x0a\xfd\x01" + b"x" * 253
_OPAQUE: dict[str, Callable[[MemoryRuntime], int]] = {
    "PodSandboxStatus": lambda rt: 4,
    "ListContainerStats": lambda rt: len(rt.containers),
    "ListPodSandboxStats": lambda rt: 2 * len(rt.sandboxes),
}


class _NotFound(Exception):
    pass


async def _main(argv: list[str] | None = None) -> None:
    import argparse
    import signal

    ap = argparse.ArgumentParser(description="serve the in-memory CRI runtime on a unix socket")
    ap.add_argument("socket")
    ap.add_argument("--bulk", type=int, default=0, help="pre-create this many running containers")
    ap.add_argument("--pods", type=int, default=0, help="pre-create this many pods of two running containers each")
    args = ap.parse_args(argv)
    rt = MemoryRuntime(args.socket)
    rt.record = False
    await rt.start()
    if args.bulk:
        req = pb.RunPodSandboxRequest(config=pb.PodSandboxConfig(metadata=pb.PodSandboxMetadata(
            name="bulk", uid="bulk-uid", namespace="default")))
        sid = (await rt.run_pod_sandbox(req, None)).pod_sandbox_id
        rt.add_containers(sid, args.bulk)
    for i in range(args.pods):
        req = pb.RunPodSandboxRequest(config=pb.PodSandboxConfig(metadata=pb.PodSandboxMetadata(
            name=f"pod-{i}", uid=f"pod-uid-{i}", namespace="default")))
        rt.add_containers((await rt.run_pod_sandbox(req, None)).pod_sandbox_id, 2)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print("ready", flush=True)
    await stop.wait()
    await rt.stop()


if __name__ == "__main__":
    asyncio.run(_main())
