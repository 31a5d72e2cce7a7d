"""Kernel-truth convergence against a real containerd: cpusets changed in the kernel behind the proxy's (and
containerd's) back are repaired, by the periodic pass and by the start-up reconcile; judged from
``/proc/<pid>/status`` and the cgroup files."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest

from numapin_lab.cri.client import CRIClient
from numapin_lab.cri.containerd import ContainerdLab

from . import test_e2e_containerd as e2e
from .test_e2e_containerd import EXCL, SHARED, ProxyProcess, cpus_of, pid_of, start_pod

lab, proxy, kubelet, machine_cpus = e2e.lab, e2e.proxy, e2e.kubelet, e2e.machine_cpus  # the same fixtures

pytestmark = pytest.mark.containerd


def write_cgroup_cpus(pid: int, cpus: str) -> None:
    """Change a container's cpuset directly in the kernel (cgroup v1 cpuset hierarchy or v2)."""
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, ctrls, path = line.split(":", 2)
        if "cpuset" in ctrls.split(","):
            Path(f"/sys/fs/cgroup/cpuset{path}/cpuset.cpus").write_text(cpus)
            return
    Path(f"/sys/fs/cgroup{path}/cpuset.cpus").write_text(cpus)


async def until(pred, what: str, tries: int = 300) -> None:
    for _ in range(tries):
        if pred():
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"never happened: {what}")


async def test_cgroup_written_behind_the_proxys_back_is_repaired(
        kubelet: CRIClient, proxy: ProxyProcess, machine_cpus: str) -> None:
    _, web = await start_pod(kubelet, "web", 200, qos="burstable")
    _, db = await start_pod(kubelet, "db", 1000, 1000)
    web_pid, db_pid = await pid_of(kubelet, web), await pid_of(kubelet, db)
    assert cpus_of(web_pid) == (SHARED, SHARED)
    write_cgroup_cpus(web_pid, machine_cpus)  # the shared container is on the exclusive CPU again
    assert cpus_of(web_pid) == (machine_cpus, machine_cpus)
    await until(lambda: cpus_of(web_pid) == (SHARED, SHARED), "web narrowed again")
    assert cpus_of(db_pid) == (EXCL, EXCL)
    await until(lambda: "converge (periodic): repaired" in proxy.log.read_text(), "the repair logged")
    log = proxy.log.read_text()
    assert "converge (periodic): repaired pod=default/web container=main" in log
    assert f"the kernel showed cgroup cpuset.cpus {machine_cpus}, the decision is cpus={SHARED}" in log


async def test_reconcile_after_a_restart_judges_the_kernel_not_containerds_record(
        kubelet: CRIClient, proxy: ProxyProcess, lab: ContainerdLab, machine_cpus: str) -> None:
    _, web = await start_pod(kubelet, "web", 200, qos="burstable")
    await start_pod(kubelet, "db", 1000, 1000)
    web_pid = await pid_of(kubelet, web)
    proxy.kill()
    write_cgroup_cpus(web_pid, machine_cpus)  # containerd's record still says narrowed
    async with CRIClient(lab.socket) as direct:
        st = await direct.container_status(web)
        assert st.status.resources.linux.cpuset_cpus == SHARED
    await asyncio.to_thread(proxy.start)  # returns once the start-up reconcile is logged
    assert cpus_of(web_pid) == (SHARED, SHARED)
    line = [x for x in proxy.log.read_text().splitlines() if "reconcile:" in x][-1]
    assert "re-applied 0 cpusets containerd recorded differently" in line
    assert "kernel: checked 2 running containers, repaired 1 cpusets (0 failed)" in line


async def test_shared_container_created_before_a_narrowing_starts_narrowed(
        kubelet: CRIClient, proxy: ProxyProcess, machine_cpus: str) -> None:
    """containerd keeps the narrowing of a created container in its spec only; the start must use it."""
    cfg = kubelet.sandbox_config("late", "uid-late-start", qos="besteffort")
    sid = await kubelet.run_pod_sandbox(cfg)
    late = await kubelet.create_container(sid, kubelet.container_config("main"), cfg)  # pool wide here
    _, db = await start_pod(kubelet, "db", 1000, 1000)
    await kubelet.start_container(late)
    assert cpus_of(await pid_of(kubelet, late)) == (SHARED, SHARED)
    assert cpus_of(await pid_of(kubelet, db)) == (EXCL, EXCL)


