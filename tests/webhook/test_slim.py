"""The fast paths of reading a review change nothing the webhook answers (perf, issue 13):

- ``decode_body`` (msgspec first, the standard library's parser for what msgspec refuses) gives the standard
  library's document or refuses the body with its reason, for seeded random JSON and random corruptions of it;
- every decision (``/mutate``, ``/validate`` of pods and bindings) gives the same verdict and patch on the slim review
  (``slim.slim_review``) as on the full one, for fuzzed pods carrying everything a real pod carries besides.
"""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from allocator.pod import CPU_MANAGER_ANNOTATION
from tests.webhook.helpers import binding_request, make_pki, review
from tests.webhook.nrt_fixtures import write_cluster
from tests.webhook.test_fuzz import annotations, json_values, pods, quantities
from webhook.admission.review import parse_review
from webhook.admission.slim import slim_review
from webhook.app import WebhookApp, WebhookOptions
from webhook.https.request_body import BodyError, _standard, decode_body

SETTINGS = settings(max_examples=150, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def _outcome(parse: Any, raw: bytes) -> tuple[str, Any]:
    try:
        return "doc", parse(raw)
    except BodyError as e:
        return "refused", str(e)


@SETTINGS
@given(doc=json_values, ascii_only=st.booleans(), flips=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)),
                                                                 max_size=3))
