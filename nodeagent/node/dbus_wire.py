"""A small asyncio D-Bus client: just what the proxy needs to call systemd's manager (method calls with string,
boolean, object-path, byte-array and ``a(sv)`` arguments; replies and errors), over a unix socket.

The D-Bus wire format (little-endian), SASL ``EXTERNAL`` authentication by uid, ``Hello`` on a message bus (not on
a direct peer connection such as systemd's private socket ``/run/systemd/private``), one connection shared by
concurrent calls (replies matched by serial). Signals and calls from the peer are read and dropped.

Why not a library: the proxy makes one kind of call (``SetUnitProperties``), the well-kept asyncio libraries pull in
a larger API than that, and the proxy's dependencies are kept to what it cannot do without.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import struct
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Bytes", "DBusConnection", "DBusError", "ObjectPath", "Variant", "marshal_call", "parse_message"]

METHOD_CALL, METHOD_RETURN, ERROR, SIGNAL = 1, 2, 3, 4
F_PATH, F_INTERFACE, F_MEMBER, F_ERROR_NAME, F_REPLY_SERIAL, F_DESTINATION, F_SENDER, F_SIGNATURE = 1, 2, 3, 4, 5, \
    6, 7, 8
MAX_MESSAGE = 1 << 27


class DBusError(RuntimeError):
    """A call failed: the peer's error (``name``, its message), or the connection's (name ``""``)."""

    def __init__(self, name: str, message: str) -> None:
        super().__init__(f"{name}: {message}" if name else message)
        self.name = name
        self.message = message


@dataclass(frozen=True)
class ObjectPath:
    path: str


@dataclass(frozen=True)
class Bytes:
    """A D-Bus ``ay``."""
    data: bytes


@dataclass(frozen=True)
class Variant:
    signature: str  # one complete type among s, b, u, o, ay
    value: object


Arg = str | bool | int | ObjectPath | Bytes | Sequence[tuple[str, Variant]]


class _Writer:
    def __init__(self, start: int = 0) -> None:
        self.buf = bytearray()
        self.start = start  # the buffer's offset in the message (alignment is from the message's start)

    def align(self, n: int) -> None:
        self.buf.extend(b"\0" * (-(self.start + len(self.buf)) % n))

    def u32(self, v: int) -> None:
        self.align(4)
        self.buf.extend(struct.pack("<I", v))

    def string(self, s: str) -> None:
        raw = s.encode()
        if b"\0" in raw:
            raise ValueError(f"a D-Bus string cannot hold NUL: {s!r}")
        self.u32(len(raw))
        self.buf.extend(raw + b"\0")

    def signature(self, s: str) -> None:
        raw = s.encode()
        self.buf.extend(bytes([len(raw)]) + raw + b"\0")

    def value(self, sig: str, v: object) -> None:
        if sig in ("s", "o"):
            self.string(v.path if isinstance(v, ObjectPath) else str(v))
        elif sig == "b":
            self.u32(1 if v else 0)
        elif sig == "u":
            assert isinstance(v, int)
            self.u32(v)
        elif sig == "g":
            self.signature(str(v))
        elif sig == "ay":
            data = v.data if isinstance(v, Bytes) else bytes(v)  # type: ignore[call-overload]
            self.u32(len(data))
            self.buf.extend(data)
        elif sig == "a(sv)":
            assert not isinstance(v, str | bytes)
            self.u32(0)
            at = len(self.buf) - 4
            self.align(8)
            first = len(self.buf)
            for name, var in v:  # type: ignore[attr-defined]
                self.align(8)
                self.string(name)
                self.signature(var.signature)
                self.value(var.signature, var.value)
            struct.pack_into("<I", self.buf, at, len(self.buf) - first)
        else:
            raise ValueError(f"D-Bus type {sig!r} is not supported here")


def _split(signature: str) -> list[str]:
    """The complete types of a signature this module writes (s b u o g ay a(sv))."""
    out, i = [], 0
    while i < len(signature):
        for t in ("a(sv)", "ay"):
            if signature.startswith(t, i):
                out.append(t)
                i += len(t)
                break
        else:
            out.append(signature[i])
            i += 1
    return out


def marshal_call(serial: int, *, path: str, interface: str, member: str, destination: str | None,
                 signature: str = "", args: Sequence[object] = ()) -> bytes:
    """A METHOD_CALL message."""
    types = _split(signature)
    if len(types) != len(args):
        raise ValueError(f"signature {signature!r} has {len(types)} arguments, {len(args)} given")
    body = _Writer()
    for t, a in zip(types, args, strict=True):
        body.value(t, a)
    fields: list[tuple[int, str, object]] = [(F_PATH, "o", ObjectPath(path)), (F_INTERFACE, "s", interface),
                                             (F_MEMBER, "s", member)]
    if destination:
        fields.append((F_DESTINATION, "s", destination))
    if signature:
        fields.append((F_SIGNATURE, "g", signature))
    head = _Writer()
    head.buf.extend(b"l" + bytes([METHOD_CALL, 0, 1]) + struct.pack("<II", len(body.buf), serial))
    head.u32(0)
    first = len(head.buf)
    for code, sig, v in fields:
        head.align(8)
        head.buf.append(code)
        head.signature(sig)
        head.value(sig, v)
    struct.pack_into("<I", head.buf, 12, len(head.buf) - first)
    head.align(8)
    return bytes(head.buf + body.buf)


@dataclass(frozen=True)
class Message:
    type: int
    serial: int
    reply_serial: int | None
    error_name: str | None
    signature: str
    body: bytes

    def first_string(self) -> str:
        """The body's first argument when it is a string (an error's message), else ""."""
        if not self.signature.startswith("s") or len(self.body) < 4:
            return ""
        n, = struct.unpack_from("<I", self.body, 0)
        return self.body[4:4 + n].decode(errors="replace")


def message_length(head: bytes) -> int:
    """A message's whole length from its first 16 bytes."""
    if head[:1] != b"l" and head[:1] != b"B":
        raise DBusError("", f"not a D-Bus message (endianness byte {head[:1]!r})")
    fmt = "<" if head[:1] == b"l" else ">"
    body_len, _serial, fields_len = struct.unpack_from(fmt + "III", head, 4)
    total = int(16 + fields_len + (-(16 + fields_len) % 8) + body_len)
    if total > MAX_MESSAGE:
        raise DBusError("", f"a D-Bus message of {total} bytes")
    return total


