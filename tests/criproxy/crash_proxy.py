"""The proxy as a real process (`python -m numapin criproxy`) in front of the in-process runtime, killed with SIGKILL
from inside the call it is making (the runtime still completes the call, as containerd would) and restarted: the
kill-and-restart helpers of the crash tests (test_crash.py, test_crash_memory.py) and the CPU file's invariants."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import grpc
import grpc.aio
import pytest

from allocator.cpuset import CPUSet
from numapin_lab.cri.client import CRIClient, pb
from numapin_lab.cri.memory_runtime import MemoryRuntime

__all__ = ["Proxy", "check_invariants", "kill_during", "kill_during_removal", "restart", "running"]

ROOT = Path(__file__).resolve().parents[2]


class Proxy:
    def __init__(self, d: Path, runtime: str, sysfs: Path) -> None:
        self.socket = str(d / "proxy.sock")
        self.state = d / "state" / "cpu_manager_state"
        self.log = d / "proxy.log"
        self.args = [sys.executable, "-m", "numapin", "criproxy", "--listen", self.socket, "--runtime-endpoint",
                     runtime, "--state-dir", str(d / "state"), "--sysfs", str(sysfs), "--reserved-cpus", "0",
                     "--metrics-address", ""]
        self.proc: subprocess.Popen[bytes] | None = None

    async def start(self) -> None:
        mark = self.log.read_text().count("reconcile:") if self.log.exists() else 0
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(self.args, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                                         stdout=log, stderr=log)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.log.read_text()[-3000:]
            if self.log.read_text().count("reconcile:") > mark:
                return
            await asyncio.sleep(0.05)
        raise AssertionError("proxy did not reconcile:\n" + self.log.read_text()[-3000:])

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)

    def reap(self) -> None:
        if self.proc is not None:
            self.proc.wait()
            self.proc = None

    def entries(self) -> dict[str, dict[str, str]]:
        return json.loads(self.state.read_text()).get("entries", {})


@asynccontextmanager
async def running(proxy: Proxy) -> AsyncIterator[Proxy]:
    """The proxy started (reconciled); killed and reaped on the way out."""
    await proxy.start()
    try:
        yield proxy
    finally:
        proxy.kill()
        proxy.reap()


async def kill_during(proxy: Proxy, runtime: MemoryRuntime, method: str,
                      call: Callable[[], Awaitable[object]]) -> grpc.aio.AioRpcError:
    """Make ``call`` through the proxy while the runtime kills the proxy from inside its ``method`` call; the call
    fails (the connection breaks). Returns its error."""
    runtime.hooks[method] = lambda raw: proxy.kill()
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call()
    runtime.hooks.clear()
    return err.value


async def kill_during_removal(k: CRIClient, proxy: Proxy, runtime: MemoryRuntime, kill_in: str, sid: str,
                              cid: str) -> None:
    """kubelet's removal of the pod (sandbox ``sid``, its container ``cid``): the container stopped, then the proxy
    killed inside ``kill_in`` (RemoveContainer, StopPodSandbox or RemovePodSandbox)."""
    await k.stop_container(cid)
    if kill_in == "RemovePodSandbox":
        await k.stop_pod_sandbox(sid)
    calls: dict[str, Callable[[], Awaitable[object]]] = {
        "RemoveContainer": lambda: k.remove_container(cid), "StopPodSandbox": lambda: k.stop_pod_sandbox(sid),
        "RemovePodSandbox": lambda: k.remove_pod_sandbox(sid)}
    await kill_during(proxy, runtime, kill_in, calls[kill_in])


async def restart(proxy: Proxy) -> None:
    """The killed proxy reaped and started again (reconciled)."""
    proxy.reap()
    await proxy.start()


def check_invariants(proxy: Proxy, runtime: MemoryRuntime) -> None:
    """Every assignment belongs to an existing container, no CPU is held twice, every live container runs
    on what the state says (its own CPUs, or the shared pool = what nobody holds exclusively)."""
    entries = {uid: {n: CPUSet.parse(c) for n, c in pod.items()} for uid, pod in proxy.entries().items()}
    uid_of = {sid: cfg.metadata.uid for sid, cfg in runtime.sandboxes.items()}
    present = {(uid_of[c.sandbox_id], c.config.metadata.name) for c in runtime.containers.values()}
    seen = CPUSet()
    for uid, pod in entries.items():
        for name, cpus in pod.items():
            assert (uid, name) in present, f"leak: {uid}/{name} holds {cpus} but has no container"
            assert seen.isdisjoint(cpus), f"CPU assigned twice: {cpus}"
            seen = seen | cpus
    pool = CPUSet.parse("0-7") - seen
    for c in runtime.containers.values():
        if c.state == pb.CONTAINER_EXITED:
            continue
        own = entries.get(uid_of[c.sandbox_id], {}).get(c.config.metadata.name)
        assert CPUSet.parse(c.resources.cpuset_cpus) == (own if own is not None else pool), c.config.metadata.name
