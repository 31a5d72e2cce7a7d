"""Wiring of the node agent, the same behind both doors: the node's parts (topology, state files, allocator,
registry, cpuset pusher, convergence, start guard, decisions, modes, resizes), its loops (start-up and periodic
reconcile, NodeResourceTopology publishing, mode changes and the pod watch, kubelet's checks) and what it serves
(the control socket, /status and /metrics).

A door (``criproxy.app.CriProxy``; the NRI plugin) constructs a ``NodeAgent``, ``start``s it with the runtime's
ports (``nodeagent.ports``), opens its own way in (the proxy's relay server), ``begin``s the loops, and at the end
``stop_serving`` (before it closes its way in) and ``close``s it.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc.aio

from allocator.checkpoint import CheckpointStore
from allocator.node import NodeAllocator, NodeConfig, NodeParts, build_node
from allocator.nrt import build_nrt
from allocator.topology import Topology
from nodeagent.config import AgentConfig
from nodeagent.decisions.allocation import PinningOptions
from nodeagent.decisions.cri_pods import rebuild_cri_pods
from nodeagent.decisions.mode_apply import ModeApplier
from nodeagent.decisions.pinning import Pinning
from nodeagent.decisions.pod_events import no_events
from nodeagent.decisions.pod_watch import NodePodWatch
from nodeagent.decisions.reconcile import ReconcileReport, reconcile
from nodeagent.decisions.registry import Registry, Tracked
from nodeagent.decisions.resize import Resizer
from nodeagent.decisions.starts import StartGuard
from nodeagent.decisions.state_files import StateFiles
from nodeagent.node.converge import Converger, Decider, Decision
from nodeagent.node.cpuset_pusher import CpusetPusher
from nodeagent.node.kernel import CgroupLayout, KernelRoots
from nodeagent.node.kubelet_drift import KubeletPaths
from nodeagent.node.kubelet_watch import KubeletWatch
from nodeagent.node.memory_settings import memory_config_of
from nodeagent.node.systemd_cpusets import SystemdCpusets
from nodeagent.ports import RecordWriter, RuntimeCallError, RuntimeReader
from nodeagent.serve.control import ControlServer
from nodeagent.serve.events import EventRecorder
from nodeagent.serve.metrics import ProxyMetrics
from nodeagent.serve.nrt import ApiPublisher, nrt_memory_of, write_nrt
from nodeagent.serve.status import ProxyView, status_document
from nodeagent.serve.unix_socket import SocketInUseError

if TYPE_CHECKING:
    from nodeagent.serve.http_server import ProxyHttpServer

__all__ = ["AgentDoor", "AgentParts", "NodeAgent", "node_parts_of"]

log = logging.getLogger("numapin.criproxy")


def node_parts_of(config: AgentConfig) -> NodeParts:
    """The agent's node, read from sysfs and built once (``build_node``: raises ConfigError / TopologyError)."""
    topology = Topology.from_sysfs(config.sysfs)
    memory = memory_config_of(sysfs=config.sysfs, policy=config.memory_manager_policy,
                              reserved=config.reserved_memory, system_reserved=config.system_reserved,
                              kube_reserved=config.kube_reserved, eviction_hard=config.eviction_hard)
    nc = NodeConfig(topology=topology, reserved_cpus=config.reserved_cpus, num_reserved_cpus=config.num_reserved_cpus,
                    cpu_manager_policy_options=dict(config.cpu_manager_policy_options),
                    topology_manager_policy=config.topology_manager_policy,
                    topology_manager_scope=config.topology_manager_scope,
                    topology_manager_policy_options=dict(config.topology_manager_policy_options),
                    require_reserved_cpus=True,  # kubelet's start-up rule for a node with the static policy
                    memory=memory,
                    pod_level_resource_managers=config.feature_gates.pod_level_resource_managers)
    return build_node(nc)


@dataclass(frozen=True)
class AgentParts:
    """What ``NodeAgent.start`` builds from the machine (its topology, the state file, the cgroup layout) and the
    runtime's ports."""

    node_config: NodeConfig
    store: CheckpointStore
    allocator: NodeAllocator
    runtime: RuntimeReader
    pusher: CpusetPusher
    converger: Converger
    starts: StartGuard
    pinning: Pinning
    modes: ModeApplier
    decider: Decider
    resizer: Resizer


