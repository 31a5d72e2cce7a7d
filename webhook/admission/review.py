"""AdmissionReview (``admission.k8s.io/v1``, and ``v1beta1`` answered in kind): parse a request, build a response.

``parse_review`` checks only what the webhook needs (the envelope and ``request.uid``) and raises ReviewError with
a message naming the field; the HTTP layer turns that into a 400. ``Verdict`` is what a decision returns;
``respond`` renders it as the AdmissionReview the API server expects, echoing the request's uid.

Denials come in the two shapes kubectl and client-go print well (kube-apiserver passes the webhook's status on,
its message prefixed with ``admission webhook "<name>" denied the request: ``):

- ``Verdict.deny``: 403 ``Forbidden`` with a message (a policy refusal). kubectl prints
  ``Error from server (Forbidden): error when creating "pod.yaml": admission webhook "..." denied the request: ...``.
- ``Verdict.invalid``: 422 ``Invalid`` with ``details`` (kind, name, causes with field paths), as kube-apiserver's
  own validation answers. kubectl prints ``The Pod "x" is invalid: <field>: <message>`` (one line per cause when
  there are several); an ``Invalid`` status without details would print only ``The request is invalid``.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec

__all__ = [
    "API_VERSIONS",
    "AdmissionRequest",
    "FieldCause",
    "ReviewError",
    "Verdict",
    "json_bytes",
    "parse_review",
    "respond",
]

API_VERSIONS = ("admission.k8s.io/v1", "admission.k8s.io/v1beta1")
# the API server shows warnings longer than this truncated; keep ours readable
MAX_WARNING_CHARS = 250


class ReviewError(ValueError):
    """The body is not an AdmissionReview request the webhook can answer."""


@dataclass(frozen=True)
class AdmissionRequest:
    """The fields of ``request`` the webhook looks at (``raw`` keeps all of it)."""

    api_version: str
    uid: str
    operation: str
    group: str
    version: str
    resource: str
    sub_resource: str
    namespace: str
    name: str
    object: Any
    old_object: Any
    dry_run: bool
    raw: Mapping[str, Any] = field(repr=False)

    @property
    def target(self) -> str:
        """``pods``, ``pods/binding``, ... (group left out for the core group)."""
        res = self.resource if not self.group else f"{self.resource}.{self.group}"
        return f"{res}/{self.sub_resource}" if self.sub_resource else res

    def describe(self) -> str:
        obj = f"{self.namespace}/{self.name}" if self.namespace else self.name
        return f"{self.operation} {self.target} {obj or '(unnamed)'} uid={self.uid}"


def _str(value: Any) -> str:
    return value if isinstance(value, str) else ""


def parse_review(body: Any) -> AdmissionRequest:
    """Validate the AdmissionReview envelope. Raises ReviewError naming the field at fault."""
    if not isinstance(body, Mapping):
        raise ReviewError("body must be a JSON object (an AdmissionReview)")
    api = body.get("apiVersion")
    if api not in API_VERSIONS:
        raise ReviewError(f"apiVersion must be one of {', '.join(API_VERSIONS)}, got {api!r}")
    if body.get("kind") != "AdmissionReview":
        raise ReviewError(f"kind must be AdmissionReview, got {body.get('kind')!r}")
    req = body.get("request")
    if not isinstance(req, Mapping):
        raise ReviewError("request must be an object")
    uid = req.get("uid")
    if not isinstance(uid, str) or not uid:
        raise ReviewError("request.uid must be a non-empty string")
    try:
        uid.encode("utf-8")
    except UnicodeEncodeError:  # a \ud800-style escape: no answer could carry the same uid
        raise ReviewError("request.uid must be valid Unicode (it holds an unpaired surrogate escape)") from None
    resource = req.get("resource")
    if resource is not None and not isinstance(resource, Mapping):
        raise ReviewError("request.resource must be an object {group, version, resource}")
    resource = resource or {}
    operation = req.get("operation")
    if operation is not None and not isinstance(operation, str):
        raise ReviewError("request.operation must be a string")
    return AdmissionRequest(
        api_version=api,
        uid=uid,
        operation=_str(operation),
        group=_str(resource.get("group")),
        version=_str(resource.get("version")),
        resource=_str(resource.get("resource")),
        sub_resource=_str(req.get("subResource")),
        namespace=_str(req.get("namespace")),
        name=_str(req.get("name")),
        object=req.get("object"),
        old_object=req.get("oldObject"),
        dry_run=req.get("dryRun") is True,
        raw=req,
    )


@dataclass(frozen=True)
class FieldCause:
    """One cause of an ``Invalid`` denial: a field path (``metadata.annotations[qos.gocrane.io/cpu-manager]``),
    Kubernetes' cause type (``FieldValueNotSupported``, ``FieldValueInvalid``, ``FieldValueForbidden``...) and the
    message kubectl prints after the field."""

    field: str
    message: str
    type: str = "FieldValueInvalid"

    def render(self) -> dict[str, str]:
        return {"reason": self.type, "message": self.message, "field": self.field}


@dataclass(frozen=True)
class Verdict:
    """A decision: allowed or denied (with a message, an HTTP-like code, a reason and, for ``Invalid``, details),
    warnings, and a JSON patch."""

    allowed: bool = True
    message: str = ""
    code: int = 200
    reason: str = ""
    warnings: tuple[str, ...] = ()
    patch: tuple[Mapping[str, Any], ...] = ()
    details: Mapping[str, Any] | None = None

    @classmethod
    def allow(cls, *warnings: str, patch: tuple[Mapping[str, Any], ...] = ()) -> Verdict:
        if not warnings and not patch and cls is Verdict:
            return _ALLOWED  # the plain allowance, one immutable value (perf, issue 37: most answers)
        return cls(allowed=True, warnings=tuple(warnings), patch=patch)

    @classmethod
    def deny(cls, message: str, *, code: int = 403, reason: str = "Forbidden", warnings: tuple[str, ...] = ()
             ) -> Verdict:
        return cls(allowed=False, message=message, code=code, reason=reason, warnings=warnings)

    @classmethod
    def invalid(cls, kind: str, name: str, causes: tuple[FieldCause, ...] | list[FieldCause], *,
                group: str = "", warnings: tuple[str, ...] = ()) -> Verdict:
        """An ``Invalid`` denial shaped as kube-apiserver's own (``apierrors.NewInvalid``): 422, details with the
        object's kind and name and one cause per field; the message lists the causes as ``field: message``."""
        causes = tuple(causes)
        errs = [f"{c.field}: {c.message}" for c in causes]
        listed = errs[0] if len(errs) == 1 else "[" + ", ".join(errs) + "]"
        details: dict[str, Any] = {"name": name, "kind": kind, "causes": [c.render() for c in causes]}
        if group:
            details["group"] = group
        return cls(allowed=False, message=f'{kind} "{name}" is invalid: {listed}', code=422, reason="Invalid",
                   warnings=warnings, details=details)

    @property
    def label(self) -> str:
        """For metrics: ``denied``, ``allowed_with_warnings``, ``patched`` or ``allowed``."""
        if not self.allowed:
            return "denied"
        if self.warnings:
            return "allowed_with_warnings"
        return "patched" if self.patch else "allowed"


