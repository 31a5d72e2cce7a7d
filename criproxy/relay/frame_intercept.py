"""What happens to an intercepted call once kubelet's request is complete (``_Intercepting``, a part of
``frame_connection._Connection``; the call's frames are kept in ``frame_held._Held``).

- The interceptor runs on the event loop and its ``Forward`` (``_StreamForward``) sends the (possibly edited)
  message on the stream kubelet opened upstream (its HEADERS went at once, in the HPACK order), framed at the
  runtime's SETTINGS_MAX_FRAME_SIZE within its flow-control windows, and collects the response. The proxy then
  answers kubelet (the runtime's header frames, the interceptor's message, the runtime's trailers) or, for a
  rejection, with a trailers-only response, and resets the upstream stream when nothing was forwarded.
- A held call the proxy answered itself has its runtime stream reset; the runtime's frames still on the way for it
  (``late``) are dropped, not passed to kubelet's closed stream, and their DATA credited back.
- A held call the runtime refused (RST_STREAM REFUSED_STREAM, or beyond its GOAWAY) is refused to kubelet the same
  way when the interceptor passes the failure on: kubelet's gRPC retries an unprocessed call once by itself.
"""

from __future__ import annotations

import time

import grpc
import grpc.aio

from criproxy.relay import h2wire as h2
from criproxy.relay.frame_headers import (
    _CACHE_LIMIT,
    _message,
    _metadata,
    _ProtocolError,
    _status_code,
    _unquote,
)
from criproxy.relay.frame_held import _Held
from criproxy.relay.frame_link import _Link
from criproxy.relay.frame_peer import _Peer
from criproxy.relay.grpc_relay import Forward, Outcome, _Replies, intercept

_DATA, _HEADERS, _RST, _CONT = h2.DATA, h2.HEADERS, h2.RST_STREAM, h2.CONTINUATION
_END_STREAM, _END_HEADERS = h2.END_STREAM, h2.END_HEADERS


class _StreamForward(Forward):
    """``Forward`` for a held stream: the message goes on the stream kubelet opened, the answer comes back from it."""

    __slots__ = ("_conn", "_held", "replies")

    def __init__(self, conn: _Intercepting, held: _Held) -> None:
        self._conn = conn
        self._held = held
        self.replies = _Replies()
        self.method = held.method
        self.metadata = held.metadata
        elapsed = time.perf_counter() - held.t0
        self.timeout = None if held.timeout is None else max(held.timeout - elapsed, 0.0)

    async def __call__(self, request: bytes) -> bytes:
        held, conn = self._held, self._conn
        if held.forwarded:
            raise grpc.aio.AioRpcError(grpc.StatusCode.INTERNAL, None, None,
                                       "numapin: an interceptor forwarded the same call twice")
        held.forwarded = True
        if held.up_closed:
            raise grpc.aio.AioRpcError(grpc.StatusCode.INTERNAL, None, None,
                                       "numapin: the request ended without a message")
        if not held.response.done():  # the runtime may have ended the stream already (its deadline)
            await conn.send_data(conn.rt, held, _message(request), end_stream=True)
        error = await held.response
        if error is not None:
            raise error
        blocks = conn.server.blocks
        try:
            initial = blocks.of(held.initial_block) if held.initial_block else ()
            trailer = blocks.of(held.trailer_block)
        except _ProtocolError as e:
            raise grpc.aio.AioRpcError(grpc.StatusCode.INTERNAL, None, None, f"numapin: {e}") from e
        self.replies.initial = _metadata(initial)
        self.replies.trailing = _metadata(trailer)
        code = _status_code(trailer)
        if code != grpc.StatusCode.OK:
            message = next((v for k, v in trailer if k == b"grpc-message"), b"")
            raise grpc.aio.AioRpcError(code, grpc.aio.Metadata(*self.replies.initial),
                                       grpc.aio.Metadata(*self.replies.trailing),
                                       _unquote(message))
        body = bytes(held.resp_data)
        if len(body) < 5 or body[0] != 0 or int.from_bytes(body[1:5], "big") != len(body) - 5:
            raise grpc.aio.AioRpcError(grpc.StatusCode.INTERNAL, None, None,
                                       "numapin: the runtime's response is not one uncompressed gRPC message")
        return body[5:]

    def last_details(self) -> str:
        """The runtime's ``grpc-message``, decoded."""
        trailer = self._conn.server.blocks.of(self._held.trailer_block) if self._held.trailer_block else ()
        return _unquote(next((v for k, v in trailer if k == b"grpc-message"), b""))


