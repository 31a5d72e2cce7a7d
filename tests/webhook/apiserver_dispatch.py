"""Which of numapin's webhooks kube-apiserver calls for a request, and what it does when a call fails: written from
the documented behaviour of k8s.io/apiserver's admission webhook dispatch (facts, not its code).

For each webhook of the Mutating- then the ValidatingWebhookConfiguration, in order:

1. ``rules``: the request's operation, group, version and resource (``pods``, or ``pods/<subresource>``: a rule
   for ``pods`` does not match a subresource) and scope must match one rule;
2. ``namespaceSelector`` against the labels of the request's namespace (``kubernetes.io/metadata.name`` is always
   one), ``objectSelector`` against the labels of the object or of the old object;
3. ``matchConditions``, CEL with ``object``, ``oldObject`` (null on CREATE) and ``request`` (the AdmissionRequest)
   declared dynamic, as kube-apiserver declares object and oldObject: any condition false skips the webhook; all
   true calls it; an evaluation error (none false) is a failed call;
4. a failed call (the webhook unreachable, a timeout, an error answer, a condition's error) refuses the request
   under ``failurePolicy: Fail`` and skips the webhook under ``Ignore``.

A mutating webhook's JSON patch is applied before the next webhook sees the object; validating webhooks see the
mutated object. (The second pass of ``reinvocationPolicy: IfNeeded`` is left out: no other mutating webhook runs
here.) CEL is evaluated by cel-expr-python, the CEL project's Python binding of its C++ runtime (a test-only
dependency): the same language kube-apiserver evaluates with cel-go, type-checked at compile time.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import yaml
from cel_expr_python import cel

from numapin_lab.demo.admission import AdmissionAnswer, apply_patch

__all__ = ["Admission", "Request", "Unreachable", "Webhook", "admit", "condition_outcome", "load_webhooks",
           "matched"]

CONFIGURATIONS = Path(__file__).resolve().parents[2] / "manifests/webhook/webhook-configurations.yaml"


class Unreachable(Exception):
    """The webhook could not be called (no endpoint, connection refused, timeout)."""


@dataclass(frozen=True)
class Webhook:
    kind: str                      # MutatingWebhookConfiguration or ValidatingWebhookConfiguration
    name: str
    path: str
    failure_policy: str
    rules: tuple[Mapping[str, Any], ...]
    namespace_selector: Mapping[str, Any]
    object_selector: Mapping[str, Any]
    conditions: tuple[tuple[str, str], ...]   # (name, expression)

    @property
    def mutating(self) -> bool:
        return self.kind == "MutatingWebhookConfiguration"


def load_webhooks(path: Path = CONFIGURATIONS) -> list[Webhook]:
    """Mutating webhooks first, then validating ones, each in the order of its configuration."""
    out = []
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        for d in docs:
            if d["kind"] != kind:
                continue
            for w in d["webhooks"]:
                out.append(Webhook(kind, w["name"], w["clientConfig"]["service"]["path"],
                                   w.get("failurePolicy", "Fail"), tuple(w["rules"]),
                                   w.get("namespaceSelector") or {}, w.get("objectSelector") or {},
                                   tuple((c["name"], c["expression"]) for c in w.get("matchConditions", ()))))
    return out


@dataclass(frozen=True)
class Request:
    """An API request as admission sees it."""

    operation: str                  # CREATE, UPDATE, DELETE, CONNECT
    namespace: str
    object: Any
    old_object: Any = None
    resource: str = "pods"
    subresource: str = ""
    name: str = ""
    namespace_labels: Mapping[str, str] = field(default_factory=dict)

    def review_request(self, obj: Any) -> dict[str, Any]:
        """``request`` of the AdmissionReview, ``obj`` the object as the webhook gets it."""
        kind = {"": "Pod", "binding": "Binding"}.get(self.subresource, "Pod")
        meta = obj.get("metadata") if isinstance(obj, Mapping) else None
        name = self.name or (meta.get("name", "") if isinstance(meta, Mapping) else "")
        gvk = {"group": "", "version": "v1", "kind": kind}
        gvr = {"group": "", "version": "v1", "resource": self.resource}
        return {"uid": str(uuid.uuid4()), "kind": gvk, "resource": gvr, "subResource": self.subresource,
                "requestKind": gvk, "requestResource": gvr, "requestSubResource": self.subresource,
                "name": name, "namespace": self.namespace, "operation": self.operation,
                "userInfo": {"username": "tester", "groups": ["system:authenticated"]},
                "object": obj, "oldObject": self.old_object, "dryRun": False,
                "options": {"apiVersion": "meta.k8s.io/v1", "kind": f"{self.operation.title()}Options"}}


def _rule_matches(rule: Mapping[str, Any], req: Request) -> bool:
    resource = f"{req.resource}/{req.subresource}" if req.subresource else req.resource
    ops, groups, versions = rule.get("operations", []), rule.get("apiGroups", []), rule.get("apiVersions", [])
    resources, scope = rule.get("resources", []), rule.get("scope", "*")
    top, _, sub = resource.partition("/")
    res_ok = any(r == resource or r == "*/*" or (r == "*" and not sub) or (r == f"{top}/*" and sub)
                 or (r == f"*/{sub}" and sub) for r in resources)
    return (("*" in ops or req.operation in ops) and ("*" in groups or "" in groups)
            and ("*" in versions or "v1" in versions) and res_ok and scope in ("*", "Namespaced"))


def selector_matches(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """A metav1.LabelSelector (matchLabels, matchExpressions In/NotIn/Exists/DoesNotExist); empty matches all."""
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for e in selector.get("matchExpressions") or ():
        key, op, values = e["key"], e["operator"], e.get("values") or []
        ok = {"In": key in labels and labels[key] in values,
              "NotIn": key not in labels or labels[key] not in values,
              "Exists": key in labels, "DoesNotExist": key not in labels}[op]
        if not ok:
            return False
    return True


def _labels(obj: Any) -> Mapping[str, str]:
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    labels = meta.get("labels") if isinstance(meta, Mapping) else None
    return labels if isinstance(labels, Mapping) else {}


@cache
def _env() -> Any:
    return cel.NewEnv(variables={"object": cel.Type.DYN, "oldObject": cel.Type.DYN, "request": cel.Type.DYN})


@cache
def compiled(expression: str) -> Any:
    """The expression compiled and type-checked (a RuntimeError names what does not check)."""
    return _env().compile(expression)


def condition_outcome(expression: str, request: Mapping[str, Any]) -> bool | str:
    """True or False, or the evaluation error's message."""
    value = compiled(expression).eval(data={"object": request["object"], "oldObject": request["oldObject"],
                                            "request": request})
    if value.type() == cel.Type.ERROR:
        return str(value.value())
    result = value.value()
    if not isinstance(result, bool):
        return f"not a bool: {result!r}"
    return result


