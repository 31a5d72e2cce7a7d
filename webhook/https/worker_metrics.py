"""One scrape of ``/metrics`` reports every worker of ``numapin webhook --workers N``.

The workers share the port, so a scrape lands on one of them. Each worker also answers its own metrics on a unix
socket, ``worker-<pid>.sock`` in a directory the supervisor made for them (``--worker-metrics-dir``); the worker a
scrape lands on asks the others there (at most ``timeout`` seconds) and answers them all merged:

- counters and histograms (and their ``_created`` times, the earliest) are summed over the workers: the webhook's
  requests, latencies, errors, as one process would count them;
- gauges are per process (connections, bytes in flight, nodes known, pods cached, certificate expiry): one sample
  per worker, labelled ``worker="<pid>"``;
- ``numapin_webhook_workers_scraped`` says how many workers are in the answer; a worker that did not answer is
  logged and left out, so the sums may drop for a scrape (a counter reset to Prometheus, which ``rate`` handles).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable, Iterable
from pathlib import Path

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

__all__ = ["WorkerMetrics", "merge"]

log = logging.getLogger("numapin.webhook.metrics")

_SUMMED = ("counter", "histogram", "summary")


def _socket(directory: Path, pid: int) -> Path:
    return directory / f"worker-{pid}.sock"


class _Fixed:
    """A collector answering fixed families (what ``generate_latest`` writes out)."""

    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterable[Metric]:
        return self._families


def merge(texts: dict[int, bytes]) -> bytes:
    """The expositions of the workers (by pid) as one: counters and histograms summed, gauges labelled by worker."""
    families: dict[str, Metric] = {}
    values: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]] = {}
    for pid, text in sorted(texts.items()):
        for family in text_string_to_metric_families(text.decode()):
            out = families.setdefault(family.name, Metric(family.name, family.documentation, family.type))
            acc = values.setdefault(family.name, {})
            for s in family.samples:
                if family.type in _SUMMED:
                    key = (s.name, tuple(sorted(s.labels.items())))
                    acc[key] = acc.get(key, 0.0) + s.value
                elif family.name.endswith("_created"):  # when a counter or histogram started: the earliest
                    key = (s.name, tuple(sorted(s.labels.items())))
                    acc[key] = min(acc.get(key, s.value), s.value)
                else:
                    out.samples.append(Sample(s.name, {**s.labels, "worker": str(pid)}, s.value))
    for name, acc in values.items():
        families[name].samples.extend(Sample(n, dict(labels), v) for (n, labels), v in acc.items())
    scraped = Metric("numapin_webhook_workers_scraped", "Webhook worker processes whose metrics this answer holds "
                     "(--workers).", "gauge")
    scraped.samples.append(Sample("numapin_webhook_workers_scraped", {}, float(len(texts))))
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Fixed([*families.values(), scraped]))
    return generate_latest(registry)


class WorkerMetrics:
    """A worker's side: its own metrics on its socket, and everyone's on a scrape."""

    def __init__(self, directory: Path, render: Callable[[], bytes], *, timeout: float = 1.0) -> None:
        self.directory = directory
        self.render = render
        self.timeout = timeout
        self.pid = os.getpid()
        self.path = _socket(directory, self.pid)
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/metrics", self._own)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()  # left by a worker of this pid before (pids are reused)
        await web.UnixSite(self._runner, str(self.path)).start()

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    async def _own(self, request: web.Request) -> web.StreamResponse:
        return web.Response(body=self.render(), content_type="text/plain")

    async def _peer(self, path: Path) -> bytes | None:
        try:
            async with asyncio.timeout(self.timeout), aiohttp.ClientSession(
                    connector=aiohttp.UnixConnector(path=str(path))) as s, s.get("http://worker/metrics") as r:
                if r.status == 200:
                    return await r.read()
                log.warning("worker metrics at %s answered %s", path, r.status)
        except (aiohttp.ClientError, OSError, TimeoutError) as e:
            log.warning("worker metrics at %s not read: %s", path, e or type(e).__name__)
        return None

    async def scrape(self) -> bytes:
        """Every worker's metrics, merged (``merge``)."""
        peers = {}
        for path in self.directory.glob("worker-*.sock"):
            pid = path.name.removeprefix("worker-").removesuffix(".sock")
            if pid.isdigit() and int(pid) != self.pid:
                peers[int(pid)] = path
        answers: list[bytes | None] = list(await asyncio.gather(*(self._peer(p) for p in peers.values())))
        texts = {pid: text for pid, text in zip(peers, answers, strict=True) if text is not None}
        texts[self.pid] = self.render()
        return merge(texts)

