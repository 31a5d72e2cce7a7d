"""Where the webhook learns the nodes' topology: NodeResourceTopology objects (and Node labels).

``NodeStore`` holds the parsed NRTs by node name and the nodes' labels, and answers "which nodes could this pod
go to" (``spec.nodeName`` and ``spec.nodeSelector`` narrow the candidates). Two sources fill it:

- ``DirectorySource`` (the default): every ``*.yaml``/``*.yml``/``*.json`` file of a directory (a mounted ConfigMap,
  the demo, the tests), each holding one or more documents (YAML multi-document, or a ``List``) of kind
  ``NodeResourceTopology`` or ``Node`` (for labels). The directory is polled; changed files are re-read off the
  event loop. A file that cannot be parsed is logged and its previous documents are kept.
- ``APISource``: list and watch ``noderesourcetopologies.topology.node.k8s.io`` and Nodes from the API server with
  kubernetes-asyncio (in-cluster config, or a kubeconfig), re-listing after a watch ends or fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from allocator.errors import TopologyError
from allocator.nrt import NRT_GROUP, NRT_KIND, NRT_PLURAL, NRT_VERSION, NodeTopology, parse_nrt
from kubeapi.client import api_client
from kubeapi.watches import WATCH_REQUEST_TIMEOUT, WATCH_SECONDS, run_watches, watch_events
from webhook.cluster.node_index import NodeIndex, ShapeGroup
from webhook.cluster.polling import poll_until_stopped, settled

__all__ = ["APISource", "DirectorySource", "NodeStore", "load_documents"]

log = logging.getLogger("numapin.webhook.nodes")


class NodeStore:
    """The known nodes: NRTs by name, and labels by node name (from Node objects, else the NRT's own labels)."""

    def __init__(self) -> None:
        self._nrt: dict[str, NodeTopology] = {}
        self._labels: dict[str, dict[str, str]] = {}
        self._synced: set[str] = set()
        self._sources: set[str] = set()
        self._told: dict[str, tuple[str, ...]] = {}  # assumptions last logged per node
        self._index = NodeIndex()
        self.version = 0

    # -- source side ----------------------------------------------------------------------------------------
    def register(self, source: str) -> None:
        self._sources.add(source)

    def mark_synced(self, source: str) -> None:
        self._synced.add(source)

    @property
    def synced(self) -> bool:
        return self._sources <= self._synced

    def replace(self, nrts: Iterable[NodeTopology], labels: Mapping[str, Mapping[str, str]]) -> None:
        self._nrt = {n.name: n for n in nrts}
        self._labels = {k: dict(v) for k, v in labels.items()}
        self._told = {k: v for k, v in self._told.items() if k in self._nrt}
        for node in self._nrt.values():
            self._tell(node)
        self._reindex()
        self.version += 1

    def put(self, node: NodeTopology) -> None:
        self._nrt[node.name] = node
        self._tell(node)
        self._index.put(node, self.labels(node.name))
        self.version += 1

    def _tell(self, node: NodeTopology) -> None:
        """Log what the webhook assumes to judge a node, once per node and set of assumptions."""
        if node.assumptions and self._told.get(node.name) != node.assumptions:
            self._told[node.name] = node.assumptions
            log.warning("node %s: judging its pods from a NodeResourceTopology that leaves things out; assumed: %s",
                        node.name, "; ".join(node.assumptions))
        elif not node.assumptions:
            self._told.pop(node.name, None)

    def delete(self, name: str) -> None:
        self._told.pop(name, None)
        if self._nrt.pop(name, None) is not None:
            self._index.delete(name)
            self.version += 1

    def put_labels(self, name: str, labels: Mapping[str, str]) -> None:
        self._labels[name] = dict(labels)
        self._reindex_labels(name)
        self.version += 1

    def replace_labels(self, labels: Mapping[str, Mapping[str, str]]) -> None:
        """All Nodes' labels at once (a fresh list): labels of Nodes not in it are dropped."""
        self._labels = {k: dict(v) for k, v in labels.items()}
        self._reindex()
        self.version += 1

    def delete_labels(self, name: str) -> None:
        if self._labels.pop(name, None) is not None:
            self._reindex_labels(name)
            self.version += 1

    def _reindex(self) -> None:
        self._index = NodeIndex()
        for name, node in self._nrt.items():
            self._index.put(node, self.labels(name))

    def _reindex_labels(self, name: str) -> None:
        node = self._nrt.get(name)
        if node is not None:
            self._index.put(node, self.labels(name))

    # -- query side -----------------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._nrt)

    def get(self, name: str) -> NodeTopology | None:
        return self._nrt.get(name)

    def names(self) -> list[str]:
        return sorted(self._nrt)

    def labels(self, name: str) -> Mapping[str, str]:
        labels = self._labels.get(name)
        if labels is not None:
            return labels
        node = self._nrt.get(name)
        base = dict(node.labels) if node is not None else {}
        base.setdefault("kubernetes.io/hostname", name)
        return base

    def candidate_groups(self, pod: Mapping[str, Any]) -> tuple[int, list[ShapeGroup]]:
        """How many known nodes the pod may land on (``candidates``), grouped by shape and free CPUs (from the
        index: no scan of the nodes)."""
        spec = pod.get("spec") if isinstance(pod, Mapping) else None
        spec = spec if isinstance(spec, Mapping) else {}
        node_name = spec.get("nodeName")
        if isinstance(node_name, str) and node_name:
            names = {node_name} if node_name in self._nrt else set()
        else:
            selector = spec.get("nodeSelector")
            if isinstance(selector, Mapping) and selector:
                names = self._index.matching({str(k): str(v) for k, v in selector.items()})
            else:
                return len(self._nrt), self._index.groups()
        return len(names), (self._index.groups(names) if names else [])

    def candidates(self, pod: Mapping[str, Any]) -> list[NodeTopology]:
        """The known nodes the pod may land on: its ``spec.nodeName`` if set, those matching ``nodeSelector``."""
        spec = pod.get("spec") if isinstance(pod, Mapping) else None
        spec = spec if isinstance(spec, Mapping) else {}
        node_name = spec.get("nodeName")
        if isinstance(node_name, str) and node_name:
            node = self._nrt.get(node_name)
            return [node] if node is not None else []
        selector = spec.get("nodeSelector")
        nodes = [self._nrt[n] for n in sorted(self._nrt)]
        if isinstance(selector, Mapping) and selector:
            want = {str(k): str(v) for k, v in selector.items()}
            nodes = [n for n in nodes if all(self.labels(n.name).get(k) == v for k, v in want.items())]
        return nodes


# -- documents ----------------------------------------------------------------------------------------------
def load_documents(text: str, *, name: str) -> list[Mapping[str, Any]]:
    """The objects in a YAML or JSON text (multi-document YAML and ``kind: *List`` expanded)."""
    if name.endswith(".json"):
        docs: list[Any] = [json.loads(text)]
    else:
        docs = list(yaml.safe_load_all(text))
    out: list[Mapping[str, Any]] = []
    for d in docs:
        if d is None:
            continue
        if not isinstance(d, Mapping):
            raise ValueError(f"{name}: a document is not a mapping")
        kind = d.get("kind")
        if isinstance(kind, str) and kind.endswith("List") and isinstance(d.get("items"), list):
            out.extend(i for i in d["items"] if isinstance(i, Mapping))
        else:
            out.append(d)
    return out


@dataclass(frozen=True)
class _FileContent:
    nrts: tuple[NodeTopology, ...]
    labels: Mapping[str, Mapping[str, str]]


def _read_file(path: Path) -> _FileContent:
    docs = load_documents(path.read_text(encoding="utf-8"), name=path.name)
    nrts: list[NodeTopology] = []
    labels: dict[str, Mapping[str, str]] = {}
    for i, d in enumerate(docs):
        kind = d.get("kind")
        if kind == NRT_KIND:
            try:
                nrts.append(parse_nrt(d))
            except TopologyError as e:
                raise ValueError(f"{path.name} document {i}: {e}") from None
        elif kind == "Node":
            meta = d.get("metadata")
            if isinstance(meta, Mapping) and isinstance(meta.get("name"), str):
                raw = meta.get("labels")
                labels[meta["name"]] = {str(k): str(v) for k, v in raw.items()} if isinstance(raw, Mapping) else {}
    return _FileContent(tuple(nrts), labels)


def _stat(path: Path) -> tuple[int, int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)


class DirectorySource:
    """Keeps a NodeStore equal to the documents of a directory, polling it."""

    name = "directory"

    def __init__(self, store: NodeStore, directory: str | os.PathLike[str], *, poll_seconds: float = 2.0) -> None:
        self.store = store
        self.directory = Path(directory)
        self.poll_seconds = poll_seconds
        self._files: dict[Path, tuple[tuple[int, int, int] | None, _FileContent]] = {}
        self.errors: dict[Path, str] = {}
        store.register(self.name)

    def _scan(self) -> bool:
        """Re-read changed files (runs in a worker thread). True when something changed."""
        changed = False
        try:
            paths = sorted(p for p in self.directory.iterdir()
                           if p.suffix in (".yaml", ".yml", ".json") and not p.name.startswith(".") and p.is_file())
        except OSError as e:
            msg = f"cannot list {self.directory}: {e}"
            if self.errors.get(self.directory) != msg:
                log.warning("%s", msg)
            self.errors[self.directory] = msg
            return False
        self.errors.pop(self.directory, None)
        seen = set(paths)
        for gone in [p for p in self._files if p not in seen]:
            del self._files[gone]
            changed = True
        for p in paths:
            st = _stat(p)
            prev = self._files.get(p)
            if prev is not None and prev[0] == st:
                continue
            try:
                content = _read_file(p)
            except (OSError, ValueError, yaml.YAMLError, RecursionError) as e:
                msg = str(e)
                if self.errors.get(p) != msg:
                    log.warning("node topology file %s not loaded: %s", p, msg)
                self.errors[p] = msg
                if prev is not None:
                    self._files[p] = (st, prev[1])  # keep what it held; retry when it changes again
                continue
            self.errors.pop(p, None)
            self._files[p] = (settled(st), content)
            changed = True
        return changed

    def _publish(self) -> None:
        nrts: dict[str, NodeTopology] = {}
        labels: dict[str, Mapping[str, str]] = {}
        for _, content in self._files.values():
            for n in content.nrts:
                nrts[n.name] = n
            labels.update(content.labels)
        self.store.replace(nrts.values(), labels)

    async def sync(self) -> None:
        if await asyncio.to_thread(self._scan) or not self.store.synced:
            self._publish()
        self.store.mark_synced(self.name)

    async def run(self, stop: asyncio.Event, *, synced: bool = False) -> None:
        """Poll until ``stop``; ``synced``: the caller has just synced, the first poll comes after ``poll_seconds``
        (not at once: the webhook's start syncs before serving, and a second read right after would re-read every
        file written within the last 2 s)."""
        await poll_until_stopped(self.sync, stop, self.poll_seconds, str(self.directory), wait_first=synced)


class APISource:
    """List and watch NRTs and Nodes from the API server (kubernetes-asyncio)."""

    name = "api"

    def __init__(self, store: NodeStore, *, kubeconfig: str | None = None, watch_nodes: bool = True,
                 retry_seconds: float = 5.0) -> None:
        self.store = store
        self.kubeconfig = kubeconfig
        self.watch_nodes = watch_nodes
        self.retry_seconds = retry_seconds
        store.register(self.name)
        if watch_nodes:
            store.register(self.name + "/nodes")

    async def _client(self) -> Any:
        return await api_client(self.kubeconfig)

    async def run(self, stop: asyncio.Event) -> None:
        api = await self._client()
        try:
            watches: dict[str, Callable[[], Awaitable[None]]] = {
                "NodeResourceTopologies": lambda: self._nrt_once(api)}
            if self.watch_nodes:
                watches["Nodes"] = lambda: self._nodes_once(api)
            await run_watches(watches, stop, self.retry_seconds)
        finally:
            await api.close()

    async def _nrt_once(self, api: Any) -> None:
        from kubernetes_asyncio import client

        custom = client.CustomObjectsApi(api)
        listing = await custom.list_cluster_custom_object(NRT_GROUP, NRT_VERSION, NRT_PLURAL)
        nrts = []
        for item in listing.get("items", []):
            try:
                nrts.append(parse_nrt({"kind": NRT_KIND, "apiVersion": f"{NRT_GROUP}/{NRT_VERSION}", **item}))
            except TopologyError as e:
                log.warning("NodeResourceTopology ignored: %s", e)
        current = {n.name: n for n in nrts}
        for name in self.store.names():
            if name not in current:
                self.store.delete(name)
        for n in nrts:
            self.store.put(n)
        self.store.mark_synced(self.name)
        rv = listing.get("metadata", {}).get("resourceVersion")
        async with contextlib.aclosing(watch_events(custom.list_cluster_custom_object, NRT_GROUP, NRT_VERSION,
                                                    NRT_PLURAL, resource_version=rv)) as events:
            async for kind, obj in events:
                name = obj.get("metadata", {}).get("name")
                if kind == "DELETED" and isinstance(name, str):
                    self.store.delete(name)
                    continue
                try:
                    self.store.put(parse_nrt(obj))
                except TopologyError as e:
                    log.warning("NodeResourceTopology %s ignored: %s", name, e)

    async def _nodes_once(self, api: Any) -> None:
        from kubernetes_asyncio import client, watch

        core = client.CoreV1Api(api)
        listing = await core.list_node()
        # a relist replaces every Node's labels: a Node deleted while not watching must not keep its old labels
        self.store.replace_labels({node.metadata.name: node.metadata.labels or {} for node in listing.items})
        self.store.mark_synced(self.name + "/nodes")
        w = watch.Watch()
        async with w.stream(core.list_node, resource_version=listing.metadata.resource_version,
                            timeout_seconds=WATCH_SECONDS, _request_timeout=WATCH_REQUEST_TIMEOUT) as stream:
            async for event in stream:
                node = event.get("object")
                if event.get("type") == "BOOKMARK" or getattr(node, "metadata", None) is None:
                    continue
                if event.get("type") == "DELETED":
                    self.store.delete_labels(node.metadata.name)
                else:
                    self.store.put_labels(node.metadata.name, node.metadata.labels or {})
