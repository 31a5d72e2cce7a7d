"""The relays the proxy can run (``--relay``), started by name."""

from __future__ import annotations

from collections.abc import Callable

from criproxy.relay.conn_limits import ConnectionLimits
from criproxy.relay.frame_server import DEFAULT_MAX_CONNECTIONS, FrameRelayServer, start_frame_relay_server
from criproxy.relay.grpc_relay import RelayHandler
from criproxy.relay.socket_server import RelayServer, start_relay_server

__all__ = ["RELAYS", "start_relay"]

# "frames": HTTP/2 frames copied between kubelet's and the runtime's connections (frame_server.py);
# "grpc": a gRPC server and channel in the proxy (grpc_relay.py, socket_server.py)
RELAYS = ("frames", "grpc")


async def start_relay(path: str, handler: RelayHandler, relay: str, *,
                      max_connections: int = DEFAULT_MAX_CONNECTIONS,
                      on_turned_away: Callable[[], None] | None = None,
                      limits: ConnectionLimits | None = None,
                      on_closed: Callable[[str], None] | None = None) -> RelayServer | FrameRelayServer:
    """Serve ``handler`` with the relay named ``relay`` (one of ``RELAYS``) on the unix socket ``path``; the frame
    relay bounds what each client connection costs (``limits``, else ``max_connections`` and the default bounds of
    conn_limits), tells ``on_turned_away`` of each connection beyond its cap and ``on_closed`` of each closed for
    its cost."""
    if relay == "frames":
        return await start_frame_relay_server(path, handler, max_connections=max_connections,
                                              on_turned_away=on_turned_away, limits=limits, on_closed=on_closed)
    if relay == "grpc":
        return await start_relay_server(path, handler)
    raise ValueError(f"unknown relay {relay!r}: expected one of {', '.join(RELAYS)}")
