"""The cluster-mode sources (``APISource``: NRTs and Nodes; ``PodAPISource``: unbound pods) run for real, through
kubernetes-asyncio and a kubeconfig, against a small HTTP server speaking the part of the Kubernetes API they use
(tests/webhook/fake_kube.py): list then watch from the list's resourceVersion, events applied, a closed watch and a
410 Gone answered by watching/listing again, a clean stop; and the webhook judging a binding with what came only from
that server."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import aiohttp
import pytest

from tests.webhook.fake_kube import NODES_PATH, NRT_PATH, PODS_PATH, FakeKubeAPI
from tests.webhook.helpers import PKI, Client, binding_request, container, make_pod
from tests.webhook.nrt_fixtures import machine, node_doc, nrt
from webhook.app import WebhookApp, WebhookOptions
from webhook.cluster.nodes import APISource, NodeStore
from webhook.cluster.pods_cache import PodAPISource, PodCache

BIG = machine(2, 14)  # 2 NUMA nodes x 28 CPUs
SMALL = machine(2, 2)
GONE = {"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                                    "message": "too old resource version: 1 (500)", "reason": "Expired",
                                    "code": 410}}


async def until(check: Callable[[], object], what: str, timeout: float = 5.0) -> None:
    """Poll ``check`` (short steps) until it is true; fail naming ``what``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not check():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for: {what}")
        await asyncio.sleep(0.01)


@pytest.fixture
async def kube() -> AsyncIterator[FakeKubeAPI]:
    api = FakeKubeAPI()
    await api.start()
    yield api
    await api.close()


@pytest.fixture
def kubeconfig(kube: FakeKubeAPI, tmp_path: Path) -> str:
    return str(kube.write_kubeconfig(tmp_path / "kubeconfig"))


class Running:
    """A source's ``run(stop)`` as a task; ``stop()`` sets the event and requires the task to end by itself."""

    def __init__(self, source: APISource | PodAPISource) -> None:
        self.stop_event = asyncio.Event()
        self.task = asyncio.create_task(source.run(self.stop_event))

    async def stop(self) -> None:
        self.stop_event.set()
        try:
            await asyncio.wait_for(asyncio.shield(self.task), timeout=5)
        finally:
            if not self.task.done():
                self.task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self.task


def _version(store: NodeStore, name: str) -> str | None:
    node = store.get(name)
    return node.state_version if node is not None else None


def _available(store: NodeStore, name: str) -> int:
    node = store.get(name)
    assert node is not None, name
    return sum(z.available for z in node.zones)


async def test_nrts_and_node_labels_listed_then_watched(kube: FakeKubeAPI, kubeconfig: str) -> None:
    await kube.put(NRT_PATH, nrt("w-0", BIG, version="1"))
    await kube.put(NRT_PATH, nrt("w-1", SMALL, version="1"))
    await kube.put(NODES_PATH, node_doc("w-0", {"pool": "big", "kubernetes.io/hostname": "w-0"}))
    store = NodeStore()
    run = Running(APISource(store, kubeconfig=kubeconfig, retry_seconds=0.05))
    try:
        await until(lambda: store.synced, "store synced")
        assert store.names() == ["w-0", "w-1"]
        assert _available(store, "w-0") == 55
        await until(lambda: store.labels("w-0").get("pool") == "big", "node labels")
        # the client listed, then watched from the list's version, with the kubeconfig's token
        for path in (NRT_PATH, NODES_PATH):
            await until(lambda p=path: kube.watch_requests(p), f"a watch of {path}")
            first_list, first_watch = kube.list_requests(path)[0], kube.watch_requests(path)[0]
            assert first_list.authorization == "Bearer fake-token"
            assert first_watch.query["resourceVersion"] == "103"
        # ADDED, MODIFIED, DELETED through the watch
        await kube.put(NRT_PATH, nrt("w-2", SMALL, version="1"))
        await until(lambda: store.get("w-2") is not None, "w-2 added")
        await kube.put(NRT_PATH, nrt("w-0", BIG, busy="1-8", version="2"))
        await until(lambda: _version(store, "w-0") == "2", "w-0 modified")
        assert _available(store, "w-0") == 47
        await kube.delete(NRT_PATH, "w-1")
        await until(lambda: store.get("w-1") is None, "w-1 deleted")
        assert store.names() == ["w-0", "w-2"]
        # an NRT the parser refuses is skipped, the others still follow
        await kube.put(NRT_PATH, {**nrt("bad", SMALL), "zones": "not a list"})
        await kube.put(NRT_PATH, nrt("w-3", SMALL))
        await until(lambda: store.get("w-3") is not None, "w-3 after a bad NRT")
        assert store.get("bad") is None
        # node labels: changed, and after the Node goes the NRT's own labels (hostname) answer
        await kube.put(NODES_PATH, node_doc("w-0", {"pool": "fast"}))
        await until(lambda: store.labels("w-0").get("pool") == "fast", "labels modified")
        await kube.delete(NODES_PATH, "w-0")
        await until(lambda: "pool" not in store.labels("w-0"), "labels deleted")
        assert store.labels("w-0")["kubernetes.io/hostname"] == "w-0"
        # the watch is the only traffic: no relist happened
        assert len(kube.list_requests(NRT_PATH)) == 1 and len(kube.list_requests(NODES_PATH)) == 1
    finally:
        await run.stop()
    await until(lambda: kube.open_watches == 0, "watches closed after stop")


