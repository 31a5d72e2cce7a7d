"""A test peer playing the runtime's side of NRI over a real unix socket: it listens, accepts the plugin's
connections and speaks the trunk protocol with its own few lines of framing (not the plugin's code), so a framing
bug cannot hide on both sides at once. It records every frame the plugin sends (to judge the Go-reader rule)."""

from __future__ import annotations

import asyncio
import contextlib
import struct
from dataclasses import dataclass, field
from typing import Any

from protos import nri_pb2, ttrpc_pb2

PLUGIN = "nri.pkg.api.v1alpha1.Plugin"
RUNTIME = "nri.pkg.api.v1alpha1.Runtime"
WAIT = 30.0  # seconds: a bound on waiting for the plugin (a hang fails, it does not block the suite)


@dataclass
class Msg:
    conn: int
    stream: int
    kind: int
    flags: int
    data: bytes


@dataclass
class PeerConn:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    frames: list[tuple[int, int]] = field(default_factory=list)  # (ConnID, payload length) of what the plugin sent
    _bufs: dict[int, bytearray] = field(default_factory=dict)
    _inbox: list[Msg] = field(default_factory=list)
    next_stream: int = 1

    # -- raw bytes ---------------------------------------------------------------------------------------------
    def write_frame(self, conn: int, payload: bytes) -> None:
        self.writer.write(struct.pack(">II", conn, len(payload)) + payload)

    def write_message(self, conn: int, stream: int, kind: int, data: bytes) -> None:
        self.write_frame(conn, struct.pack(">IIBB", len(data), stream, kind, 0) + data)

    async def _read_frame(self) -> None:
        head = await self.reader.readexactly(8)
        conn, length = struct.unpack(">II", head)
        payload = await self.reader.readexactly(length)
        self.frames.append((conn, length))
        buf = self._bufs.setdefault(conn, bytearray())
        buf += payload
        while len(buf) >= 10:
            n, stream, kind, flags = struct.unpack_from(">IIBB", buf)
            if len(buf) < 10 + n:
                break
            self._inbox.append(Msg(conn, stream, kind, flags, bytes(buf[10:10 + n])))
            del buf[:10 + n]

    async def next_message(self, conn: int, stream: int | None = None) -> Msg:
        async def find() -> Msg:
            while True:
                for m in self._inbox:
                    if m.conn == conn and (stream is None or m.stream == stream):
                        self._inbox.remove(m)
                        return m
                await self._read_frame()
        return await asyncio.wait_for(find(), WAIT)

    async def closed_by_plugin(self) -> bool:
        """Whether the plugin closes the connection (EOF) without sending anything more."""
        try:
            data = await asyncio.wait_for(self.reader.read(1 << 16), WAIT)
        except ConnectionResetError:
            return True
        return data == b""

    # -- ttrpc -------------------------------------------------------------------------------------------------
    def send_call(self, method: str, request: Any, *, stream: int | None = None, service: str = PLUGIN,
                  timeout_nano: int = 0) -> int:
        sid = self.next_stream if stream is None else stream
        self.next_stream = max(self.next_stream, sid + 2)
        env = ttrpc_pb2.Request(service=service, method=method, payload=request.SerializeToString(),
                                timeout_nano=timeout_nano)
        self.write_message(1, sid, 1, env.SerializeToString())
        return sid

    async def response(self, stream: int) -> ttrpc_pb2.Response:
        m = await self.next_message(1, stream)
        assert m.kind == 2 and m.flags == 0, m
        return ttrpc_pb2.Response.FromString(m.data)

    async def call(self, method: str, request: Any, response_type: Any, **kw: Any) -> Any:
        resp = await self.response(self.send_call(method, request, **kw))
        assert resp.status.code == 0, resp.status
        return response_type.FromString(resp.payload)

    async def plugin_call(self) -> tuple[int, ttrpc_pb2.Request]:
        """The plugin's next call to the runtime (ConnID 2)."""
        m = await self.next_message(2)
        assert m.kind == 1 and m.flags == 0, m
        return m.stream, ttrpc_pb2.Request.FromString(m.data)

    def reply(self, stream: int, payload: bytes = b"", code: int = 0, message: str = "") -> None:
        resp = ttrpc_pb2.Response(status=ttrpc_pb2.Status(code=code, message=message), payload=payload)
        self.write_message(2, stream, 2, resp.SerializeToString())

    async def handshake(self, *, version: str = "2.1.9", request_timeout: int = 2000,
                        sync: nri_pb2.SynchronizeRequest | None = None) -> tuple[nri_pb2.RegisterPluginRequest,
                                                                             nri_pb2.ConfigureResponse]:
        """What containerd does on a new connection: RegisterPlugin's handler returns, Configure is sent before
        RegisterPlugin's reply, then one Synchronize."""
        stream, req = await self.plugin_call()
        assert (req.service, req.method) == (RUNTIME, "RegisterPlugin")
        register = nri_pb2.RegisterPluginRequest.FromString(req.payload)
        sid = self.send_call("Configure", nri_pb2.ConfigureRequest(runtime_name="containerd", runtime_version=version,
                                                                    request_timeout=request_timeout,
                                                                    registration_timeout=5000))
        self.reply(stream, nri_pb2.Empty().SerializeToString())
        resp = await self.response(sid)
        assert resp.status.code == 0, resp.status
        configured = nri_pb2.ConfigureResponse.FromString(resp.payload)
        await self.call("Synchronize", sync or nri_pb2.SynchronizeRequest(), nri_pb2.SynchronizeResponse)
        return register, configured

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.writer.close()


class Peer:
    """``await Peer(path).start()``; ``await peer.accept()`` gives the plugin's next connection."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._conns: asyncio.Queue[PeerConn] = asyncio.Queue()
        self._server: asyncio.AbstractServer | None = None
        self._open: list[PeerConn] = []

    async def start(self) -> Peer:
        async def accepted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            conn = PeerConn(reader, writer)
            self._open.append(conn)
            await self._conns.put(conn)

        self._server = await asyncio.start_unix_server(accepted, self.path)
        return self

    async def accept(self) -> PeerConn:
        return await asyncio.wait_for(self._conns.get(), WAIT)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for c in self._open:
            c.close()
        if self._server is not None:
            await self._server.wait_closed()