class NodeAgent:
    """``await agent.start(reader, writer)``, ``agent.begin()`` … ``await agent.stop_serving()``, ``await
    agent.close()``. The parts built by ``start`` are read through properties (``agent.allocator``,
    ``agent.pinning``, …) that raise ``RuntimeError`` before it. ``kubelet_endpoint``: the runtime endpoint kubelet
    must use (checked for drift). ``node``: the node already built from ``config`` (``node_parts_of``, as the
    command line does to check it before it starts), else ``start`` builds it."""

    def __init__(self, config: AgentConfig, *, kubelet_endpoint: str, node: NodeParts | None = None,
                 quota_in_record: bool = True) -> None:
        self.config = config
        # True: the start-up and periodic reconciles lift a pinned container's CFS quota in the runtime's record
        # (the proxy, which shows kubelet its own quota in ContainerStatus); False: the door lifts it in the kernel
        # only (NRI: a record update every reconcile would make runc write kubelet's quota back each time)
        self.lift_in_record = config.lift_cfs_quota and quota_in_record
        self._node = node
        self.metrics = ProxyMetrics()
        paths = KubeletPaths(config.kubelet_config, config.kubelet_root_dir, config.proc_root)
        self.kubelet = KubeletWatch(paths, kubelet_endpoint, config.kubelet_check_period,
                                    on_report=self.metrics.set_kubelet_drift)
        self.registry = Registry()
        self.reconciled = asyncio.Event()
        self.last_reconcile: ReconcileReport | None = None
        self.metrics_port: int | None = None
        self.http: ProxyHttpServer | None = None  # with --metrics-address only (start)
        self._tasks: set[asyncio.Task[None]] = set()  # the background tasks (``_spawn``), all cancelled by stop
        self._nrt_dirty = asyncio.Event()
        self._api: ApiPublisher | None = None
        self.events: EventRecorder | None = None  # Events on pods (AgentConfig.events_wanted)
        if config.events_wanted:
            self.events = EventRecorder(config.kubeconfig, config.node_name,
                                        on_dropped=self.metrics.observe_event_dropped,
                                        on_sent=self.metrics.observe_event_sent)
        self._control: ControlServer | None = None
        self._stop_watch = asyncio.Event()
        # numapinStateVersion of the published NRT: unique to this process, bumped on every publication
        self._nrt_epoch = uuid.uuid4().hex[:12]
        self._nrt_generation = 0
        self._first_contact: Callable[[], Awaitable[object]] | None = None
        self._parts: AgentParts | None = None  # built by start()

    def _started(self) -> AgentParts:
        if self._parts is None:
            raise RuntimeError("the proxy is not started (await CriProxy.start() first)")
        return self._parts

    @property
    def node_config(self) -> NodeConfig:
        return self._started().node_config

    @property
    def store(self) -> CheckpointStore:
        return self._started().store

    @property
    def allocator(self) -> NodeAllocator:
        return self._started().allocator

    @property
    def pusher(self) -> CpusetPusher:
        return self._started().pusher

    @property
    def converger(self) -> Converger:
        return self._started().converger

    @property
    def starts(self) -> StartGuard:
        return self._started().starts

    @property
    def pinning(self) -> Pinning:
        return self._started().pinning

    @property
    def modes(self) -> ModeApplier:
        return self._started().modes

    @property
    def resizer(self) -> Resizer:
        return self._started().resizer

    async def start(self, reader: RuntimeReader, writer: RecordWriter, *, view: ProxyView,
                    first_contact: Callable[[], Awaitable[object]] | None = None) -> None:
        """Build the parts on the runtime's ports (``reader``, ``writer``), serve /status (of ``view``, the door)
        and /metrics, check kubelet's configuration. ``first_contact``: awaited before the start-up reconcile (the
        proxy learns the runtime's CRI version there). Nothing is decided before ``begin``'s start-up reconcile."""
        cfg = self.config
        self._first_contact = first_contact
        node = self._node if self._node is not None else await asyncio.to_thread(node_parts_of, cfg)
        node_config = node.config
        files = StateFiles.of(cfg.state_file, cfg.memory_state_file, node)
        store = files.cpu
        cfg.state_file.parent.mkdir(parents=True, exist_ok=True)
        for leftover in await asyncio.to_thread(files.clean_leftovers):
            log.info("removed %s (a state write interrupted by a kill)", leftover)
        allocator = await asyncio.to_thread(files.load, node, kubelet_cpu=cfg.import_kubelet_state,
                                            kubelet_memory=cfg.import_kubelet_memory_state)
        await asyncio.to_thread(files.save, allocator)
        layout = await asyncio.to_thread(CgroupLayout.detect, KernelRoots(Path(cfg.proc_root), Path(cfg.cgroup_root)))
        problem = await asyncio.to_thread(layout.problem)
        if problem is not None:
            log.warning("converge: %s; running containers' cpusets cannot be checked in the kernel", problem)
        # from here to the parts, nothing waits: stop_serving() and close() end what start() opened, however far
        # it got
        direct = problem is None and cfg.cpuset_writes == "kernel"  # write running containers' cgroups directly
        through_systemd = cfg.cgroup_driver == "systemd" or (cfg.cgroup_driver == "auto" and layout.unified)
        pusher = CpusetPusher(writer, self.registry, layout=layout if direct else None,
                              on_resized=lambda: self.converger.kick(),
                              memory_nodes=allocator.container_mems,
                              systemd=SystemdCpusets() if direct and through_systemd else None)
        on_event = self.events.record if self.events is not None else no_events
        converger = Converger(reader, self.registry, pusher, layout, self.decide,
                              period=cfg.converge_period or 3600.0, on_repair=self.metrics.observe_repair,
                              on_pass=self.metrics.observe_converge, on_event=on_event)
        starts = StartGuard(self.registry, converger, self.decide, on_refusal=self.metrics.observe_start_refusal)
        pinning = Pinning(
            node_config, allocator, store, pusher, self.registry,
            PinningOptions(lift_cfs_quota=cfg.lift_cfs_quota, sysfs=cfg.sysfs, self_pod=cfg.self_pod,
                           self_pod_uid=cfg.self_pod_uid, bypass=cfg.bypass, cdi_spec_dirs=cfg.cdi_dirs),
            runtime=reader, memory_store=files.memory,
            ready=self.reconciled,  # admissions wait for the start-up reconcile
            on_change=self._state_changed, on_admitted=self.metrics.observe_admission,
            on_rejected=self.metrics.observe_rejection, on_bypass_ignored=self.metrics.observe_bypass_ignored,
            on_narrow=self.metrics.observe_narrowing, on_cdi_problem=self.metrics.observe_cdi_problem,
            refuse_exclusive=self.kubelet.refusal, on_event=on_event)
        modes = ModeApplier(pinning, reader, self.registry, converger, lift_cfs_quota=cfg.lift_cfs_quota,
                            on_transition=self.metrics.observe_mode_change,
                            on_refusal=self.metrics.observe_mode_refusal,
                            on_rollback=self.metrics.observe_mode_rollback)
        resizer = Resizer(pinning, converger, lift_cfs_quota=cfg.lift_cfs_quota, on_resize=self.metrics.observe_resize)
        modes.resized = resizer.models.get  # a mode changed after a resize works on the resized pod
        self._parts = AgentParts(node_config, store, allocator, reader, pusher, converger, starts, pinning, modes,
                                 Decider(allocator, node_config.topology), resizer)
        if cfg.publish_nrt or cfg.kubeconfig:
            self._api = ApiPublisher(cfg.kubeconfig, on_published=lambda: self.metrics.nrt_published("api"))
        endpoint = cfg.metrics_endpoint()
        if endpoint is not None:
            # aiohttp is imported only for an agent that serves HTTP (a third of the proxy's import time); in a
            # worker thread, as nothing else may hold the loop
            http_server = await asyncio.to_thread(importlib.import_module, "nodeagent.serve.http_server")
            self.http = http_server.ProxyHttpServer(self.metrics.registry, lambda: status_document(view))
            self.metrics_port = await self.http.start(*endpoint)
            log.info("metrics on http://%s:%d/metrics, status on http://%s:%d/status", endpoint[0],
                     self.metrics_port, endpoint[0], self.metrics_port)
        await self.kubelet.check()  # before kubelet's first call: a drift refuses from the start

    def begin(self) -> None:
        """The loops: the start-up reconcile (then the convergence), NRT publishing, mode changes, kubelet's
        checks, the Events on pods."""
        self._nrt_dirty.set()
        self._spawn(self._reconcile_loop(), "reconcile")
        self._spawn(self._nrt_loop(), "nrt")
        self._spawn(self._modes_loop(), "modes")
        self._spawn(self.kubelet.run(), "kubelet-watch")
        if self.events is not None:
            self._spawn(self.events.run(), "events")

    def _spawn(self, work: Coroutine[Any, Any, None], name: str) -> None:
        """The one place background tasks start: each is kept until it ends and cancelled by ``stop_serving``; one
        that fails is logged at once (not when the agent stops)."""
        task = asyncio.get_running_loop().create_task(work, name=f"numapin-criproxy-{name}")
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("background task %s failed", task.get_name(), exc_info=task.exception())

    async def _modes_loop(self) -> None:
        """Changes of a running pod's mode: from the local control socket and the API watch, once the start-up
        reconcile has the node's picture; refused ones are tried again."""
        await self.reconciled.wait()
        cfg = self.config
        path = cfg.control_path
        if path:
            self._control = ControlServer(path, self.modes.request, self.modes.modes)
            try:
                await self._control.start()
            except (OSError, SocketInUseError) as e:
                log.error("control socket %s not opened: %s; `numapin mode` cannot reach this proxy", path, e)
                self._control = None
        if cfg.watch_pods:
            watch = NodePodWatch(cfg.node_name, self.modes.request, kubeconfig=cfg.kubeconfig)
            self._spawn(watch.run(self._stop_watch), "pod-watch")
            log.info("watching the pods of node %s for changes of their CPU mode", cfg.node_name)
        await self.modes.run()

    def _state_changed(self) -> None:
        """The allocation changed: publish the NodeResourceTopology again, retry refused changes of mode."""
        self._nrt_dirty.set()
        if self._parts is not None:
            self._parts.modes.kick()

    def decide(self, t: Tracked) -> Decision | None:
        """What the container must run on now (its pinned CPUs, else the shared pool)."""
        return self._started().decider(t)

    async def reconcile_once(self) -> ReconcileReport:
        if not self.reconciled.is_set() and self._first_contact is not None:
            await self._first_contact()
        async with self.pinning.lock:
            report = await reconcile(
                self._started().runtime, self.node_config.topology, self.allocator, self.registry, self.pusher,
                converger=self.converger, lift_cfs_quota=self.lift_in_record,
                bypass=self.pinning.bypass, creating=self.pinning.creating)
            gone = self.modes.prune({uid for uid in self.registry.sandboxes.values()})
            self.resizer.prune(set(self.registry.sandboxes.values()))
            await self.pinning.save()
            if not self.reconciled.is_set():  # start-up: the CRI pod models (init-container reuse) too
                await rebuild_cri_pods(self._started().runtime, self.allocator, self.registry, self.pinning.bypass)
        if gone:
            log.info("reconcile: forgot the CPU mode set while running of pods gone: %s", ", ".join(gone))
        log.info("reconcile: %s", report)  # after the state is on disk
        self.last_reconcile = report
        self._nrt_dirty.set()
        return report

    async def _reconcile_loop(self) -> None:
        backoff = 0.2
        while not self.reconciled.is_set():
            try:
                await self.reconcile_once()
                await self.starts.note_unstarted()
                self.reconciled.set()
                self._spawn(self.converger.run(), "converge")
                break
            except (grpc.aio.AioRpcError, RuntimeCallError) as e:
                log.warning("reconcile: runtime not reachable (%s: %s); retrying in %.1f s", e.code().name,
                            e.details(), backoff)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 5.0)
        period = self.config.reconcile_period
        while period > 0:
            await asyncio.sleep(period)
            try:
                await self.reconcile_once()
            except (grpc.aio.AioRpcError, RuntimeCallError) as e:
                log.warning("reconcile: runtime not reachable (%s: %s)", e.code().name, e.details())

    def nrt_document(self) -> dict[str, Any]:
        nc = self.node_config
        reserved = self.allocator.reserved_cpus
        return build_nrt(self.config.node_name, nc.topology, free_cpus=self.allocator.state.default_cpuset - reserved,
                         reserved_cpus=reserved, topology_manager_policy=nc.topology_manager_policy,
                         topology_manager_scope=nc.topology_manager_scope,
                         topology_manager_policy_options=nc.topology_manager_policy_options,
                         cpu_manager_policy_options=nc.cpu_manager_policy_options,
                         attributes={"numapinStateVersion": f"{self._nrt_epoch}-{self._nrt_generation}"},
                         **nrt_memory_of(self.allocator))

    async def _nrt_loop(self) -> None:
        while True:
            await self._nrt_dirty.wait()
            self._nrt_dirty.clear()
            self._nrt_generation += 1
            doc = self.nrt_document()
            self.metrics.set_free(self.allocator.free_cpus_per_numa())
            self.metrics.set_memory(self.allocator.memory_state)
            self.metrics.nrt_pending("file")
            try:
                await asyncio.to_thread(write_nrt, self.config.nrt_path, doc)
            except OSError as e:
                log.warning("cannot write %s: %s", self.config.nrt_path, e)
            else:
                self.metrics.nrt_published("file")
            if self._api is not None:
                self.metrics.nrt_pending("api")
                self._api.publish(doc)

    async def stop_serving(self) -> None:
        """Stop /status and /metrics, cancel every background task and wait for it, close the control socket:
        the door closes its way in next."""
        if self.http is not None:
            await self.http.stop()
        self._stop_watch.set()
        while self._tasks:  # a task being cancelled may not start another (``_spawn``), but be sure
            tasks = list(self._tasks)
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self._tasks.difference_update(tasks)
        if self._control is not None:
            await self._control.stop()
            self._control = None

    async def close(self, grace: float | None = 1.0) -> None:
        """After the door closed its way in (no create can abandon CPUs any more): the background give-backs, the
        API publisher, containerd's records behind the kernel, systemd's connection. Nothing of the agent runs
        afterwards."""
        if self._parts is not None:
            await self._parts.pinning.stop_background(1.0 if grace is None else grace)
        if self._api is not None:
            await self._api.close()
        if self.events is not None:
            await self.events.close()
        if self._parts is not None:
            records = self._parts.pusher.records
            if not await records.settle(5.0):
                log.warning("stopping with %d containerd records behind the kernel's cpusets (the next start's "
                            "reconcile brings them up to date)", records.pending)
            if self._parts.pusher.systemd is not None:
                await self._parts.pusher.systemd.close()


