"""End to end through the second door: a kubelet-like client -> REAL containerd 1.7.24 / 2.1.9 (Debian's, NRI on)
-> `numapin nri` (a real process, plugged into containerd's NRI socket). kubelet's client talks to containerd
directly, as it does in NRI mode; every check reads the container processes' real ``Cpus_allowed_list`` and cgroup
cpusets.

The machine's real topology (``--sysfs /sys``) with every CPU but the last reserved: on this 2-CPU machine CPU 0 is
reserved, an exclusive container gets CPU 1 and the shared pool narrows to CPU 0. One containerd per version for the
session (tests/nri/conftest.py); one plugin process per test."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc.aio
import pytest

from allocator.topology import Topology
from numapin_lab.cri.client import CRIClient, pb
from numapin_lab.cri.containerd import ContainerdLab
from numapin_lab.cri.nri_process import NriProcess
from tests.criproxy.test_e2e_containerd import EXCL, SHARED, cfs_quota, cpus_of, delete_pod, pid_of, start_pod
from tests.nri.plugin_process import plugin_process

pytestmark = pytest.mark.containerd
# the stories whose outcome depends on containerd's NRI (v0.6.1 in 1.7, v0.8.0 in 2.1: pinning and narrowing, the
# plugin's kill -9, containerd's restart) run on both; the rest, the door's own logic, on 2.1.9 only
ON_2X = pytest.mark.parametrize("nri_lab", ["2.x"], indirect=True, ids=["containerd2.x"])

ROOT = Path(__file__).resolve().parents[2]



@pytest.fixture(scope="module")
def cpu_all() -> str:
    return str(Topology.from_sysfs("/sys").all_cpus)


@pytest.fixture
async def plugin(nri_lab: ContainerdLab) -> AsyncIterator[NriProcess]:
    async with plugin_process(nri_lab) as p:
        yield p


async def _wait_cpus(pid: int, want: tuple[str, str], timeout: float = 20.0) -> float:
    """Seconds until the kernel shows ``want`` for ``pid`` (fails past ``timeout``)."""
    t0 = time.monotonic()
    while True:
        got = cpus_of(pid)
        if got == want:
            return time.monotonic() - t0
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"pid {pid}: the kernel shows {got}, not {want}, after {timeout:g} s")
        await asyncio.sleep(0.05)


async def test_exclusive_and_shared_pods_through_nri(cri: CRIClient, plugin: NriProcess, cpu_all: str) -> None:
    """A Guaranteed pod pinned, a Burstable one narrowed off its CPU and widened back when it goes; a BestEffort
    one created while the exclusive pod runs starts narrowed; the state file says the same."""
    _, web = await start_pod(cri, "web", 200, qos="burstable")
    web_pid = await pid_of(cri, web)
    assert cpus_of(web_pid) == (cpu_all, cpu_all)
    db_sid, db = await start_pod(cri, "db", 1000, 1000)
    db_pid = await pid_of(cri, db)
    assert cpus_of(db_pid) == (EXCL, EXCL)
    assert cfs_quota(db_pid) == "-1"  # the quota of a pinned container is lifted, in the kernel only:
    assert await _record_quota(cri, db) == (100000, 100000)  # containerd's record keeps kubelet's
    assert cpus_of(web_pid) == (SHARED, SHARED)  # narrowed before db could run
    _, late = await start_pod(cri, "late", 100, qos="besteffort")
    assert cpus_of(await pid_of(cri, late)) == (SHARED, SHARED)
    entries = plugin.state()["entries"]
    assert [v for pod in entries.values() for v in pod.values()] == [EXCL]
    await delete_pod(cri, db_sid, db)
    await _wait_cpus(web_pid, (cpu_all, cpu_all))  # widened in the kernel at RemoveContainer
    assert plugin.state().get("entries", {}) == {}


@ON_2X
async def test_modes_share_and_none_through_nri(cri: CRIClient, plugin: NriProcess, cpu_all: str) -> None:
    _, web = await start_pod(cri, "web", 200, qos="burstable")
    _, cache = await start_pod(cri, "cache", 1000, 1000, qos="burstable",
                               annotations={"qos.gocrane.io/cpu-manager": "share"})
    assert cpus_of(await pid_of(cri, cache)) == (EXCL, EXCL)  # pinned, but the pool keeps its CPU
    assert cpus_of(await pid_of(cri, web)) == (cpu_all, cpu_all)
    _, batch = await start_pod(cri, "batch", 1000, 1000, annotations={"qos.gocrane.io/cpu-manager": "none"})
    assert cpus_of(await pid_of(cri, batch)) == (cpu_all, cpu_all)  # Guaranteed, but on the shared pool


@ON_2X
async def test_a_topology_refusal_fails_the_creation_with_numapins_reason(cri: CRIClient,
                                                                         plugin: NriProcess) -> None:
    await start_pod(cri, "db", 1000, 1000)
    cfg = cri.sandbox_config("db2", f"nri-db2-{os.getpid()}-{time.monotonic_ns()}")
    sid = await cri.run_pod_sandbox(cfg)
    with pytest.raises(grpc.aio.AioRpcError) as err:  # its one allocatable CPU is taken
        await cri.create_container(sid, cri.container_config("main", cpu_milli=1000, limit_milli=1000), cfg)
    assert "numapin: pod" in (err.value.details() or ""), err.value.details()
    assert "db2" in (err.value.details() or "")


@ON_2X
async def test_in_place_resize_through_nri(cri: CRIClient, plugin: NriProcess, cpu_all: str) -> None:
    """kubelet's UpdateContainerResources (no cpuset, the new quota): a growth numapin cannot give is refused with
    its message and changes nothing; a shrink to a fractional CPU moves the container to the shared pool and the
    pool widens back over its CPU; a growth back to 1 CPU pins it again, without a CFS quota in the kernel but with
    kubelet's in containerd's ContainerStatus (kubelet shows the CPU limit it reads there)."""
    _, web = await start_pod(cri, "web", 200, qos="burstable")
    web_pid = await pid_of(cri, web)
    _, db = await start_pod(cri, "db", 1000, 1000)
    db_pid = await pid_of(cri, db)
    assert cpus_of(db_pid) == (EXCL, EXCL)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await cri.update_container_resources(db, pb.LinuxContainerResources(cpu_shares=2048, cpu_quota=200000,
                                                                            cpu_period=100000))
    assert "numapin: pod" in (err.value.details() or ""), err.value.details()
    assert cpus_of(db_pid) == (EXCL, EXCL) and cpus_of(web_pid) == (SHARED, SHARED)
    await cri.update_container_resources(db, pb.LinuxContainerResources(cpu_shares=512, cpu_quota=50000,
                                                                        cpu_period=100000))
    assert cpus_of(db_pid) == (cpu_all, cpu_all)
    assert cpus_of(web_pid) == (cpu_all, cpu_all)
    assert cfs_quota(db_pid) == "50000"  # kubelet's quota, now that it runs on the shared pool
    assert await _record_quota(cri, db) == (50000, 100000)
    await cri.update_container_resources(db, pb.LinuxContainerResources(cpu_shares=1024, cpu_quota=100000,
                                                                        cpu_period=100000))
    assert cpus_of(db_pid) == (EXCL, EXCL) and cpus_of(web_pid) == (SHARED, SHARED)  # its CPU to itself again
    assert cfs_quota(db_pid) == "-1"  # pinned: no quota in the kernel (lifted at PostUpdateContainer) ...
    assert await _record_quota(cri, db) == (100000, 100000)  # ... and kubelet's in what it reads back (its limit)
    _write_quota(db_pid, 100000)  # what runc does when containerd applies the record again (or systemd's reload)
    await _wait_quota(db_pid, "-1")  # the plugin's next sweep (after a convergence pass) lifts it again
    resizes = (plugin.status() or {}).get("resizes", [])
    assert [r.get("result") for r in resizes][-3:] == ["refused", "resized", "resized"], resizes


def _write_quota(pid: int, quota: int) -> None:
    """The CFS quota of the process's cgroup (v1 ``cpu.cfs_quota_us``, v2 ``cpu.max``)."""
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, ctrls, path = line.split(":", 2)
        if "cpu" in ctrls.split(","):
            Path("/sys/fs/cgroup", "cpu", path.lstrip("/"), "cpu.cfs_quota_us").write_text(str(quota))
            return
        if ctrls == "":
            Path("/sys/fs/cgroup", path.lstrip("/"), "cpu.max").write_text(str(quota))
            return
    raise AssertionError(f"pid {pid}: no cpu cgroup")


