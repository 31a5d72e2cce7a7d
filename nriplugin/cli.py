"""``numapin nri``: run numapin as an NRI plugin inside containerd (kubelet untouched)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from typing import TYPE_CHECKING, Any

from allocator.errors import AllocatorError
from nodeagent.cli import add_agent_arguments, configure

from .config import DEFAULTS, NriConfig, load_config

if TYPE_CHECKING:
    from allocator.node import NodeParts

HELP = "run numapin as a containerd NRI plugin that pins containers (no kubelet change)"
DESCRIPTION = """\
Run numapin as an NRI (Node Resource Interface) plugin of containerd 1.7 or 2.x. kubelet keeps its own runtime
endpoint (containerd) and cpuManagerPolicy: none; containerd calls numapin on every container's creation, start,
update (kubelet's in-place resize), stop and removal, and numapin answers with the container's cpuset.cpus and
cpuset.mems and the shared pool's new cpusets: the same decisions as `numapin criproxy` (the same flags, state
files, /status, /metrics, NodeResourceTopology, pod watch and control socket). A topology refusal or a refused
resize fails kubelet's call with numapin's reason.

containerd must have NRI enabled (2.x: on by default; 1.7: [plugins."io.containerd.nri.v1.nri"] disable = false).
The plugin connects to --nri-socket, registers as --plugin-index-plugin-name and reconnects with back-off when
containerd restarts. It reads containers' states over containerd's CRI socket (--runtime-endpoint, read-only
calls). While the plugin is not connected containerd creates containers without numapin's cpusets; when it is
back, every running container is converged (docs/nri.md: what each mode guarantees).

Flags override the --config file (YAML or JSON, keys named like the flags). Bad configuration exits 2; a runtime
whose NRI lacks what numapin needs exits 1 with what is missing.
"""

_FLAGS: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("--nri-socket", "nri_socket", {"help": f"containerd's NRI socket (default {DEFAULTS.nri_socket})"}),
    ("--plugin-name", "plugin_name", {"help": f"the plugin's name in containerd (default {DEFAULTS.plugin_name})"}),
    ("--plugin-index", "plugin_index",
     {"help": "two digits: containerd calls plugins in ascending index order; numapin must be the only plugin "
              f"that sets cpusets (default {DEFAULTS.plugin_index})"}),
    ("--runtime-endpoint", "runtime_endpoint",
     {"help": f"containerd's CRI socket, for reads only (default {DEFAULTS.runtime_endpoint})"}),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_agent_arguments(parser)
    for flag, dest, kw in _FLAGS:
        parser.add_argument(flag, dest=dest, default=None, **kw)


def run(args: argparse.Namespace) -> int:
    loaded = configure(args, _FLAGS, load_config, "nri")
    if isinstance(loaded, int):
        return loaded
    config, parts = loaded
    return asyncio.run(_serve(config, parts))


async def _serve(config: NriConfig, parts: NodeParts) -> int:
    from allocator.errors import CheckpointError

    from .app import NriAgent
    from .runtime_check import UnsupportedRuntime

    agent = NriAgent(config, parts)
    try:
        await agent.start()
    except (CheckpointError, AllocatorError, OSError, ValueError) as e:
        print(f"numapin nri: {e}", file=sys.stderr)
        await agent.stop()
        return 1
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    session = asyncio.ensure_future(agent.wait())
    stopper = asyncio.ensure_future(stop.wait())
    await asyncio.wait({session, stopper}, return_when=asyncio.FIRST_COMPLETED)
    code = 0
    if session.done() and not session.cancelled() and isinstance(session.exception(), UnsupportedRuntime):
        print(f"numapin nri: {session.exception()}", file=sys.stderr)
        code = 1
    stopper.cancel()
    logging.getLogger("numapin.nri").info("stopping")
    await agent.stop()
    return code