class AgentDoor:
    """What a door (the CRI proxy, the NRI plugin) shows of its node agent ``agent``: the agent's parts, read
    through (each raises ``RuntimeError`` before the agent is started). The door's ``/status`` is made of them."""

    agent: NodeAgent

    @property
    def metrics(self) -> ProxyMetrics:
        return self.agent.metrics

    @property
    def kubelet(self) -> KubeletWatch:
        return self.agent.kubelet

    @property
    def registry(self) -> Registry:
        return self.agent.registry

    @property
    def reconciled(self) -> asyncio.Event:
        return self.agent.reconciled

    @property
    def last_reconcile(self) -> ReconcileReport | None:
        return self.agent.last_reconcile

    @property
    def metrics_port(self) -> int | None:
        return self.agent.metrics_port

    @property
    def http(self) -> ProxyHttpServer | None:
        return self.agent.http

    @property
    def node_config(self) -> NodeConfig:
        return self.agent.node_config

    @property
    def store(self) -> CheckpointStore:
        return self.agent.store

    @property
    def allocator(self) -> NodeAllocator:
        return self.agent.allocator

    @property
    def pusher(self) -> CpusetPusher:
        return self.agent.pusher

    @property
    def converger(self) -> Converger:
        return self.agent.converger

    @property
    def starts(self) -> StartGuard:
        return self.agent.starts

    @property
    def pinning(self) -> Pinning:
        return self.agent.pinning

    @property
    def modes(self) -> ModeApplier:
        return self.agent.modes

    @property
    def resizer(self) -> Resizer:
        return self.agent.resizer
