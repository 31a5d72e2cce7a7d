"""The --pods-dir source under a racing poller: a pod written to the directory is found by the cache miss that
follows, whatever the poller is doing at that moment (its scans and the miss's used to overlap and drop the pod)."""

from __future__ import annotations

import asyncio
import os
import random
from pathlib import Path

import yaml

from tests.webhook.nrt_fixtures import machine, nrt
from webhook.cluster.nodes import DirectorySource, NodeStore
from webhook.cluster.pods_cache import PodCache, PodDirectorySource


def _pod(name: str) -> dict[str, object]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default", "uid": f"u-{name}"},
            "spec": {"containers": [{"name": "app", "resources": {"requests": {"cpu": "1"}}}]}}


async def test_a_written_pod_is_found_by_the_next_miss_while_the_poller_runs(tmp_path: Path) -> None:
    rng = random.Random(5)
    cache = PodCache()
    source = PodDirectorySource(cache, tmp_path, poll_seconds=0.0)
    stop = asyncio.Event()
    poller = asyncio.create_task(source.run(stop))
    try:
        for i in range(150):
            name = f"p{i}"
            await asyncio.sleep(rng.random() * 0.004)
            (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(_pod(name)))
            assert await source.fetch("default", name) == "directory", name
            await asyncio.sleep(rng.random() * 0.004)
            assert cache.get("default", name) is not None, f"{name} dropped after it was found"
    finally:
        stop.set()
        await poller


def _rewrite_in_the_same_tick(path: Path, text: str) -> None:
    """Rewrite ``path`` in place (same inode) with ``text`` of the same size and give it back its old mtime: what a
    rewrite within the file system's timestamp granularity looks like to stat()."""
    st = path.stat()
    assert len(text.encode()) == st.st_size
    path.write_text(text)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    again = path.stat()
    assert (again.st_ino, again.st_mtime_ns, again.st_size) == (st.st_ino, st.st_mtime_ns, st.st_size)


async def test_a_pod_file_rewritten_in_the_same_tick_is_read_again(tmp_path: Path) -> None:
    cache = PodCache()
    source = PodDirectorySource(cache, tmp_path)
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(_pod("aaaa")))
    await source.sync()
    assert cache.get("default", "aaaa") is not None
    _rewrite_in_the_same_tick(path, yaml.safe_dump(_pod("bbbb")))
    await source.sync()
    assert cache.get("default", "bbbb") is not None and cache.get("default", "aaaa") is None


async def test_a_topology_file_rewritten_in_the_same_tick_is_read_again(tmp_path: Path) -> None:
    store = NodeStore()
    source = DirectorySource(store, tmp_path)
    path = tmp_path / "n.yaml"
    path.write_text(yaml.safe_dump_all([nrt("n1", machine(2, 2), version="a-1")], sort_keys=False))
    await source.sync()
    assert (node := store.get("n1")) is not None and node.state_version == "a-1"
    _rewrite_in_the_same_tick(path, yaml.safe_dump_all([nrt("n1", machine(2, 2), version="a-3")], sort_keys=False))
    await source.sync()
    assert (node := store.get("n1")) is not None and node.state_version == "a-3"
