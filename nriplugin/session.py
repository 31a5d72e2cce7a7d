"""One NRI connection, from connect to close: register, be configured, receive the Synchronize and serve events.

The plugin serves ``nri.pkg.api.v1alpha1.Plugin`` on ConnID 1 and calls ``nri.pkg.api.v1alpha1.Runtime`` on ConnID 2
(shared/reference/nri.md §2.3, §4.4). The receive loop only reads, checks and decodes: every runtime call is
answered from its own task, because the runtime sends Configure before it answers RegisterPlugin and may have several
calls outstanding. A split Synchronize (``more``) is collected: each ``more=true`` chunk is answered ``more=true``
with nothing else, and the handler sees one request with every pod and container. A method the plugin does not serve
(UpdatePodSandbox, ValidateContainerAdjustment, the dedicated pod/container event RPCs of NRI v0.12, which then falls
back to StateChange) is answered UNIMPLEMENTED. Anything that breaks the protocol ends the session with a
``ProtocolError`` saying what came; the caller closes, logs and reconnects."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import replace
from typing import Any

from google.protobuf.message import DecodeError

from protos import nri_pb2

from .events import Event, mask_of
from .handler import CallContext, Handler, PluginError, RuntimeInfo
from .runtime_check import MINIMUM_VERSIONS, UnsupportedRuntime, check_runtime
from .wire.codes import Code
from .wire.envelope import decode_call, decode_reply, encode_call, encode_error, encode_reply
from .wire.errors import ConnectionClosed, ProtocolError
from .wire.mux import PLUGIN_CONN, RUNTIME_CONN
from .wire.streams import IncomingStreams, OutgoingStreams
from .wire.trunk import Trunk
from .wire.ttrpc import MAX_MESSAGE, Message, MessageType

__all__ = ["DEFAULT_REGISTRATION_TIMEOUT", "DEFAULT_REQUEST_TIMEOUT", "PLUGIN_SERVICE", "RUNTIME_SERVICE",
           "RuntimeCallError", "Session"]

PLUGIN_SERVICE: str = nri_pb2.DESCRIPTOR.services_by_name["Plugin"].full_name
RUNTIME_SERVICE: str = nri_pb2.DESCRIPTOR.services_by_name["Runtime"].full_name
DEFAULT_REQUEST_TIMEOUT = 2.0  # seconds, when Configure does not say (NRI v0.6.1)
DEFAULT_REGISTRATION_TIMEOUT = 5.0
# the Plugin service's methods: name -> request message
METHODS: dict[str, Any] = {
    "Configure": nri_pb2.ConfigureRequest,
    "Synchronize": nri_pb2.SynchronizeRequest,
    "Shutdown": nri_pb2.Empty,
    "CreateContainer": nri_pb2.CreateContainerRequest,
    "UpdateContainer": nri_pb2.UpdateContainerRequest,
    "StopContainer": nri_pb2.StopContainerRequest,
    "StateChange": nri_pb2.StateChangeEvent,
}


class RuntimeCallError(Exception):
    """A call of ours that the runtime answered with an error status."""

    def __init__(self, method: str, code: int, message: str) -> None:
        name = Code(code).name if code in Code.__members__.values() else str(code)
        super().__init__(f"the runtime answered {method} with {name}: {message}")
        self.method = method
        self.code = code
        self.message = message


class Session:
    """``await Session(trunk, handler, ...).run()`` serves one connection until it ends, and raises why:
    ``ConnectionClosed`` (the runtime closed it), ``ProtocolError`` (it sent something that breaks the protocol),
    ``RuntimeCallError``/``TimeoutError`` (registration refused or unanswered), ``UnsupportedRuntime`` (the start-up
    check refused the runtime's Configure)."""

    def __init__(self, trunk: Trunk, handler: Handler, *, name: str, index: str,
                 registration_timeout: float = DEFAULT_REGISTRATION_TIMEOUT,
                 minimum_versions: Any = MINIMUM_VERSIONS, log: logging.Logger | None = None) -> None:
        self.trunk = trunk
        self.handler = handler
        self.name = name
        self.index = index
        self.mask = mask_of(handler.events)
        self.registration_timeout = registration_timeout
        self.minimum_versions = minimum_versions
        self.log = log or logging.getLogger("nriplugin")
        self.runtime: RuntimeInfo | None = None  # set once the runtime configured us (on_connected was called)
        self.synchronized = asyncio.Event()  # set once our answer to the final Synchronize chunk is written
        self.syncs = 0  # Synchronize requests the handler saw (each possibly joined from chunks)
        self._request_timeout = DEFAULT_REQUEST_TIMEOUT
        self._incoming = IncomingStreams(PLUGIN_CONN)
        self._outgoing = OutgoingStreams()
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._abandoned: set[int] = set()  # our calls that timed out: their late answers are dropped
        self._tasks: set[asyncio.Task[None]] = set()
        self._sync_chunks: list[Any] = []
        self._sync_deadline: float | None = None
        self._reason: BaseException | None = None  # why we closed the connection ourselves
        self._unimplemented: set[str] = set()
        self._sync_answered = False  # the handler answered a whole Synchronize

    # -- the connection's life -------------------------------------------------------------------------------
    async def run(self) -> None:
        receiver = asyncio.create_task(self._receive())
        try:
            await self.call("RegisterPlugin", nri_pb2.RegisterPluginRequest(plugin_name=self.name,
                                                                           plugin_idx=self.index),
                            nri_pb2.Empty, self.registration_timeout)
            await receiver
        except (ConnectionClosed, ProtocolError, RuntimeCallError, TimeoutError):
            if self._reason is not None:
                raise self._reason from None
            if receiver.done() and not receiver.cancelled() and receiver.exception() is not None:
                raise receiver.exception() from None  # type: ignore[misc]
            raise
        finally:
            await self._shut(receiver)

    def close(self, reason: BaseException) -> None:
        """End the session from our side; ``run`` raises ``reason``."""
        if self._reason is None:
            self._reason = reason
        self.trunk.close()

    async def _shut(self, receiver: asyncio.Task[None]) -> None:
        self.trunk.close()
        tasks = [receiver, *self._tasks]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task
        await self.trunk.wait_closed()

    async def _receive(self) -> None:
        try:
            while True:
                conn, message = await self.trunk.receive()
                if conn == PLUGIN_CONN:
                    self._on_request(message)
                else:
                    self._on_reply(message)
        except (ConnectionClosed, ProtocolError) as e:
            for future in self._pending.values():
                if not future.done():
                    future.set_exception(self._reason or e)
            raise

    # -- the runtime's calls to us (ConnID 1) -----------------------------------------------------------------
    def _on_request(self, message: Message) -> None:
        sid, where = message.stream_id, f"ConnID 1 stream {message.stream_id}"
        if message.type != MessageType.REQUEST:
            raise ProtocolError(f"a type-{message.type} message of {len(message.data)} bytes on {where}, where only "
                                "requests come")
        call = decode_call(message.data, where)
        self._incoming.accept(sid, call.method)
        timeout = call.timeout_nano / 1e9 if call.timeout_nano > 0 else self._request_timeout
        ctx = CallContext(call.method, sid, time.monotonic() + timeout)
        kind = METHODS.get(call.method) if call.service == PLUGIN_SERVICE else None
        if kind is None:
            if call.service + "/" + call.method not in self._unimplemented:
                self._unimplemented.add(call.service + "/" + call.method)
                self.log.info("the runtime called %s/%s (%d payload bytes, stream %d), which numapin does not serve: "
                              "answered UNIMPLEMENTED", call.service, call.method, len(call.payload), sid)
            self._spawn(self._answer(sid, encode_error(Code.UNIMPLEMENTED, f"{call.service}/{call.method} is not "
                                                       "implemented by this plugin")))
            return
        try:
            request = kind.FromString(call.payload)
        except DecodeError as e:
            raise ProtocolError(f"a {call.method} request of {len(call.payload)} bytes on {where} that does not "
                                f"decode ({e})") from None
        self._spawn(self._serve(ctx, request))

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _serve(self, ctx: CallContext, request: Any) -> None:
        began = time.perf_counter()
        try:
            data = encode_reply(await self._dispatch(ctx, request))
        except PluginError as e:
            self.log.info("answered %s (stream %d) with %s: %s", ctx.method, ctx.stream_id, e.code.name, e.message)
            data = encode_error(e.code, e.message)
            self._after_failed(ctx.method, e.message)
        except Exception as e:  # the handler's bug: the runtime gets an error, the session goes on
            self.log.error("the handler failed on %s (stream %d): %r", ctx.method, ctx.stream_id, e)
            data = encode_error(Code.INTERNAL, f"numapin's NRI plugin failed on {ctx.method}: {e}")
            self._after_failed(ctx.method, repr(e))
        if len(data) > MAX_MESSAGE:
            self.log.error("the answer to %s (stream %d) is %d bytes, over ttrpc's %d: answered RESOURCE_EXHAUSTED",
                           ctx.method, ctx.stream_id, len(data), MAX_MESSAGE)
            data = encode_error(Code.RESOURCE_EXHAUSTED, f"numapin's answer to {ctx.method} is {len(data)} bytes")
        late = -ctx.remaining()
        if late > 0:
            self.log.warning("answered %s (stream %d) %.0f ms after its deadline: the runtime has dropped this "
                             "plugin for it", ctx.method, ctx.stream_id, late * 1000)
        await self._answer(ctx.stream_id, data)
        if self.log.isEnabledFor(logging.DEBUG):  # the plugin's own share of the runtime's call (benchmarks/nri.py)
            self.log.debug("served %s (stream %d) in %.3f ms", _served(ctx.method, request), ctx.stream_id,
                           (time.perf_counter() - began) * 1000)
        if self._sync_answered and not self.synchronized.is_set():
            self.synchronized.set()
        if self._reason is not None:
            self.trunk.close()

    def _after_failed(self, method: str, why: str) -> None:
        """A failed Synchronize leaves the plugin out of the runtime's list (NRI v0.6.1 even keeps the connection
        open and sends no events): close after answering, so that the plugin registers again."""
        if method == "Synchronize" and self._reason is None:
            self._reason = ConnectionClosed(f"closed after answering Synchronize with an error ({why})")

    async def _answer(self, stream_id: int, data: bytes) -> None:
        with contextlib.suppress(ConnectionClosed, OSError):
            await self.trunk.send(PLUGIN_CONN, Message(stream_id, MessageType.RESPONSE, 0, data))

    async def _dispatch(self, ctx: CallContext, request: Any) -> bytes:
        method = ctx.method
        if method == "Configure":
            return await self._configure(request)
        if method == "Synchronize":
            return await self._synchronize(ctx, request)
        if method == "CreateContainer":
            response = await self.handler.create_container(ctx, request)
        elif method == "UpdateContainer":
            response = await self.handler.update_container(ctx, request)
        elif method == "StopContainer":
            response = await self.handler.stop_container(ctx, request)
        elif method == "StateChange":
            await self.handler.state_change(ctx, request)
            response = nri_pb2.Empty()
        else:  # Shutdown: no runtime sends it (NRI v0.6.1-v0.12.2)
            self.log.info("the runtime called Shutdown")
            response = nri_pb2.Empty()
        return bytes(response.SerializeToString())

    async def _configure(self, request: Any) -> bytes:
        info = RuntimeInfo(
            name=request.runtime_name, version=request.runtime_version, config=request.config,
            request_timeout=request.request_timeout / 1000 if request.request_timeout > 0 else DEFAULT_REQUEST_TIMEOUT,
            registration_timeout=(request.registration_timeout / 1000 if request.registration_timeout > 0
                                  else DEFAULT_REGISTRATION_TIMEOUT))
        try:
            check_runtime(info, self.minimum_versions)
        except UnsupportedRuntime as e:
            self._reason = e  # answered, then closed (``_serve``)
            raise PluginError(Code.FAILED_PRECONDITION, str(e)) from None
        self._request_timeout = info.request_timeout
        self.runtime = info
        await self.handler.on_connected(info)
        return bytes(nri_pb2.ConfigureResponse(events=self.mask).SerializeToString())

    async def _synchronize(self, ctx: CallContext, request: Any) -> bytes:
        if self._sync_deadline is None:
            self._sync_deadline = ctx.deadline  # the runtime's timeout covers every chunk
        if request.more:
            self._sync_chunks.append(request)
            return bytes(nri_pb2.SynchronizeResponse(more=True).SerializeToString())
        chunks, self._sync_chunks = [*self._sync_chunks, request], []
        deadline, self._sync_deadline = self._sync_deadline, None
        whole = nri_pb2.SynchronizeRequest()
        for chunk in chunks:
            whole.pods.extend(chunk.pods)
            whole.containers.extend(chunk.containers)
        self.syncs += 1
        answer = await self.handler.synchronize(replace(ctx, deadline=deadline), whole)
        out = nri_pb2.SynchronizeResponse()
        out.CopyFrom(answer)
        out.more = False
        self._sync_answered = True
        runtime = self.runtime
        self.log.info("NRI plugin %s-%s synchronized with %s %s: %d pods, %d containers (%d messages), %d updates",
                      self.index, self.name, runtime.name if runtime else "?", runtime.version if runtime else "?",
                      len(whole.pods), len(whole.containers), len(chunks), len(out.update))
        return bytes(out.SerializeToString())

    # -- our calls to the runtime (ConnID 2) ------------------------------------------------------------------
    def _on_reply(self, message: Message) -> None:
        sid, where = message.stream_id, f"ConnID 2 stream {message.stream_id}"
        if message.type != MessageType.RESPONSE:
            raise ProtocolError(f"a type-{message.type} message of {len(message.data)} bytes on {where}, where only "
                                "responses to our calls come")
        future = self._pending.get(sid)
        if future is None:
            if sid in self._abandoned:
                self._abandoned.discard(sid)
                return
            raise ProtocolError(f"a response of {len(message.data)} bytes on {where}, a stream no call of ours is "
                                "waiting on")
        reply = decode_reply(message.data, where)
        if not future.done():
            future.set_result(reply)

    async def call(self, method: str, request: Any, response_type: Any, timeout: float) -> Any:
        """Call ``method`` of the runtime's service; its decoded response, or ``RuntimeCallError``/``TimeoutError``
        (``ConnectionClosed``/``ProtocolError`` when the connection ends meanwhile)."""
        sid = self._outgoing.next()
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[sid] = future
        try:
            data = encode_call(RUNTIME_SERVICE, method, request.SerializeToString(), int(timeout * 1e9))
            await self.trunk.send(RUNTIME_CONN, Message(sid, MessageType.REQUEST, 0, data))
            try:
                reply = await asyncio.wait_for(future, timeout)
            except TimeoutError:
                self._abandoned.add(sid)
                raise TimeoutError(f"the runtime did not answer {method} within {timeout:g} s") from None
        finally:
            self._pending.pop(sid, None)
        if reply.code != Code.OK:
            raise RuntimeCallError(method, reply.code, reply.message)
        try:
            return response_type.FromString(reply.payload)
        except DecodeError as e:
            error = ProtocolError(f"a {method} response of {len(reply.payload)} bytes on ConnID 2 stream {sid} that "
                                  f"does not decode ({e})")
            self.close(error)
            raise error from None

    async def update_containers(self, updates: list[Any], evictions: list[Any] | None = None,
                                timeout: float = 5.0) -> list[Any]:
        """The runtime's UpdateContainers: the updates it could not apply (``RuntimeCallError`` when some failed
        without ``ignore_failure``: the runtime then drops the list)."""
        response = await self.call("UpdateContainers", nri_pb2.UpdateContainersRequest(update=updates,
                                                                                      evict=evictions or []),
                                   nri_pb2.UpdateContainersResponse, timeout)
        return list(response.failed)


def _served(method: str, request: Any) -> str:
    """The call's name in the debug line of its service time: a StateChange by its event."""
    if method != "StateChange":
        return method
    try:
        return f"StateChange/{Event(request.event).name}"
    except ValueError:
        return f"StateChange/{request.event}"
