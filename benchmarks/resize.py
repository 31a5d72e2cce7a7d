#!/usr/bin/env python3
"""Benchmark of kubelet's in-place resize of a pinned container against a real containerd (lab), in one run.

A Guaranteed container of ``500m`` (on the shared pool) runs beside ``--shared`` shared containers; kubelet's call
(``UpdateContainerResources`` with the new shares, quota and period, no cpuset) resizes it to 1 CPU (a growth: it
takes the last CPU as its own, every shared container narrowed off it first and checked in the kernel) and back to
``500m`` (a shrink: it goes back to the pool, which widens after), ``--rounds`` times. On a machine of more CPUs the
growth is the same call; on this 2-CPU one it is the only growth there is (CPU 0 reserved).

For every call: the time from the client's call to the proxy's answer (which comes once the kernel shows the new
cpusets), the proxy's own time from the call's arrival to the kernel check (its log line), and whether every
container's ``Cpus_allowed_list`` was already the new one when the answer came; beside it, in the same rounds (each
resize followed by its anchor, so both see the same load), the same cpuset change sent directly to containerd
(``UpdateContainerResources`` with the cpuset and kubelet's values, no proxy) for an *anchor* container of the same
shape that numapin leaves alone (a bypassed pod in a namespace the proxy is told to pass through untouched).

Prints one JSON document.

    python benchmarks/resize.py [--shared 20] [--rounds 30]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from allocator.pod import BYPASS_ANNOTATION  # noqa: E402
from benchmarks.proxy_lab import ALL, EXCL, RESERVED, allowed, pid_of, start_proxy, stop_process  # noqa: E402
from benchmarks.timing import stats_ms as stats  # noqa: E402
from numapin_lab.cri.client import CRIClient, pb  # noqa: E402
from numapin_lab.cri.containerd import ContainerdLab  # noqa: E402

ANCHOR_NAMESPACE = "numapin-bench-anchor"  # the anchor's pod: passed through untouched by the proxy


async def run(shared: int, rounds: int, pause: float) -> dict:
    work = Path(tempfile.mkdtemp(prefix="npx-bench-resize-", dir="/tmp"))
    lab = ContainerdLab(work / "ctrd")
    lab.start()
    proxy = None
    try:
        proxy = start_proxy(work, lab.socket, log_level="INFO",
                            extra=("--bypass-namespaces", ANCHOR_NAMESPACE,
                                   "--bypass-all-cpus-namespaces", ANCHOR_NAMESPACE))
        async with CRIClient(str(work / "proxy.sock")) as k, CRIClient(lab.socket) as direct:
            pids = []
            tag = f"{os.getpid()}-{time.monotonic_ns()}"  # unique pod cgroups (other labs may run beside)
            for i in range(shared):
                cfg = k.sandbox_config(f"web-{i}", f"uid-web-{i}-{tag}", qos="burstable")
                sid = await k.run_pod_sandbox(cfg)
                cid = await k.create_container(sid, k.container_config("main", cpu_milli=100), cfg)
                await k.start_container(cid)
                pids.append(await pid_of(k, cid))
            cfg = k.sandbox_config("g", f"uid-g-{tag}")
            sid = await k.run_pod_sandbox(cfg)
            cid = await k.create_container(sid, k.container_config("main", cpu_milli=500, limit_milli=500), cfg)
            await k.start_container(cid)
            g = await pid_of(k, cid)
            # the anchor: the same shape, left alone by numapin (bypassed, untouched), updated straight on containerd
            acfg = k.sandbox_config("anchor", f"uid-anchor-{tag}", namespace=ANCHOR_NAMESPACE,
                                    annotations={BYPASS_ANNOTATION: "true"})
            asid = await k.run_pod_sandbox(acfg)
            anchor = await k.create_container(asid, k.container_config("main", cpu_milli=500, limit_milli=500), acfg)
            await k.start_container(anchor)
            expect = {1000: (str(EXCL), str(RESERVED)), 500: (str(ALL), str(ALL))}
            samples: dict[str, list[float]] = {"grow": [], "shrink": []}
            raw: list[float] = []
            agreed = total = 0
            for _ in range(rounds):
                for milli, key in ((1000, "grow"), (500, "shrink")):
                    own, web = expect[milli]
                    # the same cpuset change straight to containerd on the anchor first, then the resize through the
                    # proxy: both after the last narrowing's records settled (see --pause), in the same second
                    res = kubelet_resources(milli)
                    res.cpuset_cpus = own
                    await asyncio.sleep(pause)
                    t0 = time.perf_counter()
                    await direct.update_container_resources(anchor, res)
                    raw.append((time.perf_counter() - t0) * 1000)
                    await asyncio.sleep(pause / 4)  # paced as the resizes are: a runtime called in a loop is faster
                    t0 = time.perf_counter()
                    await k.update_container_resources(cid, kubelet_resources(milli))
                    samples[key].append((time.perf_counter() - t0) * 1000)
                    total += 1
                    agreed += allowed(g) == own and all(allowed(p) == web for p in pids)
            # ContainerStatus (kubelet polls it): intercepted for pinned containers (their CFS limit reported)
            status_ms: dict[str, list[float]] = {"proxy": [], "direct": []}
            await k.update_container_resources(cid, kubelet_resources(1000))
            for _ in range(200):
                for name, client in (("proxy", k), ("direct", direct)):
                    t0 = time.perf_counter()
                    await client.container_status(cid)
                    status_ms[name].append((time.perf_counter() - t0) * 1000)
        log = (work / "proxy.log").read_text()
        proxy_ms: dict[str, list[float]] = {"grow": [], "shrink": []}
        steps: dict[str, dict[str, list[float]]] = {"grow": {}, "shrink": {}}
        for line in log.splitlines():
            if "resize pod=default/g container=main: " in line:
                key = "grow" if "-> 1 CPU(s) exclusive" in line else "shrink"
                tail = line.rsplit(" in ", 1)[1]
                proxy_ms[key].append(float(tail.split(" ms")[0]))
                for part in tail.split(" ms (", 1)[1].rstrip(")").split(", "):
                    name, _, ms = part.rpartition(" ")
                    steps[key].setdefault(name, []).append(float(ms))
    finally:
        stop_process(proxy)
        lab.stop()
        shutil.rmtree(work, ignore_errors=True)

    return {
        "machine_cpus": str(ALL), "shared_containers": shared, "rounds": rounds, "pause_s": pause,
        "call_to_answer_through_the_proxy": {k: stats(v) for k, v in samples.items()},
        "arrival_to_kernel_checked_in_the_proxy": {k: stats(v[:rounds]) for k, v in proxy_ms.items() if v},
        "proxy_steps_p50_ms": {k: {n: round(statistics.median(v), 2) for n, v in d.items()} for k, d in steps.items()},
        "direct_update_on_containerd": stats(raw),  # the anchor's, interleaved with the resizes
        "container_status_of_a_pinned_container": {k: stats(v) for k, v in status_ms.items()},
        "kernel_showed_the_new_cpusets_at_the_answer": f"{agreed}/{total}",
        "targets": {"p50_ms": 30, "p99_ms": 100},
    }


def kubelet_resources(milli: int) -> pb.LinuxContainerResources:
    return pb.LinuxContainerResources(cpu_period=100000, cpu_quota=milli * 100, cpu_shares=milli * 1024 // 1000,
                                      memory_limit_in_bytes=64 << 20, oom_score_adj=-997)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shared", type=int, default=20, help="shared containers running beside (default 20)")
    ap.add_argument("--rounds", type=int, default=30, help="rounds of a growth and a shrink (default 30)")
    ap.add_argument("--pause", type=float, default=2.0,
                    help="seconds between resizes (default 2): a second after a narrowing the proxy brings "
                         "containerd's records of the shared containers up to date in the background (a runc update "
                         "each), which back-to-back resizes would queue behind")
    args = ap.parse_args()
    print(json.dumps(asyncio.run(run(args.shared, args.rounds, args.pause)), indent=1))


if __name__ == "__main__":
    main()
