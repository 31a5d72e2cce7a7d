"""kubelet's in-place resize of a running container, end to end: a kubelet-like client sends what kubelet sends
(``UpdateContainerResources`` with the new CFS shares, quota and period, no cpuset) through `numapin criproxy` (a real
process) to a real containerd + runc. Every cpuset is read from the kernel (``/proc/<pid>/status`` and the cgroup);
a shared container runs beside and is sampled every few milliseconds while a resize is applied.

On this 2-CPU machine CPU 0 is reserved and CPU 1 is the only allocatable CPU: a growth is a move from the shared pool
to CPU 1 of its own (fractional -> integer), a shrink the move back (integer -> fractional), and a growth to 2 CPUs is
refused. Growths and shrinks of a container that keeps CPUs of its own are proved on the allocator's tables
(tests/allocator/test_resize.py) and on a multi-NUMA kernel (tests/numa/guest/test_resize.py)."""

from __future__ import annotations

import asyncio
import json
import random
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import AsyncIterator

import grpc
import grpc.aio
import pytest

from allocator.intent import INTENT_ANNOTATION
from numapin_lab.cri.client import CRIClient, pb
from numapin_lab.cri.containerd import ContainerdLab
from numapin_lab.cri.ledger import scratch_dir
from numapin_lab.cri.proxy_process import ProxyProcess, serving

from . import test_e2e_containerd as e2e
from .test_e2e_containerd import EXCL, ROOT, SHARED, allowed, cfs_quota, cpus_of, pid_of, start_pod

lab, machine_cpus = e2e.lab, e2e.machine_cpus  # the same fixtures

pytestmark = pytest.mark.containerd

MiB = 1024 * 1024


@pytest.fixture
async def proxy(lab: ContainerdLab) -> AsyncIterator[ProxyProcess]:
    p = ProxyProcess(scratch_dir("npx-r-"), lab.socket, reserved_cpus=SHARED, extra_args=("--relay", "frames"))
    async with serving(p, lab):
        yield p


@pytest.fixture
async def kubelet(proxy: ProxyProcess) -> AsyncIterator[CRIClient]:
    async with CRIClient(proxy.socket) as c:
        yield c


def kubelet_resources(cpu_milli: int, memory: int = 64 * MiB) -> pb.LinuxContainerResources:
    """What kubelet (cpuManagerPolicy none) sends for a Guaranteed container resized to ``cpu_milli``: the whole
    block, no cpuset."""
    return pb.LinuxContainerResources(cpu_period=100000, cpu_quota=cpu_milli * 100, cpu_shares=cpu_milli * 1024 // 1000,
                                      memory_limit_in_bytes=memory, oom_score_adj=-997,
                                      memory_swap_limit_in_bytes=memory)


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.read().decode()


async def until_published(proxy: ProxyProcess, available: str) -> None:
    """The NodeResourceTopology the proxy publishes says ``available`` free CPUs on NUMA node 0 (written in the
    background right after the decision)."""
    path = proxy.state_dir / "nrt" / "lab.json"
    seen = None
    for _ in range(100):
        nrt = json.loads(path.read_text())
        zone = next(z for z in nrt["zones"] if z["name"] == "node-0")
        seen = [r["available"] for r in zone["resources"] if r["name"] == "cpu"]
        if seen == [available]:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"the NodeResourceTopology says {seen} CPUs available, not {available}")


