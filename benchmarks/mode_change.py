#!/usr/bin/env python3
"""Benchmark of a change of a running pod's CPU mode against a real containerd (lab), in one run.

A pod of one container with 1 CPU of its own (Guaranteed, created with ``qos.gocrane.io/cpu-manager: none``) runs
beside ``--shared`` shared containers; the pod goes round none -> exclusive -> share -> exclusive -> none ``--rounds``
times, each change asked on the proxy's control socket (as ``numapin mode`` does). For every transition: the time
from the request to the proxy's answer (the answer comes once the kernel shows the change), and whether every
container's ``Cpus_allowed_list`` (``/proc/<pid>/status``) was already the new one when the answer came.

Prints one JSON document. The proxy and containerd are separate processes; the client is this process.

    python benchmarks/mode_change.py [--shared 20] [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.proxy_lab import ALL, EXCL, RESERVED, allowed, pid_of, start_proxy, stop_process  # noqa: E402
from benchmarks.timing import stats_ms as stats  # noqa: E402
from nodeagent.serve.control import call_control  # noqa: E402
from numapin_lab.cri.client import CRIClient  # noqa: E402
from numapin_lab.cri.containerd import ContainerdLab  # noqa: E402


async def run(shared: int, rounds: int) -> dict:
    work = Path(tempfile.mkdtemp(prefix="npx-bench-modes-", dir="/tmp"))
    lab = ContainerdLab(work / "ctrd")
    lab.start()
    proxy = None
    try:
        proxy = start_proxy(work, lab.socket)
        async with CRIClient(str(work / "proxy.sock")) as k:
            pids = []
            for i in range(shared):
                cfg = k.sandbox_config(f"web-{i}", f"uid-web-{i}", qos="burstable")
                sid = await k.run_pod_sandbox(cfg)
                cid = await k.create_container(sid, k.container_config("main", cpu_milli=100), cfg)
                await k.start_container(cid)
                pids.append(await pid_of(k, cid))
            cfg = k.sandbox_config("db", "uid-db", annotations={"qos.gocrane.io/cpu-manager": "none"})
            sid = await k.run_pod_sandbox(cfg)
            cid = await k.create_container(sid, k.container_config("main", cpu_milli=1000, limit_milli=1000), cfg)
            await k.start_container(cid)
            db = await pid_of(k, cid)
            expect = {"exclusive": (str(EXCL), str(RESERVED)), "share": (str(EXCL), str(ALL)),
                      "none": (str(ALL), str(ALL))}
            samples: dict[str, list[float]] = {}
            applied: dict[str, list[float]] = {}
            agreed = total = 0
            previous = "none"
            for _ in range(rounds):
                for mode in ("exclusive", "share", "exclusive", "none"):
                    t0 = time.perf_counter()
                    answer = await call_control(str(work / "control.sock"),
                                                {"op": "set-mode", "pod": "default/db", "mode": mode})
                    seconds = time.perf_counter() - t0
                    if answer.get("outcome") != "changed":
                        raise RuntimeError(f"{previous} -> {mode}: {answer}")
                    db_cpus, web_cpus = expect[mode]
                    total += 1
                    agreed += allowed(db) == db_cpus and all(allowed(p) == web_cpus for p in pids)
                    key = f"{previous}->{mode}"
                    samples.setdefault(key, []).append(seconds * 1000)
                    msg = str(answer.get("message", ""))
                    applied.setdefault(key, []).append(float(msg.rsplit("applied in ", 1)[1].split(" ms")[0]))
                    previous = mode
    finally:
        stop_process(proxy)
        lab.stop()
        shutil.rmtree(work, ignore_errors=True)

    return {
        "machine_cpus": str(ALL), "shared_containers": shared, "rounds": rounds,
        "request_to_answer": {k: stats(v) for k, v in samples.items()},
        "proxy_applied": {k: stats(v) for k, v in applied.items()},
        "kernel_showed_the_new_cpusets_at_the_answer": f"{agreed}/{total}",
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shared", type=int, default=20, help="shared containers running beside (default 20)")
    ap.add_argument("--rounds", type=int, default=5, help="rounds of four transitions (default 5)")
    args = ap.parse_args()
    print(json.dumps(asyncio.run(run(args.shared, args.rounds)), indent=1))


if __name__ == "__main__":
    main()
