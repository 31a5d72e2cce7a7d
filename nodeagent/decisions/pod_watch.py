"""The proxy's watch of its own node's pods (field selector ``spec.nodeName=<node>``) on the API server: a change of
``qos.gocrane.io/cpu-manager`` on a running pod becomes a ``ModeRequest``.

Uses the project's API client and list/watch retry loop (``kubeapi``: kubeconfig or in-cluster credentials,
watch timeouts, 410 Gone handling). A pod is handed on when it is first seen (the sink compares with the mode the pod
runs in) and whenever its annotation changes; other updates of the pod (status, labels) are not. A bad value is
logged and skipped (``/validate`` denies it in a cluster with the webhook).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from typing import Any

from allocator.errors import PodSpecError
from allocator.mode_change import parse_target
from allocator.pod import CPU_MANAGER_ANNOTATION, PodInfo
from kubeapi.client import api_client
from kubeapi.watches import run_watches, watch_events
from nodeagent.decisions.mode_request import ModeRequest, ModeSink

__all__ = ["NodePodWatch"]

log = logging.getLogger("numapin.criproxy.watch")


class NodePodWatch:
    """``await NodePodWatch(node, sink, kubeconfig=...).run(stop)`` until ``stop`` is set."""

    def __init__(self, node_name: str, sink: ModeSink, *, kubeconfig: str | None = None,
                 retry_seconds: float = 5.0) -> None:
        if not node_name:
            raise ValueError("the pod watch needs the node's name (--node-name or $NODE_NAME)")
        self.node_name = node_name
        self.sink = sink
        self.kubeconfig = kubeconfig
        self.retry_seconds = retry_seconds
        self.synced = asyncio.Event()  # the first list was handed on
        self._seen: dict[str, str] = {}  # pod uid -> mode last handed on

    async def run(self, stop: asyncio.Event) -> None:
        api = await api_client(self.kubeconfig)
        try:
            await run_watches({f"pods of node {self.node_name}": lambda: self._once(api)}, stop, self.retry_seconds)
        finally:
            await api.close()

    async def _once(self, api: Any) -> None:
        from kubernetes_asyncio import client

        core = client.CoreV1Api(api)
        selector = f"spec.nodeName={self.node_name}"
        listing = api.sanitize_for_serialization(await core.list_pod_for_all_namespaces(field_selector=selector))
        present = set()
        for item in listing.get("items", []):
            present.add(str(item.get("metadata", {}).get("uid", "")))
            await self._pod(item)
        for uid in set(self._seen) - present:
            del self._seen[uid]
        self.synced.set()
        rv = listing.get("metadata", {}).get("resourceVersion")
        async with contextlib.aclosing(watch_events(core.list_pod_for_all_namespaces, field_selector=selector,
                                                    resource_version=rv)) as events:
            async for kind, obj in events:
                if kind == "DELETED":
                    self._seen.pop(str(obj.get("metadata", {}).get("uid", "")), None)
                else:
                    await self._pod(obj)

    async def _pod(self, obj: Mapping[str, Any]) -> None:
        meta = obj.get("metadata")
        if not isinstance(meta, Mapping):
            return
        uid, ns, name = (str(meta.get(k) or "") for k in ("uid", "namespace", "name"))
        ann = meta.get("annotations")
        raw = ann.get(CPU_MANAGER_ANNOTATION) if isinstance(ann, Mapping) else None
        try:
            mode = parse_target(raw)
        except PodSpecError as e:
            log.warning("pod %s/%s: %s; its mode is not changed", ns, name, e)
            return
        first = uid not in self._seen
        if not first and self._seen[uid] == mode:
            return
        try:
            info: PodInfo | None = PodInfo.from_pod(obj)
        except PodSpecError as e:
            log.warning("pod %s/%s: cannot read its spec (%s); mode %s not applied", ns, name, e, mode)
            return
        self._seen[uid] = mode
        try:
            answer = await self.sink(ModeRequest(ns, name, mode, "api", uid=uid, pod=info, first_sight=first))
        except Exception:
            log.exception("pod %s/%s: applying mode %s failed", ns, name, mode)
            self._seen.pop(uid, None)  # tried again at the next event or list
            return
        if answer.outcome == "error":
            self._seen.pop(uid, None)
