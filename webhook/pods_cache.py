"""The pods a binding refers to. A Binding carries only the pod's namespace and name, so the webhook keeps pods.

``PodCache`` maps ``(namespace, name)`` to the pod model (``PodInfo``), bounded (least recently stored dropped
first). It is fed by:

- what this replica saw at validating pods CREATE (the final object, after every mutation; dry-run creates are
  not remembered);
- ``PodDirectorySource``: pod documents in a directory (demo, tests);
- ``PodAPISource`` in a cluster: a watch of the pods not bound yet (field selector ``spec.nodeName=``), so every
  replica knows every pending pod whichever replica saw its creation; a bound pod leaves the watch and the cache.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from allocator.errors import PodSpecError
from allocator.intent import INTENT_ANNOTATION, decode_intent
from allocator.pod import PodInfo

from .nodes import load_documents
from .sources import WATCH_REQUEST_TIMEOUT, WATCH_SECONDS, api_client, poll_until_stopped, watch_until_stopped

__all__ = ["CachedPod", "PodAPISource", "PodCache", "PodDirectorySource", "pod_model"]

log = logging.getLogger("numapin.webhook.pods")


@dataclass(frozen=True)
class CachedPod:
    uid: str
    info: PodInfo
    source: str


def pod_model(pod: Mapping[str, Any], *, namespace: str = "") -> PodInfo:
    """The pod model of a pod object: from its spec; the intent annotation is used when the spec cannot be read.
    Raises PodSpecError."""
    try:
        info = PodInfo.from_pod(pod)
    except PodSpecError:
        meta = pod.get("metadata") if isinstance(pod, Mapping) else None
        ann = meta.get("annotations") if isinstance(meta, Mapping) else None
        text = ann.get(INTENT_ANNOTATION) if isinstance(ann, Mapping) else None
        if not isinstance(text, str):
            raise
        assert isinstance(meta, Mapping)
        info = decode_intent(text, uid=str(meta.get("uid") or ""), namespace=str(meta.get("namespace") or namespace),
                             name=str(meta.get("name") or ""), annotations=ann)  # type: ignore[arg-type]
    if not info.namespace and namespace:
        info = PodInfo(uid=info.uid, namespace=namespace, name=info.name, qos_class=info.qos_class,
                       cpu_manager=info.cpu_manager, bypass=info.bypass, containers=info.containers)
    return info


class PodCache:
    def __init__(self, max_pods: int = 50_000) -> None:
        self.max_pods = max_pods
        self._pods: OrderedDict[tuple[str, str], CachedPod] = OrderedDict()

    def __len__(self) -> int:
        return len(self._pods)

    def get(self, namespace: str, name: str) -> CachedPod | None:
        return self._pods.get((namespace, name))

    def put(self, info: PodInfo, *, uid: str = "", source: str = "admission") -> None:
        key = (info.namespace, info.name)
        self._pods.pop(key, None)
        self._pods[key] = CachedPod(uid=uid or info.uid, info=info, source=source)
        while len(self._pods) > self.max_pods:
            self._pods.popitem(last=False)

    def remember(self, pod: Mapping[str, Any], *, namespace: str = "", source: str = "admission") -> bool:
        """Store a pod object; False (and nothing stored) when it cannot be read or has no name."""
        try:
            info = pod_model(pod, namespace=namespace)
        except PodSpecError as e:
            log.debug("pod not cached: %s", e)
            return False
        if not info.name:
            return False
        self.put(info, source=source)
        return True

    def delete(self, namespace: str, name: str, *, source: str | None = None) -> None:
        entry = self._pods.get((namespace, name))
        if entry is not None and (source is None or entry.source == source):
            del self._pods[(namespace, name)]

    def drop_source(self, source: str, keep: set[tuple[str, str]]) -> None:
        for key in [k for k, v in self._pods.items() if v.source == source and k not in keep]:
            del self._pods[key]


class PodDirectorySource:
    """Pods from the documents (kind Pod) of a directory, polled."""

    name = "pods-directory"

    def __init__(self, cache: PodCache, directory: str | os.PathLike[str], *, poll_seconds: float = 2.0) -> None:
        self.cache = cache
        self.directory = Path(directory)
        self.poll_seconds = poll_seconds
        self._stats: dict[Path, tuple[int, int, int]] = {}
        self._keys: dict[Path, set[tuple[str, str]]] = {}

    def _scan(self) -> list[tuple[Path, list[Mapping[str, Any]] | None]]:
        out: list[tuple[Path, list[Mapping[str, Any]] | None]] = []
        try:
            paths = sorted(p for p in self.directory.iterdir()
                           if p.suffix in (".yaml", ".yml", ".json") and not p.name.startswith(".") and p.is_file())
        except OSError as e:
            log.warning("cannot list %s: %s", self.directory, e)
            return out
        for gone in [p for p in self._stats if p not in paths]:
            out.append((gone, None))
        for p in paths:
            try:
                st = p.stat()
                key = (st.st_ino, st.st_mtime_ns, st.st_size)
                if self._stats.get(p) == key:
                    continue
                docs = [d for d in load_documents(p.read_text(encoding="utf-8"), name=p.name) if d.get("kind") == "Pod"]
            except (OSError, ValueError, yaml.YAMLError, RecursionError) as e:
                log.warning("pod file %s not loaded: %s", p, e)
                continue
            self._stats[p] = key
            out.append((p, docs))
        return out

    async def sync(self) -> None:
        for path, docs in await asyncio.to_thread(self._scan):
            old = self._keys.pop(path, set())
            if docs is None:
                self._stats.pop(path, None)
                for ns, name in old:
                    self.cache.delete(ns, name, source=self.name)
                continue
            keys: set[tuple[str, str]] = set()
            for d in docs:
                meta = d.get("metadata")
                ns = str(meta.get("namespace") or "default") if isinstance(meta, Mapping) else "default"
                if self.cache.remember(d, namespace=ns, source=self.name):
                    keys.add((ns, str(meta.get("name"))))  # type: ignore[union-attr]
            for ns, name in old - keys:
                self.cache.delete(ns, name, source=self.name)
            self._keys[path] = keys

    async def run(self, stop: asyncio.Event) -> None:
        await poll_until_stopped(self.sync, stop, self.poll_seconds, str(self.directory))


class PodAPISource:
    """Watch the pods not bound to a node yet (all namespaces) with kubernetes-asyncio."""

    name = "pods-api"

    def __init__(self, cache: PodCache, *, kubeconfig: str | None = None, retry_seconds: float = 5.0) -> None:
        self.cache = cache
        self.kubeconfig = kubeconfig
        self.retry_seconds = retry_seconds
        self.synced = False  # the first list is in the cache

    async def run(self, stop: asyncio.Event) -> None:
        api = await api_client(self.kubeconfig)
        try:
            # the watch blocks until the server ends it: run it beside ``stop`` so that setting ``stop`` ends it
            task = asyncio.create_task(watch_until_stopped(lambda: self._once(api), stop, self.retry_seconds,
                                                           "pending pods"))
            stopped = asyncio.create_task(stop.wait())
            await asyncio.wait((task, stopped), return_when=asyncio.FIRST_COMPLETED)
            for t in (task, stopped):
                t.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await t
        finally:
            await api.close()

    async def _once(self, api: Any) -> None:
        from kubernetes_asyncio import client, watch

        core = client.CoreV1Api(api)
        selector = "spec.nodeName="
        pods = await core.list_pod_for_all_namespaces(field_selector=selector)
        # the pod model reads v1 Pod dicts (camelCase keys), not the generated model classes
        listing = api.sanitize_for_serialization(pods)
        keep: set[tuple[str, str]] = set()
        for item in listing.get("items", []):
            meta = item.get("metadata", {})
            if self.cache.remember(item, namespace=meta.get("namespace", ""), source=self.name):
                keep.add((meta.get("namespace", ""), meta.get("name", "")))
        self.cache.drop_source(self.name, keep)
        self.synced = True
        rv = listing.get("metadata", {}).get("resourceVersion")
        w = watch.Watch()
        async with w.stream(core.list_pod_for_all_namespaces, field_selector=selector, resource_version=rv,
                            timeout_seconds=WATCH_SECONDS, _request_timeout=WATCH_REQUEST_TIMEOUT) as stream:
            async for event in stream:
                obj = event.get("raw_object")
                if not isinstance(obj, Mapping) or event.get("type") == "BOOKMARK":
                    continue
                meta = obj.get("metadata", {})
                ns, name = meta.get("namespace", ""), meta.get("name", "")
                if event.get("type") == "DELETED":
                    self.cache.delete(ns, name)
                else:
                    self.cache.remember(obj, namespace=ns, source=self.name)
