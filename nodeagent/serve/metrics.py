"""Prometheus metrics of the proxy, in a registry of its own (served by ``http_server`` on ``/metrics``)."""

from __future__ import annotations

import time
from collections.abc import Mapping

import grpc
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from allocator.memory.state import MemoryState
from nodeagent.node.kubelet_drift import CPU_STATIC, ENDPOINT, MEMORY_STATIC, DriftReport

__all__ = ["ProxyMetrics"]

_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


class ProxyMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.allocations = Counter("numapin_criproxy_allocations", "Containers admitted, by mode",
                                   ["mode"], registry=r)
        self.rejections = Counter("numapin_criproxy_rejections", "Containers rejected by admission",
                                  ["reason"], registry=r)
        self.relay_seconds = Histogram("numapin_criproxy_relay_seconds", "Relayed CRI calls, by method",
                                       ["method", "code"], buckets=_LATENCY_BUCKETS, registry=r)
        self.narrowing_seconds = Histogram("numapin_criproxy_narrowing_seconds",
                                           "Time to resize the shared pool's containers", buckets=_LATENCY_BUCKETS,
                                           registry=r)
        self.repairs = Counter("numapin_criproxy_cpuset_repairs",
                               "Running containers whose real cpuset (kernel) was not the decision and was "
                               "re-applied, by trigger and result", ["trigger", "result"], registry=r)
        self.converge_seconds = Histogram("numapin_criproxy_converge_seconds",
                                          "One pass reading every running container's cpuset from the kernel",
                                          buckets=_LATENCY_BUCKETS, registry=r)
        self.start_refusals = Counter("numapin_criproxy_start_refusals",
                                      "Exclusive containers not started: their CPUs were still used by another "
                                      "running container", registry=r)
        self.connections_turned_away = Counter("numapin_criproxy_connections_turned_away",
                                               "Client connections told GOAWAY at once: the frame relay served "
                                               "--max-connections already", registry=r)
        self.connections_closed = Counter("numapin_criproxy_connections_closed",
                                          "Client connections the frame relay closed for what they cost: idle (asked "
                                          "to go, then closed), frames (more frames per second than allowed), memory "
                                          "(bytes held beyond a connection's bounds)", ["why"], registry=r)
        self.bypass_ignored = Counter("numapin_criproxy_bypass_ignored",
                                      "Containers of pods annotated numapin.io/bypass outside --bypass-namespaces: "
                                      "the annotation was ignored, by the pod's namespace", ["namespace"], registry=r)
        self.mode_changes = Counter("numapin_criproxy_mode_changes",
                                    "Running pods moved to another CPU mode (qos.gocrane.io/cpu-manager), by modes",
                                    ["from", "to"], registry=r)
        self.mode_refusals = Counter("numapin_criproxy_mode_refusals",
                                     "Changes of a running pod's CPU mode the node refused, by kubelet's reason",
                                     ["reason"], registry=r)
        self.mode_rollbacks = Counter("numapin_criproxy_mode_rollbacks",
                                      "Changes of a running pod's CPU mode rolled back because the shared pool could "
                                      "not be narrowed off the new exclusive CPUs, by modes", ["from", "to"],
                                      registry=r)
        self.resizes = Counter("numapin_criproxy_resizes",
                               "kubelet's in-place resizes of tracked containers (UpdateContainerResources with a new "
                               "CPU size), by result: resized, refused, rolled-back", ["result"], registry=r)
        self.resize_seconds = Histogram("numapin_criproxy_resize_seconds",
                                        "From a resize call's arrival to the kernel showing the new cpusets (or the "
                                        "refusal)", buckets=_LATENCY_BUCKETS, registry=r)
        self.cdi_problems = Counter("numapin_criproxy_cdi_unresolved",
                                    "CDI devices of created containers that gave no NUMA hint (malformed name, in "
                                    "no readable spec, unreadable or invalid spec), by reason", ["reason"],
                                    registry=r)
        self.kubelet_drift = Gauge("numapin_criproxy_kubelet_drift",
                                   "kubelet's configuration drifted from what numapin needs (1), by kind: "
                                   "cpu-manager-static, memory-manager-static (new exclusive admissions are refused), "
                                   "runtime-endpoint (kubelet's calls bypass the proxy)", ["kind"], registry=r)
        self.memory_bytes = Gauge("numapin_criproxy_memory_bytes",
                                  "Memory and huge pages per NUMA node as the Memory Manager accounts them "
                                  "(memoryManagerPolicy Static), by resource (memory, hugepages-<size>) and kind "
                                  "(allocatable, reserved by containers, free)", ["numa_node", "resource", "kind"],
                                  registry=r)
        self.free_cpus = Gauge("numapin_criproxy_free_cpus", "Allocatable CPUs not assigned, by NUMA node",
                               ["numa_node"], registry=r)
        self.nrt_unpublished_since = Gauge("numapin_criproxy_nrt_unpublished_since_seconds",
                                           "Unix time since when the newest NodeResourceTopology waits to be "
                                           "written, by target (file, api); 0 while it is published",
                                           ["target"], registry=r)
        self.events_sent = Counter("numapin_criproxy_events_sent",
                                   "Events on pods sent to the API server, by action: created (a new Event), patched "
                                   "(a repeat counted on the existing Event)", ["action"], registry=r)
        self.events_dropped = Counter("numapin_criproxy_events_dropped",
                                      "Events on pods not recorded, by why: rate-limited (the pod's burst spent), "
                                      "queue-full (the API server too slow), unreachable, refused (by the API server)",
                                      ["why"], registry=r)
        self._nrt_waiting: dict[str, float] = {}  # target -> since when its newest document waits

    def observe_call(self, method: str, seconds: float, code: grpc.StatusCode) -> None:
        self.relay_seconds.labels(method.rsplit("/", 1)[-1], code.name).observe(seconds)

    def observe_admission(self, mode: str) -> None:
        self.allocations.labels(mode).inc()

    def observe_rejection(self, reason: str) -> None:
        self.rejections.labels(reason).inc()

    def observe_narrowing(self, seconds: float) -> None:
        self.narrowing_seconds.observe(seconds)

    def observe_repair(self, trigger: str, ok: bool) -> None:
        self.repairs.labels(trigger, "repaired" if ok else "failed").inc()

    def observe_converge(self, seconds: float) -> None:
        self.converge_seconds.observe(seconds)

    def observe_connection_turned_away(self) -> None:
        self.connections_turned_away.inc()

    def observe_connection_closed(self, why: str) -> None:
        self.connections_closed.labels(why).inc()

    def observe_bypass_ignored(self, namespace: str) -> None:
        self.bypass_ignored.labels(namespace).inc()

    def observe_start_refusal(self) -> None:
        self.start_refusals.inc()

    def observe_mode_change(self, old: str, new: str) -> None:
        self.mode_changes.labels(old, new).inc()

    def observe_mode_refusal(self, reason: str) -> None:
        self.mode_refusals.labels(reason).inc()

    def observe_mode_rollback(self, old: str, new: str) -> None:
        self.mode_rollbacks.labels(old, new).inc()

    def observe_resize(self, result: str, seconds: float) -> None:
        self.resizes.labels(result).inc()
        self.resize_seconds.observe(seconds)

    def observe_event_sent(self, action: str) -> None:
        self.events_sent.labels(action).inc()

    def observe_event_dropped(self, why: str) -> None:
        self.events_dropped.labels(why).inc()

    def observe_cdi_problem(self, reason: str) -> None:
        self.cdi_problems.labels(reason).inc()

    def set_kubelet_drift(self, report: DriftReport) -> None:
        kinds = {p.kind for p in report.problems}
        for kind in (CPU_STATIC, MEMORY_STATIC, ENDPOINT):
            self.kubelet_drift.labels(kind).set(1 if kind in kinds else 0)

    def set_memory(self, state: MemoryState | None) -> None:
        """The Memory Manager's tables (nothing with memoryManagerPolicy None)."""
        if state is None:
            return
        for node, ns in state.machine.items():
            for resource, t in ns.memory.items():
                for kind, value in (("allocatable", t.allocatable), ("reserved", t.reserved), ("free", t.free)):
                    self.memory_bytes.labels(str(node), resource, kind).set(value)

    def nrt_pending(self, target: str) -> None:
        """A new NodeResourceTopology for ``target``: pending since now, unless an older one still waits."""
        if target not in self._nrt_waiting:
            self._nrt_waiting[target] = time.time()
            self.nrt_unpublished_since.labels(target).set(self._nrt_waiting[target])

    def nrt_published(self, target: str) -> None:
        self._nrt_waiting.pop(target, None)
        self.nrt_unpublished_since.labels(target).set(0)

    def set_free(self, free: Mapping[int, int]) -> None:
        for node, n in free.items():
            self.free_cpus.labels(str(node)).set(n)
