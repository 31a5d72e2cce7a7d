"""Publishing the node's NodeResourceTopology (``topology.node.k8s.io/v1alpha2``, built by
``allocator.nrt.build_nrt``, the layout the webhook reads): written atomically to a file on every change, and
to the API server when credentials are given.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from allocator.memory.report import nrt_memory, nrt_memory_attributes
from allocator.node import NodeAllocator
from allocator.nrt import NRT_GROUP, NRT_PLURAL, NRT_VERSION
from kubeapi.client import api_client as kube_api_client

__all__ = ["ApiPublisher", "nrt_memory_of", "write_nrt"]

log = logging.getLogger("numapin.criproxy")

def nrt_memory_of(allocator: NodeAllocator) -> dict[str, Any]:
    """``build_nrt``'s memory arguments for the node: with ``memoryManagerPolicy: Static`` every zone's memory
    and huge pages (capacity, allocatable, available), the policy and the zones' group attributes; nothing with
    ``None`` (memory is not accounted, the zones carry CPUs only)."""
    state = allocator.memory_state
    if state is None:
        return {}
    return {"memory": nrt_memory(state), "memory_manager_policy": "Static",
            "zone_attributes": nrt_memory_attributes(state)}


def write_nrt(path: str | os.PathLike[str], doc: Mapping[str, Any]) -> None:
    """Write ``doc`` as JSON atomically (temp file, rename): a reader sees the old document or the new one. Not
    synced to disk: the document is derived from the checkpoint (which is) and written again at every start, and an
    fsync per pool change would queue behind, or ahead of, the next admission's checkpoint on the same disk."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(f".{p.name}.tmp")
    data = (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)
    os.replace(tmp, p)


class ApiPublisher:
    """Keeps the NodeResourceTopology object on the API server equal to the latest document (create or
    replace), from a kubeconfig file or in-cluster credentials. Publishing runs in the background; only the
    newest document is sent."""

    def __init__(self, kubeconfig: str | None, *, on_published: Callable[[], None] = lambda: None) -> None:
        self.kubeconfig = kubeconfig
        self.on_published = on_published  # the newest document is on the API server
        self._latest: dict[str, Any] | None = None
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._client: Any = None  # kubernetes-asyncio's ApiClient, made on the first publication

    def publish(self, doc: dict[str, Any]) -> None:
        self._latest = doc
        self._wake.set()
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:  # tests/k8s runs it against a real API server, tests/criproxy a small one
        from kubernetes_asyncio import client
        from kubernetes_asyncio.client.rest import ApiException

        backoff = 1.0
        while True:
            await self._wake.wait()
            self._wake.clear()
            doc = self._latest
            if doc is None:
                continue
            try:
                if self._client is None:
                    self._client = await kube_api_client(self.kubeconfig)
                api = client.CustomObjectsApi(self._client)
                name = doc["metadata"]["name"]
                try:
                    cur = await api.get_cluster_custom_object(NRT_GROUP, NRT_VERSION, NRT_PLURAL, name)
                    body = dict(doc, metadata=dict(doc["metadata"],
                                                   resourceVersion=cur["metadata"]["resourceVersion"]))
                    await api.replace_cluster_custom_object(NRT_GROUP, NRT_VERSION, NRT_PLURAL, name, body)
                except ApiException as e:
                    if e.status != 404:
                        raise
                    await api.create_cluster_custom_object(NRT_GROUP, NRT_VERSION, NRT_PLURAL, doc)
                backoff = 1.0
                if self._latest is doc:
                    self.on_published()
            except Exception as e:
                log.warning("NodeResourceTopology publish failed (retrying in %.0f s): %s", backoff, e)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 60.0)
                self._wake.set()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._client is not None:
            await self._client.close()
            self._client = None
