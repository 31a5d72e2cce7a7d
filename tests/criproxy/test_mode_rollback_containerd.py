"""A change of a running pod to ``exclusive`` whose narrowing fails is rolled back, end to end on real containerd +
runc, every cpuset read from the kernel: the failure is real (a child cgroup inside a shared container's cpuset
cgroup holds the CPU that was to become exclusive, so the kernel refuses to narrow it, directly and through runc),
the allocator's state goes back to what it was, the shared containers narrowed meanwhile are widened back, the
failure is counted and shown in /status, and the same change works once the cause is gone. A kill -9 of the proxy
while it narrows (containerd frozen meanwhile) loses nothing and leaks nothing exclusive after the restart."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from numapin_lab.cri.client import CRIClient
from numapin_lab.cri.containerd import ContainerdLab

from . import test_e2e_containerd as e2e
from .test_e2e_containerd import EXCL, ROOT, SHARED, ProxyProcess, cpus_of, pid_of, start_pod
from .test_modes_containerd import MODE, get, numapin_mode

lab, proxy, kubelet, machine_cpus = e2e.lab, e2e.proxy, e2e.kubelet, e2e.machine_cpus  # the same fixtures

pytestmark = pytest.mark.containerd


def cpuset_cgroup(pid: int) -> Path:
    """The process's cgroup v1 cpuset directory (the injected failure needs a v1 cpuset hierarchy)."""
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, ctrls, path = line.split(":", 2)
        if "cpuset" in ctrls.split(","):
            return Path("/sys/fs/cgroup/cpuset") / path.lstrip("/")
    raise AssertionError(f"pid {pid} has no cgroup v1 cpuset hierarchy: this test injects its failure there")


@contextmanager
def cpu_held_by_a_child_cgroup(pid: int, cpus: str) -> Iterator[Path]:
    """A child cgroup of the container's cpuset cgroup using ``cpus``: the kernel refuses (EBUSY) any cpuset.cpus
    of the container that leaves them out, whoever writes it (the proxy, runc)."""
    parent = cpuset_cgroup(pid)
    child = parent / "numapin-test-block"
    child.mkdir()
    try:
        (child / "cpuset.mems").write_text((parent / "cpuset.mems").read_text())
        (child / "cpuset.cpus").write_text(cpus)
        with pytest.raises(OSError):  # the kernel really refuses the narrowing now
            (parent / "cpuset.cpus").write_text(SHARED)
        yield child
    finally:
        child.rmdir()