async def test_shared_start_racing_an_exclusive_create_never_runs_on_the_exclusive_cpu(
        kubelet: CRIClient, proxy: ProxyProcess, machine_cpus: str) -> None:
    """The narrowing of issue 9 item 2: containerd's update of a container being started only changes its
    stored spec. With the pool gate the start and the narrowing exclude each other; judged in the kernel."""
    for i in range(6):
        cfg = kubelet.sandbox_config(f"web{i}", f"uid-race-web-{i}", qos="besteffort")
        sid = await kubelet.run_pod_sandbox(cfg)
        web = await kubelet.create_container(sid, kubelet.container_config("main"), cfg)
        db_cfg = kubelet.sandbox_config(f"db{i}", f"uid-race-db-{i}")
        db_sid = await kubelet.run_pod_sandbox(db_cfg)
        db_create = kubelet.create_container(db_sid, kubelet.container_config("main", cpu_milli=1000,
                                                                              limit_milli=1000), db_cfg)
        db, _ = await asyncio.gather(db_create, kubelet.start_container(web))
        await kubelet.start_container(db)
        assert cpus_of(await pid_of(kubelet, web)) == (SHARED, SHARED), f"round {i}"
        assert cpus_of(await pid_of(kubelet, db)) == (EXCL, EXCL)
        await kubelet.stop_container(db, 0)
        await kubelet.stop_pod_sandbox(db_sid)
        await kubelet.remove_container(db)
        await kubelet.remove_pod_sandbox(db_sid)
        assert cpus_of(await pid_of(kubelet, web)) == (machine_cpus, machine_cpus)


async def test_widening_refused_with_unavailable_is_retried_until_it_holds(lab: ContainerdLab, machine_cpus: str,
                                                                           short_tmp: Path) -> None:
    """containerd answering UNAVAILABLE to the widening after a release (e.g. restarting): the shared
    container stays narrowed in the kernel until the convergence applies the widening again."""
    from criproxy.relay import Forward, Rejection, RelayHandler, Upstream
    from criproxy.server import start_relay_server

    failing = {"on": False}

    async def update(request: bytes, forward: Forward) -> bytes:
        if failing["on"]:
            raise Rejection(grpc.StatusCode.UNAVAILABLE, "injected: containerd is restarting")
        return await forward(request)

    upstream = Upstream(lab.socket)
    server = await start_relay_server(str(short_tmp / "faulty.sock"), RelayHandler(upstream, {
        "UpdateContainerResources": update}))
    (short_tmp / "p").mkdir()
    p = ProxyProcess(short_tmp / "p", str(short_tmp / "faulty.sock"), reserved_cpus=SHARED)
    try:
        await asyncio.to_thread(p.start)
        async with CRIClient(p.socket) as k:
            _, web = await start_pod(k, "web", 200, qos="burstable")
            db_sid, db = await start_pod(k, "db", 1000, 1000)
            web_pid = await pid_of(k, web)
            assert cpus_of(web_pid) == (SHARED, SHARED)
            failing["on"] = True
            await k.stop_container(db, 0)
            await k.stop_pod_sandbox(db_sid)  # releases CPU 1: the widening is refused
            await until(lambda: "could not repair pod=default/web" in p.log.read_text(), "a failed repair logged")
            assert cpus_of(web_pid) == (SHARED, SHARED)
            assert "cpuset update failed" in p.log.read_text()
            failing["on"] = False
            await until(lambda: cpus_of(web_pid) == (machine_cpus, machine_cpus), "web widened")
            await until(lambda: "repaired pod=default/web" in p.log.read_text().split("could not repair")[-1],
                        "the repair logged")
    finally:
        p.stop()
        await server.stop(0)
        await upstream.close()
        async with CRIClient(lab.socket) as direct:
            for sb in await direct.list_pod_sandbox():
                await direct.stop_pod_sandbox(sb.id)
                await direct.remove_pod_sandbox(sb.id)
