"""Wiring of the proxy: state, allocator, relay, interceptors, reconcile, NodeResourceTopology, metrics."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from pathlib import Path

import grpc.aio

from allocator.checkpoint import CheckpointStore, import_kubelet_state
from allocator.node import NodeAllocator, NodeConfig
from allocator.nrt import build_nrt
from allocator.topology import Topology

from .config import ProxyConfig
from .control import ControlServer
from .converge import Converger, Decider, Decision
from .cri_api import RuntimeApi
from .cri_pods import rebuild_cri_pods
from .kernel import CgroupLayout, KernelRoots
from .metrics import ProxyMetrics
from .mode_apply import ModeApplier
from .narrowing import CpusetPusher
from .nrt import ApiPublisher, write_nrt
from .pinning import Pinning, PinningOptions
from .pod_watch import NodePodWatch
from .reconcile import ReconcileReport, reconcile
from .registry import Registry, Tracked
from .relay import RelayHandler, Upstream
from .server import RelayServer, SocketInUseError, listen_path, start_relay_server
from .starts import StartGuard
from .status import status_from_thread

__all__ = ["CriProxy", "node_config_of"]

log = logging.getLogger("numapin.criproxy")


def node_config_of(config: ProxyConfig) -> NodeConfig:
    """The allocator's node configuration (validated: raises ConfigError / TopologyError)."""
    topology = Topology.from_sysfs(config.sysfs)
    nc = NodeConfig(topology=topology, reserved_cpus=config.reserved_cpus, num_reserved_cpus=config.num_reserved_cpus,
                    cpu_manager_policy_options=dict(config.cpu_manager_policy_options),
                    topology_manager_policy=config.topology_manager_policy,
                    topology_manager_scope=config.topology_manager_scope,
                    topology_manager_policy_options=dict(config.topology_manager_policy_options),
                    require_reserved_cpus=True)  # kubelet's start-up rule for a node with the static policy
    nc.validate()
    return nc


