"""Property-based fuzzing over real TLS: whatever the body or the pod, the webhook answers (never a 5xx), and no
decision raises (the server counts those as internal errors)."""

from __future__ import annotations

import asyncio
import base64
import copy
import http.client
import json
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from allocator.pod import CPU_MANAGER_ANNOTATION
from tests.webhook.helpers import PKI, binding_request, make_pki, pod_request, review
from tests.webhook.nrt_fixtures import write_cluster
from webhook.app import WebhookApp, WebhookOptions


class ThreadedServer:
    """The webhook on its own event loop in a thread, so hypothesis can drive it from a plain test function."""

    def __init__(self, opts: WebhookOptions) -> None:
        self.loop = asyncio.new_event_loop()
        self.app: WebhookApp | None = None
        self.opts = opts
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def __enter__(self) -> ThreadedServer:
        self.thread.start()

        async def start() -> WebhookApp:
            app = WebhookApp(self.opts)
            await app.start()
            return app

        self.app = asyncio.run_coroutine_threadsafe(start(), self.loop).result(30)
        return self

    def __exit__(self, *exc: object) -> None:
        assert self.app is not None
        asyncio.run_coroutine_threadsafe(self.app.stop(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


class SyncClient:
    """Keep-alive HTTPS client (http.client). It cannot set SNI apart from the host it dials, so it checks the
    certificate chain against the CA but not the name (the name check is tested in test_server.py)."""

    def __init__(self, port: int, pki: PKI) -> None:
        self.port = port
        self.ctx = pki.client_context()
        self.ctx.check_hostname = False
        self.conn: http.client.HTTPSConnection | None = None

    def post(self, path: str, data: bytes, content_type: str = "application/json") -> tuple[int, bytes]:
        for attempt in range(2):
            if self.conn is None:
                self.conn = http.client.HTTPSConnection("127.0.0.1", self.port, context=self.ctx, timeout=30)
            try:
                self.conn.request("POST", path, body=data, headers={"Content-Type": content_type})
                r = self.conn.getresponse()
                return r.status, r.read()
            except (http.client.RemoteDisconnected, ConnectionError, BrokenPipeError):
                self.conn.close()
                self.conn = None
                if attempt:
                    raise
        raise AssertionError("unreachable")


@pytest.fixture(scope="module")
def fuzz_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ThreadedServer, SyncClient]]:
    root: Path = tmp_path_factory.mktemp("fuzz")
    (root / "tls").mkdir()
    (root / "nrt").mkdir()
    pki = make_pki(root / "tls")
    write_cluster(root / "nrt")
    opts = WebhookOptions(cert=pki.cert, key=pki.key, host="127.0.0.1", port=0, nrt_dir=root / "nrt",
                          max_body=64 * 1024)
    with ThreadedServer(opts) as srv:
        assert srv.app is not None and srv.app.port is not None
        yield srv, SyncClient(srv.app.port, pki)
        assert srv.app.metrics.internal_error_count() == 0


# JSON has no Infinity (Python writes it, the webhook refuses it with 400: tests/webhook/test_parser_bounds.py)
json_scalars = st.none() | st.booleans() | st.integers(-(2**63), 2**64) | st.floats(
    allow_nan=False, allow_infinity=False) | st.text(max_size=12)
json_values = st.recursive(json_scalars, lambda c: st.lists(c, max_size=4) | st.dictionaries(
    st.text(max_size=8), c, max_size=4), max_leaves=25)

quantities = st.one_of(
    st.sampled_from(["1", "2", "4", "0.5", "1500m", "100m", "0", "1Gi", "64Mi", "2k", "1e3", "-1", "x", "", " 2 ",
                     "9999999999999999999", "1.0000001", "3.5"]),
    st.integers(-5, 64), st.floats(-1, 64, allow_nan=False), st.none(), st.text(max_size=6),
)
resources = st.fixed_dictionaries({}, optional={
    "requests": st.dictionaries(st.sampled_from(["cpu", "memory", "nvidia.com/gpu"]), quantities, max_size=3),
    "limits": st.dictionaries(st.sampled_from(["cpu", "memory", "hugepages-2Mi"]), quantities, max_size=3),
}) | json_values
container_names = st.text(alphabet="abc-", min_size=0, max_size=4) | st.none() | st.integers()
containers = st.fixed_dictionaries({"name": container_names}, optional={
    "resources": resources, "image": st.just("busybox"), "restartPolicy": st.sampled_from(["Always", "Never", 3]),
})
annotations = st.dictionaries(
    st.sampled_from([CPU_MANAGER_ANNOTATION, "numapin.io/cpu-intent", "numapin.io/bypass", "a/b~c", "x"]),
    st.sampled_from(["exclusive", " Share ", "none", "turbo", "", "true", '{"v":1}']) | json_values, max_size=4)
