"""Talk to numapin's webhook the way kube-apiserver does: AdmissionReview v1 bodies for pods CREATE and
pods/binding CREATE, over HTTPS with the webhook's CA and service name, JSON patches applied to the pod.

A slim, real version of what the webhook tests build by hand (tests/webhook/helpers.py); used by ``numapin demo``
and the end-to-end tests. The patch applier handles the operations RFC 6902 defines for objects and arrays
(``add``, ``remove``, ``replace``, ``test``, ``move``, ``copy``).
"""

from __future__ import annotations

import base64
import copy
import json
import ssl
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

__all__ = ["AdmissionAnswer", "AdmissionClient", "PatchError", "apply_patch", "binding_request", "pod_request"]


class PatchError(ValueError):
    """A JSON patch that cannot be applied."""


def _tokens(pointer: str) -> list[str]:
    if pointer == "":
        return []
    if not pointer.startswith("/"):
        raise PatchError(f"JSON pointer {pointer!r} must start with '/'")
    return [t.replace("~1", "/").replace("~0", "~") for t in pointer[1:].split("/")]


def _parent(doc: Any, tokens: list[str], pointer: str) -> Any:
    node = doc
    for t in tokens[:-1]:
        if isinstance(node, dict) and t in node:
            node = node[t]
        elif isinstance(node, list) and t.isdigit() and int(t) < len(node):
            node = node[int(t)]
        else:
            raise PatchError(f"path {pointer!r} does not exist")
    return node


def _get(doc: Any, pointer: str) -> Any:
    tokens = _tokens(pointer)
    if not tokens:
        return doc
    parent = _parent(doc, tokens, pointer)
    last = tokens[-1]
    if isinstance(parent, dict) and last in parent:
        return parent[last]
    if isinstance(parent, list) and last.isdigit() and int(last) < len(parent):
        return parent[int(last)]
    raise PatchError(f"path {pointer!r} does not exist")


def _remove(doc: Any, pointer: str) -> Any:
    tokens = _tokens(pointer)
    parent = _parent(doc, tokens, pointer)
    last = tokens[-1]
    if isinstance(parent, dict) and last in parent:
        return parent.pop(last)
    if isinstance(parent, list) and last.isdigit() and int(last) < len(parent):
        return parent.pop(int(last))
    raise PatchError(f"remove: path {pointer!r} does not exist")


def _add(doc: Any, pointer: str, value: Any, *, replace: bool = False) -> Any:
    tokens = _tokens(pointer)
    if not tokens:
        return value
    parent = _parent(doc, tokens, pointer)
    last = tokens[-1]
    if isinstance(parent, dict):
        if replace and last not in parent:
            raise PatchError(f"replace: path {pointer!r} does not exist")
        parent[last] = value
    elif isinstance(parent, list):
        if last == "-" and not replace:
            parent.append(value)
        elif last.isdigit() and int(last) <= len(parent) - (1 if replace else 0):
            if replace:
                parent[int(last)] = value
            else:
                parent.insert(int(last), value)
        else:
            raise PatchError(f"path {pointer!r}: bad array index")
    else:
        raise PatchError(f"path {pointer!r}: parent is not an object or array")
    return doc


def apply_patch(obj: Any, ops: Sequence[Mapping[str, Any]]) -> Any:
    """``obj`` with the RFC 6902 ``ops`` applied (``obj`` itself is not changed)."""
    doc = copy.deepcopy(obj)
    for i, op in enumerate(ops):
        kind, path = op.get("op"), op.get("path")
        if not isinstance(path, str):
            raise PatchError(f"operation {i}: no path")
        if kind == "add":
            doc = _add(doc, path, copy.deepcopy(op["value"]))
        elif kind == "replace":
            doc = _add(doc, path, copy.deepcopy(op["value"]), replace=True)
        elif kind == "remove":
            _remove(doc, path)
        elif kind == "test":
            if _get(doc, path) != op.get("value"):
                raise PatchError(f"operation {i}: test of {path!r} failed")
        elif kind in ("move", "copy"):
            src = op.get("from")
            if not isinstance(src, str):
                raise PatchError(f"operation {i}: {kind} without from")
            value = _remove(doc, src) if kind == "move" else copy.deepcopy(_get(doc, src))
            doc = _add(doc, path, value)
        else:
            raise PatchError(f"operation {i}: unknown op {kind!r}")
    return doc


