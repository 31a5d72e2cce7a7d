"""The webhook's blast radius, from manifests/webhook/webhook-configurations.yaml as written: which requests
kube-apiserver sends to which webhook (rules, namespace selector, matchConditions evaluated by a CEL runtime: see
apiserver_dispatch.py), and what a down webhook refuses.

- A table of requests, each with the webhooks it must reach: pods numapin may pin or must judge are sent, pods it
  would never touch are not; kubelet's status writes, deletes, label and finalizer updates never are.
- Generated pods: every pod numapin's own rules pin or judge (allocator.pod, webhook.admission.validate) is sent;
  for every pod that is not, the node proxy decides from CRI alone exactly what it decides from the intent (the
  shared pool, no memory placement), so skipping the webhook changes nothing on the node. No expression fails to
  evaluate on any pod (under failurePolicy Fail an evaluation error refuses the request).
- Against the real webhook over TLS: a skipped request is one the webhook would have allowed (a CREATE's patch only
  an intent of the shared pool, an UPDATE's no patch at all); with nothing listening, only the requests that reach
  a webhook with failurePolicy Fail are refused, and those are exactly the pods numapin pins or judges.
"""

from __future__ import annotations

import copy
import socket
from collections.abc import Mapping
from typing import Any

import aiohttp
import pytest
from cel_expr_python import cel
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from allocator.intent import INTENT_ANNOTATION, decode_intent, encode_intent
from allocator.memory.requests import container_requests
from allocator.pod import CPU_MANAGER_ANNOTATION, PodInfo, container_mode
from nodeagent.decisions.cri_intent import pod_from_cri
from nodeagent.decisions.pod_roles import PodRoles
from numapin_lab.cri.client import CRIClient
from protos import cri_pb2
from tests.webhook.apiserver_dispatch import Request, Unreachable, Webhook, admit, compiled, load_webhooks, matched
from tests.webhook.helpers import Client, apply_patch, container, make_pod
from webhook.admission.mutate import mutate_pod
from webhook.admission.validate import judged

WEBHOOKS = load_webhooks()
MUTATE, VALIDATE, RESIZE, BINDINGS = ("mutate.pods.numapin.io", "validate.pods.numapin.io",
                                      "validate.resize.numapin.io", "validate.bindings.numapin.io")
PODS_WEBHOOKS = (MUTATE, VALIDATE)


def _numapin_annotations(pod: Any) -> dict[str, str]:
    ann = ((pod or {}).get("metadata") or {}).get("annotations") or {}
    return {k: v for k, v in ann.items() if k.startswith("numapin.io/") or k == CPU_MANAGER_ANNOTATION}


def _sent(req: Request) -> tuple[str, ...]:
    out = []
    for w in WEBHOOKS:
        m = matched(w, req, req.object)
        assert not isinstance(m, str), f"{w.name}: a matchCondition failed to evaluate: {m}"
        if m:
            out.append(w.name)
    return tuple(out)


# -- pods ---------------------------------------------------------------------------------------------------------

def _res(**kw: str) -> dict[str, Any]:
    """resources from requests_cpu=..., limits_memory=... (requests defaulted from limits, as the API server does
    before admission)."""
    out: dict[str, dict[str, str]] = {}
    for key, value in kw.items():
        kind, _, name = key.partition("_")
        out.setdefault(kind, {})[name] = value
    for name, value in out.get("limits", {}).items():
        out.setdefault("requests", {}).setdefault(name, value)
    return out


def _c(name: str, resources: dict[str, Any] | None) -> dict[str, Any]:
    c = container(name, None, None)
    if resources is None:
        del c["resources"]
    else:
        c["resources"] = resources
    return c


def guaranteed(name: str = "g", cpu: str = "2", **kw: Any) -> dict[str, Any]:
    return make_pod(name, [container("app", cpu)], **kw)


def besteffort(name: str = "be", **kw: Any) -> dict[str, Any]:
    return make_pod(name, [_c("app", {})], **kw)