def parse_message(data: bytes) -> Message:
    """A whole message's header fields this client needs, and its body."""
    fmt = "<" if data[:1] == b"l" else ">"
    kind = data[1]
    body_len, serial, fields_len = struct.unpack_from(fmt + "III", data, 4)
    pos, end = 16, 16 + fields_len
    reply_serial: int | None = None
    error_name: str | None = None
    signature = ""
    while pos < end:
        pos += -pos % 8
        code = data[pos]
        sig_len = data[pos + 1]
        sig = data[pos + 2:pos + 2 + sig_len].decode()
        pos += 3 + sig_len
        if sig in ("s", "o"):
            pos += -pos % 4
            n, = struct.unpack_from(fmt + "I", data, pos)
            value: object = data[pos + 4:pos + 4 + n].decode(errors="replace")
            pos += 5 + n
        elif sig == "u":
            pos += -pos % 4
            value, = struct.unpack_from(fmt + "I", data, pos)
            pos += 4
        elif sig == "g":
            n = data[pos]
            value = data[pos + 1:pos + 1 + n].decode()
            pos += 2 + n
        else:
            raise DBusError("", f"unexpected header field type {sig!r}")
        if code == F_REPLY_SERIAL:
            reply_serial = int(value)  # type: ignore[call-overload]
        elif code == F_ERROR_NAME:
            error_name = str(value)
        elif code == F_SIGNATURE:
            signature = str(value)
    start = end + (-end % 8)
    return Message(kind, serial, reply_serial, error_name, signature, data[start:start + body_len])


class DBusConnection:
    """``await DBusConnection.open(path, bus=...)``; ``await call(...)``; ``await close()``. ``bus``: a message bus
    (``Hello`` first) rather than a direct peer."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader, self._writer = reader, writer
        self._serial = 0
        self._pending: dict[int, asyncio.Future[Message]] = {}
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] = asyncio.create_task(self._read_loop())
        self.closed = False

    @classmethod
    async def open(cls, path: str, *, bus: bool, timeout: float = 10.0) -> DBusConnection:
        reader, writer = await asyncio.wait_for(asyncio.open_unix_connection(path), timeout)
        try:
            writer.write(b"\0AUTH EXTERNAL " + str(os.geteuid()).encode().hex().encode() + b"\r\n")
            await writer.drain()
            line = await asyncio.wait_for(reader.readline(), timeout)
            if not line.startswith(b"OK "):
                raise DBusError("", f"{path}: authentication refused ({line.strip().decode(errors='replace')})")
            writer.write(b"BEGIN\r\n")
            await writer.drain()
        except BaseException:
            writer.close()
            raise
        conn = cls(reader, writer)
        if bus:
            try:
                await conn.call(path="/org/freedesktop/DBus", interface="org.freedesktop.DBus", member="Hello",
                                destination="org.freedesktop.DBus", timeout=timeout)
            except BaseException:
                await conn.close()
                raise
        return conn

    async def _read_loop(self) -> None:
        error = "the connection was closed"
        try:
            while True:
                head = await self._reader.readexactly(16)
                rest = await self._reader.readexactly(message_length(head) - 16)
                msg = parse_message(head + rest)
                if msg.type in (METHOD_RETURN, ERROR) and msg.reply_serial is not None:
                    fut = self._pending.pop(msg.reply_serial, None)
                    if fut is not None and not fut.done():
                        fut.set_result(msg)
        except (asyncio.IncompleteReadError, OSError, DBusError) as e:
            error = f"the connection was lost ({e})"
        finally:
            self.closed = True
            for fut in self._pending.values():
                if not fut.done():
                    fut.set_exception(DBusError("", error))
            self._pending.clear()

    async def call(self, *, path: str, interface: str, member: str, destination: str | None,
                   signature: str = "", args: Sequence[object] = (), timeout: float = 30.0) -> Message:
        """Send a method call and wait for its reply; DBusError for an error reply or a lost connection."""
        if self.closed:
            raise DBusError("", "the connection is closed")
        async with self._lock:  # serials in order on the wire
            self._serial += 1
            serial = self._serial
            fut: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
            self._pending[serial] = fut
            self._writer.write(marshal_call(serial, path=path, interface=interface, member=member,
                                            destination=destination, signature=signature, args=args))
            await self._writer.drain()
        try:
            msg = await asyncio.wait_for(fut, timeout)
        finally:
            self._pending.pop(serial, None)
        if msg.type == ERROR:
            raise DBusError(msg.error_name or "org.freedesktop.DBus.Error.Failed", msg.first_string())
        return msg

    async def close(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._writer.close()
        with contextlib.suppress(OSError):
            await self._writer.wait_closed()
