"""The frame relay at the edges of HTTP/2: flow-control windows after grown edits (neither side is sent more than
its window), runtime frames arriving for a call the proxy already answered, REFUSED_STREAM, the connection cap.

The peers are hand-made frames on unix sockets (hpack + h2wire) that enforce what RFC 9113 lets a strict peer
enforce, and real gRPC clients where a library's behaviour is the point (its transparent retry)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import grpc.aio
import hpack
import pytest

from criproxy.relay import h2wire as h2
from criproxy.relay.frame_server import start_frame_relay_server
from criproxy.relay.grpc_relay import Forward, Rejection, RelayHandler, Upstream
from numapin_lab.cri.client import CRIClient, pb
from numapin_lab.cri.memory_runtime import MemoryRuntime

from .test_relay_frames import (
    ECHO,
    VERSION,
    RawClient,
    _runtime_process,
    eventually,
    frame_relay,
    grow,
    version_once_back,
)

WINDOW = 65_535  # RFC 9113's initial windows: neither raw peer here changes them
REFUSED_STREAM = 0x7  # RFC 9113 7: the stream was not processed


class StrictReceiver:
    """Reads a peer's frames and enforces the connection flow-control window it granted (RFC 9113 6.9.1: a receiver
    MAY treat an overrun as FLOW_CONTROL_ERROR): more credit only once the window is used up, and only while
    ``granting`` is set. Keeps every frame; answers SETTINGS and PING."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, preface: bool) -> None:
        self.reader, self.writer = reader, writer
        self.preface = preface
        self.granted = WINDOW
        self.received = 0
        self.granting = asyncio.Event()
        self.granting.set()
        self.frames: list[tuple[int, int, int, bytes]] = []
        self.changed = asyncio.Event()
        self.overrun = ""
        self.task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            if self.preface:
                assert await self.reader.readexactly(24) == h2.PREFACE
            while True:
                hi, lo, ftype, flags, sid = h2.FRAME_HEADER.unpack(await self.reader.readexactly(9))
                payload = await self.reader.readexactly(hi << 16 | lo)
                sid &= 0x7FFFFFFF
                if ftype == h2.SETTINGS and not flags & h2.ACK:
                    self.writer.write(h2.frame(h2.SETTINGS, h2.ACK, 0))
                elif ftype == h2.PING and not flags & h2.ACK:
                    self.writer.write(h2.frame(h2.PING, h2.ACK, 0, payload))
                elif ftype == h2.DATA:
                    self.received += len(payload)
                    if self.received > self.granted and not self.overrun:
                        self.overrun = f"{self.received} bytes of DATA received with {self.granted} granted"
                    if payload and sid:  # streams get their credit at once: the connection window is under test
                        self.writer.write(h2.window_update(sid, len(payload)))
                self.frames.append((ftype, flags, sid, payload))
                self.changed.set()
                if self.received == self.granted:
                    await self.granting.wait()
                    self.writer.write(h2.window_update(0, WINDOW))
                    self.granted += WINDOW

    async def until(self, what: str, check: object) -> None:
        assert callable(check)
        for _ in range(600):
            if self.overrun:
                pytest.fail(f"flow control broken: {self.overrun}")
            if check():
                return
            self.changed.clear()
            waiter = asyncio.ensure_future(self.changed.wait())
            try:  # (not wait_for: on Python 3.11 it can swallow a cancellation)
                await asyncio.wait([waiter], timeout=0.05)
            finally:
                waiter.cancel()
        pytest.fail(f"never: {what}")

    def data(self, sid: int) -> bytes:
        return b"".join(p for t, _, s, p in self.frames if t == h2.DATA and s == sid)

    def ended(self, sid: int) -> bool:
        return any(s == sid and f & h2.END_STREAM and t in (h2.DATA, h2.HEADERS) for t, f, s, _ in self.frames)

    def close(self) -> None:
        self.task.cancel()
        self.writer.close()


