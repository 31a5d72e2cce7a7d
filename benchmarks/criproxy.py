#!/usr/bin/env python3
"""Benchmark of numapin's CRI proxy: the same calls direct to the runtime and through the proxy, in one run.

Prints one JSON document, each figure beside its direct (or anchor) counterpart:
- ``unary``: p50/p99 latency of small unary calls (Version, ContainerStatus) against the in-memory runtime, direct
  and through a proxy with each relay (``--relay frames`` and ``--relay grpc``, two proxy processes in front of the
  same runtime; calls rotate between direct and the two proxies, so all see the same machine load), and the CPU
  time each proxy process spends per 1,000 relayed calls beside the runtime's own per 1,000 calls it answers
  (from /proc/<pid>/stat: user + system, all threads);
- ``list_containers_1000``: the same for ListContainers returning 1000 containers (in-memory runtime);
- ``kubelet_steady_state``: 110 pods (220 containers); kubelet's calls at kubelet's rates (PLEG relist every second:
  ListPodSandbox + ListContainers; every pod synced once a minute: ListPodSandbox, PodSandboxStatus and
  ListContainers filtered to the pod, ContainerStatus of each container; Status every 5 s; ListContainerStats,
  ListPodSandboxStats and ImageFsInfo every 10 s) for ``--steady-seconds``, through a proxy with each relay at
  the same time (two kubelets, each with its own proxy, one runtime): each proxy's CPU as a percentage of one
  core, beside the runtime's (which answers both) (the proxies with ``--converge-period 0``: the lab runtime's
  containers have no processes for the kernel-truth pass to read);
- ``create_remove_containerd``: CreateContainer + RemoveContainer against a real containerd (lab);
- ``concurrent_pods_containerd``: 20 pods created at once (RunPodSandbox + CreateContainer + StartContainer each)
  on a real containerd, direct and through the proxy: wall time of the burst (median of rounds) and the ratio;
- ``narrow_100_shared`` (in-memory runtime): creating an exclusive container while 100 shared containers run
  (each narrowed by UpdateContainerResources first): the proxy's narrowing time (from its metrics) and the create
  latency;
- ``narrow_containerd`` (100 real containers on containerd): the same with the proxy writing the running
  containers' cgroups directly (``--cpuset-writes kernel``), with the previous way (``runtime``: one
  UpdateContainerResources each) and with ``kernel`` again, in one run: the proxy's narrowing time, the time from
  the exclusive container's CreateContainer until the kernel (read by this script) shows no other container on its
  CPUs, its create and start latency; beside the anchors on the same containers without a proxy (all
  UpdateContainerResources at once and 8 at a time, all ``runc update`` processes at once, the cgroup files
  written one after another).
The proxy, the runtime and containerd run as separate processes (`python -m numapin criproxy`, the
in-memory runtime module, containerd); the client is this process.

    python benchmarks/criproxy.py [--quick] [--no-containerd]
    [--only relay|steady|concurrent_pods_containerd|narrow_containerd] [--steady-seconds S] [--pause S]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Awaitable, Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.proxy_lab import stop_process  # noqa: E402
from numapin_lab.cri.client import CRIClient, pb  # noqa: E402
from numapin_lab.cri.containerd import ContainerdLab  # noqa: E402

ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def _wait_socket(path: str, proc: subprocess.Popen, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        if os.path.exists(path):
            return
        time.sleep(0.02)
    raise RuntimeError(f"{what} did not create {path}")


def start_runtime(path: str, bulk: int = 0, pods: int = 0) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-m", "numapin_lab.cri.memory_runtime", path, "--bulk", str(bulk),
                          "--pods", str(pods)],
                         cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert p.stdout is not None
    p.stdout.readline()
    return p


def start_proxy(workdir: Path, runtime: str, metrics_port: int, *extra: str) -> subprocess.Popen:
    sock = str(workdir / "proxy.sock")
    log = open(workdir / "proxy.log", "ab")  # noqa: SIM115
    p = subprocess.Popen([sys.executable, "-m", "numapin", "criproxy", "--listen", sock, "--runtime-endpoint",
                          f"unix://{runtime}", "--state-dir", str(workdir / "state"), "--sysfs", "/sys",
                          "--reserved-cpus", "0", "--metrics-address", f"127.0.0.1:{metrics_port}",
                          "--log-level", "WARNING", *extra], cwd=ROOT, env=ENV, stdout=log, stderr=log)
    log.close()
    _wait_socket(sock, p, "proxy")
    return p


def stats(samples: list[float]) -> dict[str, float]:
    s = sorted(samples)
    q = statistics.quantiles(s, n=100, method="inclusive") if len(s) > 1 else [s[0]] * 99
    return {"n": len(s), "p50_ms": round(q[49] * 1000, 3), "p99_ms": round(q[98] * 1000, 3),
            "mean_ms": round(statistics.fmean(s) * 1000, 3)}


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` (all its threads) so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


Call = Callable[[], Awaitable[object]]


async def alternating(direct: Call, vias: dict[str, tuple[Call, int]], n: int, runtime_pid: int,
                      warmup: int = 20) -> dict:
    """``n`` calls direct and through each proxy (``vias``: relay -> (call, proxy pid)), in rotation, and the CPU
    each process spent meanwhile."""
    for _ in range(warmup):
        await direct()
        for via, _ in vias.values():
            await via()
    d: list[float] = []
    p: dict[str, list[float]] = {name: [] for name in vias}
    c_proxy = {name: cpu_seconds(pid) for name, (_, pid) in vias.items()}
    c_rt = cpu_seconds(runtime_pid)
    for _ in range(n):
        t0 = time.perf_counter()
        await direct()
        d.append(time.perf_counter() - t0)
        for name, (via, _) in vias.items():
            t0 = time.perf_counter()
            await via()
            p[name].append(time.perf_counter() - t0)
    c_rt = cpu_seconds(runtime_pid) - c_rt
    out: dict = {"direct": stats(d)}
    for name, (_, pid) in vias.items():
        r = compare(d, p[name])
        del r["direct"]
        r["p50_ratio"] = round(r["proxy"]["p50_ms"] / out["direct"]["p50_ms"], 3)
        r["p99_ratio"] = round(r["proxy"]["p99_ms"] / out["direct"]["p99_ms"], 3)
        r["proxy_cpu_ms_per_1000_calls"] = round((cpu_seconds(pid) - c_proxy[name]) / n * 1e6, 1)
        out[name] = r
    # the runtime answered n calls per path
    out["runtime_cpu_ms_per_1000_calls_anchor"] = round(c_rt / ((1 + len(vias)) * n) * 1e6, 1)
    return out


async def timed(fn: Callable[[], Awaitable[object]], n: int, warmup: int = 20) -> list[float]:
    for _ in range(warmup):
        await fn()
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        await fn()
        out.append(time.perf_counter() - t0)
    return out


async def ready(client: CRIClient) -> None:
    for _ in range(300):
        try:
            await client.version()
            return
        except Exception:
            await asyncio.sleep(0.05)
    raise RuntimeError("endpoint never answered")


def compare(direct: list[float], proxy: list[float]) -> dict:
    d, p = stats(direct), stats(proxy)
    return {"direct": d, "proxy": p, "overhead_p50_ms": round(p["p50_ms"] - d["p50_ms"], 3),
            "overhead_p99_ms": round(p["p99_ms"] - d["p99_ms"], 3)}


def metric(port: int, name: str) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    m = re.search(rf"^{re.escape(name)} ([0-9.e+-]+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


RELAYS = ("frames", "grpc")


def start_proxies(work: Path, rt_sock: str) -> dict[str, subprocess.Popen]:
    """A proxy with each relay in front of ``rt_sock`` (``work/<relay>/proxy.sock``)."""
    proxies: dict[str, subprocess.Popen] = {}
    try:
        for relay in RELAYS:
            (work / relay).mkdir(exist_ok=True)
            # --converge-period 0: see bench_steady
            proxies[relay] = start_proxy(work / relay, rt_sock, 0, "--converge-period", "0", "--relay", relay)
    except BaseException:
        for p in proxies.values():
            stop_process(p)
        raise
    return proxies


async def bench_memory(work: Path, n: int) -> dict:
    rt_sock = str(work / "rt.sock")
    rt = start_runtime(rt_sock, bulk=1000)
    proxies: dict[str, subprocess.Popen] = {}
    try:
        proxies = start_proxies(work, rt_sock)
        direct = CRIClient(rt_sock)
        vias = {relay: CRIClient(str(work / relay / "proxy.sock")) for relay in RELAYS}
        await ready(direct)
        for via in vias.values():
            await ready(via)
        await asyncio.sleep(5)  # the proxies' start-up reconcile of the 1000 containers is over
        cid = (await direct.list_containers())[0].id
        out: dict = {}
        for name, make in (("Version", lambda c: c.version),
                           ("ContainerStatus", lambda c: (lambda: c.container_status(cid)))):
            out[name] = await alternating(make(direct), {r: (make(c), proxies[r].pid) for r, c in vias.items()}, n,
                                          rt.pid)
        big = await alternating(direct.list_containers,
                                {r: (c.list_containers, proxies[r].pid) for r, c in vias.items()},
                                max(n // 10, 20), rt.pid, warmup=3)
        big["containers"] = len(await direct.list_containers())
        await direct.close()
        for via in vias.values():
            await via.close()
        return {"unary": out, "list_containers_1000": big, "load_average": os.getloadavg()}
    finally:
        for p in proxies.values():
            stop_process(p)
        stop_process(rt)


async def kubelet_load(k: CRIClient, seconds: float) -> int:
    """kubelet's CRI calls for its pods at kubelet's rates, for ``seconds``; returns the number of calls."""
    raw = k.channel.unary_unary  # opaque methods are called with raw bytes
    sandboxes = await k.list_pod_sandbox()
    containers: dict[str, list[str]] = {}
    for c in await k.list_containers():
        containers.setdefault(c.pod_sandbox_id, []).append(c.id)
    calls = 0
    start = time.monotonic()
    tick = 0
    while time.monotonic() - start < seconds:
        await k.list_pod_sandbox()  # PLEG relist
        await k.list_containers()
        calls += 2
        if tick % 5 == 0:
            await k.call("Status", pb.StatusRequest(), pb.StatusResponse)
            calls += 1
        if tick % 10 == 0:
            for m in ("ListContainerStats", "ListPodSandboxStats"):
                await raw(k.path(m))(b"", timeout=30)
            await raw(k.path("ImageFsInfo", "ImageService"))(b"", timeout=30)
            calls += 3
        # every pod once a minute: its status (spread over the minute)
        for sb in sandboxes[tick % 60::60] if len(sandboxes) >= 60 else sandboxes[tick % 60:tick % 60 + 1]:
            await k.call("ListPodSandbox", pb.ListPodSandboxRequest(filter=pb.PodSandboxFilter(id=sb.id)),
                         pb.ListPodSandboxResponse)
            await raw(k.path("PodSandboxStatus"))(b"\x0a" + bytes([len(sb.id)]) + sb.id.encode(), timeout=30)
            await k.list_containers(pod_sandbox_id=sb.id)
            calls += 3
            for cid in containers.get(sb.id, []):
                await k.container_status(cid)
                calls += 1
        tick += 1
        await asyncio.sleep(max(0.0, start + tick - time.monotonic()))
    return calls


async def bench_steady(work: Path, seconds: float, pods: int = 110) -> dict:
    rt_sock = str(work / "rt.sock")
    rt = start_runtime(rt_sock, pods=pods)
    # the in-memory runtime's containers have no processes: the kernel-truth pass would retry locating them for
    # ever (an artefact); it runs on changes only here, and its cost on a real node is not part of this figure
    proxies: dict[str, subprocess.Popen] = {}
    try:
        proxies = start_proxies(work, rt_sock)
        kubelets = {relay: CRIClient(str(work / relay / "proxy.sock")) for relay in RELAYS}
        for k in kubelets.values():
            await ready(k)
        await asyncio.sleep(2)  # the proxies' start-up reconcile is over
        c_proxy = {relay: cpu_seconds(p.pid) for relay, p in proxies.items()}
        c_rt, t0 = cpu_seconds(rt.pid), time.monotonic()
        calls = await asyncio.gather(*(kubelet_load(k, seconds) for k in kubelets.values()))
        elapsed = time.monotonic() - t0
        cpu = {relay: round((cpu_seconds(p.pid) - c_proxy[relay]) / elapsed * 100, 2) for relay, p in proxies.items()}
        for k in kubelets.values():
            await k.close()
        return {"pods": pods, "containers": 2 * pods, "seconds": round(elapsed, 1),
                "calls_per_second_per_kubelet": round(calls[0] / elapsed, 1),
                "cpu_percent_of_one_core": {
                    **{f"proxy_{relay}": v for relay, v in cpu.items()},
                    # the runtime answers both kubelets: its share for one
                    "runtime_anchor_per_kubelet": round((cpu_seconds(rt.pid) - c_rt) / elapsed * 100 / 2, 2)},
                "load_average": os.getloadavg()}
    finally:
        for p in proxies.values():
            stop_process(p)
        stop_process(rt)


async def bench_narrow(work: Path, rt_sock: str, shared: int, rounds: int) -> dict:
    """Through a proxy in front of ``rt_sock``: ``shared`` shared containers run, then an exclusive container
    is created ``rounds`` times (each time every shared container is narrowed first) and removed again."""
    port = _free_port()
    proxy = start_proxy(work, rt_sock, port)
    try:
        async with CRIClient(str(work / "proxy.sock")) as k:
            await ready(k)
            cfg = k.sandbox_config("web", f"bench-web-{os.getpid()}", qos="burstable")
            sid = await k.run_pod_sandbox(cfg)
            for i in range(shared):
                c = await k.create_container(sid, k.container_config(f"w{i}", cpu_milli=100), cfg)
                await k.start_container(c)
            creates, narrow = [], []
            for r in range(rounds):
                before_sum = metric(port, "numapin_criproxy_narrowing_seconds_sum")
                before_n = metric(port, "numapin_criproxy_narrowing_seconds_count")
                pcfg = k.sandbox_config(f"db{r}", f"bench-db-{r}-{os.getpid()}")
                psid = await k.run_pod_sandbox(pcfg)
                t0 = time.perf_counter()
                cid = await k.create_container(psid, k.container_config("db", cpu_milli=1000, limit_milli=1000),
                                               pcfg)
                creates.append(time.perf_counter() - t0)
                n_after = metric(port, "numapin_criproxy_narrowing_seconds_count")
                assert n_after > before_n, "no narrowing happened"
                narrow.append(metric(port, "numapin_criproxy_narrowing_seconds_sum") - before_sum)
                await k.remove_container(cid)  # widens the pool again
                await k.stop_pod_sandbox(psid)
                await k.remove_pod_sandbox(psid)
            await k.stop_pod_sandbox(sid)
            await k.remove_pod_sandbox(sid)
            return {"shared_containers": shared, "narrow": stats(narrow),
                    "exclusive_create_with_narrowing": stats(creates)}
    finally:
        stop_process(proxy)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def bench_containerd(work: Path, n: int) -> dict:
    lab = ContainerdLab(work / "ctrd")
    await asyncio.to_thread(lab.start)
    proxy = None
    try:
        proxy = start_proxy(work, lab.socket, 0)
        results = {}
        for label, endpoint in (("direct", lab.socket), ("proxy", str(work / "proxy.sock"))):
            async with CRIClient(endpoint) as k:
                await ready(k)
                cfg = k.sandbox_config(f"bench-{label}", f"bench-{label}-uid", qos="burstable")
                sid = await k.run_pod_sandbox(cfg)
                i = 0

                async def create_remove(k=k, sid=sid, cfg=cfg) -> None:
                    nonlocal i
                    i += 1
                    cid = await k.create_container(sid, k.container_config(f"c{i}", cpu_milli=100), cfg)
                    await k.remove_container(cid)

                results[label] = await timed(create_remove, n, warmup=3)
                await k.stop_pod_sandbox(sid)
                await k.remove_pod_sandbox(sid)
        return compare(results["direct"], results["proxy"])
    finally:
        if proxy is not None:
            stop_process(proxy)
        await asyncio.to_thread(lab.stop)


async def bench_concurrent_pods(work: Path, pods: int, rounds: int) -> dict:
    """``pods`` pods created at once, direct and through the proxy, ``rounds`` times each (alternating)."""
    lab = ContainerdLab(work / "ctrd")
    await asyncio.to_thread(lab.start)
    proxy = None
    try:
        proxy = start_proxy(work, lab.socket, 0)
        walls: dict[str, list[float]] = {"direct": [], "proxy": []}
        for r in range(rounds + 1):  # round 0 warms both paths up (image, shims, caches) and is not counted
            for label, endpoint in (("direct", lab.socket), ("proxy", str(work / "proxy.sock"))):
                async with CRIClient(endpoint) as k:
                    await ready(k)

                    async def one(i: int, k: CRIClient = k, label: str = label, r: int = r) -> str:
                        cfg = k.sandbox_config(f"b-{label}-{r}-{i}", f"b-{label}-{r}-{i}", qos="burstable")
                        sid = await k.run_pod_sandbox(cfg)
                        cid = await k.create_container(sid, k.container_config("app", cpu_milli=100), cfg)
                        await k.start_container(cid)
                        return sid

                    t0 = time.perf_counter()
                    sids = await asyncio.gather(*(one(i) for i in range(pods)))
                    wall = time.perf_counter() - t0
                    if r:
                        walls[label].append(wall)
                    for sid in sids:
                        await k.stop_pod_sandbox(sid)
                        await k.remove_pod_sandbox(sid)
        d, p = statistics.median(walls["direct"]), statistics.median(walls["proxy"])
        return {"pods": pods, "rounds": rounds,
                "direct_wall_ms": round(d * 1000, 1), "proxy_wall_ms": round(p * 1000, 1),
                "ratio": round(p / d, 3),
                "direct_rounds_ms": [round(w * 1000, 1) for w in walls["direct"]],
                "proxy_rounds_ms": [round(w * 1000, 1) for w in walls["proxy"]]}
    finally:
        if proxy is not None:
            stop_process(proxy)
        await asyncio.to_thread(lab.stop)


async def _start_shared(k: CRIClient, n: int, tag: str) -> tuple[str, list[str]]:
    cfg = k.sandbox_config("web", f"bench-web-{tag}", qos="burstable")
    sid = await k.run_pod_sandbox(cfg)
    ids = []
    for i in range(n):
        c = await k.create_container(sid, k.container_config(f"w{i}", cpu_milli=100), cfg)
        await k.start_container(c)
        ids.append(c)
    return sid, ids


async def _cgroups_of(direct: CRIClient, ids: list[str]) -> dict[str, Path]:
    """Each container's cpuset cgroup directory, from its first process (asked of containerd directly)."""
    out = {}
    for cid in ids:
        pid = json.loads((await direct.container_status(cid, verbose=True)).info["info"])["pid"]
        for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
            _, ctrls, path = line.split(":", 2)
            if "cpuset" in ctrls.split(","):
                out[cid] = Path("/sys/fs/cgroup/cpuset") / path.lstrip("/")
                break
            if ctrls == "":
                out[cid] = Path("/sys/fs/cgroup") / path.lstrip("/")
    return out


