"""kubelet's frames on their way to the runtime (``_FromKubelet``, a part of ``frame_connection._Connection``).

- Header blocks from kubelet are decoded (``hpack``) only to keep a decoder paired with kubelet's encoder and to
  learn each new stream's ``:path``; the frames themselves go on verbatim, so the runtime's decoder stays paired
  with kubelet's encoder.
- kubelet's SETTINGS reach the runtime with ``SETTINGS_HEADER_TABLE_SIZE`` 0: the runtime then encodes its header
  blocks (responses) without the dynamic table, so the relay can read, hold or replace a response's headers
  without keeping the response direction's HPACK state, and writes its own blocks as literals without indexing.
  Nothing else is changed (kubelet's decoder accepts a smaller table than it offered).
- Streams of an intercepted method (``RelayHandler.interceptors``) are *held*: their HEADERS go upstream at once
  (the HPACK order), their DATA is kept (``frame_held``) until the request is complete, then the interceptor
  decides (``frame_intercept``). A request that comes whole in its last DATA frame is first shown to the
  interceptor's ``PassThrough`` (``RelayHandler.pass_through``): a call it passes is relayed from then on as an
  unheld one, that frame as it came (``_passes``).
"""

from __future__ import annotations

import time

import grpc
import hpack

from criproxy.relay import frame_held
from criproxy.relay import h2wire as h2
from criproxy.relay.frame_headers import _MAX_HEADER_LIST, _OverBudget, _ProtocolError
from criproxy.relay.frame_held import _Held, held_at_once
from criproxy.relay.frame_intercept import _Intercepting
from criproxy.relay.frame_peer import _frames, _pass_on

_DATA, _HEADERS, _RST, _SETTINGS, _WU, _CONT = (h2.DATA, h2.HEADERS, h2.RST_STREAM, h2.SETTINGS, h2.WINDOW_UPDATE,
                                              h2.CONTINUATION)
_END_STREAM, _END_HEADERS, _PADDED = h2.END_STREAM, h2.END_HEADERS, h2.PADDED