@contextlib.asynccontextmanager
async def raw_runtime(path: str) -> AsyncIterator[list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]]:
    """A unix socket whose connections the test drives by hand."""
    conns: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def serve(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        conns.append((r, w))

    server = await asyncio.start_unix_server(serve, path)
    try:
        yield conns
    finally:
        server.close()
        for _, w in conns:
            w.close()


def _encoder() -> hpack.Encoder:
    e = hpack.Encoder()
    e.header_table_size = 0  # the proxy sets the runtime's table to 0 (see relay_frames)
    return e


def response_frames(sid: int, message: bytes, *, status: int = 0) -> bytes:
    """A whole gRPC answer as a runtime sends it: headers, the message in DATA frames of 16384, trailers."""
    enc = _encoder()
    body = b"\0" + len(message).to_bytes(4, "big") + message
    out = [h2.frame(h2.HEADERS, h2.END_HEADERS, sid, enc.encode([(":status", "200"),
                                                                  ("content-type", "application/grpc")]))]
    out += h2.data_frames(sid, body, 16_384, False)
    out.append(h2.frame(h2.HEADERS, h2.END_HEADERS | h2.END_STREAM, sid, enc.encode([("grpc-status", str(status))])))
    return b"".join(out)


def request_frames(c: RawClient, method: str, message: bytes) -> tuple[int, bytes]:
    """A whole unary request, its message in DATA frames of 16384 (the proxy's peers' SETTINGS_MAX_FRAME_SIZE)."""
    sid, frames = c.request_frames(method, b"")
    body = b"\0" + len(message).to_bytes(4, "big") + message
    return sid, frames[0] + b"".join(h2.data_frames(sid, body, 16_384, True))


async def version_call(c: RawClient, conns: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]
                       ) -> tuple[int, StrictReceiver]:
    """A Version request from ``c``: its stream, and the runtime connection the relay opened for ``c``, read."""
    sid, frames = c.request_frames(VERSION, pb.VersionRequest(version="x").SerializeToString())
    c.writer.write(b"".join(frames))
    await eventually(lambda: bool(conns), "the relay connects to the runtime")
    return sid, StrictReceiver(*conns[0], preface=True)


# --- 1. never more than the peer's window ----------------------------------------------------------------------------

async def test_kubelet_counting_on_credit_a_grown_edit_took_waits_for_the_runtimes_window(short_tmp: Path) -> None:
    """An intercepted request grown by 30000 bytes takes that much of the runtime's connection window, while
    kubelet (whose held request the proxy credited back at once) still sees the whole window and sends a relayed
    Echo of 60000 bytes: the runtime is sent no more than it granted; the rest follows its WINDOW_UPDATE, whole."""
    rt_path = str(short_tmp / "raw-rt.sock")
    async with raw_runtime(rt_path) as conns, \
            frame_relay(short_tmp, rt_path, {"Version": grow(30_000)}) as (relay, _):
        c = await RawClient.connect(relay)
        v_sid, rt = await version_call(c, conns)
        try:
            await rt.until("the grown request reaches the runtime", lambda: rt.ended(v_sid))
            assert len(rt.data(v_sid)) > 30_000
            echo = bytes(range(256)) * 234 + b"end"  # 59907 bytes: with the grown request, beyond 65535
            e_sid, e_frames = request_frames(c, ECHO, echo)
            c.writer.write(e_frames)
            await rt.until("the whole Echo request reaches the runtime", lambda: rt.ended(e_sid))
            assert rt.data(e_sid) == b"\0" + len(echo).to_bytes(4, "big") + echo
            assert rt.granted > WINDOW  # it went on after the runtime's credit, not before
        finally:
            rt.close()
            await c.close()


async def test_runtime_counting_on_credit_a_grown_answer_took_waits_for_kubelets_window(short_tmp: Path) -> None:
    """The same the other way: the interceptor's answer grown by 30000 bytes takes that much of kubelet's window,
    while the runtime (whose answer the proxy credited back) sends a relayed Echo answer of 60000 bytes: kubelet
    is sent no more than it granted; the rest follows its WINDOW_UPDATE."""
    rt_path = str(short_tmp / "raw-rt.sock")
    async with raw_runtime(rt_path) as conns, \
            frame_relay(short_tmp, rt_path, {"Version": grow(30_000)}) as (relay, _):
        r, w = await asyncio.open_unix_connection(relay)
        w.write(h2.PREFACE + h2.settings_frame([]))
        c = RawClient(r, w)
        kube = StrictReceiver(r, w, preface=False)
        kube.granting.clear()  # kubelet grants nothing more until the Echo answer is under way
        v_sid, v_frames = c.request_frames(VERSION, pb.VersionRequest(version="x").SerializeToString())
        e_sid, e_frames = request_frames(c, ECHO, b"q")
        w.write(b"".join(v_frames) + e_frames)
        await eventually(lambda: bool(conns), "the relay connects to the runtime")
        rt = StrictReceiver(*conns[0], preface=True)
        try:
            await rt.until("both requests reach the runtime", lambda: rt.ended(v_sid) and rt.ended(e_sid))
            conns[0][1].write(h2.settings_frame([]) + response_frames(
                v_sid, pb.VersionResponse(runtime_version="v").SerializeToString()))
            await kube.until("the grown answer reaches kubelet", lambda: kube.ended(v_sid))
            assert len(kube.data(v_sid)) > 30_000
            echo = bytes(range(256)) * 234 + b"end"
            conns[0][1].write(response_frames(e_sid, echo))
            await kube.until("kubelet's window is used up", lambda: kube.received >= WINDOW)
            kube.granting.set()
            await kube.until("the whole Echo answer reaches kubelet", lambda: kube.ended(e_sid))
            assert kube.data(e_sid) == b"\0" + len(echo).to_bytes(4, "big") + echo
        finally:
            rt.close()
            kube.close()


