"""Certificate rotation while requests keep coming: none fails, and new connections get the new certificate."""

from __future__ import annotations

import asyncio
import os
import ssl

import aiohttp
from cryptography import x509

from tests.webhook.helpers import PKI, SERVER_NAME, Client, container, make_pod, pod_request, review
from webhook.app import WebhookApp
from webhook.https.certs import make_serving_cert, service_dns_names


async def _served_serial(port: int, pki: PKI) -> int:
    _, w = await asyncio.open_connection("127.0.0.1", port, ssl=pki.client_context(), server_hostname=SERVER_NAME)
    der = w.get_extra_info("ssl_object").getpeercert(binary_form=True)
    w.close()
    return x509.load_der_x509_certificate(der).serial_number


async def _wait_for_serial(port: int, pki: PKI, serial: int) -> None:
    for _ in range(400):
        if await _served_serial(port, pki) == serial:
            return
        await asyncio.sleep(0.025)
    raise AssertionError(f"certificate with serial {serial:x} never served")


async def test_rotation_under_load_drops_no_request(server: WebhookApp, pki: PKI) -> None:
    port = server.port
    assert port is not None
    failures: list[str] = []
    done = 0
    stop = asyncio.Event()
    body = review(pod_request(make_pod("p", [container("c", "2")])))

    async def keepalive_worker() -> None:
        nonlocal done
        async with aiohttp.ClientSession() as s:
            c = Client(port, pki, s)
            while not stop.is_set():
                status, resp = await c.post("/mutate", body)
                if status != 200 or resp["response"]["allowed"] is not True:
                    failures.append(f"{status} {resp}")
                done += 1

    async def new_connection_worker() -> None:
        nonlocal done
        while not stop.is_set():
            conn = aiohttp.TCPConnector(force_close=True)
            async with aiohttp.ClientSession(connector=conn) as s:
                try:
                    status, _ = await Client(port, pki, s).post("/validate", body)
                    if status != 200:
                        failures.append(str(status))
                except (aiohttp.ClientError, ssl.SSLError) as e:
                    failures.append(repr(e))
            done += 1

    workers = [asyncio.create_task(keepalive_worker()) for _ in range(4)]
    workers += [asyncio.create_task(new_connection_worker()) for _ in range(4)]
    serials = []
    for _ in range(3):
        await asyncio.sleep(0.15)
        serial = pki.issue()  # atomic rename of key then cert
        serials.append(serial)
        await _wait_for_serial(port, pki, serial)
    stop.set()
    await asyncio.gather(*workers)
    assert failures == []
    assert done > 20
    assert server.reloader.reloads == 3
    async with aiohttp.ClientSession() as s:
        _, metrics = await Client(port, pki, s).get("/metrics")
    assert "numapin_webhook_cert_reloads_total 3.0" in metrics


async def test_half_written_or_mismatched_pair_keeps_the_old_certificate(server: WebhookApp, pki: PKI) -> None:
    port = server.port
    assert port is not None
    before = await _served_serial(port, pki)
    # a new certificate whose key has not been written yet: the pair does not match
    other = make_serving_cert(pki.ca, service_dns_names("numapin-webhook", "numapin"))
    pki.cert.write_bytes(other.cert_pem)
    await asyncio.sleep(0.3)
    assert await _served_serial(port, pki) == before
    assert server.reloader.last_error is not None
    # a truncated key
    pki.key.write_bytes(b"-----BEGIN PRIVATE KEY-----\nMIG")
    await asyncio.sleep(0.3)
    assert await _served_serial(port, pki) == before
    # the writer finishes: the new pair is served
    pki.key.write_bytes(other.key_pem)
    await _wait_for_serial(port, pki, other.certificate.serial_number)


async def test_secret_volume_symlink_swap(pki: PKI, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """kubelet updates a Secret volume by swapping the ``..data`` symlink; the files are links through it."""
    from webhook.app import WebhookOptions

    vol = tmp_path / "vol"
    vol.mkdir()
    v1 = vol / "..v1"
    v1.mkdir()
    (v1 / "tls.crt").write_bytes(pki.cert.read_bytes())
    (v1 / "tls.key").write_bytes(pki.key.read_bytes())
    os.symlink("..v1", vol / "..data")
    os.symlink("..data/tls.crt", vol / "tls.crt")
    os.symlink("..data/tls.key", vol / "tls.key")
    nrt = tmp_path / "nrt2"
    nrt.mkdir()
    app = WebhookApp(WebhookOptions(cert=vol / "tls.crt", key=vol / "tls.key", host="127.0.0.1", port=0,
                                    nrt_dir=nrt, cert_poll_seconds=0.05))
    await app.start()
    try:
        pair = make_serving_cert(pki.ca, service_dns_names("numapin-webhook", "numapin"))
        v2 = vol / "..v2"
        v2.mkdir()
        (v2 / "tls.crt").write_bytes(pair.cert_pem)
        (v2 / "tls.key").write_bytes(pair.key_pem)
        os.symlink("..v2", vol / "..data_tmp")
        os.replace(vol / "..data_tmp", vol / "..data")
        assert app.port is not None
        await _wait_for_serial(app.port, pki, pair.certificate.serial_number)
    finally:
        await app.stop()
