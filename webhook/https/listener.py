"""The webhook's TLS listener: its own accept loop, so the number of connections, their handshakes and their idle
time are bounded (``ServerLimits``); aiohttp serves each accepted connection.

Each connection's protocol is aiohttp's request handler wrapped in ``_Tracked``, which sees every byte arrive and
the connection end, and keeps the connection's state:

- ``idle``: no request being read or answered. A new connection must start its first request within
  ``header_timeout``; after a response it may stay idle ``idle_timeout`` (keep-alive);
- ``reading``: bytes of a request arrived; its headers must be complete within ``header_timeout``;
- ``busy``: the headers are parsed and a handler runs (``request_started``/``request_ended``, called by the server's
  middleware); the body has its own timeout there.

A connection whose timer fires is closed. Connections being handshaken count towards the cap and are bounded by
``handshake_timeout``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from collections.abc import Callable
from typing import Any, Literal

from webhook.https.limits import ServerLimits

__all__ = ["Listener"]

log = logging.getLogger("numapin.webhook.listener")

State = Literal["idle", "reading", "busy"]
# a connection is evicted for a new one only after being idle this long (a fresh one gets time to send its request)
EVICT_IDLE_AFTER = 0.5


class _Tracked(asyncio.Protocol):
    """aiohttp's protocol for one connection, plus the connection's state and timer."""

    def __init__(self, listener: Listener, inner: Any) -> None:
        self.listener = listener
        self.inner = inner
        self.transport: asyncio.Transport | None = None
        self.state: State = "idle"
        self.idle_since = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self.requests = 0

    # -- timers ---------------------------------------------------------------------------------------------
    def _arm(self, seconds: float, why: str) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self.listener.loop.call_later(seconds, self._expire, why)

    def _expire(self, why: str) -> None:
        self._timer = None
        if self.transport is not None and not self.transport.is_closing():
            log.debug("closing connection from %s: %s", self.transport.get_extra_info("peername"), why)
            self.listener.closed("timeout")
            self.transport.abort()

    def _idle(self, seconds: float, why: str) -> None:
        self.state = "idle"
        self.idle_since = self.listener.loop.time()
        self._arm(seconds, why)

    # -- protocol -------------------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's transports are not asyncio.Transport
        self.listener.connected(self)
        self._idle(self.listener.limits.header_timeout, "no request within the header timeout")
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self.state == "idle":
            self.state = "reading"
            self._arm(self.listener.limits.header_timeout, "request headers not complete within the header timeout")
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()  # type: ignore[no-any-return]

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        try:
            self.inner.connection_lost(exc)
        finally:
            self.listener.disconnected(self)

    # -- from the server's middleware -----------------------------------------------------------------------
    def request_started(self) -> None:
        self.state = "busy"
        self.requests += 1
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def request_ended(self) -> None:
        self._idle(self.listener.limits.idle_timeout, "idle longer than the keep-alive timeout")


class Listener:
    """Accepts TLS connections on ``host:port`` within ``limits`` and hands them to ``factory`` (aiohttp's
    ``web.Server``)."""

    def __init__(self, *, host: str, port: int, ssl_context: ssl.SSLContext, factory: Callable[[], Any],
                 limits: ServerLimits, backlog: int = 1024, on_close: Callable[[str], None] | None = None,
                 reuse_port: bool = False) -> None:
        self.host = host
        self.port = port
        self.ssl_context = ssl_context
        self.factory = factory
        self.limits = limits
        self.backlog = backlog
        self.reuse_port = reuse_port  # SO_REUSEPORT: several worker processes listen on the same port
        self.loop = asyncio.get_running_loop()
        self._sock: socket.socket | None = None
        self._accepting: asyncio.Task[None] | None = None
        self._handshakes: set[asyncio.Task[None]] = set()
        self._conns: dict[asyncio.Transport, _Tracked] = {}
        self._room = asyncio.Event()
        self._stopping = False
        self._warned_full = -1e9
        self._warned_accept = -1e9
        self._on_close = on_close
        self.closed_count: dict[str, int] = {"timeout": 0, "evicted": 0, "handshake_failed": 0}
        self.waited_for_room = 0

    # -- counts ---------------------------------------------------------------------------------------------
    @property
    def connections(self) -> int:
        """Open connections plus handshakes in progress (what the cap counts)."""
        return len(self._conns) + len(self._handshakes)

    def closed(self, why: str) -> None:
        self.closed_count[why] = self.closed_count.get(why, 0) + 1
        if self._on_close is not None:
            self._on_close(why)

    def tracked(self, transport: Any) -> _Tracked | None:
        return self._conns.get(transport)

    def connected(self, conn: _Tracked) -> None:
        assert conn.transport is not None
        self._conns[conn.transport] = conn

    def disconnected(self, conn: _Tracked) -> None:
        if conn.transport is not None:
            self._conns.pop(conn.transport, None)
        self._room.set()

    # -- accepting ------------------------------------------------------------------------------------------
    async def start(self) -> int:
        """Listen; returns the port (useful with port 0)."""
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if self.reuse_port:  # the kernel spreads new connections over the workers' sockets
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            sock.bind((self.host, self.port))
            sock.listen(self.backlog)
            sock.setblocking(False)
        except OSError:
            sock.close()
            raise
        self._sock = sock
        self.port = sock.getsockname()[1]
        self._accepting = asyncio.create_task(self._accept_loop())
        return self.port

    def _evict_idle(self) -> bool:
        oldest_allowed = self.loop.time() - EVICT_IDLE_AFTER
        idle = [c for c in self._conns.values() if c.state == "idle" and c.idle_since <= oldest_allowed
                and c.transport is not None and not c.transport.is_closing()]
        if not idle:
            return False
        oldest = min(idle, key=lambda c: c.idle_since)
        assert oldest.transport is not None
        log.debug("at %d connections: closing the oldest idle one for a new one", self.limits.max_connections)
        self.closed("evicted")
        oldest.transport.abort()
        return True

    async def _room_for_one(self) -> None:
        waited = False
        while self.connections >= self.limits.max_connections:
            self._room.clear()
            if not self._evict_idle() and not waited:
                self.waited_for_room += 1
                waited = True
                if self.loop.time() - self._warned_full > 10.0:
                    self._warned_full = self.loop.time()
                    log.warning("at the cap of %d connections, none idle: new connections wait in the accept queue "
                                "(%d time(s) so far)", self.limits.max_connections, self.waited_for_room)
            # an abort takes effect on the next loop turn (connection_lost); a busy connection ends in time
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(0.5):
                    await self._room.wait()

    async def _accept_loop(self) -> None:
        assert self._sock is not None
        while not self._stopping:
            await self._room_for_one()
            try:
                conn, _ = await self.loop.sock_accept(self._sock)
            except OSError as e:  # e.g. EMFILE: wait for descriptors to come back instead of spinning
                if self.loop.time() - self._warned_accept > 10.0:
                    self._warned_accept = self.loop.time()
                    log.warning("accepting a connection failed (retrying every 0.1 s): %s", e)
                await asyncio.sleep(0.1)
                continue
            task = asyncio.create_task(self._handshake(conn))
            self._handshakes.add(task)
            task.add_done_callback(self._handshake_done)

    def _handshake_done(self, task: asyncio.Task[None]) -> None:
        self._handshakes.discard(task)
        self._room.set()

    async def _handshake(self, conn: socket.socket) -> None:
        try:
            await self.loop.connect_accepted_socket(
                lambda: _Tracked(self, self.factory()), conn, ssl=self.ssl_context,
                ssl_handshake_timeout=self.limits.handshake_timeout)
        except asyncio.CancelledError:
            conn.close()
            raise
        except Exception as e:  # a failed or timed-out handshake, a client gone: nothing to answer
            log.debug("TLS handshake failed: %s", e)
            self.closed("handshake_failed")
            conn.close()

    async def stop(self) -> None:
        """Stop accepting; open connections are left to aiohttp's shutdown."""
        self._stopping = True
        if self._accepting is not None:
            # cancel until it ends: a cancellation can be lost in a timeout racing it (Python 3.11's wait_for)
            while not self._accepting.done():
                self._accepting.cancel()
                await asyncio.wait([self._accepting], timeout=0.1)
            with contextlib.suppress(asyncio.CancelledError):
                self._accepting.result()
            self._accepting = None
        for t in list(self._handshakes):
            t.cancel()
        for t in list(self._handshakes):
            with contextlib.suppress(asyncio.CancelledError):
                await t
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def abort_all(self) -> None:
        for t in list(self._conns):
            t.abort()
