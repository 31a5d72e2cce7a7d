"""A node moved between proxy mode and NRI mode without a drain (docs/nri.md, "Switching a node between the modes"):
pods admitted through ``numapin criproxy`` (a kubelet-like client on the proxy's socket) keep their CPUs when the
proxy stops and ``numapin nri`` starts on the same state directory (the client now on containerd's socket), the
exclusive CPU stays taken, deletes release it; and the same on the way back. REAL containerd 2.1.9 with NRI on
(the session's ``nri_lab``); judged from the kernel: the processes' ``Cpus_allowed_list`` and cgroup cpusets,
sampled through each switch, and the second door's repair counter (a door that had to move something repairs)."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc.aio
import pytest

from allocator.topology import Topology
from numapin_lab.cri.client import CRIClient
from numapin_lab.cri.containerd import ContainerdLab
from numapin_lab.cri.ledger import scratch_dir
from numapin_lab.cri.nri_process import NriProcess
from numapin_lab.cri.proxy_process import ROOT, ProxyProcess
from tests.criproxy.test_e2e_containerd import EXCL, SHARED, cpus_of, delete_pod, pid_of, start_pod

pytestmark = pytest.mark.containerd


@pytest.fixture
def node_dir() -> Iterator[Path]:
    """One directory for both doors: the same ``state/`` (cpu_manager_state), logs and control socket."""
    d = scratch_dir("npx-switch-")
    yield d
    shutil.rmtree(d, ignore_errors=True)


def repairs(door: ProxyProcess) -> float:
    """The door's ``numapin_criproxy_cpuset_repairs_total`` summed over triggers and results."""
    with urllib.request.urlopen(f"http://127.0.0.1:{door.port}/metrics", timeout=5) as r:
        text = r.read().decode()
    return sum(float(m.group(1)) for m in re.finditer(r"^numapin_criproxy_cpuset_repairs_total\{[^}]*\} (\S+)$",
                                                       text, flags=re.M))


async def _sampled(pids: dict[str, int], want: dict[str, tuple[str, str]],
                   switch: Callable[[], Any]) -> tuple[Any, int]:
    """Runs ``switch`` in a thread while the kernel's cpusets of ``pids`` are sampled; any sample that is not
    ``want`` fails. Returns the switch's result and how many samples were taken."""
    seen: list[tuple[str, tuple[str, str]]] = []
    done = asyncio.Event()
    count = 0

    async def sample() -> None:
        nonlocal count
        while not done.is_set():
            for name, pid in pids.items():
                got = cpus_of(pid)
                if got != want[name]:
                    seen.append((name, got))
            count += 1
            await asyncio.sleep(0.01)

    sampler = asyncio.create_task(sample())
    try:
        result = await asyncio.to_thread(switch)
    finally:
        done.set()
        await sampler
    assert seen == [], f"the kernel moved a container during the switch: {seen[:5]}"
    return result, count


async def _refused(k: CRIClient, name: str) -> str:
    cfg = k.sandbox_config(name, f"switch-{name}-{os.getpid()}-{time.monotonic_ns()}")
    sid = await k.run_pod_sandbox(cfg)
    with pytest.raises(grpc.aio.AioRpcError) as err:  # the one allocatable CPU is taken
        await k.create_container(sid, k.container_config("main", cpu_milli=1000, limit_milli=1000), cfg)
    return err.value.details() or ""


