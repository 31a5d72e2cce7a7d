"""The HTTPS server as kube-apiserver and the kubelet see it: real TLS, real HTTP."""

from __future__ import annotations

import asyncio
import json
import ssl
from pathlib import Path

import aiohttp
import pytest

from tests.webhook import apiserver_view
from tests.webhook.helpers import PKI, SERVER_NAME, Client, container, make_pod, pod_request, review
from webhook.app import WebhookApp


async def test_healthz_readyz_metrics(client: Client) -> None:
    assert await client.get("/healthz") == (200, "ok\n")
    assert await client.get("/readyz") == (200, "ok\n")
    await client.admit("/mutate", pod_request(make_pod("p", [container("c", "1")])))
    status, text = await client.get("/metrics")
    assert status == 200
    assert 'numapin_webhook_requests_total{endpoint="mutate",verdict="patched"} 1.0' in text
    assert "numapin_webhook_request_duration_seconds_bucket" in text
    assert "numapin_webhook_cert_not_after_seconds" in text


async def test_readyz_waits_for_the_node_source(pki: PKI, tmp_path: Path) -> None:
    from webhook.app import WebhookOptions

    app = WebhookApp(WebhookOptions(cert=pki.cert, key=pki.key, host="127.0.0.1", port=0,
                                    nrt_dir=tmp_path / "does-not-exist-yet", nrt_poll_seconds=0.05))
    app.nodes.register("api")  # a source that never syncs
    await app.start()
    try:
        async with aiohttp.ClientSession() as s:
            c = Client(app.port, pki, s)  # type: ignore[arg-type]
            status, text = await c.get("/readyz")
            assert status == 503 and "node topology" in text
            app.nodes.mark_synced("api")
            for _ in range(200):  # then the decision paths are warmed up: not ready until they are
                status, text = await c.get("/readyz")
                if status == 200:
                    break
                assert (status, text) == (503, "warming up the decision paths\n")
                await asyncio.sleep(0.02)
            assert (status, text) == (200, "ok\n") and app.prepared.is_set()
    finally:
        await app.stop()


async def test_v1_and_v1beta1_answered_in_kind(client: Client) -> None:
    for version in ("admission.k8s.io/v1", "admission.k8s.io/v1beta1"):
        req = pod_request(make_pod("p", [container("c", "100m")]))
        resp = await client.admit("/validate", req, api_version=version)
        assert resp["allowed"] is True


async def test_bad_bodies_get_400_with_a_message(client: Client) -> None:
    status, text = await client.post("/mutate", None, raw=b"{not json")
    assert status == 400 and "not valid JSON" in text
    status, text = await client.post("/mutate", {"apiVersion": "v1", "kind": "Pod"})
    assert status == 400 and "apiVersion" in text
    status, text = await client.post("/validate", review({"operation": "CREATE"}))
    assert status == 400 and "request.uid" in text
    status, text = await client.post("/validate", None, raw=b"[" * 100000 + b"]" * 100000)
    assert status == 400


async def test_wrong_content_type_gets_415(client: Client) -> None:
    status, text = await client.post("/mutate", review(pod_request(make_pod("p", [container("c")]))),
                                     content_type="text/plain")
    assert status == 415 and "application/json" in text


async def test_body_over_the_limit_gets_413(client: Client) -> None:
    pod = make_pod("p", [container("c")], annotations={"big": "x" * (300 * 1024)})
    status, text = await client.post("/mutate", review(pod_request(pod)))
    assert status == 413 and "limit" in text


async def test_unhandled_objects_are_allowed(client: Client) -> None:
    req = pod_request(make_pod("p", [container("c")]))
    req["resource"] = {"group": "apps", "version": "v1", "resource": "deployments"}
    req["kind"] = {"group": "apps", "version": "v1", "kind": "Deployment"}
    for path in ("/mutate", "/validate"):
        resp = await client.admit(path, req)
        assert resp["allowed"] is True and "patch" not in resp
    req = pod_request(make_pod("p", [container("c")]), operation="DELETE")
    req["object"] = None
    assert (await client.admit("/validate", req))["allowed"] is True


async def test_plain_http_is_refused(server: WebhookApp) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    await writer.drain()
    data = await asyncio.wait_for(reader.read(4096), timeout=10)
    writer.close()
    assert not data.startswith(b"HTTP/1.1 200"), data
    assert b"ok" not in data


def _old_tls_client(version: ssl.TLSVersion) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.set_ciphers("DEFAULT:@SECLEVEL=0")
    ctx.minimum_version = version
    ctx.maximum_version = version
    return ctx


