"""Transparent gRPC relay: every method of every service is forwarded to the runtime as raw bytes.

Relayed calls run on the threads of a synchronous gRPC server, each forwarded with a blocking call on a
synchronous channel: the cheapest path gRPC's Python bindings offer (about half the instructions per call of a
grpc.aio server and channel; docs/performance.md). Known unary CRI methods take a unary path; every other method
(``GetContainerEvents``, methods newer than this list, unknown services) is relayed as a bidirectional stream,
which carries any of the four gRPC call shapes unchanged. Metadata and deadlines go upstream as they came ("no
deadline" stays none); status codes, details and trailing metadata come back unchanged.

A few methods are handed to an interceptor first. Interceptors are coroutines of the proxy's event loop (where
its state lives): the server thread hands the request over and waits for the outcome. The interceptor sees the
request bytes and decides what (if anything) goes upstream, through ``Forward`` (the event loop's grpc.aio
channel).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import grpc
import grpc.aio
from google.protobuf.message import DecodeError

from criproxy.relay.wire import WireError
from nodeagent.rejection import Rejection

__all__ = [
    "CRI_SERVICES",
    "UNARY_METHODS",
    "Forward",
    "Interceptor",
    "Outcome",
    "PassThrough",
    "Rejection",
    "RelayHandler",
    "Upstream",
    "intercept",
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

# A synchronous server reports "no deadline" as a remaining time of about 2**63 ns; anything beyond a year is that.
_NO_DEADLINE = 365 * 24 * 3600.0

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
    """The runtime's gRPC channels (each reconnects with back-off by itself; calls fail fast when it is down):
    ``channel`` (grpc.aio) for the event loop — interceptors of the gRPC relay and the proxy's own calls —, and a
    synchronous one for the gRPC relay's server threads."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        target = normalize_endpoint(endpoint)
        self.channel = grpc.aio.insecure_channel(target, options=CHANNEL_OPTIONS)
        self._target = target
        self._sync_channel: grpc.Channel | None = None  # made by the gRPC relay only (the frame relay needs none)
        self._unary: dict[str, grpc.aio.UnaryUnaryMultiCallable[bytes, bytes]] = {}
        self._stream: dict[str, grpc.aio.StreamStreamMultiCallable[bytes, bytes]] = {}

    @property
    def sync_channel(self) -> grpc.Channel:
        if self._sync_channel is None:
            self._sync_channel = grpc.insecure_channel(self._target, options=CHANNEL_OPTIONS)
        return self._sync_channel

    def unary(self, method: str) -> grpc.aio.UnaryUnaryMultiCallable[bytes, bytes]:
        c = self._unary.get(method)
        if c is None:
            c = self._unary[method] = self.channel.unary_unary(method)
        return c

    def stream(self, method: str) -> grpc.aio.StreamStreamMultiCallable[bytes, bytes]:
        c = self._stream.get(method)
        if c is None:
            c = self._stream[method] = self.channel.stream_stream(method)
        return c

    async def call(self, method: str, request: bytes, *, timeout: float | None = 10.0) -> bytes:
        """A call the proxy makes on its own behalf (raw bytes in and out)."""
        return await self.unary(method)(request, timeout=timeout)

    async def close(self) -> None:
        if self._sync_channel is not None:
            self._sync_channel.close()
        await self.channel.close()


class _Replies:
    """The runtime's initial and trailing metadata of an intercepted call, passed back to the caller."""

    __slots__ = ("initial", "trailing")

    def __init__(self) -> None:
        self.initial: Metadata = ()
        self.trailing: Metadata = ()


class Forward:
    """What an interceptor uses to send (possibly changed) request bytes upstream with the caller's
    metadata and deadline."""

    __slots__ = ("_replies", "_upstream", "metadata", "method", "timeout")

    def __init__(self, upstream: Upstream, method: str, metadata: Metadata, timeout: float | None,
                 replies: _Replies | None = None) -> None:
        self._upstream = upstream
        self._replies = replies if replies is not None else _Replies()
        self.method = method
        self.metadata = metadata
        self.timeout = timeout

    async def __call__(self, request: bytes) -> bytes:
        call = self._upstream.unary(self.method)(request, metadata=self.metadata, timeout=self.timeout)
        response = await call
        initial = await call.initial_metadata()
        if initial:
            self._replies.initial = tuple(initial)
        trailing = await call.trailing_metadata()
        if trailing:
            self._replies.trailing = tuple(trailing)
        return response


