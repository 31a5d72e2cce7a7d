"""The proxy's /metrics and /status: aiohttp on the proxy's event loop, real sockets, real HTTP clients.

What is checked: the documents and content types (Prometheus text or OpenMetrics, gzip, JSON), that /status is
built on the loop's thread, clear 4xx for bad requests, the address the server binds, and that a stopped proxy
leaves nothing running (no task, no thread, no listening port).
"""

from __future__ import annotations

import asyncio
import gzip
import json
import logging
import re
import socket
import threading
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Counter

from allocator.errors import ConfigError
from criproxy.app import CriProxy
from criproxy.config import load_config
from nodeagent.serve.http_server import ProxyHttpServer
from nodeagent.serve.status import status_document
from numapin_lab.cri.client import CRIClient
from numapin_lab.cri.memory_runtime import MemoryRuntime
from numapin_lab.systemd_vm import THREAD_PREFIX as VM_THREAD_PREFIX
from tests.cri_validation.background import THREAD_PREFIX as CRITEST_THREAD_PREFIX

from .test_pinning import proxy_config, run_pod


def get(url: str, headers: dict[str, str] | None = None, method: str = "GET") -> tuple[int, dict[str, str], bytes]:
    req = urllib.request.Request(url, headers=headers or {}, method=method)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


async def aget(url: str, headers: dict[str, str] | None = None, method: str = "GET"
               ) -> tuple[int, dict[str, str], bytes]:
    return await asyncio.to_thread(get, url, headers, method)


