"""Transparent gRPC relay: every method of every service is forwarded to the runtime as raw bytes.

Known unary CRI methods take a fast unary path; every other method (``GetContainerEvents``, methods newer
than this list, unknown services) is relayed as a bidirectional stream, which carries any of the four gRPC
call shapes unchanged. Metadata and deadlines go upstream as they came ("no deadline" stays none);
status codes, details and trailing metadata come back unchanged. A few methods are handed to an
interceptor first: it sees the request bytes and decides what (if anything) goes upstream.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass

import grpc
import grpc.aio
from google.protobuf.message import DecodeError

from .wire import WireError

__all__ = [
    "CRI_SERVICES",
    "UNARY_METHODS",
    "Forward",
    "Interceptor",
    "Rejection",
    "RelayHandler",
    "Upstream",
    "normalize_endpoint",
]

log = logging.getLogger("numapin.criproxy")

CRI_SERVICES = (
    "runtime.v1.RuntimeService",
    "runtime.v1.ImageService",
    "runtime.v1alpha2.RuntimeService",
    "runtime.v1alpha2.ImageService",
)

# Unary methods of the CRI services (everything else, e.g. GetContainerEvents, is relayed as a stream).
UNARY_METHODS = frozenset({
    "Version", "RunPodSandbox", "StopPodSandbox", "RemovePodSandbox", "PodSandboxStatus", "ListPodSandbox",
    "CreateContainer", "StartContainer", "StopContainer", "RemoveContainer", "ListContainers", "ContainerStatus",
    "UpdateContainerResources", "ReopenContainerLog", "ExecSync", "Exec", "Attach", "PortForward",
    "ContainerStats", "ListContainerStats", "PodSandboxStats", "ListPodSandboxStats", "UpdateRuntimeConfig",
    "Status", "CheckpointContainer", "ListMetricDescriptors", "ListPodSandboxMetrics", "RuntimeConfig",
    "UpdatePodSandboxResources", "ListImages", "ImageStatus", "PullImage", "RemoveImage", "ImageFsInfo",
})

# Metadata the gRPC library sets itself; everything else is the caller's and goes upstream.
_TRANSPORT_KEYS = frozenset({"user-agent", "content-type", "te", "host", "grpc-timeout", "grpc-encoding",
                             "grpc-accept-encoding", "grpc-message-type"})

MAX_MESSAGE = 64 * 1024 * 1024
# Reconnect quickly after the runtime restarts (100 ms, growing to 2 s), but give each connection attempt the time a
# loaded runtime needs to answer: gRPC takes "min_reconnect_backoff_ms" as the minimum connect timeout (20 s by
# default), so 100 ms there failed every call on a starved node with "timed out before receiving SETTINGS frame".
CONNECT_TIMEOUT_MS = 20_000
CHANNEL_OPTIONS = (
    ("grpc.max_receive_message_length", MAX_MESSAGE),
    ("grpc.max_send_message_length", MAX_MESSAGE),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", CONNECT_TIMEOUT_MS),
    ("grpc.max_reconnect_backoff_ms", 2000),
    ("grpc.enable_retries", 0),
)

Metadata = tuple[tuple[str, str | bytes], ...]
Observer = Callable[[str, float, grpc.StatusCode], None]


def normalize_endpoint(endpoint: str) -> str:
    """A gRPC target for ``unix:///path``, ``unix:/path`` or a bare ``/path``."""
    if endpoint.startswith("unix://"):
        return "unix:" + endpoint[len("unix://"):]
    if endpoint.startswith("unix:"):
        return endpoint
    if endpoint.startswith("/"):
        return "unix:" + endpoint
    raise ValueError(f"runtime endpoint {endpoint!r}: expected unix:///path/to/socket")


