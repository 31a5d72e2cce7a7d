"""/validate's memo of the checks of a pod CREATE that read the pod alone (perf, issue 37 round 3): keyed by the pod's
text less its uid, name and labels, the request's namespace, the bypass policy and the kubelets' gate; the nodes are
asked every time, and a denial is worked out again on the whole path (it names the pod). Each verdict is compared with
a validator remembering nothing, and each part of the key is changed alone under the same pod text."""

from __future__ import annotations

import asyncio
import copy
import uuid
from pathlib import Path
from typing import Any

from allocator.bypass import BypassPolicy
from allocator.intent import INTENT_ANNOTATION
from allocator.pod import BYPASS_ANNOTATION, CPU_MANAGER_ANNOTATION
from tests.webhook.helpers import cluster_webhook, container, make_pod, pod_request, review
from webhook.admission.mutate import mutate_pod
from webhook.admission.review import AdmissionRequest, parse_review, respond
from webhook.admission.simulate import Simulator
from webhook.admission.validate import PodValidator


def _request(pod: dict[str, Any], *, namespace: str | None = None) -> AdmissionRequest:
    pod = copy.deepcopy(pod)
    pod["metadata"]["uid"] = str(uuid.uuid4())  # as the API server has set it before validating admission
    req = pod_request(pod)
    if namespace is not None:
        req["namespace"] = namespace
    return parse_review(review(req))


def _pods() -> list[dict[str, Any]]:
    exclusive = {CPU_MANAGER_ANNOTATION: "exclusive"}
    stamped, _ = mutate_pod(make_pod("web", [container("app", "2", "2Gi"), container("log", "1", "1Gi")],
                                     annotations=exclusive))
    forged = copy.deepcopy(stamped)
    forged["spec"]["containers"][1]["resources"]["limits"]["cpu"] = "2"  # the pod changed, its intent not
    huge, _ = mutate_pod(make_pod("huge", [container("app", "100", "2Gi")], annotations=exclusive))
    no_effect, _ = mutate_pod(make_pod("half", [container("app", "500m")], annotations=exclusive))
    bypassed = make_pod("b", [container("app", "2")], annotations={BYPASS_ANNOTATION: "true"})
    unreadable = make_pod("u", [container("app", "2")])
    unreadable["spec"]["containers"] = {"app": {}}
    selected, _ = mutate_pod(make_pod("sel", [container("app", "2", "2Gi")], annotations=exclusive,
                                      node_selector={"no-such": "label"}))
    return [stamped, forged, huge, no_effect, bypassed, unreadable, selected,
            make_pod("bad-mode", [container("app", "2")], annotations={CPU_MANAGER_ANNOTATION: "turbo"}),
            make_pod("plain", [container("app", "2")])]


def _pod_level(cpus: str) -> dict[str, Any]:
    """A Guaranteed pod with pod-level resources whose one container asks ``cpus`` CPUs of its own: pinned only
    with the kubelets' PodLevelResourceManagers gate."""
    pod = make_pod("level", [container("app", cpus, "1Gi")])
    pod["spec"]["resources"] = {"requests": {"cpu": cpus, "memory": "1Gi"}, "limits": {"cpu": cpus, "memory": "1Gi"}}
    return pod


def test_create_checks_remembered_answer_as_the_whole_path(tmp_path: Path) -> None:
    webhook = cluster_webhook(tmp_path)
    memo = webhook.pod_validator

    async def answers(req: AdmissionRequest) -> tuple[dict[str, Any], dict[str, Any]]:
        plain = PodValidator(webhook.nodes, memo.simulator, webhook.unjudged, memo.bypass, memo_size=0)
        return respond(req, await memo.validate(req)), respond(req, await plain.validate(req))

    async def allowed(req: AdmissionRequest) -> bool:
        remembered, whole = await answers(req)
        assert remembered == whole
        return bool(remembered["response"]["allowed"])

    async def run() -> None:
        for s in webhook.sources:
            await s.sync()
        pods = _pods()
        for _ in range(2):  # the second round from the memo, the pods renamed (other uid, name and labels)
            for i, pod in enumerate(pods):
                for namespace in (None, "numapin"):
                    renamed = copy.deepcopy(pod)
                    renamed["metadata"]["name"] = f"{pod['metadata']['name']}-{uuid.uuid4().hex[:5]}"
                    renamed["metadata"]["labels"] = {"pod-index": str(i)}
                    remembered, whole = await answers(_request(renamed, namespace=namespace))
                    assert remembered == whole, pod["metadata"]["name"]
                    if not whole["response"]["allowed"] and pod["metadata"]["name"] == "huge":
                        # a denial worked out on the nodes names the pod asked about, not one remembered
                        assert renamed["metadata"]["name"] in whole["response"]["status"]["message"]
        assert memo._cleared is not None and memo._cleared.cache_info().hits >= len(pods)

        # each part of the key changed alone, the pod's text the same
        asks = make_pod("b", [container("app", "2")], annotations={BYPASS_ANNOTATION: "true"})
        del asks["metadata"]["namespace"]  # the request's namespace decides
        assert await allowed(_request(asks, namespace="numapin"))
        assert not await allowed(_request(asks, namespace="default"))
        assert await allowed(_request(asks, namespace="numapin"))
        memo.bypass = BypassPolicy(namespaces=frozenset({"default"}))
        assert not await allowed(_request(asks, namespace="numapin"))
        assert await allowed(_request(asks, namespace="default"))
        level = _pod_level("100")  # as many CPUs as no node has: refused only where the container is pinned
        assert await allowed(_request(level))
        memo.simulator = Simulator(pod_level_managers=True)  # kubelets with the gate (a simulator is made with one)
        assert not await allowed(_request(level))
        memo.simulator = webhook.simulator
        assert await allowed(_request(level))
        # the intent annotation is the pod's text too: a stale one after the remembered pod is refused
        stamped = pods[0]
        assert await allowed(_request(stamped))
        stale = copy.deepcopy(stamped)
        stale["metadata"]["annotations"][INTENT_ANNOTATION] = mutate_pod(pods[2])[0]["metadata"]["annotations"][
            INTENT_ANNOTATION]
        assert not await allowed(_request(stale))

    asyncio.run(run())
