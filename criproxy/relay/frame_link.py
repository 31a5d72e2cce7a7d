"""What the parts of one relayed connection share (``_Link``, the base of ``frame_connection._Connection``): its
two peers, the relayed calls in flight (for the metrics), the held calls, the flow-control book and the bounds of
what a client may cost; and what the connections of one listening socket share (``_Server``).

- Flow control stays exact: held DATA is credited back to its sender (WINDOW_UPDATE for the stream and the
  connection: the proxy is its receiver) at once while more of the message is to come, else with the proxy's next
  frames to it (``_Peer.owe``; a held answer's mostly by the receiver's credit for the proxy's own answer,
  ``frame_intercept._settle``), and what the proxy writes itself is withheld from the receiver's next
  connection-level WINDOW_UPDATEs, so each side's windows match the other's. Until those come, the sender counts on
  more of the receiver's connection window than there is (by what the proxy wrote): a relayed DATA frame beyond
  the receiver's window waits in ``_Peer.backlog`` (split at the window; what follows, the proxy's own frames too,
  in order behind it) and goes as the receiver grants more, so neither side is sent more than it granted.
- The proxy's own frames (credits, edited messages, answers, resets) never go between a relayed HEADERS frame and
  its CONTINUATION frames (RFC 9113 6.10): they wait in ``_Peer.queued`` until the relayed header block ends.
- What a client connection may cost is bounded (``conn_limits``): descriptors (every connection the process has
  descriptors for is served; one beyond is told GOAWAY and closed), an idle connection (asked to go, then closed),
  bytes held per connection, frames per second (a flood is told GOAWAY ENHANCE_YOUR_CALM and closed).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any

import grpc
import grpc.aio
import hpack

from criproxy.relay import frame_held
from criproxy.relay import h2wire as h2
from criproxy.relay.conn_limits import ConnectionLimits, FrameBudget
from criproxy.relay.frame_headers import _MAX_HEADER_LIST, _Blocks, _ProtocolError, _Routes, _Statuses
from criproxy.relay.frame_held import _Held
from criproxy.relay.frame_peer import _Peer
from criproxy.relay.grpc_relay import Observer, RelayHandler, normalize_endpoint

log = logging.getLogger("numapin.criproxy")

_REFUSAL_LOG_PERIOD = 10.0  # at most one log line per period about turned-away connections
_TURNED_AWAY_LINGER = 2.0   # seconds a turned-away client has to read the GOAWAY before its connection closes


class _Server:
    """What the connections of one listening socket share."""

    def __init__(self, handler: RelayHandler, limits: ConnectionLimits, on_turned_away: Callable[[], None] | None,
                 on_closed: Callable[[str], None] | None = None) -> None:
        self.runtime_path = normalize_endpoint(handler.upstream.endpoint)[len("unix:"):]
        self.routes = _Routes(dict(handler.interceptors), dict(handler.pass_through))
        self.statuses = _Statuses()
        self.blocks = _Blocks()
        self.observe: Observer | None = handler.observe
        self.connections: set[_Link] = set()
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
        """Ask idle connections to go, and close those asked that are done (``_Link.idle_check``)."""
        timeout = self.limits.idle_timeout
        period = min(max(timeout / 4, 0.05), 5.0)
        while True:
            await asyncio.sleep(period)
            now = time.monotonic()
            for c in list(self.connections):
                c.idle_check(now, timeout, self.limits.drain_grace)


class _Link:
    """One relayed connection's state and what its parts share: the base of each part (``frame_intercept``,
    ``frame_kubelet``, ``frame_runtime``), which ``frame_connection._Connection`` puts together."""

    def __init__(self, server: _Server) -> None:
        self.server = server
        self.kube = _Peer("kubelet")
        self.rt = _Peer("runtime")
        self.held: dict[int, _Held] = {}
        self.calls: dict[int, tuple[str, float]] = {}  # relayed calls in flight, for the metrics
        self.state = "connecting"                       # connecting, relaying, refusing, calming, closed
        self.pending = bytearray()                      # kubelet's bytes before the runtime connection is up
        self.last_sid = 0                               # the highest stream kubelet opened
        # kubelet to runtime (frame_kubelet)
        self.preface = False
        self.ktail = b""
        self.decoder = hpack.Decoder(max_header_list_size=_MAX_HEADER_LIST)  # paired with kubelet's encoder
        self.kcont: tuple[int, int, bytearray] | None = None   # kubelet header block being collected
        # runtime to kubelet (frame_runtime)
        self.rtail = b""
        self.rcont: tuple[int, bytearray] | None = None        # runtime trailer block of a relayed call
        self.rcont_held: _Held | None = None
        self.rblock_open = False  # the runtime's frames passed on to kubelet end inside a header block
        # held calls the proxy answered (frame_intercept)
        self.late: dict[int, int] = {}  # answered streams the runtime may still send on: highest stream id then
        self.late_block = 0              # a late stream whose dropped header block goes on in CONTINUATIONs
        self.kube_gone = False
        self.credit = asyncio.Event()
        self.tasks: set[asyncio.Task[None]] = set()
        self.refusal = ""
        now = time.monotonic()
        self.heard = now       # when kubelet last sent anything
        self.draining = 0.0    # when it was asked to go for being idle (0: not asked)
        self.budget = FrameBudget(server.limits.frame_rate, server.limits.frame_burst, now)
        self.flush_soon: asyncio.Handle | None = None  # the corked writes go at the loop's next turn (``uncork``)

    # --- writes: one system call per peer for what one read and the interceptors it wakes send

    def cork(self) -> None:
        """A read begins: what it sends to either peer is collected (``_Peer.cork``) until ``uncork``."""
        self.kube.cork()
        self.rt.cork()

    def uncork(self) -> None:
        """A read is done. Without held calls, what it collected goes now (one write per peer); with held calls, at
        the loop's next turn, after the interceptors it woke (scheduled before) have run as far as they can without
        waiting: their frames (a held request's message, the answer's headers, message and trailers) go in the same
        write as the read's own, instead of a write each. The order of what each peer is sent never changes."""
        if self.held and self.state == "relaying":
            if self.flush_soon is None:
                self.flush_soon = asyncio.get_running_loop().call_soon(self.flush)
        elif self.flush_soon is None:
            self.flush()

    def flush(self) -> None:
        self.flush_soon = None
        self.kube.flush()
        self.rt.flush()

    # --- tear-down and what a client may cost

    def _close(self) -> None:
        self.flush()  # what was collected goes before the close
        self.state = "closed"
        self.credit.set()  # window waiters see the end
        for peer in (self.kube, self.rt):
            if peer.transport is not None:
                peer.transport.close()
        self.server.connections.discard(self)

    def abort(self) -> None:
        for peer in (self.kube, self.rt):
            peer.corked = None
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
        self.flush()
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

    # --- the flow-control book (both directions)

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

    def _check_backlog(self, peer: _Peer) -> None:
        """Frames waiting for ``peer``'s window are bounded by the credit the proxy's own DATA took from it (the
        other side's view of the window is larger by that much): beyond it, the other side broke flow control."""
        if peer.backlog_size > peer.withhold + frame_held.MAX_HELD:
            other = "runtime" if peer is self.kube else "kubelet"
            self._fail(f"the {other} sent beyond {peer.name}'s flow-control window "
                       f"({peer.backlog_size} bytes waiting)")

    def _call_ended(self, sid: int, code: grpc.StatusCode) -> None:
        call = self.calls.pop(sid, None)
        if call is not None and self.server.observe is not None:
            self.server.observe(call[0], time.perf_counter() - call[1], code)
