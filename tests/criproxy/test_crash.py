"""SIGKILL the proxy process between its steps; after a restart no CPU is assigned twice and none leaks.

The proxy runs as a real process (`python -m numapin criproxy`) in front of the in-process runtime, which
kills it from inside the call the proxy is making at that moment (the runtime still completes the call,
as containerd would).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import grpc.aio
import pytest

from allocator.cpuset import CPUSet
from numapin_lab.cri.client import CRIClient, pb
from numapin_lab.cri.memory_runtime import MemoryRuntime
from tests.criproxy.crash_proxy import Proxy, check_invariants, kill_during, kill_during_removal, restart, running


@pytest.fixture
async def proxy(short_tmp: Path, runtime: MemoryRuntime, two_numa_sysfs: Path) -> AsyncIterator[Proxy]:
    async with running(Proxy(short_tmp, runtime.socket_path, two_numa_sysfs)) as p:
        yield p


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
        err = await kill_during(proxy, runtime, kill_in,
                                lambda: k.create_container(sid, container(k, 2000, "guaranteed"), cfg))
        # the connection to the killed proxy breaks: UNAVAILABLE usually, "Stream removed" (UNKNOWN) at times
        assert err.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL)
    await restart(proxy)
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
        await kill_during_removal(k, proxy, runtime, kill_in, dsid, cid)
    await restart(proxy)
    check_invariants(proxy, runtime)
    assert "uid-db" not in proxy.entries()
    async with CRIClient(proxy.socket, timeout=10) as k:  # all 7 allocatable CPUs are free again
        sid2, cfg2 = await pod(k, "big", 7000)
        await k.create_container(sid2, container(k, 7000, "guaranteed"), cfg2)
    check_invariants(proxy, runtime)
