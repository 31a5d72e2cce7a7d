"""Wires the webhook together: TLS, metrics, node and pod sources, decisions, the HTTPS server."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from allocator.bypass import BypassPolicy
from allocator.feature_gates import FeatureGates
from webhook.admission.binding import BindingValidator
from webhook.admission.extender_filter import ExtenderFilter
from webhook.admission.mutate import is_pod_request, mutate_review
from webhook.admission.resize import ResizeValidator, is_resize_request
from webhook.admission.review import AdmissionRequest, Verdict
from webhook.admission.simulate import Simulator
from webhook.admission.unjudged import UnjudgedAction, UnjudgedRule
from webhook.admission.validate import PodValidator
from webhook.cluster.nodes import APISource, DirectorySource, NodeStore
from webhook.cluster.pods_cache import DEFAULT_POD_CACHE_BYTES, PodAPISource, PodCache, PodDirectorySource, PodFinder
from webhook.https.heap import settle
from webhook.https.limits import ServerLimits
from webhook.https.metrics import WebhookMetrics
from webhook.https.server import DEFAULT_MAX_BODY, ServerConfig, WebhookServer
from webhook.https.tls import CertReloader
from webhook.https.warmup import warm_up
from webhook.https.worker_metrics import WorkerMetrics

__all__ = ["WebhookApp", "WebhookOptions"]

log = logging.getLogger("numapin.webhook")


@dataclass(frozen=True)
class WebhookOptions:
    cert: Path
    key: Path
    host: str = "0.0.0.0"
    port: int = 8443
    nrt_dir: Path | None = None
    pods_dir: Path | None = None
    kubeconfig: str | None = None
    in_cluster: bool = False
    max_body: int = DEFAULT_MAX_BODY
    cert_poll_seconds: float = 5.0
    nrt_poll_seconds: float = 2.0
    limits: ServerLimits = field(default_factory=ServerLimits)
    client_ca: Path | None = None
    reuse_port: bool = False  # a worker of ``numapin webhook --workers N``
    unjudged: UnjudgedAction = "allow"
    pod_lookup_timeout: float = 1.0
    pod_cache_bytes: int = DEFAULT_POD_CACHE_BYTES
    # the process is the webhook's own (``numapin webhook``): after the first load, freeze its heap out of the
    # garbage collector's full passes (``heap.settle``); off for a webhook embedded in another process (tests)
    settle_heap: bool = False
    bypass: BypassPolicy = field(default_factory=BypassPolicy)  # who may set numapin.io/bypass (allocator.bypass)
    worker_metrics_dir: Path | None = None  # a worker of ``--workers N``: where the workers answer each other's metrics
    feature_gates: FeatureGates = field(default_factory=FeatureGates)  # the kubelets' --feature-gates it simulates


class WebhookApp:
    """The running webhook: server plus the background sources."""

    def __init__(self, opts: WebhookOptions) -> None:
        self.opts = opts
        self.metrics = WebhookMetrics()
        self.nodes = NodeStore()
        self.pods = PodCache(max_bytes=opts.pod_cache_bytes)
        self.simulator = Simulator(pod_level_managers=opts.feature_gates.pod_level_resource_managers)
        self.unjudged = UnjudgedRule(opts.unjudged, self.metrics)
        self.sources: list[Any] = []
        pod_sources: list[PodAPISource | PodDirectorySource] = []
        if opts.nrt_dir is not None:
            self.sources.append(DirectorySource(self.nodes, opts.nrt_dir, poll_seconds=opts.nrt_poll_seconds))
        if opts.pods_dir is not None:
            pod_sources.append(PodDirectorySource(self.pods, opts.pods_dir, poll_seconds=opts.nrt_poll_seconds))
        if opts.kubeconfig or opts.in_cluster:
            self.sources.append(APISource(self.nodes, kubeconfig=opts.kubeconfig))
            pod_sources.append(PodAPISource(self.pods, kubeconfig=opts.kubeconfig))
        self.sources.extend(pod_sources)
        self.pod_finder = PodFinder(self.pods, pod_sources, timeout=opts.pod_lookup_timeout,
                                    count=lambda result: self.metrics.pod_lookups.labels(result).inc())
        self.pod_validator = PodValidator(self.nodes, self.simulator, self.unjudged, opts.bypass)
        self.resize_validator = ResizeValidator(self.nodes, self.simulator)
        self.binding_validator = BindingValidator(self.nodes, self.pod_finder, self.simulator, self.unjudged)
        self.extender_filter = ExtenderFilter(self.binding_validator, self.unjudged)
        self.reloader = CertReloader(opts.cert, opts.key)
        self.server = WebhookServer(
            reloader=self.reloader, mutate=self.mutate, validate=self.validate, metrics=self.metrics,
            config=ServerConfig(host=opts.host, port=opts.port, max_body=opts.max_body,
                                cert_poll_seconds=opts.cert_poll_seconds, limits=opts.limits,
                                client_ca=str(opts.client_ca) if opts.client_ca else None,
                                reuse_port=opts.reuse_port),
            ready_checks=(self._nodes_ready, self._warmed), unjudged=self.unjudged,
            extender_filter=self.extender_filter.filter,
        )
        self.worker_metrics: WorkerMetrics | None = None
        if opts.worker_metrics_dir is not None:  # one scrape reports every worker
            self.worker_metrics = WorkerMetrics(opts.worker_metrics_dir, self.server.render_metrics)
            self.server.scrape = self.worker_metrics.scrape
        self.metrics.nodes.set_function(lambda: len(self.nodes))
        self.metrics.pods.set_function(lambda: len(self.pods))
        self.metrics.pod_cache_bytes.set_function(lambda: self.pods.bytes)
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self.prepared = asyncio.Event()  # warmed up and heap settled, after the node sources' first sync

    def _warmed(self) -> tuple[bool, str]:
        if not self.prepared.is_set():
            return False, "warming up the decision paths"
        return True, "ok"

    def _nodes_ready(self) -> tuple[bool, str]:
        if not self.nodes.synced:
            return False, "node topology source not synced yet"
        return True, "ok"

    @property
    def port(self) -> int | None:
        return self.server.port

    async def mutate(self, req: AdmissionRequest) -> Verdict:
        return await mutate_review(req, pod_level_managers=self.simulator.pod_level_managers)

    async def validate(self, req: AdmissionRequest) -> Verdict:
        if req.group == "" and req.resource == "pods" and req.sub_resource == "binding":
            return await self.binding_validator.validate(req)
        if is_resize_request(req):
            return await self.resize_validator.validate(req)
        if is_pod_request(req):
            return await self.pod_validator.validate(req)
        log.info("validate: not handled, allowed: %s", req.describe())
        return Verdict.allow()

    async def start(self) -> None:
        # first sync of the directory sources before serving, so /readyz turns ready at once
        for s in self.sources:
            if isinstance(s, DirectorySource | PodDirectorySource):
                await s.sync()
        for s in self.sources:
            self._tasks.append(asyncio.create_task(self._run_source(s)))
        if self.nodes.synced:  # directory sources only: ready when serving starts
            await self._prepare()
        else:
            self._tasks.append(asyncio.create_task(self._prepare_when_synced()))
        await self.server.start()
        if self.worker_metrics is not None:
            await self.worker_metrics.start()

    async def _prepare(self) -> None:
        """Once the node sources have synced: one synthetic review through each decision path, then the heap
        settled (``heap.settle``), so the first seconds of traffic pay for neither; /readyz waits for it."""
        try:
            warmed = await warm_up(parser=self.server.parser, mutate=self.mutate, validate=self.validate,
                                   nodes=self.nodes, simulator=self.simulator)
            log.info("warmed up in %.1f ms (mutate %s, validate %s)", warmed.seconds * 1000, *warmed.verdicts)
        except Exception:  # a warm-up is an optimisation: serving goes on, the first requests pay
            log.exception("warming up the decision paths failed; serving without it")
        if self.opts.settle_heap:
            settled = settle()
            log.info("heap settled: %d objects frozen out of the garbage collector's full passes (%d collected, "
                     "%.1f ms)", settled.frozen_objects, settled.collected, settled.seconds * 1000)
        self.prepared.set()

    async def _prepare_when_synced(self) -> None:
        while not self.nodes.synced:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), timeout=0.05)
            if self._stop.is_set():
                return
        await self._prepare()

    async def _run_source(self, source: Any) -> None:
        try:
            if isinstance(source, DirectorySource | PodDirectorySource):
                await source.run(self._stop, synced=True)  # synced by ``start``
            else:
                await source.run(self._stop)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("source %s stopped", type(source).__name__)

    async def stop(self) -> None:
        self._stop.set()
        if self.worker_metrics is not None:
            await self.worker_metrics.stop()
        await self.server.stop()
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        self._tasks.clear()