async def test_closed_watch_and_gone_are_survived(kube: FakeKubeAPI, kubeconfig: str) -> None:
    await kube.put(NRT_PATH, nrt("w-0", BIG, version="1"))
    await kube.put(NODES_PATH, node_doc("w-0", {"pool": "big"}))
    store = NodeStore()
    run = Running(APISource(store, kubeconfig=kubeconfig, retry_seconds=0.05))
    try:
        await until(lambda: store.synced and len(kube.watch_requests(NRT_PATH)) == 1
                    and len(kube.watch_requests(NODES_PATH)) == 1, "synced and watching")
        # the server ends both watches: the source watches again and sees later changes
        await kube.end_watches()
        await until(lambda: len(kube.watch_requests(NRT_PATH)) == 2 and len(kube.watch_requests(NODES_PATH)) == 2,
                    "watching again")
        await kube.put(NRT_PATH, nrt("w-1", SMALL))
        await kube.put(NODES_PATH, node_doc("w-1", {"pool": "small"}))
        await until(lambda: store.get("w-1") is not None and store.labels("w-1").get("pool") == "small",
                    "changes after the reconnect")
        # 410 Gone on the open watches, and changes the server kept no events of: only a fresh list shows them
        lists = len(kube.list_requests(NRT_PATH)), len(kube.list_requests(NODES_PATH))
        await kube.inject(GONE)
        await kube.delete(NRT_PATH, "w-0", record=False)
        await kube.put(NRT_PATH, nrt("w-4", SMALL), record=False)
        await kube.delete(NODES_PATH, "w-1", record=False)
        await kube.put(NODES_PATH, node_doc("w-4", {"pool": "new"}), record=False)
        await until(lambda: store.names() == ["w-1", "w-4"], "NRTs relisted after 410")
        await until(lambda: store.labels("w-4").get("pool") == "new", "labels relisted after 410")
        await until(lambda: "pool" not in store.labels("w-1"), "labels of a Node gone while not watching dropped")
        assert len(kube.list_requests(NRT_PATH)) > lists[0] and len(kube.list_requests(NODES_PATH)) > lists[1]
        await kube.put(NRT_PATH, nrt("w-5", SMALL))
        await until(lambda: store.get("w-5") is not None, "watching after the relist")
    finally:
        await run.stop()
    await until(lambda: kube.open_watches == 0, "watches closed after stop")


async def test_gone_lists_again_without_the_retry_pause(kube: FakeKubeAPI, kubeconfig: str) -> None:
    """410 Gone is routine (the API server compacted the watch's version away): both sources list again at once,
    not after the pause meant for failures (30 s here; the test waits at most 5)."""
    await kube.put(NRT_PATH, nrt("w-0", SMALL))
    await kube.put(PODS_PATH, _pod("a", "1"))
    store, cache = NodeStore(), PodCache()
    pods = PodAPISource(cache, kubeconfig=kubeconfig, retry_seconds=30)
    runs = [Running(APISource(store, kubeconfig=kubeconfig, retry_seconds=30, watch_nodes=False)), Running(pods)]
    try:
        await until(lambda: store.synced and pods.synced and kube.open_watches == 2, "both watching")
        await kube.inject(GONE)
        await kube.put(NRT_PATH, nrt("w-1", SMALL), record=False)
        await kube.put(PODS_PATH, _pod("b", "1"), record=False)
        await until(lambda: store.get("w-1") is not None and cache.get("default", "b") is not None,
                    "relisted after 410")
    finally:
        for run in runs:
            await run.stop()


