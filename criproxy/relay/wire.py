"""Surgical edits of protobuf wire bytes.

The proxy must hand containerd exactly the bytes kubelet sent except the fields numapin changes. Parsing
with our partial messages and serialising again would keep unknown fields but move them behind the known
ones; this module instead rewrites only the fields that change, in place, and leaves every other byte
where it was.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = ["WireError", "encode_int64", "encode_string", "fields", "message_at", "set_fields"]

_VARINT, _I64, _LEN, _SGROUP, _EGROUP, _I32 = 0, 1, 2, 3, 4, 5


class WireError(ValueError):
    """The bytes are not a valid protobuf message."""


@dataclass(frozen=True)
class Field:
    number: int
    wire_type: int
    start: int   # first byte of the tag
    end: int     # one past the last byte of the value
    value_start: int  # first byte of the payload (after the length prefix for LEN fields)


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf):
            raise WireError("truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise WireError("varint too long")


def _put_varint(value: int) -> bytes:
    value &= (1 << 64) - 1
    out = bytearray()
    while True:
        b = value & 0x7F
        value >>= 7
        if value:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def fields(buf: bytes) -> list[Field]:
    """The top-level fields of a message, in wire order."""
    out: list[Field] = []
    pos = 0
    n = len(buf)
    while pos < n:
        start = pos
        key, pos = _varint(buf, pos)
        number, wt = key >> 3, key & 7
        if number == 0:
            raise WireError("field number 0")
        if wt == _VARINT:
            _, pos = _varint(buf, pos)
            value_start = start
        elif wt == _I64:
            value_start, pos = pos, pos + 8
        elif wt == _I32:
            value_start, pos = pos, pos + 4
        elif wt == _LEN:
            length, value_start = _varint(buf, pos)
            pos = value_start + length
        elif wt == _SGROUP:
            depth = 1
            while depth:
                k, pos = _varint(buf, pos)
                inner = k & 7
                if inner == _SGROUP:
                    depth += 1
                elif inner == _EGROUP:
                    depth -= 1
                elif inner == _VARINT:
                    _, pos = _varint(buf, pos)
                elif inner == _I64:
                    pos += 8
                elif inner == _I32:
                    pos += 4
                elif inner == _LEN:
                    length, pos = _varint(buf, pos)
                    pos += length
                else:
                    raise WireError(f"bad wire type {inner}")
            value_start = start
        else:
            raise WireError(f"bad wire type {wt}")
        if pos > n:
            raise WireError("truncated field")
        out.append(Field(number, wt, start, pos, value_start))
    return out


def encode_string(number: int, value: str) -> bytes:
    """A string field, or nothing for the proto3 default ``""``."""
    if not value:
        return b""
    data = value.encode()
    return _put_varint(number << 3 | _LEN) + _put_varint(len(data)) + data


def encode_int64(number: int, value: int) -> bytes:
    """An int64 field, or nothing for the proto3 default 0."""
    if not value:
        return b""
    return _put_varint(number << 3 | _VARINT) + _put_varint(value)


def _len_field(number: int, payload: bytes) -> bytes:
    return _put_varint(number << 3 | _LEN) + _put_varint(len(payload)) + payload


def set_fields(buf: bytes, path: Sequence[int], updates: Mapping[int, bytes], *, create: bool = True) -> bytes:
    """Replace scalar fields of the message at ``path`` (field numbers of nested messages) inside ``buf``.

    ``updates`` maps a field number to its new encoding (``encode_string``/``encode_int64``; ``b""`` removes
    the field). Every occurrence of an updated field is dropped and the new encoding goes where the first
    one was, or before the first field with a higher number (canonical order) when it was absent. Nested
    messages on the path are created when missing (``create``; else such a message is left as it is). All
    other bytes are kept as they were.
    """
    if path:
        head, rest = path[0], path[1:]
        fs = fields(buf)
        subs = [f for f in fs if f.number == head and f.wire_type == _LEN]
        if subs:
            # several occurrences of an embedded message merge: edit the last, which wins for scalars,
            # and drop the updated fields from the earlier ones as well
            out = bytearray()
            pos = 0
            for f in subs:
                inner = set_fields(buf[f.value_start:f.end], rest, updates, create=create)
                out += buf[pos:f.start] + _len_field(head, inner)
                pos = f.end
            out += buf[pos:]
            return bytes(out)
        if not create:
            return buf
        inner = set_fields(b"", rest, updates)
        return _insert_in_order(buf, fs, head, _len_field(head, inner))
    fs = fields(buf)
    out = bytearray()
    pos = 0
    pending = dict(updates)
    for f in fs:
        if f.number in updates:
            out += buf[pos:f.start]
            out += pending.pop(f.number, b"")
            pos = f.end
    out += buf[pos:]
    result = bytes(out)
    for number in sorted(pending):
        if pending[number]:
            result = _insert_in_order(result, fields(result), number, pending[number])
    return result


def message_at(buf: bytes, path: Sequence[int]) -> bytes | None:
    """The bytes of the embedded message at ``path`` (its last occurrence at each level), None when absent."""
    for number in path:
        found = None
        for f in fields(buf):
            if f.number == number and f.wire_type == _LEN:
                found = f
        if found is None:
            return None
        buf = buf[found.value_start:found.end]
    return buf


def _insert_in_order(buf: bytes, fs: list[Field], number: int, encoded: bytes) -> bytes:
    for f in fs:
        if f.number > number:
            return buf[:f.start] + encoded + buf[f.start:]
    return buf + encoded