def matched(webhook: Webhook, req: Request, obj: Any) -> bool | str:
    """Whether the API server calls ``webhook`` for ``req`` (``obj``: the object as it is at that point): True,
    False, or a matchCondition's error message (a failed call)."""
    if not any(_rule_matches(r, req) for r in webhook.rules):
        return False
    ns_labels = {"kubernetes.io/metadata.name": req.namespace, **req.namespace_labels}
    if not selector_matches(webhook.namespace_selector, ns_labels):
        return False
    if webhook.object_selector and not (selector_matches(webhook.object_selector, _labels(obj))
                                        or selector_matches(webhook.object_selector, _labels(req.old_object))):
        return False
    review = req.review_request(obj)
    errors = []
    for name, expression in webhook.conditions:
        outcome = condition_outcome(expression, review)
        if outcome is False:
            return False
        if outcome is not True:
            errors.append(f"matchCondition {name}: {outcome}")
    return "; ".join(errors) if errors else True


@dataclass(frozen=True)
class Admission:
    allowed: bool
    object: Any
    called: tuple[str, ...]          # the webhooks called (or whose call failed)
    failed: tuple[str, ...] = ()     # the webhooks whose call failed (ignored or refusing)
    refused_by: str = ""             # the webhook that refused (a denial, or a failed call under Fail)
    message: str = ""


Call = Callable[[Webhook, dict[str, Any]], Awaitable[Mapping[str, Any]]]


async def admit(webhooks: Sequence[Webhook], req: Request, call: Call) -> Admission:
    """The request through the webhooks; ``call`` answers a webhook's AdmissionReview ``response`` or raises
    Unreachable."""
    obj = req.object
    called: list[str] = []
    failed: list[str] = []
    for w in webhooks:
        m = matched(w, req, obj)
        if m is False:
            continue
        called.append(w.name)
        failure = m if isinstance(m, str) else ""
        answer = None
        if not failure:
            try:
                answer = AdmissionAnswer.of(await call(w, req.review_request(obj)))
            except Unreachable as e:
                failure = f"failed calling webhook {w.name!r}: {e}"
        if failure:
            failed.append(w.name)
            if w.failure_policy == "Fail":
                return Admission(False, obj, tuple(called), tuple(failed), w.name, failure)
            continue
        assert answer is not None
        if not answer.allowed:
            return Admission(False, obj, tuple(called), tuple(failed), w.name, answer.message)
        if w.mutating and answer.patch:
            obj = apply_patch(obj, answer.patch)
    return Admission(True, obj, tuple(called), tuple(failed))
