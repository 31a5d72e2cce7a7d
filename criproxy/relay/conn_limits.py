"""What one client connection of the frame relay may cost, instead of how many there may be.

The proxy's socket is root-only (mode 0660): its clients are kubelet and the node's own tools, and the CRI
conformance suite (critest) opens a client per spec and keeps them all. So the relay serves every connection the
process has descriptors for (two each: the client's and its runtime connection), and bounds what each costs:

- **descriptors**: ``descriptor_cap`` serves as many connections as the soft ``RLIMIT_NOFILE`` leaves room for (the
  command line raises the soft limit to the hard one first, ``raise_descriptor_limit``); only beyond that is a
  connection told GOAWAY, as the process could not open its runtime connection anyway;
- **idle connections**: one with no call in flight and nothing from the client for ``idle_timeout`` seconds is
  asked to go (GOAWAY NO_ERROR with the highest stream id: every stream it sent is still served, a gRPC client opens
  a new connection for its next call) and closed once its calls are done, ``DRAIN_GRACE`` seconds later at least;
- **memory**: bytes of a client held by the relay are bounded per connection: what arrives before the runtime
  connection is up (``MAX_PENDING``, reading pauses beyond), a frame larger than the runtime accepts
  (SETTINGS_MAX_FRAME_SIZE) is refused before it is buffered, and the requests of intercepted calls held at once
  share one ``frame_held.MAX_HELD``;
- **frames per second**: a token bucket of ``FRAME_RATE`` frames per second (``FRAME_BURST`` at once) per
  connection; a client beyond it (a PING, SETTINGS or reset flood) is told GOAWAY ENHANCE_YOUR_CALM and closed.
  kubelet sends a few frames per call, thousands of times below it.
"""

from __future__ import annotations

import logging
import resource
from dataclasses import dataclass

__all__ = ["DRAIN_GRACE", "FRAME_BURST", "FRAME_RATE", "MAX_PENDING", "ConnectionLimits", "FrameBudget",
           "descriptor_cap", "raise_descriptor_limit"]

log = logging.getLogger("numapin.criproxy")

FRAME_RATE = 20_000.0        # frames per second a client connection may send, on average (kubelet: a few per call)
FRAME_BURST = 50_000.0       # at once
MAX_PENDING = 1 << 20        # bytes of a client read before its runtime connection is up
DRAIN_GRACE = 10.0           # seconds an idle connection asked to go has before the relay closes it
DEFAULT_IDLE_TIMEOUT = 600.0
_RESERVED_DESCRIPTORS = 256  # the proxy's own: files, its gRPC channel to the runtime, HTTP server, control socket


def descriptor_cap() -> int:
    """Connections the frame relay can serve with the process's descriptors (two each), at least 1."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        soft = 1 << 20
    return max(1, (soft - _RESERVED_DESCRIPTORS) // 2)


def raise_descriptor_limit() -> int:
    """Raise the soft ``RLIMIT_NOFILE`` to the hard limit (what systemd and containerd do too); returns it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError) as e:
            log.warning("cannot raise the open-files limit from %d to %d: %s", soft, hard, e)
    return soft


@dataclass(frozen=True)
class ConnectionLimits:
    """``max_connections``: 0 for ``descriptor_cap()``; ``idle_timeout``: seconds, 0 never."""

    max_connections: int = 0
    idle_timeout: float = DEFAULT_IDLE_TIMEOUT
    drain_grace: float = DRAIN_GRACE
    frame_rate: float = FRAME_RATE
    frame_burst: float = FRAME_BURST

    def cap(self) -> int:
        return self.max_connections or descriptor_cap()


class FrameBudget:
    """A token bucket of frames: ``take(n, now)`` is False once a client sent more than the bucket allows."""

    __slots__ = ("at", "burst", "rate", "tokens")

    def __init__(self, rate: float, burst: float, now: float) -> None:
        self.rate, self.burst = rate, burst
        self.tokens = burst
        self.at = now

    def take(self, n: int, now: float) -> bool:
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate) - n
        self.at = now
        return self.tokens >= 0
