"""The one error of the wire: what came from the peer breaks the protocol."""

from __future__ import annotations

__all__ = ["ConnectionClosed", "ProtocolError"]


class ProtocolError(Exception):
    """What the peer sent breaks the protocol (a malformed, truncated or oversized frame or message, a bad stream id,
    a payload that does not decode): the connection must be closed. ``str()`` says what came (sizes, ids, method)."""


class ConnectionClosed(Exception):
    """The peer closed the connection at a message boundary (a runtime stopping or dropping the plugin)."""
