"""/validate for pods CREATE/UPDATE over real TLS, against NodeResourceTopology documents in a directory."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from allocator.intent import INTENT_ANNOTATION
from allocator.pod import CPU_MANAGER_ANNOTATION
from tests.webhook.helpers import Client, apply_patch, container, make_pod, pod_request
from tests.webhook.nrt_fixtures import write_cluster
from webhook.app import WebhookApp


@pytest.fixture
async def cluster(server: WebhookApp, nrt_dir: Path) -> WebhookApp:
    write_cluster(nrt_dir)
    for s in server.sources:
        await s.sync()
    assert len(server.nodes) == 3
    return server


async def _mutated(client: Client, pod: dict) -> dict:
    resp = await client.admit("/mutate", pod_request(copy.deepcopy(pod)))
    return apply_patch(copy.deepcopy(pod), resp)


async def test_bad_cpu_manager_value_denied_with_the_allowed_values(client: Client) -> None:
    pod = make_pod("p", [container("c", "2")], annotations={CPU_MANAGER_ANNOTATION: "turbo"})
    resp = await client.admit("/validate", pod_request(pod, with_uid=True))
    assert resp["allowed"] is False
    status = resp["status"]
    # kube-apiserver's own shape of a validation error, which kubectl prints as `The Pod "p" is invalid: ...`
    assert (status["code"], status["reason"], status["status"]) == (422, "Invalid", "Failure")
    assert status["details"] == {"kind": "Pod", "name": "p", "causes": [{
        "reason": "FieldValueNotSupported", "field": f"metadata.annotations[{CPU_MANAGER_ANNOTATION}]",
        "message": 'Unsupported value: "turbo": supported values: "none", "exclusive", "share" (numapin)'}]}
    assert status["message"] == f'Pod "p" is invalid: metadata.annotations[{CPU_MANAGER_ANNOTATION}]: ' + \
        status["details"]["causes"][0]["message"]


async def test_update_denies_only_a_new_bad_value(client: Client) -> None:
    old = make_pod("p", [container("c", "2")], annotations={CPU_MANAGER_ANNOTATION: "turbo"})
    new = copy.deepcopy(old)
    new["metadata"]["labels"]["x"] = "y"
    resp = await client.admit("/validate", pod_request(new, operation="UPDATE", old=old))
    assert resp["allowed"] is True  # a pod created before numapin can still be updated
    good = make_pod("p", [container("c", "2")], annotations={CPU_MANAGER_ANNOTATION: "share"})
    bad = copy.deepcopy(good)
    bad["metadata"]["annotations"][CPU_MANAGER_ANNOTATION] = "Sharing"
    resp = await client.admit("/validate", pod_request(bad, operation="UPDATE", old=good))
    assert resp["allowed"] is False and '"none", "exclusive", "share"' in resp["status"]["message"]


async def test_exclusive_without_eligible_container_warns(client: Client) -> None:
    pod = make_pod("p", [container("a", "500m"), container("b", "2", cpu_limit="3")],
                   annotations={CPU_MANAGER_ANNOTATION: "exclusive"})
    resp = await client.admit("/validate", pod_request(await _mutated(client, pod), with_uid=True))
    assert resp["allowed"] is True
    assert any("no effect" in w and "exclusive" in w for w in resp["warnings"])


async def test_intent_must_match_the_pod(client: Client) -> None:
    pod = await _mutated(client, make_pod("p", [container("c", "2")]))
    assert (await client.admit("/validate", pod_request(copy.deepcopy(pod), with_uid=True)))["allowed"] is True
    forged = copy.deepcopy(pod)
    forged["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "100m"}}
    resp = await client.admit("/validate", pod_request(forged, with_uid=True))
    assert resp["allowed"] is False and INTENT_ANNOTATION in resp["status"]["message"]
    changed = copy.deepcopy(pod)
    changed["metadata"]["annotations"][INTENT_ANNOTATION] = changed["metadata"]["annotations"][
        INTENT_ANNOTATION].replace("2000", "4000")
    resp = await client.admit("/validate", pod_request(changed, operation="UPDATE", old=pod))
    assert resp["allowed"] is False and "does not match" in resp["status"]["message"]
    removed = copy.deepcopy(pod)
    del removed["metadata"]["annotations"][INTENT_ANNOTATION]
    resp = await client.admit("/validate", pod_request(removed, operation="UPDATE", old=pod))
    assert resp["allowed"] is False and "cannot be removed" in resp["status"]["message"]


async def _annotated(client: Client, running: dict, mode: str | None) -> dict:
    """``kubectl annotate`` of a running pod, through /mutate as kube-apiserver does."""
    changed = copy.deepcopy(running)
    if mode is None:
        del changed["metadata"]["annotations"][CPU_MANAGER_ANNOTATION]
    else:
        changed["metadata"]["annotations"][CPU_MANAGER_ANNOTATION] = mode
    resp = await client.admit("/mutate", pod_request(copy.deepcopy(changed), operation="UPDATE", old=running))
    return apply_patch(changed, resp)


async def test_a_valid_change_of_mode_is_allowed(cluster: WebhookApp, client: Client) -> None:
    running = await _mutated(client, make_pod("db", [container("c", "4")], node_name="w-0",
                                              annotations={CPU_MANAGER_ANNOTATION: "exclusive"}))
    for mode in ("share", "none", None, "exclusive"):
        changed = await _annotated(client, running, mode)
        resp = await client.admit("/validate", pod_request(changed, operation="UPDATE", old=running))
        assert resp["allowed"] is True, (mode, resp)
        running = changed
    # still denied: a bad value, and a hand-made intent that says something else
    bad = copy.deepcopy(running)
    bad["metadata"]["annotations"][CPU_MANAGER_ANNOTATION] = "turbo"
    resp = await client.admit("/validate", pod_request(bad, operation="UPDATE", old=running))
    assert resp["allowed"] is False and '"none", "exclusive", "share"' in resp["status"]["message"]
    forged = copy.deepcopy(running)
    forged["metadata"]["annotations"][CPU_MANAGER_ANNOTATION] = "share"  # not stamped again: says exclusive
    resp = await client.admit("/validate", pod_request(forged, operation="UPDATE", old=running))
    assert resp["allowed"] is False and INTENT_ANNOTATION in resp["status"]["message"]


async def test_a_change_the_node_can_never_satisfy_is_denied(cluster: WebhookApp, client: Client) -> None:
    # w-0: single-numa-node, the largest NUMA node has 28 allocatable CPUs; 30 CPUs run on the shared pool today
    running = await _mutated(client, make_pod("big", [container("c", "30", "4Gi")], node_name="w-0",
                                              annotations={CPU_MANAGER_ANNOTATION: "none"}))
    changed = await _annotated(client, running, "exclusive")
    resp = await client.admit("/validate", pod_request(changed, operation="UPDATE", old=running))
    assert resp["allowed"] is False
    msg = resp["status"]["message"]
    assert "w-0" in msg and "single-numa-node" in msg and "none -> exclusive" in msg and "never" in msg
    assert "28 allocatable" in msg and "TopologyAffinityError" in msg
    # on the best-effort node the same change is fine
    elsewhere = copy.deepcopy(running)
    elsewhere["spec"]["nodeName"] = "w-1"
    moved = await _annotated(client, elsewhere, "exclusive")
    assert (await client.admit("/validate", pod_request(moved, operation="UPDATE", old=elsewhere)))["allowed"]
    # a pod not bound yet, or bound to a node without a published topology, is not judged
    unknown = copy.deepcopy(running)
    unknown["spec"]["nodeName"] = "w-9"
    moved = await _annotated(client, unknown, "exclusive")
    assert (await client.admit("/validate", pod_request(moved, operation="UPDATE", old=unknown)))["allowed"]


async def test_a_change_the_node_cannot_satisfy_now_warns(cluster: WebhookApp, client: Client) -> None:
    # w-2: 4 NUMA x 8 CPUs, restricted + full-pcpus-only, 27 free now, 30 allocatable when empty
    running = await _mutated(client, make_pod("wide", [container("c", "28")], node_name="w-2",
                                              annotations={CPU_MANAGER_ANNOTATION: "none"}))
    changed = await _annotated(client, running, "share")
    resp = await client.admit("/validate", pod_request(changed, operation="UPDATE", old=running))
    assert resp["allowed"] is True
    assert any("w-2" in w and "right now" in w and "keeps running as it was" in w for w in resp["warnings"])


async def test_pod_no_node_could_ever_admit_is_denied(cluster: WebhookApp, client: Client) -> None:
    pod = await _mutated(client, make_pod("huge", [container("small", "2"), container("big", "30", "4Gi")],
                                          node_name="w-0"))
    resp = await client.admit("/validate", pod_request(pod, with_uid=True))
    assert resp["allowed"] is False
    msg = resp["status"]["message"]
    assert "single-numa-node" in msg and '"big"' in msg and "30" in msg
    assert "node-1" in msg and "28 allocatable" in msg and "w-0" in msg
    # the same pod may go to the best-effort node: allowed
    anywhere = copy.deepcopy(pod)
    del anywhere["spec"]["nodeName"]
    assert (await client.admit("/validate", pod_request(anywhere, with_uid=True)))["allowed"] is True


async def test_pod_scope_names_the_pod_total(cluster: WebhookApp, client: Client, nrt_dir: Path) -> None:
    from tests.webhook.nrt_fixtures import machine, nrt, write_docs

    write_docs(nrt_dir / "p-0.yaml", [nrt("p-0", machine(2, 8), scope="pod", reserved="0,16")])
    for s in cluster.sources:
        await s.sync()
    pod = await _mutated(client, make_pod("pair", [container("a", "9"), container("b", "9")], node_name="p-0"))
    resp = await client.admit("/validate", pod_request(pod, with_uid=True))
    assert resp["allowed"] is False
    msg = resp["status"]["message"]
    assert "scope pod" in msg and "18 CPUs of its own in total" in msg and '"a", "b"' in msg


async def test_pod_no_node_can_admit_now_is_allowed_with_a_warning(cluster: WebhookApp, client: Client) -> None:
    # w-2: 4 NUMA nodes x 8 CPUs, restricted, full-pcpus-only; 30 allocatable when empty, 27 free now
    pod = await _mutated(client, make_pod("wide", [container("c", "28")], node_selector={"pool": "small"}))
    resp = await client.admit("/validate", pod_request(pod, with_uid=True))
    assert resp["allowed"] is True
    assert any("right now" in w for w in resp["warnings"])


async def test_node_selector_and_unknown_nodes(cluster: WebhookApp, client: Client) -> None:
    pod = await _mutated(client, make_pod("p", [container("c", "30")], node_selector={"pool": "nowhere"}))
    assert (await client.admit("/validate", pod_request(pod, with_uid=True)))["allowed"] is True  # nothing known
    fits = await _mutated(client, make_pod("q", [container("c", "24")], node_selector={"pool": "big"}))
    resp = await client.admit("/validate", pod_request(fits, with_uid=True))
    assert resp["allowed"] is True and "warnings" not in resp


async def test_shared_pool_pods_are_not_simulated(cluster: WebhookApp, client: Client) -> None:
    pod = await _mutated(client, make_pod("burst", [container("c", "60", cpu_limit="64")], node_name="w-0"))
    before = cluster.simulator.simulations
    resp = await client.admit("/validate", pod_request(pod, with_uid=True))
    assert resp["allowed"] is True
    assert cluster.simulator.simulations == before


async def test_v1beta1_denial_in_kind(cluster: WebhookApp, client: Client) -> None:
    pod = await _mutated(client, make_pod("huge", [container("big", "30")], node_name="w-0"))
    resp = await client.admit("/validate", pod_request(pod, with_uid=True), api_version="admission.k8s.io/v1beta1")
    assert resp["allowed"] is False


async def test_concurrent_validations_share_the_simulator(cluster: WebhookApp, client: Client) -> None:
    import asyncio

    pods = [await _mutated(client, make_pod(f"c{i}", [container("c", str(1 + i % 30))])) for i in range(40)]
    answers = await asyncio.gather(*(client.admit("/validate", pod_request(p, with_uid=True)) for p in pods))
    assert all(a["allowed"] for a in answers)  # w-1 (best-effort) admits any of them
    assert cluster.metrics.internal_error_count() == 0


# -- pods/resize ----------------------------------------------------------------------------------------------


def _resize_request(running: dict, cpu: str, container_name: str = "c") -> dict:
    """kube-apiserver's review of ``kubectl patch pod --subresource resize``: the whole pod before and after, only the
    container's resources changed (the annotations, intent included, are the old pod's)."""
    resized = copy.deepcopy(running)
    for c in resized["spec"]["containers"]:
        if c["name"] == container_name:
            c["resources"]["requests"]["cpu"] = cpu
            c["resources"]["limits"]["cpu"] = cpu
    req = pod_request(resized, operation="UPDATE", old=running)
    req["subResource"] = "resize"
    return req


async def test_a_resize_the_node_can_never_satisfy_is_denied(cluster: WebhookApp, client: Client) -> None:
    # w-0: single-numa-node, the largest NUMA node has 28 allocatable CPUs
    running = await _mutated(client, make_pod("db", [container("c", "4")], node_name="w-0"))
    resp = await client.admit("/validate", _resize_request(running, "30"))
    assert resp["allowed"] is False
    msg = resp["status"]["message"]
    assert "resize" in msg and "never" in msg and "w-0" in msg and "single-numa-node" in msg
    assert 'container "c" 4 CPU(s) of its own -> 30 CPU(s) of its own (CPU 4000m -> 30000m)' in msg
    assert "28 allocatable" in msg and "TopologyAffinityError" in msg
    # a size the node can satisfy, a shrink, a move to the shared pool: allowed without a word
    for cpu in ("8", "2", "1500m"):
        resp = await client.admit("/validate", _resize_request(running, cpu))
        assert resp["allowed"] is True and not resp.get("warnings"), (cpu, resp)
    # on the best-effort node the same growth is fine; on a node without a published topology it is not judged
    for node in ("w-1", "w-9"):
        elsewhere = copy.deepcopy(running)
        elsewhere["spec"]["nodeName"] = node
        assert (await client.admit("/validate", _resize_request(elsewhere, "30")))["allowed"] is True


async def test_a_resize_the_node_cannot_satisfy_now_warns(cluster: WebhookApp, client: Client) -> None:
    # w-2: 4 NUMA x 8 CPUs, restricted + full-pcpus-only; CPUs 1-3 busy, 0 and 16 reserved: 27 free
    running = await _mutated(client, make_pod("db", [container("c", "2")], node_name="w-2"))
    resp = await client.admit("/validate", _resize_request(running, "3"))
    assert resp["allowed"] is False and "SMTAlignmentError" in resp["status"]["message"]  # odd under full-pcpus-only
    resp = await client.admit("/validate", _resize_request(running, "30"))
    assert resp["allowed"] is True
    assert any("w-2" in w and "right now" in w and "28 more CPU(s)" in w and "PodResizeInProgress" in w
               for w in resp["warnings"]), resp
    resp = await client.admit("/validate", _resize_request(running, "4"))
    assert resp["allowed"] is True and not resp.get("warnings")