async def test_api_source_without_server_retries_until_it_comes(tmp_path: Path) -> None:
    kube = FakeKubeAPI()
    await kube.start()
    config = str(kube.write_kubeconfig(tmp_path / "kubeconfig"))
    port = kube.port
    await kube.close()  # nothing listens on the kubeconfig's address now
    store = NodeStore()
    run = Running(APISource(store, kubeconfig=config, retry_seconds=0.05))
    try:
        await asyncio.sleep(0.2)
        assert not store.synced and not run.task.done()
        kube = FakeKubeAPI()
        await kube.put(NRT_PATH, nrt("w-0", SMALL))
        await kube.start(port)
        await until(lambda: store.synced and store.names() == ["w-0"], "synced once the server is up")
    finally:
        await run.stop()
        await kube.close()


def _pod(name: str, cpus: str, *, namespace: str = "default", node: str | None = None) -> dict:
    return make_pod(name, [container("main", cpus)], namespace=namespace, node_name=node)


async def test_unbound_pods_watched(kube: FakeKubeAPI, kubeconfig: str) -> None:
    await kube.put(PODS_PATH, _pod("pending", "4"))
    await kube.put(PODS_PATH, _pod("running", "2", node="w-0"))
    cache = PodCache()
    source = PodAPISource(cache, kubeconfig=kubeconfig, retry_seconds=0.05)
    run = Running(source)
    try:
        await until(lambda: source.synced, "pod source synced")
        assert cache.get("default", "pending") is not None and cache.get("default", "running") is None
        assert cache.get("default", "pending").info.containers[0].cpu_request_milli == 4000  # type: ignore[union-attr]
        await until(lambda: kube.watch_requests(PODS_PATH), "a pod watch")
        assert kube.list_requests(PODS_PATH)[0].query["fieldSelector"] == "spec.nodeName="
        watch = kube.watch_requests(PODS_PATH)[0]
        assert watch.query["fieldSelector"] == "spec.nodeName=" and watch.query["resourceVersion"] == "102"
        # a new pending pod arrives; binding it (it leaves the selector) and deleting one drop them
        await kube.put(PODS_PATH, _pod("batch", "8", namespace="jobs"))
        await until(lambda: cache.get("jobs", "batch") is not None, "new pending pod")
        await kube.put(PODS_PATH, _pod("batch", "8", namespace="jobs", node="w-1"))
        await until(lambda: cache.get("jobs", "batch") is None, "bound pod dropped")
        await kube.put(PODS_PATH, _pod("other", "1"))
        await kube.delete(PODS_PATH, "pending", "default")
        await until(lambda: cache.get("default", "pending") is None, "deleted pod dropped")
        assert cache.get("default", "other") is not None
        # a changed pending pod is stored again
        await kube.put(PODS_PATH, _pod("other", "3"))
        await until(lambda: cache.get("default", "other").info.containers[0].cpu_request_milli == 3000,  # type: ignore[union-attr]
                    "modified pod")
        # closed watch: watched again
        await kube.end_watches()
        await kube.put(PODS_PATH, _pod("late", "2"))
        await until(lambda: cache.get("default", "late") is not None, "pod after the reconnect")
        # 410 Gone, and changes without events: the relist brings them and drops what left
        await kube.inject(GONE)
        await kube.delete(PODS_PATH, "other", "default", record=False)
        await kube.put(PODS_PATH, _pod("quiet", "2"), record=False)
        await until(lambda: cache.get("default", "quiet") is not None, "pod relisted after 410")
        await until(lambda: cache.get("default", "other") is None, "pod gone while not watching dropped")
    finally:
        await run.stop()
    await until(lambda: kube.open_watches == 0, "pod watch closed after stop")