async def raw_exchange(port: int, request: bytes) -> bytes:
    """Send ``request``, read until the server closes the connection (or, when the request declared a body it did
    not send, one second after the answer's head came: the server waits for that body before it closes)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request)
    await writer.drain()
    answer = b""
    while True:
        try:
            chunk = await asyncio.wait_for(reader.read(65536), 1 if b"\r\n\r\n" in answer else 10)
        except TimeoutError:
            if b"\r\n\r\n" not in answer:
                raise
            break
        if not chunk:
            break
        answer += chunk
    writer.close()
    return answer


@pytest.fixture
async def proxy(short_tmp: Path, runtime: MemoryRuntime, two_numa_sysfs: Path) -> AsyncIterator[CriProxy]:
    p = await CriProxy(proxy_config(short_tmp, runtime, two_numa_sysfs)).start()
    await asyncio.wait_for(p.reconciled.wait(), 30)
    yield p
    await p.stop()


async def test_metrics_and_status_of_a_running_proxy(proxy: CriProxy) -> None:
    async with CRIClient(proxy.config.listen) as k:
        await run_pod(k, "db", 2000, 2000)
    base = f"http://127.0.0.1:{proxy.metrics_port}"
    code, headers, body = await aget(f"{base}/metrics")
    assert code == 200 and headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
    text = body.decode()
    assert 'numapin_criproxy_allocations_total{mode="exclusive"} 1.0' in text
    assert 'numapin_criproxy_relay_seconds_count{code="OK",method="CreateContainer"} 1.0' in text
    # what Prometheus asks for: OpenMetrics, gzip
    code, headers, body = await aget(f"{base}/metrics", {"Accept": "application/openmetrics-text; version=1.0.0",
                                                         "Accept-Encoding": "gzip"})
    assert code == 200 and headers["Content-Type"].startswith("application/openmetrics-text")
    assert headers["Content-Encoding"] == "gzip"
    assert gzip.decompress(body).decode().rstrip().endswith("# EOF")
    # one metric by name
    code, _, body = await aget(f"{base}/metrics?name[]=numapin_criproxy_free_cpus")
    lines = [line for line in body.decode().splitlines() if not line.startswith("#")]
    assert code == 200 and lines and all(line.startswith("numapin_criproxy_free_cpus{") for line in lines)
    code, headers, body = await aget(f"{base}/status")
    assert code == 200 and headers["Content-Type"] == "application/json"
    doc = json.loads(body)
    assert doc == json.loads(json.dumps(status_document(proxy)))
    assert doc["kind"] == "NumapinProxyStatus" and doc["reconciled"] is True
    assert [(a["container"], a["mode"]) for a in doc["assignments"]] == [("app", "exclusive")]
    code, headers, body = await aget(f"{base}/status", method="HEAD")
    assert code == 200 and body == b"" and headers["Content-Type"] == "application/json"


@pytest.fixture
async def served() -> AsyncIterator[tuple[ProxyHttpServer, list[int], list[Any]]]:
    """A ProxyHttpServer whose status callable records the thread it runs on, and may be told to fail."""
    threads: list[int] = []
    failures: list[Any] = []
    registry = CollectorRegistry()
    Counter("numapin_test_things", "Things", registry=registry).inc()

    def status() -> dict[str, Any]:
        threads.append(threading.get_ident())
        if failures:
            raise failures.pop()
        return {"kind": "NumapinProxyStatus", "threads": len(threads)}

    server = ProxyHttpServer(registry, status)
    await server.start("127.0.0.1", 0)
    yield server, threads, failures
    await server.stop()


async def test_status_is_built_on_the_event_loop_thread(served: tuple[ProxyHttpServer, list[int], list[Any]]
                                                        ) -> None:
    server, threads, _ = served
    for _ in range(3):
        code, _, body = await aget(f"http://127.0.0.1:{server.port}/status")
        assert code == 200 and json.loads(body)["kind"] == "NumapinProxyStatus"
    assert threads == [threading.get_ident()] * 3


async def test_bad_requests_get_clear_4xx(served: tuple[ProxyHttpServer, list[int], list[Any]]) -> None:
    server, threads, _ = served
    base = f"http://127.0.0.1:{server.port}"
    code, headers, body = await aget(f"{base}/nothing")
    assert code == 404 and headers["Content-Type"].startswith("text/plain")
    assert body.decode() == "/nothing: no such endpoint; the proxy serves /metrics and /status\n"
    code, headers, body = await aget(f"{base}/status", method="POST")
    assert code == 405 and "GET" in headers["Allow"] and body.decode() == \
        "POST /status: method not allowed; use GET\n"
    answer = await raw_exchange(server.port, b"\x16\x03\x01 not http at all\r\n\r\n")  # a TLS client
    assert answer.split(b" ")[1] == b"400" and answer.endswith(b"Received HTTPS traffic on an HTTP port")
    answer = await raw_exchange(server.port, b"BREW /status HTCPCP/1.0\r\n\r\n")
    assert answer.split(b" ")[1] == b"400"
    answer = await raw_exchange(server.port, b"GET /status HTTP/1.1\r\nHost: x\r\n" + b"X: " + b"a" * 20000 +
                                b"\r\n\r\n")
    assert answer.split(b" ")[1] in (b"400", b"431")
    assert threads == []  # none of them reached the status document
    code, _, body = await aget(f"{base}/status")
    assert code == 200


async def test_a_failing_status_is_a_500_and_the_server_keeps_serving(
        served: tuple[ProxyHttpServer, list[int], list[Any]], caplog: pytest.LogCaptureFixture) -> None:
    server, _, failures = served
    failures.append(KeyError("podModes"))
    with caplog.at_level(logging.ERROR, "numapin.criproxy"):
        code, headers, body = await aget(f"http://127.0.0.1:{server.port}/status")
    assert code == 500 and headers["Content-Type"] == "application/json"
    assert json.loads(body) == {"error": "status unavailable: KeyError('podModes')"}
    assert "status: building the document failed" in caplog.text
    code, _, _ = await aget(f"http://127.0.0.1:{server.port}/status")
    assert code == 200


async def test_binds_the_address_it_is_given() -> None:
    server = ProxyHttpServer(CollectorRegistry(), dict)
    port = await server.start("127.0.0.1", 0)
    try:
        code, _, _ = await aget(f"http://127.0.0.1:{port}/metrics")
        assert code == 200
        with pytest.raises(ConnectionRefusedError):  # another loopback address: not listened on
            await asyncio.open_connection("127.0.0.2", port)
        other = ProxyHttpServer(CollectorRegistry(), dict)
        with pytest.raises(OSError, match=rf"^metrics-address 127\.0\.0\.1:{port}: cannot listen: Address already "
                                          "in use$"):
            await other.start("127.0.0.1", port)
        assert other.port is None
    finally:
        await server.stop()
    with pytest.raises(ConnectionRefusedError):
        await asyncio.open_connection("127.0.0.1", port)
    with pytest.raises(OSError, match=re.escape("metrics-address no-such-host.invalid:0: cannot resolve")):
        await ProxyHttpServer(CollectorRegistry(), dict).start("no-such-host.invalid", 0)


async def test_binds_ipv6_when_the_address_is_ipv6() -> None:
    for address in ("[::1]:0", "::1:0"):
        host, port = load_config(None, {"metrics_address": address}).metrics_endpoint() or ("", -1)
        assert (host, port) == ("::1", 0)
        server = ProxyHttpServer(CollectorRegistry(), dict)
        port = await server.start(host, port)
        try:
            code, _, _ = await aget(f"http://[::1]:{port}/status")
            assert code == 200
        finally:
            await server.stop()


@pytest.mark.parametrize("address", ["127.0.0.1:65536", "127.0.0.1:-1", "localhost", "127.0.0.1:http"])
def test_a_bad_metrics_address_is_a_config_error(address: str) -> None:
    with pytest.raises(ConfigError, match="metrics-address"):
        load_config(None, {"metrics_address": address}).metrics_endpoint()


async def leftovers(before: set[asyncio.Task[Any]]) -> list[str]:
    """Tasks started since ``before`` and still there, once the stopped runtime's own RPC handlers (gRPC names them
    ``HandleExceptions[/runtime....]``; they end a few loop turns after its server stops) are gone."""
    for _ in range(500):
        if not any(t.get_name().startswith("HandleExceptions[/runtime.") for t in asyncio.all_tasks()):
            break
        await asyncio.sleep(0.01)
    return [f"{t.get_name()}: {t.get_coro()!r}" for t in asyncio.all_tasks() - before
            if t is not asyncio.current_task()]


@pytest.mark.parametrize("relay", ["grpc", "frames"])
async def test_nothing_runs_after_stop(short_tmp: Path, two_numa_sysfs: Path, relay: str) -> None:
    """Every attribute of the proxy exists from __init__; every task it started is gone after stop (the runtime,
    a gRPC server too, is stopped as well: its tasks look like the proxy's); the port is closed; no thread is left
    but the loop's worker pool."""
    tasks = asyncio.all_tasks()
    runtime = await MemoryRuntime(str(short_tmp / "own-rt.sock")).start()
    threads = {t.name for t in threading.enumerate()}  # grpc.aio's poller thread (process-wide) runs from here
    p = CriProxy(proxy_config(short_tmp, runtime, two_numa_sysfs, reconcile_period=0.05, converge_period=0.05,
                              relay=relay))
    with pytest.raises(RuntimeError, match="not started"):
        p.allocator  # noqa: B018
    attributes = set(vars(p))
    await p.start()
    try:
        await asyncio.wait_for(p.reconciled.wait(), 30)
        assert set(vars(p)) == attributes  # every attribute is created in __init__
        async with CRIClient(p.config.listen) as k:
            await run_pod(k, "db", 2000, 2000)
            await run_pod(k, "web", 500)
        port = p.metrics_port
        assert port is not None
        code, _, _ = await aget(f"http://127.0.0.1:{port}/status")
        assert code == 200
        held = socket.create_connection(("127.0.0.1", port))  # an idle keep-alive client must not hold the stop
        await asyncio.sleep(0.2)  # a few reconcile and converge passes
    finally:
        await p.stop()
        await runtime.stop()
    held.close()
    assert set(vars(p)) == attributes
    assert await leftovers(tasks) == []
    with pytest.raises(ConnectionRefusedError):
        await asyncio.open_connection("127.0.0.1", port)
    # the gRPC relay's thread pool is shut down without waiting: a thread ends once its call has, and stop() closed
    # the runtime's channel under every call; grpc's own stop thread (cancel_all_calls_after_grace) sets the event
    # stop() waits for as its last step, then ends (bounded wait, 10 s: under load it outlived stop() by a moment)
    for _ in range(1000):
        if not any(t.name.startswith("numapin-relay") or "cancel_all_calls_after_grace" in t.name
                   for t in threading.enumerate()):
            break
        await asyncio.sleep(0.01)
    # to_thread's pool only; in the whole suite a VM boot or the CRI validation suite's runs may begin meanwhile in
    # the background, with threads of their own (named for them), which are not the proxy's
    new_threads = {t.name for t in threading.enumerate() if t.is_alive()} - threads
    background = ("asyncio_", VM_THREAD_PREFIX, CRITEST_THREAD_PREFIX)
    assert not [n for n in new_threads if not n.startswith(background)], new_threads


async def test_a_proxy_that_cannot_bind_its_metrics_port_stops_cleanly(short_tmp: Path, two_numa_sysfs: Path
                                                                      ) -> None:
    tasks = asyncio.all_tasks()
    runtime = await MemoryRuntime(str(short_tmp / "own-rt.sock")).start()
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    p = CriProxy(proxy_config(short_tmp, runtime, two_numa_sysfs, metrics_address=f"127.0.0.1:{port}"))
    try:
        with pytest.raises(OSError, match=f"metrics-address 127.0.0.1:{port}: cannot listen"):
            await p.start()
    finally:
        await p.stop()
        await runtime.stop()
        taken.close()
    assert await leftovers(tasks) == []
    assert not Path(p.config.listen).exists()  # the relay never started


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_seeded_garbage_never_gets_a_5xx_and_the_server_keeps_serving(
        served: tuple[ProxyHttpServer, list[int], list[Any]], seed: int) -> None:
    """Random request lines, methods, paths, headers and raw bytes: every answer is 200 (a real endpoint asked
    properly) or 4xx, never 5xx; /status still answers afterwards."""
    import random

    rng = random.Random(seed)
    server, _, _ = served
    assert server.port is not None
    methods = ["GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "PATCH", "BREW", "G\x00T", "get"]
    paths = ["/metrics", "/status", "/", "/status/", "/metrics?name[]=x", "//status", "/%ff", "/a" * 300,
             "/status?" + "x=1&" * 200, "*", "http://evil/status", "/stat\x01us"]
    answers: list[int] = []
    for _ in range(60):
        if rng.random() < 0.2:
            raw = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 200))) + b"\r\n\r\n"
        else:
            headers = "".join(f"{rng.choice(['X-A', 'Accept', 'Accept-Encoding', 'Content-Length', 'Host'])}: "
                              f"{rng.choice(['gzip', '1', '-1', 'x' * rng.randrange(1, 300), '', 'text/*'])}\r\n"
                              for _ in range(rng.randrange(0, 5)))
            raw = (f"{rng.choice(methods)} {rng.choice(paths)} {rng.choice(['HTTP/1.1', 'HTTP/1.0', 'HTTP/9'])}\r\n"
                   f"{headers}Connection: close\r\n\r\n").encode("latin-1")
        answer = await raw_exchange(server.port, raw)
        if answer:  # a connection closed without an answer is a refusal too
            first = answer.split(b"\r\n", 1)[0].split(b" ")
            assert len(first) >= 2 and first[0].startswith(b"HTTP/1."), answer[:200]
            answers.append(int(first[1]))
    assert answers and all(code == 200 or 400 <= code < 500 for code in answers), sorted(set(answers))
    code, _, _ = await aget(f"http://127.0.0.1:{server.port}/status")
    assert code == 200


