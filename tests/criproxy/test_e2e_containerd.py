"""End to end: a kubelet-like client -> `numapin criproxy` (a real process) -> a real containerd + runc.

Assertions read the container processes' real ``Cpus_allowed_list`` and cgroup cpusets. The machine's real
topology is used (``--sysfs /sys``): every CPU but the last is reserved, so on this 2-CPU machine CPU 0 is
reserved, an exclusive container gets CPU 1 and the shared pool narrows to CPU 0 (on a bigger machine: the
last CPU, and all the others). These tests FAIL (never skip) when containerd, runc or busybox-static is missing.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import grpc.aio
import pytest

from allocator.cpuset import CPUSet
from allocator.topology import Topology
from numapin_lab.cri.cgroups import existing_cgroup_dirs
from numapin_lab.cri.client import CRIClient
from numapin_lab.cri.containerd import ContainerdLab
from numapin_lab.cri.ledger import scratch_dir
from numapin_lab.cri.proxy_process import ProxyProcess, serving

# on containerd 1.7 and 2.x too (containerd_matrix): the stories whose outcome depends on containerd's own behaviour
# (its records, restarts, what it leaves behind); the NRI door's tests (tests/nri) pin and narrow on both as well
pytestmark = [pytest.mark.containerd]

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def lab(shared_lab: ContainerdLab) -> Iterator[ContainerdLab]:
    """The session's containerd (its modules share it), left empty of pods when the module ends."""
    yield shared_lab
    asyncio.run(shared_lab.remove_all_pods())


ALL = Topology.from_sysfs("/sys").all_cpus
EXCL = str(ALL.max())            # the one allocatable CPU
SHARED = str(ALL - CPUSet([ALL.max()]))  # the reserved CPUs: where shared containers go when EXCL is taken


@pytest.fixture(scope="module")
def machine_cpus() -> str:
    assert len(ALL) >= 2, "the end-to-end tests need at least 2 CPUs"
    return str(ALL)


@pytest.fixture(params=["frames", "grpc"])
async def proxy(lab: ContainerdLab, request: pytest.FixtureRequest) -> AsyncIterator[ProxyProcess]:
    """The proxy process with each relay (``--relay``)."""
    p = ProxyProcess(scratch_dir("npx-p-"), lab.socket, reserved_cpus=SHARED, extra_args=("--relay", request.param))
    async with serving(p, lab):  # containerd left empty for the next test
        yield p


@pytest.fixture
async def kubelet(proxy: ProxyProcess) -> AsyncIterator[CRIClient]:
    async with CRIClient(proxy.socket) as c:
        yield c


async def start_pod(k: CRIClient, name: str, cpu: int, limit: int | None = None, *, qos: str = "guaranteed",
                    annotations: dict[str, str] | None = None) -> tuple[str, str]:
    """RunPodSandbox + CreateContainer + StartContainer like kubelet; returns (sandbox id, container id)."""
    uid = f"e2e-{name}-{os.getpid()}-{time.monotonic_ns()}"
    cfg = k.sandbox_config(name, uid, qos=qos, annotations=annotations)
    sid = await k.run_pod_sandbox(cfg)
    cid = await k.create_container(sid, k.container_config("main", cpu_milli=cpu, limit_milli=limit), cfg)
    await k.start_container(cid)
    return sid, cid


async def delete_pod(k: CRIClient, sid: str, cid: str) -> None:
    """What kubelet does when a pod is deleted."""
    await k.stop_container(cid, timeout=0)
    await k.stop_pod_sandbox(sid)
    await k.remove_container(cid)
    await k.remove_pod_sandbox(sid)


async def pid_of(k: CRIClient, cid: str) -> int:
    st = await k.container_status(cid, verbose=True)
    return int(json.loads(st.info["info"])["pid"])


def allowed(pid: int) -> str:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Cpus_allowed_list:"):
            return line.split(":", 1)[1].strip()
    raise AssertionError(f"no Cpus_allowed_list for pid {pid}")


def cgroup_file(pid: int, controller: str, name: str) -> str:
    """A cgroup file of the process: v1 (``/sys/fs/cgroup/<controller>/<path>/<name>``) or, on a unified
    hierarchy, v2 (``/sys/fs/cgroup/<path>/<name>``)."""
    v2 = None
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, ctrls, path = line.split(":", 2)
        if controller in ctrls.split(","):
            base = Path("/sys/fs/cgroup") / ctrls
            if not base.exists():
                base = Path("/sys/fs/cgroup") / controller
            return (base / path.lstrip("/") / name).read_text().strip()
        if ctrls == "":
            v2 = path
    if v2 is not None and (Path("/sys/fs/cgroup") / v2.lstrip("/") / name).exists():
        return (Path("/sys/fs/cgroup") / v2.lstrip("/") / name).read_text().strip()
    raise AssertionError(f"pid {pid} has no {controller} cgroup file {name}")


