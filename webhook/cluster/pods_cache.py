"""The pods a binding refers to. A Binding carries only the pod's namespace and name, so the webhook keeps pods.

``PodCache`` maps ``(namespace, name)`` to the pod model (``PodInfo``), bounded by an estimate of its memory
(``max_bytes``; least recently stored dropped first). Only sources the operator trusts feed it, never the content
of admission requests (a forged review could otherwise replace a real pod, issue 15):

- ``PodAPISource`` in a cluster: a watch of the pods not bound yet (field selector ``spec.nodeName=``), so every
  replica knows every pending pod whichever replica saw its creation; a bound pod leaves the watch and the cache;
- ``PodDirectorySource``: pod documents in a directory (demo, tests).

``PodFinder`` answers a binding: the cache, else (the scheduler can bind within milliseconds of the creation,
before the watch delivers the pod) a GET of the pod from the API server, or a re-read of the directory, bounded by
``timeout`` seconds; each outcome is counted (``numapin_webhook_pod_lookups_total``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from allocator.errors import PodSpecError
from allocator.intent import INTENT_ANNOTATION, decode_intent
from allocator.pod import PodInfo
from kubeapi.client import api_client
from kubeapi.watches import run_watches, watch_events
from webhook.cluster.nodes import load_documents
from webhook.cluster.polling import poll_until_stopped, settled

__all__ = ["DEFAULT_POD_CACHE_BYTES", "CachedPod", "PodAPISource", "PodCache", "PodDirectorySource", "PodFinder",
           "pod_model"]

log = logging.getLogger("numapin.webhook.pods")


DEFAULT_POD_CACHE_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class CachedPod:
    uid: str
    info: PodInfo
    source: str

    @property
    def cost(self) -> int:
        """Estimated bytes held by the entry (objects, strings, the key), for the cache's bound."""
        info = self.info
        strings = len(self.uid) + len(info.uid) + 2 * (len(info.namespace) + len(info.name))
        return 900 + strings + sum(420 + len(c.name) for c in info.containers)


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
                             name=str(meta.get("name") or ""), annotations=ann)
    if not info.namespace and namespace:
        info = replace(info, namespace=namespace)
    return info


class PodCache:
    def __init__(self, max_bytes: int = DEFAULT_POD_CACHE_BYTES) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self.evicted = 0
        self._pods: OrderedDict[tuple[str, str], CachedPod] = OrderedDict()

    def __len__(self) -> int:
        return len(self._pods)

    def get(self, namespace: str, name: str) -> CachedPod | None:
        return self._pods.get((namespace, name))

    def _pop(self, key: tuple[str, str]) -> None:
        old = self._pods.pop(key, None)
        if old is not None:
            self.bytes -= old.cost

    def put(self, info: PodInfo, *, uid: str = "", source: str) -> None:
        key = (info.namespace, info.name)
        self._pop(key)
        entry = CachedPod(uid=uid or info.uid, info=info, source=source)
        self._pods[key] = entry
        self.bytes += entry.cost
        while self.bytes > self.max_bytes and len(self._pods) > 1:
            oldest = next(iter(self._pods))
            self._pop(oldest)
            self.evicted += 1
            if self.evicted in (1, 10, 100) or self.evicted % 1000 == 0:
                log.warning("pod cache over %d bytes: %d pod(s) dropped so far (their bindings read them from the "
                            "API server)", self.max_bytes, self.evicted)

    def remember(self, pod: Mapping[str, Any], *, namespace: str = "", source: str) -> bool:
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
            self._pop((namespace, name))

    def drop_source(self, source: str, keep: set[tuple[str, str]]) -> None:
        for key in [k for k, v in self._pods.items() if v.source == source and k not in keep]:
            self._pop(key)


class PodDirectorySource:
    """Pods from the documents (kind Pod) of a directory, polled."""

    name = "pods-directory"

    def __init__(self, cache: PodCache, directory: str | os.PathLike[str], *, poll_seconds: float = 2.0) -> None:
        self.cache = cache
        self.directory = Path(directory)
        self.poll_seconds = poll_seconds
        self._stats: dict[Path, tuple[int, int, int] | None] = {}
        self._keys: dict[Path, set[tuple[str, str]]] = {}
        # one scan at a time: the poller's and a cache miss's scans overlapping in threads made the older one take a
        # file the newer one had just read for gone, and drop the pod the miss had found
        self._sync_lock = asyncio.Lock()

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
            self._stats[p] = settled(key)
            out.append((p, docs))
        return out

    async def sync(self) -> None:
        async with self._sync_lock:
            self._apply(await asyncio.to_thread(self._scan))

    def _apply(self, scanned: list[tuple[Path, list[Mapping[str, Any]] | None]]) -> None:
        for path, docs in scanned:
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

    async def run(self, stop: asyncio.Event, *, synced: bool = False) -> None:
        """Poll until ``stop``; ``synced``: the caller has just synced, the first poll comes after ``poll_seconds``
        (not at once: the webhook's start syncs before serving, and a second read right after would re-read every
        file written within the last 2 s)."""
        await poll_until_stopped(self.sync, stop, self.poll_seconds, str(self.directory), wait_first=synced)

    async def fetch(self, namespace: str, name: str) -> str:
        """A cache miss: read the directory again now. ``directory`` when the pod is there, else ``not_found``."""
        await self.sync()
        return "directory" if self.cache.get(namespace, name) is not None else "not_found"


