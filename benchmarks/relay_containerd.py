#!/usr/bin/env python3
"""Benchmark of the CRI proxy's relay in front of a real containerd (lab), in one run; prints JSON.

One running container on a lab containerd and ``numapin criproxy`` (the frame relay, default flags) in front of it;
``Version`` and ``ContainerStatus`` of that container are called ``--calls`` times directly and through the proxy
in rotation (both see the same machine load). Each figure stands beside its anchor: the overhead the proxy adds to
p50 and p99 over calling containerd directly, and the proxy's CPU per 1,000 relayed calls beside containerd's own
per 1,000 answers (user + system of all threads, from /proc/<pid>/stat; containerd answers both paths). Goals
(issue 37): overhead at most +0.05 ms p50 and +0.10 ms p99, proxy CPU at most half of containerd's.

``ContainerStatus`` is one of the calls the proxy intercepts (it reports a pinned container's CPU limit, see
docs/resize.md): of a container numapin has no CPU limit to report for (the shared, burstable container here: most
of a node), the call is relayed frame by frame as ``Version`` is, once its request is read (``pass_through``);
``ContainerStatus (pinned)``, of a guaranteed container pinned to a CPU of its own, is held: its answer goes through
the interceptor, which puts kubelet's CPU limit back (checked: through the proxy the status shows the quota,
directly containerd's -1). A ``--compare-root`` proxy started before the containers were created and does not know
the pinned one (it relays its answer unchanged, but held, as every ``ContainerStatus`` before issue 37).

``--compare-root DIR`` (a ``git archive`` of other code, e.g. the code before a change) adds a second proxy run from
that tree in front of the same containerd: calls rotate between direct, this tree's proxy (``frames``) and that one
(``compared``), so a change is judged within one run, on the same load.

    python benchmarks/relay_containerd.py [--calls 1000] [--compare-root DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.criproxy import alternating, ready  # noqa: E402
from benchmarks.proxy_lab import start_proxy, stop_process  # noqa: E402
from numapin_lab.cri.client import CRIClient  # noqa: E402
from numapin_lab.cri.containerd import ContainerdLab, containerd_version  # noqa: E402

GOALS = {"overhead_p50_ms": 0.05, "overhead_p99_ms": 0.10, "proxy_cpu_share_of_runtime": 0.5}


async def run(calls: int, compare_root: Path | None = None) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="npx-bench-relay-", dir="/tmp"))
    lab = ContainerdLab(work / "ctrd")
    await asyncio.to_thread(lab.start)
    proxy = compared = None
    try:
        assert lab.proc is not None
        proxy = start_proxy(work, lab.socket)
        if compare_root is not None:
            (work / "compared").mkdir()
            compared = start_proxy(work / "compared", lab.socket, root=compare_root)
        async with contextlib.AsyncExitStack() as stack:
            via = await stack.enter_async_context(CRIClient(str(work / "proxy.sock")))
            direct = await stack.enter_async_context(CRIClient(lab.socket))
            other = (await stack.enter_async_context(CRIClient(str(work / "compared" / "proxy.sock")))
                     if compared is not None else None)
            await ready(via)
            tag = f"{os.getpid()}-{time.monotonic_ns()}"
            cfg = via.sandbox_config("relay", f"uid-relay-{tag}", qos="burstable")
            sid = await via.run_pod_sandbox(cfg)
            cid = await via.create_container(sid, via.container_config("main", cpu_milli=100), cfg)
            await via.start_container(cid)
            pcfg = via.sandbox_config("relay-pinned", f"uid-relay-pinned-{tag}")
            psid = await via.run_pod_sandbox(pcfg)
            pcid = await via.create_container(psid, via.container_config("main", cpu_milli=1000, limit_milli=1000),
                                              pcfg)
            await via.start_container(pcid)
            quotas = ((await via.container_status(pcid)).status.resources.linux.cpu_quota,
                      (await direct.container_status(pcid)).status.resources.linux.cpu_quota)
            if quotas[0] <= 0 or quotas[1] > 0:
                raise RuntimeError(f"the guaranteed container is not pinned with its limit reported (quota through "
                                   f"the proxy {quotas[0]}, containerd's {quotas[1]})")
            out: dict[str, Any] = {}
            for name, make in (("Version", lambda c: c.version),
                               ("ContainerStatus", lambda c: (lambda: c.container_status(cid))),
                               ("ContainerStatus (pinned)", lambda c: (lambda: c.container_status(pcid)))):
                vias = {"frames": (make(via), proxy.pid)}
                if compared is not None and other is not None:
                    vias["compared"] = (make(other), compared.pid)
                r = await alternating(make(direct), vias, calls, lab.proc.pid)
                frames = r["frames"]
                share = frames["proxy_cpu_ms_per_1000_calls"] / r["runtime_cpu_ms_per_1000_calls_anchor"]
                out[name] = {**r, "proxy_cpu_share_of_runtime": round(share, 3),
                             "goals_met": {"overhead_p50_ms": frames["overhead_p50_ms"] <= GOALS["overhead_p50_ms"],
                                           "overhead_p99_ms": frames["overhead_p99_ms"] <= GOALS["overhead_p99_ms"],
                                           "proxy_cpu_share_of_runtime": share <= GOALS["proxy_cpu_share_of_runtime"]}}
            for pod in (psid, sid):
                await via.stop_pod_sandbox(pod)
                await via.remove_pod_sandbox(pod)
        return {"benchmark": "relay_containerd", "relay": "frames (default flags)", "calls": calls,
                "containerd": containerd_version(), "goals": GOALS,
                "compared": str(compare_root) if compare_root is not None else None,
                "results": out, "load_average": os.getloadavg()}
    finally:
        stop_process(compared)
        stop_process(proxy)
        await asyncio.to_thread(lab.stop)
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=1000, help="calls of each method on each path (default 1000)")
    ap.add_argument("--compare-root", type=Path, default=None,
                    help="a tree of other numapin code (git archive): its proxy measured in the same run")
    args = ap.parse_args()
    if args.calls < 1:
        ap.error("--calls must be at least 1")
    if args.compare_root is not None and not (args.compare_root / "numapin" / "__main__.py").is_file():
        ap.error(f"--compare-root {args.compare_root}: not a numapin tree (no numapin/__main__.py)")
    print(json.dumps(asyncio.run(run(args.calls, args.compare_root)), indent=1))


if __name__ == "__main__":
    main()