pods = st.fixed_dictionaries({
    "metadata": st.fixed_dictionaries({"name": st.text(alphabet="ab", max_size=3)},
                                      optional={"namespace": st.just("default"), "annotations": annotations,
                                                "uid": st.uuids().map(str)}) | json_values,
    "spec": st.fixed_dictionaries({"containers": st.lists(containers, max_size=3) | json_values}, optional={
        "initContainers": st.lists(containers, max_size=2), "nodeName": st.sampled_from(["w-0", "w-1", "nope", 1]),
        "nodeSelector": st.dictionaries(st.sampled_from(["pool", "x"]), st.sampled_from(["big", "small", "a"])),
    }),
}, optional={"apiVersion": st.just("v1"), "kind": st.just("Pod"), "status": json_values})

FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                       HealthCheck.too_slow])


def _check(status: int, raw: bytes, uid: str | None = None) -> dict[str, Any] | None:
    assert status < 500, raw
    assert status in (200, 400, 413, 415), (status, raw)
    if status != 200:
        assert raw.strip(), "an error answer carries a message"
        return None
    body = json.loads(raw)
    resp = body["response"]
    if uid is not None:
        assert resp["uid"] == uid
    assert isinstance(resp["allowed"], bool)
    if not resp["allowed"]:
        assert resp["status"]["message"]
    return resp


@FUZZ
@given(body=st.binary(max_size=300) | json_values.map(lambda v: json.dumps(v).encode()),
       path=st.sampled_from(["/mutate", "/validate"]),
       ctype=st.sampled_from(["application/json", "application/json; charset=utf-8", "text/plain", ""]))
def test_arbitrary_bodies(fuzz_server: tuple[ThreadedServer, SyncClient], body: bytes, path: str,
                          ctype: str) -> None:
    _, c = fuzz_server
    _check(*c.post(path, body, ctype))


@FUZZ
@given(request=st.dictionaries(st.sampled_from(["uid", "operation", "resource", "subResource", "object",
                                                "oldObject", "namespace", "name", "dryRun", "kind"]),
                               json_values, max_size=8),
       version=st.sampled_from(["admission.k8s.io/v1", "admission.k8s.io/v1beta1", "v1", None]),
       path=st.sampled_from(["/mutate", "/validate"]))
def test_arbitrary_review_envelopes(fuzz_server: tuple[ThreadedServer, SyncClient], request: dict[str, Any],
                                    version: str | None, path: str) -> None:
    _, c = fuzz_server
    data = json.dumps({"apiVersion": version, "kind": "AdmissionReview", "request": request}).encode()
    _check(*c.post(path, data))


@FUZZ
@given(pod=pods, operation=st.sampled_from(["CREATE", "UPDATE"]), old=st.none() | pods, dry_run=st.booleans(),
       version=st.sampled_from(["admission.k8s.io/v1", "admission.k8s.io/v1beta1"]))
def test_arbitrary_pods(fuzz_server: tuple[ThreadedServer, SyncClient], pod: Any, operation: str, old: Any,
                        dry_run: bool, version: str) -> None:
    _, c = fuzz_server
    req = pod_request({"metadata": {}}, operation=operation, dry_run=dry_run)
    req["object"], req["oldObject"] = pod, old
    for path in ("/mutate", "/validate"):
        resp = _check(*c.post(path, json.dumps(review(req, version)).encode()), uid=req["uid"])
        assert resp is not None
        if path == "/mutate" and "patch" in resp:
            ops = json.loads(base64.b64decode(resp["patch"]))
            jsonpatch.JsonPatch(ops).apply(copy.deepcopy(pod))  # applies cleanly


