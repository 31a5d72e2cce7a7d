"""The frame relay attacked: byte streams cut and merged at random, frames gRPC libraries rarely send (padding,
priority, CONTINUATION), edited messages larger than a frame and than the flow-control windows, callers that
cancel, time out or vanish mid-call, a runtime killed under load, a bad preface, many connections at once.

Real parts throughout: the in-memory CRI runtime (a grpc.aio server) or its process, gRPC clients over unix
sockets; a raw HTTP/2 client (hpack + hand-made frames) only where a gRPC library cannot be made to send the
frames under test."""

from __future__ import annotations

import asyncio
import contextlib
import random
import signal
import socket
import struct
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import grpc
import grpc.aio
import hpack
import pytest

from criproxy.relay import h2wire as h2
from criproxy.relay.frame_server import FrameRelayServer, start_frame_relay_server
from criproxy.relay.grpc_relay import Forward, Interceptor, Rejection, RelayHandler, Upstream
from numapin_lab.cri.client import CRIClient, pb
from numapin_lab.cri.memory_runtime import MemoryRuntime

ROOT = Path(__file__).resolve().parents[2]
ECHO = "/runtime.v1.RuntimeService/Echo"
VERSION = "/runtime.v1.RuntimeService/Version"


class Chopper:
    """A unix socket in front of ``target`` that passes bytes on in both directions cut into pieces of random size
    (seeded), sometimes after a pause (so the reader gets several writes merged)."""

    def __init__(self, target: str, path: str, seed: int) -> None:
        self.target, self.path = target, path
        self.rng = random.Random(seed)
        self.server: asyncio.AbstractServer | None = None
        self.tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> Chopper:
        self.server = await asyncio.start_unix_server(self._serve, self.path)
        return self

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_unix_connection(self.target)

        async def pipe(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            with contextlib.suppress(ConnectionError):
                while data := await r.read(65536):
                    pos = 0
                    while pos < len(data):
                        n = self.rng.choice((1, 2, 3, 5, 8, 9, 10, 17, 100, 4096, 20000))
                        w.write(data[pos:pos + n])
                        pos += n
                        await w.drain()
                        if self.rng.random() < 0.3:
                            await asyncio.sleep(self.rng.choice((0, 0.0005, 0.002)))
            w.close()

        t = asyncio.ensure_future(asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer)))
        self.tasks.add(t)  # type: ignore[arg-type]
        t.add_done_callback(self.tasks.discard)  # type: ignore[arg-type]

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
        for t in list(self.tasks):
            t.cancel()


