"""One kubelet connection and its runtime connection (``_Connection``: the protocol of kubelet's side;
``_RuntimeSide``: the runtime's), made of the relay's parts: what they share (``frame_link``), each direction
(``frame_kubelet``, ``frame_runtime``) and the held calls (``frame_intercept``). Here: set-up (kubelet's bytes
wait until the runtime connection is up), tear-down, and a runtime that cannot be reached.

The runtime going away closes kubelet's connection (kubelet reconnects, as with a runtime restart); a runtime that
cannot be reached answers kubelet's calls UNAVAILABLE and closes the connection; kubelet going away closes the
runtime connection once the interceptors still running on it are done (a decision is carried through).
"""

from __future__ import annotations

import asyncio
import logging
from typing import cast

import grpc
import grpc.aio

from criproxy.relay import h2wire as h2
from criproxy.relay.conn_limits import MAX_PENDING
from criproxy.relay.frame_kubelet import _FromKubelet
from criproxy.relay.frame_peer import _frames
from criproxy.relay.frame_runtime import _FromRuntime

log = logging.getLogger("numapin.criproxy")

_HEADERS, _SETTINGS, _PING = h2.HEADERS, h2.SETTINGS, h2.PING
_CONNECT_TIMEOUT = 20.0


class _RuntimeSide(asyncio.Protocol):
    """The runtime connection's protocol: hands everything to its ``_Connection``."""

    def __init__(self, conn: _Connection) -> None:
        self.conn = conn

    def data_received(self, data: bytes) -> None:
        conn = self.conn
        conn.cork()
        try:
            conn.from_runtime(data)
        finally:
            conn.uncork()

    def connection_lost(self, exc: Exception | None) -> None:
        self.conn.runtime_lost(exc)

    def pause_writing(self) -> None:
        self.conn.pause(self.conn.kube)

    def resume_writing(self) -> None:
        self.conn.resume(self.conn.kube)


class _Connection(_FromKubelet, _FromRuntime, asyncio.Protocol):
    """One kubelet connection (this protocol) and its runtime connection (``_RuntimeSide``)."""

    # --- set-up and tear-down

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if len(self.server.connections) >= self.server.max_connections:
            self.state = "closed"
            self.server.turn_away(cast(asyncio.Transport, transport))
            return
        self.kube.transport = cast(asyncio.Transport, transport)  # a stream transport (uvloop's is no subclass)
        self.server.connections.add(self)
        self._spawn(self._connect())

    async def _connect(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            transport, _ = await asyncio.wait_for(
                loop.create_unix_connection(lambda: _RuntimeSide(self), self.server.runtime_path), _CONNECT_TIMEOUT)
        except (OSError, TimeoutError) as e:
            self._refuse(f"numapin: the runtime at {self.server.runtime_path} cannot be reached: {e}")
            return
        if self.state != "connecting":  # kubelet went away meanwhile
            transport.close()
            return
        self.rt.transport = transport
        self.state = "relaying"
        if self.pending:
            data, self.pending = bytes(self.pending), bytearray()
            self.from_kubelet(data)
            self.resume(self.kube)  # paused at MAX_PENDING bytes, if it came to that

    def data_received(self, data: bytes) -> None:
        if self.state == "relaying":
            self.cork()
            try:
                self.from_kubelet(data)
            finally:
                self.uncork()
        elif self.state == "connecting":
            self.pending.extend(data)
            if len(self.pending) > MAX_PENDING:  # read on once the runtime connection is up
                self.pause(self.kube)
        elif self.state == "refusing":
            self.pending.extend(data)
            self._refuse_calls()
            if len(self.pending) > MAX_PENDING and self.state != "closed":
                self._close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.kube_gone = True
        for sid, held in list(self.held.items()):
            held.kube_reset = True
            if not held.answered:  # its request never completed: nothing to decide
                del self.held[sid]
        if self.state == "connecting":
            self.state = "closed"
        if not self.held:
            self._close()

    def runtime_lost(self, exc: Exception | None) -> None:
        if self.state in ("closed", "calming"):
            return
        log.info("frame relay: the runtime closed a connection (%s); closing kubelet's, with %d call(s) in flight",
                 exc or "end of stream", len(self.calls) + len(self.held))
        error = grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, None, None,
                                     "numapin: the runtime closed the connection")
        for held in self.held.values():
            held.done(error)
        self._close()

    def pause_writing(self) -> None:  # kubelet reads slowly: stop reading the runtime
        self.pause(self.rt)

    def resume_writing(self) -> None:
        self.resume(self.rt)

    # --- a runtime that cannot be reached

    def _refuse(self, why: str) -> None:
        """Answer kubelet's calls on this connection UNAVAILABLE (fail fast, as gRPC does), then GOAWAY and close:
        kubelet's next call opens a new connection, and a new try at the runtime."""
        if self.state != "connecting":
            return
        self.state = "refusing"
        self.refusal = why
        log.warning("frame relay: %s; kubelet's calls on this connection fail with UNAVAILABLE", why)
        self.kube.write(h2.settings_frame([]))
        self._refuse_calls()
        asyncio.get_running_loop().call_later(10.0, self._close)

    def _refuse_calls(self) -> None:
        data = bytes(self.pending)
        if len(data) < 24:
            return
        if not data.startswith(h2.PREFACE):
            self._close()
            return
        done, answered = 24, False
        for pos, end, ftype, flags, sid in _frames(data, done):
            if ftype == _SETTINGS and not flags & h2.ACK:
                self.kube.write(h2.frame(_SETTINGS, h2.ACK, 0))
            elif ftype == _PING and not flags & h2.ACK:
                self.kube.write(h2.frame(_PING, h2.ACK, 0, data[pos + 9:end]))
            elif ftype == _HEADERS and sid > self.last_sid:
                self.last_sid = sid
                self.kube.write(h2.headers_frames(sid, h2.status_block(grpc.StatusCode.UNAVAILABLE.value[0],
                                                                       self.refusal, trailers_only=True),
                                                  self.kube.max_frame, True))
                answered = True
            done = end
        self.pending = bytearray(data[done:])
        self.pending[:0] = h2.PREFACE  # what is left parses the same next time
        if answered:
            self.kube.write(h2.goaway(self.last_sid))
            self._close()