def burstable(name: str = "bu", **kw: Any) -> dict[str, Any]:
    return make_pod(name, [_c("app", _res(requests_cpu="500m", requests_memory="64Mi"))], **kw)


def stamped(pod: dict[str, Any]) -> dict[str, Any]:
    """The pod as numapin's /mutate left it at its creation (what the API server stored), with a uid."""
    mutated, _ = mutate_pod(copy.deepcopy(pod))
    mutated["metadata"]["uid"] = "uid-" + mutated["metadata"]["name"]
    mutated["status"] = {"qosClass": PodInfo.from_pod(mutated).qos_class}
    return mutated


def _with(pod: dict[str, Any], *, annotations: Mapping[str, str | None] = {}, labels: Mapping[str, str] = {},
          finalizers: list[str] | None = None) -> dict[str, Any]:
    new = copy.deepcopy(pod)
    meta = new["metadata"]
    for k, v in annotations.items():
        if v is None:
            meta.get("annotations", {}).pop(k, None)
        else:
            meta.setdefault("annotations", {})[k] = v
    meta.setdefault("labels", {}).update(labels)
    if finalizers is not None:
        meta["finalizers"] = finalizers
    return new


def _resized(pod: dict[str, Any], cpu: str) -> dict[str, Any]:
    new = copy.deepcopy(pod)
    for c in new["spec"]["containers"]:
        c["resources"].setdefault("requests", {})["cpu"] = cpu
        if "limits" in c["resources"]:
            c["resources"]["limits"]["cpu"] = cpu
    return new


def _create(pod: dict[str, Any]) -> Request:
    return Request("CREATE", pod["metadata"]["namespace"], pod)


def _update(old: dict[str, Any], new: dict[str, Any], subresource: str = "") -> Request:
    return Request("UPDATE", new["metadata"]["namespace"], new, old, subresource=subresource)


SG = stamped(guaranteed("sg"))
SX = stamped(burstable("sx", annotations={CPU_MANAGER_ANNOTATION: "exclusive"}))
SB = _with(burstable("sb"), labels={})  # not sent at its creation: no intent
SB["metadata"]["uid"] = "uid-sb"
POD_LEVEL = make_pod("pl", [_c("app", {})])
POD_LEVEL["spec"]["resources"] = {"limits": {"cpu": "2", "memory": "1Gi"}}
BINDING = {"kind": "Binding", "apiVersion": "v1", "metadata": {"name": "g", "namespace": "default"},
           "target": {"kind": "Node", "name": "w1"}}

