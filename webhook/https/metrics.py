"""Prometheus metrics of one webhook server (its own registry: no process-global state)."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

__all__ = ["CONTENT_TYPE", "WebhookMetrics"]

CONTENT_TYPE = CONTENT_TYPE_LATEST

_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class WebhookMetrics:
    """Requests by endpoint and verdict, latency per endpoint, internal errors, certificate and node-source state."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "numapin_webhook_requests", "Admission requests and kube-scheduler filter calls by endpoint and "
            "verdict (allowed, patched, allowed_with_warnings, denied; for filter: passed, filtered, error; "
            "bad_request, unsupported_media_type, too_large).",
            ["endpoint", "verdict"], registry=self.registry)
        self.latency = Histogram(
            "numapin_webhook_request_duration_seconds", "Time to answer an admission request, by endpoint.",
            ["endpoint"], buckets=_BUCKETS, registry=self.registry)
        self.internal_errors = Counter(
            "numapin_webhook_internal_errors", "Requests whose handling raised unexpectedly (answered, not crashed).",
            ["endpoint"], registry=self.registry)
        self.cert_reloads = Counter(
            "numapin_webhook_cert_reloads", "Serving certificate reloads.", registry=self.registry)
        self.cert_not_after = Gauge(
            "numapin_webhook_cert_not_after_seconds", "Expiry of the served certificate (unix time).",
            registry=self.registry)
        self.nodes = Gauge(
            "numapin_webhook_known_nodes", "Nodes with a NodeResourceTopology the webhook knows.",
            registry=self.registry)
        self.pods = Gauge(
            "numapin_webhook_cached_pods", "Pods in the cache used to judge bindings.", registry=self.registry)

        self.pod_cache_bytes = Gauge(
            "numapin_webhook_pod_cache_bytes", "Estimated memory of the pod cache (bounded by --pod-cache-bytes).",
            registry=self.registry)
        self.unjudged = Counter(
            "numapin_webhook_unjudged", "Requests the webhook could not judge, by endpoint, reason (pod_unknown, "
            "node_unknown, node_unsupported, pod_unreadable, internal_error) and the action taken (allow, deny).",
            ["endpoint", "reason", "action"], registry=self.registry)
        self.pod_lookups = Counter(
            "numapin_webhook_pod_lookups", "Pods a binding names, by where they were found: cache, api (a GET after a "
            "cache miss), directory (a re-read of --pods-dir), or not_found, failed (error or timeout).",
            ["result"], registry=self.registry)
        self.connections = Gauge(
            "numapin_webhook_connections", "Open client connections, TLS handshakes in progress included.",
            registry=self.registry)
        self.connections_closed = Counter(
            "numapin_webhook_connections_closed", "Client connections the webhook closed, by why: timeout (headers, "
            "idle keep-alive), evicted (idle, at the connection cap), handshake_failed (TLS handshake failed or took "
            "too long).", ["why"], registry=self.registry)
        self.body_budget_bytes = Gauge(
            "numapin_webhook_inflight_body_bytes", "Bytes reserved by request bodies being read and judged.",
            registry=self.registry)
        self._children: dict[tuple[str, str], tuple[Any, Any]] = {}

    def observe(self, endpoint: str, verdict: str, seconds: float) -> None:
        # the labelled children, looked up once per (endpoint, verdict): ``labels()`` takes a lock and checks its
        # arguments on every call (perf, issue 37); a handful of pairs, never removed
        children = self._children.get((endpoint, verdict))
        if children is None:
            children = self._children[(endpoint, verdict)] = (self.requests.labels(endpoint, verdict),
                                                              self.latency.labels(endpoint))
        children[0].inc()
        children[1].observe(seconds)

    def count(self, endpoint: str, verdict: str) -> float:
        """The current value of a request counter (for tests and the benchmark)."""
        value = self.registry.get_sample_value(
            "numapin_webhook_requests_total", {"endpoint": endpoint, "verdict": verdict})
        return value or 0.0

    def internal_error_count(self) -> float:
        total = 0.0
        for metric in self.internal_errors.collect():
            for sample in metric.samples:
                if sample.name.endswith("_total"):
                    total += sample.value
        return total

    def render(self) -> bytes:
        return generate_latest(self.registry)
