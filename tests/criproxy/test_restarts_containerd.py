"""Container restarts and init-container reuse against a real containerd (no intent annotation: the proxy only
has CRI), judged from ``/proc/<pid>/status`` and the cgroup files. On this machine one CPU (EXCL) is allocatable.

- an app container that crashed keeps its CPU while a sibling is first created, and gets it back when kubelet
  re-creates it; the sibling never runs on it;
- after a proxy restart (kill -9) an app container reuses the CPU of its pod's exited init container.
"""

from __future__ import annotations

import asyncio
import os
import time

import grpc
import grpc.aio
import pytest

from numapin_lab.cri.client import CRIClient, pb

from . import test_e2e_containerd as e2e
from .test_e2e_containerd import EXCL, ProxyProcess, cpus_of, pid_of

lab, proxy, kubelet, machine_cpus = e2e.lab, e2e.proxy, e2e.kubelet, e2e.machine_cpus  # the same fixtures

pytestmark = pytest.mark.containerd


async def create(k: CRIClient, sid: str, cfg: pb.PodSandboxConfig, name: str, command: tuple[str, ...], *,
                 attempt: int = 0) -> str:
    cid = await k.create_container(sid, k.container_config(name, cpu_milli=1000, limit_milli=1000, command=command,
                                                           attempt=attempt), cfg)
    await k.start_container(cid)
    return cid


async def exited(k: CRIClient, cid: str) -> int:
    for _ in range(300):
        st = (await k.container_status(cid)).status
        if st.state == pb.CONTAINER_EXITED:
            return st.exit_code
        await asyncio.sleep(0.05)
    raise AssertionError(f"container {cid} did not exit")


def sandbox(k: CRIClient, name: str) -> pb.PodSandboxConfig:
    return k.sandbox_config(name, f"e2e-{name}-{os.getpid()}-{time.monotonic_ns()}")


@pytest.mark.containerd_matrix
async def test_crashed_app_container_keeps_its_cpu_and_gets_it_back_when_recreated(
        kubelet: CRIClient, proxy: ProxyProcess) -> None:
    cfg = sandbox(kubelet, "pair")
    sid = await kubelet.run_pod_sandbox(cfg)
    app1 = await create(kubelet, sid, cfg, "app1", ("sh", "-c", "until [ -e /tmp/crash ]; do sleep 0.02; done; exit 3"))
    assert cpus_of(await pid_of(kubelet, app1)) == (EXCL, EXCL)  # read while it runs: it crashes when told
    await kubelet.exec_sync(app1, ["touch", "/tmp/crash"])
    assert await exited(kubelet, app1) == 3
    with pytest.raises(grpc.aio.AioRpcError) as err:  # app2's first create: app1's CPU is not an init's
        await create(kubelet, sid, cfg, "app2", ("sleep", "3600"))
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    again = await create(kubelet, sid, cfg, "app1", ("sleep", "3600"), attempt=1)
    assert cpus_of(await pid_of(kubelet, again)) == (EXCL, EXCL)
    assert list(proxy.state()["entries"].values()) == [{"app1": EXCL}]


async def test_app_container_that_exited_0_never_shares_its_cpu_with_the_sibling_that_took_it(
        kubelet: CRIClient, proxy: ProxyProcess) -> None:
    cfg = sandbox(kubelet, "pair0")
    sid = await kubelet.run_pod_sandbox(cfg)
    app1 = await create(kubelet, sid, cfg, "app1", ("true",))
    assert await exited(kubelet, app1) == 0  # looks like an init container that completed
    app2 = await create(kubelet, sid, cfg, "app2", ("sleep", "3600"))
    app2_pid = await pid_of(kubelet, app2)
    assert cpus_of(app2_pid) == (EXCL, EXCL)
    with pytest.raises(grpc.aio.AioRpcError) as err:  # re-created: it needs a CPU of its own; none is free
        await create(kubelet, sid, cfg, "app1", ("sleep", "3600"), attempt=1)
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert cpus_of(app2_pid) == (EXCL, EXCL)
    running = [c for c in await kubelet.list_containers(pod_sandbox_id=sid) if c.state == pb.CONTAINER_RUNNING]
    assert [c.metadata.name for c in running] == ["app2"]


async def test_after_a_proxy_kill_an_app_container_reuses_its_exited_init_containers_cpu(
        kubelet: CRIClient, proxy: ProxyProcess) -> None:
    cfg = sandbox(kubelet, "job")
    sid = await kubelet.run_pod_sandbox(cfg)
    init = await create(kubelet, sid, cfg, "init", ("true",))
    assert await exited(kubelet, init) == 0
    proxy.kill()
    await asyncio.to_thread(proxy.start)
    async with CRIClient(proxy.socket) as k2:
        app = await create(k2, sid, cfg, "app", ("sleep", "3600"))  # the one allocatable CPU is the init's
        assert cpus_of(await pid_of(k2, app)) == (EXCL, EXCL)
    assert sorted(next(iter(proxy.state()["entries"].values())).items()) == [("app", EXCL), ("init", EXCL)]
