"""Talk to numapin's webhook the way kube-apiserver does: AdmissionReview v1 bodies for pods CREATE and
pods/binding CREATE, over HTTPS with the webhook's CA and service name, JSON patches applied to the pod.

A slim, real version of what the webhook tests build by hand (tests/webhook/helpers.py); used by ``numapin demo``
and the end-to-end tests. The webhook's RFC 6902 patches are applied with the jsonpatch library.
"""

from __future__ import annotations

import base64
import json
import ssl
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
import jsonpatch

__all__ = ["AdmissionAnswer", "AdmissionClient", "PatchError", "apply_patch", "binding_request", "pod_request"]


class PatchError(ValueError):
    """A JSON patch that cannot be applied, or an answer whose patch is not a JSON patch."""


def apply_patch(obj: Any, ops: Sequence[Mapping[str, Any]]) -> Any:
    """``obj`` with the RFC 6902 ``ops`` applied by the jsonpatch library, as the tests apply them (``obj`` itself
    is not changed)."""
    try:
        return jsonpatch.JsonPatch([dict(op) for op in ops]).apply(obj)
    except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as e:
        raise PatchError(f"the webhook's patch does not apply: {e}") from e


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
