"""The trunk multiplexer (containerd/nri pkg/net/multiplex): several logical byte streams on one socket, each frame
``ConnID`` (uint32 BE), payload length N (uint32 BE), N payload bytes. ConnID 1 carries the plugin's service (the
runtime calls), ConnID 2 the runtime's (the plugin calls). A frame boundary means nothing to ttrpc: each ConnID is a
byte stream, so what comes in is handed on in pieces as it arrives (``Demuxer``), and a frame's length is judged
from its header, before any of it is kept.

What is *sent* to a Go runtime follows its reader (shared/reference/nri.md §2.5): Go's per-ConnID ``Read`` fails on
a frame larger than the buffer offered, and ttrpc reads through a 4096-byte ``bufio.Reader``: so a ttrpc message
travels in one frame when it fits in 4096 bytes, else in two (its 10-byte header, then its whole payload), never in
many small frames (Go queues at most 256 frames per ConnID)."""

from __future__ import annotations

import struct

from .errors import ProtocolError

__all__ = ["GO_READ_BUFFER", "HEADER_SIZE", "MAX_FRAME", "PLUGIN_CONN", "RUNTIME_CONN", "Demuxer", "encode_frame",
           "frames_for_message"]

HEADER = struct.Struct(">II")
HEADER_SIZE = HEADER.size
# the largest frame a runtime writes: NRI v0.8.0 cuts longer writes at 4 MiB + 10 bytes, which is also the largest
# ttrpc message (a 10-byte header and at most 4 MiB of data) that a v0.6.1 runtime writes in one frame
MAX_FRAME = 4 * 1024 * 1024 + 10
GO_READ_BUFFER = 4096  # bufio.Reader's default size, ttrpc's read buffer on the Go side
PLUGIN_CONN = 1  # the runtime is the client, the plugin serves nri.pkg.api.v1alpha1.Plugin
RUNTIME_CONN = 2  # the plugin is the client, the runtime serves nri.pkg.api.v1alpha1.Runtime


def encode_frame(conn_id: int, payload: bytes) -> bytes:
    """One frame carrying ``payload`` on ``conn_id``."""
    if not 0 < conn_id <= 0xFFFFFFFF:
        raise ValueError(f"ConnID {conn_id} is not a uint32 other than 0")
    if len(payload) > MAX_FRAME:
        raise ValueError(f"a frame of {len(payload)} bytes is over the {MAX_FRAME}-byte limit")
    return HEADER.pack(conn_id, len(payload)) + payload


def frames_for_message(conn_id: int, header: bytes, payload: bytes) -> list[bytes]:
    """The frames carrying one ttrpc message (its ``header`` and ``payload``) to a Go runtime: one frame when the
    whole message fits in Go's 4096-byte read buffer, else two (the header, then the whole payload)."""
    if len(header) + len(payload) <= GO_READ_BUFFER:
        return [encode_frame(conn_id, header + payload)]
    return [encode_frame(conn_id, header), encode_frame(conn_id, payload)]


class Demuxer:
    """Splits the trunk's bytes, however they are chunked, into ``(conn_id, piece)`` in arrival order: the pieces
    of one ConnID concatenated are its byte stream. A frame longer than ``max_frame`` raises ``ProtocolError`` as
    soon as its header is read."""

    def __init__(self, max_frame: int = MAX_FRAME) -> None:
        self.max_frame = max_frame
        self._head = bytearray()
        self._conn = 0
        self._left = 0  # payload bytes of the current frame still to come
        self.frames = 0  # frame headers read

    @property
    def mid_frame(self) -> bool:
        """Whether the bytes so far end inside a frame (a connection closed now was truncated)."""
        return bool(self._head) or self._left > 0

    def describe_pending(self) -> str:
        if self._left:
            return f"{self._left} payload bytes of a frame on ConnID {self._conn} missing"
        return f"{len(self._head)} of a frame header's {HEADER_SIZE} bytes"

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        out: list[tuple[int, bytes]] = []
        pos, size = 0, len(data)
        view = memoryview(data)
        while pos < size:
            if self._left == 0:
                take = min(HEADER_SIZE - len(self._head), size - pos)
                self._head += view[pos:pos + take]
                pos += take
                if len(self._head) < HEADER_SIZE:
                    break
                conn, length = HEADER.unpack(self._head)
                self._head.clear()
                self.frames += 1
                if length > self.max_frame:
                    raise ProtocolError(f"a mux frame of {length} bytes on ConnID {conn} (limit {self.max_frame})")
                self._conn, self._left = conn, length
                continue
            take = min(self._left, size - pos)
            out.append((self._conn, bytes(view[pos:pos + take])))
            pos += take
            self._left -= take
        return out