def _on_cpus(cgroups: dict[str, Path], cpus: set[int]) -> int:
    """How many of the containers the kernel lets run on any of ``cpus`` (cgroup cpuset and every process)."""
    from allocator.cpuset import CPUSet

    n = 0
    for d in cgroups.values():
        f = d / "cpuset.cpus.effective" if (d / "cpuset.cpus.effective").exists() else d / "cpuset.cpus"
        seen = CPUSet.parse(f.read_text().strip() or "")
        for pid in (d / "cgroup.procs").read_text().split():
            try:
                text = Path(f"/proc/{pid}/status").read_text()
            except OSError:
                continue
            line = next(x for x in text.splitlines() if x.startswith("Cpus_allowed_list:"))
            seen = seen | CPUSet.parse(line.split(":", 1)[1].strip())
        n += bool(set(seen) & cpus)
    return n


async def _exclusive_rounds(k: CRIClient, direct: CRIClient, port: int, cgroups: dict[str, Path], rounds: int,
                            pause: float, tag: str) -> dict:
    """``rounds`` times: an exclusive container is created (every shared container narrowed first), the kernel
    read until nobody else is on its CPUs, the container started and removed again (widening the pool)."""
    clear, creates, starts, narrow, late = [], [], [], [], 0
    for r in range(rounds):
        before_sum = metric(port, "numapin_criproxy_narrowing_seconds_sum")
        pcfg = k.sandbox_config(f"db{r}", f"bench-db-{tag}-{r}-{os.getpid()}")
        psid = await k.run_pod_sandbox(pcfg)
        t0 = time.perf_counter()
        cid = await k.create_container(psid, k.container_config("db", cpu_milli=1000, limit_milli=1000), pcfg)
        creates.append(time.perf_counter() - t0)
        own = {int(c) for c in (await direct.container_status(cid)).status.resources.linux.cpuset_cpus.split(",")
               if c.isdigit()}
        while await asyncio.to_thread(_on_cpus, cgroups, own):
            late += 1  # not clear yet when the create returned (the old way never leaves it so)
            await asyncio.sleep(0.001)
        clear.append(time.perf_counter() - t0)
        narrow.append(metric(port, "numapin_criproxy_narrowing_seconds_sum") - before_sum)
        t1 = time.perf_counter()
        await k.start_container(cid)  # the proxy checks the kernel again before it lets it start
        starts.append(time.perf_counter() - t1)
        await k.stop_container(cid, 0)
        await k.remove_container(cid)  # widens the pool again
        await k.stop_pod_sandbox(psid)
        await k.remove_pod_sandbox(psid)
        await asyncio.sleep(pause)  # containerd's records of the widening catch up (background)
    return {"narrowing_in_proxy": stats(narrow), "create_to_kernel_clear": stats(clear),
            "exclusive_create": stats(creates), "exclusive_start": stats(starts), "kernel_not_clear_polls": late}