class _FromKubelet(_Intercepting):
    """kubelet's bytes relayed to the runtime, whole frames at a time."""

    def from_kubelet(self, data: bytes) -> None:
        if self.ktail:
            data = self.ktail + data
            self.ktail = b""
        pos = 0
        if not self.preface:
            if len(data) < 24:
                if not h2.PREFACE.startswith(data):
                    self._fail("the client did not start with the HTTP/2 connection preface")
                else:
                    self.ktail = data
                return
            if data[:24] != h2.PREFACE:
                self._fail("the client did not start with the HTTP/2 connection preface")
                return
            self.preface = True
            pos = 24
        start = 0
        out: list[bytes] = []
        rt = self.rt
        held = self.held
        done = pos
        cut: int | None = 0 if rt.backlog else None  # where the frames waiting for the runtime's window begin
        count = 0
        try:
            for pos, end, ftype, flags, sid in _frames(data, done):
                count += 1
                length = end - pos - 9
                if ftype == _DATA:
                    h = held.get(sid)
                    if h is None:
                        if cut is None and not rt.take(length):  # from here on, frames wait for the window
                            out.append(data[start:pos])
                            start = pos
                            cut = len(out)
                    elif flags & _END_STREAM and h.passes is not None and self._passes(h, flags, data[pos + 9:end]):
                        # the interceptor needs nothing of this call: relayed as it came, an unheld call from here
                        if cut is None and not rt.take(length):
                            out.append(data[start:pos])
                            start = pos
                            cut = len(out)
                    else:
                        out.append(data[start:pos])
                        start = end
                        self._held_request_data(h, flags, data[pos + 9:end], length)
                elif ftype in (_HEADERS, _CONT):
                    self._request_headers(ftype, flags, sid, data[pos + 9:end])
                elif ftype == _SETTINGS:
                    if not flags & h2.ACK:
                        out.append(data[start:pos])
                        start = end
                        out.append(self._kubelet_settings(data[pos + 9:end]))
                elif ftype == _WU:
                    rewritten = self._window_update(self.kube, sid, data[pos + 9:end])
                    if rewritten is not None:
                        out.append(data[start:pos])
                        start = end
                        out.append(rewritten)
                elif ftype == _RST:
                    h = held.get(sid)
                    if h is not None and not h.answered:  # the request never completed: nothing to decide, and
                        del held[sid]                     # the runtime's stream (its HEADERS went) is reset too
                        if h.uncredited:  # an answer the runtime sent early, whole: its DATA credited back
                            self.rt.owe(h.uncredited)
                    elif h is not None:  # the proxy owns the upstream stream now: not forwarded
                        out.append(data[start:pos])
                        start = end
                        h.kube_reset = True
                        self.credit.set()  # its answer, if being sent, stops waiting for credit
                    elif self.calls:
                        self._call_ended(sid, grpc.StatusCode.CANCELLED)
                done = end
            if len(data) - done >= 9:  # a frame not whole yet: refused before it is buffered if the runtime would
                size = int.from_bytes(data[done:done + 3], "big")
                if size > rt.max_frame:
                    raise _OverBudget(f"a frame of {size} bytes, larger than the runtime accepts "
                                      f"(SETTINGS_MAX_FRAME_SIZE {rt.max_frame})")
        except _ProtocolError as e:
            self._fail(str(e), "memory" if isinstance(e, _OverBudget) else "")
            return
        now = time.monotonic()
        self.heard = now
        if not self.budget.take(count, now):
            self._calm_down()
            return
        self.ktail = data[done:]
        _pass_on(rt, data, start, done, out, self.kcont is not None, cut)
        if cut is not None:
            self._check_backlog(rt)

    def _kubelet_settings(self, payload: bytes) -> bytes:
        """kubelet's SETTINGS as the runtime gets them: HEADER_TABLE_SIZE 0 (see the module doc)."""
        entries = h2.settings_entries(payload)
        for key, value in entries:
            self._setting(self.kube, key, value)
        kept = [(k, v) for k, v in entries if k != h2.SETTINGS_HEADER_TABLE_SIZE]
        return h2.settings_frame([*kept, (h2.SETTINGS_HEADER_TABLE_SIZE, 0)])

    def _request_headers(self, ftype: int, flags: int, sid: int, payload: bytes) -> None:
        if ftype == _HEADERS:
            if self.kcont is not None:
                raise _ProtocolError("HEADERS while a header block is open")
            fragment = h2.header_block_fragment(flags, payload) if flags & (_PADDED | h2.PRIORITY_FLAG) else payload
            if not flags & _END_HEADERS:
                self.kcont = (sid, flags, bytearray(fragment))
                return
            block = fragment
        else:
            if self.kcont is None or self.kcont[0] != sid:
                raise _ProtocolError("CONTINUATION without its HEADERS")
            self.kcont[2].extend(payload)
            if len(self.kcont[2]) > _MAX_HEADER_LIST:
                raise _ProtocolError(f"a header block larger than {_MAX_HEADER_LIST} bytes")
            if not flags & _END_HEADERS:
                return
            sid, flags, whole = self.kcont
            self.kcont = None
            block = bytes(whole)
        try:
            headers = self.decoder.decode(block, raw=True)
        except hpack.HPACKError as e:
            raise _ProtocolError(f"cannot decode the client's header block: {e}") from e
        if sid > self.last_sid:  # a new stream: a call
            self.last_sid = sid
            path = b""
            for k, v in headers:
                if k == b":path":
                    path = v
                    break
            method, icpt, passes = self.server.routes.of(path)
            self.calls[sid] = (method, time.perf_counter())  # in flight: the connection is not idle
            if icpt is not None and not flags & _END_STREAM:
                self.calls.pop(sid, None)
                self.held[sid] = _Held(sid, method, icpt, passes, [(bytes(k), bytes(v)) for k, v in headers],
                                       self.kube.init_window, self.rt.init_window)
        elif flags & _END_STREAM:  # the client's trailers end the request
            h = self.held.get(sid)
            if h is not None and not h.answered:
                h.up_closed = True
                self._start(h)

    def _passes(self, h: _Held, flags: int, payload: bytes) -> bool:
        """The last DATA frame of held call ``h``'s request (END_STREAM): when it carries the whole request, one
        uncompressed message, before anything of the answer, and the interceptor's ``PassThrough`` says the call
        needs nothing of it, the call is no longer held (True): this frame goes on as it came, uncredited, and the
        answer's frames are relayed as they come (the call's status for the metrics from its trailers). Decided on
        the event loop from the state of the moment (docs/performance.md, issue 37)."""
        if h.request or not h.answer_untouched():
            return False  # part of the request was credited back already, or the runtime answered early: held
        message = frame_held.unpadded(flags, payload)
        if len(message) < 5 or message[0] != 0 or int.from_bytes(message[1:5], "big") != len(message) - 5:
            return False  # the interceptor's path answers it (INVALID_ARGUMENT, UNIMPLEMENTED)
        assert h.passes is not None
        try:
            unchanged = h.passes(message[5:])
        except Exception:  # a request it cannot read: the interceptor runs and reports it
            return False
        if not unchanged:
            return False
        del self.held[h.sid]
        self.calls[h.sid] = (h.method, h.t0)
        return True

    def _held_request_data(self, h: _Held, flags: int, payload: bytes, length: int) -> None:
        h.request_data(flags, payload)
        if len(self.held) > 1:
            held_at_once(self.held.values())
        if length:  # the proxy is this data's receiver: credit the stream and the connection back to kubelet
            if flags & _END_STREAM:  # the request is whole: the connection's credit goes with the next frames to it
                self.kube.owe(length)
            else:
                self.kube.write(h2.window_update(0, length) + h2.window_update(h.sid, length))
        if flags & _END_STREAM:
            self._start(h)