@contextlib.asynccontextmanager
async def raw_runtime(tmp: Path) -> AsyncIterator[tuple[str, list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]]]:
    """A "runtime" that only accepts connections on a unix socket and keeps them, for a test to speak hand-made
    frames on: yields its socket path and the connections as they come (all closed at the end)."""
    path = str(tmp / "raw-rt.sock")
    conns: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def serve(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        conns.append((r, w))

    server = await asyncio.start_unix_server(serve, path)
    try:
        yield path, conns
    finally:
        server.close()
        for _, w in conns:
            w.close()


@contextlib.asynccontextmanager
async def frame_relay(tmp: Path, runtime_path: str, interceptors: dict[str, Interceptor] | None = None,
                      name: str = "fr.sock") -> AsyncIterator[tuple[str, FrameRelayServer]]:
    upstream = Upstream(runtime_path)
    path = str(tmp / name)
    server = await start_frame_relay_server(path, RelayHandler(upstream, interceptors or {}))
    try:
        yield path, server
    finally:
        await server.stop(0)
        await upstream.close()


async def eventually(check: Callable[[], bool], what: str, tries: int = 500) -> None:
    for _ in range(tries):
        if check():
            return
        await asyncio.sleep(0.02)
    pytest.fail(f"never: {what}")


def grow(n: int) -> Interceptor:
    """An interceptor of Version that forwards a request ``n`` bytes longer and answers a response ``n`` bytes
    longer than the runtime's."""

    async def version(request: bytes, forward: Forward) -> bytes:
        req = pb.VersionRequest.FromString(request)
        out = pb.VersionResponse.FromString(await forward(pb.VersionRequest(version=req.version + "v" * n)
                                                          .SerializeToString()))
        out.runtime_version += "r" * n
        return out.SerializeToString()

    return version


# --- a raw HTTP/2 client -------------------------------------------------------------------------------------------

class RawClient:
    """Hand-made HTTP/2 frames over a unix socket (for what gRPC libraries do not send)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.encoder = hpack.Encoder()
        self.decoder = hpack.Decoder()
        self.sid = -1

    @classmethod
    async def connect(cls, path: str) -> RawClient:
        r, w = await asyncio.open_unix_connection(path)
        c = cls(r, w)
        w.write(h2.PREFACE + h2.settings_frame([]))
        return c

    def request_frames(self, method: str, message: bytes, *, padded: bool = False, padded_headers: bool = False,
                       priority: bool = False, split_block: int = 0,
                       metadata: tuple[tuple[str, str], ...] = ()) -> tuple[int, list[bytes]]:
        self.sid += 2
        sid = self.sid
        block = self.encoder.encode([(":method", "POST"), (":scheme", "http"), (":path", method),
                                     (":authority", "localhost"), ("content-type", "application/grpc"),
                                     ("te", "trailers"), *metadata])
        frames = []
        parts = [block] if not split_block else [block[i:i + split_block] for i in range(0, len(block), split_block)]
        first = parts[0]
        flags = h2.END_HEADERS if len(parts) == 1 else 0
        # grpc's C core (the in-memory runtime) misreads padded HEADERS frames (kubelet sends none); grpc-go reads them
        if padded_headers:
            frames.append(h2.frame(h2.HEADERS, flags | h2.PADDED, sid, bytes((7,)) + first + b"\0" * 7))
        elif priority:
            frames.append(h2.frame(h2.HEADERS, flags | h2.PRIORITY_FLAG, sid, struct.pack(">IB", 0, 15) + first))
        else:
            frames.append(h2.frame(h2.HEADERS, flags, sid, first))
        for i, part in enumerate(parts[1:], 1):
            frames.append(h2.frame(h2.CONTINUATION, h2.END_HEADERS if i == len(parts) - 1 else 0, sid, part))
        body = b"\0" + len(message).to_bytes(4, "big") + message
        half = len(body) // 2
        for i, chunk in enumerate((body[:half], body[half:])):
            flags = h2.END_STREAM if i == 1 else 0
            if padded:
                frames.append(h2.frame(h2.DATA, flags | h2.PADDED, sid, bytes((3,)) + chunk + b"\0\0\0"))
            else:
                frames.append(h2.frame(h2.DATA, flags, sid, chunk))
        return sid, frames

    async def read_frame(self) -> tuple[int, int, int, bytes]:
        head = await self.reader.readexactly(9)
        hi, lo, ftype, flags, sid = h2.FRAME_HEADER.unpack(head)
        payload = await self.reader.readexactly(hi << 16 | lo)
        return ftype, flags, sid & 0x7FFFFFFF, payload

    async def response(self, sid: int) -> tuple[dict[str, str], bytes]:
        """Headers (initial and trailing merged) and the message of stream ``sid``."""
        headers: dict[str, str] = {}
        data = b""
        block = b""
        while True:
            ftype, flags, fsid, payload = await self.read_frame()
            if ftype == h2.SETTINGS and not flags & h2.ACK:
                self.writer.write(h2.frame(h2.SETTINGS, h2.ACK, 0))
            elif ftype == h2.PING and not flags & h2.ACK:
                self.writer.write(h2.frame(h2.PING, h2.ACK, 0, payload))
            elif fsid != sid:
                continue
            elif ftype in (h2.HEADERS, h2.CONTINUATION):
                if ftype == h2.HEADERS:
                    end_stream = bool(flags & h2.END_STREAM)
                    payload = h2.header_block_fragment(flags, payload)
                block += payload
                if flags & h2.END_HEADERS:
                    headers.update(dict(self.decoder.decode(block)))
                    block = b""
                    if end_stream:
                        return headers, data[5:]
            elif ftype == h2.DATA:
                data += payload
                if payload:
                    self.writer.write(h2.window_update(0, len(payload)) + h2.window_update(sid, len(payload)))
                if flags & h2.END_STREAM:
                    return headers, data[5:]
            elif ftype == h2.RST_STREAM:
                raise AssertionError(f"stream {sid} reset: {payload.hex()}")

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(ConnectionError, TimeoutError):
            await asyncio.wait_for(self.writer.wait_closed(), 10)


# --- the tests -----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_byte_streams_cut_at_random_both_sides(short_tmp: Path, runtime: MemoryRuntime, seed: int) -> None:
    """kubelet -> chopper -> relay -> chopper -> runtime: every answer as direct, edits and big messages included."""
    back = await Chopper(runtime.socket_path, str(short_tmp / "back.sock"), seed).start()
    async with frame_relay(short_tmp, back.path, {"Version": grow(20_000)}) as (relay, _):
        front = await Chopper(relay, str(short_tmp / "front.sock"), seed + 100).start()
        try:
            async with CRIClient(front.path) as k, CRIClient(runtime.socket_path) as direct:
                cfg = k.sandbox_config("p", f"uid-chop-{seed}")
                sid = await k.run_pod_sandbox(cfg)
                runtime.add_containers(sid, 300)
                rng = random.Random(seed)

                async def one(i: int) -> None:
                    kind = rng.choice(("version", "list", "missing", "echo"))
                    if kind == "version":
                        v = await k.version()
                        assert v.runtime_version == "1" + "r" * 20_000
                        assert runtime.requests("Version")[-1] == pb.VersionRequest(
                            version="v1" + "v" * 20_000).SerializeToString()
                    elif kind == "list":
                        assert len(await k.list_containers()) == len(await direct.list_containers()) == 300
                    elif kind == "missing":
                        with pytest.raises(grpc.aio.AioRpcError) as err:
                            await k.container_status(f"nope-{i}")
                        assert err.value.code() == grpc.StatusCode.NOT_FOUND
                    else:
                        payload = rng.randbytes(rng.choice((0, 1, 16_383, 16_384, 70_000, 300_000)))
                        assert await k.channel.unary_unary(ECHO)(payload, timeout=60) == payload

                for _ in range(4):
                    await asyncio.gather(*(one(i) for i in range(12)))
        finally:
            await front.stop()
    await back.stop()


async def test_edits_beyond_frames_and_windows_keep_flow_control_exact(short_tmp: Path,
                                                                       runtime: MemoryRuntime) -> None:
    """Requests and responses grown by more than a frame and more than a stream's window (64 KiB), and shrunk,
    on one connection with large relayed messages in between: nothing stalls and nothing overflows a window."""
    sizes = [200_000, 0, 70_000, 100, 1_000_000] * 4  # 0: request and response shrunk

    async def version(request: bytes, forward: Forward) -> bytes:
        n = sizes[len(runtime.requests("Version"))]
        out = pb.VersionResponse.FromString(await forward(pb.VersionRequest(version="x" * n).SerializeToString()))
        out.runtime_version = "y" * n
        return out.SerializeToString()

    async with frame_relay(short_tmp, runtime.socket_path, {"Version": version}) as (relay, _), \
            CRIClient(relay) as k:
        echo = k.channel.unary_unary(ECHO)
        for i in range(20):
            v = await k.version()
            assert runtime.requests("Version")[-1] == pb.VersionRequest(version="x" * sizes[i]).SerializeToString()
            assert v.runtime_version == "y" * sizes[i]
            payload = bytes([i]) * (900_000 + i)
            assert await echo(payload, timeout=60) == payload


async def test_priority_and_continuation_from_a_raw_client(short_tmp: Path, runtime: MemoryRuntime) -> None:
    """Header blocks split over CONTINUATION frames, PRIORITY fields, padded DATA of a held stream (the relay
    re-frames it; the in-memory runtime's gRPC core refuses padding itself: see the containerd test for padding
    relayed verbatim)."""
    async with frame_relay(short_tmp, runtime.socket_path, {"Version": grow(5)}) as (relay, _):
        c = await RawClient.connect(relay)
        try:
            for method, padded, priority, split in ((VERSION, True, False, 7), (VERSION, False, True, 3),
                                                    (ECHO, False, True, 5), (ECHO, False, False, 0),
                                                    (VERSION, True, True, 1)):
                msg = pb.VersionRequest(version="raw").SerializeToString()
                sid, frames = c.request_frames(method, msg, padded=padded, priority=priority, split_block=split,
                                               metadata=(("x-trace", "t-raw"),))
                c.writer.write(b"".join(frames))
                headers, body = await asyncio.wait_for(c.response(sid), 30)
                assert headers["grpc-status"] == "0", headers
                if method == VERSION:
                    assert pb.VersionResponse.FromString(body).runtime_version == "1rrrrr"
                    assert runtime.requests("Version")[-1] == pb.VersionRequest(version="rawvvvvv").SerializeToString()
                else:
                    assert body == msg
                assert ("x-trace", "t-raw") in runtime.calls[-1].metadata
        finally:
            await c.close()


@pytest.mark.containerd
async def test_padded_frames_relayed_to_containerd(short_tmp: Path) -> None:
    """Padded HEADERS and DATA, held (Version, intercepted) and relayed verbatim (Status), to a grpc-go peer."""
    from numapin_lab.cri.containerd import ContainerdLab

    lab = ContainerdLab(short_tmp / "ctrd")
    await asyncio.to_thread(lab.start)
    try:
        async with frame_relay(short_tmp, lab.socket, {"Version": grow(5)}) as (relay, _):
            c = await RawClient.connect(relay)
            try:
                for method, split in ((VERSION, 0), ("/runtime.v1.RuntimeService/Status", 4), (VERSION, 2)):
                    msg = pb.VersionRequest(version="v1").SerializeToString() if method == VERSION else b""
                    sid, frames = c.request_frames(method, msg, padded=True, padded_headers=True, split_block=split)
                    c.writer.write(b"".join(frames))
                    headers, body = await asyncio.wait_for(c.response(sid), 30)
                    assert headers["grpc-status"] == "0", headers
                    if method == VERSION:
                        assert pb.VersionResponse.FromString(body).runtime_name == "containerd"
                        assert pb.VersionResponse.FromString(body).runtime_version.endswith("rrrrr")
                    else:
                        assert pb.StatusResponse.FromString(body).status.conditions
            finally:
                await c.close()
    finally:
        await asyncio.to_thread(lab.stop)


@pytest.mark.containerd
async def test_a_grpc_go_client_through_the_relay(short_tmp: Path) -> None:
    """containerd's own ``ctr`` (a grpc-go client, as kubelet is) against containerd (a grpc-go server) through the
    frame relay: its non-CRI services pass untouched, answers as direct; CRI from a Python client on the same relay."""
    from numapin_lab.cri.containerd import ContainerdLab

    lab = ContainerdLab(short_tmp / "ctrd")
    await asyncio.to_thread(lab.start)
    try:
        async with frame_relay(short_tmp, lab.socket, {"Version": grow(2)}) as (relay, server):
            async def ctr(address: str, *args: str) -> str:
                p = await asyncio.create_subprocess_exec("ctr", "--address", address, *args,
                                                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                out, err = await asyncio.wait_for(p.communicate(), 60)
                assert p.returncode == 0, err.decode()
                return out.decode()

            for args in (("version",), ("namespaces", "ls"), ("-n", "k8s.io", "images", "ls"), ("plugins", "ls")):
                assert await ctr(relay, *args) == await ctr(lab.socket, *args)
            async with CRIClient(relay) as k:
                assert (await k.version()).runtime_version.endswith("rr")
                assert [i.repo_tags for i in await k.list_images()]
            await eventually(lambda: server.connections == 0, "the clients' connections close")
    finally:
        await asyncio.to_thread(lab.stop)


async def test_bad_preface_closes_that_connection_only(short_tmp: Path, runtime: MemoryRuntime) -> None:
    async with frame_relay(short_tmp, runtime.socket_path) as (relay, server):
        for garbage in (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", b"PRI * HTTP/2.0\r\n\r\nXX\r\n\r\n" + b"\0" * 30):
            r, w = await asyncio.open_unix_connection(relay)
            w.write(garbage)
            answer = await asyncio.wait_for(r.read(), 20)  # closed: the runtime's connection frames at most
            pos = 0
            while pos < len(answer):
                hi, lo, ftype, _, _ = h2.FRAME_HEADER.unpack_from(answer, pos)
                assert ftype not in (h2.HEADERS, h2.CONTINUATION, h2.DATA), answer  # no call answered
                pos += 9 + (hi << 16 | lo)
            w.close()
        await eventually(lambda: server.connections == 0, "the bad connections are forgotten")
        async with CRIClient(relay) as k:
            assert (await k.version()).runtime_name == "memory"


async def test_intercepted_request_beyond_the_held_limit_closes_that_connection(
        short_tmp: Path, runtime: MemoryRuntime, monkeypatch: pytest.MonkeyPatch) -> None:
    """An intercepted request is held in memory until complete, its data credited back at once: one larger than the
    limit (64 MiB + 5 in production, 64 KiB here) closes that connection before the decision; others go on."""
    from criproxy.relay import frame_held
    monkeypatch.setattr(frame_held, "MAX_HELD", 64 * 1024)
    entered = asyncio.Event()

    async def version(request: bytes, forward: Forward) -> bytes:
        entered.set()
        return await forward(request)

    async with frame_relay(short_tmp, runtime.socket_path, {"Version": version}) as (relay, server):
        c = await RawClient.connect(relay)
        _, frames = c.request_frames(VERSION, pb.VersionRequest(version="x" * 100_000).SerializeToString())
        c.writer.write(b"".join(frames))
        await c.writer.drain()
        rest = await asyncio.wait_for(c.reader.read(), 20)  # the proxy closes the connection
        pos = 0
        while pos < len(rest):
            hi, lo, ftype, _, _ = h2.FRAME_HEADER.unpack_from(rest, pos)
            assert ftype not in (h2.HEADERS, h2.DATA), rest[:200]  # never answered
            pos += 9 + (hi << 16 | lo)
        await c.close()
        assert not entered.is_set() and not runtime.requests("Version")
        await eventually(lambda: server.connections == 0, "the connection is forgotten")
        async with CRIClient(relay) as k:
            assert (await k.version()).runtime_name == "memory"
        assert entered.is_set()


async def test_client_vanishing_mid_request_and_mid_decision(short_tmp: Path, runtime: MemoryRuntime) -> None:
    """A half-sent intercepted request is dropped; a complete one whose client leaves during the decision is carried
    through to the runtime; the connections are closed afterwards."""
    entered, release = asyncio.Event(), asyncio.Event()

    async def version(request: bytes, forward: Forward) -> bytes:
        entered.set()
        await release.wait()
        return await forward(request)

    async with frame_relay(short_tmp, runtime.socket_path, {"Version": version}) as (relay, server):
        c = await RawClient.connect(relay)
        _, frames = c.request_frames(VERSION, pb.VersionRequest(version="half").SerializeToString())
        c.writer.write(b"".join(frames[:-1]))  # the last DATA frame (END_STREAM) never comes
        await c.writer.drain()
        await asyncio.sleep(0.2)
        await c.close()
        await eventually(lambda: server.connections == 0, "the half-sent request's connections close")
        assert not entered.is_set() and not runtime.requests("Version")

        c = await RawClient.connect(relay)
        _, frames = c.request_frames(VERSION, pb.VersionRequest(version="whole").SerializeToString())
        c.writer.write(b"".join(frames))
        await asyncio.wait_for(entered.wait(), 20)
        await c.close()
        await asyncio.sleep(0.2)
        assert server.connections == 1  # kept for the decision in flight
        release.set()
        await eventually(lambda: bool(runtime.requests("Version")), "the decision reaches the runtime")
        assert runtime.requests("Version")[-1] == pb.VersionRequest(version="whole").SerializeToString()
        await eventually(lambda: server.connections == 0, "the connections close after the decision")


@pytest.mark.parametrize("then", ["forward", "reject"])
async def test_cancel_while_the_interceptor_runs(short_tmp: Path, runtime: MemoryRuntime, then: str) -> None:
    """kubelet resets the stream (a cancelled call) during the decision: the decision is carried through (forwarded,
    or the upstream stream reset when rejected) and the connection goes on serving."""
    entered, release = asyncio.Event(), asyncio.Event()
    outcome: list[str] = []

    async def version(request: bytes, forward: Forward) -> bytes:
        entered.set()
        await release.wait()
        if then == "reject":
            outcome.append("rejected")
            raise Rejection(grpc.StatusCode.FAILED_PRECONDITION, "numapin: no")
        response = await forward(pb.VersionRequest(version="after-cancel").SerializeToString())
        outcome.append("forwarded")
        return response

    async with frame_relay(short_tmp, runtime.socket_path, {"Version": version}) as (relay, _), \
            CRIClient(relay) as k:
        call = k.channel.unary_unary(VERSION)(pb.VersionRequest(version="v1").SerializeToString(), timeout=30)
        await asyncio.wait_for(entered.wait(), 20)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        release.set()
        await eventually(lambda: bool(outcome), "the decision finishes")
        if then == "forward":
            await eventually(lambda: bool(runtime.requests("Version")), "the forwarded request reaches the runtime")
            assert runtime.requests("Version")[-1] == pb.VersionRequest(version="after-cancel").SerializeToString()
        else:
            assert not runtime.requests("Version")
        entered.clear()
        release.set()
        assert (await k.call("Status", pb.StatusRequest(), pb.StatusResponse)).status is not None


async def test_deadline_passes_during_the_decision(short_tmp: Path, runtime: MemoryRuntime) -> None:
    seen: list[grpc.StatusCode] = []

    async def version(request: bytes, forward: Forward) -> bytes:
        assert forward.timeout is not None and forward.timeout < 1.0
        await asyncio.sleep(1.5)
        try:
            return await forward(request)
        except grpc.aio.AioRpcError as e:
            seen.append(e.code())
            raise

    async with frame_relay(short_tmp, runtime.socket_path, {"Version": version}) as (relay, _), \
            CRIClient(relay) as k:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await k.call("Version", pb.VersionRequest(), pb.VersionResponse, timeout=0.5)
        assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        await eventually(lambda: bool(seen), "the decision's forward ends")
        assert seen == [grpc.StatusCode.DEADLINE_EXCEEDED]  # the runtime had the deadline too
        assert (await k.list_images())  # the connection is fine


async def test_many_connections_at_once(short_tmp: Path, runtime: MemoryRuntime) -> None:
    async with frame_relay(short_tmp, runtime.socket_path, {"Version": grow(3)}) as (relay, server):
        # a subchannel pool of its own per channel: one connection each (like 30 kubelets)
        channels = [grpc.aio.insecure_channel("unix:" + relay, options=(("grpc.use_local_subchannel_pool", 1),))
                    for _ in range(30)]
        try:
            async def work(ch: grpc.aio.Channel, i: int) -> None:
                version = ch.unary_unary(VERSION)
                for j in range(6):
                    raw = await version(pb.VersionRequest(version="v1").SerializeToString(), timeout=60)
                    assert pb.VersionResponse.FromString(raw).runtime_version == "1rrr"
                    payload = f"{i}-{j}".encode() * 50
                    assert await ch.unary_unary(ECHO)(payload, timeout=60) == payload

            await asyncio.gather(*(work(ch, i) for i, ch in enumerate(channels)))
            assert server.connections == 30
        finally:
            for ch in channels:
                await ch.close()
        await eventually(lambda: server.connections == 0, "every connection closes with its client")


def _runtime_process(path: str, bulk: int) -> subprocess.Popen[bytes]:
    p = subprocess.Popen([sys.executable, "-m", "numapin_lab.cri.memory_runtime", path, "--bulk", str(bulk)],
                         cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert p.stdout is not None
    assert p.stdout.readline() == b"ready\n"
    return p


async def version_once_back(k: CRIClient) -> pb.VersionResponse:
    """Version, tried until the runtime is back (UNAVAILABLE meanwhile)."""
    for _ in range(300):
        try:
            return await k.version()
        except grpc.aio.AioRpcError as e:
            assert e.code() == grpc.StatusCode.UNAVAILABLE
            await asyncio.sleep(0.1)
    pytest.fail("never reconnected to the restarted runtime")


async def test_runtime_killed_under_load_then_back(short_tmp: Path) -> None:
    """SIGKILL of the runtime with calls in flight: they fail UNAVAILABLE (kubelet's connection is closed, as a
    direct connection would be), none hangs; once the runtime is back, calls go through again."""
    rt_path = str(short_tmp / "rt.sock")
    rt = _runtime_process(rt_path, 2000)
    try:
        async with frame_relay(short_tmp, rt_path, {"Version": grow(1)}) as (relay, server), \
                CRIClient(relay) as k:
            assert len(await k.list_containers()) == 2000
            calls = [asyncio.ensure_future(k.list_containers()) for _ in range(8)]
            calls += [asyncio.ensure_future(k.version()) for _ in range(4)]
            await asyncio.sleep(0.05)
            rt.send_signal(signal.SIGKILL)
            rt.wait()
            results = await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), 30)
            for r in results:
                if isinstance(r, BaseException):
                    assert isinstance(r, grpc.aio.AioRpcError) and r.code() == grpc.StatusCode.UNAVAILABLE, r
            with pytest.raises(grpc.aio.AioRpcError) as err:  # runtime gone: fail fast
                await k.version()
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
            rt = _runtime_process(rt_path, 10)
            assert (await version_once_back(k)).runtime_version == "1r"
            assert len(await k.list_containers()) == 10
            assert server.connections == 1
    finally:
        rt.kill()
        rt.wait()


async def test_runtime_goaway_on_graceful_stop(short_tmp: Path) -> None:
    """The runtime stops gracefully (GOAWAY, passed to kubelet) and a new one takes its socket: kubelet's
    channel moves to a new connection."""
    rt_path = str(short_tmp / "rt.sock")
    rt = await MemoryRuntime(rt_path).start()
    async with frame_relay(short_tmp, rt_path) as (relay, _), CRIClient(relay) as k:
        assert (await k.version()).runtime_name == "memory"
        await rt.stop()
        rt = await MemoryRuntime(rt_path).start()
        try:
            for _ in range(300):
                try:
                    assert (await k.version()).runtime_name == "memory"
                    break
                except grpc.aio.AioRpcError as e:
                    assert e.code() == grpc.StatusCode.UNAVAILABLE
                    await asyncio.sleep(0.1)
            else:
                pytest.fail("never reached the new runtime")
            assert rt.calls and rt.calls[-1].method == "Version"
        finally:
            await rt.stop()




async def _read_until_ended(c: RawClient, sids: set[int]) -> dict[int, dict[str, str]]:
    """Each stream's headers (initial and trailing merged) until every stream of ``sids`` ended."""
    headers: dict[int, dict[str, str]] = {sid: {} for sid in sids}
    blocks: dict[int, bytes] = {}
    open_ = set(sids)
    while open_:
        ftype, flags, sid, payload = await c.read_frame()
        if ftype == h2.SETTINGS and not flags & h2.ACK:
            c.writer.write(h2.frame(h2.SETTINGS, h2.ACK, 0))
        elif sid not in open_:
            continue
        elif ftype in (h2.HEADERS, h2.CONTINUATION):
            if ftype == h2.HEADERS:
                payload = h2.header_block_fragment(flags, payload)
            blocks[sid] = blocks.get(sid, b"") + payload
            if flags & h2.END_HEADERS:
                headers[sid].update(dict(c.decoder.decode(blocks.pop(sid))))
            if flags & h2.END_STREAM:
                open_.discard(sid)
        elif ftype == h2.DATA:
            if payload:
                c.writer.write(h2.window_update(0, len(payload)) + h2.window_update(sid, len(payload)))
            if flags & h2.END_STREAM:
                open_.discard(sid)
        elif ftype == h2.RST_STREAM:
            raise AssertionError(f"stream {sid} reset: {payload.hex()}")
    return headers


async def test_own_frames_wait_for_a_relayed_header_block_to_end(short_tmp: Path, runtime: MemoryRuntime) -> None:
    """An edited message forwarded while kubelet's header block of another call is half relayed (HEADERS went,
    its CONTINUATION not yet) goes after the block: a frame between them is a connection error (RFC 9113 6.10)."""
    entered, release, forwarded = asyncio.Event(), asyncio.Event(), asyncio.Event()

    async def version(request: bytes, forward: Forward) -> bytes:
        entered.set()
        await release.wait()
        task = asyncio.ensure_future(forward(request))
        await asyncio.sleep(0.3)
        forwarded.set()
        return await task

    async with frame_relay(short_tmp, runtime.socket_path, {"Version": version}) as (relay, _):
        c = await RawClient.connect(relay)
        try:
            v_sid, v_frames = c.request_frames(VERSION, pb.VersionRequest(version="held").SerializeToString())
            c.writer.write(b"".join(v_frames))
            await asyncio.wait_for(entered.wait(), 20)
            e_sid, e_frames = c.request_frames(ECHO, pb.VersionRequest(version="echo").SerializeToString(),
                                               split_block=4)
            c.writer.write(e_frames[0])  # HEADERS without END_HEADERS
            await c.writer.drain()
            await asyncio.sleep(0.3)
            release.set()
            await asyncio.wait_for(forwarded.wait(), 20)
            c.writer.write(b"".join(e_frames[1:]))
            got = await asyncio.wait_for(_read_until_ended(c, {v_sid, e_sid}), 30)
            assert got[v_sid]["grpc-status"] == "0" and got[e_sid]["grpc-status"] == "0", got
            assert runtime.requests("Version")[-1] == pb.VersionRequest(version="held").SerializeToString()
        finally:
            await c.close()


async def test_kubelet_resetting_a_half_sent_intercepted_request(short_tmp: Path, runtime: MemoryRuntime) -> None:
    """kubelet resets an intercepted call before its request is complete: nothing is decided, the runtime's stream
    is reset too (it was opened by the HEADERS relayed at once) and the proxy keeps nothing of it."""
    entered = asyncio.Event()

    async def version(request: bytes, forward: Forward) -> bytes:
        entered.set()
        return await forward(request)

    async with frame_relay(short_tmp, runtime.socket_path, {"Version": version}) as (relay, server):
        c = await RawClient.connect(relay)
        try:
            sid, frames = c.request_frames(VERSION, pb.VersionRequest(version="half").SerializeToString())
            c.writer.write(b"".join(frames[:-1]) + h2.rst_stream(sid))
            await c.writer.drain()
            await eventually(lambda: server.connections == 1, "the relay accepts the connection")
            conns = list(server._shared.connections)
            await eventually(lambda: not conns[0].held, "the reset call is forgotten")
            sid2, frames2 = c.request_frames(VERSION, pb.VersionRequest(version="next").SerializeToString())
            c.writer.write(b"".join(frames2))
            got = await asyncio.wait_for(_read_until_ended(c, {sid2}), 30)
            assert got[sid2]["grpc-status"] == "0"
            assert runtime.requests("Version") == [pb.VersionRequest(version="next").SerializeToString()]
        finally:
            await c.close()


async def test_credits_wait_for_the_runtimes_header_block_to_end(short_tmp: Path) -> None:
    """The runtime's header block of a relayed call split over two reads (HEADERS, later its CONTINUATION) while
    kubelet sends an intercepted request: the credits the proxy writes to kubelet for it come after the
    CONTINUATION, never between (RFC 9113 6.10). The runtime here is hand-made frames on a unix socket."""
    async with (raw_runtime(short_tmp) as (rt_path, conns),
                frame_relay(short_tmp, rt_path, {"Version": grow(1)}) as (relay, _)):
        c = await RawClient.connect(relay)
        msg = pb.VersionRequest(version="x").SerializeToString()
        e_sid, e_frames = c.request_frames(ECHO, msg)
        c.writer.write(b"".join(e_frames))
        await eventually(lambda: bool(conns), "the relay connects to the runtime")
        rr, rw = conns[0]
        assert await rr.readexactly(24) == h2.PREFACE
        while True:  # kubelet's frames, relayed, up to the end of the Echo request
            hi, lo, ftype, flags, sid = h2.FRAME_HEADER.unpack(await rr.readexactly(9))
            await rr.readexactly(hi << 16 | lo)
            if ftype == h2.DATA and flags & h2.END_STREAM:
                break
        encoder = hpack.Encoder()
        encoder.header_table_size = 0
        block = encoder.encode([(":status", "200"), ("content-type", "application/grpc"),
                                ("x-initial", "i" * 200)])
        rw.write(h2.frame(h2.HEADERS, 0, e_sid, block[:20]))
        await rw.drain()
        await asyncio.sleep(0.3)
        _, v_frames = c.request_frames(VERSION, msg)  # held: the proxy credits its DATA back to kubelet
        c.writer.write(b"".join(v_frames))
        await c.writer.drain()
        await asyncio.sleep(0.3)
        rw.write(h2.frame(h2.CONTINUATION, h2.END_HEADERS, e_sid, block[20:]))
        await rw.drain()
        seen: list[tuple[int, int, int]] = []
        while not seen or seen[-1][0] != h2.CONTINUATION:
            ftype, flags, sid, _ = await asyncio.wait_for(c.read_frame(), 20)
            seen.append((ftype, flags, sid))
        split = seen.index((h2.HEADERS, 0, e_sid))
        assert seen[split + 1] == (h2.CONTINUATION, h2.END_HEADERS, e_sid), seen
        await c.close()


async def test_runtime_goaway_below_a_held_call_fails_it_at_once(short_tmp: Path) -> None:
    """The runtime says GOAWAY with a last stream id below a held call's stream (it will never process it) and
    keeps its connection open for its other calls: the interceptor's forward fails UNAVAILABLE at once instead of
    waiting for the connection to close. The runtime here is hand-made frames on a unix socket."""
    entered, release = asyncio.Event(), asyncio.Event()
    seen: list[grpc.StatusCode] = []

    async def version(request: bytes, forward: Forward) -> bytes:
        entered.set()
        await release.wait()
        try:
            return await forward(request)
        except grpc.aio.AioRpcError as e:
            seen.append(e.code())
            raise

    async with (raw_runtime(short_tmp) as (rt_path, conns),
                frame_relay(short_tmp, rt_path, {"Version": version}) as (relay, _)):
        c = await RawClient.connect(relay)
        _, frames = c.request_frames(VERSION, pb.VersionRequest(version="x").SerializeToString())
        c.writer.write(b"".join(frames))
        await asyncio.wait_for(entered.wait(), 20)
        await eventually(lambda: bool(conns), "the relay connects to the runtime")
        rw = conns[0][1]
        rw.write(h2.settings_frame([]) + h2.goaway(0))
        await rw.drain()
        await asyncio.sleep(0.2)
        release.set()
        await eventually(lambda: bool(seen), "the held call's forward fails")
        assert seen == [grpc.StatusCode.UNAVAILABLE]
        await c.close()


async def test_runtime_answering_before_a_large_edited_request_is_sent(short_tmp: Path) -> None:
    """An edited request larger than the runtime's stream window, and the runtime ends the call (DEADLINE_EXCEEDED,
    then RST_STREAM) before granting more window: the forward stops sending and kubelet gets the runtime's answer
    (it waited forever for credit that never comes). The runtime here is hand-made frames on a unix socket."""
    async with (raw_runtime(short_tmp) as (rt_path, conns),
                frame_relay(short_tmp, rt_path, {"Version": grow(100_000)}) as (relay, _)):
        c = await RawClient.connect(relay)
        sid, frames = c.request_frames(VERSION, pb.VersionRequest(version="x").SerializeToString())
        c.writer.write(b"".join(frames))
        await eventually(lambda: bool(conns), "the relay connects to the runtime")
        rr, rw = conns[0]
        assert await rr.readexactly(24) == h2.PREFACE
        received = 0
        while received < 65_535:  # the edited request, up to the default stream window
            hi, lo, ftype, _, fsid = h2.FRAME_HEADER.unpack(await rr.readexactly(9))
            await rr.readexactly(hi << 16 | lo)
            if ftype == h2.DATA and fsid & 0x7FFFFFFF == sid:
                received += hi << 16 | lo
        encoder = hpack.Encoder()
        encoder.header_table_size = 0
        block = encoder.encode([(":status", "200"), ("content-type", "application/grpc"),
                                ("grpc-status", "4"), ("grpc-message", "too late")])
        rw.write(h2.frame(h2.HEADERS, h2.END_HEADERS | h2.END_STREAM, sid, block)
                 + h2.rst_stream(sid, h2.NO_ERROR))
        await rw.drain()
        headers, _ = await asyncio.wait_for(c.response(sid), 20)
        assert headers["grpc-status"] == "4" and headers["grpc-message"] == "too late", headers
        await c.close()


async def test_a_client_that_does_not_read_holds_back_the_runtime(short_tmp: Path) -> None:
    """A client granting huge windows but not reading while the runtime streams a large answer (ListContainers of
    20000 containers, megabytes): the proxy stops reading the runtime (pause_writing) instead of buffering the
    answer; read at last, the answer is whole."""
    rt_path = str(short_tmp / "rt.sock")
    rt = _runtime_process(rt_path, 20000)
    try:
        async with frame_relay(short_tmp, rt_path) as (relay, server):
            r, w = await asyncio.open_unix_connection(relay, limit=1 << 16)
            w.transport.set_write_buffer_limits(0)
            sock = w.transport.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            c = RawClient(r, w)
            w.write(h2.PREFACE + h2.settings_frame([(h2.SETTINGS_INITIAL_WINDOW_SIZE, 0x7FFFFFFF)])
                    + h2.window_update(0, 0x7FFFFFFF - 65_535))
            sid, frames = c.request_frames("/runtime.v1.RuntimeService/ListContainers",
                                           pb.ListContainersRequest().SerializeToString())
            w.write(b"".join(frames))
            r._transport.pause_reading()  # type: ignore[attr-defined]  # the client stops reading
            await asyncio.sleep(3)
            conn = next(iter(server._shared.connections))
            buffered = conn.kube.transport.get_write_buffer_size() if conn.kube.transport else 0
            assert buffered < 1 << 20, f"{buffered} bytes buffered for a client that does not read"
            r._transport.resume_reading()  # type: ignore[attr-defined]
            headers, body = await asyncio.wait_for(c.response(sid), 60)
            assert headers["grpc-status"] == "0"
            size = len(body)
            assert len(pb.ListContainersResponse.FromString(body).containers) == 20000
            assert size > 4 * buffered, (size, buffered)
            await c.close()
    finally:
        rt.kill()
        rt.wait()


async def test_a_runtime_header_block_beyond_the_limit_closes_the_connection(short_tmp: Path) -> None:
    """The runtime's header block of a held call growing past 16 MiB (CONTINUATION after CONTINUATION): the proxy
    closes that connection instead of keeping it all in memory. The runtime here is hand-made frames."""
    async with (raw_runtime(short_tmp) as (rt_path, conns),
                frame_relay(short_tmp, rt_path, {"Version": grow(1)}) as (relay, server)):
        c = await RawClient.connect(relay)
        sid, frames = c.request_frames(VERSION, pb.VersionRequest(version="x").SerializeToString())
        c.writer.write(b"".join(frames))
        await eventually(lambda: bool(conns), "the relay connects to the runtime")
        rw = conns[0][1]
        encoder = hpack.Encoder()
        encoder.header_table_size = 0
        rw.write(h2.frame(h2.HEADERS, 0, sid, encoder.encode([(":status", "200")])))
        with contextlib.suppress(ConnectionError):
            for _ in range(17):
                rw.write(h2.frame(h2.CONTINUATION, 0, sid, b"\0" * (1 << 20)))
                await rw.drain()
        await eventually(lambda: server.connections == 0, "the connection closes")
        await c.close()


async def test_an_event_stream_beside_many_edited_calls(short_tmp: Path, runtime: MemoryRuntime) -> None:
    """kubelet's long GetContainerEvents stream on the same connection as hundreds of intercepted, edited (grown)
    creates, starts and stops: every event arrives in order, none of the edited calls disturbs the stream's flow
    control (the proxy's credits are withheld only from connection WINDOW_UPDATEs), and the stream is still open."""

    async def create(request: bytes, forward: Forward) -> bytes:
        req = pb.CreateContainerRequest.FromString(request)
        req.config.annotations["numapin.test/pad"] = "p" * 70_000  # larger than a window: credit is needed
        return await forward(req.SerializeToString())

    async with frame_relay(short_tmp, runtime.socket_path, {"CreateContainer": create}) as (relay, _), \
            CRIClient(relay) as k:
        stream = k.container_events()
        got: list[tuple[str, int]] = []

        async def read() -> None:
            async for ev in stream:
                got.append((ev.container_id, ev.container_event_type))

        reader = asyncio.ensure_future(read())
        await eventually(lambda: bool(runtime._events), "the stream reaches the runtime")
        cfg = k.sandbox_config("p", "uid-events")
        sid = await k.run_pod_sandbox(cfg)
        expected: list[tuple[str, int]] = []
        for i in range(120):
            cid = await k.create_container(sid, k.container_config(f"c{i}"), cfg)
            await k.start_container(cid)
            await k.stop_container(cid)
            expected += [(cid, pb.CONTAINER_CREATED_EVENT), (cid, pb.CONTAINER_STARTED_EVENT)]  # (no stop events)
        await eventually(lambda: len(got) >= len(expected), "every event arrives")
        assert got == expected
        assert not reader.done()
        stream.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reader