class PodAPISource:
    """Watch the pods not bound to a node yet (all namespaces) with kubernetes-asyncio."""

    name = "pods-api"

    def __init__(self, cache: PodCache, *, kubeconfig: str | None = None, retry_seconds: float = 5.0) -> None:
        self.cache = cache
        self.kubeconfig = kubeconfig
        self.retry_seconds = retry_seconds
        self.synced = False  # the first list is in the cache
        self._api: Any = None

    async def fetch(self, namespace: str, name: str) -> str:
        """A cache miss: GET the pod (the caller bounds the time). ``api`` when found (and cached), ``not_found``
        (404), or ``failed`` (no client yet, or another API error)."""
        if self._api is None:
            return "failed"
        from kubernetes_asyncio import client
        from kubernetes_asyncio.client.exceptions import ApiException

        core = client.CoreV1Api(self._api)
        try:
            pod = await core.read_namespaced_pod(name, namespace)
        except ApiException as e:
            if e.status == 404:
                return "not_found"
            log.warning("GET pod %s/%s failed: %s %s", namespace, name, e.status, e.reason)
            return "failed"
        obj = self._api.sanitize_for_serialization(pod)
        return "api" if self.cache.remember(obj, namespace=namespace, source=self.name) else "unreadable"

    async def run(self, stop: asyncio.Event) -> None:
        api = await api_client(self.kubeconfig)
        self._api = api
        try:
            await run_watches({"pending pods": lambda: self._once(api)}, stop, self.retry_seconds)
        finally:
            self._api = None
            await api.close()

    async def _once(self, api: Any) -> None:
        from kubernetes_asyncio import client

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
        async with contextlib.aclosing(watch_events(core.list_pod_for_all_namespaces, field_selector=selector,
                                                    resource_version=rv)) as events:
            async for kind, obj in events:
                meta = obj.get("metadata", {})
                ns, name = meta.get("namespace", ""), meta.get("name", "")
                if kind == "DELETED":
                    self.cache.delete(ns, name)
                else:
                    self.cache.remember(obj, namespace=ns, source=self.name)


class PodFinder:
    """The pod a binding names: from the cache, else from a source's ``fetch`` within ``timeout`` seconds."""

    def __init__(self, cache: PodCache, sources: Sequence[PodAPISource | PodDirectorySource], *, timeout: float,
                 count: Any) -> None:
        self.cache = cache
        self.sources = tuple(sources)
        self.timeout = timeout
        self._count = count  # count(result): numapin_webhook_pod_lookups_total{result}

    async def find(self, namespace: str, name: str, uid: str | None = None) -> tuple[CachedPod | None, str]:
        """The cached pod (read again when the binding names another uid) and how it was found: ``cache``, ``api``,
        ``directory``, ``not_found``, ``unreadable`` (the pod model cannot read it) or ``failed`` (an error, or nothing
        within the timeout)."""
        cached = self.cache.get(namespace, name)
        if cached is not None and (not uid or not cached.uid or cached.uid == uid):
            self._count("cache")
            return cached, "cache"
        result = "not_found"
        for source in self.sources:
            try:
                async with asyncio.timeout(self.timeout):
                    result = await source.fetch(namespace, name)
            except TimeoutError:
                log.warning("reading pod %s/%s from %s took over %s s", namespace, name, source.name, self.timeout)
                result = "failed"
            except Exception as e:  # the API client's own errors (connection refused, TLS, ...)
                log.warning("reading pod %s/%s from %s failed: %s", namespace, name, source.name, e)
                result = "failed"
            if result in ("api", "directory"):
                break
        self._count(result)
        found = self.cache.get(namespace, name) if result in ("api", "directory") else None
        if found is None and cached is not None:
            return cached, "cache"  # the binding's uid differs and nothing newer was found: the apiserver decides
        return found, result
