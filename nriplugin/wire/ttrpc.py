"""ttrpc's message framing (containerd/ttrpc channel.go): a 10-byte header (data length uint32 BE, stream id uint32
BE, message type, flags) and at most 4 MiB of data. NRI makes only unary calls: a Request (type 1) answered by one
Response (type 2) on the same stream id, flags 0. ``MessageReader`` rebuilds the messages of one logical connection
from its byte stream and refuses a length over the limit as soon as the header is read, before keeping any data."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum

from .errors import ProtocolError

__all__ = ["HEADER_SIZE", "MAX_MESSAGE", "Message", "MessageReader", "MessageType", "encode_header"]

HEADER = struct.Struct(">IIBB")
HEADER_SIZE = HEADER.size
MAX_MESSAGE = 4 * 1024 * 1024  # ttrpc's messageLengthMax: the data after the header


class MessageType(IntEnum):
    REQUEST = 1
    RESPONSE = 2
    DATA = 3  # streaming only: NRI never sends it


@dataclass(frozen=True)
class Message:
    stream_id: int
    type: int
    flags: int
    data: bytes

    def header(self) -> bytes:
        return encode_header(len(self.data), self.stream_id, self.type, self.flags)


def encode_header(length: int, stream_id: int, message_type: int, flags: int = 0) -> bytes:
    if length > MAX_MESSAGE:
        raise ValueError(f"a ttrpc message of {length} bytes is over the {MAX_MESSAGE}-byte limit")
    return HEADER.pack(length, stream_id, message_type, flags)


class MessageReader:
    """The messages in one logical connection's byte stream, however it is cut into pieces."""

    def __init__(self, conn_id: int, max_message: int = MAX_MESSAGE) -> None:
        self.conn_id = conn_id
        self.max_message = max_message
        self._buf = bytearray()
        self._need: tuple[int, int, int, int] | None = None  # the header of the message being read

    @property
    def mid_message(self) -> bool:
        return bool(self._buf) or self._need is not None

    def describe_pending(self) -> str:
        if self._need is not None:
            length, stream, kind, _ = self._need
            return (f"{len(self._buf)} of the {length} data bytes of a type-{kind} message on ConnID {self.conn_id} "
                    f"stream {stream}")
        return f"{len(self._buf)} of a ttrpc header's {HEADER_SIZE} bytes on ConnID {self.conn_id}"

    def feed(self, piece: bytes) -> list[Message]:
        self._buf += piece
        out: list[Message] = []
        while True:
            if self._need is None:
                if len(self._buf) < HEADER_SIZE:
                    return out
                length, stream, kind, flags = HEADER.unpack_from(self._buf)
                if length > self.max_message:
                    raise ProtocolError(f"a ttrpc message of {length} bytes on ConnID {self.conn_id} stream {stream} "
                                        f"(limit {self.max_message})")
                if kind not in MessageType.__members__.values():
                    raise ProtocolError(f"a ttrpc message of unknown type {kind} ({length} bytes) on ConnID "
                                        f"{self.conn_id} stream {stream}")
                del self._buf[:HEADER_SIZE]
                self._need = (length, stream, kind, flags)
            length, stream, kind, flags = self._need
            if len(self._buf) < length:
                return out
            out.append(Message(stream, kind, flags, bytes(self._buf[:length])))
            del self._buf[:length]
            self._need = None