class CriProxy:
    """``await CriProxy(config).start()`` … ``await proxy.stop()``."""

    def __init__(self, config: ProxyConfig) -> None:
        self.config = config
        self.metrics = ProxyMetrics()
        self.registry = Registry()
        self.api = RuntimeApi()  # the runtime's CRI version, for the proxy's own calls
        self.reconciled = asyncio.Event()
        self.last_reconcile: ReconcileReport | None = None
        self.metrics_port: int | None = None
        self._server: RelayServer | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._nrt_dirty = asyncio.Event()
        self._api: ApiPublisher | None = None
        self._control: ControlServer | None = None
        self._stop_watch = asyncio.Event()
        # numapinStateVersion of the published NRT: unique to this process, bumped on every publication
        self._nrt_epoch = uuid.uuid4().hex[:12]
        self._nrt_generation = 0

    async def start(self) -> CriProxy:
        cfg = self.config
        self.node_config = await asyncio.to_thread(node_config_of, cfg)
        self.store = CheckpointStore(cfg.state_file, "numapin")
        cfg.state_file.parent.mkdir(parents=True, exist_ok=True)
        for leftover in await asyncio.to_thread(self.store.clean_leftovers):
            log.info("removed %s (a state write interrupted by a kill)", leftover)
        state = await asyncio.to_thread(self.store.load)
        if state is None and cfg.import_kubelet_state:
            state = await asyncio.to_thread(import_kubelet_state, cfg.import_kubelet_state)
            log.info("imported kubelet's CPU manager state from %s", cfg.import_kubelet_state)
        self.allocator = NodeAllocator(self.node_config, state)
        self._decider = Decider(self.allocator, self.node_config.topology)
        await asyncio.to_thread(self.store.save, self.allocator.state)
        self.upstream = Upstream(cfg.runtime_endpoint)
        layout = await asyncio.to_thread(CgroupLayout.detect, KernelRoots(Path(cfg.proc_root), Path(cfg.cgroup_root)))
        problem = await asyncio.to_thread(layout.problem)
        if problem is not None:
            log.warning("converge: %s; running containers' cpusets cannot be checked in the kernel", problem)
        direct = problem is None and cfg.cpuset_writes == "kernel"  # write running containers' cgroups directly
        self.pusher = CpusetPusher(self.upstream, self.registry, layout=layout if direct else None,
                                   on_resized=lambda: self.converger.kick(), api=self.api)
        self.converger = Converger(self.upstream, self.registry, self.pusher, layout, self.decide,
                                   period=cfg.converge_period or 3600.0, on_repair=self.metrics.observe_repair,
                                   on_pass=self.metrics.observe_converge)
        self.starts = StartGuard(self.registry, self.converger, self.decide,
                                 on_refusal=self.metrics.observe_start_refusal)
        self.pinning = Pinning(
            self.node_config, self.allocator, self.store, self.pusher, self.registry,
            PinningOptions(lift_cfs_quota=cfg.lift_cfs_quota, sysfs=cfg.sysfs, self_pod=cfg.self_pod,
                           self_pod_uid=cfg.self_pod_uid),
            api=self.api, ready=self.reconciled,  # admissions wait for the start-up reconcile
            on_change=self._state_changed, on_decision=self.metrics.observe_decision,
            on_narrow=self.metrics.observe_narrowing)
        self.modes = ModeApplier(self.pinning, self.upstream, self.registry, self.converger,
                                 lift_cfs_quota=cfg.lift_cfs_quota, on_transition=self.metrics.observe_mode_change,
                                 on_refusal=self.metrics.observe_mode_refusal)
        interceptors = dict(self.pinning.interceptors())
        interceptors["StartContainer"] = self.starts.start_container
        # kubelet's own cpuset-bearing update is sent with the pool gate held (shared): never between a
        # narrowing's decision and its updates, which would put the wide pool back
        interceptors["UpdateContainerResources"] = self.starts.gated(interceptors["UpdateContainerResources"])
        handler = RelayHandler(self.upstream, interceptors, observe=self.metrics.observe_call)
        if cfg.publish_nrt or cfg.kubeconfig:
            self._api = ApiPublisher(cfg.kubeconfig)
        endpoint = cfg.metrics_endpoint()
        if endpoint is not None:
            loop = asyncio.get_running_loop()
            self.metrics_port = self.metrics.serve(*endpoint, status=lambda: status_from_thread(self, loop))
            log.info("metrics on http://%s:%d/metrics, status on http://%s:%d/status", endpoint[0],
                     self.metrics_port, endpoint[0], self.metrics_port)
        self._server = await start_relay_server(listen_path(cfg.listen), handler)
        log.info("numapin criproxy listening on %s, runtime %s, topology manager %s/%s, reserved %s",
                 cfg.listen, cfg.runtime_endpoint, cfg.topology_manager_policy, cfg.topology_manager_scope,
                 cfg.reserved_cpus if cfg.reserved_cpus is not None else f"{cfg.num_reserved_cpus} CPUs")
        self._nrt_dirty.set()
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(self._reconcile_loop()))
        self._tasks.append(loop.create_task(self._nrt_loop()))
        self._tasks.append(loop.create_task(self._modes_loop()))
        return self

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
            self._tasks.append(asyncio.get_running_loop().create_task(watch.run(self._stop_watch)))
            log.info("watching the pods of node %s for changes of their CPU mode", cfg.node_name)
        await self.modes.run()

    def _state_changed(self) -> None:
        """The allocation changed: publish the NodeResourceTopology again, retry refused changes of mode."""
        self._nrt_dirty.set()
        if hasattr(self, "modes"):
            self.modes.kick()

    def decide(self, t: Tracked) -> Decision | None:
        """What the container must run on now (its pinned CPUs, else the shared pool)."""
        return self._decider(t)

    async def reconcile_once(self) -> ReconcileReport:
        if not self.reconciled.is_set():
            await self.api.detect(self.upstream.call)  # the CRI version the proxy's own calls use
        async with self.pinning.lock:
            report = await reconcile(
                self.upstream, self.node_config.topology, self.allocator, self.registry, self.pusher,
                converger=self.converger, lift_cfs_quota=self.config.lift_cfs_quota,
                self_pod=self.pinning.self_pod, api=self.api, creating=self.pinning.creating)
            gone = self.modes.prune({uid for uid in self.registry.sandboxes.values()})
            await self.pinning.save()
            if not self.reconciled.is_set():  # start-up: the CRI pod models (init-container reuse) too
                await rebuild_cri_pods(self.upstream, self.api, self.allocator, self.registry, self.pinning.self_pod)
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
                self._tasks.append(asyncio.get_running_loop().create_task(self.converger.run()))
                break
            except grpc.aio.AioRpcError as e:
                log.warning("reconcile: runtime not reachable (%s: %s); retrying in %.1f s", e.code().name,
                            e.details(), backoff)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 5.0)
        period = self.config.reconcile_period
        while period > 0:
            await asyncio.sleep(period)
            try:
                await self.reconcile_once()
            except grpc.aio.AioRpcError as e:
                log.warning("reconcile: runtime not reachable (%s: %s)", e.code().name, e.details())

    def nrt_document(self) -> dict:
        nc = self.node_config
        reserved = self.allocator.reserved_cpus
        return build_nrt(self.config.node_name, nc.topology, free_cpus=self.allocator.state.default_cpuset - reserved,
                         reserved_cpus=reserved, topology_manager_policy=nc.topology_manager_policy,
                         topology_manager_scope=nc.topology_manager_scope,
                         topology_manager_policy_options=nc.topology_manager_policy_options,
                         cpu_manager_policy_options=nc.cpu_manager_policy_options,
                         attributes={"numapinStateVersion": f"{self._nrt_epoch}-{self._nrt_generation}"})

    async def _nrt_loop(self) -> None:
        while True:
            await self._nrt_dirty.wait()
            self._nrt_dirty.clear()
            self._nrt_generation += 1
            doc = self.nrt_document()
            self.metrics.set_free(self.allocator.free_cpus_per_numa())
            try:
                await asyncio.to_thread(write_nrt, self.config.nrt_path, doc)
            except OSError as e:
                log.warning("cannot write %s: %s", self.config.nrt_path, e)
            if self._api is not None:
                self._api.publish(doc)

    async def wait(self) -> None:
        if self._server is not None:
            await self._server.wait_for_termination()

    async def stop(self, grace: float | None = 1.0) -> None:
        self._stop_watch.set()
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        self._tasks.clear()
        if self._control is not None:
            await self._control.stop()
            self._control = None
        if self._server is not None:
            await self._server.stop(grace)
            self._server = None
        if self._api is not None:
            await self._api.close()
        if hasattr(self, "pusher") and not await self.pusher.records.settle(5.0):
            log.warning("stopping with %d containerd records behind the kernel's cpusets (the next start's "
                        "reconcile brings them up to date)", self.pusher.records.pending)
        if hasattr(self, "upstream"):
            await self.upstream.close()
        self.metrics.close()