# (id, request, the webhooks it reaches, whether numapin pins or judges it: a down webhook refuses it)
TABLE: list[tuple[str, Request, tuple[str, ...], bool]] = [
    ("create-besteffort", _create(besteffort()), (), False),
    ("create-burstable", _create(burstable()), (), False),
    ("create-burstable-cpu-limit-only", _create(make_pod("cl", [_c("app", _res(limits_cpu="1"))])), (), False),
    ("create-no-resources-field", _create(make_pod("nr", [_c("app", None)])), (), False),
    ("create-guaranteed-init-without-limits",
     _create(make_pod("gi", [container("app", "2")], init=[_c("init", _res(requests_cpu="100m"))])), (), False),
    ("create-unrelated-annotations", _create(burstable(annotations={"prometheus.io/scrape": "true"})), (), False),
    ("create-guaranteed-kube-system", _create(guaranteed(namespace="kube-system")), (), False),
    ("create-guaranteed-numapin-namespace", _create(guaranteed(namespace="numapin")), (), False),
    ("create-guaranteed-integer", _create(guaranteed()), PODS_WEBHOOKS, True),
    ("create-guaranteed-fractional", _create(guaranteed(cpu="1500m")), PODS_WEBHOOKS, True),
    ("create-guaranteed-with-init",
     _create(make_pod("gw", [container("app", "2")], init=[container("init", "1")])), PODS_WEBHOOKS, True),
    ("create-pod-level-resources", _create(POD_LEVEL), PODS_WEBHOOKS, True),
    ("create-burstable-crane-exclusive",
     _create(burstable(annotations={CPU_MANAGER_ANNOTATION: "exclusive"})), PODS_WEBHOOKS, True),
    ("create-besteffort-bad-crane-value", _create(besteffort(annotations={CPU_MANAGER_ANNOTATION: "turbo"})),
     PODS_WEBHOOKS, True),
    ("create-besteffort-forged-intent", _create(besteffort(annotations={INTENT_ANNOTATION: "{}"})),
     PODS_WEBHOOKS, True),
    ("create-besteffort-bypass", _create(besteffort(annotations={"numapin.io/bypass": "true"})),
     PODS_WEBHOOKS, True),
    ("update-guaranteed-label", _update(SG, _with(SG, labels={"tier": "gold"})), (), False),
    ("update-guaranteed-finalizer-removed",
     _update(_with(SG, finalizers=["example.com/x"]), _with(SG, finalizers=[])), (), False),
    ("update-guaranteed-unrelated-annotation", _update(SG, _with(SG, annotations={"note": "x"})), (), False),
    ("update-burstable-label", _update(SB, _with(SB, labels={"tier": "x"})), (), False),
    ("update-exclusive-label", _update(SX, _with(SX, labels={"tier": "x"})), (), False),
    ("update-guaranteed-mode-change", _update(SG, _with(SG, annotations={CPU_MANAGER_ANNOTATION: "none"})),
     PODS_WEBHOOKS, True),
    ("update-exclusive-mode-removed", _update(SX, _with(SX, annotations={CPU_MANAGER_ANNOTATION: None})),
     PODS_WEBHOOKS, True),
    ("update-guaranteed-intent-removed", _update(SG, _with(SG, annotations={INTENT_ANNOTATION: None})),
     PODS_WEBHOOKS, True),
    ("update-guaranteed-intent-forged", _update(SG, _with(SG, annotations={INTENT_ANNOTATION: "{}"})),
     PODS_WEBHOOKS, True),
    ("update-burstable-bypass-added", _update(SB, _with(SB, annotations={"numapin.io/bypass": "true"})),
     PODS_WEBHOOKS, True),
    ("resize-guaranteed", _update(SG, _resized(SG, "3"), "resize"), (RESIZE,), False),
    ("resize-exclusive", _update(SX, _resized(SX, "1"), "resize"), (RESIZE,), False),
    ("resize-burstable", _update(SB, _resized(SB, "700m"), "resize"), (), False),
    ("binding", Request("CREATE", "default", BINDING, subresource="binding", name="g"), (BINDINGS,), False),
    ("binding-kube-system", Request("CREATE", "kube-system", BINDING, subresource="binding", name="g"), (), False),
    ("status-guaranteed", _update(SG, _with(SG, labels={}), "status"), (), False),
    ("ephemeral-containers", _update(SG, SG, "ephemeralcontainers"), (), False),
    ("delete-guaranteed", Request("DELETE", "default", None, SG), (), False),
]


def test_the_table_covers_every_webhook() -> None:
    assert {w.name for w in WEBHOOKS} == {MUTATE, VALIDATE, RESIZE, BINDINGS}
    assert {name for _, _, sent, _ in TABLE for name in sent} == {MUTATE, VALIDATE, RESIZE, BINDINGS}


def test_conditions_type_check_as_bool_and_the_pods_webhooks_share_them() -> None:
    by_name = {w.name: w for w in WEBHOOKS}
    for w in WEBHOOKS:
        for name, expression in w.conditions:
            assert compiled(expression).return_type() == cel.Type.BOOL, (w.name, name)
    mutate, validate, resize = by_name[MUTATE], by_name[VALIDATE], by_name[RESIZE]
    assert mutate.conditions == validate.conditions and len(mutate.conditions) == 2
    assert (mutate.rules, mutate.namespace_selector) == (validate.rules, validate.namespace_selector)
    # the resize webhook asks the first question of the pod after the resize (a resize changes no annotation)
    (name, expression), = resize.conditions
    assert name == mutate.conditions[0][0] and expression in mutate.conditions[0][1]
    assert by_name[BINDINGS].conditions == ()  # a Binding carries no pod to ask about
    policies = {w.name: w.failure_policy for w in WEBHOOKS}
    assert policies == {MUTATE: "Fail", VALIDATE: "Fail", RESIZE: "Ignore", BINDINGS: "Ignore"}
    assert all(not w.object_selector for w in WEBHOOKS)  # a pod's labels are its author's: no opt-out by label


