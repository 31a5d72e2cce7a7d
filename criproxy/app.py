"""Wiring of the proxy: the node agent (``nodeagent.app.NodeAgent``: state, allocator, decisions, reconcile,
NodeResourceTopology, metrics) on the runtime's ports over the proxy's channel, the relay and its interceptors."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from allocator.node import NodeParts
from criproxy.config import ProxyConfig
from criproxy.intercept.interceptors import ProxyInterceptors
from criproxy.relay.conn_limits import ConnectionLimits
from criproxy.relay.cri_api import RuntimeApi
from criproxy.relay.frame_server import FrameRelayServer
from criproxy.relay.grpc_relay import RelayHandler, Upstream
from criproxy.relay.relays import start_relay
from criproxy.relay.socket_server import RelayServer, listen_path
from nodeagent.app import AgentDoor, NodeAgent, node_parts_of
from nodeagent.decisions.reconcile import ReconcileReport
from nodeagent.decisions.registry import Tracked
from nodeagent.node.converge import Decision
from nodeagent.node.cri_runtime import CriRuntime

if TYPE_CHECKING:

    pass

__all__ = ["CriProxy", "node_parts_of"]

log = logging.getLogger("numapin.criproxy")


class CriProxy(AgentDoor):
    """``await CriProxy(config).start()`` … ``await proxy.stop()``: a node agent (``agent``) and the relay that
    kubelet calls. The agent's parts are read through properties (``proxy.allocator``, ``proxy.pinning``, …) that
    raise ``RuntimeError`` before ``start``. ``node``: the node already built from ``config`` (``node_parts_of``,
    as the command line does to check it before it starts), else ``start`` builds it."""

    def __init__(self, config: ProxyConfig, node: NodeParts | None = None) -> None:
        self.config = config
        self.agent = NodeAgent(config, kubelet_endpoint=config.listen, node=node)
        self.api = RuntimeApi()  # the runtime's CRI version, for the proxy's own calls
        self._upstream: Upstream | None = None
        self._server: RelayServer | FrameRelayServer | None = None

    @property
    def upstream(self) -> Upstream:
        if self._upstream is None:
            raise RuntimeError("the proxy is not started (await CriProxy.start() first)")
        return self._upstream

    async def start(self) -> CriProxy:
        cfg = self.config
        upstream = self._upstream = Upstream(cfg.runtime_endpoint)
        # the node agent's ports: reads and record writes
        runtime = CriRuntime(lambda m, r, t: upstream.call(m, r, timeout=t), self.api.method)
        # the CRI version the proxy's own calls use, learnt before the start-up reconcile
        await self.agent.start(runtime, runtime, view=self, first_contact=lambda: self.api.detect(upstream.call))
        interceptors = ProxyInterceptors(self.pinning, self.resizer, self.starts, self.api)
        handler = RelayHandler(upstream, interceptors.table(), observe=self.metrics.observe_call,
                               pass_through=interceptors.pass_through())
        self._server = await start_relay(
            listen_path(cfg.listen), handler, cfg.relay,
            limits=ConnectionLimits(max_connections=cfg.max_connections, idle_timeout=cfg.connection_idle_timeout),
            on_turned_away=self.metrics.observe_connection_turned_away,
            on_closed=self.metrics.observe_connection_closed)
        log.info("numapin criproxy listening on %s (%s relay), runtime %s, topology manager %s/%s, reserved %s, "
                 "feature gates %s",
                 cfg.listen, cfg.relay, cfg.runtime_endpoint, cfg.topology_manager_policy, cfg.topology_manager_scope,
                 cfg.reserved_cpus if cfg.reserved_cpus is not None else f"{cfg.num_reserved_cpus} CPUs",
                 cfg.feature_gates.to_text())
        self.agent.begin()
        return self

    def decide(self, t: Tracked) -> Decision | None:
        """What the container must run on now (its pinned CPUs, else the shared pool)."""
        return self.agent.decide(t)

    async def reconcile_once(self) -> ReconcileReport:
        return await self.agent.reconcile_once()

    def nrt_document(self) -> dict[str, Any]:
        return self.agent.nrt_document()

    async def wait(self) -> None:
        if self._server is not None:
            await self._server.wait_for_termination()

    async def stop(self, grace: float | None = 1.0) -> None:
        """Stop serving, cancel every background task and wait for it: nothing of the proxy runs afterwards."""
        await self.agent.stop_serving()
        if self._server is not None:
            await self._server.stop(grace)
            self._server = None
        await self.agent.close(grace)  # after the relay: no create can abandon CPUs any more
        if self._upstream is not None:
            await self._upstream.close()