def cfs_quota(pid: int) -> str:
    """The CPU quota of the process's cgroup: "-1" (v1) or "max" (v2) when there is none."""
    try:
        return cgroup_file(pid, "cpu", "cpu.cfs_quota_us")
    except (AssertionError, FileNotFoundError):
        q = cgroup_file(pid, "cpu", "cpu.max").split()[0]
        return "-1" if q == "max" else q


def cpus_of(pid: int) -> tuple[str, str]:
    """(Cpus_allowed_list, cgroup cpuset.cpus) of a container's process."""
    return allowed(pid), cgroup_file(pid, "cpuset", "cpuset.cpus")


@pytest.mark.containerd_matrix
async def test_exclusive_container_is_isolated_from_shared_ones_and_released(
        kubelet: CRIClient, proxy: ProxyProcess, machine_cpus: str) -> None:
    _, web = await start_pod(kubelet, "web", 200, qos="burstable")
    web_pid = await pid_of(kubelet, web)
    assert cpus_of(web_pid) == (machine_cpus, machine_cpus)
    db_sid, db = await start_pod(kubelet, "db", 1000, 1000)
    db_pid = await pid_of(kubelet, db)
    assert cpus_of(db_pid) == (EXCL, EXCL)
    assert cfs_quota(db_pid) == "-1"  # quota lifted for the pinned container
    assert cpus_of(web_pid) == (SHARED, SHARED)  # narrowed off the exclusive CPU
    assert cgroup_file(web_pid, "cpu", "cpu.shares") == "204"  # narrowing touched only the cpuset
    entries = proxy.state()["entries"]
    assert [v for pod in entries.values() for v in pod.values()] == [EXCL]
    # a late shared container starts narrowed too
    _, late = await start_pod(kubelet, "late", 100, qos="besteffort")
    assert cpus_of(await pid_of(kubelet, late)) == (SHARED, SHARED)
    await delete_pod(kubelet, db_sid, db)
    assert cpus_of(web_pid) == (machine_cpus, machine_cpus)
    assert proxy.state().get("entries", {}) == {}


async def test_a_bypass_annotation_never_reaches_exclusive_cpus(
        kubelet: CRIClient, proxy: ProxyProcess, machine_cpus: str) -> None:
    """Issue 25, in the kernel: a tenant's bypass (namespace default, not listed) is ignored, one in numapin's own
    namespace (listed by default) is honoured; both run on the shared pool and are narrowed off db's CPU."""
    pids = []
    for ns in ("default", "numapin"):
        cfg = kubelet.sandbox_config(f"tool-{ns}", f"e2e-tool-{ns}-{os.getpid()}-{time.monotonic_ns()}",
                                     namespace=ns, qos="burstable", annotations={"numapin.io/bypass": "true"})
        sid = await kubelet.run_pod_sandbox(cfg)
        cid = await kubelet.create_container(sid, kubelet.container_config("main", cpu_milli=200), cfg)
        await kubelet.start_container(cid)
        pids.append(await pid_of(kubelet, cid))
    assert [cpus_of(pid) for pid in pids] == [(machine_cpus, machine_cpus)] * 2
    _, db = await start_pod(kubelet, "db", 1000, 1000)
    assert cpus_of(await pid_of(kubelet, db)) == (EXCL, EXCL)
    assert [cpus_of(pid) for pid in pids] == [(SHARED, SHARED)] * 2


async def test_share_mode_is_pinned_but_shared_containers_keep_its_cpu(
        kubelet: CRIClient, proxy: ProxyProcess, machine_cpus: str) -> None:
    _, web = await start_pod(kubelet, "web", 200, qos="burstable")
    _, cache = await start_pod(kubelet, "cache", 1000, 1000, qos="burstable",
                               annotations={"qos.gocrane.io/cpu-manager": "share"})
    assert cpus_of(await pid_of(kubelet, cache)) == (EXCL, EXCL)
    assert cpus_of(await pid_of(kubelet, web)) == (machine_cpus, machine_cpus)