class Sampler:
    """Reads the resized container's and a shared container's ``Cpus_allowed_list`` every ``every`` seconds in a
    thread (the resized one first): a sample where the resized container is on ``own`` alone while the shared one
    still has a CPU of ``own`` is an isolation window."""

    def __init__(self, pid: int, shared_pid: int, own: str, every: float = 0.002) -> None:
        self.pid, self.shared_pid, self.own, self.every = pid, shared_pid, own, every
        self.samples: list[tuple[str, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            mine = allowed(self.pid)
            other = allowed(self.shared_pid)
            self.samples.append((mine, other))
            time.sleep(self.every)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def windows(self) -> list[tuple[str, str]]:
        own = set(_cpus(self.own))
        return [(m, o) for m, o in self.samples if set(_cpus(m)) == own and own & set(_cpus(o))]


def _cpus(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        if "-" in part:
            a, b = part.split("-")
            out.extend(range(int(a), int(b) + 1))
        elif part:
            out.append(int(part))
    return out


async def test_grow_shrink_and_refuse_judged_from_the_kernel(
        kubelet: CRIClient, proxy: ProxyProcess, machine_cpus: str) -> None:
    ALL = machine_cpus
    _, web = await start_pod(kubelet, "web", 200, qos="burstable")
    _, g = await start_pod(kubelet, "g", 500, 500)  # Guaranteed, fractional: the shared pool
    web_pid, g_pid = await pid_of(kubelet, web), await pid_of(kubelet, g)
    assert cpus_of(g_pid) == (ALL, ALL) and cfs_quota(g_pid) == "50000"
    # 500m -> 1: CPUs of its own; the shared container is off CPU 1 before the resized one is on it alone
    with Sampler(g_pid, web_pid, EXCL) as s:
        await kubelet.update_container_resources(g, kubelet_resources(1000))
    assert s.samples and s.windows() == []
    # read at once when the call returns: the kernel shows the new sets before kubelet hears OK
    assert cpus_of(g_pid) == (EXCL, EXCL) and cpus_of(web_pid) == (SHARED, SHARED)
    assert cfs_quota(g_pid) == "-1"  # pinned: no quota, though kubelet sent 100000
    state = proxy.state()
    assert [c for pod in state["entries"].values() for c in pod.values()] == [EXCL]
    await until_published(proxy, "0")  # the NodeResourceTopology follows: no free CPU left
    # kubelet retries on every sync: the same call again changes nothing and answers OK
    await kubelet.update_container_resources(g, kubelet_resources(1000))
    assert cpus_of(g_pid) == (EXCL, EXCL) and cfs_quota(g_pid) == "-1" and proxy.state() == state
    # 1 -> 2: the node has one allocatable CPU: refused, nothing changes (kernel, state, quota)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await kubelet.update_container_resources(g, kubelet_resources(2000))
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "resize refused (UnexpectedAdmissionError)" in (err.value.details() or "")
    assert "from 1 to 2 exclusive CPU(s)" in (err.value.details() or "")
    assert "keeps running as it was" in (err.value.details() or "")
    assert cpus_of(g_pid) == (EXCL, EXCL) and cpus_of(web_pid) == (SHARED, SHARED) and cfs_quota(g_pid) == "-1"
    assert proxy.state() == state
    # 1 -> 1500m: back to the shared pool, its quota from kubelet's limit again, the pool widened; the resized
    # container is on the whole pool before the shared one joins its CPU (never on CPU 1 alone with company)
    with Sampler(g_pid, web_pid, EXCL) as s:
        await kubelet.update_container_resources(g, kubelet_resources(1500))
    assert s.samples and s.windows() == []
    assert cpus_of(g_pid) == (ALL, ALL) and cpus_of(web_pid) == (ALL, ALL) and cfs_quota(g_pid) == "150000"
    assert proxy.state().get("entries", {}) == {}
    await until_published(proxy, "1")
    # seen by people: /status, numapin status, metrics, one log line per resize
    status = json.loads(await asyncio.to_thread(get, f"http://127.0.0.1:{proxy.port}/status"))
    results = [(r["pod"], r["result"], r["from"], r["to"]) for r in status["resizes"]]
    assert results == [("default/g", "resized", "shared pool", "1 CPU(s) exclusive"),
                       ("default/g", "refused", "1 CPU(s) exclusive", ""),
                       ("default/g", "resized", "1 CPU(s) exclusive", "shared pool")]
    assert status["resizes"][1]["reason"] == "UnexpectedAdmissionError"
    metrics = await asyncio.to_thread(get, f"http://127.0.0.1:{proxy.port}/metrics")
    assert 'numapin_criproxy_resizes_total{result="resized"} 2.0' in metrics
    assert 'numapin_criproxy_resizes_total{result="refused"} 1.0' in metrics
    assert "numapin_criproxy_resize_seconds_count 3.0" in metrics
    shown = await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "numapin", "status", "--status-url",
                                                     f"http://127.0.0.1:{proxy.port}/status", "--no-runtime"],
                                    capture_output=True, text=True, cwd=ROOT)
    assert "resize of default/g container main refused (UnexpectedAdmissionError)" in shown.stdout, shown.stdout
    assert "resize of default/g container main: shared pool -> 1 CPU(s) exclusive" in shown.stdout
    log = proxy.log.read_text()
    assert log.count("resize pod=default/g container=main: ") == 2
    assert log.count("resize pod=default/g container=main refused") == 1


async def test_memory_pass_then_cpu_pass_and_what_kubelet_reads_back(
        kubelet: CRIClient, proxy: ProxyProcess, machine_cpus: str) -> None:
    _, web = await start_pod(kubelet, "web", 200, qos="burstable")
    _, g = await start_pod(kubelet, "g", 500, 500)
    web_pid, g_pid = await pid_of(kubelet, web), await pid_of(kubelet, g)
    # kubelet resizes CPU and memory in two calls, memory first (CPU at its current values)
    await kubelet.update_container_resources(g, kubelet_resources(500, memory=128 * MiB))
    assert cpus_of(g_pid) == (machine_cpus, machine_cpus) and cfs_quota(g_pid) == "50000"
    await kubelet.update_container_resources(g, kubelet_resources(1000, memory=128 * MiB))
    assert cpus_of(g_pid) == (EXCL, EXCL) and cpus_of(web_pid) == (SHARED, SHARED) and cfs_quota(g_pid) == "-1"
    st = (await kubelet.container_status(g)).status
    # kubelet shows status.containerStatuses[].resources from this: the limit it set, not the runtime's -1
    assert (st.resources.linux.cpu_quota, st.resources.linux.cpu_period) == (100000, 100000)
    assert st.resources.linux.memory_limit_in_bytes == 128 * MiB
    assert st.resources.linux.cpu_shares == 1024
    # the runtime itself says -1 (what kubelet would have shown as "no limit", keeping the old one on display)
    async with CRIClient(proxy.runtime_socket) as direct:
        raw = (await direct.container_status(g)).status.resources.linux
        assert raw.cpu_quota == -1
    # a shared container's status is the runtime's own
    assert (await kubelet.container_status(web)).status.resources.linux.cpu_quota == 0


async def test_a_kill_of_the_proxy_mid_resize_leaves_the_old_or_the_new_decision(
        kubelet: CRIClient, proxy: ProxyProcess, machine_cpus: str) -> None:
    ALL = machine_cpus
    rng = random.Random(20)
    _, web = await start_pod(kubelet, "web", 200, qos="burstable")
    _, g = await start_pod(kubelet, "g", 500, 500)
    web_pid, g_pid = await pid_of(kubelet, web), await pid_of(kubelet, g)
    old, new = ((ALL, ALL), (ALL, ALL)), ((EXCL, EXCL), (SHARED, SHARED))
    seen = set()
    for i in range(6):
        grow = i % 2 == 0
        target = 1000 if grow else 500
        call = asyncio.ensure_future(kubelet.update_container_resources(g, kubelet_resources(target)))
        await asyncio.sleep(rng.uniform(0.0, 0.04))
        proxy.kill()
        with pytest.raises(BaseException):  # noqa: B017 - the answer is lost or the call was cut (any error)
            await call
            raise RuntimeError("answered before the kill")
        await asyncio.to_thread(proxy.start)
        after = (cpus_of(g_pid), cpus_of(web_pid))
        before_pair, after_pair = (old, new) if grow else (new, old)
        assert after in (before_pair, after_pair), (i, after)
        seen.add(after == after_pair)
        # kubelet's next sync sends the call again: the new decision, in the kernel
        async with CRIClient(proxy.socket) as k2:
            await k2.update_container_resources(g, kubelet_resources(target))
        assert (cpus_of(g_pid), cpus_of(web_pid)) == after_pair
        assert cfs_quota(g_pid) == ("-1" if grow else "50000")


async def test_a_container_created_again_after_a_resize_gets_the_resized_set(
        kubelet: CRIClient, proxy: ProxyProcess, machine_cpus: str) -> None:
    ALL = machine_cpus
    _, web = await start_pod(kubelet, "web", 200, qos="burstable")
    web_pid = await pid_of(kubelet, web)
    uid = f"uid-re-{time.monotonic_ns()}"
    # the webhook's intent, stamped at creation, says 500m; kubelet's create of attempt 1 carries the resized size
    intent = json.dumps({"v": 1, "qosClass": "Guaranteed", "cpuManager": None, "containers": [
        {"name": "main", "role": "app", "cpu": [500, 500], "memory": [None, None]}]})
    cfg = kubelet.sandbox_config("g", uid, annotations={INTENT_ANNOTATION: intent})
    sid = await kubelet.run_pod_sandbox(cfg)
    g = await kubelet.create_container(sid, kubelet.container_config("main", cpu_milli=500, limit_milli=500), cfg)
    await kubelet.start_container(g)
    assert cpus_of(await pid_of(kubelet, g)) == (ALL, ALL)
    await kubelet.update_container_resources(g, kubelet_resources(1000))
    assert cpus_of(await pid_of(kubelet, g)) == (EXCL, EXCL) and cpus_of(web_pid) == (SHARED, SHARED)
    # the container restarts (or resizePolicy RestartContainer): a new create with the new resources
    await kubelet.stop_container(g, timeout=0)
    await kubelet.remove_container(g)
    g = await kubelet.create_container(
        sid, kubelet.container_config("main", cpu_milli=1000, limit_milli=1000, attempt=1), cfg)
    await kubelet.start_container(g)
    assert cpus_of(await pid_of(kubelet, g)) == (EXCL, EXCL) and cpus_of(web_pid) == (SHARED, SHARED)
    assert cfs_quota(await pid_of(kubelet, g)) == "-1"


async def test_update_pod_sandbox_resources_is_relayed_untouched(kubelet: CRIClient, proxy: ProxyProcess) -> None:
    """kubelet >= 1.33 sends it around a resize; containerd 1.6 answers UNIMPLEMENTED, which kubelet ignores: the
    proxy must pass that answer on, never fail the call itself."""
    sid, _ = await start_pod(kubelet, "g", 500, 500)
    # UpdatePodSandboxResourcesRequest: pod_sandbox_id = 1 (the rest as the runtime reads it)
    body = b"\x0a" + bytes([len(sid)]) + sid.encode()
    method = "/runtime.v1.RuntimeService/UpdatePodSandboxResources"
    from criproxy.relay.grpc_relay import Upstream
    for target in (proxy.socket, proxy.runtime_socket):
        up = Upstream(target)
        try:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await up.call(method, body)
            assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED, target
        finally:
            await up.close()

