"""The server's limits and input rules (issue 15), in-process over real TLS with small limits:

- bodies must be UTF-8 JSON; the answer's uid is the request's, byte for byte in UTF-8;
- at the connection cap the oldest idle connection is closed for a new one; with none idle, new connections wait
  (backpressure) until one ends;
- header, handshake and body timeouts close what a slow or silent client holds;
- the in-flight body budget refuses a body that could never fit it;
- with --client-ca, /mutate and /validate need a client certificate from that CA, the probes do not.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.webhook.helpers import PKI, SERVER_NAME, container, make_pod, pod_request, review
from webhook.admission.review import AdmissionRequest, Verdict
from webhook.https.certs import make_ca
from webhook.https.client_certs import make_client_cert
from webhook.https.limits import BODY_EXPANSION, ServerLimits
from webhook.https.metrics import WebhookMetrics
from webhook.https.server import ServerConfig, WebhookServer
from webhook.https.tls import CertReloader


async def _allow(req: AdmissionRequest) -> Verdict:
    return Verdict.allow()


def _server(pki: PKI, **kw: object) -> WebhookServer:
    limits = ServerLimits(**{k: v for k, v in kw.items() if k != "client_ca"})  # type: ignore[arg-type]
    return WebhookServer(reloader=CertReloader(pki.cert, pki.key), mutate=_allow, validate=_allow,
                         metrics=WebhookMetrics(),
                         config=ServerConfig(host="127.0.0.1", port=0, max_body=limits.max_body, limits=limits,
                                             client_ca=kw.get("client_ca")))  # type: ignore[arg-type]


@pytest.fixture
async def small(pki: PKI) -> AsyncIterator[WebhookServer]:
    srv = _server(pki, max_connections=4, header_timeout=2.0, idle_timeout=2.0, body_timeout=0.5,
                  handshake_timeout=0.5, max_body=64 * 1024, inflight_bytes=BODY_EXPANSION * 64 * 1024 * 2)
    await srv.start()
    yield srv
    await srv.stop()


async def _open(port: int, ctx: ssl.SSLContext) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port, ssl=ctx,
                                                          server_hostname=SERVER_NAME), 10)


async def _exchange(port: int, ctx: ssl.SSLContext, data: bytes) -> bytes:
    r, w = await _open(port, ctx)
    try:
        w.write(data)
        return await asyncio.wait_for(r.read(), 10)  # Connection: close: read to EOF
    finally:
        w.close()


def _post(path: str, body: bytes) -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n").encode() + body


async def _closed(reader: asyncio.StreamReader) -> bytes:
    """Everything the server sends until it closes the connection (fails after 10 s)."""
    return await asyncio.wait_for(reader.read(), 10)


# -- encodings ---------------------------------------------------------------------------------------------------
async def test_uid_is_echoed_byte_for_byte_and_non_utf8_is_refused(small: WebhookServer, pki: PKI) -> None:
    assert small.port is not None
    ctx = pki.client_context()
    uid = "é-ü-中-" + str(uuid.uuid4())
    body = json.dumps(review(pod_request(make_pod("p", [container("c")])) | {"uid": uid}),
                      ensure_ascii=False).encode()
    answer = await _exchange(small.port, ctx, _post("/validate", body))
    assert answer.startswith(b"HTTP/1.1 200")
    assert b'"uid":"' + uid.encode() + b'"' in answer
    # the same request with its uid as a lone surrogate: as bytes (not UTF-8) or as a \\u escape
    for raw in (body.replace(uid.encode(), b"\xed\xa0\x80"), body.replace(uid.encode(), b"\\ud800"),
                b"\xff" + body, "\ufeff".encode() + body):
        answer = await _exchange(small.port, ctx, _post("/validate", raw))
        assert answer.startswith(b"HTTP/1.1 400"), answer[:200]
    assert b"valid Unicode" in await _exchange(small.port, ctx, _post("/validate", body.replace(uid.encode(),
                                                                                                 b"\\ud800")))
    assert small.metrics.internal_error_count() == 0


# -- connections -------------------------------------------------------------------------------------------------
async def test_idle_connections_are_evicted_for_new_ones(small: WebhookServer, pki: PKI) -> None:
    assert small.port is not None and small.listener is not None
    ctx = pki.client_context()
    idle = [await _open(small.port, ctx) for _ in range(4)]
    answer = await _exchange(small.port, ctx, b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 200")
    assert small.listener.closed_count["evicted"] >= 1
    # the oldest was closed first
    assert await _closed(idle[0][0]) == b""
    for _, w in idle:
        w.close()


async def test_busy_connections_make_new_ones_wait(pki: PKI) -> None:
    srv = _server(pki, max_connections=2, body_timeout=30.0, max_body=64 * 1024,
                  inflight_bytes=BODY_EXPANSION * 64 * 1024 * 4)
    await srv.start()
    try:
        assert srv.port is not None and srv.listener is not None
        ctx = pki.client_context()
        busy = []
        for _ in range(2):  # half-sent bodies: busy, not idle
            r, w = await _open(srv.port, ctx)
            w.write(b"POST /validate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                    b"Content-Length: 1000\r\n\r\n{")
            busy.append((r, w))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10
        while srv.listener.connections < 2 or any(c.state != "busy" for c in srv.listener._conns.values()):
            assert loop.time() < deadline, "the two half-sent requests never reached the handler"
            await asyncio.sleep(0.02)
        probe = asyncio.create_task(_exchange(srv.port, ctx, b"GET /healthz HTTP/1.1\r\nHost: x\r\n"
                                                             b"Connection: close\r\n\r\n"))
        while srv.listener.waited_for_room == 0:  # the accept loop waits instead of accepting
            assert loop.time() < deadline, "the accept loop did not wait at the cap"
            await asyncio.sleep(0.02)
        assert not probe.done()
        busy[0][1].transport.abort()  # one ends: the waiting connection is accepted and answered
        assert (await asyncio.wait_for(probe, 10)).startswith(b"HTTP/1.1 200")
        busy[1][1].close()
    finally:
        await srv.stop()


async def test_slow_and_silent_clients_are_closed(small: WebhookServer, pki: PKI) -> None:
    assert small.port is not None and small.listener is not None
    ctx = pki.client_context()
    # headers never completed
    r, w = await _open(small.port, ctx)
    w.write(b"POST /validate HTTP/1.1\r\nHost: x\r\n")
    assert await _closed(r) == b""
    w.close()
    # a keep-alive connection idle after its request
    r, w = await _open(small.port, ctx)
    w.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    assert (await _closed(r)).startswith(b"HTTP/1.1 200")
    w.close()
    # a body that stops half way: 408, then closed
    r, w = await _open(small.port, ctx)
    w.write(b"POST /validate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 5000\r\n\r\n{")
    assert (await _closed(r)).startswith(b"HTTP/1.1 408")
    w.close()
    # TCP without a TLS handshake
    r, w = await asyncio.open_connection("127.0.0.1", small.port)
    assert await _closed(r) == b""
    w.close()
    assert small.listener.closed_count["timeout"] >= 1 and small.listener.closed_count["handshake_failed"] == 1
    await asyncio.sleep(0)
    assert small.listener.connections == 0


async def test_body_that_could_never_fit_the_budget_is_refused(pki: PKI) -> None:
    srv = _server(pki, max_body=1024 * 1024, inflight_bytes=BODY_EXPANSION * 100 * 1024)
    await srv.start()
    try:
        assert srv.port is not None
        answer = await _exchange(srv.port, pki.client_context(), _post("/validate", b" " * (200 * 1024)))
        assert answer.startswith(b"HTTP/1.1 413") and b"in-flight budget" in answer
        answer = await _exchange(srv.port, pki.client_context(), _post("/validate", b"{}"))
        assert answer.startswith(b"HTTP/1.1 400")
        assert srv.budget.used == 0
    finally:
        await srv.stop()


# -- client certificates -----------------------------------------------------------------------------------------
async def test_client_certificate_required_on_admission_paths(pki: PKI, tmp_path: Path) -> None:
    clients = make_ca("apiserver-client-ca")
    (tmp_path / "client-ca.crt").write_bytes(clients.cert_pem)
    pair = make_client_cert(clients)
    (tmp_path / "client.crt").write_bytes(pair.cert_pem)
    (tmp_path / "client.key").write_bytes(pair.key_pem)
    other = make_client_cert(make_ca("someone-else"))
    (tmp_path / "other.crt").write_bytes(other.cert_pem)
    (tmp_path / "other.key").write_bytes(other.key_pem)
    srv = _server(pki, client_ca=str(tmp_path / "client-ca.crt"))
    await srv.start()
    try:
        assert srv.port is not None
        body = json.dumps(review(pod_request(make_pod("p", [container("c")])))).encode()
        anonymous = pki.client_context()
        assert (await _exchange(srv.port, anonymous, _post("/validate", body))).startswith(b"HTTP/1.1 401")
        assert (await _exchange(srv.port, anonymous, b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                                                     b"\r\n")).startswith(b"HTTP/1.1 200")
        apiserver = pki.client_context()
        apiserver.load_cert_chain(tmp_path / "client.crt", tmp_path / "client.key")
        assert (await _exchange(srv.port, apiserver, _post("/validate", body))).startswith(b"HTTP/1.1 200")
        stranger = pki.client_context()
        stranger.load_cert_chain(tmp_path / "other.crt", tmp_path / "other.key")
        with pytest.raises((ssl.SSLError, ConnectionError, asyncio.IncompleteReadError)):
            answer = await _exchange(srv.port, stranger, _post("/validate", body))
            assert not answer, answer[:100]  # TLS 1.3 reports the refusal at the first read: nothing answered
            raise ConnectionError("closed without an answer")
    finally:
        await srv.stop()
