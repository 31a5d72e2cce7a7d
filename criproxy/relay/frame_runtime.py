"""The runtime's frames on their way to kubelet (``_FromRuntime``, a part of ``frame_connection._Connection``).

- The runtime's trailers give each relayed call's status for the metrics (a block is decoded once and
  remembered: without the dynamic table, equal bytes mean equal headers).
- A held call's answer (header frames, message, trailers) is kept for the proxy (``frame_held``), not passed on,
  its DATA credited back at the end of the read while the answer is not whole (a whole one's credit is settled
  when the proxy has answered, ``frame_intercept``); a stream the proxy answered itself gets none of its late
  frames (``frame_intercept``).
- A runtime GOAWAY fails the held calls beyond it, an RST_STREAM its held call: the runtime will not process them.
"""

from __future__ import annotations

import grpc
import grpc.aio

from criproxy.relay import h2wire as h2
from criproxy.relay.frame_headers import _MAX_HEADER_LIST, _ProtocolError
from criproxy.relay.frame_held import _Held
from criproxy.relay.frame_intercept import _Intercepting
from criproxy.relay.frame_peer import _frames, _pass_on

_DATA, _HEADERS, _RST, _SETTINGS, _GOAWAY, _WU, _CONT = (h2.DATA, h2.HEADERS, h2.RST_STREAM, h2.SETTINGS, h2.GOAWAY,
                                                      h2.WINDOW_UPDATE, h2.CONTINUATION)
_END_STREAM, _END_HEADERS = h2.END_STREAM, h2.END_HEADERS
# a held call's whole answer up to this much DATA is credited back to the runtime once the proxy has answered
# (``_Intercepting._settle``); a larger one at once
_SETTLED_LATER = 16_384


class _FromRuntime(_Intercepting):
    """The runtime's bytes relayed to kubelet, whole frames at a time."""

    def from_runtime(self, data: bytes) -> None:
        if self.rtail:
            data = self.rtail + data
            self.rtail = b""
        pos = start = 0
        out: list[bytes] = []
        kube = self.kube
        held = self.held
        late = self.late
        done = pos
        cut: int | None = 0 if kube.backlog else None  # where the frames waiting for kubelet's window begin
        try:
            for pos, end, ftype, flags, sid in _frames(data, done):
                length = end - pos - 9
                if late and sid in late:
                    out.append(data[start:pos])
                    start = end
                    self._late_frame(ftype, flags, sid, length)
                    done = end
                    continue
                if ftype == _DATA:
                    h = held.get(sid)
                    if h is None:
                        if cut is None and not kube.take(length):  # from here on, frames wait for the window
                            out.append(data[start:pos])
                            start = pos
                            cut = len(out)
                        if flags & _END_STREAM and self.calls:
                            self._call_ended(sid, grpc.StatusCode.UNKNOWN)
                    else:
                        out.append(data[start:pos])
                        start = end
                        self._held_response_data(h, flags, data[pos + 9:end], length)
                elif ftype == _HEADERS:
                    if late:
                        self._forget_late(sid)
                    h = held.get(sid)
                    if h is not None:
                        out.append(data[start:pos])
                        start = end
                        fragment = h2.header_block_fragment(flags, data[pos + 9:end])
                        if not flags & _END_HEADERS:
                            self.rcont_held = h
                        h.response_headers(flags, data[pos:end], fragment, bool(flags & _END_STREAM))
                    else:
                        self.rblock_open = not flags & _END_HEADERS
                    if h is None and flags & _END_STREAM and self.calls:
                        fragment = h2.header_block_fragment(flags, data[pos + 9:end])
                        if flags & _END_HEADERS:
                            self._call_ended(sid, self.server.statuses.of(fragment))
                        else:
                            self.rcont = (sid, bytearray(fragment))
                elif ftype == _CONT:
                    if self.rcont_held is not None and self.rcont_held.sid == sid:
                        out.append(data[start:pos])
                        start = end
                        self.rcont_held.response_headers(flags, data[pos:end], data[pos + 9:end], None)
                        if flags & _END_HEADERS:
                            self.rcont_held = None
                        done = end
                        continue
                    self.rblock_open = not flags & _END_HEADERS
                    if self.rcont is not None and self.rcont[0] == sid:
                        self.rcont[1].extend(data[pos + 9:end])
                        if len(self.rcont[1]) > _MAX_HEADER_LIST:  # kubelet's limit too: not kept, not decoded
                            self.rcont = None
                            self._call_ended(sid, grpc.StatusCode.UNKNOWN)
                        elif flags & _END_HEADERS:
                            block = bytes(self.rcont[1])
                            self.rcont = None
                            self._call_ended(sid, self.server.statuses.of(block))
                elif ftype == _SETTINGS:
                    if not flags & h2.ACK:
                        for key, value in h2.settings_entries(data[pos + 9:end]):
                            self._setting(self.rt, key, value)
                elif ftype == _WU:
                    rewritten = self._window_update(self.rt, sid, data[pos + 9:end])
                    if rewritten is not None:
                        out.append(data[start:pos])
                        start = end
                        out.append(rewritten)
                elif ftype == _GOAWAY and length >= 8:
                    last = int.from_bytes(data[pos + 9:pos + 13], "big") & 0x7FFFFFFF
                    for h in held.values():  # RFC 9113 6.8: the runtime will not process these: fail them now
                        if h.sid > last and not h.response.done():
                            h.refused = "numapin: the runtime is going away (GOAWAY) and did not take the call"
                            h.done(grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, None, None, h.refused))
                elif ftype == _RST:
                    h = held.get(sid)
                    if h is not None:
                        out.append(data[start:pos])
                        start = end
                        h.runtime_reset(int.from_bytes(data[pos + 9:end], "big") if length == 4 else 0)
                    elif self.calls:
                        self._call_ended(sid, grpc.StatusCode.CANCELLED)
                done = end
        except _ProtocolError as e:
            self._fail(str(e))
            return
        self.rtail = data[done:]
        if held:  # a held call may have been answered or reset: its sender stops waiting for credit (send_data)
            self.credit.set()
            for h in held.values():
                # more of it to come: the runtime must not wait for credit; or so much that the runtime's other
                # streams would, while the interceptor runs on
                if h.uncredited and (not h.response.done() or h.uncredited > _SETTLED_LATER):
                    self.rt.write(h2.window_update(0, h.uncredited) + h2.window_update(h.sid, h.uncredited))
                    h.uncredited = 0
        _pass_on(kube, data, start, done, out, self.rblock_open, cut)
        if cut is not None:
            self._check_backlog(kube)

    def _held_response_data(self, h: _Held, flags: int, payload: bytes, length: int) -> None:
        """The proxy receives it: credited back to the runtime at the end of this read if the answer is not whole
        then, else once the proxy has answered kubelet (``_settle``: kubelet's credit for that answer stands for
        it, as for a relayed answer, and saves a write to the runtime per held call)."""
        h.response_data(flags, payload)
        h.uncredited += length
        if flags & _END_STREAM:
            h.done(None)