# --- 2. late runtime frames of a call the proxy answered -----------------------------------------------------------

async def test_runtime_frames_crossing_the_proxys_answer_are_dropped_and_credited(short_tmp: Path) -> None:
    """The interceptor rejects a call whose HEADERS went to the runtime: the proxy answers kubelet itself and resets
    the runtime's stream, while the runtime's answer is already on its way (it crosses the RST_STREAM). Those late
    frames never reach kubelet, whose stream is closed (RFC 9113 5.1: a connection error for a strict peer), and
    their DATA is credited back to the runtime on the connection; the connection goes on serving."""
    rt_path = str(short_tmp / "raw-rt.sock")

    async def reject(request: bytes, forward: Forward) -> bytes:
        raise Rejection(grpc.StatusCode.FAILED_PRECONDITION, "numapin: not now")

    async with raw_runtime(rt_path) as conns, frame_relay(short_tmp, rt_path, {"Version": reject}) as (relay, _):
        r, w = await asyncio.open_unix_connection(relay)
        w.write(h2.PREFACE + h2.settings_frame([]))
        c = RawClient(r, w)
        kube = StrictReceiver(r, w, preface=False)
        v_sid, v_frames = c.request_frames(VERSION, pb.VersionRequest(version="x").SerializeToString())
        w.write(b"".join(v_frames))
        await eventually(lambda: bool(conns), "the relay connects to the runtime")
        rt = StrictReceiver(*conns[0], preface=True)
        try:
            await kube.until("kubelet gets the rejection", lambda: kube.ended(v_sid))
            await rt.until("the proxy resets the runtime's stream",
                           lambda: any(t == h2.RST_STREAM and s == v_sid for t, _, s, _ in rt.frames))
            late = response_frames(v_sid, b"l" * 20_000)
            conns[0][1].write(late + h2.frame(h2.PING, 0, 0, b"pingpong"))
            await rt.until("kubelet answers the runtime's PING that followed",
                           lambda: any(t == h2.PING and f & h2.ACK for t, f, _, _ in rt.frames))
            after = kube.frames[[i for i, (t, _, s, _) in enumerate(kube.frames) if s == v_sid][-1]:]
            assert all(t != h2.HEADERS and t != h2.DATA for t, _, _, _ in after[1:]), after
            assert [p for t, _, s, p in kube.frames if s == v_sid and t == h2.DATA] == []
            credit = sum(int.from_bytes(p, "big") for t, _, s, p in rt.frames if t == h2.WINDOW_UPDATE and s == 0)
            assert credit >= 20_005  # the late DATA given back to the runtime on the connection
            e_sid, e_frames = request_frames(c, ECHO, b"next")
            w.write(e_frames)
            await rt.until("the next call reaches the runtime", lambda: rt.ended(e_sid))
            conns[0][1].write(response_frames(e_sid, b"next"))
            await kube.until("and its answer kubelet", lambda: kube.ended(e_sid))
            assert kube.data(e_sid) == b"\0\0\0\0\4next"
        finally:
            rt.close()
            kube.close()


# --- 3. REFUSED_STREAM -----------------------------------------------------------------------------------------------

