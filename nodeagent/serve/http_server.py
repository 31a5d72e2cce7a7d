"""The proxy's HTTP endpoints, served by aiohttp on the proxy's own event loop (``--metrics-address``).

- ``GET /metrics``: the Prometheus metrics (``metrics.ProxyMetrics``), text format 0.0.4 or OpenMetrics as the
  scraper's ``Accept`` asks, gzip when its ``Accept-Encoding`` allows, ``name[]`` to select metrics; rendered in a
  worker thread (the client library locks each value), so a scrape never holds the loop that relays CRI calls.
- ``GET /status``: the proxy's view of the node as JSON (``status.status_document``), built on the loop (the only
  place the allocator and the registry are touched) and encoded in a worker thread.

Anything else is a clear 4xx in plain text: 404 for an unknown path, 405 for a method other than GET/HEAD, 400 for
a request that is not HTTP (aiohttp's parser).
"""

from __future__ import annotations

import asyncio
import gzip
import json
import logging
import socket
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder, gzip_accepted

__all__ = ["PATHS", "ProxyHttpServer", "bind_tcp"]

log = logging.getLogger("numapin.criproxy")

PATHS = ("/metrics", "/status")
# a connection that sends no complete request head for this long, or stays idle between requests this long, is
# closed (aiohttp's keep-alive timer, armed from the connection's start): no client holds one open for ever
IDLE_TIMEOUT = 15.0

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def bind_tcp(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (IPv6 when the host has a colon; port 0: any free port), or an
    OSError naming the address."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        addr = socket.getaddrinfo(host, port, family, socket.SOCK_STREAM, 0, socket.AI_PASSIVE)[0][4]
    except socket.gaierror as e:
        raise OSError(f"metrics-address {host}:{port}: cannot resolve {host!r}: {e.strerror}") from None
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
        sock.listen(128)
    except OSError as e:
        sock.close()
        raise OSError(f"metrics-address {host}:{port}: cannot listen: {e.strerror or e}") from None
    sock.setblocking(False)
    return sock


class ProxyHttpServer:
    """``/metrics`` and ``/status`` on one port: ``await start(host, port)`` … ``await stop()``."""

    def __init__(self, registry: CollectorRegistry, status: Callable[[], Mapping[str, Any]], *,
                 idle_timeout: float = IDLE_TIMEOUT) -> None:
        self._registry = registry
        self.idle_timeout = idle_timeout
        self._status = status  # called on the loop
        self._runner: web.AppRunner | None = None
        self.port: int | None = None

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._plain_errors])
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/status", self._status_json)
        return app

    @web.middleware
    async def _plain_errors(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except web.HTTPNotFound:
            return _text(404, f"{request.path}: no such endpoint; the proxy serves {' and '.join(PATHS)}")
        except web.HTTPMethodNotAllowed as e:
            resp = _text(405, f"{request.method} {request.path}: method not allowed; use GET")
            resp.headers["Allow"] = ",".join(sorted(e.allowed_methods))
            return resp

    async def _metrics(self, request: web.Request) -> web.StreamResponse:
        names = request.query.getall("name[]", [])
        body, headers = await asyncio.to_thread(
            _render_metrics, self._registry, request.headers.get("Accept", ""),
            request.headers.get("Accept-Encoding", ""), names)
        return web.Response(body=body, headers=headers)

    async def _status_json(self, request: web.Request) -> web.StreamResponse:
        try:
            doc = self._status()
        except Exception as e:  # a bug, not the client's fault: say so, keep serving
            log.exception("status: building the document failed")
            body = json.dumps({"error": f"status unavailable: {e!r}"}).encode()
            return web.Response(status=500, body=body, content_type="application/json")
        body = await asyncio.to_thread(_status_bytes, doc)
        return web.Response(body=body, content_type="application/json")

    async def start(self, host: str, port: int) -> int:
        """Serve on ``host:port``; returns the bound port."""
        sock = await asyncio.to_thread(bind_tcp, host, port)  # a host name is resolved: not on the loop
        runner = web.AppRunner(self.app(), access_log=None, handle_signals=False, shutdown_timeout=1.0,
                               keepalive_timeout=self.idle_timeout)
        try:
            await runner.setup()
            await web.SockSite(runner, sock).start()
        except BaseException:
            await runner.cleanup()
            sock.close()
            raise
        self._runner = runner
        self.port = sock.getsockname()[1]
        return self.port

    async def stop(self) -> None:
        """Stop listening, finish or drop the requests in flight, close every connection."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        self.port = None


def _render_metrics(registry: CollectorRegistry, accept: str, accept_encoding: str,
                    names: list[str]) -> tuple[bytes, dict[str, str]]:
    encoder, content_type = choose_encoder(accept)
    body = encoder(registry.restricted_registry(names) if names else registry)
    headers = {"Content-Type": content_type}
    if gzip_accepted(accept_encoding):
        body = gzip.compress(body)
        headers["Content-Encoding"] = "gzip"
    return body, headers


def _status_bytes(doc: Mapping[str, Any]) -> bytes:
    return json.dumps(doc, indent=1).encode() + b"\n"


def _text(status: int, message: str) -> web.Response:
    return web.Response(status=status, text=message + "\n", content_type="text/plain")
