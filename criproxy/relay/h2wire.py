"""HTTP/2 frame layout (RFC 9113) and the few gRPC header blocks the frame relay writes itself.

Only what the frame relay needs: the 9-byte frame header, SETTINGS entries, frames the relay emits (WINDOW_UPDATE,
RST_STREAM, GOAWAY, DATA, HEADERS) and header blocks encoded as HPACK literals *without indexing* (RFC 7541 6.2.2),
which leave both peers' dynamic tables untouched, so blocks the relay writes can sit between the peers' own.
"""

from __future__ import annotations

import struct
import urllib.parse

__all__ = [
    "ACK",
    "CONTINUATION",
    "DATA",
    "END_HEADERS",
    "END_STREAM",
    "FRAME_HEADER",
    "GOAWAY",
    "HEADERS",
    "PADDED",
    "PING",
    "PREFACE",
    "PRIORITY",
    "PRIORITY_FLAG",
    "RST_STREAM",
    "SETTINGS",
    "WINDOW_UPDATE",
    "data_frames",
    "goaway",
    "grpc_timeout",
    "header_block_fragment",
    "headers_frames",
    "literal_block",
    "rst_stream",
    "settings_entries",
    "settings_frame",
    "status_block",
    "window_update",
]

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)
END_STREAM = ACK = 0x1
END_HEADERS = 0x4
PADDED = 0x8
PRIORITY_FLAG = 0x20

SETTINGS_HEADER_TABLE_SIZE = 0x1
SETTINGS_INITIAL_WINDOW_SIZE = 0x4
SETTINGS_MAX_FRAME_SIZE = 0x5

# error codes (RFC 9113 7)
NO_ERROR = 0x0
REFUSED_STREAM = 0x7
CANCEL = 0x8
ENHANCE_YOUR_CALM = 0xB

# length (24 bits: high byte + low 16), type, flags, stream id (the reserved bit masked by the reader)
FRAME_HEADER = struct.Struct(">BHBBI")
_SETTING = struct.Struct(">HI")
_U32 = struct.Struct(">I")


def frame(ftype: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    n = len(payload)
    return FRAME_HEADER.pack(n >> 16, n & 0xFFFF, ftype, flags, stream_id) + payload


def window_update(stream_id: int, increment: int) -> bytes:
    """WINDOW_UPDATE frames for ``increment`` (split when it exceeds the 31-bit maximum)."""
    out = []
    while increment > 0:
        step = min(increment, 0x7FFFFFFF)
        out.append(frame(WINDOW_UPDATE, 0, stream_id, _U32.pack(step)))
        increment -= step
    return b"".join(out)


def rst_stream(stream_id: int, code: int = CANCEL) -> bytes:
    return frame(RST_STREAM, 0, stream_id, _U32.pack(code))


def goaway(last_stream_id: int, code: int = NO_ERROR, debug: bytes = b"") -> bytes:
    return frame(GOAWAY, 0, 0, struct.pack(">II", last_stream_id, code) + debug)


def settings_frame(entries: list[tuple[int, int]]) -> bytes:
    return frame(SETTINGS, 0, 0, b"".join(_SETTING.pack(k, v) for k, v in entries))


def settings_entries(payload: bytes) -> list[tuple[int, int]]:
    return [_SETTING.unpack_from(payload, i) for i in range(0, len(payload) - len(payload) % 6, 6)]


def header_block_fragment(flags: int, payload: bytes) -> bytes:
    """The header block fragment of a HEADERS frame's payload (padding and priority removed)."""
    start, end = 0, len(payload)
    if flags & PADDED:
        start, end = 1, end - payload[0]
    if flags & PRIORITY_FLAG:
        start += 5
    if end < start:
        raise ValueError("HEADERS frame: padding longer than the frame")
    return payload[start:end]


def data_frames(stream_id: int, body: bytes, max_frame: int, end_stream: bool) -> list[bytes]:
    """``body`` as DATA frames of at most ``max_frame`` bytes; END_STREAM on the last when asked."""
    chunks = [body[i:i + max_frame] for i in range(0, len(body), max_frame)] or [b""]
    last = len(chunks) - 1
    return [frame(DATA, END_STREAM if end_stream and i == last else 0, stream_id, c) for i, c in enumerate(chunks)]


def headers_frames(stream_id: int, block: bytes, max_frame: int, end_stream: bool) -> bytes:
    """A header block as HEADERS (+ CONTINUATION) frames of at most ``max_frame`` bytes."""
    parts = [block[i:i + max_frame] for i in range(0, len(block), max_frame)] or [b""]
    out = []
    for i, part in enumerate(parts):
        flags = END_HEADERS if i == len(parts) - 1 else 0
        if i == 0:
            out.append(frame(HEADERS, flags | (END_STREAM if end_stream else 0), stream_id, part))
        else:
            out.append(frame(CONTINUATION, flags, stream_id, part))
    return b"".join(out)


def _length(n: int, prefix_bits: int, first: int) -> bytes:
    """An HPACK integer (RFC 7541 5.1) with ``first``'s high bits set."""
    limit = (1 << prefix_bits) - 1
    if n < limit:
        return bytes((first | n,))
    out = bytearray((first | limit,))
    n -= limit
    while n >= 128:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def literal_block(headers: list[tuple[bytes, bytes]]) -> bytes:
    """Headers as literals without indexing, new names, no Huffman (``:status: 200`` from the static table)."""
    out = bytearray()
    for name, value in headers:
        if name == b":status" and value == b"200":
            out.append(0x88)  # indexed field 8 of the static table: touches no dynamic table
            continue
        out.append(0x00)  # literal without indexing, new name
        out += _length(len(name), 7, 0x00)
        out += name
        out += _length(len(value), 7, 0x00)
        out += value
    return bytes(out)


def _metadata_value(value: str | bytes) -> bytes:
    return value if isinstance(value, bytes) else value.encode()


def status_block(code: int, message: str, trailing: tuple[tuple[str, str | bytes], ...] = (),
                 *, trailers_only: bool) -> bytes:
    """gRPC status (``grpc-status``, percent-encoded ``grpc-message``, trailing metadata, ``-bin`` values in
    base64) as a header block; ``trailers_only`` adds ``:status`` and ``content-type`` (a call answered by trailers
    alone)."""
    import base64

    headers: list[tuple[bytes, bytes]] = []
    if trailers_only:
        headers += [(b":status", b"200"), (b"content-type", b"application/grpc")]
    headers.append((b"grpc-status", str(code).encode()))
    if message:
        headers.append((b"grpc-message", urllib.parse.quote(message, safe=" !\"#$&'()*+,-./:;<=>?@[\\]^_`{|}~")
                        .encode()))
    for key, value in trailing:
        if key.endswith("-bin"):
            raw = _metadata_value(value)
            headers.append((key.encode(), base64.b64encode(raw).rstrip(b"=")))
        else:
            headers.append((key.encode(), _metadata_value(value)))
    return literal_block(headers)


_TIMEOUT_UNITS = {b"H": 3600.0, b"M": 60.0, b"S": 1.0, b"m": 1e-3, b"u": 1e-6, b"n": 1e-9}


def grpc_timeout(value: bytes) -> float | None:
    """Seconds of a ``grpc-timeout`` value (``1999m``); None when it cannot be read."""
    unit = _TIMEOUT_UNITS.get(value[-1:])
    if unit is None or not value[:-1].isdigit():
        return None
    return int(value[:-1]) * unit