def test_a_broken_expression_is_caught() -> None:
    """The check can fail: an unguarded field is an evaluation error on a pod without it, and that is reported."""
    broken = Webhook("ValidatingWebhookConfiguration", "x", "/validate", "Fail", WEBHOOKS[1].rules, {}, {},
                     (("annotated", "object.metadata.annotations.exists(k, k.startsWith('numapin.io/'))"),))
    outcome = matched(broken, _create(besteffort()), besteffort())
    assert isinstance(outcome, str) and "annotations" in outcome


@pytest.mark.parametrize(("request_", "sent"), [(r, s) for _, r, s, _ in TABLE], ids=[i for i, *_ in TABLE])
def test_which_webhooks_a_request_reaches(request_: Request, sent: tuple[str, ...]) -> None:
    assert _sent(request_) == sent


# -- generated pods -----------------------------------------------------------------------------------------------

CPU = st.sampled_from(["1", "2", "500m", "1500m", "2000m", "0"])
MEMORY = st.sampled_from(["64Mi", "1Gi"])
ANNOTATION_POOL = {CPU_MANAGER_ANNOTATION: ["none", "exclusive", "share", " Exclusive"],
                   "numapin.io/bypass": ["true"], INTENT_ANNOTATION: ['{"v":1}'],
                   "prometheus.io/scrape": ["true"], "example.com/owner": ["team-a"]}


@st.composite
def resources(draw: st.DrawFn) -> dict[str, Any] | None:
    if draw(st.integers(0, 9)) == 0:
        return None
    kw = {}
    for key, values in (("requests_cpu", CPU), ("requests_memory", MEMORY), ("limits_cpu", CPU),
                        ("limits_memory", MEMORY)):
        if draw(st.booleans()):
            kw[key] = draw(values)
    res = _res(**kw)
    if "limits" in res and "requests" in res:  # a request above its limit is refused by the API server's validation
        for name, value in res["requests"].items():
            if name in res["limits"]:
                res["requests"][name] = min(value, res["limits"][name], key=_quantity)
    return res


def _quantity(q: str) -> float:
    units = {"m": 1e-3, "Mi": 2**20, "Gi": 2**30}
    for u, f in units.items():
        if q.endswith(u):
            return float(q[: -len(u)]) * f
    return float(q)


@st.composite
def annotations(draw: st.DrawFn) -> dict[str, str] | None:
    if draw(st.booleans()):
        return None
    keys = draw(st.lists(st.sampled_from(sorted(ANNOTATION_POOL)), unique=True, max_size=3))
    return {k: draw(st.sampled_from(ANNOTATION_POOL[k])) for k in keys}


@st.composite
def pods(draw: st.DrawFn) -> dict[str, Any]:
    apps = [_c(f"app{i}", draw(resources())) for i in range(draw(st.integers(1, 3)))]
    inits = [_c(f"init{i}", draw(resources())) for i in range(draw(st.integers(0, 2)))]
    for c in inits:
        if draw(st.booleans()):
            c["restartPolicy"] = "Always"  # a sidecar
    pod = make_pod("p", apps, annotations=draw(annotations()), init=inits or None)
    if draw(st.integers(0, 5)) == 0:
        pod["spec"]["resources"] = draw(st.sampled_from([{"limits": {"cpu": "2", "memory": "1Gi"}},
                                                         {"requests": {"cpu": "1"}}]))
    return pod


def _numapin_needs(pod: dict[str, Any]) -> bool:
    """numapin's own rules: the pod carries one of its annotations, or its model says it is Guaranteed, pinned,
    placed by the Memory Manager, or sized at pod level."""
    if _numapin_annotations(pod):
        return True
    info = PodInfo.from_pod(pod)
    return info.qos_class == "Guaranteed" or judged(info) or info.pod_level_resources