async def test_refused_stream_on_a_held_call_reaches_kubelet_as_refused_stream(short_tmp: Path) -> None:
    """The runtime refuses a held call (RST_STREAM REFUSED_STREAM: not processed) and the interceptor passes the
    failure on: kubelet gets REFUSED_STREAM too (not an UNAVAILABLE status), which its gRPC retries once by
    itself."""
    rt_path = str(short_tmp / "raw-rt.sock")
    async with raw_runtime(rt_path) as conns, frame_relay(short_tmp, rt_path, {"Version": grow(1)}) as (relay, _):
        c = await RawClient.connect(relay)
        kube = StrictReceiver(c.reader, c.writer, preface=False)
        v_sid, rt = await version_call(c, conns)
        try:
            await rt.until("the request reaches the runtime", lambda: rt.ended(v_sid))
            conns[0][1].write(h2.rst_stream(v_sid, REFUSED_STREAM))
            await kube.until("kubelet's stream ends", lambda: any(
                s == v_sid and (t == h2.RST_STREAM or f & h2.END_STREAM) for t, f, s, _ in kube.frames))
            ends = [(t, p) for t, f, s, p in kube.frames if s == v_sid and t != h2.WINDOW_UPDATE]
            assert ends == [(h2.RST_STREAM, REFUSED_STREAM.to_bytes(4, "big"))], ends
        finally:
            rt.close()
            kube.close()


async def test_a_grpc_client_sees_a_refused_held_call_unavailable_and_goes_on(short_tmp: Path) -> None:
    """A real gRPC client (gRPC's C core: unlike grpc-go, kubelet's, it does not retry a REFUSED_STREAM by itself)
    calls Version through the relay; the runtime refuses the first stream and answers the second: the first call
    fails UNAVAILABLE (as before the proxy passed REFUSED_STREAM on), the next on the same connection succeeds."""
    rt_path = str(short_tmp / "raw-rt.sock")
    runs: list[int] = []

    async def version(request: bytes, forward: Forward) -> bytes:
        runs.append(1)
        return await forward(request)

    async def serve_runtime(conns: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]) -> None:
        await eventually(lambda: bool(conns), "the relay connects to the runtime")
        r, w = conns[0]
        w.write(h2.settings_frame([]))
        rt = StrictReceiver(r, w, preface=True)
        answered: set[int] = set()
        refused = 0
        while True:
            await rt.until("a Version request", lambda: any(t == h2.DATA and f & h2.END_STREAM and s not in answered
                                                              for t, f, s, _ in rt.frames))
            sid = next(s for t, f, s, _ in rt.frames if t == h2.DATA and f & h2.END_STREAM and s not in answered)
            answered.add(sid)
            if not refused:
                refused = sid
                w.write(h2.rst_stream(sid, REFUSED_STREAM))
            else:
                w.write(response_frames(sid, pb.VersionResponse(runtime_version="second").SerializeToString()))

    async with raw_runtime(rt_path) as conns, frame_relay(short_tmp, rt_path, {"Version": version}) as (relay, _):
        task = asyncio.ensure_future(serve_runtime(conns))
        try:
            async with CRIClient(relay) as k:
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await asyncio.wait_for(k.version(), 30)
                assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
                assert (await asyncio.wait_for(k.version(), 30)).runtime_version == "second"
            assert len(runs) == 2
        finally:
            task.cancel()


# --- 4. a bounded number of client connections ---------------------------------------------------------------------

async def test_connections_beyond_the_cap_are_told_goaway_and_cost_no_runtime_connection(
        short_tmp: Path, runtime: MemoryRuntime) -> None:
    """With ``max_connections`` 2 and two clients served, a third connection is told SETTINGS and GOAWAY
    (ENHANCE_YOUR_CALM, no stream taken) and closed, without a runtime connection; a gRPC client on it fails
    UNAVAILABLE; each is counted; once a served client leaves, a new one is served."""
    turned_away: list[int] = []
    path = str(short_tmp / "cap.sock")
    upstream = Upstream(runtime.socket_path)
    server = await start_frame_relay_server(path, RelayHandler(upstream, {"Version": grow(1)}), max_connections=2,
                                            on_turned_away=lambda: turned_away.append(1))
    try:
        served = [await RawClient.connect(path) for _ in range(2)]
        for c in served:
            sid, frames = c.request_frames(VERSION, pb.VersionRequest(version="x").SerializeToString())
            c.writer.write(b"".join(frames))
            headers, _ = await asyncio.wait_for(c.response(sid), 30)
            assert headers["grpc-status"] == "0"
        assert server.connections == 2
        r, w = await asyncio.open_unix_connection(path)
        w.write(h2.PREFACE + h2.settings_frame([]))
        got = await asyncio.wait_for(r.read(), 30)  # up to the proxy's close
        w.close()
        frames = []
        pos = 0
        while pos < len(got):
            hi, lo, ftype, _, _ = h2.FRAME_HEADER.unpack_from(got, pos)
            frames.append((ftype, got[pos + 9:pos + 9 + (hi << 16 | lo)]))
            pos += 9 + (hi << 16 | lo)
        assert [t for t, _ in frames] == [h2.SETTINGS, h2.GOAWAY], frames
        assert frames[1][1][:8] == (0).to_bytes(4, "big") + h2.ENHANCE_YOUR_CALM.to_bytes(4, "big")
        async with CRIClient(path) as k:
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await asyncio.wait_for(k.version(), 30)
            assert e.value.code() == grpc.StatusCode.UNAVAILABLE
        assert server.connections == 2 and len(turned_away) >= 2
        for c in served:
            await c.close()
        await eventually(lambda: server.connections == 0, "the served clients' connections close")
        d = await RawClient.connect(path)  # (a gRPC client would wait out its reconnect backoff first)
        sid, frames = d.request_frames(VERSION, pb.VersionRequest(version="x").SerializeToString())
        d.writer.write(b"".join(frames))
        headers, _ = await asyncio.wait_for(d.response(sid), 30)
        assert headers["grpc-status"] == "0"
        await d.close()
    finally:
        await server.stop(0)
        await upstream.close()