async def _wait_quota(pid: int, want: str, timeout: float = 20.0) -> None:
    t0 = time.monotonic()
    while (got := cfs_quota(pid)) != want:
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"pid {pid}: CFS quota {got}, not {want}, after {timeout:g} s")
        await asyncio.sleep(0.05)


async def _record_quota(cri: CRIClient, cid: str) -> tuple[int, int]:
    """(cpu_quota, cpu_period) in containerd's ContainerStatus: what kubelet turns into the CPU limit it shows."""
    linux = (await cri.container_status(cid)).status.resources.linux
    return linux.cpu_quota, linux.cpu_period


async def test_plugin_killed_then_back_converges_what_was_created_meanwhile(
        cri: CRIClient, plugin: NriProcess, cpu_all: str) -> None:
    """kill -9 of the plugin: containerd creates containers without it (the window NRI leaves on 1.7/2.1: nothing
    makes a plugin mandatory there), so a container created meanwhile runs on every CPU, the exclusive one
    included. Back, the plugin converges it off the exclusive CPU in the kernel, and the exclusive pod never
    moved."""
    _, db = await start_pod(cri, "db", 1000, 1000)
    db_pid = await pid_of(cri, db)
    plugin.kill()
    _, orphan = await start_pod(cri, "orphan", 200, qos="burstable")
    orphan_pid = await pid_of(cri, orphan)
    assert cpus_of(orphan_pid) == (cpu_all, cpu_all)  # unpinned: what containerd does without a plugin
    await asyncio.to_thread(plugin.start)
    await _wait_cpus(orphan_pid, (SHARED, SHARED))
    assert cpus_of(db_pid) == (EXCL, EXCL)
    # and admissions go on where they left off: a second exclusive pod still has no CPU
    cfg = cri.sandbox_config("db2", f"nri-db2-{os.getpid()}-{time.monotonic_ns()}")
    sid = await cri.run_pod_sandbox(cfg)
    with pytest.raises(grpc.aio.AioRpcError):
        await cri.create_container(sid, cri.container_config("main", cpu_milli=1000, limit_milli=1000), cfg)


