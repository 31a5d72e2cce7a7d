"""The NodeResourceTopology reaches the API server (a small real HTTP server speaking the subset used)."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web

from criproxy.app import CriProxy
from criproxy.config import ProxyConfig, load_config
from numapin_lab.cri.client import CRIClient
from numapin_lab.cri.memory_runtime import MemoryRuntime

BASE = "/apis/topology.node.k8s.io/v1alpha2/noderesourcetopologies"


class FakeApiServer:
    def __init__(self) -> None:
        self.objects: dict[str, dict] = {}
        self.version = 0
        self.requests: list[str] = []
        app = web.Application()
        app.router.add_get(BASE + "/{name}", self.get)
        app.router.add_post(BASE, self.create)
        app.router.add_put(BASE + "/{name}", self.replace)
        self.runner = web.AppRunner(app)

    def _store(self, body: dict) -> dict:
        self.version += 1
        body.setdefault("metadata", {})["resourceVersion"] = str(self.version)
        self.objects[body["metadata"]["name"]] = body
        return body

    async def get(self, request: web.Request) -> web.Response:
        self.requests.append("GET")
        obj = self.objects.get(request.match_info["name"])
        if obj is None:
            return web.json_response({"kind": "Status", "code": 404, "reason": "NotFound"}, status=404)
        return web.json_response(obj)

    async def create(self, request: web.Request) -> web.Response:
        self.requests.append("POST")
        return web.json_response(self._store(await request.json()), status=201)

    async def replace(self, request: web.Request) -> web.Response:
        self.requests.append("PUT")
        body = await request.json()
        cur = self.objects.get(request.match_info["name"])
        if cur is None or body["metadata"].get("resourceVersion") != cur["metadata"]["resourceVersion"]:
            return web.json_response({"kind": "Status", "code": 409, "reason": "Conflict"}, status=409)
        return web.json_response(self._store(body))


def write_kubeconfig(path: Path, port: int) -> Path:
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "t",
        "clusters": [{"name": "t", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
        "users": [{"name": "t", "user": {"token": "x"}}],
        "contexts": [{"name": "t", "context": {"cluster": "t", "user": "t"}}]}))
    return path


def proxy_config(tmp: Path, runtime: MemoryRuntime, sysfs: Path, kubeconfig: Path) -> ProxyConfig:
    return load_config(None, {"listen": str(tmp / "proxy.sock"), "runtime_endpoint": runtime.socket_path,
                              "state_dir": str(tmp / "state"), "sysfs": str(sysfs), "reserved_cpus": "0",
                              "metrics_address": "", "node_name": "node-a", "kubeconfig": str(kubeconfig)})


@pytest.fixture
async def api(short_tmp: Path) -> AsyncIterator[tuple[FakeApiServer, Path]]:
    srv = FakeApiServer()
    await srv.runner.setup()
    site = web.TCPSite(srv.runner, "127.0.0.1", 0)
    await site.start()
    port = srv.runner.addresses[0][1]
    kubeconfig = write_kubeconfig(short_tmp / "kubeconfig", port)
    yield srv, kubeconfig
    await srv.runner.cleanup()


async def test_nrt_is_created_then_replaced_on_change(api, short_tmp: Path, runtime: MemoryRuntime,
                                                      two_numa_sysfs: Path) -> None:
    srv, kubeconfig = api
    cfg = proxy_config(short_tmp, runtime, two_numa_sysfs, kubeconfig)
    p = await CriProxy(cfg).start()
    try:
        async with CRIClient(p.config.listen) as k:
            await asyncio.wait_for(p.reconciled.wait(), 30)
            sb = k.sandbox_config("db", "uid-db")
            sid = await k.run_pod_sandbox(sb)
            await k.create_container(sid, k.container_config("app", cpu_milli=3000, limit_milli=3000), sb)

        def available() -> list[str]:
            obj = srv.objects.get("node-a")
            return [z["resources"][0]["available"] for z in obj["zones"]] if obj else []

        for _ in range(1500):
            if available() == ["0", "4"]:
                break
            await asyncio.sleep(0.02)
        assert available() == ["0", "4"]
        assert "POST" in srv.requests and "PUT" in srv.requests
        assert srv.objects["node-a"]["kind"] == "NodeResourceTopology"
        for _ in range(1500):  # the newest document is on the API server: nothing waits (the alert's gauge)
            if unpublished_since(p, "api") == 0:
                break
            await asyncio.sleep(0.02)
        assert unpublished_since(p, "api") == 0 and unpublished_since(p, "file") == 0
    finally:
        await p.stop()


def unpublished_since(proxy: CriProxy, target: str) -> float | None:
    return proxy.metrics.registry.get_sample_value("numapin_criproxy_nrt_unpublished_since_seconds",
                                                   {"target": target})


async def test_a_topology_the_api_server_does_not_take_shows_as_waiting(
        short_tmp: Path, runtime: MemoryRuntime, two_numa_sysfs: Path, caplog: pytest.LogCaptureFixture) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    kubeconfig = write_kubeconfig(short_tmp / "kubeconfig", port)
    cfg = proxy_config(short_tmp, runtime, two_numa_sysfs, kubeconfig)
    before = time.time()
    p = await CriProxy(cfg).start()
    try:
        for _ in range(1500):
            if "NodeResourceTopology publish failed" in caplog.text and unpublished_since(p, "file") == 0:
                break
            await asyncio.sleep(0.02)
        assert "NodeResourceTopology publish failed" in caplog.text
        assert unpublished_since(p, "file") == 0  # the file was written
        since = unpublished_since(p, "api")
        assert since is not None and before <= since <= time.time()
    finally:
        await p.stop()