_ALLOWED = Verdict()


def _warning(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= MAX_WARNING_CHARS else text[: MAX_WARNING_CHARS - 3] + "..."


def respond(req: AdmissionRequest, verdict: Verdict) -> dict[str, Any]:
    """The AdmissionReview answer, in the request's apiVersion, echoing its uid."""
    response: dict[str, Any] = {"uid": req.uid, "allowed": verdict.allowed}
    if not verdict.allowed:
        status: dict[str, Any] = {"status": "Failure", "code": verdict.code, "message": verdict.message}
        if verdict.reason:
            status["reason"] = verdict.reason
        if verdict.details is not None:
            status["details"] = verdict.details
        response["status"] = status
    if verdict.warnings:
        response["warnings"] = [_warning(w) for w in verdict.warnings]
    if verdict.allowed and verdict.patch:
        raw = json_bytes(list(verdict.patch))
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(raw).decode("ascii")
    return {"apiVersion": req.api_version, "kind": "AdmissionReview", "response": response}


_encoder = msgspec.json.Encoder()


def json_bytes(obj: Any) -> bytes:
    """Compact UTF-8 JSON: the uid and names come back as the request's characters; an unpaired surrogate (only
    possible from a \\u escape) is written as that escape again. msgspec's encoder writes what the standard
    library's writes with ``ensure_ascii=False`` (floats aside, in another valid form) about ten times faster; it
    refuses unpaired surrogates, which the standard library's then writes."""
    try:
        return _encoder.encode(obj)
    except (UnicodeEncodeError, TypeError):  # TypeError: a type msgspec does not write (none expected)
        return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8", "backslashreplace")