async def _anchor_updates(direct: CRIClient, cgroups: dict[str, Path], runc_root: str, narrow: str, wide: str,
                          rounds: int) -> dict:
    """What narrowing the same containers costs without numapin: all UpdateContainerResources to containerd at
    once and 8 at a time, all ``runc update`` processes at once, and the cgroup files written one after
    another."""
    ids = list(cgroups)
    out: dict[str, list[float]] = {"containerd_updates_at_once": [], "containerd_updates_8_at_a_time": [],
                                   "runc_updates_at_once": [], "cgroup_writes": []}

    async def cri(value: str, fanout: int = len(ids)) -> None:
        res = pb.LinuxContainerResources(cpuset_cpus=value)
        slots = asyncio.Semaphore(fanout)

        async def one(c: str) -> None:
            async with slots:
                await direct.update_container_resources(c, res)
        await asyncio.gather(*(one(c) for c in ids))

    async def cri8(value: str) -> None:
        await cri(value, 8)

    async def runc(value: str) -> None:
        procs = [await asyncio.create_subprocess_exec("runc", "--root", runc_root, "update", "--cpuset-cpus", value,
                                                      c) for c in ids]
        if any([await p.wait() for p in procs]):
            raise RuntimeError("runc update failed")

    async def files(value: str) -> None:
        def write() -> None:
            for d in cgroups.values():
                (d / "cpuset.cpus").write_text(value)
        await asyncio.to_thread(write)

    for _ in range(rounds):
        for name, fn in (("containerd_updates_at_once", cri), ("containerd_updates_8_at_a_time", cri8),
                         ("runc_updates_at_once", runc), ("cgroup_writes", files)):
            t0 = time.perf_counter()
            await fn(narrow)
            out[name].append(time.perf_counter() - t0)
            await fn(wide)
    return {k: stats(v) for k, v in out.items()}