@contextmanager
def frozen(lab: ContainerdLab) -> Iterator[None]:
    """containerd stopped (SIGSTOP) for the block, continued after."""
    assert lab.proc is not None
    os.kill(lab.proc.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(lab.proc.pid, signal.SIGCONT)


async def three_pods(kubelet: CRIClient) -> tuple[int, int, int]:
    """Two shared pods (web, api) and a Guaranteed one (db) running with mode ``none`` on the shared pool, to be
    changed to exclusive: their containers' pids."""
    _, web = await start_pod(kubelet, "web", 200, qos="burstable")
    _, api = await start_pod(kubelet, "api", 300, qos="burstable")
    _, db = await start_pod(kubelet, "db", 1000, 1000, annotations={MODE: "none"})
    web_pid, api_pid, db_pid = [await pid_of(kubelet, c) for c in (web, api, db)]
    return web_pid, api_pid, db_pid


async def test_a_failed_narrowing_is_rolled_back_and_a_retry_works(
        kubelet: CRIClient, proxy: ProxyProcess, machine_cpus: str) -> None:
    ALL = machine_cpus
    web_pid, api_pid, db_pid = await three_pods(kubelet)
    state = proxy.state()
    with cpu_held_by_a_child_cgroup(api_pid, EXCL):
        out = await asyncio.to_thread(numapin_mode, proxy, "default/db", "exclusive")
        assert out.returncode == 2, out.stdout + out.stderr
        assert "rolled back" in out.stdout and "default/api container=main" in out.stdout, out.stdout
        assert "every cpuset restored" in out.stdout, out.stdout
        # the kernel: nobody moved for good (web, narrowed meanwhile, is wide again); the state is as it was
        for pid in (web_pid, api_pid, db_pid):
            assert cpus_of(pid) == (ALL, ALL), pid
        assert proxy.state() == state
        metrics = await asyncio.to_thread(get, f"http://127.0.0.1:{proxy.port}/metrics")
        assert 'numapin_criproxy_mode_rollbacks_total{from="none",to="exclusive"} 1.0' in metrics
        assert 'numapin_criproxy_mode_changes_total{from="none",to="exclusive"}' not in metrics
        status = json.loads(await asyncio.to_thread(get, f"http://127.0.0.1:{proxy.port}/status"))
        db_mode = next(p for p in status["podModes"] if p["pod"] == "default/db")
        assert db_mode["mode"] == "none" and db_mode["changed"] is False
        assert db_mode["failure"]["reason"] == "NarrowingFailed" and db_mode["failure"]["mode"] == "exclusive"
        assert "mode change rolled back: pod default/db: mode none -> exclusive" in proxy.log.read_text()
        # the cause is still there: a second try is rolled back the same way
        out = await asyncio.to_thread(numapin_mode, proxy, "default/db", "exclusive")
        assert out.returncode == 2 and "rolled back" in out.stdout
        assert cpus_of(db_pid) == (ALL, ALL) and cpus_of(web_pid) == (ALL, ALL)
    # the cause gone, the same change works
    out = await asyncio.to_thread(numapin_mode, proxy, "default/db", "exclusive")
    assert out.returncode == 0, out.stdout + out.stderr
    assert cpus_of(db_pid) == (EXCL, EXCL)
    assert cpus_of(web_pid) == (SHARED, SHARED) and cpus_of(api_pid) == (SHARED, SHARED)
    assert list(proxy.state()["numapin"]["podModes"].values()) == ["exclusive"]
    status = json.loads(await asyncio.to_thread(get, f"http://127.0.0.1:{proxy.port}/status"))
    db_mode = next(p for p in status["podModes"] if p["pod"] == "default/db")
    assert db_mode["mode"] == "exclusive" and db_mode["failure"] is None


async def test_proxy_killed_while_narrowing_loses_nothing_and_leaks_nothing_exclusive(
        kubelet: CRIClient, proxy: ProxyProcess, lab: ContainerdLab, machine_cpus: str) -> None:
    """web is narrowed in the kernel at once; api's cgroup refuses, so the proxy goes on through containerd, which
    is frozen: the proxy is killed -9 in the middle of the change. After the restart the old decision holds in the
    kernel (web wide again, db on the shared pool, no exclusive CPU on disk) and the change then works."""
    ALL = machine_cpus
    web_pid, api_pid, db_pid = await three_pods(kubelet)
    state = proxy.state()
    landed = []  # per try: whether the kill landed mid-change (web narrowed, the command not answered)
    for _ in range(4):  # a kill may land after the rollback on a loaded machine: tried again then
        landed.append(await kill_while_narrowing(proxy, lab, web_pid, api_pid))
        await asyncio.to_thread(proxy.start)  # reconcile and a convergence pass, judged from the kernel
        for pid in (web_pid, api_pid, db_pid):
            assert cpus_of(pid) == (ALL, ALL), (pid, landed, proxy.log.read_text()[-3000:])
        assert proxy.state() == state  # nothing exclusive on disk, nothing lost
        if landed[-1]:
            break
    assert landed[-1], f"no kill landed in the middle of the narrowing in {len(landed)} tries"
    out = await asyncio.to_thread(numapin_mode, proxy, "default/db", "exclusive")
    assert out.returncode == 0, out.stdout + out.stderr
    assert cpus_of(db_pid) == (EXCL, EXCL) and cpus_of(web_pid) == (SHARED, SHARED)
    assert cpus_of(api_pid) == (SHARED, SHARED)


async def kill_while_narrowing(proxy: ProxyProcess, lab: ContainerdLab, web_pid: int, api_pid: int) -> bool:
    """Ask for db -> exclusive with api's cgroup refusing the narrowing; as soon as the kernel shows web narrowed,
    freeze containerd (the proxy's way round api's cgroup) and kill -9 the proxy. Returns whether the kill landed
    while web was narrowed and the change unanswered."""
    with cpu_held_by_a_child_cgroup(api_pid, EXCL):
        command = subprocess.Popen([sys.executable, "-m", "numapin", "mode", "default/db", "exclusive", "--socket",
                                    str(proxy.dir / "control.sock")], stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True, cwd=ROOT,
                                   env={**os.environ, "PYTHONPATH": str(ROOT)})
        try:
            deadline = time.monotonic() + 60  # a bound on the wait, not a speed check
            while time.monotonic() < deadline:  # until the kernel shows web narrowed (or the command ended)
                if cpus_of(web_pid)[1] == SHARED or command.poll() is not None:
                    break
            with frozen(lab):
                landed = command.poll() is None and cpus_of(web_pid)[1] == SHARED
                proxy.kill()
        finally:
            command.communicate(timeout=60)
    return landed
