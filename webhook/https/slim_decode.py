"""The slim review straight from the body, in one C pass, for reviews of the usual shape (perf, issue 37).

``request_body.parse_slim`` decodes a body into Python objects, cuts it down to what the decisions read
(``slim.slim_review``) and checks the bounds of what is left (``json_bounds``): for a pod review of 4-5 KiB that is
about 35 µs, most of it building objects for fields that are then dropped and walking what is kept. ``decode_slim``
gives the same document in about a quarter of that: msgspec decodes the body against the schema below, which names
the fields ``slim`` keeps with the types the API server sends them in, builds the pod's or Binding's dictionaries and
lists itself and skips every other field without building it.

It answers only when the result is sure to be what the general path gives, and None otherwise (the caller then takes
the general path, whose answer, a document or a 400 and its reason, stands):

- the body is ASCII (a skipped field's bytes are checked for JSON syntax by msgspec, not for UTF-8) and at most
  ``MAX_STRING_BYTES`` long (no string in it can be longer); msgspec refuses a lone surrogate escape wherever it
  stands (the general path then reads the body with the standard library's parser): every string kept is within the
  bounds of ``json_bounds``;
- every field kept has the type below: strings, objects of strings, integers (``int``: no float, so no non-finite
  number), booleans, ``null``; the schema nests a fixed number of levels, far below ``json_bounds.MAX_DEPTH``;
- the review and its ``request`` hold no field the schema does not name (``slim`` keeps those, so the fast path
  would not), and ``userInfo`` and ``options``, which ``slim`` drops, are skipped whatever they hold.

The dictionaries are equal to the general path's; their keys may come in another order (the body's where ``slim``
picks them in its own order, the schema's for the review and the request): nothing reads that order.
tests/webhook/test_slim_decode.py compares both paths on every shape of review the tests know and on altered ones.
"""

from __future__ import annotations

from typing import Any, TypedDict

import msgspec
from msgspec import UNSET, Raw, Struct, UnsetType

from webhook.https.json_bounds import MAX_STRING_BYTES

__all__ = ["decode_slim"]

_Strings = dict[str, str]
# a container's or the pod's resources as the API server writes them: {"requests": {"cpu": "500m"}, ...}
_Resources = dict[str, dict[str, str | int]]


# below the request: msgspec builds these dictionaries itself and skips the keys they do not name (``slim`` drops them)
class _Container(TypedDict, total=False):
    name: str | None
    resources: _Resources | None
    restartPolicy: str | None


class _Metadata(TypedDict, total=False):
    name: str | None
    namespace: str | None
    generateName: str | None
    uid: str | None
    annotations: _Strings | None
    labels: _Strings | None


class _Spec(TypedDict, total=False):
    nodeName: str | None
    nodeSelector: _Strings | None
    serviceAccountName: str | None
    serviceAccount: str | None
    resources: _Resources | None
    initContainers: list[_Container] | None
    containers: list[_Container] | None


class _Status(TypedDict, total=False):
    qosClass: str | None


class _Object(TypedDict, total=False):
    """A pod or a Binding (the fields of either; ``slim.slim_object``)."""

    apiVersion: str | None
    kind: str | None
    metadata: _Metadata | None
    spec: _Spec | None
    status: _Status | None
    target: _Strings | None


# the review and its request: structures refusing a key they do not name (``slim`` keeps every such key)
class _Request(Struct, forbid_unknown_fields=True):
    uid: str | UnsetType | None = UNSET
    kind: _Strings | UnsetType | None = UNSET
    resource: _Strings | UnsetType | None = UNSET
    subResource: str | UnsetType | None = UNSET
    requestKind: _Strings | UnsetType | None = UNSET
    requestResource: _Strings | UnsetType | None = UNSET
    requestSubResource: str | UnsetType | None = UNSET
    name: str | UnsetType | None = UNSET
    namespace: str | UnsetType | None = UNSET
    operation: str | UnsetType | None = UNSET
    userInfo: Raw | UnsetType = UNSET  # dropped by ``slim``: skipped, never built
    options: Raw | UnsetType = UNSET   # dropped by ``slim``
    dryRun: bool | UnsetType | None = UNSET
    object: _Object | UnsetType | None = UNSET
    oldObject: _Object | UnsetType | None = UNSET


class _Review(Struct, forbid_unknown_fields=True):
    apiVersion: str | UnsetType | None = UNSET
    kind: str | UnsetType | None = UNSET
    request: _Request | UnsetType | None = UNSET


_KEPT = tuple(name for name in _Request.__struct_fields__ if name not in ("userInfo", "options"))
_decoder = msgspec.json.Decoder(_Review)


def decode_slim(raw: bytes) -> Any:
    """``slim_review`` of the body's document, when the body is of the shape described above and within every bound
    of ``json_bounds``; None otherwise (take the general path)."""
    if len(raw) > MAX_STRING_BYTES or not raw.isascii():
        return None
    try:
        review = _decoder.decode(raw)
    except (msgspec.DecodeError, RecursionError, ValueError):  # another shape, or not JSON: the general path says
        return None
    out: dict[str, Any] = {}
    if review.apiVersion is not UNSET:
        out["apiVersion"] = review.apiVersion
    if review.kind is not UNSET:
        out["kind"] = review.kind
    request = review.request
    if isinstance(request, _Request):
        out["request"] = {name: value for name in _KEPT if (value := getattr(request, name)) is not UNSET}
    elif request is None:
        out["request"] = None
    return out
