"""The webhook's limits on connections and request bodies, and the memory ceiling they give.

Every client of the HTTPS port is untrusted until the API server is the only one that can reach it (client
certificates, a NetworkPolicy): the limits keep one process's memory bounded whatever the number of clients.

- at most ``max_connections`` connections at once, TLS handshakes in progress included. At the cap the connection
  idle longest (no request being read or answered, for at least half a second) is closed for the new one; when none
  is, new connections wait in the kernel's accept queue (backpressure) until one ends or becomes evictable;
- a TLS handshake must end within ``handshake_timeout`` seconds;
- a connection must deliver a request's headers within ``header_timeout`` seconds of its first byte (and a new
  connection its first request within ``header_timeout`` of the handshake);
- an idle keep-alive connection is closed after ``idle_timeout`` seconds;
- a request body must arrive within ``body_timeout`` seconds (else 408 and the connection is closed) and be at most
  ``max_body`` bytes (413);
- bodies being read, parsed and judged reserve ``BODY_EXPANSION`` times their length from a budget of
  ``inflight_bytes``: a request waits (within ``body_timeout``) until its share is free; a body larger than the whole
  budget is refused with 413. Bodies not being read yet cost at most aiohttp's read buffer per connection (reading
  pauses past it).

``memory_ceiling_bytes`` states the resulting bound (documented in docs/webhook.md).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

__all__ = ["BODY_EXPANSION", "PARSER_BASELINE_BYTES", "PER_CONNECTION_BYTES", "BodyBudget", "BudgetExceeded",
           "ServerLimits"]

# A parsed JSON document takes several times its text in Python objects; a request also holds its raw bytes.
BODY_EXPANSION = 8
# An open TLS connection: asyncio's SSL protocol keeps a 256 KiB read buffer per connection, plus OpenSSL's state,
# a request's headers and aiohttp's paused read buffer (~282 KiB measured by benchmarks/webhook_hostile.py).
PER_CONNECTION_BYTES = 320 * 1024
# The process without traffic: interpreter, libraries, caches of node shapes.
BASELINE_BYTES = 96 * 1024 * 1024
# The body parser process (request_body.BodyParser) without a body: interpreter, msgspec (~20 MiB measured); it
# parses one body at a time, which takes it up to BODY_EXPANSION times that body's length while it does.
PARSER_BASELINE_BYTES = 24 * 1024 * 1024


@dataclass(frozen=True)
class ServerLimits:
    max_connections: int = 256
    handshake_timeout: float = 5.0
    header_timeout: float = 10.0
    idle_timeout: float = 60.0
    body_timeout: float = 10.0
    max_body: int = 7 * 1024 * 1024
    inflight_bytes: int = 128 * 1024 * 1024

    def __post_init__(self) -> None:
        for name in ("max_connections", "handshake_timeout", "header_timeout", "idle_timeout", "body_timeout",
                     "max_body", "inflight_bytes"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")

    def memory_ceiling_bytes(self, pod_cache_bytes: int = 0) -> int:
        """An upper bound of the webhook's memory (its process and its body parser process): baseline +
        connections + bodies in flight + the pod cache + the parser reading the largest body."""
        return (BASELINE_BYTES + self.max_connections * PER_CONNECTION_BYTES + self.inflight_bytes + pod_cache_bytes
                + PARSER_BASELINE_BYTES + BODY_EXPANSION * self.max_body)


class BudgetExceeded(Exception):
    """The body can never fit the in-flight budget."""


class BodyBudget:
    """Bytes reserved by requests in flight; waiters are served first come, first served."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.used = 0
        self._waiting = 0
        self._cond = asyncio.Condition()

    def need(self, body_bytes: int) -> int:
        """What a body of ``body_bytes`` reserves; BudgetExceeded when it can never fit."""
        need = max(1, body_bytes) * BODY_EXPANSION
        if need > self.total:
            raise BudgetExceeded(f"a body of {body_bytes} bytes reserves {need} bytes in flight; the budget is "
                                 f"{self.total}")
        return need

    def try_acquire(self, need: int) -> bool:
        """Reserve ``need`` at once if it fits and nobody waits before it (the common case: no waiting, no timer)."""
        if self._waiting or self.used + need > self.total:
            return False
        self.used += need
        return True

    async def acquire(self, need: int) -> None:
        self._waiting += 1
        try:
            async with self._cond:
                await self._cond.wait_for(lambda: self.used + need <= self.total)
                self.used += need
        finally:
            self._waiting -= 1

    def release(self, need: int) -> None:
        self.used -= need
        if self._waiting:
            # wake the waiters without waiting for the lock here (release runs in finally blocks)
            asyncio.get_running_loop().create_task(self._notify())

    async def _notify(self) -> None:
        async with self._cond:
            self._cond.notify_all()
