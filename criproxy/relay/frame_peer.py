"""One side of a relayed connection as the frame relay writes to it (``_Peer``): its SETTINGS, its connection
window and the flow-control backlog (a relayed DATA frame beyond the window waits, split at the window, and what
follows waits in order behind it), and the proxy's own frames held back while a relayed header block is open
(RFC 9113 6.10); with ``_frames``, the walk over the whole frames of a read, and ``_pass_on``, what a walk
kept written to the other side."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

from criproxy.relay import h2wire as h2

_FRAME = h2.FRAME_HEADER.unpack_from
_DATA, _END_STREAM, _PADDED = h2.DATA, h2.END_STREAM, h2.PADDED
_DEFAULT_WINDOW = 65_535
_DEFAULT_FRAME = 16_384
# credit owed to a peer (``_Peer.owe``) goes with the next frames written to it, within this many seconds, and at
# once beyond this many bytes (a sixteenth of the smallest window a peer starts with)
_PAY_WITHIN = 0.005
_OWED_MAX = 4_096


def _frames(data: bytes, pos: int) -> Iterator[tuple[int, int, int, int, int]]:
    """Start, end, type, flags and stream id of each whole frame in ``data`` from ``pos`` on."""
    n = len(data)
    while n - pos >= 9:
        hi, lo, ftype, flags, sid = _FRAME(data, pos)
        end = pos + 9 + (hi << 16 | lo)
        if end > n:
            return
        yield pos, end, ftype, flags, sid & 0x7FFFFFFF
        pos = end


class _Peer:
    """One side of a relayed connection, as the proxy writes to it."""

    __slots__ = ("backlog", "backlog_size", "block_open", "corked", "init_window", "max_frame", "name", "owed",
                 "pay_later", "queued", "transport", "window", "withhold")

    def __init__(self, name: str) -> None:
        self.name = name
        self.transport: asyncio.Transport | None = None
        self.max_frame = _DEFAULT_FRAME      # its SETTINGS_MAX_FRAME_SIZE: the largest frame it accepts
        self.init_window = _DEFAULT_WINDOW   # its SETTINGS_INITIAL_WINDOW_SIZE: a new stream's receive window
        self.window = _DEFAULT_WINDOW        # its connection receive window (what may still be sent to it)
        self.withhold = 0                    # credit to take off its next connection WINDOW_UPDATEs
        self.block_open = False              # a relayed header block to it awaits its CONTINUATION frames
        self.queued: list[bytes] = []        # the proxy's own frames held back until that block ends
        # frames waiting for its connection window, in order: (frames, counted) where counted frames (the proxy's
        # own) took their window when written and the others' DATA takes it as they go (see ``drain``)
        self.backlog: list[tuple[bytes, bool]] = []
        self.backlog_size = 0
        # while not None: what is sent to it collects here, in order, and goes in one write at ``flush`` (perf, issue
        # 37: each write is a system call that wakes the peer; see ``_Link.uncork``)
        self.corked: list[bytes] | None = None
        # connection credit owed to it for held DATA it sent that needs no credit now (``owe``)
        self.owed = 0
        self.pay_later: asyncio.TimerHandle | None = None

    def take(self, length: int) -> bool:
        """A relayed DATA frame of ``length`` bytes: taken off the connection window when it fits (True); False:
        beyond the window (its sender counts on credit the proxy's own DATA took, RFC 9113 6.9.1), it must wait."""
        if length <= self.window:
            self.window -= length
            return True
        return False

    def write(self, data: bytes) -> None:
        """The proxy's own frames: after the relayed header block in progress, if any (RFC 9113 6.10: nothing may
        come between a HEADERS frame without END_HEADERS and its CONTINUATION frames), and after the frames
        waiting for its window."""
        if self.block_open:
            self.queued.append(data)
        elif self.backlog:
            self._wait(data, True)
        elif self.owed:
            self._send(data + self._bill())
        else:
            self._send(data)

    def owe(self, n: int) -> None:
        """Connection credit for ``n`` bytes of DATA the proxy received from this peer and keeps (a held call's
        request or answer, whole: no stream credit is needed, the stream sends no more): it goes with the next frames
        written to it (perf, issue 37: no write of its own), at the latest ``_PAY_WITHIN`` seconds from now, and at
        once beyond ``_OWED_MAX`` bytes, so a peer that waits for the credit before it sends more is never stuck."""
        self.owed += n
        if self.owed > _OWED_MAX:
            self.pay()
        if self.owed and self.pay_later is None:
            self.pay_later = asyncio.get_running_loop().call_later(_PAY_WITHIN, self._pay_late)

    def pay(self) -> None:
        """The credit owed, now (after what was sent, outside a relayed header block; else as soon as it ends)."""
        if self.owed and not self.block_open:
            self._send(self._bill())

    def _pay_late(self) -> None:
        self.pay_later = None
        self.pay()
        if self.owed:  # a relayed header block is open: again a little later
            self.pay_later = asyncio.get_running_loop().call_later(_PAY_WITHIN, self._pay_late)

    def _bill(self) -> bytes:
        """The WINDOW_UPDATE for what is owed, which is then paid."""
        owed, self.owed = self.owed, 0
        if self.pay_later is not None:  # (a cancelled timer does not wake the loop)
            self.pay_later.cancel()
            self.pay_later = None
        return h2.window_update(0, owed)

    def relay(self, data: bytes, block_open: bool, over: bytes = b"") -> None:
        """Frames passed on from the other side: ``data`` within this peer's connection window (its DATA taken off
        ``window`` already), then ``over``, from a DATA frame beyond the window on, which waits for the window;
        ``block_open``: they end inside a header block."""
        if data:
            self._send(data)
        if over:
            self._wait(over, False)
            self.drain()  # as far as the window goes: a peer sends credit only for what it received
        self.block_open = block_open
        if not block_open and self.queued:
            queued = b"".join(self.queued)
            self.queued.clear()
            if self.backlog:
                self._wait(queued, True)
            else:
                self._send(queued + self._bill() if self.owed else queued)

    def _wait(self, data: bytes, counted: bool) -> None:
        self.backlog.append((data, counted))
        self.backlog_size += len(data)

    def drain(self) -> None:
        """Send what waits for the connection window as far as the window goes (a DATA frame beyond it is split
        when it has no padding)."""
        out: list[bytes] = []
        backlog = self.backlog
        while backlog:
            data, counted = backlog[0]
            if counted:
                out.append(data)
                del backlog[0]
                continue
            rest = b""
            for start, end, ftype, flags, sid in _frames(data, 0):
                n = end - start - 9
                if ftype != _DATA or n <= self.window:
                    if ftype == _DATA:
                        self.window -= n
                    continue
                out.append(data[:start])
                if self.window > 0 and not flags & _PADDED:
                    k = self.window
                    self.window = 0
                    out.append(h2.frame(_DATA, flags & ~_END_STREAM, sid, data[start + 9:start + 9 + k]))
                    rest = h2.frame(_DATA, flags, sid, data[start + 9 + k:end]) + data[end:]
                else:
                    rest = data[start:]
                break
            else:
                out.append(data)
                del backlog[0]
                continue
            backlog[0] = (rest, False)
            break
        self.backlog_size = sum(len(d) for d, _ in backlog)
        if out:
            self._send(b"".join(out))

    def _send(self, data: bytes) -> None:
        corked = self.corked
        if corked is not None:
            corked.append(data)
            return
        t = self.transport
        if t is not None and not t.is_closing():
            t.write(data)

    def cork(self) -> None:
        """Collect what is sent from now on until ``flush`` (in order, after anything collected already)."""
        if self.corked is None:
            self.corked = []

    def flush(self) -> None:
        """Send what was collected since ``cork`` in one write, and write at once again from now on."""
        corked, self.corked = self.corked, None
        if corked:
            if self.owed and not self.block_open:  # the credit owed goes with them
                corked.append(self._bill())
            self._send(corked[0] if len(corked) == 1 else b"".join(corked))


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
