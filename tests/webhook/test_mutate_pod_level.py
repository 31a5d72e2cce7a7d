"""/mutate over real TLS for pods with pod-level resources (``spec.resources``): the intent says so, and the author
of a Guaranteed one that asks for no numapin mode is warned that no container gets CPUs of its own."""

from __future__ import annotations

import copy
import json

from allocator.intent import INTENT_ANNOTATION, decode_intent
from allocator.pod import CPU_MANAGER_ANNOTATION, guaranteed_cpus
from tests.webhook.helpers import Client, apply_patch, container, make_pod, pod_request


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