class _Intercepting(_Link):
    """Held calls carried through: the interceptor's decision, the answer to kubelet, the late frames."""

    def _start(self, h: _Held) -> None:
        if h.answered:
            return
        h.answered = True
        self._spawn(self._intercepted(h))

    async def send_data(self, peer: _Peer, h: _Held, body: bytes, *, end_stream: bool) -> None:
        """``body`` as DATA frames on ``h``'s stream to ``peer``, within its frame size and windows; what is sent
        is withheld from ``peer``'s next connection WINDOW_UPDATEs (its sender was credited already)."""
        to_rt = peer is self.rt
        pos = 0
        while True:
            if self.state == "closed":
                raise grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, None, None,
                                           f"numapin: the {peer.name} connection closed")
            if h.response.done() if to_rt else h.kube_reset:
                return  # the receiver ended the call (answered early, or reset it): no credit comes for the rest
            stream_window = h.up_window if to_rt else h.down_window
            room = 0 if peer.backlog else min(peer.max_frame, peer.window, stream_window, len(body) - pos)
            if room <= 0 and pos < len(body):
                self.credit.clear()
                await self.credit.wait()
                continue
            chunk = body[pos:pos + room]
            pos += len(chunk)
            last = pos >= len(body)
            peer.write(h2.frame(_DATA, _END_STREAM if last and end_stream else 0, h.sid, chunk))
            peer.window -= len(chunk)
            peer.withhold += len(chunk)
            if to_rt:
                h.up_window -= len(chunk)
            else:
                h.down_window -= len(chunk)
                h.sent_down += len(chunk)
            if last:
                return

    async def _intercepted(self, h: _Held) -> None:
        forward = _StreamForward(self, h)
        outcome = None
        try:
            request = bytes(h.request)
            if h.up_closed or len(request) < 5 or int.from_bytes(request[1:5], "big") != len(request) - 5:
                outcome = Outcome(code=grpc.StatusCode.INVALID_ARGUMENT,
                                  details=f"numapin: the {h.method.rsplit('/', 1)[-1]} request is not one gRPC message")
            elif request[0] != 0:
                outcome = Outcome(code=grpc.StatusCode.UNIMPLEMENTED,
                                  details="numapin: compressed requests are not supported")
            else:
                outcome = await intercept(h.method, h.icpt, request[5:], forward, forward.replies)
            await self._answer(h, forward, outcome)
        except grpc.aio.AioRpcError:
            pass  # the connection closed under the answer: kubelet sees the connection go
        except _ProtocolError as e:
            self._fail(str(e))
        finally:
            self.held.pop(h.sid, None)
            self._settle(h)
            if self.server.observe is not None:
                code = outcome.code if outcome is not None else grpc.StatusCode.UNAVAILABLE
                self.server.observe(h.method, time.perf_counter() - h.t0, code)
            self._late(h)
            if self.kube_gone and not self.held:
                self._close()

    async def _answer(self, h: _Held, forward: _StreamForward, outcome: Outcome) -> None:
        kube = self.kube
        sid = h.sid
        if not h.forwarded or not h.response.done():
            self.rt.write(h2.rst_stream(sid))  # nothing (or not all) went upstream: the runtime forgets the call
            # the streams kubelet opened so far, a header block in progress included, reach the runtime before it
            h.late_mark = max(self.last_sid, self.kcont[0] if self.kcont is not None else 0)
        if h.kube_reset or self.state == "closed":
            return
        if h.refused and outcome.code == grpc.StatusCode.UNAVAILABLE and outcome.details == h.refused:
            # the runtime did not process the call and the interceptor passed that on: kubelet's gRPC (grpc-go)
            # retries such a call once by itself (transparent retry), as it does without the proxy
            kube.write(h2.rst_stream(sid, h2.REFUSED_STREAM))
            return
        runtime_answered = h.forwarded and h.response.done() and h.response.result() is None
        if outcome.code == grpc.StatusCode.OK:
            if runtime_answered:
                head, tail = h.initial_frames, h.trailer_frames
            else:
                head = h2.headers_frames(sid, h2.literal_block([(b":status", b"200"),
                                                                (b"content-type", b"application/grpc")]),
                                         kube.max_frame, False)
                tail = h2.headers_frames(sid, h2.status_block(0, "", trailing=forward.replies.trailing,
                                                              trailers_only=False), kube.max_frame, True)
            if not head:  # the runtime answered with trailers only but the interceptor made a response
                head = h2.headers_frames(sid, h2.literal_block([(b":status", b"200"),
                                                                (b"content-type", b"application/grpc")]),
                                         kube.max_frame, False)
            kube.write(head)
            await self.send_data(kube, h, _message(outcome.response), end_stream=False)
            if not h.kube_reset:
                kube.write(tail)
        elif runtime_answered and _status_code(self.server.blocks.of(h.trailer_block)) == outcome.code \
                and outcome.details == forward.last_details():
            kube.write(h.initial_frames + h.trailer_frames)  # the runtime's own error, as it sent it
        else:
            kube.write(h2.headers_frames(sid, h2.status_block(outcome.code.value[0], outcome.details,
                                                              outcome.trailing, trailers_only=True),
                                         kube.max_frame, True))

    def _settle(self, h: _Held) -> None:
        """The runtime's whole answer to ``h`` is not credited back yet (``frame_runtime``): kubelet's credit for
        the proxy's own answer stands for as much of it (that much less is withheld from kubelet's next connection
        WINDOW_UPDATEs, as if the runtime's answer had been relayed), the rest is owed to the runtime
        (``_Peer.owe``). The sum stays exact when kubelet's credit for the answer has been withheld already (it is
        then given here)."""
        owed = h.uncredited
        if not owed:
            return
        h.uncredited = 0
        take = min(owed, h.sent_down, self.kube.withhold)
        self.kube.withhold -= take
        if owed > take and self.state != "closed":
            self.rt.owe(owed - take)

    def _late(self, h: _Held) -> None:
        """``h`` is answered and forgotten while the runtime may still send on its stream (frames crossing the
        proxy's RST_STREAM, or a reset after its trailers): those frames are dropped, not passed to kubelet, whose
        stream is closed (RFC 9113 5.1: a peer may treat them as a connection error)."""
        if h.up_reset:
            return
        self.late[h.sid] = h.late_mark or self.last_sid
        if len(self.late) > _CACHE_LIMIT:
            del self.late[next(iter(self.late))]

    def _forget_late(self, sid: int) -> None:
        """The runtime answers stream ``sid``: it has read every frame the proxy sent before that stream's HEADERS,
        so the streams reset before them get no more frames."""
        late = self.late
        while late:
            first, mark = next(iter(late.items()))
            if mark >= sid:
                return
            del late[first]

    def _late_frame(self, ftype: int, flags: int, sid: int, length: int) -> None:
        """A runtime frame on a late stream (``_late``): dropped; its DATA credited back to the runtime on the
        connection (the proxy is its receiver); the stream forgotten once the runtime has ended it."""
        if ftype == _DATA:
            if length:
                self.rt.write(h2.window_update(0, length))
            ended = bool(flags & _END_STREAM)
        elif ftype == _HEADERS:
            ended = bool(flags & _END_STREAM)
            if ended and not flags & _END_HEADERS:
                self.late_block = sid
                return
        elif ftype == _CONT:
            ended = bool(flags & _END_HEADERS) and self.late_block == sid
            if ended:
                self.late_block = 0
        else:
            ended = ftype == _RST
        if ended:
            del self.late[sid]
