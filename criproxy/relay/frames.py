"""The frame relay: HTTP/2 frames forwarded between each of kubelet's connections and a runtime connection of its own.

For every connection accepted on the proxy's socket the relay opens one connection to the runtime and copies the
byte stream across in both directions, whole frames at a time, without gRPC in between: one read and one write
per burst of frames, no per-call objects on the relayed path. What it looks at:

- Header blocks from kubelet are decoded (``hpack``) only to keep a decoder paired with kubelet's encoder and to
  learn each new stream's ``:path``; the frames themselves go on verbatim, so the runtime's decoder stays paired
  with kubelet's encoder.
- kubelet's SETTINGS reach the runtime with ``SETTINGS_HEADER_TABLE_SIZE`` 0: the runtime then encodes its header
  blocks (responses) without the dynamic table, so the relay can read, hold or replace a response's headers
  without keeping the response direction's HPACK state, and writes its own blocks as literals without indexing.
  Nothing else is changed (kubelet's decoder accepts a smaller table than it offered).
- Streams of an intercepted method (``RelayHandler.interceptors``) are *held*: their HEADERS go upstream at once
  (the HPACK order), their DATA is kept until the request is complete; the interceptor runs on the event loop and
  its ``Forward`` sends the (possibly edited) message on the same upstream stream, framed at the runtime's
  SETTINGS_MAX_FRAME_SIZE within its flow-control windows, and collects the response. The proxy then answers
  kubelet (the runtime's header frames, the interceptor's message, the runtime's trailers) or, for a rejection,
  with a trailers-only response, and resets the upstream stream when nothing was forwarded.
- Flow control stays exact: held DATA is credited back to its sender at once (WINDOW_UPDATE for the stream and the
  connection: the proxy is its receiver), and what the proxy writes itself is withheld from the receiver's next
  connection-level WINDOW_UPDATEs, so each side's windows match the other's. Until those come, the sender counts on
  more of the receiver's connection window than there is (by what the proxy wrote): a relayed DATA frame beyond
  the receiver's window waits in ``_Peer.backlog`` (split at the window; what follows, the proxy's own frames too,
  in order behind it) and goes as the receiver grants more, so neither side is sent more than it granted.
- A held call the proxy answered itself has its runtime stream reset; the runtime's frames still on the way for it
  (``_Connection.late``) are dropped, not passed to kubelet's closed stream, and their DATA credited back.
- A held call the runtime refused (RST_STREAM REFUSED_STREAM, or beyond its GOAWAY) is refused to kubelet the same
  way when the interceptor passes the failure on: kubelet's gRPC retries an unprocessed call once by itself.
- What a client connection may cost is bounded (``conn_limits``): descriptors (every connection the process has
  descriptors for is served; one beyond is told GOAWAY and closed), an idle connection (asked to go, then closed),
  bytes held per connection, frames per second (a flood is told GOAWAY ENHANCE_YOUR_CALM and closed).
- The proxy's own frames (credits, edited messages, answers, resets) never go between a relayed HEADERS frame and
  its CONTINUATION frames (RFC 9113 6.10): they wait in ``_Peer.queued`` until the relayed header block ends.
- The runtime's trailers give each relayed call's status for the metrics (a block is decoded once and
  remembered: without the dynamic table, equal bytes mean equal headers).

The runtime going away closes kubelet's connection (kubelet reconnects, as with a runtime restart); a runtime that
cannot be reached answers kubelet's calls UNAVAILABLE and closes the connection; kubelet going away closes the
runtime connection once the interceptors still running on it are done (a decision is carried through).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any, cast

import grpc
import grpc.aio
import hpack

from criproxy.relay import frame_held
from criproxy.relay import h2wire as h2
from criproxy.relay.conn_limits import MAX_PENDING, ConnectionLimits, FrameBudget
from criproxy.relay.frame_headers import (
    _CACHE_LIMIT,
    _MAX_HEADER_LIST,
    _message,
    _metadata,
    _OverBudget,
    _ProtocolError,
    _Routes,
    _stateless_decode,
    _status_code,
    _Statuses,
    _unquote,
)
from criproxy.relay.frame_held import _Held, held_at_once
from criproxy.relay.frame_peer import _frames, _Peer
from criproxy.relay.grpc_relay import (
    Forward,
    Observer,
    Outcome,
    RelayHandler,
    _Replies,
    intercept,
    normalize_endpoint,
)

log = logging.getLogger("numapin.criproxy")

_FRAME = h2.FRAME_HEADER.unpack_from
_DATA, _HEADERS, _RST, _SETTINGS, _PING, _GOAWAY, _WU, _CONT = (h2.DATA, h2.HEADERS, h2.RST_STREAM, h2.SETTINGS,
                                                               h2.PING, h2.GOAWAY, h2.WINDOW_UPDATE, h2.CONTINUATION)
_END_STREAM, _END_HEADERS, _PADDED = h2.END_STREAM, h2.END_HEADERS, h2.PADDED
_CONNECT_TIMEOUT = 20.0
_REFUSAL_LOG_PERIOD = 10.0  # at most one log line per period about turned-away connections
_TURNED_AWAY_LINGER = 2.0   # seconds a turned-away client has to read the GOAWAY before its connection closes



class _StreamForward(Forward):
    """``Forward`` for a held stream: the message goes on the stream kubelet opened, the answer comes back from it."""

    __slots__ = ("_conn", "_held", "replies")

    def __init__(self, conn: _Connection, held: _Held) -> None:
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
        try:
            initial = _stateless_decode(held.initial_block) if held.initial_block else []
            trailer = _stateless_decode(held.trailer_block)
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
        trailer = _stateless_decode(self._held.trailer_block) if self._held.trailer_block else []
        return _unquote(next((v for k, v in trailer if k == b"grpc-message"), b""))



def _pass_on(peer: _Peer, data: bytes, start: int, pos: int, out: list[bytes], block_open: bool,
             cut: int | None) -> None:
    """Write to ``peer`` what a pass over ``data`` kept (``out``, then ``data[start:pos]``): ``data`` itself when
    every frame went as it came; ``block_open``: what was kept ends inside a header block; ``cut``: the pieces of
    ``out`` from there on (and ``data[start:pos]``) wait for ``peer``'s connection window (None: nothing waits)."""
    if cut is None:
        if start == 0 and pos == len(data):
            peer.relay(data, block_open)
        else:
            out.append(data[start:pos])
            peer.relay(b"".join(out), block_open)
    else:
        out.append(data[start:pos])
        peer.relay(b"".join(out[:cut]), block_open, b"".join(out[cut:]))