def _decisions(info: PodInfo) -> list[tuple[str, str, dict[str, int]]]:
    return [(c.name, container_mode(info, c), container_requests(info, c)) for c in info.containers]


def _decisions_from_cri(pod: dict[str, Any]) -> list[tuple[str, str, dict[str, int]]]:
    """What the node proxy decides for each container without an intent: the CRI calls kubelet makes for the pod
    (its QoS class's cgroup parent, CFS shares and quota, the memory limit), in kubelet's order, read by the
    proxy's own pod_from_cri."""
    info = PodInfo.from_pod(pod)
    meta = pod["metadata"]
    # the lab builds kubelet's messages from the full CRI protos; the proxy reads its own: the same bytes
    sandbox = cri_pb2.PodSandboxConfig.FromString(CRIClient.sandbox_config(
        meta["name"], "uid-p", namespace=meta["namespace"], qos=info.qos_class.lower(),
        annotations=meta.get("annotations") or {}).SerializeToString())
    known: dict[str, Any] = {}
    roles = PodRoles()
    out = []
    for c in info.containers:
        cfg = cri_pb2.ContainerConfig.FromString(CRIClient.container_config(
            c.name, cpu_milli=c.cpu_request_milli, limit_milli=c.cpu_limit_milli).SerializeToString())
        cfg.linux.resources.memory_limit_in_bytes = c.memory_limit or 0
        model = pod_from_cri(cri_pb2.CreateContainerRequest(pod_sandbox_id="sb", config=cfg, sandbox_config=sandbox),
                             known, roles)
        known[c.name] = cfg.linux.resources
        this = model.container(c.name)
        out.append((c.name, container_mode(model, this), container_requests(model, this)))
    return out


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pods())
def test_every_pod_numapin_pins_or_judges_is_sent_and_the_others_are_decided_alike_without(pod: dict[str, Any]
                                                                                           ) -> None:
    sent = _sent(_create(pod))
    assert sent in ((), PODS_WEBHOOKS)
    if not sent:
        assert not _numapin_needs(pod), "a pod numapin pins, places or judges is not sent to the webhook"
        info = PodInfo.from_pod(pod)
        with_intent = _decisions(decode_intent(encode_intent(info), uid="uid-p", namespace="default", name="p"))
        assert _decisions_from_cri(pod) == with_intent
        assert all(mode == "shared" and not mem for _, mode, mem in with_intent)


@st.composite
def updates(draw: st.DrawFn) -> tuple[dict[str, Any], dict[str, Any]]:
    old = draw(pods())
    if _sent(_create(old)):
        old, _ = mutate_pod(old)  # stored as numapin's webhook left it at its creation
    new = copy.deepcopy(old)
    for key in draw(st.lists(st.sampled_from(sorted(ANNOTATION_POOL)), unique=True, max_size=2)):
        value = draw(st.sampled_from([None, *ANNOTATION_POOL[key]]))
        new = _with(new, annotations={key: value})
    if draw(st.booleans()):
        new = _with(new, labels={"tier": "gold"}, finalizers=["example.com/x"])
    return old, new


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(updates())
def test_an_update_is_sent_exactly_when_it_changes_one_of_numapins_annotations(
        pair: tuple[dict[str, Any], dict[str, Any]]) -> None:
    old, new = pair
    sent = _sent(_update(old, new))
    assert sent == (PODS_WEBHOOKS if _numapin_annotations(old) != _numapin_annotations(new) else ())


# -- against the real webhook -------------------------------------------------------------------------------------

def _real(client: Client) -> Any:
    async def call(w: Webhook, request: dict[str, Any]) -> Mapping[str, Any]:
        return await client.admit(w.path, request)
    return call


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed again: nothing listens there


def _down(port: int, session: aiohttp.ClientSession) -> Any:
    async def call(w: Webhook, request: dict[str, Any]) -> Mapping[str, Any]:
        try:
            async with session.post(f"https://127.0.0.1:{port}{w.path}", json={"request": request}) as r:
                return dict(await r.json())
        except aiohttp.ClientConnectionError as e:
            raise Unreachable(f"connection refused: {e}") from e
    return call


