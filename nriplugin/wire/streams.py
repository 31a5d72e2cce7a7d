"""ttrpc's stream ids on one logical connection: the client numbers its calls 1, 3, 5, … and the server refuses an
even id and any id not above the last one (ttrpc server.go)."""

from __future__ import annotations

from .errors import ProtocolError

__all__ = ["IncomingStreams", "OutgoingStreams"]


class OutgoingStreams:
    """The ids of our own calls."""

    def __init__(self) -> None:
        self._next = 1

    def next(self) -> int:
        sid = self._next
        self._next += 2
        return sid


class IncomingStreams:
    """Checks the ids of the peer's calls."""

    def __init__(self, conn_id: int) -> None:
        self.conn_id = conn_id
        self.last = 0

    def accept(self, stream_id: int, method: str) -> None:
        if stream_id % 2 == 0:
            raise ProtocolError(f"a {method} request on ConnID {self.conn_id} with even stream id {stream_id}")
        if stream_id <= self.last:
            raise ProtocolError(f"a {method} request on ConnID {self.conn_id} re-using stream id {stream_id} "
                                f"(the last was {self.last})")
        self.last = stream_id