async def test_webhook_judges_binding_from_api_server_only(kube: FakeKubeAPI, kubeconfig: str, pki: PKI) -> None:
    # NUMA 0 has 10 free CPUs, NUMA 1 12 on "busy"; nothing on disk, everything from the API server
    await kube.put(NRT_PATH, nrt("busy", BIG, reserved="0,28", busy="1-8,29-36,14-21,42-49"))
    await kube.put(NRT_PATH, nrt("empty", BIG, reserved="0,28"))
    await kube.put(NODES_PATH, node_doc("busy", {"pool": "big"}))
    await kube.put(NODES_PATH, node_doc("empty", {"pool": "big"}))
    await kube.put(PODS_PATH, _pod("db", "14"))
    app = WebhookApp(WebhookOptions(cert=pki.cert, key=pki.key, host="127.0.0.1", port=0, kubeconfig=kubeconfig,
                                    cert_poll_seconds=0.05))
    await app.start()
    try:
        async with aiohttp.ClientSession() as session:
            client = Client(app.port, pki, session)  # type: ignore[arg-type]
            await until(lambda: app.nodes.synced and app.pods.get("default", "db") is not None, "webhook synced")
            # ready once the decision paths are warmed up, just after the API sources' first sync
            await until(lambda: app.prepared.is_set(), "webhook warmed up")
            status, _ = await client.get("/readyz")
            assert status == 200
            resp = await client.admit("/validate", binding_request("default", "db", "busy"))
            assert resp["allowed"] is False
            assert "TopologyAffinityError" in resp["status"]["message"] and "default/db" in resp["status"]["message"]
            assert (await client.admit("/validate", binding_request("default", "db", "empty")))["allowed"] is True
            # the node frees CPUs on NUMA 1 (a watch event): the same binding now passes
            await kube.put(NRT_PATH, nrt("busy", BIG, reserved="0,28", busy="1-8,29-36", version="2"))
            await until(lambda: _version(app.nodes, "busy") == "2", "NRT update")
            assert (await client.admit("/validate", binding_request("default", "db", "busy")))["allowed"] is True
    finally:
        await app.stop()
    await until(lambda: kube.open_watches == 0, "webhook's watches closed after stop")


async def test_binding_for_a_pod_not_yet_watched_gets_it_from_the_api(kube: FakeKubeAPI, kubeconfig: str,
                                                                      pki: PKI) -> None:
    """Issue 12.5: the scheduler binds a pod the watch has not delivered yet: the webhook GETs it (within
    --pod-lookup-timeout) and judges it; each way a pod was found is counted."""
    await kube.put(NRT_PATH, nrt("busy", BIG, reserved="0,28", busy="1-8,29-36,14-21,42-49"))
    app = WebhookApp(WebhookOptions(cert=pki.cert, key=pki.key, host="127.0.0.1", port=0, kubeconfig=kubeconfig,
                                    cert_poll_seconds=0.05, pod_lookup_timeout=0.5))

    def lookups(result: str) -> float:
        return app.metrics.registry.get_sample_value("numapin_webhook_pod_lookups_total", {"result": result}) or 0

    await app.start()
    try:
        async with aiohttp.ClientSession() as session:
            client = Client(app.port, pki, session)  # type: ignore[arg-type]
            await until(lambda: app.nodes.synced and any(s.name == "pods-api" and s.synced for s in app.sources
                                                         if hasattr(s, "synced")), "webhook synced")
            # stored without a watch event: only a GET can see it
            await kube.put(PODS_PATH, _pod("late", "14"), record=False)
            resp = await client.admit("/validate", binding_request("default", "late", "busy"))
            assert resp["allowed"] is False and "TopologyAffinityError" in resp["status"]["message"]
            assert [r.path for r in kube.get_requests()] == ["/api/v1/namespaces/default/pods/late"]
            assert lookups("api") == 1
            assert (await client.admit("/validate", binding_request("default", "late", "busy")))["allowed"] is False
            assert lookups("cache") == 1 and len(kube.get_requests()) == 1
            # not found by the API server either: allowed with the warning (the default --unjudged=allow)
            resp = await client.admit("/validate", binding_request("default", "nobody", "busy"))
            assert resp["allowed"] is True and "not found" in resp["warnings"][0] and lookups("not_found") == 1
            # the API server answers too late: not waited for beyond the timeout
            kube.get_delay = 3.0
            await kube.put(PODS_PATH, _pod("slow", "14"), record=False)
            resp = await client.admit("/validate", binding_request("default", "slow", "busy"))
            assert resp["allowed"] is True and "timed out" in resp["warnings"][0] and lookups("failed") == 1
            kube.get_delay = 0.0
    finally:
        await app.stop()