Interceptor = Callable[[bytes, Forward], Awaitable[bytes]]
# From an intercepted call's request message alone (synchronous, on the event loop, nothing awaited): True when its
# interceptor would forward the request as it came and give the runtime's answer back unchanged. The frame relay then
# relays such a call frame by frame, as an unheld one (frame_kubelet); an exception counts as False (the
# interceptor runs and reports it).
PassThrough = Callable[[bytes], bool]


def caller_metadata(context: grpc.ServicerContext) -> Metadata:
    md = context.invocation_metadata() or ()
    # grpc's metadata items are namedtuples (key, value); the stubs type them as plain pairs
    return tuple((m.key, m.value) for m in md  # type: ignore[attr-defined]
                 if not m.key.startswith(":") and m.key not in _TRANSPORT_KEYS)  # type: ignore[attr-defined]


def caller_timeout(context: grpc.ServicerContext) -> float | None:
    """The caller's remaining time; None when it set no deadline."""
    remaining = context.time_remaining()
    return None if remaining is None or remaining > _NO_DEADLINE else remaining


@dataclass(frozen=True)
class Outcome:
    """How an intercepted call ends: a response, or an error status."""

    response: bytes = b""
    code: grpc.StatusCode = grpc.StatusCode.OK
    details: str = ""
    initial: Metadata = ()
    trailing: Metadata = ()


async def intercept(method: str, interceptor: Interceptor, request: bytes, forward: Forward, replies: _Replies
                    ) -> Outcome:
    """Run ``interceptor`` on ``request``; its response, or the status it ends with (a runtime error passed on,
    a rejection, a request that cannot be parsed, a bug in numapin)."""
    name = method.rsplit("/", 1)[-1]
    try:
        response = await interceptor(request, forward)
    except grpc.aio.AioRpcError as e:
        return Outcome(code=e.code(), details=e.details() or "", trailing=tuple(e.trailing_metadata() or ()))
    except Rejection as e:
        return Outcome(code=e.code, details=e.message)
    except (DecodeError, WireError) as e:
        return Outcome(code=grpc.StatusCode.INVALID_ARGUMENT, details=f"numapin: cannot parse the {name} request: {e}")
    except Exception as e:
        log.exception("%s: unexpected error in numapin's interceptor", method)
        return Outcome(code=grpc.StatusCode.INTERNAL,
                       details=f"numapin: internal error handling {name}: {type(e).__name__}: {e}")
    return Outcome(response=response, initial=replies.initial, trailing=replies.trailing)


def _answer(context: grpc.ServicerContext, initial: Metadata, trailing: Metadata) -> None:
    if initial:
        context.send_initial_metadata(initial)
    if trailing:
        context.set_trailing_metadata(trailing)


def _fail(context: grpc.ServicerContext, code: grpc.StatusCode, details: str, trailing: Metadata) -> None:
    """End the call with the runtime's (or numapin's) status; raises."""
    if trailing:
        context.set_trailing_metadata(trailing)
    context.abort(code, details)


