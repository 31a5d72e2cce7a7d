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


async def recorded_cpus(lab: ContainerdLab, cid: str) -> str:
    """The cpuset containerd's record holds for a container (not the truth: what containerd would write back)."""
    async with CRIClient(lab.socket) as direct:
        return (await direct.container_status(cid)).status.resources.linux.cpuset_cpus


async def until_recorded(lab: ContainerdLab, cid: str, cpus: str) -> None:
    for _ in range(300):
        if await recorded_cpus(lab, cid) == cpus:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"containerd never recorded cpus {cpus} for {cid[:13]}")


async def test_cgroup_written_behind_the_proxys_back_is_repaired(
        kubelet: CRIClient, proxy: ProxyProcess, lab: ContainerdLab, machine_cpus: str) -> None:
    _, web = await start_pod(kubelet, "web", 200, qos="burstable")
    _, db = await start_pod(kubelet, "db", 1000, 1000)
    web_pid, db_pid = await pid_of(kubelet, web), await pid_of(kubelet, db)
    assert cpus_of(web_pid) == (SHARED, SHARED)
    await until_recorded(lab, web, SHARED)  # no update of the proxy's own is still on its way
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
    await until_recorded(lab, web, SHARED)  # containerd's record follows the kernel
    proxy.kill()
    write_cgroup_cpus(web_pid, machine_cpus)  # containerd's record still says narrowed
    assert await recorded_cpus(lab, web) == SHARED
    await asyncio.to_thread(proxy.start)  # returns once the start-up reconcile is logged
    assert cpus_of(web_pid) == (SHARED, SHARED)
    line = [x for x in proxy.log.read_text().splitlines() if "reconcile:" in x][-1]
    assert "re-applied 0 cpusets containerd recorded differently" in line
    assert "kernel: checked 2 running containers, repaired 1 cpusets (0 failed)" in line


async def test_a_kill_between_the_kernel_and_containerds_record_is_made_whole_at_restart(
        kubelet: CRIClient, proxy: ProxyProcess, lab: ContainerdLab, machine_cpus: str) -> None:
    """kill -9 right after a narrowing: the kernel has it, containerd's record (sent a moment later) does not.
    The start-up reconcile sees the record differ and brings it up to date; the kernel never left the decision."""
    _, web = await start_pod(kubelet, "web", 200, qos="burstable")
    web_pid = await pid_of(kubelet, web)
    await until_recorded(lab, web, machine_cpus)
    _, db = await start_pod(kubelet, "db", 1000, 1000)
    proxy.kill()
    assert cpus_of(web_pid) == (SHARED, SHARED)
    async with CRIClient(lab.socket) as direct:
        assert cpus_of(await pid_of(direct, db)) == (EXCL, EXCL)
    stale = await recorded_cpus(lab, web) == machine_cpus  # almost always: the record waits a second
    await asyncio.to_thread(proxy.start)
    await until_recorded(lab, web, SHARED)
    assert cpus_of(web_pid) == (SHARED, SHARED)
    line = [x for x in proxy.log.read_text().splitlines() if "reconcile:" in x][-1]
    assert f"re-applied {int(stale)} cpusets containerd recorded differently" in line
    assert "kernel: checked 2 running containers, repaired 0 cpusets (0 failed)" in line


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


class RefusingUpdates:
    """A relay in front of the lab's containerd that answers UNAVAILABLE to UpdateContainerResources while
    ``refusing`` (containerd restarting), and a proxy in front of it."""

    def __init__(self, lab: ContainerdLab, tmp: Path) -> None:
        self.lab, self.tmp, self.refusing = lab, tmp, False

    async def __aenter__(self) -> ProxyProcess:
        from criproxy.relay.grpc_relay import Forward, Rejection, RelayHandler, Upstream
        from criproxy.relay.socket_server import start_relay_server

        async def update(request: bytes, forward: Forward) -> bytes:
            if self.refusing:
                raise Rejection(grpc.StatusCode.UNAVAILABLE, "injected: containerd is restarting")
            return await forward(request)

        self.upstream = Upstream(self.lab.socket)
        self.server = await start_relay_server(str(self.tmp / "faulty.sock"), RelayHandler(self.upstream, {
            "UpdateContainerResources": update}))
        (self.tmp / "p").mkdir()
        self.proxy = ProxyProcess(self.tmp / "p", str(self.tmp / "faulty.sock"), reserved_cpus=SHARED)
        await asyncio.to_thread(self.proxy.start)
        return self.proxy

    async def __aexit__(self, *exc: object) -> None:
        self.proxy.stop()
        await self.server.stop(0)
        await self.upstream.close()
        async with CRIClient(self.lab.socket) as direct:
            for sb in await direct.list_pod_sandbox():
                await direct.stop_pod_sandbox(sb.id)
                await direct.remove_pod_sandbox(sb.id)