class _RuntimeSide(asyncio.Protocol):
    """The runtime connection's protocol: hands everything to its ``_Connection``."""

    def __init__(self, conn: _Connection) -> None:
        self.conn = conn

    def data_received(self, data: bytes) -> None:
        self.conn.from_runtime(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.conn.runtime_lost(exc)

    def pause_writing(self) -> None:
        self.conn.pause(self.conn.kube)

    def resume_writing(self) -> None:
        self.conn.resume(self.conn.kube)



class _Server:
    """What the connections of one listening socket share."""

    def __init__(self, handler: RelayHandler, limits: ConnectionLimits, on_turned_away: Callable[[], None] | None,
                 on_closed: Callable[[str], None] | None = None) -> None:
        self.runtime_path = normalize_endpoint(handler.upstream.endpoint)[len("unix:"):]
        self.routes = _Routes(dict(handler.interceptors))
        self.statuses = _Statuses()
        self.observe: Observer | None = handler.observe
        self.connections: set[_Connection] = set()
        self.limits = limits
        self.max_connections = limits.cap()
        self.on_turned_away = on_turned_away
        self.on_closed = on_closed or (lambda why: None)  # a connection closed for what it cost: idle, frames, memory
        self.lingering = 0         # turned-away connections still open (reading the GOAWAY)
        self.turned_away = 0       # since the last log line about them
        self.logged_at = -_REFUSAL_LOG_PERIOD

    def turn_away(self, transport: asyncio.Transport) -> None:
        """A connection beyond ``max_connections``: told GOAWAY at once (no stream taken, ENHANCE_YOUR_CALM: the
        client's calls fail UNAVAILABLE, unprocessed) and closed, without a runtime connection."""
        transport.write(h2.settings_frame([]) + h2.goaway(0, h2.ENHANCE_YOUR_CALM,
                                                          b"numapin: too many connections to the CRI proxy"))
        if self.lingering >= self.max_connections:  # a flood: no time to read it
            transport.abort()
        else:  # time to read the GOAWAY before the close (a close with its bytes unread resets the connection)
            self.lingering += 1  # what it sends meanwhile is read and dropped (the connection is "closed")
            asyncio.get_running_loop().call_later(_TURNED_AWAY_LINGER, self._close_turned_away, transport)
        if self.on_turned_away is not None:
            self.on_turned_away()
        self.turned_away += 1
        now = time.monotonic()
        if now - self.logged_at >= _REFUSAL_LOG_PERIOD:
            log.warning("frame relay: %d connection(s) turned away (GOAWAY): %d connections already served, the "
                        "most allowed (--max-connections)", self.turned_away, len(self.connections))
            self.turned_away = 0
            self.logged_at = now

    def _close_turned_away(self, transport: asyncio.Transport) -> None:
        self.lingering -= 1
        transport.close()

    async def sweep_idle(self) -> None:
        """Ask idle connections to go, and close those asked that are done (``_Connection.idle_check``)."""
        timeout = self.limits.idle_timeout
        period = min(max(timeout / 4, 0.05), 5.0)
        while True:
            await asyncio.sleep(period)
            now = time.monotonic()
            for c in list(self.connections):
                c.idle_check(now, timeout, self.limits.drain_grace)


class _Connection(asyncio.Protocol):
    """One kubelet connection (this protocol) and its runtime connection (``_RuntimeSide``)."""

    def __init__(self, server: _Server) -> None:
        self.server = server
        self.kube = _Peer("kubelet")
        self.rt = _Peer("runtime")
        self.held: dict[int, _Held] = {}
        self.calls: dict[int, tuple[str, float]] = {}  # relayed calls in flight, for the metrics
        self.decoder = hpack.Decoder(max_header_list_size=_MAX_HEADER_LIST)  # paired with kubelet's encoder
        self.state = "connecting"                       # connecting, relaying, refusing, calming, closed
        self.pending = bytearray()                      # kubelet's bytes before the runtime connection is up
        self.preface = False
        self.ktail = b""
        self.rtail = b""
        self.kcont: tuple[int, int, bytearray] | None = None   # kubelet header block being collected
        self.rcont: tuple[int, bytearray] | None = None        # runtime trailer block of a relayed call
        self.rcont_held: _Held | None = None
        self.rblock_open = False  # the runtime's frames passed on to kubelet end inside a header block
        self.late: dict[int, int] = {}  # answered streams the runtime may still send on: highest stream id then
        self.late_block = 0              # a late stream whose dropped header block goes on in CONTINUATIONs
        self.last_sid = 0
        self.kube_gone = False
        self.credit = asyncio.Event()
        self.tasks: set[asyncio.Task[None]] = set()
        self.refusal = ""
        now = time.monotonic()
        self.heard = now       # when kubelet last sent anything
        self.draining = 0.0    # when it was asked to go for being idle (0: not asked)
        self.budget = FrameBudget(server.limits.frame_rate, server.limits.frame_burst, now)

    # --- set-up and tear-down

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if len(self.server.connections) >= self.server.max_connections:
            self.state = "closed"
            self.server.turn_away(cast(asyncio.Transport, transport))
            return
        self.kube.transport = cast(asyncio.Transport, transport)  # a stream transport (uvloop's is no subclass)
        self.server.connections.add(self)
        self._spawn(self._connect())

    async def _connect(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            transport, _ = await asyncio.wait_for(
                loop.create_unix_connection(lambda: _RuntimeSide(self), self.server.runtime_path), _CONNECT_TIMEOUT)
        except (OSError, TimeoutError) as e:
            self._refuse(f"numapin: the runtime at {self.server.runtime_path} cannot be reached: {e}")
            return
        if self.state != "connecting":  # kubelet went away meanwhile
            transport.close()
            return
        self.rt.transport = transport
        self.state = "relaying"
        if self.pending:
            data, self.pending = bytes(self.pending), bytearray()
            self.from_kubelet(data)
            self.resume(self.kube)  # paused at MAX_PENDING bytes, if it came to that

    def data_received(self, data: bytes) -> None:
        if self.state == "relaying":
            self.from_kubelet(data)
        elif self.state == "connecting":
            self.pending.extend(data)
            if len(self.pending) > MAX_PENDING:  # read on once the runtime connection is up
                self.pause(self.kube)
        elif self.state == "refusing":
            self.pending.extend(data)
            self._refuse_calls()
            if len(self.pending) > MAX_PENDING and self.state != "closed":
                self._close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.kube_gone = True
        for sid, held in list(self.held.items()):
            held.kube_reset = True
            if not held.answered:  # its request never completed: nothing to decide
                del self.held[sid]
        if self.state == "connecting":
            self.state = "closed"
        if not self.held:
            self._close()

    def runtime_lost(self, exc: Exception | None) -> None:
        if self.state in ("closed", "calming"):
            return
        log.info("frame relay: the runtime closed a connection (%s); closing kubelet's, with %d call(s) in flight",
                 exc or "end of stream", len(self.calls) + len(self.held))
        error = grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, None, None,
                                     "numapin: the runtime closed the connection")
        for held in self.held.values():
            held.done(error)
        self._close()

    def _close(self) -> None:
        self.state = "closed"
        self.credit.set()  # window waiters see the end
        for peer in (self.kube, self.rt):
            if peer.transport is not None:
                peer.transport.close()
        self.server.connections.discard(self)

    def abort(self) -> None:
        for peer in (self.kube, self.rt):
            if peer.transport is not None:
                peer.transport.abort()
        self.state = "closed"
        self.credit.set()
        self.server.connections.discard(self)

    def pause(self, reader: _Peer) -> None:
        if reader.transport is not None and not reader.transport.is_closing():
            reader.transport.pause_reading()

    def resume(self, reader: _Peer) -> None:
        if reader.transport is not None and not reader.transport.is_closing():
            reader.transport.resume_reading()

    def pause_writing(self) -> None:  # kubelet reads slowly: stop reading the runtime
        self.pause(self.rt)

    def resume_writing(self) -> None:
        self.resume(self.rt)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def idle_check(self, now: float, timeout: float, grace: float) -> None:
        """An idle connection (no call in flight, nothing from kubelet for ``timeout`` seconds) is asked to go: GOAWAY
        NO_ERROR with the highest stream id, so every stream it sent is still served and a gRPC client opens a new
        connection for its next call; it is closed once asked ``grace`` seconds ago with no call in flight."""
        if self.state != "relaying" or self.calls or self.held:
            return
        if self.draining:
            if now - self.draining >= grace:
                log.debug("frame relay: closing a connection idle for %.0f s", now - self.heard)
                self.server.on_closed("idle")
                self._close()
        elif now - self.heard >= timeout:
            self.draining = now
            self.kube.write(h2.goaway(0x7FFFFFFF, h2.NO_ERROR, b"numapin: idle connection"))

    def _calm_down(self) -> None:
        """A client sending more frames than its budget: told GOAWAY ENHANCE_YOUR_CALM, its runtime connection
        closed at once, and itself closed after a linger in which what it sends is dropped unread (a close with its
        bytes unread would reset the connection before it reads the GOAWAY)."""
        self.kube.write(h2.goaway(self.last_sid, h2.ENHANCE_YOUR_CALM, b"numapin: too many frames"))
        self.server.on_closed("frames")
        log.warning("frame relay: closing a kubelet connection: more than %.0f frames per second on average",
                    self.server.limits.frame_rate)
        error = grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, None, None, "numapin: too many frames")
        for held in self.held.values():
            held.done(error)
        self.state = "calming"  # data_received drops everything from now on
        if self.rt.transport is not None:
            self.rt.transport.close()
        asyncio.get_running_loop().call_later(_TURNED_AWAY_LINGER, self._close)

    def _fail(self, why: str, cost: str = "") -> None:
        if cost:
            self.server.on_closed(cost)
        log.warning("frame relay: closing a kubelet connection: %s", why)
        error = grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, None, None, f"numapin: {why}")
        for held in self.held.values():
            held.done(error)
        self._close()

    # --- kubelet to runtime

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
                        if cut is None:
                            if length <= rt.window:
                                rt.window -= length
                            else:  # kubelet counts on credit the proxy's own DATA took (RFC 9113 6.9.1)
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

    def _setting(self, peer: _Peer, key: int, value: int) -> None:
        if key == h2.SETTINGS_MAX_FRAME_SIZE:
            peer.max_frame = value
        elif key == h2.SETTINGS_INITIAL_WINDOW_SIZE:
            delta = value - peer.init_window
            peer.init_window = value
            for h in self.held.values():  # RFC 9113 6.9.2: open streams' windows move by the difference
                if peer is self.rt:
                    h.up_window += delta
                else:
                    h.down_window += delta
            self.credit.set()

    def _window_update(self, sender: _Peer, sid: int, payload: bytes) -> bytes | None:
        """Book a WINDOW_UPDATE from ``sender``; the frame to pass on instead of it (b"" drops it), None: as is."""
        if len(payload) != 4:
            raise _ProtocolError("WINDOW_UPDATE of the wrong size")
        inc = int.from_bytes(payload, "big") & 0x7FFFFFFF
        if sid == 0:
            sender.window += inc
            if sender.backlog:
                sender.drain()
            self.credit.set()
            if sender.withhold:
                cut = min(sender.withhold, inc)
                sender.withhold -= cut
                return h2.window_update(0, inc - cut)
            return None
        h = self.held.get(sid)
        if h is not None:
            if sender is self.rt:
                h.up_window += inc
            else:
                h.down_window += inc
            self.credit.set()
        return None

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
            method, icpt = self.server.routes.of(path)
            self.calls[sid] = (method, time.perf_counter())  # in flight: the connection is not idle
            if icpt is not None and not flags & _END_STREAM:
                self.calls.pop(sid, None)
                self.held[sid] = _Held(sid, method, icpt, [(bytes(k), bytes(v)) for k, v in headers],
                                       self.kube.init_window, self.rt.init_window)
        elif flags & _END_STREAM:  # the client's trailers end the request
            h = self.held.get(sid)
            if h is not None and not h.answered:
                h.up_closed = True
                self._start(h)

    def _held_request_data(self, h: _Held, flags: int, payload: bytes, length: int) -> None:
        h.request_data(flags, payload)
        if len(self.held) > 1:
            held_at_once(self.held.values())
        if length:  # the proxy is this data's receiver: credit the stream and the connection back to kubelet
            self.kube.write(h2.window_update(0, length) + h2.window_update(h.sid, length))
        if flags & _END_STREAM:
            self._start(h)

    def _start(self, h: _Held) -> None:
        if h.answered:
            return
        h.answered = True
        self._spawn(self._intercepted(h))

    # --- runtime to kubelet

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
                        if cut is None:
                            if length <= kube.window:
                                kube.window -= length
                            else:  # the runtime counts on credit the proxy's own DATA took (RFC 9113 6.9.1)
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
        _pass_on(kube, data, start, done, out, self.rblock_open, cut)
        if cut is not None:
            self._check_backlog(kube)

    def _check_backlog(self, peer: _Peer) -> None:
        """Frames waiting for ``peer``'s window are bounded by the credit the proxy's own DATA took from it (the
        other side's view of the window is larger by that much): beyond it, the other side broke flow control."""
        if peer.backlog_size > peer.withhold + frame_held.MAX_HELD:
            other = "runtime" if peer is self.kube else "kubelet"
            self._fail(f"the {other} sent beyond {peer.name}'s flow-control window "
                       f"({peer.backlog_size} bytes waiting)")

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

    def _held_response_data(self, h: _Held, flags: int, payload: bytes, length: int) -> None:
        h.response_data(flags, payload)
        if length:  # the proxy received it: credit it back to the runtime
            self.rt.write(h2.window_update(0, length) + h2.window_update(h.sid, length))
        if flags & _END_STREAM:
            h.done(None)

    def _call_ended(self, sid: int, code: grpc.StatusCode) -> None:
        call = self.calls.pop(sid, None)
        if call is not None and self.server.observe is not None:
            self.server.observe(call[0], time.perf_counter() - call[1], code)

    # --- intercepted calls

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
        elif runtime_answered and _status_code(_stateless_decode(h.trailer_block)) == outcome.code \
                and outcome.details == forward.last_details():
            kube.write(h.initial_frames + h.trailer_frames)  # the runtime's own error, as it sent it
        else:
            kube.write(h2.headers_frames(sid, h2.status_block(outcome.code.value[0], outcome.details,
                                                              outcome.trailing, trailers_only=True),
                                         kube.max_frame, True))

    # --- a runtime that cannot be reached

    def _refuse(self, why: str) -> None:
        """Answer kubelet's calls on this connection UNAVAILABLE (fail fast, as gRPC does), then GOAWAY and close:
        kubelet's next call opens a new connection, and a new try at the runtime."""
        if self.state != "connecting":
            return
        self.state = "refusing"
        self.refusal = why
        log.warning("frame relay: %s; kubelet's calls on this connection fail with UNAVAILABLE", why)
        self.kube.write(h2.settings_frame([]))
        self._refuse_calls()
        asyncio.get_running_loop().call_later(10.0, self._close)

    def _refuse_calls(self) -> None:
        data = bytes(self.pending)
        if len(data) < 24:
            return
        if not data.startswith(h2.PREFACE):
            self._close()
            return
        done, answered = 24, False
        for pos, end, ftype, flags, sid in _frames(data, done):
            if ftype == _SETTINGS and not flags & h2.ACK:
                self.kube.write(h2.frame(_SETTINGS, h2.ACK, 0))
            elif ftype == _PING and not flags & h2.ACK:
                self.kube.write(h2.frame(_PING, h2.ACK, 0, data[pos + 9:end]))
            elif ftype == _HEADERS and sid > self.last_sid:
                self.last_sid = sid
                self.kube.write(h2.headers_frames(sid, h2.status_block(grpc.StatusCode.UNAVAILABLE.value[0],
                                                                       self.refusal, trailers_only=True),
                                                  self.kube.max_frame, True))
                answered = True
            done = end
        self.pending = bytearray(data[done:])
        self.pending[:0] = h2.PREFACE  # what is left parses the same next time
        if answered:
            self.kube.write(h2.goaway(self.last_sid))
            self._close()