@pytest.mark.filterwarnings("ignore:ssl.TLSVersion:DeprecationWarning")
@pytest.mark.parametrize("version", [ssl.TLSVersion.TLSv1, ssl.TLSVersion.TLSv1_1])
async def test_tls_1_0_and_1_1_are_refused(server: WebhookApp, pki: PKI, version: ssl.TLSVersion) -> None:
    # control: this client can speak the old version (a server that allows it accepts the handshake)
    permissive = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    permissive.set_ciphers("DEFAULT:@SECLEVEL=0")
    permissive.minimum_version = ssl.TLSVersion.TLSv1
    permissive.load_cert_chain(pki.cert, pki.key)
    srv = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0, ssl=permissive)
    port = srv.sockets[0].getsockname()[1]
    try:
        _, w = await asyncio.open_connection("127.0.0.1", port, ssl=_old_tls_client(version))
        assert w.get_extra_info("ssl_object").version() in ("TLSv1", "TLSv1.1")
        w.close()
    finally:
        srv.close()
        await srv.wait_closed()
    # the webhook refuses it
    with pytest.raises((ssl.SSLError, ConnectionError)):
        await asyncio.open_connection("127.0.0.1", server.port, ssl=_old_tls_client(version))
    # and TLS 1.2 works with the same kind of client
    _, w = await asyncio.open_connection("127.0.0.1", server.port, ssl=_old_tls_client(ssl.TLSVersion.TLSv1_2))
    assert w.get_extra_info("ssl_object").version() == "TLSv1.2"
    w.close()


async def test_certificate_is_verified_by_name(client: Client, pki: PKI) -> None:
    async with client.session.get(client.base + "/healthz", ssl=pki.client_context(),
                                  server_hostname=SERVER_NAME) as r:
        assert r.status == 200
    with pytest.raises(aiohttp.ClientConnectorCertificateError):
        async with client.session.get(client.base + "/healthz", ssl=pki.client_context(),
                                      server_hostname="evil.example.com"):
            pass


async def test_decision_errors_are_answered_not_500(pki: PKI) -> None:
    from webhook.admission.review import AdmissionRequest, Verdict
    from webhook.https.metrics import WebhookMetrics
    from webhook.https.server import ServerConfig, WebhookServer
    from webhook.https.tls import CertReloader

    async def broken(req: AdmissionRequest) -> Verdict:
        raise RuntimeError("bug")

    metrics = WebhookMetrics()
    srv = WebhookServer(reloader=CertReloader(pki.cert, pki.key), mutate=broken, validate=broken, metrics=metrics,
                        config=ServerConfig(host="127.0.0.1", port=0))
    await srv.start()
    try:
        async with aiohttp.ClientSession() as s:
            c = Client(srv.port, pki, s)  # type: ignore[arg-type]
            resp = await c.admit("/mutate", pod_request(make_pod("p", [container("c")])))
            assert resp["allowed"] is True and "internal error" in resp["warnings"][0]
        assert metrics.internal_error_count() == 1
    finally:
        await srv.stop()


