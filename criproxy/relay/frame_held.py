"""An intercepted call as its frames come (``_Held``): kubelet's request held until complete (its DATA credited
back at once, the frame that completes it with the proxy's next frames to kubelet, ``_Peer.owe``; so ``MAX_HELD``
bounds what a call, and the calls held at once on a connection, keep in memory), then
the runtime's answer (header frames, message, trailers) kept for the proxy, which answers kubelet itself
(``frame_intercept``; the answer's DATA is credited back at the end of each read while the answer is not whole, and
a whole answer's when the proxy has answered: ``frame_runtime``, ``_Intercepting._settle``)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable

import grpc
import grpc.aio

from criproxy.relay import h2wire as h2
from criproxy.relay.frame_headers import _MAX_HEADER_LIST, _metadata, _OverBudget, _ProtocolError
from criproxy.relay.grpc_relay import MAX_MESSAGE, Interceptor, PassThrough

_END_HEADERS, _PADDED = h2.END_HEADERS, h2.PADDED
# the largest intercepted message (request or answer) held in memory, with gRPC's 5-byte prefix: the gRPC relay's
# limit; beyond it the connection is closed (the proxy credits held data back at once, so nothing else bounds it)
MAX_HELD = MAX_MESSAGE + 5
# what the gRPC library sets itself: not the caller's metadata (as relay.caller_metadata)
_TRANSPORT_KEYS = frozenset({b"user-agent", b"content-type", b"te", b"host", b"grpc-timeout", b"grpc-encoding",
                             b"grpc-accept-encoding", b"grpc-message-type"})
_RST_CODES = {0x7: grpc.StatusCode.UNAVAILABLE, 0x8: grpc.StatusCode.CANCELLED,  # REFUSED_STREAM, CANCEL
              0xB: grpc.StatusCode.RESOURCE_EXHAUSTED, 0xC: grpc.StatusCode.PERMISSION_DENIED}


class _Held:
    """An intercepted call: kubelet's request held until complete, then the runtime's answer held for the proxy."""

    __slots__ = (
        "_hdr",
        "answered",
        "down_window",
        "forwarded",
        "icpt",
        "initial_block",
        "initial_frames",
        "kube_reset",
        "late_mark",
        "metadata",
        "method",
        "passes",
        "refused",
        "request",
        "resp_data",
        "response",
        "sent_down",
        "sid",
        "t0",
        "timeout",
        "trailer_block",
        "trailer_frames",
        "uncredited",
        "up_closed",
        "up_reset",
        "up_window",
    )

    def __init__(self, sid: int, method: str, icpt: Interceptor, passes: PassThrough | None,
                 headers: list[tuple[bytes, bytes]], down_window: int, up_window: int) -> None:
        self.sid = sid
        self.method = method
        self.icpt = icpt
        self.passes = passes            # the interceptor's PassThrough: may the call go on unheld (frame_kubelet)
        self.t0 = time.perf_counter()
        self.metadata = _metadata(headers, skip=_TRANSPORT_KEYS)
        self.timeout: float | None = None
        for k, v in headers:
            if k == b"grpc-timeout":
                self.timeout = h2.grpc_timeout(v)
        self.request = bytearray()
        self.up_closed = False          # kubelet ended the request on a HEADERS frame (went upstream as it came)
        self.kube_reset = False         # kubelet reset the stream: the decision is carried through, not answered
        self.up_reset = False           # the runtime reset the stream: it sends nothing more on it
        self.late_mark = 0              # the highest stream the runtime got before the proxy's RST_STREAM
        self.refused = ""               # why the runtime did not process the call (REFUSED_STREAM, GOAWAY)
        self.forwarded = False
        self.answered = False
        self.down_window = down_window  # kubelet's receive window of this stream
        self.up_window = up_window      # the runtime's receive window of this stream
        self.resp_data = bytearray()
        self.uncredited = 0             # the runtime's answer DATA received and not credited back yet (frame_runtime)
        self.sent_down = 0              # DATA the proxy wrote to kubelet on this stream (its answer)
        self.initial_frames = b""
        self.initial_block = b""
        self.trailer_frames = b""
        self.trailer_block = b""
        self._hdr: tuple[bytearray, bytearray, bool] | None = None  # a response header block being collected
        self.response: asyncio.Future[BaseException | None] = asyncio.get_running_loop().create_future()

    def response_headers(self, flags: int, frame: bytes, fragment: bytes, end_stream: bool | None) -> None:
        """A HEADERS (``end_stream`` given) or CONTINUATION frame of the runtime's answer on this stream."""
        if end_stream is not None:
            self._hdr = (bytearray(frame), bytearray(fragment), end_stream)
        elif self._hdr is None:
            raise _ProtocolError(f"CONTINUATION without HEADERS on stream {self.sid}")
        else:
            self._hdr[0].extend(frame)
            self._hdr[1].extend(fragment)
            if len(self._hdr[1]) > _MAX_HEADER_LIST:
                raise _ProtocolError(f"the runtime's header block on stream {self.sid} is larger than "
                                     f"{_MAX_HEADER_LIST} bytes")
        if flags & _END_HEADERS:
            frames, block, end = self._hdr
            self._hdr = None
            if end:
                self.trailer_frames, self.trailer_block = bytes(frames), bytes(block)
                self.done(None)
            else:
                self.initial_frames, self.initial_block = bytes(frames), bytes(block)

    def answer_untouched(self) -> bool:
        """Nothing of the runtime's answer has come (no frame, no reset, no GOAWAY beyond it): the call may still
        go on unheld."""
        return self._hdr is None and not self.initial_frames and not self.resp_data and not self.response.done()

    def done(self, error: BaseException | None) -> None:
        if not self.response.done():
            self.response.set_result(error)

    def request_data(self, flags: int, payload: bytes) -> None:
        """A DATA frame's payload of kubelet's request (its padding taken off)."""
        self.request.extend(unpadded(flags, payload))
        if len(self.request) > MAX_HELD:
            raise _ProtocolError(f"{self.method} request on stream {self.sid} larger than {MAX_HELD} bytes")

    def response_data(self, flags: int, payload: bytes) -> None:
        """A DATA frame's payload of the runtime's answer (its padding taken off)."""
        self.resp_data.extend(unpadded(flags, payload))
        if len(self.resp_data) > MAX_HELD:
            raise _ProtocolError(f"the runtime's {self.method} answer on stream {self.sid} larger than {MAX_HELD} "
                                 "bytes")

    def runtime_reset(self, code: int) -> None:
        """The runtime reset the stream with HTTP/2 error ``code``: it sends nothing more; REFUSED_STREAM before
        its answer means it did not process the call."""
        self.up_reset = True
        why = f"numapin: the runtime reset the stream (HTTP/2 error {code})"
        if code == h2.REFUSED_STREAM and not self.response.done():
            self.refused = why
        self.done(grpc.aio.AioRpcError(_RST_CODES.get(code, grpc.StatusCode.INTERNAL), None, None, why))


def held_at_once(held: Iterable[_Held]) -> None:
    """The requests of the calls held at once on one connection share one ``MAX_HELD`` (conn_limits)."""
    if sum(len(x.request) for x in held) > MAX_HELD:
        raise _OverBudget(f"intercepted requests held at once on one connection larger than {MAX_HELD} bytes")


def unpadded(flags: int, payload: bytes) -> bytes:
    if flags & _PADDED:
        if not payload or payload[0] >= len(payload):
            raise _ProtocolError("DATA frame: padding longer than the frame")
        return payload[1:len(payload) - payload[0]]
    return payload