def test_decode_body_answers_as_the_standard_library(doc: Any, ascii_only: bool, flips: list[tuple[int, int]]) -> None:
    raw = bytearray(json.dumps(doc, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass"))
    for at, byte in flips:
        if raw:
            raw[at % len(raw)] = byte
    got, want = _outcome(decode_body, bytes(raw)), _outcome(_standard, bytes(raw))
    assert got[0] == want[0], (bytes(raw), got, want)
    if got[0] == "doc":
        assert json.dumps(got[1], sort_keys=True) == json.dumps(want[1], sort_keys=True)
    else:
        assert got[1] == want[1]


@pytest.mark.parametrize("raw", [b'{"a":"\\ud800"}', b"[NaN]", b"[1e400]", b"\xef\xbb\xbf{}", b"[" * 5000 + b"]" * 5000,
                                 b'{"a":1,"a":2}', b'["\xed\xa0\x80"]', b"[" + b"9" * 40 + b"]"])
def test_decode_body_edge_cases(raw: bytes) -> None:
    got, want = _outcome(decode_body, raw), _outcome(_standard, raw)
    assert got[0] == want[0] and repr(got[1]) == repr(want[1])


# -- the decisions on the slim review --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[asyncio.AbstractEventLoop, WebhookApp]]:
    root: Path = tmp_path_factory.mktemp("slim")
    (root / "tls").mkdir()
    (root / "nrt").mkdir()
    (root / "pods").mkdir()
    pki = make_pki(root / "tls")
    write_cluster(root / "nrt")
    # the pods that bindings name: one pinned, one not
    for name, cpu in (("b1", "4"), ("b2", "500m")):
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default", "uid": name},
               "spec": {"containers": [{"name": "c", "resources": {"limits": {"cpu": cpu, "memory": "1Gi"}}}]}}
        pod["metadata"]["annotations"] = {"qos.gocrane.io/cpu-manager": "exclusive"}
        (root / "pods" / f"{name}.json").write_text(json.dumps(pod))
    loop = asyncio.new_event_loop()
    webhook = WebhookApp(WebhookOptions(cert=pki.cert, key=pki.key, nrt_dir=root / "nrt", pods_dir=root / "pods"))
    for s in webhook.sources:
        loop.run_until_complete(s.sync())
    assert len(webhook.nodes) == 3
    yield loop, webhook
    loop.close()


_ENV = [{"name": f"V{i}", "value": "x" * 20} for i in range(5)]


def _bulk(pod: Any) -> Any:
    """The pod with what real pods carry besides (env, volumes, managed fields...), where its shape allows."""
    pod = copy.deepcopy(pod)
    if not isinstance(pod, dict):
        return pod
    meta = pod.get("metadata")
    if isinstance(meta, dict):
        meta["managedFields"] = [{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}]
        meta["ownerReferences"] = [{"kind": "ReplicaSet", "name": "rs"}]
    spec = pod.get("spec")
    if isinstance(spec, dict):
        spec["volumes"] = [{"name": "data", "emptyDir": {}}]
        spec["tolerations"] = [{"key": "k", "operator": "Exists"}]
        for key in ("containers", "initContainers"):
            for c in spec.get(key) or [] if isinstance(spec.get(key), list) else []:
                if isinstance(c, dict):
                    c["env"] = _ENV
                    c["command"] = ["sleep", "inf"]
                    c["volumeMounts"] = [{"name": "data", "mountPath": "/data"}]
    pod["status"] = pod.get("status", {"phase": "Pending"})
    return pod


async def _verdicts(webhook: WebhookApp, body: dict[str, Any]) -> list[Any]:
    out = []
    for decide in (webhook.mutate, webhook.validate):
        out.append(await decide(parse_review(json.loads(json.dumps(body)))))
    return out


def _container(draw: st.DrawFn, name: str, init: bool) -> dict[str, Any]:
    res = {"cpu": draw(st.sampled_from(["2", "29", "500m"]) | quantities), "memory": "1Gi"}
    c: dict[str, Any] = {"name": name, "resources": draw(st.sampled_from([{"requests": res, "limits": res},
                                                                          {"limits": res}, {"requests": res}]))}
    if init:
        policy = draw(st.sampled_from([None, "Always", "Never"]))
        if policy is not None:
            c["restartPolicy"] = policy
    return c


@st.composite
def wellformed_pods(draw: st.DrawFn) -> dict[str, Any]:
    """Pods as the API server stores them (the fuzz strategy's are mostly malformed)."""
    spec: dict[str, Any] = {
        "containers": [_container(draw, f"c{i}", False) for i in range(draw(st.integers(1, 3)))],
        "initContainers": [_container(draw, f"i{i}", True) for i in range(draw(st.integers(0, 2)))]}
    for key, values in (("nodeName", st.sampled_from(["w-0", "w-1", "w-2", "nope"])),
                        ("nodeSelector", st.sampled_from([{"pool": "big"}, {"pool": "small"}, {"x": "y"}]))):
        if draw(st.booleans()):
            spec[key] = draw(values)
    pod: dict[str, Any] = {"apiVersion": "v1", "kind": "Pod", "spec": spec, "metadata": {
        "name": draw(st.sampled_from(["p", "q"])), "namespace": "default", "uid": "pod-uid",
        "labels": {"app": "x"},
        "annotations": draw(st.sampled_from([{CPU_MANAGER_ANNOTATION: "exclusive"}, {}]) | annotations)}}
    if draw(st.booleans()):
        pod["status"] = {"qosClass": draw(st.sampled_from(["Guaranteed", "Burstable", "BestEffort", "x"]))}
    return pod


_NEVER_ON_SMALL = {"apiVersion": "v1", "kind": "Pod", "metadata": {
    "name": "p", "namespace": "default", "annotations": {CPU_MANAGER_ANNOTATION: "exclusive"}},
    "spec": {"nodeSelector": {"pool": "small"}, "containers": [
        {"name": "c", "resources": {"limits": {"cpu": "29", "memory": "1Gi"}}}]}}


@SETTINGS
@example(pod=_NEVER_ON_SMALL, old=None, operation="CREATE")
@given(pod=wellformed_pods() | pods, old=wellformed_pods() | pods, operation=st.sampled_from(["CREATE", "UPDATE"]))
def test_decisions_are_the_same_on_the_slim_review(app: tuple[asyncio.AbstractEventLoop, WebhookApp], pod: Any,
                                                   old: Any, operation: str) -> None:
    loop, webhook = app
    full = review({"uid": "u-1", "kind": {"group": "", "version": "v1", "kind": "Pod"},
                   "resource": {"group": "", "version": "v1", "resource": "pods"}, "namespace": "default",
                   "name": "p", "operation": operation, "object": _bulk(pod),
                   "oldObject": _bulk(old) if operation == "UPDATE" else None, "dryRun": False,
                   "userInfo": {"username": "system:serviceaccount:kube-system:replicaset-controller"}})
    assert loop.run_until_complete(_verdicts(webhook, full)) == \
        loop.run_until_complete(_verdicts(webhook, slim_review(copy.deepcopy(full))))


@SETTINGS
@given(name=st.sampled_from(["b1", "b2", "missing"]), node=st.sampled_from(["w-0", "w-1", "nope"]),
       extra=st.dictionaries(st.sampled_from(["uid", "labels", "junk"]), json_values, max_size=2))
def test_binding_decisions_are_the_same_on_the_slim_review(app: tuple[asyncio.AbstractEventLoop, WebhookApp],
                                                           name: str, node: str, extra: dict[str, Any]) -> None:
    loop, webhook = app
    full = review(binding_request("default", name, node))
    full["request"]["dryRun"] = True  # the first answer must not count a pending binding for the second
    full["request"]["object"]["metadata"].update(extra)
    full["request"]["userInfo"] = {"username": "system:kube-scheduler", "groups": ["system:authenticated"]}
    assert loop.run_until_complete(_verdicts(webhook, full)) == \
        loop.run_until_complete(_verdicts(webhook, slim_review(copy.deepcopy(full))))
