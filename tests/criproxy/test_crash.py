"""SIGKILL the proxy process between its steps; after a restart no CPU is assigned twice and none leaks.

The proxy runs as a real process (`python -m numapin criproxy`) in front of the in-process runtime, which
kills it from inside the call the proxy is making at that moment (the runtime still completes the call,
as containerd would).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import grpc.aio
import pytest

from allocator.cpuset import CPUSet
from numapin_lab.cri.client import CRIClient, pb
from numapin_lab.cri.memory_runtime import MemoryRuntime

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


@pytest.fixture
async def proxy(short_tmp: Path, runtime: MemoryRuntime, two_numa_sysfs: Path) -> AsyncIterator[Proxy]:
    p = Proxy(short_tmp, runtime.socket_path, two_numa_sysfs)
    await p.start()
    yield p
    p.kill()
    p.reap()


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


async def pod(k: CRIClient, name: str, cpu: int, qos: str = "guaranteed") -> tuple[str, pb.PodSandboxConfig]:
    cfg = k.sandbox_config(name, f"uid-{name}", qos=qos)
    return await k.run_pod_sandbox(cfg), cfg


def container(k: CRIClient, cpu: int, qos: str) -> pb.ContainerConfig:
    return k.container_config("app", cpu_milli=cpu, limit_milli=cpu if qos == "guaranteed" else None)


@pytest.mark.parametrize("kill_in", ["CreateContainer", "UpdateContainerResources"])
async def test_kill_during_create_or_narrowing(proxy: Proxy, runtime: MemoryRuntime, kill_in: str) -> None:
    async with CRIClient(proxy.socket, timeout=10) as k:
        for i in range(3):  # shared containers to narrow
            sid, cfg = await pod(k, f"web{i}", 200, "burstable")
            await k.start_container(await k.create_container(sid, container(k, 200, "burstable"), cfg))
        sid, cfg = await pod(k, "db", 2000)
        runtime.hooks[kill_in] = lambda raw: proxy.kill()
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await k.create_container(sid, container(k, 2000, "guaranteed"), cfg)
        # the connection to the killed proxy breaks: UNAVAILABLE usually, "Stream removed" (UNKNOWN) at times
        assert err.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL)
        runtime.hooks.clear()
    proxy.reap()
    await proxy.start()
    check_invariants(proxy, runtime)
    async with CRIClient(proxy.socket, timeout=10) as k:  # kubelet retries the create
        cid = await k.create_container(sid, container(k, 2000, "guaranteed"), cfg)
        await k.start_container(cid)
        assert len(CPUSet.parse(runtime.containers[cid].resources.cpuset_cpus)) == 2
    check_invariants(proxy, runtime)


@pytest.mark.parametrize("kill_in", ["RemoveContainer", "StopPodSandbox", "RemovePodSandbox"])
async def test_kill_during_removal(proxy: Proxy, runtime: MemoryRuntime, kill_in: str) -> None:
    async with CRIClient(proxy.socket, timeout=10) as k:
        sid, cfg = await pod(k, "web", 200, "burstable")
        await k.start_container(await k.create_container(sid, container(k, 200, "burstable"), cfg))
        dsid, dcfg = await pod(k, "db", 3000)
        cid = await k.create_container(dsid, container(k, 3000, "guaranteed"), dcfg)
        await k.start_container(cid)
        await k.stop_container(cid)
        if kill_in == "RemovePodSandbox":
            await k.stop_pod_sandbox(dsid)
        runtime.hooks[kill_in] = lambda raw: proxy.kill()
        with pytest.raises(grpc.aio.AioRpcError):
            if kill_in == "RemoveContainer":
                await k.remove_container(cid)
            elif kill_in == "StopPodSandbox":
                await k.stop_pod_sandbox(dsid)
            else:
                await k.remove_pod_sandbox(dsid)
        runtime.hooks.clear()
    proxy.reap()
    await proxy.start()
    check_invariants(proxy, runtime)
    assert "uid-db" not in proxy.entries()
    async with CRIClient(proxy.socket, timeout=10) as k:  # all 7 allocatable CPUs are free again
        sid2, cfg2 = await pod(k, "big", 7000)
        await k.create_container(sid2, container(k, 7000, "guaranteed"), cfg2)
    check_invariants(proxy, runtime)
