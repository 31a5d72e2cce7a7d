"""/mutate over real TLS: the returned JSON patch, applied with the jsonpatch library, gives the expected pod."""

from __future__ import annotations

import copy
import json

from allocator.intent import INTENT_ANNOTATION, decode_intent
from allocator.pod import CPU_MANAGER_ANNOTATION
from tests.webhook.helpers import Client, apply_patch, container, make_pod, pod_request


def _intent(pod: dict) -> dict:
    return json.loads(pod["metadata"]["annotations"][INTENT_ANNOTATION])


async def test_intent_stamped_on_a_pod_without_annotations(client: Client) -> None:
    pod = make_pod("web", [container("app", "2", "2Gi"), container("log", "100m", "64Mi", cpu_limit="200m")],
                   init=[container("setup", "1", "128Mi"),
                         {**container("proxy", "1", "128Mi"), "restartPolicy": "Always"}])
    assert "annotations" not in pod["metadata"]
    resp = await client.admit("/mutate", pod_request(copy.deepcopy(pod)))
    assert resp["allowed"] is True
    out = apply_patch(copy.deepcopy(pod), resp)
    intent = _intent(out)
    assert intent["qosClass"] == "Burstable"
    assert [(c["name"], c["role"]) for c in intent["containers"]] == [
        ("setup", "init"), ("proxy", "sidecar"), ("app", "app"), ("log", "app")]
    assert intent["containers"][3]["cpu"] == [100, 200]
    info = decode_intent(out["metadata"]["annotations"][INTENT_ANNOTATION], uid="u", namespace="default",
                         name="web")
    assert info.container("app").cpu_request_milli == 2000
    # only the annotation was added
    out["metadata"].pop("annotations")
    assert out == pod


async def test_cpu_manager_normalised_and_reinvocation_is_idempotent(client: Client) -> None:
    pod = make_pod("db", [container("db", "4", "8Gi")],
                   annotations={CPU_MANAGER_ANNOTATION: "  Exclusive ", "team": "x"})
    resp = await client.admit("/mutate", pod_request(copy.deepcopy(pod)))
    once = apply_patch(copy.deepcopy(pod), resp)
    assert once["metadata"]["annotations"][CPU_MANAGER_ANNOTATION] == "exclusive"
    assert once["metadata"]["annotations"]["team"] == "x"
    assert _intent(once)["cpuManager"] == "exclusive"
    again = await client.admit("/mutate", pod_request(copy.deepcopy(once)))
    assert "patch" not in again
    assert apply_patch(copy.deepcopy(once), again) == once


async def test_a_forged_intent_is_overwritten(client: Client) -> None:
    pod = make_pod("sneaky", [container("c", "500m")], annotations={INTENT_ANNOTATION: '{"v":1,"qosClass":"x"}'})
    out = apply_patch(copy.deepcopy(pod), await client.admit("/mutate", pod_request(copy.deepcopy(pod))))
    assert _intent(out)["qosClass"] == "Guaranteed"
    assert _intent(out)["containers"][0]["cpu"] == [500, 500]


async def test_bad_cpu_manager_value_left_for_validate(client: Client) -> None:
    pod = make_pod("bad", [container("c", "1")], annotations={CPU_MANAGER_ANNOTATION: "turbo"})
    resp = await client.admit("/mutate", pod_request(copy.deepcopy(pod)))
    out = apply_patch(copy.deepcopy(pod), resp)
    assert out["metadata"]["annotations"][CPU_MANAGER_ANNOTATION] == "turbo"
    assert INTENT_ANNOTATION not in out["metadata"]["annotations"]
    assert any("intent not recorded" in w for w in resp["warnings"])


async def test_update_of_a_pod_numapin_never_stamped_is_not_mutated(client: Client) -> None:
    pod = make_pod("p", [container("c", "1")])
    resp = await client.admit("/mutate", pod_request(copy.deepcopy(pod), operation="UPDATE", old=copy.deepcopy(pod)))
    assert resp["allowed"] is True and "patch" not in resp


async def test_update_changing_the_mode_restamps_the_intent(client: Client) -> None:
    created = make_pod("db", [container("c", "2")], annotations={CPU_MANAGER_ANNOTATION: "exclusive"})
    resp = await client.admit("/mutate", pod_request(copy.deepcopy(created)))
    running = apply_patch(copy.deepcopy(created), resp)
    assert _intent(running)["cpuManager"] == "exclusive"
    # nothing changed: nothing to patch
    resp = await client.admit("/mutate", pod_request(copy.deepcopy(running), operation="UPDATE",
                                                     old=copy.deepcopy(running)))
    assert "patch" not in resp
    # kubectl annotate --overwrite qos.gocrane.io/cpu-manager=" Share"
    changed = copy.deepcopy(running)
    changed["metadata"]["annotations"][CPU_MANAGER_ANNOTATION] = " Share"
    resp = await client.admit("/mutate", pod_request(copy.deepcopy(changed), operation="UPDATE", old=running))
    out = apply_patch(copy.deepcopy(changed), resp)
    assert out["metadata"]["annotations"][CPU_MANAGER_ANNOTATION] == "share"
    assert _intent(out)["cpuManager"] == "share"
    # the annotation removed: kubelet's rule
    removed = copy.deepcopy(out)
    del removed["metadata"]["annotations"][CPU_MANAGER_ANNOTATION]
    resp = await client.admit("/mutate", pod_request(copy.deepcopy(removed), operation="UPDATE", old=out))
    assert _intent(apply_patch(copy.deepcopy(removed), resp))["cpuManager"] is None
    # a pod created before numapin gets an intent once its mode changes
    plain = make_pod("old", [container("c", "2")])
    annotated = make_pod("old", [container("c", "2")], annotations={CPU_MANAGER_ANNOTATION: "none"})
    resp = await client.admit("/mutate", pod_request(copy.deepcopy(annotated), operation="UPDATE", old=plain))
    assert _intent(apply_patch(copy.deepcopy(annotated), resp))["cpuManager"] == "none"


async def test_v1beta1_mutation(client: Client) -> None:
    pod = make_pod("p", [container("c", "1")])
    resp = await client.admit("/mutate", pod_request(copy.deepcopy(pod)), api_version="admission.k8s.io/v1beta1")
    assert INTENT_ANNOTATION in apply_patch(copy.deepcopy(pod), resp)["metadata"]["annotations"]
