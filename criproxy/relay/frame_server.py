"""The frame relay (``--relay frames``, the default) and its listening socket (``start_frame_relay_server``,
``FrameRelayServer``: a unix socket born 0660; a stop tells every connection GOAWAY and gives calls in flight their
grace).

For every connection accepted on the proxy's socket the relay opens one connection to the runtime and copies the
byte stream across in both directions, whole frames at a time, without gRPC in between: one read and one write
per burst of frames, no per-call objects on the relayed path. Its modules, one job each:

- ``frame_connection``: one kubelet connection and its runtime connection (``_Connection``): set-up, tear-down, a
  runtime that cannot be reached; made of the parts below;
- ``frame_link``: what those parts share (both peers, the calls in flight, the flow-control book, the bounds of
  what a client may cost) and what the connections of one socket share (``_Server``);
- ``frame_kubelet``, ``frame_runtime``: kubelet's frames on their way to the runtime, the runtime's to kubelet;
- ``frame_held``, ``frame_intercept``: an intercepted call held as its frames come, and what the proxy does with
  it (the interceptor's ``Forward``, the answer to kubelet, the runtime's late frames);
- ``frame_peer`` (a side's windows and backlog, the frame walk), ``frame_headers`` (routes, statuses, metadata).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable

from criproxy.relay import h2wire as h2
from criproxy.relay.conn_limits import ConnectionLimits
from criproxy.relay.frame_connection import _Connection
from criproxy.relay.frame_link import _Server
from criproxy.relay.grpc_relay import RelayHandler
from criproxy.relay.socket_server import SOCKET_MODE, prepare_socket

__all__ = ["DEFAULT_MAX_CONNECTIONS", "FrameRelayServer", "start_frame_relay_server"]

log = logging.getLogger("numapin.criproxy")

# kubelet connections served at once (each costs two descriptors: it and its runtime connection); kubelet opens two.
# 0: as many as the process's descriptors allow (conn_limits.descriptor_cap)
DEFAULT_MAX_CONNECTIONS = 0
_BACKLOG = 4096

class FrameRelayServer:
    """The frame relay's listening socket, with the stop/wait interface of ``grpc.aio.Server``."""

    def __init__(self, server: asyncio.AbstractServer, shared: _Server) -> None:
        self._server = server
        self._shared = shared
        self._stopped = asyncio.Event()
        self._sweeper: asyncio.Task[None] | None = None
        if shared.limits.idle_timeout > 0:
            self._sweeper = asyncio.get_running_loop().create_task(shared.sweep_idle())

    @property
    def max_connections(self) -> int:
        return self._shared.max_connections

    @property
    def connections(self) -> int:
        return len(self._shared.connections)

    async def stop(self, grace: float | None) -> None:
        """Refuse new connections, tell kubelet to open no new calls (GOAWAY), give calls in flight ``grace``
        seconds, then close every connection."""
        if self._stopped.is_set():
            return
        if self._sweeper is not None:
            self._sweeper.cancel()
        self._server.close()
        conns = list(self._shared.connections)
        for c in conns:
            c.kube.write(h2.goaway(0x7FFFFFFF))
        deadline = time.monotonic() + (grace or 0.0)
        while time.monotonic() < deadline and any(c.calls or c.held for c in self._shared.connections):
            await asyncio.sleep(0.05)
        for c in list(self._shared.connections):
            c.abort()
        for c in conns:
            for t in list(c.tasks):
                t.cancel()
        self._stopped.set()

    async def wait_for_termination(self) -> None:
        await self._stopped.wait()


async def start_frame_relay_server(path: str, handler: RelayHandler, *,
                                   max_connections: int = DEFAULT_MAX_CONNECTIONS,
                                   on_turned_away: Callable[[], None] | None = None,
                                   limits: ConnectionLimits | None = None,
                                   on_closed: Callable[[str], None] | None = None) -> FrameRelayServer:
    """Serve the frame relay for ``handler`` (its runtime endpoint, interceptors and observer) on the unix socket
    ``path`` (mode 0660); interceptors run on the calling event loop. What a connection may cost: ``limits``
    (conn_limits; default: ``max_connections``, 0 for as many as the descriptors allow, and the default bounds).
    A connection beyond the cap is told GOAWAY and closed (``on_turned_away`` is told); one closed for what it cost
    is told to ``on_closed`` ("idle", "frames" or "memory")."""
    if limits is None:
        limits = ConnectionLimits(max_connections=max_connections)
    if limits.max_connections < 0:
        raise ValueError(f"max_connections must not be negative, got {limits.max_connections}")
    prepare_socket(path)
    shared = _Server(handler, limits, on_turned_away, on_closed)
    loop = asyncio.get_running_loop()
    handler.loop = loop
    factory: Callable[[], asyncio.Protocol] = lambda: _Connection(shared)  # noqa: E731
    old = os.umask(0o117)  # the socket is born 0660: no window with wider permissions
    try:
        # a backlog for bursts of clients (critest starting its specs) rather than asyncio's 100 (the kernel caps it
        # at net.core.somaxconn)
        server = await loop.create_unix_server(factory, path, backlog=_BACKLOG)
    finally:
        os.umask(old)
    os.chmod(path, SOCKET_MODE)
    return FrameRelayServer(server, shared)
