"""/validate for pods/binding: the Binding carries no pod; the webhook judges it with its pod cache and the target
node's NodeResourceTopology, simulating that node's topology manager with its free CPUs."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import pytest
import yaml

from tests.webhook.helpers import PKI, Client, apply_patch, binding_request, container, make_pod, pod_request
from tests.webhook.nrt_fixtures import machine, nrt, write_docs
from webhook.app import WebhookApp, WebhookOptions

BIG = machine(2, 14)  # 2 NUMA nodes x 28 CPUs; NUMA 0 = cores 0-13 (cpus 0-13, 28-41), NUMA 1 = cores 14-27


@pytest.fixture
async def nodes(server: WebhookApp, nrt_dir: Path) -> WebhookApp:
    write_docs(nrt_dir / "empty.yaml", [nrt("empty", BIG, reserved="0,28")])
    # NUMA 0: 26 allocatable, 16 busy -> 10 free; NUMA 1: 16 busy -> 12 free
    write_docs(nrt_dir / "busy.yaml", [nrt("busy", BIG, reserved="0,28", busy="1-8,29-36,14-21,42-49")])
    write_docs(nrt_dir / "loose.yaml", [nrt("loose", BIG, policy="best-effort", reserved="0,28",
                                            busy="1-8,29-36,14-21,42-49")])
    for s in server.sources:
        await s.sync()
    return server


Create = Callable[[dict], Awaitable[dict]]


@pytest.fixture
def create(client: Client, pods_dir: Path) -> Create:
    """What kube-apiserver does before the scheduler binds: mutate, validate, then store the pod (here: in the
    webhook's --pods-dir, which it reads again on a cache miss, as it GETs a pod from the API server)."""
    async def _create(pod: dict) -> dict:
        pod = apply_patch(copy.deepcopy(pod), await client.admit("/mutate", pod_request(copy.deepcopy(pod))))
        req = pod_request(pod, with_uid=True)
        assert (await client.admit("/validate", req))["allowed"] is True
        meta = req["object"]["metadata"]
        (pods_dir / f"{meta['namespace']}-{meta['name']}.yaml").write_text(yaml.safe_dump(req["object"]))
        return req["object"]

    return _create


async def test_binding_the_node_would_reject_is_denied(nodes: WebhookApp, client: Client, create: Create) -> None:
    pod = await create(make_pod("db", [container("db", "12"), container("log", "100m")]))
    uid = pod["metadata"]["uid"]
    resp = await client.admit("/validate", binding_request("default", "db", "busy", pod_uid=uid))
    assert resp["allowed"] is True  # NUMA 1 has 12 free
    pod = await create(make_pod("db2", [container("db", "14")]))
    resp = await client.admit("/validate", binding_request("default", "db2", "busy"))
    assert resp["allowed"] is False
    msg = resp["status"]["message"]
    assert "busy" in msg and "TopologyAffinityError" in msg and "default/db2" in msg
    assert "node-0=10" in msg and "node-1=12" in msg and "single-numa-node" in msg
    # the same pod fits the empty node, and the best-effort node admits whatever it can place
    assert (await client.admit("/validate", binding_request("default", "db2", "empty")))["allowed"] is True
    assert (await client.admit("/validate", binding_request("default", "db2", "loose")))["allowed"] is True


async def test_node_freeing_cpus_lets_the_binding_through(nodes: WebhookApp, client: Client, create: Create,
                                                          nrt_dir: Path) -> None:
    await create(make_pod("web", [container("web", "16")]))
    assert (await client.admit("/validate", binding_request("default", "web", "busy")))["allowed"] is False
    # the proxy publishes the node again after pods on NUMA 1 ended
    write_docs(nrt_dir / "busy.yaml", [nrt("busy", BIG, reserved="0,28", busy="1-8,29-36")])
    for _ in range(200):
        if (await client.admit("/validate", binding_request("default", "web", "busy")))["allowed"]:
            break
        await asyncio.sleep(0.02)
    else:
        raise AssertionError("binding still denied after the node freed CPUs")


async def test_pods_from_the_directory_source(nodes: WebhookApp, client: Client, pods_dir: Path) -> None:
    pod = make_pod("batch", [container("w", "20")], namespace="jobs")
    (pods_dir / "batch.yaml").write_text(yaml.safe_dump(pod))
    for s in nodes.sources:
        await s.sync()
    resp = await client.admit("/validate", binding_request("jobs", "batch", "busy"), "admission.k8s.io/v1beta1")
    assert resp["allowed"] is False and "TopologyAffinityError" in resp["status"]["message"]


def _lookups(app: WebhookApp, result: str) -> float:
    return app.metrics.registry.get_sample_value("numapin_webhook_pod_lookups_total", {"result": result}) or 0.0


def _unjudged(app: WebhookApp, reason: str, action: str = "allow") -> float:
    return app.metrics.registry.get_sample_value(
        "numapin_webhook_unjudged_total", {"endpoint": "validate", "reason": reason, "action": action}) or 0.0


async def test_what_cannot_be_judged_is_allowed_with_a_warning(nodes: WebhookApp, client: Client,
                                                              create: Create) -> None:
    resp = await client.admit("/validate", binding_request("default", "never-seen", "busy"))
    assert resp["allowed"] is True
    assert "default/never-seen" in resp["warnings"][0] and "not found" in resp["warnings"][0]
    assert "--unjudged=allow" in resp["warnings"][0]
    assert _unjudged(nodes, "pod_unknown") == 1 and _lookups(nodes, "not_found") == 1
    await create(make_pod("x", [container("c", "20")]))
    resp = await client.admit("/validate", binding_request("default", "x", "no-nrt"))
    assert resp["allowed"] is True and "no NodeResourceTopology" in resp["warnings"][0]
    assert _unjudged(nodes, "node_unknown") == 1
    # a pod on the shared pool is never refused
    await create(make_pod("burst", [container("c", "20", cpu_limit="40")]))
    assert (await client.admit("/validate", binding_request("default", "burst", "busy")))["allowed"] is True
    # dry-run creates are never stored by the API server, and the webhook remembers nothing from admissions
    pod = apply_patch(make_pod("dry", [container("c", "20")]),
                      await client.admit("/mutate", pod_request(make_pod("dry", [container("c", "20")]))))
    assert (await client.admit("/validate", pod_request(pod, with_uid=True, dry_run=True)))["allowed"] is True
    resp = await client.admit("/validate", binding_request("default", "dry", "busy"))
    assert resp["allowed"] is True and "not found" in resp["warnings"][0]


async def test_pod_missing_from_the_cache_is_read_again_and_judged(pki: PKI, nrt_dir: Path, pods_dir: Path) -> None:
    """The scheduler binds before the pod source has delivered the pod: the webhook reads it again (issue 12.5).
    Its own webhook, whose directories are polled once an hour: with the shared fixture's 50 ms poll, a poll
    landing during the binding's request (under load) delivered the pod first and the read never happened."""
    write_docs(nrt_dir / "busy.yaml", [nrt("busy", BIG, reserved="0,28", busy="1-8,29-36,14-21,42-49")])
    app = WebhookApp(WebhookOptions(cert=pki.cert, key=pki.key, host="127.0.0.1", port=0, nrt_dir=nrt_dir,
                                    pods_dir=pods_dir, nrt_poll_seconds=3600))
    await app.start()
    try:
        async with aiohttp.ClientSession() as session:
            client = Client(app.port, pki, session)  # type: ignore[arg-type]
            pod = make_pod("fast", [container("c", "20")])
            pod = apply_patch(copy.deepcopy(pod), await client.admit("/mutate", pod_request(copy.deepcopy(pod))))
            req = pod_request(pod, with_uid=True)
            assert (await client.admit("/validate", req))["allowed"] is True
            (pods_dir / "default-fast.yaml").write_text(yaml.safe_dump(req["object"]))
            assert app.pods.get("default", "fast") is None  # no poll of the directory since
            resp = await client.admit("/validate", binding_request("default", "fast", "busy"))
            assert resp["allowed"] is False and "TopologyAffinityError" in resp["status"]["message"]
            assert _lookups(app, "directory") == 1
            assert (await client.admit("/validate", binding_request("default", "fast", "busy")))["allowed"] is False
            assert _lookups(app, "cache") == 1
    finally:
        await app.stop()


async def test_forged_admission_review_does_not_change_the_cached_pod(nodes: WebhookApp, client: Client,
                                                                     create: Create) -> None:
    """Issue 15.6: a CREATE review carrying a real pod's name and uid with 30 CPUs must not replace the pod the
    webhook judges that pod's binding with."""
    real = await create(make_pod("db", [container("db", "12")]))
    assert (await client.admit("/validate", binding_request("default", "db", "busy")))["allowed"] is True
    forged = make_pod("db", [container("db", "30")])
    forged["metadata"]["uid"] = real["metadata"]["uid"]
    for path in ("/mutate", "/validate"):
        await client.admit(path, pod_request(copy.deepcopy(forged)))
    cached = nodes.pods.get("default", "db")
    assert cached is not None and cached.info.containers[0].cpu_limit_milli == 12000
    resp = await client.admit("/validate", binding_request("default", "db", "busy",
                                                           pod_uid=real["metadata"]["uid"]))
    assert resp["allowed"] is True


async def test_unjudged_deny_refuses_what_cannot_be_judged(pki: PKI, nrt_dir: Path, pods_dir: Path) -> None:
    write_docs(nrt_dir / "busy.yaml", [nrt("busy", BIG, reserved="0,28", busy="1-8,29-36,14-21,42-49")])
    (pods_dir / "p.yaml").write_text(yaml.safe_dump(make_pod("p", [container("c", "4")])))
    app = WebhookApp(WebhookOptions(cert=pki.cert, key=pki.key, host="127.0.0.1", port=0, nrt_dir=nrt_dir,
                                      pods_dir=pods_dir, unjudged="deny"))
    await app.start()
    try:
        async with aiohttp.ClientSession() as session:
            client = Client(app.port, pki, session)  # type: ignore[arg-type]
            resp = await client.admit("/validate", binding_request("default", "ghost", "busy"))
            assert resp["allowed"] is False and resp["status"]["code"] == 403
            assert "default/ghost" in resp["status"]["message"] and "--unjudged=deny" in resp["status"]["message"]
            resp = await client.admit("/validate", binding_request("default", "p", "no-such-node"))
            assert resp["allowed"] is False and "no NodeResourceTopology" in resp["status"]["message"]
            assert (await client.admit("/validate", binding_request("default", "p", "busy")))["allowed"] is True
            # a pod whose spec numapin cannot read is not judged either: denied by the same rule
            odd = make_pod("odd", [container("c", "1" * 100)])
            resp = await client.admit("/validate", pod_request(odd, with_uid=True))
            assert resp["allowed"] is False and "at most 64 characters" in resp["status"]["message"]
            assert _unjudged(app, "pod_unknown", "deny") == 1 and _unjudged(app, "node_unknown", "deny") == 1
            assert _unjudged(app, "pod_unreadable", "deny") == 1
    finally:
        await app.stop()


async def test_pods_just_bound_count_until_the_node_publishes_again(nodes: WebhookApp, client: Client, create: Create,
                                                                   nrt_dir: Path) -> None:
    """The scheduler binds three 16-CPU pods to an empty node in a row: NUMA 0 (26 allocatable) and NUMA 1 (28)
    take one each; the third would be rejected by the node, so its binding is denied before the node publishes."""
    for name in ("r1", "r2", "r3"):
        await create(make_pod(name, [container("c", "16")]))
    assert (await client.admit("/validate", binding_request("default", "r1", "empty")))["allowed"] is True
    # the same pod judged again is not counted twice
    assert (await client.admit("/validate", binding_request("default", "r1", "empty")))["allowed"] is True
    assert (await client.admit("/validate", binding_request("default", "r2", "empty")))["allowed"] is True
    resp = await client.admit("/validate", binding_request("default", "r3", "empty"))
    assert resp["allowed"] is False
    assert "counting 2 pod(s) just bound" in resp["status"]["message"]
    assert sorted({p.pod for p in nodes.binding_validator.pending("empty")}) == [("default", "r1"), ("default", "r2")]
    # the node publishes its topology with r1 and r2 running: the pending pods are dropped, the answer is the same
    write_docs(nrt_dir / "empty.yaml", [nrt("empty", BIG, reserved="0,28", busy="1-8,29-36,14-21,42-49")])
    for s in nodes.sources:
        await s.sync()
    resp = await client.admit("/validate", binding_request("default", "r3", "empty"))
    assert resp["allowed"] is False and "just bound" not in resp["status"]["message"]
    assert nodes.binding_validator.pending("empty") == []


async def test_pod_bound_started_and_ended_between_two_bindings_is_not_counted(
        nodes: WebhookApp, client: Client, create: Create, nrt_dir: Path) -> None:
    """A pod is bound, runs and ends with no binding judged in between: the node's free CPUs are back to what they
    were at the binding, but its state version moved on, so the pod no longer counts as just bound."""
    write_docs(nrt_dir / "empty.yaml", [nrt("empty", BIG, reserved="0,28", version="a-1")])
    for s in nodes.sources:
        await s.sync()
    for name in ("r1", "r2", "r3"):
        await create(make_pod(name, [container("c", "16")]))
    assert (await client.admit("/validate", binding_request("default", "r1", "empty")))["allowed"] is True
    assert (await client.admit("/validate", binding_request("default", "r2", "empty")))["allowed"] is True
    # r1 and r2 ran and ended: the same free CPUs as at their bindings, published under a newer version
    write_docs(nrt_dir / "empty.yaml", [nrt("empty", BIG, reserved="0,28", version="a-3")])
    for s in nodes.sources:
        await s.sync()
    resp = await client.admit("/validate", binding_request("default", "r3", "empty"))
    assert resp["allowed"] is True, resp
    # without a version change, the same counts still mean the pods just bound have not started yet
    assert (await client.admit("/validate", binding_request("default", "r1", "empty")))["allowed"] is True
    resp = await client.admit("/validate", binding_request("default", "r2", "empty"))
    assert resp["allowed"] is False and "counting 2 pod(s) just bound" in resp["status"]["message"]


@pytest.mark.parametrize("binding_name", ["", None])
async def test_denial_names_the_pod_when_the_binding_metadata_has_no_name(
        nodes: WebhookApp, client: Client, create: Create, binding_name: str | None) -> None:
    """kube-apiserver sends the pod's name as the request's ``name`` (from ``pods/<name>/binding``); the Binding's
    own metadata.name may be empty or absent. The pod is found and the denial names it."""
    await create(make_pod("db3", [container("db", "14")]))
    req = binding_request("default", "db3", "busy")
    if binding_name is None:
        del req["object"]["metadata"]["name"]
    else:
        req["object"]["metadata"]["name"] = binding_name
    resp = await client.admit("/validate", req)
    assert resp["allowed"] is False
    msg = resp["status"]["message"]
    assert "pod default/db3 " in msg and "default/;" not in msg and "default/ " not in msg
    assert "TopologyAffinityError" in msg
