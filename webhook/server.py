"""The HTTPS server: routes, body limits, content types, and the rule that nothing ends in a 500.

``/mutate`` and ``/validate`` take AdmissionReviews (POST, ``application/json``) and hand the parsed request to
the decision callables; ``/healthz``, ``/readyz`` and ``/metrics`` are for the kubelet and Prometheus. A body that
is not JSON or not an AdmissionReview gets 400 with the reason, another content type 415, a body over the limit
413. A decision that raises is logged, counted (``numapin_webhook_internal_errors_total``) and answered with an
allowed review carrying a warning: the webhook fails open on its own bugs, and the node proxy remains the backstop.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestPayloadError

from .metrics import CONTENT_TYPE, WebhookMetrics
from .review import AdmissionRequest, ReviewError, Verdict, parse_review, respond
from .tls import CertReloader

__all__ = ["DEFAULT_MAX_BODY", "Decide", "ServerConfig", "WebhookServer"]

log = logging.getLogger("numapin.webhook")

# kube-apiserver caps a request at 3 MiB; a review carries object and oldObject, plus JSON overhead
DEFAULT_MAX_BODY = 7 * 1024 * 1024

Decide = Callable[[AdmissionRequest], Awaitable[Verdict]]
ReadyCheck = Callable[[], "tuple[bool, str]"]


@dataclass(frozen=True)
class ServerConfig:
    host: str = "0.0.0.0"
    port: int = 8443
    max_body: int = DEFAULT_MAX_BODY
    cert_poll_seconds: float = 5.0
    shutdown_grace_seconds: float = 5.0


def _text(status: int, message: str) -> web.Response:
    return web.Response(status=status, text=message + "\n", content_type="text/plain")


class WebhookServer:
    """One webhook server: an aiohttp app over TLS with a reloading certificate."""

    def __init__(self, *, reloader: CertReloader, mutate: Decide, validate: Decide, metrics: WebhookMetrics,
                 config: ServerConfig = ServerConfig(), ready_checks: tuple[ReadyCheck, ...] = ()) -> None:
        self.reloader = reloader
        self.metrics = metrics
        self.config = config
        self._decide = {"mutate": mutate, "validate": validate}
        self._ready_checks = ready_checks
        self._runner: web.AppRunner | None = None
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self.port: int | None = None

    # -- app ------------------------------------------------------------------------------------------------
    def app(self) -> web.Application:
        app = web.Application(client_max_size=self.config.max_body, middlewares=[self._never_500])
        app.router.add_post("/mutate", self._admission("mutate"))
        app.router.add_post("/validate", self._admission("validate"))
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        app.router.add_get("/metrics", self._metrics)
        return app

    @web.middleware
    async def _never_500(self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                         ) -> web.StreamResponse:
        try:
            return await handler(request)
        except web.HTTPException:
            raise
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("unhandled error answering %s %s", request.method, request.path)
            self.metrics.internal_errors.labels(request.path.strip("/") or "root").inc()
            return _text(400, "the request could not be processed")

    def _admission(self, endpoint: str) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        async def handle(request: web.Request) -> web.StreamResponse:
            started = time.perf_counter()
            response, verdict = await self._answer(endpoint, request)
            self.metrics.observe(endpoint, verdict, time.perf_counter() - started)
            return response

        return handle

    async def _answer(self, endpoint: str, request: web.Request) -> tuple[web.StreamResponse, str]:
        if request.content_type != "application/json":
            return _text(415, f"content type must be application/json, got {request.content_type!r}"), \
                "unsupported_media_type"
        if request.content_length is not None and request.content_length > self.config.max_body:
            return _text(413, f"body is over the limit of {self.config.max_body} bytes"), "too_large"
        try:
            raw = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return _text(413, f"body is over the limit of {self.config.max_body} bytes"), "too_large"
        except RequestPayloadError as e:
            # e.g. a body that does not decode with its Content-Encoding; nothing more can be read from it
            with contextlib.suppress(Exception):
                request.content.feed_eof()
            resp = _text(400, f"body cannot be read: {e}")
            resp.force_close()
            return resp, "bad_request"
        try:
            body = json.loads(raw)
        except (ValueError, RecursionError) as e:
            return _text(400, f"body is not valid JSON: {e}"[:500]), "bad_request"
        try:
            req = parse_review(body)
        except ReviewError as e:
            return _text(400, f"not an AdmissionReview request: {e}"), "bad_request"
        try:
            verdict = await self._decide[endpoint](req)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("%s: deciding %s failed; allowing it unchecked", endpoint, req.describe())
            self.metrics.internal_errors.labels(endpoint).inc()
            verdict = Verdict.allow(f"numapin webhook: internal error, {endpoint} not checked (see webhook logs)")
        if not verdict.allowed:
            log.info("%s denied %s: %s", endpoint, req.describe(), verdict.message)
        return web.json_response(respond(req, verdict), dumps=_dumps), verdict.label

    # -- probes ---------------------------------------------------------------------------------------------
    async def _healthz(self, request: web.Request) -> web.StreamResponse:
        return _text(200, "ok")

    def ready(self) -> tuple[bool, str]:
        if not self.reloader.loaded:
            return False, "serving certificate not loaded"
        for check in self._ready_checks:
            ok, why = check()
            if not ok:
                return False, why
        return True, "ok"

    async def _readyz(self, request: web.Request) -> web.StreamResponse:
        ok, why = self.ready()
        return _text(200 if ok else 503, why)

    async def _metrics(self, request: web.Request) -> web.StreamResponse:
        info = self.reloader.info
        if info is not None:
            self.metrics.cert_not_after.set(info.not_after.timestamp())
        return web.Response(body=self.metrics.render(), headers={"Content-Type": CONTENT_TYPE})

    # -- lifecycle ------------------------------------------------------------------------------------------
    async def start(self) -> None:
        """Bind and serve (the certificate must already be loaded); also start the certificate watcher."""
        if not self.reloader.loaded:
            self.reloader.load()
        self._runner = web.AppRunner(self.app(), access_log=None,
                                     shutdown_timeout=self.config.shutdown_grace_seconds)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.config.host, self.config.port, ssl_context=self.reloader.context,
                           backlog=1024, reuse_address=True)
        await site.start()
        server = getattr(site, "_server", None)
        sockets = getattr(server, "sockets", None) or []
        self.port = sockets[0].getsockname()[1] if sockets else self.config.port
        self._tasks.append(asyncio.create_task(self._watch_certs()))
        log.info("numapin webhook serving HTTPS on %s:%s", self.config.host, self.port)

    async def _watch_certs(self) -> None:
        before = self.reloader.reloads
        while not self._stop.is_set():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._stop.wait(), timeout=self.config.cert_poll_seconds)
            if self._stop.is_set():
                return
            try:
                self.reloader.check()
            except Exception:
                log.exception("certificate check failed")
            if self.reloader.reloads != before:
                self.metrics.cert_reloads.inc(self.reloader.reloads - before)
                before = self.reloader.reloads

    async def stop(self) -> None:
        self._stop.set()
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        self._tasks.clear()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


def _dumps(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"))