async def _wait_cpus(pid: int, want: tuple[str, str], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while (got := cpus_of(pid)) != want:
        assert time.monotonic() < deadline, f"pid {pid}: the kernel shows {got}, not {want}"
        await asyncio.sleep(0.05)


@pytest.mark.parametrize("nri_lab", ["2.x"], indirect=True, ids=["containerd2.x"])
async def test_proxy_to_nri_and_back_without_a_drain(nri_lab: ContainerdLab, node_dir: Path) -> None:
    cpu_all = str(Topology.from_sysfs("/sys").all_cpus)
    proxy = ProxyProcess(node_dir, nri_lab.socket, reserved_cpus=SHARED)
    plugin = NriProcess(node_dir, nri_lab.socket, nri_lab.nri_socket, reserved_cpus=SHARED)
    assert plugin.state_dir == proxy.state_dir
    try:
        # proxy mode: kubelet's calls pass the proxy
        await asyncio.to_thread(proxy.start)
        async with CRIClient(proxy.socket) as kubelet:
            _, web = await start_pod(kubelet, "web", 200, qos="burstable")
            db_sid, db = await start_pod(kubelet, "db", 1000, 1000)
            web_pid, db_pid = await pid_of(kubelet, web), await pid_of(kubelet, db)
        pids = {"web": web_pid, "db": db_pid}
        assert cpus_of(db_pid) == (EXCL, EXCL) and cpus_of(web_pid) == (SHARED, SHARED)
        entries = proxy.state()["entries"]

        # to NRI mode: the proxy stops, the plugin starts on the same state, kubelet talks to containerd
        def to_nri() -> dict[str, Any]:
            proxy.stop()
            return plugin.start()

        _, samples = await _sampled(pids, {"web": (SHARED, SHARED), "db": (EXCL, EXCL)}, to_nri)
        assert samples > 0
        assert plugin.state()["entries"] == entries
        assert repairs(plugin) == 0, plugin.log_tail()  # it adopted every container as it was
        # docs/nri.md's check of a node: numapin status against the plugin, the kernel agreeing with the state
        shown = await asyncio.to_thread(
            subprocess.run, [sys.executable, "-m", "numapin", "status", "--status-url",
                             f"http://127.0.0.1:{plugin.port}/status", "--runtime-endpoint", f"unix://{nri_lab.socket}"],
            capture_output=True, text=True, cwd=ROOT, timeout=120)
        assert shown.returncode == 0, shown.stdout + shown.stderr
        async with CRIClient(nri_lab.socket) as kubelet:
            assert "numapin: pod" in await _refused(kubelet, "db2")
            _, late = await start_pod(kubelet, "late", 100, qos="besteffort")
            late_pid = await pid_of(kubelet, late)
            assert cpus_of(late_pid) == (SHARED, SHARED)  # created narrowed through NRI
            await delete_pod(kubelet, db_sid, db)  # released: the pool widens in the kernel
            await _wait_cpus(web_pid, (cpu_all, cpu_all))
            assert plugin.state().get("entries", {}) == {}
            db3_sid, db3 = await start_pod(kubelet, "db3", 1000, 1000)
            db3_pid = await pid_of(kubelet, db3)
        assert cpus_of(db3_pid) == (EXCL, EXCL)
        assert cpus_of(web_pid) == (SHARED, SHARED) and cpus_of(late_pid) == (SHARED, SHARED)
        entries = plugin.state()["entries"]

        # and back to proxy mode
        pids = {"web": web_pid, "late": late_pid, "db3": db3_pid}

        def to_proxy() -> dict[str, Any]:
            plugin.stop()
            return proxy.start()

        _, samples = await _sampled(
            pids, {"web": (SHARED, SHARED), "late": (SHARED, SHARED), "db3": (EXCL, EXCL)}, to_proxy)
        assert samples > 0
        assert proxy.state()["entries"] == entries
        assert repairs(proxy) == 0, proxy.log_tail()
        async with CRIClient(proxy.socket) as kubelet:
            assert "numapin: pod" in await _refused(kubelet, "db4")
            await delete_pod(kubelet, db3_sid, db3)
            await _wait_cpus(web_pid, (cpu_all, cpu_all))
            await _wait_cpus(late_pid, (cpu_all, cpu_all))
        assert proxy.state().get("entries", {}) == {}
    finally:
        plugin.stop()
        proxy.stop()
        await nri_lab.remove_all_pods()