async def test_widening_reaches_the_kernel_while_containerd_refuses_it_and_its_record_follows(
        lab: ContainerdLab, machine_cpus: str, short_tmp: Path) -> None:
    """containerd answering UNAVAILABLE to the widening after a release (e.g. restarting): the kernel has the
    widening at once (the cgroup is written directly); containerd's record is sent again on every pass until
    containerd takes it."""
    faults = RefusingUpdates(lab, short_tmp)
    async with faults as p, CRIClient(p.socket) as k:
        _, web = await start_pod(k, "web", 200, qos="burstable")
        db_sid, db = await start_pod(k, "db", 1000, 1000)
        web_pid = await pid_of(k, web)
        assert cpus_of(web_pid) == (SHARED, SHARED)
        await until_recorded(lab, web, SHARED)
        faults.refusing = True
        await k.stop_container(db, 0)
        await k.stop_pod_sandbox(db_sid)  # releases CPU 1: containerd refuses the widening
        assert cpus_of(web_pid) == (machine_cpus, machine_cpus)
        await until(lambda: "containerd's record of pod=default/web container=main" in p.log.read_text(),
                    "the refused record update logged")
        assert await recorded_cpus(lab, web) == SHARED
        faults.refusing = False
        for _ in range(300):
            if await recorded_cpus(lab, web) == machine_cpus:
                break
            await asyncio.sleep(0.1)
        assert await recorded_cpus(lab, web) == machine_cpus
        assert cpus_of(web_pid) == (machine_cpus, machine_cpus)


@pytest.mark.containerd_matrix  # how containerd keeps and re-applies its record is version-specific
async def test_a_stale_record_containerd_writes_back_is_caught_in_the_kernel_and_repaired(
        lab: ContainerdLab, machine_cpus: str, short_tmp: Path) -> None:
    """The narrowing reached the kernel but containerd refused the record update: containerd's record still says
    the wide pool. An update of something else made directly at containerd makes runc write the whole recorded
    resources, the stale cpuset included, into the cgroup; the convergence sees it in the kernel and narrows the
    container again."""
    faults = RefusingUpdates(lab, short_tmp)
    async with faults as p, CRIClient(p.socket) as k:
        _, web = await start_pod(k, "web", 200, qos="burstable")
        web_pid = await pid_of(k, web)
        assert cpus_of(web_pid) == (machine_cpus, machine_cpus)
        faults.refusing = True
        _, db = await start_pod(k, "db", 1000, 1000)  # narrows web in the kernel; its record stays wide
        assert cpus_of(web_pid) == (SHARED, SHARED)
        assert cpus_of(await pid_of(k, db)) == (EXCL, EXCL)
        assert await recorded_cpus(lab, web) == machine_cpus
        assert "converge (periodic): repaired pod=default/web" not in p.log.read_text()
        async with CRIClient(lab.socket) as direct:  # behind the proxy's back: only the CPU shares change
            await direct.update_container_resources(web, direct.container_config("x", cpu_milli=300).linux.resources)
        await until(lambda: "converge (periodic): repaired pod=default/web" in p.log.read_text(),
                    "the rewritten cgroup repaired")
        assert (f"repaired pod=default/web container=main id={web[:13]} (shared): the kernel showed cgroup "
                f"cpuset.cpus {machine_cpus}, the decision is cpus={SHARED}") in p.log.read_text()
        assert cpus_of(web_pid) == (SHARED, SHARED)
        faults.refusing = False
        for _ in range(300):
            if await recorded_cpus(lab, web) == SHARED:
                break
            await asyncio.sleep(0.1)
        assert await recorded_cpus(lab, web) == SHARED
