"""The --pods-dir source under a racing poller: a pod written to the directory is found by the cache miss that
follows, whatever the poller is doing at that moment (its scans and the miss's used to overlap and drop the pod)."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import yaml

from webhook.pods_cache import PodCache, PodDirectorySource


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
