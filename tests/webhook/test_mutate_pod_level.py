"""/mutate and /validate over real TLS for pods with pod-level resources (``spec.resources``): the intent says so,
the author of a Guaranteed one that asks for no numapin mode is warned that no container gets CPUs of its own, and
/validate judges them as kubelet 1.36 does: with ``PodLevelResourceManagers`` off (the default) neither CPUs nor
memory count (kubelet gives no hint, admits), with ``--feature-gates PodLevelResourceManagers=true`` the containers
Guaranteed on their own do."""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from allocator.feature_gates import FeatureGates
from allocator.intent import INTENT_ANNOTATION, decode_intent
from allocator.pod import CPU_MANAGER_ANNOTATION, guaranteed_cpus
from tests.webhook.helpers import PKI, Client, apply_patch, container, make_pod, pod_request
from tests.webhook.nrt_fixtures import node_doc, write_docs
from tests.webhook.test_memory_admission import memory_node
from webhook.app import WebhookApp, WebhookOptions


def with_pod_resources(pod: dict, cpu: str, mem: str) -> dict:
    pod["spec"]["resources"] = {"requests": {"cpu": cpu, "memory": mem}, "limits": {"cpu": cpu, "memory": mem}}
    return pod


async def test_a_guaranteed_pod_level_pod_is_stamped_and_warned(client: Client) -> None:
    pod = with_pod_resources(make_pod("web", [container("app", "4", "4Gi")]), "4", "4Gi")
    resp = await client.admit("/mutate", pod_request(copy.deepcopy(pod)))
    assert resp["allowed"] is True
    text = apply_patch(copy.deepcopy(pod), resp)["metadata"]["annotations"][INTENT_ANNOTATION]
    assert json.loads(text)["podLevel"] is True
    info = decode_intent(text, uid="u", namespace="default", name="web")
    assert info.qos_class == "Guaranteed" and guaranteed_cpus(info, info.container("app")) == 0
    [warning] = resp["warnings"]
    assert "pod-level resources (spec.resources)" in warning and "no container of it gets CPUs" in warning
    assert "PodLevelResourceManagers off" in warning


async def test_no_warning_without_pod_level_resources_or_with_a_pinning_mode(client: Client) -> None:
    plain = make_pod("web", [container("app", "4", "4Gi")])
    resp = await client.admit("/mutate", pod_request(copy.deepcopy(plain)))
    assert not resp.get("warnings")
    assert "podLevel" not in json.loads(apply_patch(copy.deepcopy(plain), resp)["metadata"]["annotations"][
        INTENT_ANNOTATION])
    annotated = with_pod_resources(make_pod("db", [container("app", "4", "4Gi")],
                                            annotations={CPU_MANAGER_ANNOTATION: "exclusive"}), "4", "4Gi")
    resp = await client.admit("/mutate", pod_request(copy.deepcopy(annotated)))
    assert not resp.get("warnings")
    text = apply_patch(copy.deepcopy(annotated), resp)["metadata"]["annotations"][INTENT_ANNOTATION]
    info = decode_intent(text, uid="u", namespace="default", name="db")
    assert guaranteed_cpus(info, info.container("app")) == 4  # the annotation pins by the container's own values


