"""One trunk: the unix-socket connection to the runtime, carrying ttrpc messages on ConnID 1 (the runtime's calls to
the plugin) and ConnID 2 (the plugin's calls to the runtime). Frames for any other ConnID are dropped, as the Go
side drops frames for ids it has not opened. Memory is bounded: a frame or a message over its limit is refused from
its header (``ProtocolError``), so at most one message per ConnID and one read are held."""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque

from .errors import ConnectionClosed, ProtocolError
from .mux import PLUGIN_CONN, RUNTIME_CONN, Demuxer, frames_for_message
from .ttrpc import Message, MessageReader

__all__ = ["READ_SIZE", "Trunk"]

READ_SIZE = 64 * 1024


class Trunk:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer
        self._demux = Demuxer()
        self._streams = {conn: MessageReader(conn) for conn in (PLUGIN_CONN, RUNTIME_CONN)}
        self._ready: deque[tuple[int, Message]] = deque()
        self._drain_lock = asyncio.Lock()
        self.dropped_bytes = 0  # payload bytes for ConnIDs nobody opened

    @classmethod
    async def connect(cls, path: str) -> Trunk:
        """Connect to the runtime's NRI socket (``OSError`` when it is absent or refuses)."""
        reader, writer = await asyncio.open_unix_connection(path, limit=READ_SIZE)
        return cls(reader, writer)

    async def receive(self) -> tuple[int, Message]:
        """The next whole message and its ConnID; ``ConnectionClosed`` at a clean end, ``ProtocolError`` when the
        bytes break the framing (the connection ending mid-frame or mid-message included)."""
        while not self._ready:
            try:
                data = await self._reader.read(READ_SIZE)
            except (ConnectionResetError, BrokenPipeError) as e:
                raise ConnectionClosed(f"the connection broke ({e})") from None
            if not data:
                self._check_boundary()
                raise ConnectionClosed("the runtime closed the connection")
            for conn, piece in self._demux.feed(data):
                stream = self._streams.get(conn)
                if stream is None:
                    self.dropped_bytes += len(piece)
                    continue
                self._ready.extend((conn, m) for m in stream.feed(piece))
        return self._ready.popleft()

    def _check_boundary(self) -> None:
        if self._demux.mid_frame:
            raise ProtocolError(f"the connection closed inside a mux frame ({self._demux.describe_pending()})")
        for stream in self._streams.values():
            if stream.mid_message:
                raise ProtocolError(f"the connection closed inside a ttrpc message ({stream.describe_pending()})")

    async def send(self, conn_id: int, message: Message) -> None:
        """Write one message (its frames back to back: no other message comes between them)."""
        if self._writer.is_closing():
            raise ConnectionClosed("the connection is closed")
        self._writer.writelines(frames_for_message(conn_id, message.header(), message.data))
        async with self._drain_lock:
            try:
                await self._writer.drain()
            except (ConnectionResetError, BrokenPipeError) as e:
                raise ConnectionClosed(f"the connection broke ({e})") from None

    def close(self) -> None:
        """Close the socket (``receive`` then ends with ``ConnectionClosed``)."""
        self._writer.close()

    async def wait_closed(self) -> None:
        with contextlib.suppress(OSError):
            await self._writer.wait_closed()