# --- attacks: seeded random frame sequences, kill -9 -----------------------------------------------------------------

async def _behave(request: bytes, forward: Forward) -> bytes:
    """Version as the random tests drive it: the request's ``version`` says what the interceptor does."""
    what = pb.VersionRequest.FromString(request).version
    if what == "reject":
        raise Rejection(grpc.StatusCode.FAILED_PRECONDITION, "numapin: rejected")
    if what == "own":
        return pb.VersionResponse(runtime_version="own").SerializeToString()
    n = int(what.split(":")[1])
    out = pb.VersionResponse.FromString(await forward(pb.VersionRequest(version="v" * n).SerializeToString()))
    out.runtime_version += "r" * n
    return out.SerializeToString()


@pytest.mark.parametrize("seed", range(12))
async def test_random_frame_sequences_keep_both_peers_in_protocol(short_tmp: Path, seed: int) -> None:
    """Seeded random mixes on one connection: relayed Echo calls and intercepted Version calls (grown edits both
    ways, rejections, answers of the proxy's own) of random sizes, kubelet resetting streams at random, the runtime
    answering, refusing, resetting, failing, late, and sending answers that cross the proxy's reset. Both raw peers
    enforce their connection windows; kubelet never gets a frame on a stream after its end; every call kubelet did
    not reset ends; the connection stays up and the proxy forgets every held call."""
    import random

    rng = random.Random(seed)
    rt_path = str(short_tmp / "raw-rt.sock")
    kinds: dict[int, str] = {}
    async with raw_runtime(rt_path) as conns, frame_relay(short_tmp, rt_path, {"Version": _behave}) as (relay, srv):
        r, w = await asyncio.open_unix_connection(relay)
        w.write(h2.PREFACE + h2.settings_frame([]))
        c = RawClient(r, w)
        kube = StrictReceiver(r, w, preface=False)
        reset_by_kube: set[int] = set()

        async def runtime_side() -> None:
            await eventually(lambda: bool(conns), "the relay connects to the runtime")
            rr, rw = conns[0]
            rw.write(h2.settings_frame([]))
            rt = StrictReceiver(rr, rw, preface=True)
            seen = 0
            done: set[int] = set()  # streams answered, reset, or waiting in ``later``
            later: list[int] = []   # requests that ended, answered after the next read, in random order

            def answer(sid: int) -> None:
                roll = rng.random()
                if kinds.get(sid) == "version":
                    message = pb.VersionResponse(runtime_version="x" * rng.choice((0, 10, 20_000))).SerializeToString()
                else:
                    message = bytes(rng.randrange(256) for _ in range(8)) * rng.choice((0, 1, 500, 5000))
                if roll < 0.7:
                    rw.write(response_frames(sid, message))
                elif roll < 0.8:
                    rw.write(h2.rst_stream(sid, REFUSED_STREAM))
                elif roll < 0.9:
                    rw.write(h2.rst_stream(sid, h2.CANCEL))
                else:
                    rw.write(h2.frame(h2.HEADERS, h2.END_HEADERS | h2.END_STREAM, sid, _encoder().encode(
                        [(":status", "200"), ("content-type", "application/grpc"), ("grpc-status", "13")])))

            while True:
                await rt.until("more frames", lambda seen=seen: len(rt.frames) > seen)
                new, seen = rt.frames[seen:], len(rt.frames)
                for ftype, flags, sid, _ in new:
                    if ftype == h2.RST_STREAM and (sid not in done or sid in later):
                        done.add(sid)
                        if sid in later:
                            later.remove(sid)
                        if rng.random() < 0.5:  # an answer written before the reset was read: they cross
                            answer(sid)
                    elif ftype in (h2.DATA, h2.HEADERS) and flags & h2.END_STREAM and sid not in done:
                        done.add(sid)
                        later.append(sid)
                rng.shuffle(later)
                while later:
                    answer(later.pop())

        runtime_task = asyncio.ensure_future(runtime_side())
        try:
            for _ in range(60):
                roll = rng.random()
                if roll < 0.4:
                    sid, frames = request_frames(c, ECHO, bytes(rng.randrange(256) for _ in range(4))
                                                 * rng.choice((0, 1, 100, 12_000)))
                    kinds[sid] = "echo"
                    w.write(frames)
                elif roll < 0.85:
                    what = rng.choice(("reject", "own", "grow:0", "grow:100", "grow:30000"))
                    sid, parts = c.request_frames(VERSION, pb.VersionRequest(version=what).SerializeToString())
                    kinds[sid] = "version"
                    w.write(b"".join(parts))
                elif kinds:
                    sid = rng.choice(sorted(kinds))
                    if not kube.ended(sid) and sid not in reset_by_kube:
                        reset_by_kube.add(sid)
                        w.write(h2.rst_stream(sid, h2.CANCEL))
                if rng.random() < 0.3:
                    await asyncio.sleep(rng.choice((0, 0.001, 0.01)))

            def over(sid: int) -> bool:
                if runtime_task.done():  # the runtime side failed (its window overrun): say so
                    runtime_task.result()
                return sid in reset_by_kube or any(s == sid and (t == h2.RST_STREAM or f & h2.END_STREAM)
                                                   for t, f, s, _ in kube.frames)

            await kube.until("every call kubelet did not reset ends", lambda: all(over(s) for s in kinds))
            ended: set[int] = set()
            for ftype, flags, sid, _ in kube.frames:
                assert ftype != h2.GOAWAY, "the proxy closed kubelet's connection"
                if sid in ended and sid not in reset_by_kube:
                    assert ftype in (h2.WINDOW_UPDATE, h2.PRIORITY), (seed, sid, kinds[sid], [
                        (t, f, p[:80]) for t, f, s, p in kube.frames if s == sid])
                if ftype == h2.RST_STREAM or (ftype in (h2.DATA, h2.HEADERS) and flags & h2.END_STREAM):
                    ended.add(sid)
            conn = next(iter(srv._shared.connections))
            await eventually(lambda: not conn.held, "the proxy forgets every held call")
        finally:
            runtime_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await runtime_task
            kube.close()


