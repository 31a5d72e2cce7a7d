"""The relays the proxy can run (``--relay``), started by name."""

from __future__ import annotations

from .relay import RelayHandler
from .relay_frames import FrameRelayServer, start_frame_relay_server
from .server import RelayServer, start_relay_server

__all__ = ["RELAYS", "start_relay"]

# "frames": HTTP/2 frames copied between kubelet's and the runtime's connections (relay_frames.py);
# "grpc": a gRPC server and channel in the proxy (relay.py, server.py)
RELAYS = ("frames", "grpc")


async def start_relay(path: str, handler: RelayHandler, relay: str) -> RelayServer | FrameRelayServer:
    """Serve ``handler`` with the relay named ``relay`` (one of ``RELAYS``) on the unix socket ``path``."""
    if relay == "frames":
        return await start_frame_relay_server(path, handler)
    if relay == "grpc":
        return await start_relay_server(path, handler)
    raise ValueError(f"unknown relay {relay!r}: expected one of {', '.join(RELAYS)}")
