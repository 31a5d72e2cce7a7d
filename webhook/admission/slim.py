"""What of an AdmissionReview the webhook's decisions read: ``slim_review`` keeps that and drops the rest.

A pod of several megabytes is mostly what numapin never looks at (environment variables, commands, volumes,
managed fields); its decisions read the pod's identity and annotations, its containers' names, resources and restart
policies, ``nodeName``, ``nodeSelector``, its pod-level ``resources`` and ``status.qosClass``, and of a Binding
its metadata and target. Every review is cut down to those fields right after parsing (in the parser process for a
large body, see ``request_body``), so a large body costs the event loop only what the decisions read, and every
decision sees the same shape of document whatever the body's size.

Fields are kept by name whatever their type (a ``containers`` that is not a list stays as it is), so a malformed
pod is refused with the same message as before the cut. A decision that starts reading another field must add it
here (tests/webhook/test_slim.py compares every decision on the full and the slim review).
"""

from __future__ import annotations

from typing import Any

__all__ = ["slim_review"]

_REQUEST_DROP = ("object", "oldObject", "userInfo", "options")
_METADATA = ("name", "namespace", "generateName", "uid", "annotations", "labels")
_SPEC = ("nodeName", "nodeSelector", "serviceAccountName", "serviceAccount", "resources")  # resources: pod-level
_CONTAINER = ("name", "resources", "restartPolicy")


def _pick(obj: dict[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    return {k: obj[k] for k in keys if k in obj}


def _containers(items: Any) -> Any:
    if not isinstance(items, list):
        return items
    return [_pick(c, _CONTAINER) if isinstance(c, dict) else c for c in items]


def slim_object(obj: Any) -> Any:
    """A pod or Binding cut down to what the decisions read (anything else returned as it is)."""
    if not isinstance(obj, dict):
        return obj
    out: dict[str, Any] = {k: obj[k] for k in ("apiVersion", "kind") if k in obj}
    meta = obj.get("metadata", None)
    if "metadata" in obj:
        out["metadata"] = _pick(meta, _METADATA) if isinstance(meta, dict) else meta
    if "spec" in obj:
        spec = obj["spec"]
        if isinstance(spec, dict):
            slim_spec = _pick(spec, _SPEC)
            for key in ("initContainers", "containers"):
                if key in spec:
                    slim_spec[key] = _containers(spec[key])
            out["spec"] = slim_spec
        else:
            out["spec"] = spec
    if "status" in obj:
        status = obj["status"]
        out["status"] = _pick(status, ("qosClass",)) if isinstance(status, dict) else status
    if "target" in obj:  # a Binding
        out["target"] = obj["target"]
    return out


def slim_review(doc: Any) -> Any:
    """The review with ``request.object`` and ``request.oldObject`` cut down (anything not a review unchanged)."""
    if not isinstance(doc, dict):
        return doc
    req = doc.get("request")
    if not isinstance(req, dict):
        return doc
    slim_req = {k: v for k, v in req.items() if k not in _REQUEST_DROP}
    for key in ("object", "oldObject"):
        if key in req:
            slim_req[key] = slim_object(req[key])
    out = dict(doc)
    out["request"] = slim_req
    return out