def pod_request(pod: Mapping[str, Any], *, operation: str = "CREATE", dry_run: bool = False,
                old: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``request`` of a pods review as kube-apiserver builds it (``old``: the object before an UPDATE)."""
    meta = pod.get("metadata") or {}
    return {
        "uid": str(uuid.uuid4()),
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
        "requestResource": {"group": "", "version": "v1", "resource": "pods"},
        "name": meta.get("name", ""),
        "namespace": meta.get("namespace", "default"),
        "operation": operation,
        "userInfo": {"username": "numapin-demo", "groups": ["system:authenticated"]},
        "object": pod,
        "oldObject": old,
        "dryRun": dry_run,
        "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions" if operation == "CREATE"
                    else "UpdateOptions"},
    }


def binding_request(namespace: str, name: str, node: str, *, pod_uid: str | None = None) -> dict[str, Any]:
    """``request`` of a pods/binding CREATE review (the scheduler binding a pod): only the Binding, no pod."""
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "creationTimestamp": None}
    if pod_uid:
        meta["uid"] = pod_uid
    return {
        "uid": str(uuid.uuid4()),
        "kind": {"group": "", "version": "v1", "kind": "Binding"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "subResource": "binding",
        "requestKind": {"group": "", "version": "v1", "kind": "Binding"},
        "requestResource": {"group": "", "version": "v1", "resource": "pods"},
        "requestSubResource": "binding",
        "name": name,
        "namespace": namespace,
        "operation": "CREATE",
        "userInfo": {"username": "system:kube-scheduler", "groups": ["system:authenticated"]},
        "object": {"kind": "Binding", "apiVersion": "v1", "metadata": meta, "target": {"kind": "Node", "name": node}},
        "oldObject": None,
        "dryRun": False,
        "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
    }


@dataclass(frozen=True)
class AdmissionAnswer:
    allowed: bool
    message: str
    warnings: tuple[str, ...]
    patch: tuple[Mapping[str, Any], ...]

    @classmethod
    def of(cls, response: Mapping[str, Any]) -> AdmissionAnswer:
        patch: tuple[Mapping[str, Any], ...] = ()
        if response.get("patch"):
            if response.get("patchType") != "JSONPatch":
                raise PatchError(f"unexpected patchType {response.get('patchType')!r}")
            patch = tuple(json.loads(base64.b64decode(response["patch"])))
        status = response.get("status") or {}
        return cls(bool(response.get("allowed")), str(status.get("message", "")),
                   tuple(response.get("warnings") or ()), patch)


class AdmissionClient:
    """HTTPS to the webhook, verifying its certificate against ``ca_file`` under ``server_name`` (the Service's
    DNS name, as kube-apiserver dials it), keep-alive. ``async with AdmissionClient(...) as c``."""

    def __init__(self, base_url: str, ca_file: str, server_name: str, *, timeout: float = 10.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.ctx = ssl.create_default_context(cafile=ca_file)
        self.server_name = server_name
        self.timeout = aiohttp.ClientTimeout(total=timeout)
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> AdmissionClient:
        self._session = aiohttp.ClientSession(timeout=self.timeout)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def review(self, path: str, request: Mapping[str, Any]) -> AdmissionAnswer:
        assert self._session is not None, "use: async with AdmissionClient(...)"
        body = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}
        async with self._session.post(self.base_url + path, json=body, ssl=self.ctx,
                                      server_hostname=self.server_name) as r:
            text = await r.text()
            if r.status != 200:
                raise RuntimeError(f"webhook {path}: HTTP {r.status}: {text[:500]}")
        doc = json.loads(text)
        response = doc.get("response") or {}
        if response.get("uid") != request["uid"]:
            raise RuntimeError(f"webhook {path}: response uid {response.get('uid')!r} does not echo the request's")
        return AdmissionAnswer.of(response)

    async def mutate(self, pod: Mapping[str, Any]) -> tuple[dict[str, Any], AdmissionAnswer]:
        """The pod as mutated by ``/mutate`` (the patch applied), and the answer."""
        answer = await self.review("/mutate", pod_request(pod))
        return (apply_patch(pod, answer.patch) if answer.allowed else dict(pod)), answer

    async def validate(self, pod: Mapping[str, Any], *, dry_run: bool = False) -> AdmissionAnswer:
        """``/validate`` of a pods CREATE (``dry_run``: as ``kubectl create --dry-run=server``, which the webhook
        neither remembers nor counts)."""
        return await self.review("/validate", pod_request(pod, dry_run=dry_run))

    async def update(self, old: Mapping[str, Any], new: Mapping[str, Any]) -> tuple[dict[str, Any], AdmissionAnswer,
                                                                                 AdmissionAnswer]:
        """A pods UPDATE as kube-apiserver admits it (``kubectl annotate``): ``/mutate`` (its patch applied), then
        ``/validate``; returns the updated pod and both answers."""
        m = await self.review("/mutate", pod_request(new, operation="UPDATE", old=old))
        updated = apply_patch(new, m.patch) if m.allowed else dict(new)
        v = await self.review("/validate", pod_request(updated, operation="UPDATE", old=old))
        return updated, m, v

    async def bind(self, namespace: str, name: str, node: str, *, pod_uid: str | None = None) -> AdmissionAnswer:
        return await self.review("/validate", binding_request(namespace, name, node, pod_uid=pod_uid))

    async def get(self, path: str) -> tuple[int, str]:
        assert self._session is not None
        async with self._session.get(self.base_url + path, ssl=self.ctx, server_hostname=self.server_name) as r:
            return r.status, await r.text()