@pytest.mark.containerd_matrix
async def test_proxy_killed_and_restarted_in_the_middle_of_a_pods_life(
        kubelet: CRIClient, proxy: ProxyProcess, lab: ContainerdLab, machine_cpus: str) -> None:
    _, web = await start_pod(kubelet, "web", 200, qos="burstable")
    db_sid, db = await start_pod(kubelet, "db", 1000, 1000)
    web_pid, db_pid = await pid_of(kubelet, web), await pid_of(kubelet, db)
    proxy.kill()
    async with CRIClient(lab.socket) as direct:  # while the proxy is dead, the web container drifts back
        from numapin_lab.cri.client import pb
        await direct.update_container_resources(web, pb.LinuxContainerResources(cpuset_cpus=machine_cpus))
    assert cpus_of(web_pid)[0] == machine_cpus
    await asyncio.to_thread(proxy.start)
    assert cpus_of(web_pid) == (SHARED, SHARED)  # re-applied by reconcile
    assert cpus_of(db_pid) == (EXCL, EXCL)
    async with CRIClient(proxy.socket) as k2:
        with pytest.raises(grpc.aio.AioRpcError) as err:  # CPU 1 is still taken: no double assignment
            await start_pod(k2, "db2", 1000, 1000)
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        await delete_pod(k2, db_sid, db)
        assert cpus_of(web_pid) == (machine_cpus, machine_cpus)
        _, db3 = await start_pod(k2, "db3", 1000, 1000)
        assert cpus_of(await pid_of(k2, db3)) == (EXCL, EXCL)


@pytest.mark.containerd_matrix
async def test_containerd_restarted_under_the_proxy(
        kubelet: CRIClient, proxy: ProxyProcess, lab: ContainerdLab) -> None:
    _, web = await start_pod(kubelet, "web", 200, qos="burstable")
    web_pid = await pid_of(kubelet, web)
    state_before = proxy.state()
    await asyncio.to_thread(lab.stop_containerd)
    try:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await kubelet.version()
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await start_pod(kubelet, "db", 1000, 1000)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        assert proxy.state() == state_before  # nothing allocated, nothing leaked
    finally:
        await asyncio.to_thread(lab.start_containerd)
    for _ in range(300):  # the proxy reconnects by itself (back-off at most 2 s)
        try:
            await kubelet.version()
            break
        except grpc.aio.AioRpcError:
            await asyncio.sleep(0.1)
    _, db = await start_pod(kubelet, "db", 1000, 1000)
    assert cpus_of(await pid_of(kubelet, db)) == (EXCL, EXCL)
    assert cpus_of(web_pid) == (SHARED, SHARED)


@pytest.mark.containerd_matrix
def test_lab_cleanup_leaves_nothing_behind(containerd_bin: Path | None) -> None:
    """stop() with pods still running (and one whose shim was killed under it): no process, mount, socket, shim
    socket or pod cgroup stays; a pod removed through the client goes with its cgroup, as kubelet removes it."""
    d = scratch_dir("npx-lab2-")
    lab = ContainerdLab(d / "c", containerd_bin).start()
    pods: dict[str, str] = {}
    try:
        async def run() -> None:
            async with CRIClient(lab.socket) as c:
                for name, qos in (("x", "besteffort"), ("y", "guaranteed"), ("z", "burstable")):
                    sid, _ = await start_pod(c, name, 100, qos=qos)
                    pods[name] = c.cgroup_parents[sid]
                gone = c.sandbox_config("gone", "lab2-gone")
                sid = await c.run_pod_sandbox(gone)
                pods["gone"] = gone.linux.cgroup_parent
                assert existing_cgroup_dirs(pods["gone"])
                await c.stop_pod_sandbox(sid)
                await c.remove_pod_sandbox(sid)
                assert existing_cgroup_dirs(pods["gone"]) == []
        asyncio.run(run())
        shims = lab._shims()
        assert len(shims) >= 3 and all(existing_cgroup_dirs(p) for p in pods.values() if p != pods["gone"])
        os.kill(shims[0][0], signal.SIGKILL)  # its container keeps running, reparented
    finally:
        lab.stop()
    assert lab.leftovers() == []
    assert [p for p in pods.values() if existing_cgroup_dirs(p)] == []
    assert [cid for _, cid in shims if lab._shim_socket(cid).exists()] == []
    shutil.rmtree(d, ignore_errors=True)


async def test_concurrent_creates_on_containerd(kubelet: CRIClient, proxy: ProxyProcess, machine_cpus: str) -> None:
    _, web = await start_pod(kubelet, "web", 200, qos="burstable")

    async def one(i: int) -> str | None:
        try:
            return (await start_pod(kubelet, f"db{i}", 1000, 1000))[1]
        except grpc.aio.AioRpcError as e:
            assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, e.details()
            return None

    won = [c for c in await asyncio.gather(*(one(i) for i in range(4))) if c is not None]
    assert len(won) == 1  # one allocatable CPU: exactly one pod gets it
    assert cpus_of(await pid_of(kubelet, won[0])) == (EXCL, EXCL)
    assert cpus_of(await pid_of(kubelet, web)) == (SHARED, SHARED)
    assert len(proxy.state()["entries"]) == 1
