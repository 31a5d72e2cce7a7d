"""A held call its interceptor needs nothing of (``RelayHandler.pass_through``, issue 37): relayed frame by frame as
an unheld call, every byte as it came (padding and frame boundaries included, no credit of the proxy's own), while a
call the interceptor needs is still held and edited, a container pinned between the request and the answer gets the
runtime's answer (the decision is the request's), and a runtime that answered before the request was whole keeps
the held path. A held call's whole answer is credited back to the runtime by kubelet's credit for the proxy's
answer, the difference by the proxy: exact, and no write of its own to the runtime when the answer grew.

Hand-made HTTP/2 frames on both sides (hpack + h2wire): what is under test is which frames each peer receives."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import grpc

from criproxy.relay import h2wire as h2
from criproxy.relay.frame_server import start_frame_relay_server
from criproxy.relay.grpc_relay import Forward, RelayHandler, Upstream
from numapin_lab.cri.client import pb

from .test_relay_frames import RawClient, eventually
from .test_relay_frames_edges import StrictReceiver, _encoder, raw_runtime

STATUS = "/runtime.v1.RuntimeService/ContainerStatus"
Frame = tuple[int, int, int, bytes]


class Calls:
    """The ContainerStatus interceptor under test (appends ``+`` to the runtime's message: an edit), its
    ``PassThrough`` (containers not in ``pinned``), and what the relay told the metrics."""

    def __init__(self) -> None:
        self.pinned: set[str] = set()
        self.ran: list[str] = []
        self.observed: list[tuple[str, grpc.StatusCode]] = []
        self.release = asyncio.Event()  # what the interceptor of container "slow" waits for before it forwards

    async def status(self, request: bytes, forward: Forward) -> bytes:
        cid = pb.ContainerStatusRequest.FromString(request).container_id
        self.ran.append(cid)
        if cid == "slow":
            await self.release.wait()
        response = await forward(request)
        return response[:-3] if cid.startswith("shrunk") else response + b"+++++"

    def unchanged(self, request: bytes) -> bool:
        return pb.ContainerStatusRequest.FromString(request).container_id not in self.pinned

    def observe(self, method: str, seconds: float, code: grpc.StatusCode) -> None:
        self.observed.append((method, code))


@contextlib.asynccontextmanager
async def peers(tmp: Path, calls: Calls) -> AsyncIterator[tuple[RawClient, StrictReceiver, StrictReceiver,
                                                                 asyncio.StreamWriter]]:
    """The relay between a raw kubelet and a raw runtime: the kubelet client, what each side receives, and the
    runtime's writer."""
    rt_path = str(tmp / "raw-rt.sock")
    upstream = Upstream(rt_path)
    handler = RelayHandler(upstream, {"ContainerStatus": calls.status}, observe=calls.observe,
                           pass_through={"ContainerStatus": calls.unchanged})
    async with raw_runtime(rt_path) as conns:
        server = await start_frame_relay_server(str(tmp / "relay.sock"), handler)
        c = await RawClient.connect(str(tmp / "relay.sock"))
        kube = StrictReceiver(c.reader, c.writer, preface=False)
        await eventually(lambda: bool(conns), "the relay connects to the runtime")
        rt = StrictReceiver(*conns[0], preface=True)
        try:
            yield c, kube, rt, conns[0][1]
        finally:
            rt.close()
            kube.close()
            await server.stop(0)
            await upstream.close()


def request(c: RawClient, container_id: str) -> tuple[int, bytes, bytes]:
    """A ContainerStatus request whose message comes in one padded DATA frame (END_STREAM): its stream, HEADERS
    and that DATA frame."""
    message = pb.ContainerStatusRequest(container_id=container_id).SerializeToString()
    sid, frames = c.request_frames(STATUS, b"")
    body = b"\0" + len(message).to_bytes(4, "big") + message
    return sid, frames[0], h2.frame(h2.DATA, h2.END_STREAM | h2.PADDED, sid, bytes((4,)) + body + b"\0" * 4)


def answer(sid: int, message: bytes, status: int = 0) -> list[bytes]:
    """A runtime's answer: headers, the message in two DATA frames (the second padded), trailers."""
    enc = _encoder()
    body = b"\0" + len(message).to_bytes(4, "big") + message
    return [h2.frame(h2.HEADERS, h2.END_HEADERS, sid, enc.encode([(":status", "200"),
                                                                  ("content-type", "application/grpc")])),
            h2.frame(h2.DATA, 0, sid, body[:7]),
            h2.frame(h2.DATA, h2.PADDED, sid, bytes((2,)) + body[7:] + b"\0\0"),
            h2.frame(h2.HEADERS, h2.END_HEADERS | h2.END_STREAM, sid, enc.encode([("grpc-status", str(status))]))]


def parsed(frames: list[bytes]) -> list[Frame]:
    out = []
    for f in frames:
        _, _, ftype, flags, sid = h2.FRAME_HEADER.unpack(f[:9])
        out.append((ftype, flags, sid & 0x7FFFFFFF, f[9:]))
    return out


def on(frames: list[Frame], sid: int) -> list[Frame]:
    """The frames of stream ``sid`` but credit (what the receiver itself grants is not under test)."""
    return [f for f in frames if f[2] == sid and f[0] != h2.WINDOW_UPDATE]


def connection_credit(frames: list[Frame]) -> int:
    return sum(int.from_bytes(p, "big") for t, _, s, p in frames if t == h2.WINDOW_UPDATE and s == 0)


async def test_an_unpinned_containers_status_is_relayed_as_it_came_and_a_pinned_ones_edited(
        short_tmp: Path) -> None:
    calls = Calls()
    calls.pinned.add("pinned")
    async with peers(short_tmp, calls) as (c, kube, rt, rt_w):
        # not pinned: the request frame reaches the runtime as it came (padded), nothing credited back to kubelet;
        # the answer's frames reach kubelet as the runtime sent them, the interceptor never runs, the metrics get
        # the status of the runtime's trailers
        sid, headers, data = request(c, "free")
        c.writer.write(headers + data)
        await rt.until("the request reaches the runtime", lambda: rt.ended(sid))
        assert on(rt.frames, sid)[-1] == parsed([data])[0]
        frames = answer(sid, b"free-status", status=grpc.StatusCode.NOT_FOUND.value[0])
        rt_w.write(b"".join(frames))
        await kube.until("kubelet gets the answer", lambda: kube.ended(sid))
        assert on(kube.frames, sid) == parsed(frames)
        assert calls.ran == []
        assert calls.observed == [(STATUS, grpc.StatusCode.NOT_FOUND)]
        assert connection_credit(kube.frames) == 0 and connection_credit(rt.frames) == 0

        # pinned: held, the interceptor runs and edits the answer
        sid, headers, data = request(c, "pinned")
        c.writer.write(headers + data)
        await rt.until("the held request reaches the runtime", lambda: rt.ended(sid))
        rt_w.write(b"".join(answer(sid, b"pinned-status")))
        await kube.until("kubelet gets the edited answer", lambda: kube.ended(sid))
        assert kube.data(sid) == b"\0\0\0\0\x12pinned-status+++++"
        assert calls.ran == ["pinned"]


async def test_pinned_between_request_and_answer_and_an_early_answer(short_tmp: Path) -> None:
    calls = Calls()
    async with peers(short_tmp, calls) as (c, kube, rt, rt_w):
        # decided when the request is read: pinned meanwhile, the runtime's answer still goes back as it came
        sid, headers, data = request(c, "late")
        c.writer.write(headers + data)
        await rt.until("the request reaches the runtime", lambda: rt.ended(sid))
        calls.pinned.add("late")
        frames = answer(sid, b"late-status")
        rt_w.write(b"".join(frames))
        await kube.until("kubelet gets the answer", lambda: kube.ended(sid))
        assert on(kube.frames, sid) == parsed(frames)
        assert calls.ran == []

        # the runtime ends a call before its request is whole (trailers only): the call stays held, kubelet gets
        # the runtime's status, and the request's last frame is not relayed to the ended stream
        sid, headers, data = request(c, "early")
        c.writer.write(headers)
        await rt.until("the HEADERS reach the runtime", lambda: any(s == sid for _, _, s, _ in rt.frames))
        enc = _encoder()
        rt_w.write(h2.frame(h2.HEADERS, h2.END_HEADERS | h2.END_STREAM, sid,
                            enc.encode([(":status", "200"), ("content-type", "application/grpc"),
                                        ("grpc-status", str(grpc.StatusCode.DEADLINE_EXCEEDED.value[0]))])))
        rt_w.write(h2.frame(h2.PING, 0, 0, b"answered"))  # kubelet's ACK: the proxy has read the trailers
        await rt.until("kubelet's PING ACK", lambda: any(t == h2.PING and p == b"answered" for t, _, _, p in rt.frames))
        c.writer.write(data)
        await kube.until("kubelet gets the runtime's status", lambda: kube.ended(sid))
        assert calls.ran == ["early"]
        assert [t for t, _, _, _ in on(kube.frames, sid)] == [h2.HEADERS]
        assert not any(t == h2.DATA for t, _, _, _ in on(rt.frames, sid))
        await eventually(lambda: (STATUS, grpc.StatusCode.DEADLINE_EXCEEDED) in calls.observed, "the metrics")

        # a whole early answer, then kubelet gives the call up: the answer's DATA is credited back to the runtime
        sid, headers, _ = request(c, "gone")
        c.writer.write(headers)
        await rt.until("the HEADERS reach the runtime", lambda: any(s == sid for _, _, s, _ in rt.frames))
        before = connection_credit(rt.frames)
        frames = answer(sid, b"gone-status")
        rt_w.write(b"".join(frames) + h2.frame(h2.PING, 0, 0, b"answer.2"))
        await rt.until("kubelet's PING ACK", lambda: any(t == h2.PING and p == b"answer.2" for t, _, _, p in rt.frames))
        c.writer.write(h2.rst_stream(sid, 0x8))
        await rt.until("the reset reaches the runtime", lambda: any(t == h2.RST_STREAM and s == sid
                                                                   for t, _, s, _ in rt.frames))
        assert connection_credit(rt.frames) - before == sum(len(p) for t, _, _, p in parsed(frames) if t == h2.DATA)
        assert on(kube.frames, sid) == []


async def test_a_held_answer_is_credited_through_kubelets_credit_exactly(short_tmp: Path) -> None:
    calls = Calls()
    calls.pinned.update({"grown-1", "grown-2", "shrunk"})
    async with peers(short_tmp, calls) as (c, kube, rt, rt_w):
        sent = 0  # DATA the runtime sends, padding included (what flow control counts)
        for cid in ("grown-1", "grown-2", "shrunk", "free"):
            sid, headers, data = request(c, cid)
            c.writer.write(headers + data)
            await rt.until("the request reaches the runtime", lambda s=sid: rt.ended(s))
            frames = answer(sid, f"{cid}-status".encode() * 20)
            sent += sum(len(p) for t, _, _, p in parsed(frames) if t == h2.DATA)
            rt_w.write(b"".join(frames))
            await kube.until("kubelet gets the answer", lambda s=sid: kube.ended(s))
        assert calls.ran == ["grown-1", "grown-2", "shrunk"]
        # the grown answers (by 5 bytes, 3 of padding less) wait for kubelet's credit; of the shrunk one (by 3 bytes
        # and its padding), the proxy gives the 6 bytes back itself
        assert connection_credit(rt.frames) == 6
        received = sum(len(p) for t, _, s, p in kube.frames if t == h2.DATA and s)
        assert received == sent + 2 * 2 - 6
        c.writer.write(h2.window_update(0, received))  # kubelet credits all it received
        await rt.until("kubelet's credit reaches the runtime", lambda: connection_credit(rt.frames) > 6)
        c.writer.write(h2.frame(h2.PING, 0, 0, b"credited"))  # anything later: the credit has been passed on
        await kube.until("the PING's ACK", lambda: any(t == h2.PING and p == b"credited" for t, _, _, p in kube.frames))
        assert connection_credit(rt.frames) == sent


async def test_credit_owed_for_a_held_request_comes_while_the_interceptor_waits(short_tmp: Path) -> None:
    """The connection credit for a whole held request goes with the proxy's next frames to kubelet (its answer); an
    interceptor that waits does not keep it from kubelet, which may wait for it before it sends more."""
    calls = Calls()
    calls.pinned.add("slow")
    async with peers(short_tmp, calls) as (c, kube, rt, rt_w):
        c.writer.write(h2.frame(h2.PING, 0, 0, b"settled."))  # the set-up done: from here only the call's frames
        await kube.until("the runtime's PING ACK", lambda: any(t == h2.PING and p == b"settled." for t, _, _, p in
                                                                kube.frames))
        sid, headers, data = request(c, "slow")
        c.writer.write(headers + data)
        await kube.until("kubelet's credit for the request", lambda: connection_credit(kube.frames) == len(data) - 9)
        assert calls.ran == ["slow"] and not any(t == h2.DATA and s == sid for t, _, s, _ in rt.frames)
        calls.release.set()
        await rt.until("the request reaches the runtime", lambda: rt.ended(sid))
        rt_w.write(b"".join(answer(sid, b"slow-status")))
        await kube.until("kubelet gets the answer", lambda: kube.ended(sid))
        assert connection_credit(kube.frames) == len(data) - 9
