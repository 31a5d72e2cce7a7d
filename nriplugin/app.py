"""Wiring of the NRI plugin: the node agent (``nodeagent.app.NodeAgent``: state, allocator, decisions, reconcile,
NodeResourceTopology, /status, /metrics, modes, the control socket) on the runtime's ports (reads over containerd's
CRI socket, record writes into the answers to NRI events), and the NRI session that carries containerd's events to
it (``NriPlugin``: connects, registers, reconnects with back-off)."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from allocator.node import NodeParts
from nodeagent.app import AgentDoor, NodeAgent
from nodeagent.node.cri_runtime import CriChannel, CriRuntime

from .config import NriConfig
from .door.handler import NumapinHandler
from .door.quota import QuotaKeeper
from .door.records import EventRecords
from .plugin import NriPlugin, PluginConfig

if TYPE_CHECKING:
    from .handler import RuntimeInfo

__all__ = ["NriAgent"]

log = logging.getLogger("numapin.nri")


class NriAgent(AgentDoor):
    """``await NriAgent(config).start()`` … ``await agent.stop()``. ``wait()`` returns when the plugin ends (stopped,
    or a runtime that lacks what numapin needs: ``UnsupportedRuntime``)."""

    def __init__(self, config: NriConfig, node: NodeParts | None = None) -> None:
        self.config = config
        # kubelet must talk to the containerd numapin is plugged into (its drift check compares the endpoint)
        # a pinned container's CFS quota is lifted in the kernel only (door.quota): containerd's record, which kubelet
        # reads back as the CPU limit it shows, keeps kubelet's
        self.agent = NodeAgent(config, kubelet_endpoint=config.runtime_endpoint, node=node, quota_in_record=False)
        self.records = EventRecords()
        self.runtime_info: RuntimeInfo | None = None
        self._channel: CriChannel | None = None
        self._handler: NumapinHandler | None = None
        self._plugin: NriPlugin | None = None
        self._run: asyncio.Task[None] | None = None

    @property
    def plugin(self) -> NriPlugin:
        if self._plugin is None:
            raise RuntimeError("the NRI plugin is not started (await NriAgent.start() first)")
        return self._plugin

    def _connected(self, info: RuntimeInfo) -> None:
        self.runtime_info = info

    def door_status(self) -> dict[str, object]:
        """/status's ``door``: the NRI session (connected and synchronized now, how many sessions, why the last
        ones ended, the runtime, the updates waiting for the next event)."""
        plugin = self._plugin
        session = plugin.session if plugin is not None else None
        info = self.runtime_info
        return {
            "kind": "nri",
            "socket": self.config.nri_socket,
            "plugin": f"{self.config.plugin_index}-{self.config.plugin_name}",
            "synchronized": session is not None and session.synchronized.is_set(),
            "connections": plugin.connections if plugin is not None else 0,
            "closed": list(plugin.closed[-5:]) if plugin is not None else [],
            "runtime": None if info is None else f"{info.name} {info.version}",
            "pendingUpdates": self.records.pending,
        }

    async def start(self) -> NriAgent:
        cfg = self.config
        channel = self._channel = CriChannel(cfg.runtime_endpoint)
        await self.agent.start(CriRuntime(channel.call), self.records, view=self)
        quota = None
        if self.agent.config.lift_cfs_quota:
            converger = self.agent.converger
            quota = QuotaKeeper(converger.layout, self.agent.registry, self.agent.pusher.cgroups)
            observe = converger.on_pass

            def after_pass(seconds: float) -> None:  # every convergence pass: the quotas runc put back go again
                observe(seconds)
                quota.sweep_soon()

            converger.on_pass = after_pass
        handler = self._handler = NumapinHandler(self.agent, self.records, reconcile=self.agent.reconcile_once,
                                                 on_connected=self._connected, quota=quota)
        self._plugin = NriPlugin(PluginConfig(cfg.nri_socket, name=cfg.plugin_name, index=cfg.plugin_index),
                                 handler, log=logging.getLogger("numapin.nri"))
        self.agent.begin()
        self._run = asyncio.get_running_loop().create_task(self._plugin.run(), name="numapin-nri-session")
        log.info("numapin nri: plugin %s-%s on %s (reads from %s), topology manager %s/%s, reserved %s",
                 cfg.plugin_index, cfg.plugin_name, cfg.nri_socket, cfg.runtime_endpoint, cfg.topology_manager_policy,
                 cfg.topology_manager_scope,
                 cfg.reserved_cpus if cfg.reserved_cpus is not None else f"{cfg.num_reserved_cpus} CPUs")
        return self

    async def wait(self) -> None:
        """Until the plugin's session loop ends (it raises ``UnsupportedRuntime`` for a runtime it cannot serve)."""
        if self._run is not None:
            await self._run

    async def stop(self) -> None:
        """Stop serving: the loops, the NRI session, the background work; nothing of the plugin runs afterwards."""
        await self.agent.stop_serving()
        if self._plugin is not None:
            await self._plugin.stop()
        if self._run is not None:
            await asyncio.gather(self._run, return_exceptions=True)
        if self._handler is not None:
            await self._handler.stop()
        await self.agent.close()
        if self._channel is not None:
            await self._channel.close()