@pytest.mark.parametrize("seed", range(4))
async def test_runtime_killed_at_a_random_point_of_grown_edits_and_large_calls(short_tmp: Path, seed: int) -> None:
    """SIGKILL of the runtime process at a seeded random moment while grown edits (both ways, beyond the windows)
    and large relayed calls are in flight on the same connections, frames waiting for windows: every call ends OK
    or UNAVAILABLE, none hangs, the proxy forgets its held calls and serves the restarted runtime."""
    import random
    import signal

    rng = random.Random(seed)
    rt_path = str(short_tmp / "rt.sock")
    rt = _runtime_process(rt_path, 10)
    try:
        async with frame_relay(short_tmp, rt_path, {"Version": grow(100_000)}) as (relay, server), \
                CRIClient(relay) as k:
            echo = k.channel.unary_unary(ECHO)
            payload = bytes(range(256)) * 800
            assert await echo(payload, timeout=60) == payload
            calls = [asyncio.ensure_future(echo(payload, timeout=60)) for _ in range(6)]
            calls += [asyncio.ensure_future(k.version()) for _ in range(6)]
            await asyncio.sleep(rng.choice((0, 0.001, 0.005, 0.02, 0.05)))
            rt.send_signal(signal.SIGKILL)
            await asyncio.to_thread(rt.wait)
            results = await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), 60)
            for r in results:
                if isinstance(r, BaseException):
                    assert isinstance(r, grpc.aio.AioRpcError) and r.code() == grpc.StatusCode.UNAVAILABLE, r
            await eventually(lambda: all(not c.held for c in server._shared.connections), "held calls forgotten")
            rt = _runtime_process(rt_path, 10)
            assert (await version_once_back(k)).runtime_version.endswith("r" * 100_000)
            assert await echo(payload, timeout=60) == payload
    finally:
        rt.kill()
        rt.wait()
