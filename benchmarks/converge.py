#!/usr/bin/env python3
"""What the proxy's kernel-truth convergence costs: ``numapin criproxy`` (a child process) in front of a real
containerd with N running shared containers, idle for a while with ``--converge-period`` 1 s.

Prints one JSON document: the containers, the passes counted, the mean time of a pass (from the proxy's
``numapin_criproxy_converge_seconds``), and the proxy's CPU time per second of wall time while idle (utime +
stime from ``/proc/<pid>/stat``) with the periodic passes on and, for comparison in the same run, off
(``--converge-period 0``). Needs root, containerd, runc and busybox-static.

    python benchmarks/converge.py [--containers 20] [--seconds 10]
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


async def measure(lab: ContainerdLab, work: Path, n: int, seconds: float, period: str) -> dict:
    proxy = ProxyProcess(work / f"p{period}", lab.socket, reserved_cpus="0", extra_args=("--converge-period", period))
    await asyncio.to_thread(proxy.start)
    try:
        async with CRIClient(proxy.socket) as k:
            for i in range(n):
                cfg = k.sandbox_config(f"s{i}", f"bench-{period}-{i}", qos="besteffort")
                sid = await k.run_pod_sandbox(cfg)
                cid = await k.create_container(sid, k.container_config("app"), cfg)
                await k.start_container(cid)
        await asyncio.sleep(2.0)
        assert proxy.proc is not None
        c0, t0 = cpu_seconds(proxy.proc.pid), time.monotonic()
        n0 = metric(proxy.port, "numapin_criproxy_converge_seconds_count")
        s0 = metric(proxy.port, "numapin_criproxy_converge_seconds_sum")
        await asyncio.sleep(seconds)
        c1, t1 = cpu_seconds(proxy.proc.pid), time.monotonic()
        n1 = metric(proxy.port, "numapin_criproxy_converge_seconds_count")
        s1 = metric(proxy.port, "numapin_criproxy_converge_seconds_sum")
        passes = n1 - n0
        return {"period": float(period), "passes": int(passes),
                "pass_ms_mean": round(1000 * (s1 - s0) / passes, 2) if passes else None,
                "proxy_cpu_ms_per_s": round(1000 * (c1 - c0) / (t1 - t0), 2)}
    finally:
        proxy.stop()
        async with CRIClient(lab.socket) as direct:
            for sb in await direct.list_pod_sandbox():
                await direct.stop_pod_sandbox(sb.id)
                await direct.remove_pod_sandbox(sb.id)


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--containers", type=int, default=20)
    ap.add_argument("--seconds", type=float, default=10.0)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="npx-bconv-", dir="/tmp"))
    lab = ContainerdLab(work / "c")
    try:
        await asyncio.to_thread(lab.start)
        on = await measure(lab, work, args.containers, args.seconds, "1")
        off = await measure(lab, work, args.containers, args.seconds, "0")
    finally:
        await asyncio.to_thread(lab.stop)
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps({"containers": args.containers, "seconds": args.seconds, "converge_on": on,
                      "converge_off": off}, indent=1))


if __name__ == "__main__":
    asyncio.run(main())