async def test_an_intent_that_hides_or_invents_pod_level_resources_is_refused(client: Client) -> None:
    """The intent's ``podLevel`` is the pod's: without it, a pod with pod-level resources would be pinned by the node
    agent where kubelet (its gate off) gives no container CPUs of its own; a tenant's edit of it is refused."""
    pod = with_pod_resources(make_pod("level", [container("app", "2", "1Gi")]), "2", "1Gi")
    resp = await client.admit("/mutate", pod_request(copy.deepcopy(pod)))
    stamped = apply_patch(copy.deepcopy(pod), resp)
    text = stamped["metadata"]["annotations"][INTENT_ANNOTATION]
    assert (await client.admit("/validate", pod_request(copy.deepcopy(stamped), with_uid=True)))["allowed"] is True
    hidden = copy.deepcopy(stamped)
    doc = json.loads(text)
    del doc["podLevel"]
    hidden["metadata"]["annotations"][INTENT_ANNOTATION] = json.dumps(doc)
    resp = await client.admit("/validate", pod_request(hidden, with_uid=True))
    assert resp["allowed"] is False and "does not match" in resp["status"]["message"]
    invented = make_pod("plain", [container("app", "2", "1Gi")])
    resp = await client.admit("/mutate", pod_request(copy.deepcopy(invented)))
    invented = apply_patch(invented, resp)
    doc = json.loads(invented["metadata"]["annotations"][INTENT_ANNOTATION])
    doc["podLevel"] = True
    invented["metadata"]["annotations"][INTENT_ANNOTATION] = json.dumps(doc)
    resp = await client.admit("/validate", pod_request(invented, with_uid=True))
    assert resp["allowed"] is False and "does not match" in resp["status"]["message"]


@pytest.fixture(params=[False, True], ids=["gate-off", "PodLevelResourceManagers=true"])
async def gated(request: pytest.FixtureRequest, pki: PKI, nrt_dir: Path) -> AsyncIterator[tuple[bool, Client]]:
    """A webhook simulating kubelets with the gate off, then on, judging one single-numa-node node publishing
    memory (2 NUMA nodes of 28 CPUs and 64Gi)."""
    logging.getLogger("numapin").setLevel(logging.INFO)
    write_docs(nrt_dir / "m.yaml", [memory_node("m-snn", "single-numa-node"), node_doc("m-snn", {"pool": "snn"})])
    srv = WebhookApp(WebhookOptions(cert=pki.cert, key=pki.key, host="127.0.0.1", port=0, nrt_dir=nrt_dir,
                                    cert_poll_seconds=0.05, nrt_poll_seconds=0.05,
                                    feature_gates=FeatureGates(request.param)))
    await srv.start()
    try:
        async with aiohttp.ClientSession() as session:
            yield request.param, Client(srv.port, pki, session)  # type: ignore[arg-type]
    finally:
        await srv.stop()


async def _judge(client: Client, pod: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    mutated = await client.admit("/mutate", pod_request(copy.deepcopy(pod)))
    pod = apply_patch(copy.deepcopy(pod), mutated)
    return mutated, await client.admit("/validate", pod_request(pod, with_uid=True))


async def test_validate_judges_pod_level_pods_as_the_gate_says(gated: tuple[bool, Client]) -> None:
    gate, client = gated
    # 30 CPUs of its own under single-numa-node (28 per NUMA node): only the gate gives the container CPUs
    big = with_pod_resources(make_pod("big", [container("gu", "30", "1Gi"), container("side", "1", None)],
                                      node_selector={"pool": "snn"}), "31", "2Gi")
    mutated, resp = await _judge(client, big)
    assert resp["allowed"] is not gate, resp
    if gate:
        assert "30 CPUs" in resp["status"]["message"] and "m-snn" in resp["status"]["message"]
        assert not mutated.get("warnings")  # a container gets CPUs of its own: nothing to warn about
    else:
        [warning] = mutated["warnings"]
        assert "no container of it gets CPUs of its own" in warning
    # memory no NUMA node holds: kubelet gives no memory hint without the gate (admitted; denied by numapin before)
    huge = with_pod_resources(make_pod("huge", [container("app", "4", "100Gi")], node_selector={"pool": "snn"}),
                              "4", "100Gi")
    _, resp = await _judge(client, huge)
    assert resp["allowed"] is not gate, resp
    # a container not Guaranteed on its own (CPU only): nothing of its own either way, admitted, warned with the gate
    cpu_only = with_pod_resources(make_pod("cpu-only", [container("app", "30", None)], node_selector={"pool": "snn"}),
                                  "30", "100Gi")
    mutated, resp = await _judge(client, cpu_only)
    assert resp["allowed"] is True
    [warning] = mutated["warnings"]
    assert ("PodLevelResourceManagers gate" in warning) is gate