async def test_an_internal_error_is_a_500_the_operator_reads_in_kubectl(pki: PKI,
                                                                         caplog: pytest.LogCaptureFixture) -> None:
    """An exception that is not the client's fault, outside the decision (here: a verdict whose patch cannot be
    written as JSON, a bug), is answered 500 with a line of text naming the error, over real TLS, on every path; the
    API server, reading it as it does (``apiserver_view``), refuses the request under ``failurePolicy: Fail`` with
    that line in kubectl's message and lets it through under ``Ignore``; the server keeps serving."""
    from webhook.admission.review import AdmissionRequest, Verdict
    from webhook.https.metrics import WebhookMetrics
    from webhook.https.server import ServerConfig, WebhookServer
    from webhook.https.tls import CertReloader

    async def unwritable(req: AdmissionRequest) -> Verdict:
        return Verdict.allow(patch=({"op": "add", "path": "/metadata/labels", "value": object()},))

    async def allow(req: AdmissionRequest) -> Verdict:
        return Verdict.allow()

    ready_calls: list[int] = []

    def broken_check() -> tuple[bool, str]:
        ready_calls.append(1)
        if len(ready_calls) == 1:
            raise ZeroDivisionError("bug")
        return True, "ok"

    metrics = WebhookMetrics()
    srv = WebhookServer(reloader=CertReloader(pki.cert, pki.key), mutate=unwritable, validate=allow, metrics=metrics,
                        config=ServerConfig(host="127.0.0.1", port=0), ready_checks=(broken_check,))
    await srv.start()
    said = "internal error answering POST /mutate: TypeError (see the webhook's log)"
    try:
        async with aiohttp.ClientSession() as s:
            c = Client(srv.port, pki, s)  # type: ignore[arg-type]
            async with s.post(c.base + "/mutate", data=json.dumps(review(pod_request(make_pod("p", [container("c")])))),
                              headers={"Content-Type": "application/json"}, ssl=c.ctx,
                              server_hostname=SERVER_NAME) as r:
                status, content_type, body = r.status, r.headers.get("Content-Type", ""), await r.read()
            assert (status, body) == (500, said.encode() + b"\n") and content_type.startswith("text/plain")
            error = apiserver_view.call_error(status, content_type, body)
            assert error == f'an error on the server ("{said}") has prevented the request from succeeding'
            refused = apiserver_view.outcome("mutate.pods.numapin.io", "Fail", error)
            assert not refused.allowed and refused.message is not None
            assert apiserver_view.kubectl_line(refused.message) == (
                'Error from server (InternalError): error when creating "pod.yaml": Internal error occurred: failed '
                'calling webhook "mutate.pods.numapin.io": failed to call webhook: an error on the server ("internal '
                "error answering POST /mutate: TypeError (see the webhook's log)\") has prevented the request from "
                "succeeding")
            assert apiserver_view.outcome("validate.bindings.numapin.io", "Ignore", error).allowed  # failurePolicy
            assert await c.get("/readyz") == (500, "internal error answering GET /readyz: ZeroDivisionError (see the "
                                                   "webhook's log)\n")
            # the same server goes on answering
            assert (await c.admit("/validate", pod_request(make_pod("p", [container("c")]))))["allowed"] is True
            assert await c.get("/readyz") == (200, "ok\n")
        assert metrics.internal_error_count() == 2
        assert "unhandled error answering POST /mutate" in caplog.text and "TypeError" in caplog.text
    finally:
        await srv.stop()


def test_the_apiserver_view_reads_what_was_observed() -> None:
    """The reading the test above relies on gives what operators saw of the old answer (an AdmissionReview in a
    500: ``("unknown")``) and keeps a v1 Status's message."""
    old = json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": {
        "uid": "", "allowed": False, "status": {"status": "Failure", "code": 500, "message": "boom"}}}).encode()
    assert apiserver_view.call_error(500, "application/json", old) == \
        'an error on the server ("unknown") has prevented the request from succeeding'
    busy = apiserver_view.call_error(503, "text/plain", b"busy")
    assert busy == "the server is currently unable to handle the request"
    assert apiserver_view.call_error(200, "application/json", old) is None
    status = json.dumps({"apiVersion": "v1", "kind": "Status", "status": "Failure", "message": "boom"}).encode()
    assert apiserver_view.call_error(500, "application/json", status) == "boom"


async def _raw_exchange(port: int, pki: PKI, data: bytes) -> bytes:
    r, w = await asyncio.open_connection("127.0.0.1", port, ssl=pki.client_context(), server_hostname=SERVER_NAME)
    w.write(data)
    await w.drain()
    out = await asyncio.wait_for(r.read(4096), timeout=10)
    w.close()
    return out.split(b"\r\n", 1)[0]


async def test_odd_http_bodies(server: WebhookApp, pki: PKI) -> None:
    head = b"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\n"
    port = server.port
    assert port is not None
    # a body that does not decode with its Content-Encoding
    assert await _raw_exchange(port, pki, head + b"Content-Encoding: gzip\r\nContent-Length: 7\r\n\r\n{\"a\":1}") \
        == b"HTTP/1.1 400 Bad Request"
    # chunked, no Content-Length, over the limit (256 KiB in the test server)
    chunks = b"".join(b"%x\r\n%s\r\n" % (65536, b"x" * 65536) for _ in range(5)) + b"0\r\n\r\n"
    assert await _raw_exchange(port, pki, head + b"Transfer-Encoding: chunked\r\n\r\n" + chunks) \
        == b"HTTP/1.1 413 Request Entity Too Large"
    # JSON that is not an object, numbers out of range, invalid UTF-8
    for body in (b"NaN", b"1e999", b"\xff\xfe\x00\x01", b"null", b'"x"'):
        assert await _raw_exchange(port, pki, head + b"Content-Length: %d\r\n\r\n%s" % (len(body), body)) \
            == b"HTTP/1.1 400 Bad Request"
    assert server.metrics.internal_error_count() == 0