async def test_stop_while_requests_are_in_flight(short_tmp: Path, two_numa_sysfs: Path) -> None:
    """Status and metrics requests racing the proxy's stop: stop completes, each request is answered or cut off,
    nothing is left running."""
    tasks = asyncio.all_tasks()
    runtime = await MemoryRuntime(str(short_tmp / "own-rt.sock")).start()
    p = await CriProxy(proxy_config(short_tmp, runtime, two_numa_sysfs)).start()
    try:
        await asyncio.wait_for(p.reconciled.wait(), 30)
        port = p.metrics_port
        requests = [asyncio.ensure_future(aget(f"http://127.0.0.1:{port}{path}"))
                    for _ in range(10) for path in ("/status", "/metrics")]
        await asyncio.sleep(0.01)
    finally:
        await asyncio.wait_for(p.stop(), 30)
        await runtime.stop()
    for outcome in await asyncio.gather(*requests, return_exceptions=True):
        assert isinstance(outcome, OSError) or outcome[0] == 200, outcome
    assert await leftovers(tasks) == []


async def test_a_connection_without_a_request_is_closed() -> None:
    """A client that connects and sends nothing, or only part of a request head, does not hold its connection:
    the server closes it after its idle timeout (0.5 s here; the wait below is only an upper bound)."""
    server = ProxyHttpServer(CollectorRegistry(), dict, idle_timeout=0.5)
    port = await server.start("127.0.0.1", 0)
    try:
        for sent in (b"", b"GET /status HTTP/1.1\r\nHost: x\r\n"):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(sent)
            assert await asyncio.wait_for(reader.read(), 30) == b""  # closed, nothing answered
            writer.close()
        code, _, _ = await aget(f"http://127.0.0.1:{port}/status")
        assert code == 200
    finally:
        await server.stop()
