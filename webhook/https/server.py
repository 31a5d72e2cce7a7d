"""The HTTPS server: routes, body limits, content types, and what an internal error is answered.

``/mutate`` and ``/validate`` take AdmissionReviews (POST, ``application/json``) and hand the parsed request to
the decision callables; ``/filter`` takes kube-scheduler's extender ExtenderArgs (``extender_filter``, same limits
and content type; a body that is not one gets 400 and a log line); ``/healthz``, ``/readyz`` and ``/metrics`` are
for the kubelet and Prometheus. A body that
is not UTF-8 JSON or not an AdmissionReview gets 400 with the reason, another content type 415, a body over the
limit 413, a body not sent within the body timeout 408 (``request_body``, ``review``). A decision that raises is
logged, counted (``numapin_webhook_internal_errors_total``) and answered by the operator's rule for requests that
cannot be judged (``unjudged``: allowed with a warning, or denied). Any other exception while answering is not the
client's fault: logged, counted the same way and answered 500 with a line of plain text naming the error:
kube-apiserver applies the webhook's ``failurePolicy`` to any answer that is not 2xx, and its client quotes the body of
such an answer in the error kubectl shows only when it is text (an AdmissionReview there would read "unknown").

Connections are accepted by ``listener.Listener`` within ``limits.ServerLimits`` (connection cap, handshake, header,
idle and body timeouts, a budget of bytes in flight); with ``client_ca`` set, /mutate, /validate and /filter answer
only clients presenting a certificate signed by that CA (the API server's admission kubeconfig), while the probes and
/metrics stay open to the kubelet and Prometheus.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestPayloadError

from webhook.admission.extender_filter import ExtenderArgsError, FilterResult
from webhook.admission.review import AdmissionRequest, ReviewError, Verdict, json_bytes, parse_review, respond
from webhook.admission.unjudged import UnjudgedRule
from webhook.https.limits import BodyBudget, BudgetExceeded, ServerLimits
from webhook.https.listener import Listener
from webhook.https.metrics import CONTENT_TYPE, WebhookMetrics
from webhook.https.request_body import BodyError, BodyParser, ParserUnavailable, parse_slim
from webhook.https.tls import CertReloader

__all__ = ["DEFAULT_MAX_BODY", "Decide", "ServerConfig", "WebhookServer"]

log = logging.getLogger("numapin.webhook")

# kube-apiserver caps a request at 3 MiB; a review carries object and oldObject, plus JSON overhead
DEFAULT_MAX_BODY = 7 * 1024 * 1024

Decide = Callable[[AdmissionRequest], Awaitable[Verdict]]
Filter = Callable[[Any], Awaitable[FilterResult]]  # kube-scheduler's ExtenderArgs in, its ExtenderFilterResult out
ReadyCheck = Callable[[], "tuple[bool, str]"]


@dataclass(frozen=True)
class ServerConfig:
    host: str = "0.0.0.0"
    port: int = 8443
    max_body: int = DEFAULT_MAX_BODY
    cert_poll_seconds: float = 5.0
    shutdown_grace_seconds: float = 5.0
    limits: ServerLimits = dataclasses.field(default_factory=ServerLimits)  # its max_body is replaced by ``max_body``
    client_ca: str | None = None            # PEM file: require client certificates on /mutate and /validate
    reuse_port: bool = False                # one of several worker processes on the same port (--workers)


# the routes called by the API server and kube-scheduler: a client certificate is required on them with ``client_ca``
_CALLED_BY_CLIENTS = ("/mutate", "/validate", "/filter")


def _text(status: int, message: str) -> web.Response:
    return web.Response(status=status, text=message + "\n", content_type="text/plain")


class WebhookServer:
    """One webhook server: an aiohttp app over TLS with a reloading certificate."""

    def __init__(self, *, reloader: CertReloader, mutate: Decide, validate: Decide, metrics: WebhookMetrics,
                 config: ServerConfig = ServerConfig(), ready_checks: tuple[ReadyCheck, ...] = (),
                 unjudged: UnjudgedRule | None = None, extender_filter: Filter | None = None) -> None:
        self.reloader = reloader
        self.metrics = metrics
        self.config = config
        self.limits = dataclasses.replace(config.limits, max_body=config.max_body)
        self.unjudged = unjudged or UnjudgedRule("allow", metrics)
        self.budget = BodyBudget(self.limits.inflight_bytes)
        self.parser = BodyParser()
        # a body up to this size that arrived whole is parsed on the loop at once (``_judge``)
        self._small_body = min(self.parser.large, config.max_body)
        self.listener: Listener | None = None
        self._decide = {"mutate": mutate, "validate": validate}
        self._filter = extender_filter
        self._ready_checks = ready_checks
        # what /metrics answers when it is more than this process's (``worker_metrics``: every worker's)
        self.scrape: Callable[[], Awaitable[bytes]] | None = None
        self._runner: web.AppRunner | None = None
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self.port: int | None = None

    # -- app ------------------------------------------------------------------------------------------------
    def app(self) -> web.Application:
        app = web.Application(client_max_size=self.config.max_body, middlewares=[self._around])
        app.router.add_post("/mutate", self._admission("mutate"))
        app.router.add_post("/validate", self._admission("validate"))
        if self._filter is not None:
            app.router.add_post("/filter", self._admission("filter"))
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        app.router.add_get("/metrics", self._metrics)
        return app

    @web.middleware
    async def _around(self, request: web.Request,
                      handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
        """Around every request (one middleware: each is a coroutine frame per request, perf issue 37): tell the
        listener a request is being handled (its header timer stops) and when it ends (idle again); ask for the
        client certificate on /mutate and /validate (``client_ca``); answer what the handler raised with a 500."""
        conn = self.listener.tracked(request.transport) if self.listener is not None else None
        if conn is not None:
            conn.request_started()
        try:
            if self.config.client_ca and request.path in _CALLED_BY_CLIENTS:
                refused = self._without_client_cert(request)
                if refused is not None:
                    return refused
            try:
                return await handler(request)
            except web.HTTPException:
                raise
            except asyncio.CancelledError:
                raise
            except Exception as e:
                log.exception("unhandled error answering %s %s", request.method, request.path)
                self.metrics.internal_errors.labels(request.path.strip("/") or "root").inc()
                return _internal_error(f"internal error answering {request.method} {request.path}: "
                                       f"{type(e).__name__} (see the webhook's log)")
        finally:
            if conn is not None:
                conn.request_ended()

    def _without_client_cert(self, request: web.Request) -> web.StreamResponse | None:
        peer = request.transport.get_extra_info("peercert") if request.transport is not None else None
        if peer:
            return None
        # the TLS layer already refused a certificate the CA did not sign
        self.metrics.observe(request.path.strip("/"), "unauthenticated", 0.0)
        resp = _text(401, "a client certificate signed by the webhook's --client-ca-file is required")
        resp.force_close()
        return resp

    def _admission(self, endpoint: str) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        async def handle(request: web.Request) -> web.StreamResponse:
            started = time.perf_counter()
            response, verdict = await self._answer(endpoint, request)
            if endpoint == "filter" and response.status >= 400:  # the scheduler logs only the status code
                log.warning("filter: answered %d: %s", response.status,
                            response.text.strip() if isinstance(response, web.Response) and response.text else "")
            self.metrics.observe(endpoint, verdict, time.perf_counter() - started)
            return response

        return handle

    async def _answer(self, endpoint: str, request: web.Request) -> tuple[web.StreamResponse, str]:
        if request.content_type != "application/json":
            return _text(415, f"content type must be application/json, got {request.content_type!r}"), \
                "unsupported_media_type"
        if request.content_length is not None and request.content_length > self.config.max_body:
            return _closing(413, f"body is over the limit of {self.config.max_body} bytes"), "too_large"
        try:
            need = self.budget.need(request.content_length or self.config.max_body)
        except BudgetExceeded as e:
            return _closing(413, f"body too large for the webhook's in-flight budget: {e}"), "too_large"
        if not self.budget.try_acquire(need):
            try:
                async with asyncio.timeout(self.limits.body_timeout):
                    await self.budget.acquire(need)
            except TimeoutError:
                return _closing(503, "the webhook is busy reading other bodies; try again"), "busy"
        try:
            return await self._judge(endpoint, request)
        finally:
            self.budget.release(need)

    async def _judge(self, endpoint: str, request: web.Request) -> tuple[web.StreamResponse, str]:
        content = request.content
        try:
            if content.is_eof() and content.total_bytes <= self._small_body:
                # the whole body arrived with the headers and is small (most reviews): taken and parsed at once, no
                # timer and no coroutine per step (perf, issue 37)
                body = parse_slim(content.read_nowait())
            else:
                body = await self._receive(request)
        except TimeoutError:
            # the body did not arrive in time: drop the connection and what it holds
            return _closing(408, f"request body not received within {self.limits.body_timeout} s"), "timeout"
        except web.HTTPRequestEntityTooLarge:
            return _closing(413, f"body is over the limit of {self.config.max_body} bytes"), "too_large"
        except RequestPayloadError as e:
            # e.g. a body that does not decode with its Content-Encoding; nothing more can be read from it
            with contextlib.suppress(Exception):
                request.content.feed_eof()
            return _closing(400, f"body cannot be read: {e}"), "bad_request"
        except ConnectionError:  # the client went away mid-body: nobody to answer
            log.debug("%s: client gone while sending its body", endpoint)
            return _closing(400, "connection lost"), "client_gone"
        except BodyError as e:
            return _text(400, str(e)), "bad_request"
        except ParserUnavailable as e:
            return _closing(503, str(e)), "busy"
        if endpoint == "filter":
            return await self._filter_answer(body)
        try:
            req = parse_review(body)
        except ReviewError as e:
            return _text(400, f"not an AdmissionReview request: {e}"), "bad_request"
        try:
            verdict = await self._decide[endpoint](req)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            log.exception("%s: deciding %s failed", endpoint, req.describe())
            self.metrics.internal_errors.labels(endpoint).inc()
            verdict = self.unjudged.verdict(
                endpoint, "internal_error",
                f"{endpoint} of {req.describe()} could not be judged: internal error {type(e).__name__} (see the "
                "webhook's log)")
        if not verdict.allowed:
            log.info("%s denied %s: %s", endpoint, req.describe(), verdict.message)
        return web.Response(body=json_bytes(respond(req, verdict)), content_type="application/json"), verdict.label

    async def _filter_answer(self, body: Any) -> tuple[web.StreamResponse, str]:
        """kube-scheduler's filter call (``extender_filter``): 400 for a body that is not an ExtenderArgs; a decision
        that raises is logged, counted and answered with the result's ``Error`` (the scheduler then treats numapin as
        unavailable: with ``ignorable: true`` it schedules without it)."""
        assert self._filter is not None
        try:
            result = await self._filter(body)
        except ExtenderArgsError as e:
            return _text(400, f"not an ExtenderArgs request: {e}"), "bad_request"
        except asyncio.CancelledError:
            raise
        except Exception as e:
            log.exception("filter: deciding failed")
            self.metrics.internal_errors.labels("filter").inc()
            result = FilterResult(passed=(), error=f"numapin: filter failed: internal error {type(e).__name__} (see "
                                                   "the webhook's log)")
        return web.Response(body=json_bytes(result.render()), content_type="application/json"), result.label

    async def _receive(self, request: web.Request) -> Any:
        """The slim review of a body still arriving, or large: read within the body timeout (none when it is all
        here), then parsed (``BodyParser``: a large one in the parser process)."""
        if request.content.is_eof():
            raw = await self._read(request)
        else:
            async with asyncio.timeout(self.limits.body_timeout):
                raw = await self._read(request)
        return await self.parser.parse(raw)

    async def _read(self, request: web.Request) -> list[bytes]:
        """The body in the pieces it arrived in: a large one is never joined on the event loop (the parser process
        gets the pieces). Raises HTTPRequestEntityTooLarge past ``max_body`` bytes (after decompression)."""
        pieces: list[bytes] = []
        size = 0
        while True:
            piece = await request.content.readany()
            if not piece:
                return pieces
            size += len(piece)
            if size > self.config.max_body:
                raise web.HTTPRequestEntityTooLarge(max_size=self.config.max_body, actual_size=size)
            pieces.append(piece)

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

    def render_metrics(self) -> bytes:
        """This process's metrics in Prometheus' text format."""
        info = self.reloader.info
        if info is not None:
            self.metrics.cert_not_after.set(info.not_after.timestamp())
        return self.metrics.render()

    async def _metrics(self, request: web.Request) -> web.StreamResponse:
        body = await self.scrape() if self.scrape is not None else self.render_metrics()
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})

    # -- lifecycle ------------------------------------------------------------------------------------------
    async def start(self) -> None:
        """Bind and serve (the certificate must already be loaded); also start the certificate watcher."""
        if not self.reloader.loaded:
            self.reloader.load()
        if self.config.client_ca:
            from webhook.https.tls import require_client_certificates

            require_client_certificates(self.reloader.context, self.config.client_ca)
        self._runner = web.AppRunner(self.app(), access_log=None, handle_signals=False,
                                     shutdown_timeout=self.config.shutdown_grace_seconds,
                                     keepalive_timeout=self.limits.idle_timeout)
        await self._runner.setup()
        await self.parser.start()
        assert self._runner.server is not None
        self.listener = Listener(host=self.config.host, port=self.config.port, ssl_context=self.reloader.context,
                                 factory=self._runner.server, limits=self.limits,
                                 on_close=lambda why: self.metrics.connections_closed.labels(why).inc(),
                                 reuse_port=self.config.reuse_port)
        self.metrics.connections.set_function(lambda: self.listener.connections if self.listener else 0)
        self.metrics.body_budget_bytes.set_function(lambda: self.budget.used)
        self.port = await self.listener.start()
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
        if self.listener is not None:
            await self.listener.stop()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self.listener is not None:
            self.listener.abort_all()
            self.listener = None
        await self.parser.close()


def _internal_error(message: str) -> web.Response:
    """500 with ``message`` as plain text, on every path. kube-apiserver's client (client-go ``rest``) turns a non-2xx
    answer into ``an error on the server ("<body>") has prevented the request from succeeding`` when its content type
    is ``text/*`` and into ``("unknown")`` otherwise; with ``failurePolicy: Fail`` kubectl shows that sentence after
    ``Internal error occurred: failed calling webhook "<name>": failed to call webhook:``."""
    return _text(500, message)


def _closing(status: int, message: str) -> web.Response:
    """A plain-text answer after which the connection is closed (its body may be partly unread)."""
    resp = _text(status, message)
    resp.force_close()
    return resp
