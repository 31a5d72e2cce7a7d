"""The proxy in process in front of the in-process CRI runtime, as the pinning and memory tests set it up: its
configuration (every key a flag, overridable) and a started proxy (reconciled before the test talks to it)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from criproxy.app import CriProxy
from criproxy.config import ProxyConfig, load_config
from numapin_lab.cri.memory_runtime import MemoryRuntime

__all__ = ["proc_without_kubelet", "proxy_config", "running_proxy"]


def proxy_config(tmp: Path, runtime: MemoryRuntime, sysfs: Path, **over: object) -> ProxyConfig:
    """The proxy on ``tmp/proxy.sock`` in front of ``runtime``, CPU 0 reserved, metrics on a free port."""
    base: dict[str, object] = {
        "listen": str(tmp / "proxy.sock"), "runtime_endpoint": runtime.socket_path, "state_dir": str(tmp / "state"),
        "sysfs": str(sysfs), "reserved_cpus": "0", "metrics_address": "127.0.0.1:0", "node_name": "node-a"}
    base.update(over)
    return load_config(None, base)


@asynccontextmanager
async def running_proxy(cfg: ProxyConfig) -> AsyncIterator[CriProxy]:
    """The proxy started and reconciled; stopped on the way out."""
    p = await CriProxy(cfg).start()
    try:
        await asyncio.wait_for(p.reconciled.wait(), 30)
        yield p
    finally:
        await p.stop()


def proc_without_kubelet(tmp: Path) -> str:
    """A /proc for the proxy with no kubelet process in it (``self`` is the real one): a real kubelet running on this
    machine meanwhile (the session's kubelet nodes, tests/k8s) would otherwise be the one judged, its flags winning
    over the configuration file these stories write."""
    proc = tmp / "proc"
    proc.mkdir(exist_ok=True)
    if not (proc / "self").exists():
        (proc / "self").symlink_to("/proc/self")
    return str(proc)
