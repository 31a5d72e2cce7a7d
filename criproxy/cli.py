"""``numapin criproxy``: run the CRI proxy (kubelet -> numapin -> containerd)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from typing import TYPE_CHECKING, Any

from allocator.errors import AllocatorError
from criproxy.config import DEFAULTS, ProxyConfig, load_config
from nodeagent.cli import add_agent_arguments, configure

if TYPE_CHECKING:
    from allocator.node import NodeParts

HELP = "run the CRI proxy that pins containers (kubelet's runtime endpoint)"
DESCRIPTION = """\
Run numapin's CRI proxy. kubelet (cpuManagerPolicy: none) uses --listen as its container runtime
endpoint; every CRI call is forwarded to --runtime-endpoint, and CreateContainer, UpdateContainerResources,
StartContainer, RemoveContainer, StopPodSandbox and RemovePodSandbox are intercepted to pin CPUs and NUMA
memory. Every running container's real cpuset is read from the kernel (cgroup files and /proc/<pid>/status)
each --converge-period and repaired where it is not numapin's decision.

A running pod's CPU mode (qos.gocrane.io/cpu-manager) can change: with --watch-pods the proxy watches its node's
pods on the API server (credentials from --kubeconfig or in-cluster); on every node `numapin mode` can ask for a
change through the root-only --control-socket.

Flags override the --config file (YAML or JSON, keys named like the flags). Bad configuration exits 2.
"""

_FLAGS: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("--listen", "listen", {"help": f"unix socket to serve CRI on (default {DEFAULTS.listen})"}),
    ("--runtime-endpoint", "runtime_endpoint", {"help": f"containerd's CRI socket (default "
                                                         f"{DEFAULTS.runtime_endpoint})"}),
    ("--relay", "relay", {"choices": ("frames", "grpc"),
                          "help": "how calls reach the runtime: frames (HTTP/2 frames copied between kubelet's "
                                  "and the runtime's connections, decoded only for the intercepted methods) or "
                                  f"grpc (a gRPC server and channel in the proxy) (default {DEFAULTS.relay})"}),
    ("--max-connections", "max_connections",
     {"help": "clients (kubelet's connections) the frame relay serves at once, two file descriptors each; one "
              "beyond is told GOAWAY and closed, logged and counted in numapin_criproxy_connections_turned_away "
              "(default 0: as many as the open-files limit allows, which the proxy raises to its hard limit; what "
              "each connection may cost is bounded instead, see docs/node.md)"}),
    ("--connection-idle-timeout", "connection_idle_timeout",
     {"help": "seconds a client connection may stay without a call in flight and without sending anything before "
              "it is asked to go (GOAWAY, no call lost; a gRPC client reconnects for its next call) and closed "
              f"(default {DEFAULTS.connection_idle_timeout:.0f}; 0: never)"}),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_agent_arguments(parser)
    for flag, dest, kw in _FLAGS:
        parser.add_argument(flag, dest=dest, default=None, **kw)


def run(args: argparse.Namespace) -> int:
    loaded = configure(args, _FLAGS, load_config, "criproxy")
    if isinstance(loaded, int):
        return loaded
    config, parts = loaded
    from criproxy.relay.conn_limits import raise_descriptor_limit
    raise_descriptor_limit()  # connections are bounded by their cost, not by a count (conn_limits)
    return asyncio.run(_serve(config, parts))


async def _serve(config: ProxyConfig, parts: NodeParts) -> int:
    from allocator.errors import CheckpointError
    from criproxy.app import CriProxy
    from criproxy.relay.socket_server import SocketInUseError

    proxy = CriProxy(config, parts)
    try:
        await proxy.start()
    except (SocketInUseError, CheckpointError, AllocatorError, OSError) as e:
        print(f"numapin criproxy: {e}", file=sys.stderr)
        await proxy.stop()
        return 1
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    logging.getLogger("numapin.criproxy").info("stopping")
    await proxy.stop()
    return 0