class Upstream:
    """The runtime's gRPC channel (reconnects with back-off by itself; calls fail fast when it is down)."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.channel = grpc.aio.insecure_channel(normalize_endpoint(endpoint), options=CHANNEL_OPTIONS)
        self._unary: dict[str, grpc.aio.UnaryUnaryMultiCallable] = {}
        self._stream: dict[str, grpc.aio.StreamStreamMultiCallable] = {}

    def unary(self, method: str) -> grpc.aio.UnaryUnaryMultiCallable:
        c = self._unary.get(method)
        if c is None:
            c = self._unary[method] = self.channel.unary_unary(method)
        return c

    def stream(self, method: str) -> grpc.aio.StreamStreamMultiCallable:
        c = self._stream.get(method)
        if c is None:
            c = self._stream[method] = self.channel.stream_stream(method)
        return c

    async def call(self, method: str, request: bytes, *, timeout: float | None = 10.0) -> bytes:
        """A call the proxy makes on its own behalf (raw bytes in and out)."""
        return await self.unary(method)(request, timeout=timeout)

    async def close(self) -> None:
        await self.channel.close()


@dataclass(frozen=True)
class Rejection(Exception):
    """Raised by an interceptor to answer the caller with an error without forwarding anything."""

    code: grpc.StatusCode
    message: str

    def __str__(self) -> str:
        return self.message


class Forward:
    """What an interceptor uses to send (possibly changed) request bytes upstream with the caller's
    metadata and deadline."""

    __slots__ = ("_context", "_upstream", "metadata", "method", "timeout")

    def __init__(self, upstream: Upstream, method: str, context: grpc.aio.ServicerContext) -> None:
        self._upstream = upstream
        self._context = context
        self.method = method
        self.metadata = caller_metadata(context)
        self.timeout: float | None = context.time_remaining()

    async def __call__(self, request: bytes) -> bytes:
        call = self._upstream.unary(self.method)(request, metadata=self.metadata, timeout=self.timeout)
        response = await call
        initial = await call.initial_metadata()
        if initial:
            await self._context.send_initial_metadata(tuple(initial))
        trailing = await call.trailing_metadata()
        if trailing:
            self._context.set_trailing_metadata(tuple(trailing))
        return response


Interceptor = Callable[[bytes, Forward], Awaitable[bytes]]


def caller_metadata(context: grpc.aio.ServicerContext) -> Metadata:
    md = context.invocation_metadata() or ()
    return tuple((m.key, m.value) for m in md if not m.key.startswith(":") and m.key not in _TRANSPORT_KEYS)


class RelayHandler(grpc.GenericRpcHandler):
    """A generic handler that relays every method to ``upstream``.

    ``interceptors`` maps a method's short name (``CreateContainer``) to an interceptor; it applies to that
    method of every CRI service (runtime.v1 and runtime.v1alpha2 share field numbers). ``observe`` is told
    each call's method, duration and status code (metrics).
    """

    def __init__(self, upstream: Upstream, interceptors: Mapping[str, Interceptor] | None = None,
                 observe: Observer | None = None) -> None:
        self.upstream = upstream
        self.interceptors = dict(interceptors or {})
        self.observe = observe
        self._handlers: dict[str, grpc.RpcMethodHandler] = {}

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        method = handler_call_details.method
        handler = self._handlers.get(method)
        if handler is None:
            handler = self._handlers[method] = self._make_handler(method)
        return handler

    def _make_handler(self, method: str) -> grpc.RpcMethodHandler:
        service, _, name = method.lstrip("/").rpartition("/")
        if service in CRI_SERVICES and name in UNARY_METHODS:
            interceptor = self.interceptors.get(name)
            return grpc.unary_unary_rpc_method_handler(self._unary_behavior(method, interceptor))
        return grpc.stream_stream_rpc_method_handler(self._stream_behavior(method))

    def _done(self, method: str, t0: float, code: grpc.StatusCode) -> None:
        if self.observe is not None:
            self.observe(method, time.perf_counter() - t0, code)

    def _unary_behavior(self, method: str, interceptor: Interceptor | None):
        upstream = self.upstream
        name = method.rsplit("/", 1)[-1]

        async def behavior(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
            t0 = time.perf_counter()
            code = grpc.StatusCode.OK
            try:
                forward = Forward(upstream, method, context)
                if interceptor is None:
                    return await forward(request)
                return await interceptor(request, forward)
            except grpc.aio.AioRpcError as e:
                code = e.code()
                await context.abort(e.code(), e.details() or "", tuple(e.trailing_metadata() or ()))
                raise  # not reached: abort raises
            except Rejection as e:
                code = e.code
                await context.abort(e.code, e.message)
                raise
            except (DecodeError, WireError) as e:
                code = grpc.StatusCode.INVALID_ARGUMENT
                await context.abort(code, f"numapin: cannot parse the {name} request: {e}")
                raise
            except grpc.aio.AbortError:
                raise
            except Exception as e:
                code = grpc.StatusCode.INTERNAL
                log.exception("%s: unexpected error in numapin's interceptor", method)
                await context.abort(code, f"numapin: internal error handling {name}: {type(e).__name__}: {e}")
                raise
            finally:
                self._done(method, t0, code)

        return behavior

    def _stream_behavior(self, method: str):
        upstream = self.upstream

        async def behavior(request_iterator: AsyncIterator[bytes],
                           context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
            t0 = time.perf_counter()
            code = grpc.StatusCode.OK
            call = upstream.stream(method)(request_iterator, metadata=caller_metadata(context),
                                           timeout=context.time_remaining())
            try:
                initial = await call.initial_metadata()
                if initial:
                    await context.send_initial_metadata(tuple(initial))
                async for response in call:
                    yield response
                trailing = await call.trailing_metadata()
                if trailing:
                    context.set_trailing_metadata(tuple(trailing))
            except grpc.aio.AioRpcError as e:
                code = e.code()
                await context.abort(e.code(), e.details() or "", tuple(e.trailing_metadata() or ()))
            finally:
                call.cancel()
                self._done(method, t0, code)

        return behavior