@FUZZ
@given(pod=pods, node=st.sampled_from(["w-0", "w-1", "w-2", "nope", ""]), ns=st.sampled_from(["default", "x"]))
def test_arbitrary_bindings(fuzz_server: tuple[ThreadedServer, SyncClient], pod: Any, node: str, ns: str) -> None:
    _, c = fuzz_server
    name = f"fz-{uuid.uuid4().hex[:8]}"
    if isinstance(pod.get("metadata"), dict):
        pod["metadata"].update(name=name, namespace=ns)
    create = pod_request({"metadata": {}}, with_uid=False)
    create["object"], create["namespace"], create["name"] = pod, ns, name
    _check(*c.post("/validate", json.dumps(review(create)).encode()), uid=create["uid"])
    req = binding_request(ns, name, node)
    _check(*c.post("/validate", json.dumps(review(req)).encode()), uid=req["uid"])


cpu_amounts = st.sampled_from(["1", "2", "3", "4", "8", "13", "16", "26", "27", "28", "29", "30", "56", "500m",
                               "1500m", "2000m"])
well_formed_containers = st.builds(
    lambda name, cpu, burstable, mem: {
        "name": name, "image": "busybox",
        "resources": {"requests": {"cpu": cpu, "memory": mem},
                      "limits": {"cpu": "64" if burstable else cpu, "memory": mem}}},
    st.text(alphabet="abcdefgh", min_size=1, max_size=3), cpu_amounts,
    st.sampled_from([False, False, False, True]), st.sampled_from(["64Mi", "1Gi"]))


@st.composite
def well_formed_pods(draw: st.DrawFn) -> dict[str, Any]:
    apps = draw(st.lists(well_formed_containers, min_size=1, max_size=4, unique_by=lambda c: c["name"]))
    inits = draw(st.lists(well_formed_containers, max_size=2, unique_by=lambda c: c["name"]))
    inits = [dict(c, name="i" + c["name"]) for c in inits]
    for c in inits:
        if draw(st.booleans()):
            c["restartPolicy"] = "Always"
    ann = draw(st.dictionaries(st.just(CPU_MANAGER_ANNOTATION), st.sampled_from(["exclusive", "share", "none"]),
                               max_size=1))
    spec: dict[str, Any] = {"containers": apps}
    if inits:
        spec["initContainers"] = inits
    placement = draw(st.sampled_from(["any", "nodeName", "selector"]))
    if placement == "nodeName":
        spec["nodeName"] = draw(st.sampled_from(["w-0", "w-1", "w-2"]))
    elif placement == "selector":
        spec["nodeSelector"] = {"pool": draw(st.sampled_from(["big", "small"]))}
    return {"apiVersion": "v1", "kind": "Pod", "spec": spec,
            "metadata": {"name": f"wf-{uuid.uuid4().hex[:10]}", "namespace": "default", "annotations": ann}}


@FUZZ
@given(pod=well_formed_pods(), node=st.sampled_from(["w-0", "w-1", "w-2"]))
def test_well_formed_pods_through_mutate_validate_and_bind(fuzz_server: tuple[ThreadedServer, SyncClient],
                                                          pod: dict[str, Any], node: str) -> None:
    """Pods the topology managers really have to judge (whole CPUs, Crane modes, init containers, sidecars)."""
    _, c = fuzz_server
    req = pod_request(copy.deepcopy(pod))
    resp = _check(*c.post("/mutate", json.dumps(review(req)).encode()), uid=req["uid"])
    assert resp is not None and resp["allowed"] is True
    mutated = jsonpatch.JsonPatch(json.loads(base64.b64decode(resp["patch"]))).apply(copy.deepcopy(pod))
    req = pod_request(mutated, with_uid=True)
    resp = _check(*c.post("/validate", json.dumps(review(req)).encode()), uid=req["uid"])
    assert resp is not None
    if not resp["allowed"]:
        event("pod denied")
        assert "no known node can ever admit" in resp["status"]["message"]
        return
    meta = mutated["metadata"]
    req = binding_request(meta["namespace"], meta["name"], node)
    resp = _check(*c.post("/validate", json.dumps(review(req)).encode()), uid=req["uid"])
    assert resp is not None
    event(f"binding {'allowed' if resp['allowed'] else 'denied'}")
    if not resp["allowed"]:
        assert f"node {node} would reject pod default/{meta['name']}" in resp["status"]["message"]