async def test_containerd_restarted_with_pods_running(cri: CRIClient, plugin: NriProcess, nri_lab: ContainerdLab,
                                                      cpu_all: str) -> None:
    """containerd restarts (the NRI socket goes away for a moment): the plugin registers again, nothing moves, and
    the next exclusive pod is pinned as before."""
    _, web = await start_pod(cri, "web", 200, qos="burstable")
    db_sid, db = await start_pod(cri, "db", 1000, 1000)
    web_pid, db_pid = await pid_of(cri, web), await pid_of(cri, db)
    await asyncio.to_thread(nri_lab.stop_containerd)
    await asyncio.to_thread(nri_lab.start_containerd)
    await asyncio.to_thread(plugin.wait_synchronized, 2)
    assert cpus_of(db_pid) == (EXCL, EXCL) and cpus_of(web_pid) == (SHARED, SHARED)
    async with CRIClient(nri_lab.socket) as again:
        await delete_pod(again, db_sid, db)
        await _wait_cpus(web_pid, (cpu_all, cpu_all))
        _, db2 = await start_pod(again, "db2", 1000, 1000)
        assert cpus_of(await pid_of(again, db2)) == (EXCL, EXCL)
        assert cpus_of(web_pid) == (SHARED, SHARED)


def _numapin(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "numapin", *args], capture_output=True, text=True, timeout=60,
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})


@ON_2X
async def test_live_mode_change_and_status_through_nri(cri: CRIClient, plugin: NriProcess, nri_lab: ContainerdLab,
                                                       cpu_all: str) -> None:
    """`numapin mode` on the plugin's control socket moves a running pod share -> exclusive -> none with the same
    zero-window order as at creation (the shared pool leaves its CPU first), in the kernel; `numapin status` reads
    the plugin's /status and checks every container's real cpuset against it."""
    _, web = await start_pod(cri, "web", 200, qos="burstable")
    web_pid = await pid_of(cri, web)
    _, cache = await start_pod(cri, "cache", 1000, 1000, annotations={"qos.gocrane.io/cpu-manager": "share"})
    cache_pid = await pid_of(cri, cache)
    assert cpus_of(cache_pid) == (EXCL, EXCL) and cpus_of(web_pid) == (cpu_all, cpu_all)
    done = await asyncio.to_thread(_numapin, "mode", "default/cache", "exclusive", "--socket", plugin.control_socket)
    assert done.returncode == 0, done.stdout + done.stderr
    await _wait_cpus(web_pid, (SHARED, SHARED))
    assert cpus_of(cache_pid) == (EXCL, EXCL)
    done = await asyncio.to_thread(_numapin, "mode", "default/cache", "none", "--socket", plugin.control_socket)
    assert done.returncode == 0, done.stdout + done.stderr
    await _wait_cpus(cache_pid, (cpu_all, cpu_all))
    await _wait_cpus(web_pid, (cpu_all, cpu_all))
    status = await asyncio.to_thread(_numapin, "status", "--status-url", f"http://127.0.0.1:{plugin.port}/status",
                                     "--runtime-endpoint", f"unix://{nri_lab.socket}")
    assert status.returncode == 0, status.stdout + status.stderr
    door = (plugin.status() or {}).get("door") or {}
    assert door.get("kind") == "nri" and door.get("synchronized") and door.get("runtime", "").startswith("containerd")