async def bench_narrow_containerd(work: Path, shared: int, rounds: int, pause: float) -> dict:
    """``shared`` shared containers on a real containerd; an exclusive container created ``rounds`` times through
    the proxy writing cgroups directly (``--cpuset-writes kernel``) and, in the same run, through a proxy that
    narrows with UpdateContainerResources only (``runtime``, the previous way); then the anchors on the same
    containers with no proxy running."""
    lab = ContainerdLab(work / "ctrd")
    await asyncio.to_thread(lab.start)
    try:
        out: dict = {"shared_containers": shared, "rounds": rounds, "pause_between_rounds_s": pause}
        async with CRIClient(lab.socket) as direct:
            cgroups: dict[str, Path] = {}
            sid = ""
            for writes in ("kernel", "runtime", "kernel"):
                port = _free_port()
                (work / writes).mkdir(exist_ok=True)
                proxy = start_proxy(work / writes, lab.socket, port, "--cpuset-writes", writes)
                try:
                    async with CRIClient(str(work / writes / "proxy.sock")) as k:
                        await ready(k)
                        if not sid:
                            sid, ids = await _start_shared(k, shared, str(os.getpid()))
                            cgroups = await _cgroups_of(direct, ids)
                        await asyncio.sleep(2)  # the start-up reconcile and its convergence pass are over
                        key = f"proxy_{writes}" if f"proxy_{writes}" not in out else f"proxy_{writes}_again"
                        out[key] = await _exclusive_rounds(k, direct, port, cgroups, rounds, pause, writes)
                finally:
                    stop_process(proxy)
            pool = (await direct.container_status(next(iter(cgroups)))).status.resources.linux.cpuset_cpus
            narrow = str(min(int(c) for c in pool.replace("-", ",").split(",")))
            out["anchor_no_proxy"] = await _anchor_updates(direct, cgroups, str(work / "ctrd" / "state" / "runc" /
                                                                                "k8s.io"), narrow, pool, rounds)
        await lab.remove_all_pods()  # with their cgroups, whoever ran them
        return out
    finally:
        await asyncio.to_thread(lab.stop)


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer iterations")
    ap.add_argument("--no-containerd", action="store_true", help="skip the real-containerd part")
    ap.add_argument("--steady-seconds", type=float, default=None,
                    help="length of the kubelet-like steady state (default 60, 20 with --quick)")
    ap.add_argument("--only", choices=("relay", "steady", "concurrent_pods_containerd", "narrow_containerd"),
                    help="run only the relay latency, steady-state, concurrent-creates or narrowing part")
    ap.add_argument("--pause", type=float, default=2.0,
                    help="seconds between narrowing rounds (containerd's records of the widening catch up)")
    args = ap.parse_args()
    n = 300 if args.quick else 2000
    work = Path(tempfile.mkdtemp(prefix="npx-bench-", dir="/tmp"))
    try:
        result: dict = {"cpus": os.cpu_count(), "iterations": n}
        if args.only == "narrow_containerd":
            (work / "nc").mkdir()
            result["narrow_containerd"] = await bench_narrow_containerd(work / "nc", 100, 5 if args.quick else 20,
                                                                        args.pause)
            print(json.dumps(result, indent=2))
            return
        if args.only == "concurrent_pods_containerd":
            (work / "cp").mkdir()
            result["concurrent_pods_containerd"] = await bench_concurrent_pods(work / "cp", 20, 3 if args.quick else 7)
            print(json.dumps(result, indent=2))
            return
        if args.only != "steady":
            (work / "m").mkdir()
            result.update(await bench_memory(work / "m", n))
        if args.only != "relay":
            (work / "s").mkdir()
            result["kubelet_steady_state"] = await bench_steady(
                work / "s", args.steady_seconds or (20.0 if args.quick else 60.0))
        if args.only:
            print(json.dumps(result, indent=2))
            return
        (work / "n").mkdir()
        rt = start_runtime(str(work / "n" / "rt.sock"))
        try:
            result["narrow_100_shared"] = await bench_narrow(work / "n", str(work / "n" / "rt.sock"), 100,
                                                             5 if args.quick else 20)
        finally:
            stop_process(rt)
        if not args.no_containerd:
            (work / "c").mkdir()
            result["create_remove_containerd"] = await bench_containerd(work / "c", 10 if args.quick else 40)
            (work / "cp").mkdir()
            result["concurrent_pods_containerd"] = await bench_concurrent_pods(work / "cp", 20, 3 if args.quick else 7)
            (work / "nc").mkdir()
            result["narrow_containerd"] = await bench_narrow_containerd(work / "nc", 100, 5 if args.quick else 20,
                                                                        args.pause)
        print(json.dumps(result, indent=2))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    asyncio.run(main())