async def test_a_skipped_request_is_one_the_webhook_would_have_allowed_unchanged(client: Client) -> None:
    """Every request of the table the pods webhooks skip, sent to them anyway: allowed, and what /mutate would add
    (an intent on a CREATE) gives every container the shared pool and no memory placement, as CRI alone does."""
    checked = 0
    for ident, req, sent, _ in TABLE:
        if MUTATE in sent or req.subresource or req.operation not in ("CREATE", "UPDATE"):
            continue
        if req.namespace in ("kube-system", "numapin"):
            continue  # left out by namespace (the webhook's own pods must start), not by the pod
        review = req.review_request(req.object)
        mutated = await client.admit("/mutate", copy.deepcopy(review))
        assert mutated["allowed"] is True, ident
        obj = apply_patch(copy.deepcopy(req.object), mutated)
        if req.operation == "UPDATE":
            assert "patch" not in mutated, (ident, "an UPDATE numapin skips would have changed nothing")
        else:
            intent = obj["metadata"]["annotations"][INTENT_ANNOTATION]
            decided = _decisions(decode_intent(intent, uid="u", namespace="default", name="p"))
            assert decided == _decisions_from_cri(req.object), ident
        validated = await client.admit("/validate", req.review_request(obj))
        assert validated["allowed"] is True, (ident, validated)
        checked += 1
    assert checked >= 8


async def test_with_the_webhook_up_the_pods_it_judges_are_stamped_or_refused(client: Client) -> None:
    for ident, req, sent, _ in TABLE:
        result = await admit(WEBHOOKS, req, _real(client))
        if ident in ("update-guaranteed-intent-removed", "update-guaranteed-intent-forged"):
            # /mutate stamps the intent again from the pod: the UPDATE no longer changes it, /validate is skipped
            assert result.called == (MUTATE,) and result.allowed, ident
            assert result.object["metadata"]["annotations"] == req.old_object["metadata"]["annotations"], ident
            continue
        assert result.called == sent and result.failed == (), ident
        if ident.startswith("create-") and MUTATE in sent and "bad" not in ident and "forged" not in ident \
                and "bypass" not in ident:
            assert result.allowed and INTENT_ANNOTATION in result.object["metadata"]["annotations"], ident
        if ident == "create-besteffort-forged-intent":  # /mutate writes what the pod says over it
            pod = copy.deepcopy(req.object)
            del pod["metadata"]["annotations"][INTENT_ANNOTATION]
            assert result.allowed and result.object["metadata"]["annotations"][INTENT_ANNOTATION] == \
                encode_intent(PodInfo.from_pod(pod))
        if ident in ("create-besteffort-bad-crane-value", "create-besteffort-bypass", "update-burstable-bypass-added"):
            assert not result.allowed and result.refused_by == VALIDATE, (ident, result)
        if not sent:
            assert result.allowed and result.object == req.object, ident


async def test_a_down_webhook_refuses_only_the_pods_numapin_pins_or_judges() -> None:
    """Nothing listens where the webhook should: what the API server refuses is what reaches a Fail webhook."""
    port = _closed_port()
    async with aiohttp.ClientSession() as session:
        call = _down(port, session)
        for ident, req, sent, judged_by_numapin in TABLE:
            result = await admit(WEBHOOKS, req, call)
            assert result.failed == result.called == (sent[:1] if judged_by_numapin else sent), ident
            assert result.allowed is not judged_by_numapin, (ident, result)
            if judged_by_numapin:
                assert result.refused_by == MUTATE and "connection refused" in result.message, ident
            else:
                assert result.object == req.object, ident
    # the requests that go through although a webhook was called: the bindings and resizes (Ignore)
    ignored = [i for i, _, sent, judged_by_numapin in TABLE if sent and not judged_by_numapin]
    assert sorted(ignored) == ["binding", "resize-exclusive", "resize-guaranteed"]
