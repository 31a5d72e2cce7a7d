#!/usr/bin/env python3
"""What the proxy's kernel-truth convergence costs on a real node: ``numapin criproxy`` (a child process) in front
of a real containerd with N running shared containers (one pod each), idle for a while with ``--converge-period``
1 s (the default), and for comparison in the same run with ``--converge-period 0`` (passes only on changes).

Prints one JSON document; for each N: the passes counted, the mean wall time of a pass (from the proxy's
``numapin_criproxy_converge_seconds``), the proxy's CPU while idle (utime + stime from ``/proc/<pid>/stat``) as
ms per second and % of one core with the passes on and off, the CPU per pass (the difference over the passes),
and the load average at the end. ``--compare-root DIR`` runs the same with the proxy of another checkout (e.g. a
``git archive`` of main) right after each measurement, so both see the same machine. Needs root, containerd,
runc and busybox-static.

    python benchmarks/converge.py [--containers 20,110] [--seconds 20] [--compare-root DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from numapin_lab.cri.client import CRIClient  # noqa: E402
from numapin_lab.cri.containerd import ContainerdLab  # noqa: E402
from numapin_lab.cri.proxy_process import ProxyProcess  # noqa: E402


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def metric(port: int, name: str) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    m = re.search(rf"^{name} ([0-9.e+-]+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


async def idle(lab: ContainerdLab, work: Path, seconds: float, period: str, root: Path) -> dict:
    """A proxy adopting the running containers, idle for ``seconds``: its CPU and passes."""
    proxy = ProxyProcess(work, lab.socket, reserved_cpus="0", extra_args=("--converge-period", period), root=root)
    await asyncio.to_thread(proxy.start)
    try:
        await asyncio.sleep(3.0)  # the start-up reconcile and its first passes are over
        assert proxy.proc is not None
        c0, t0 = cpu_seconds(proxy.proc.pid), time.monotonic()
        n0 = metric(proxy.port, "numapin_criproxy_converge_seconds_count")
        s0 = metric(proxy.port, "numapin_criproxy_converge_seconds_sum")
        await asyncio.sleep(seconds)
        c1, t1 = cpu_seconds(proxy.proc.pid), time.monotonic()
        n1 = metric(proxy.port, "numapin_criproxy_converge_seconds_count")
        s1 = metric(proxy.port, "numapin_criproxy_converge_seconds_sum")
        passes = int(n1 - n0)
        return {"passes": passes, "pass_wall_ms_mean": round(1000 * (s1 - s0) / passes, 2) if passes else None,
                "cpu_ms": round(1000 * (c1 - c0), 1), "cpu_ms_per_s": round(1000 * (c1 - c0) / (t1 - t0), 2),
                "cpu_percent_of_one_core": round(100 * (c1 - c0) / (t1 - t0), 2)}
    finally:
        proxy.stop()


async def measure(lab: ContainerdLab, work: Path, seconds: float, root: Path) -> dict:
    on = await idle(lab, work / "on", seconds, "1", root)
    off = await idle(lab, work / "off", seconds, "0", root)
    per_pass = (on["cpu_ms"] - off["cpu_ms"]) / on["passes"] if on["passes"] else None  # same idle seconds
    return {"converge_period_1s": on, "converge_period_0": off,
            "cpu_ms_per_pass": round(per_pass, 2) if per_pass is not None else None,
            "load_average": [round(x, 2) for x in os.getloadavg()]}


async def run(args: argparse.Namespace) -> dict:
    work = Path(tempfile.mkdtemp(prefix="npx-bconv-", dir="/tmp"))
    lab = ContainerdLab(work / "c")
    out: dict = {"seconds": args.seconds, "results": []}
    try:
        await asyncio.to_thread(lab.start)
        async with CRIClient(lab.socket) as k:
            running = 0
            for n in sorted(int(x) for x in args.containers.split(",")):
                for i in range(running, n):  # created directly: the proxies adopt them at start-up
                    cfg = k.sandbox_config(f"s{i}", f"bench-{i}", qos="besteffort")
                    sid = await k.run_pod_sandbox(cfg)
                    cid = await k.create_container(sid, k.container_config("app"), cfg)
                    await k.start_container(cid)
                running = n
                entry = {"containers": n, "this": await measure(lab, work / f"n{n}", args.seconds, ROOT)}
                if args.compare_root:
                    entry["compare"] = await measure(lab, work / f"n{n}c", args.seconds, Path(args.compare_root))
                out["results"].append(entry)
            for sb in await k.list_pod_sandbox():
                await k.stop_pod_sandbox(sb.id)
                await k.remove_pod_sandbox(sb.id)
    finally:
        await asyncio.to_thread(lab.stop)
        shutil.rmtree(work, ignore_errors=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--containers", default="20,110", help="comma-separated numbers of running containers")
    ap.add_argument("--seconds", type=float, default=20.0, help="idle seconds measured per proxy")
    ap.add_argument("--compare-root", help="another checkout whose proxy is measured the same way")
    print(json.dumps(asyncio.run(run(ap.parse_args())), indent=1))


if __name__ == "__main__":
    main()