class RelayHandler(grpc.GenericRpcHandler):
    """A generic handler (for ``start_relay_server``) that relays every method to ``upstream``.

    ``interceptors`` maps a method's short name (``CreateContainer``) to an interceptor; it applies to that
    method of every CRI service (runtime.v1 and runtime.v1alpha2 share field numbers). Interceptors run on
    ``loop`` (set by ``start_relay_server`` to the event loop that starts it). ``observe`` is told each call's
    method, duration and status code (metrics; called from the server's threads). ``pass_through`` maps an
    intercepted method's short name to its ``PassThrough``: the frame relay relays the calls it passes unheld (the
    gRPC relay, whose calls arrive on its server threads, runs the interceptor for every call).
    """

    def __init__(self, upstream: Upstream, interceptors: Mapping[str, Interceptor] | None = None,
                 observe: Observer | None = None, pass_through: Mapping[str, PassThrough] | None = None) -> None:
        self.upstream = upstream
        self.interceptors = dict(interceptors or {})
        self.pass_through = {k: v for k, v in (pass_through or {}).items() if k in self.interceptors}
        self.observe = observe
        self.loop: asyncio.AbstractEventLoop | None = None
        self._handlers: dict[str, grpc.RpcMethodHandler[bytes, bytes]] = {}

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler[bytes, bytes] | None:
        method = handler_call_details.method
        handler = self._handlers.get(method)
        if handler is None:
            handler = self._handlers[method] = self._make_handler(method)
        return handler

    def _make_handler(self, method: str) -> grpc.RpcMethodHandler[bytes, bytes]:
        service, _, name = method.lstrip("/").rpartition("/")
        if service in CRI_SERVICES and name in UNARY_METHODS:
            interceptor = self.interceptors.get(name)
            if interceptor is not None:
                return grpc.unary_unary_rpc_method_handler(self._intercepted_behavior(method, interceptor))
            return grpc.unary_unary_rpc_method_handler(self._unary_behavior(method))
        return grpc.stream_stream_rpc_method_handler(self._stream_behavior(method))

    def _done(self, method: str, t0: float, code: grpc.StatusCode) -> None:
        if self.observe is not None:
            self.observe(method, time.perf_counter() - t0, code)

    def _unary_behavior(self, method: str) -> Callable[[bytes, grpc.ServicerContext], bytes]:
        forward: grpc.UnaryUnaryMultiCallable[bytes, bytes] = self.upstream.sync_channel.unary_unary(method)

        def behavior(request: bytes, context: grpc.ServicerContext) -> bytes:
            t0 = time.perf_counter()
            code = grpc.StatusCode.OK
            try:
                response, call = forward.with_call(request, metadata=caller_metadata(context),
                                                   timeout=caller_timeout(context))
            except grpc.RpcError as e:
                code = e.code()
                # the stubs type an error's trailing metadata as objects; they are (key, value) pairs
                _fail(context, code, e.details() or "", tuple(e.trailing_metadata() or ()))  # type: ignore[arg-type]
                raise  # not reached: abort raises
            else:
                _answer(context, tuple(call.initial_metadata() or ()), tuple(call.trailing_metadata() or ()))
                return response
            finally:
                self._done(method, t0, code)

        return behavior

    def _intercepted_behavior(self, method: str, interceptor: Interceptor
                              ) -> Callable[[bytes, grpc.ServicerContext], bytes]:
        def behavior(request: bytes, context: grpc.ServicerContext) -> bytes:
            t0 = time.perf_counter()
            outcome = Outcome(code=grpc.StatusCode.INTERNAL)
            try:
                outcome = self._on_loop(self._intercept(method, interceptor, request, caller_metadata(context),
                                                        caller_timeout(context)))
                if outcome.code != grpc.StatusCode.OK:
                    _fail(context, outcome.code, outcome.details, outcome.trailing)
                _answer(context, outcome.initial, outcome.trailing)
                return outcome.response
            finally:
                self._done(method, t0, outcome.code)

        return behavior

    def _on_loop(self, coro: Coroutine[Any, Any, Outcome]) -> Outcome:
        """Run ``coro`` on the proxy's event loop and wait for it (the caller going away does not stop it: a
        decision is carried through)."""
        loop = self.loop
        if loop is None or loop.is_closed():
            coro.close()
            return Outcome(code=grpc.StatusCode.UNAVAILABLE, details="numapin: the proxy is stopping")
        future = asyncio.run_coroutine_threadsafe(coro, loop)
        while True:
            try:
                return future.result(timeout=1.0)
            except concurrent.futures.TimeoutError:
                if loop.is_closed():
                    return Outcome(code=grpc.StatusCode.UNAVAILABLE, details="numapin: the proxy is stopping")
            except concurrent.futures.CancelledError:
                return Outcome(code=grpc.StatusCode.UNAVAILABLE, details="numapin: the proxy is stopping")

    async def _intercept(self, method: str, interceptor: Interceptor, request: bytes, metadata: Metadata,
                         timeout: float | None) -> Outcome:
        replies = _Replies()
        return await intercept(method, interceptor, request, Forward(self.upstream, method, metadata, timeout, replies),
                               replies)

    def _stream_behavior(self, method: str) -> Callable[[Iterator[bytes], grpc.ServicerContext], Iterator[bytes]]:
        forward: grpc.StreamStreamMultiCallable[bytes, bytes] = self.upstream.sync_channel.stream_stream(method)

        def behavior(request_iterator: Iterator[bytes], context: grpc.ServicerContext) -> Iterator[bytes]:
            t0 = time.perf_counter()
            code = grpc.StatusCode.OK
            call = forward(request_iterator, metadata=caller_metadata(context), timeout=caller_timeout(context))
            # the caller went away: so does the upstream stream (grpc ignores what the callback returns)
            context.add_callback(call.cancel)  # type: ignore[arg-type]
            try:
                initial = call.initial_metadata()
                if initial:
                    context.send_initial_metadata(tuple(initial))
                yield from call
                trailing = call.trailing_metadata()
                if trailing:
                    context.set_trailing_metadata(tuple(trailing))
            except grpc.RpcError as e:
                code = e.code()
                if context.is_active():
                    _fail(context, code, e.details() or "", tuple(e.trailing_metadata() or ()))  # type: ignore[arg-type]
            finally:
                call.cancel()
                self._done(method, t0, code)

        return behavior
