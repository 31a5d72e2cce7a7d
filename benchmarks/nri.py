#!/usr/bin/env python3
"""Benchmark of ``numapin nri`` (the NRI door) on a real containerd with NRI on (lab, 2.x by default), in one run.

Prints one JSON document:
- ``create_overhead``: kubelet's CreateContainer on containerd with no NRI plugin connected against with
  ``numapin nri`` connected (the same containerd, NRI on in both), shared-pool creates (Burstable 100m) and
  exclusive creates (Guaranteed 1 CPU, which narrows ``--running`` running shared containers first) measured apart;
  blocks of each alternate (the plugin killed and started between blocks), so both see the same machine load. Each
  created container is removed before the next create (its CPU goes back). p50 overhead goal: <= 1 ms. Beside it
  the plugin's own service time (its debug line) and its CPU per create and removal (/proc, all threads: the figure
  that holds on a loaded machine).
- ``resize``: kubelet's in-place resize through NRI (UpdateContainerResources on containerd, no cpuset: the plugin
  decides) of a Guaranteed container between 500m (shared pool) and 1 CPU (exclusive, ``--shared`` running shared
  containers narrowed off it first), ``--rounds`` growths and shrinks; at every answer the kernel's
  ``Cpus_allowed_list`` of every container is checked. Goal: p99 <= 100 ms.
- ``cpu``: CPU seconds per minute (user + system, from /proc/<pid>/stat) of the plugin with ``--pods`` pods running
  (one container each) while a kubelet-like client makes kubelet's periodic calls (PLEG relist, statuses, stats;
  ``benchmarks/criproxy.py``'s ``kubelet_load``) straight to containerd (they do not reach the plugin): idle, and
  during a create/delete churn of pods; beside the same for ``numapin criproxy`` in front of the same containerd
  with the same pods (kubelet's calls through it), so the two doors are compared on one machine in one run.

    python benchmarks/nri.py [--quick] [--containerd 2.x|1.7] [--only create,resize,cpu]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.criproxy import cpu_seconds, kubelet_load  # noqa: E402
from benchmarks.proxy_lab import ALL, EXCL, RESERVED, allowed, pid_of, start_proxy, stop_process  # noqa: E402
from benchmarks.resize import kubelet_resources  # noqa: E402
from benchmarks.timing import stats_ms  # noqa: E402
from numapin_lab.cri.client import CRIClient, pb  # noqa: E402
from numapin_lab.cri.containerd import ContainerdLab  # noqa: E402
from numapin_lab.cri.containerd_versions import containerd_bin_dir  # noqa: E402
from numapin_lab.cri.nri_process import NriProcess  # noqa: E402

TAG = f"{os.getpid()}-{time.monotonic_ns()}"  # unique pod cgroups (other labs may run beside)


def plugin_in(work: Path, lab: ContainerdLab, name: str, log_level: str = "INFO") -> NriProcess:
    return NriProcess(work / name, lab.socket, lab.nri_socket, reserved_cpus=str(RESERVED),
                      extra_args=("--log-level", log_level))


def served_ms(log: Path, method: str) -> list[float]:
    """The plugin's own service times of ``method`` (its debug lines: from the request's arrival to the answer
    written), in the order served."""
    key = f"served {method} (stream "
    return [float(line.rsplit(" in ", 1)[1].split(" ms")[0]) for line in log.read_text().splitlines() if key in line]


async def run_pod(k: CRIClient, name: str, cpu: int, limit: int | None = None, *, qos: str = "burstable",
                  start: bool = True) -> tuple[str, str, pb.PodSandboxConfig]:
    cfg = k.sandbox_config(name, f"uid-{name}-{TAG}", qos=qos)
    sid = await k.run_pod_sandbox(cfg)
    cid = await k.create_container(sid, k.container_config("main", cpu_milli=cpu, limit_milli=limit), cfg)
    if start:
        await k.start_container(cid)
    return sid, cid, cfg


async def remove_pod(k: CRIClient, sid: str) -> None:
    for c in await k.list_containers(pod_sandbox_id=sid):
        await k.stop_container(c.id, 0)
    await k.stop_pod_sandbox(sid)
    for c in await k.list_containers(pod_sandbox_id=sid):
        await k.remove_container(c.id)
    await k.remove_pod_sandbox(sid)


# -- CreateContainer with and without the plugin -------------------------------------------------------------
async def create_block(k: CRIClient, n: int, kinds: dict[str, tuple[str, pb.PodSandboxConfig, int, int | None]],
                       out: dict[str, list[float]], attempts: dict[str, int], pid: int | None = None,
                       cpu: dict[str, list[float]] | None = None) -> None:
    """``n`` creates (each removed after) of each kind, one kind after the other; with ``pid``, that process's CPU
    seconds over each kind's ``n`` creates and removals are added to ``cpu``."""
    for kind, (sid, cfg, milli, limit) in kinds.items():
        c0 = cpu_seconds(pid) if pid is not None else 0.0
        for _ in range(n):
            # kubelet's re-creation of the pod's one container (attempt+1), the previous one removed
            conf = k.container_config("main", cpu_milli=milli, limit_milli=limit, attempt=attempts[kind])
            attempts[kind] += 1
            t0 = time.perf_counter()
            cid = await k.create_container(sid, conf, cfg)
            out[kind].append((time.perf_counter() - t0) * 1000)
            await k.remove_container(cid)
        if pid is not None and cpu is not None:
            cpu[kind].append(cpu_seconds(pid) - c0)


async def bench_create(work: Path, lab: ContainerdLab, per_block: int, blocks: int, running: int) -> dict:
    samples: dict[str, dict[str, list[float]]] = {m: {"shared": [], "exclusive": []} for m in ("without", "with")}
    served: list[float] = []  # the plugin's own service times of the measured creates
    plugin_cpu: dict[str, list[float]] = {"shared": [], "exclusive": []}  # CPU seconds per block
    plugin = plugin_in(work, lab, "create-plugin", "DEBUG")
    async with CRIClient(lab.socket) as k:
        plugin.spawn()
        await asyncio.to_thread(plugin.wait_synchronized)
        sids = [(await run_pod(k, f"run-{i}", 100))[0] for i in range(running)]
        shared_sid, _, shared_cfg = await run_pod(k, "create-shared", 100, start=False)
        excl_sid, _, excl_cfg = await run_pod(k, "create-excl", 1000, 1000, qos="guaranteed", start=False)
        for c in await k.list_containers():  # only the sandboxes stay: the creates below are the samples
            if c.pod_sandbox_id in (shared_sid, excl_sid):
                await k.remove_container(c.id)
        kinds = {"shared": (shared_sid, shared_cfg, 100, None), "exclusive": (excl_sid, excl_cfg, 1000, 1000)}
        attempts = dict.fromkeys(kinds, 1)
        await create_block(k, 3, kinds, {"shared": [], "exclusive": []}, attempts)  # warm-up, with the plugin
        for _ in range(blocks):
            plugin.kill()
            await create_block(k, per_block, kinds, samples["without"], attempts)
            plugin.spawn()
            await asyncio.to_thread(plugin.wait_synchronized)
            await asyncio.sleep(1.0)  # the reconcile and convergence after its Synchronize are over
            before = len(served_ms(plugin.log, "CreateContainer"))
            assert plugin.proc is not None
            await create_block(k, per_block, kinds, samples["with"], attempts, plugin.proc.pid, plugin_cpu)
            served += served_ms(plugin.log, "CreateContainer")[before:]  # the shared ones, then the exclusive
        for sid in (*sids, shared_sid, excl_sid):
            await remove_pod(k, sid)
    plugin.stop()
    out: dict = {"running_shared_containers": running}
    if len(served) != 2 * per_block * blocks:
        raise RuntimeError(f"{len(served)} CreateContainer service times in the plugin's log for "
                           f"{2 * per_block * blocks} creates")
    per_kind = [served[i:i + per_block] for i in range(0, len(served), per_block)]  # blocks: shared, exclusive
    out["plugin_service_time"] = {"shared": stats_ms([x for b in per_kind[0::2] for x in b]),
                                  "exclusive": stats_ms([x for b in per_kind[1::2] for x in b]),
                                  "remove_container": stats_ms(served_ms(plugin.log, "StateChange/REMOVE_CONTAINER"))}
    # the plugin's CPU (user + system, all threads) per create and its removal, its background passes included
    out["plugin_cpu_ms_per_create_and_remove"] = {
        kind: round(sum(v) / (per_block * len(v)) * 1000, 3) for kind, v in plugin_cpu.items() if v}
    for kind in ("shared", "exclusive"):
        without, with_ = stats_ms(samples["without"][kind]), stats_ms(samples["with"][kind])
        out[kind] = {"without_plugin": without, "with_plugin": with_,
                     "p50_overhead_ms": round(with_["p50_ms"] - without["p50_ms"], 3),
                     "p50_ratio": round(with_["p50_ms"] / without["p50_ms"], 3)}
    out["goal_p50_overhead_ms"] = 1.0
    return out


# -- an in-place resize through NRI --------------------------------------------------------------------------
async def bench_resize(work: Path, lab: ContainerdLab, shared: int, rounds: int, pause: float) -> dict:
    plugin = plugin_in(work, lab, "resize-plugin", "DEBUG")
    await asyncio.to_thread(plugin.start)
    samples: dict[str, list[float]] = {"grow": [], "shrink": []}
    agreed = total = 0
    wrong: list[str] = []
    anchor: list[float] = []
    try:
        async with CRIClient(lab.socket) as k:
            pods = [await run_pod(k, f"web-{i}", 100) for i in range(shared)]
            pids = [await pid_of(k, cid) for _, cid, _ in pods]
            gsid, gcid, _ = await run_pod(k, "g", 500, 500, qos="guaranteed")
            g = await pid_of(k, gcid)
            expect = {1000: (str(EXCL), str(RESERVED)), 500: (str(ALL), str(ALL))}
            for _ in range(rounds):
                for milli, key in ((1000, "grow"), (500, "shrink")):
                    await asyncio.sleep(pause)
                    t0 = time.perf_counter()
                    await k.update_container_resources(gcid, kubelet_resources(milli))
                    samples[key].append((time.perf_counter() - t0) * 1000)
                    own, web = expect[milli]
                    total += 1
                    seen = (allowed(g), [allowed(p) for p in pids])
                    ok = seen[0] == own and all(w == web for w in seen[1])
                    agreed += ok
                    if not ok and len(wrong) < 5:
                        wrong.append(f"{key}: resized container on {seen[0]} (want {own}), shared on "
                                     f"{sorted(set(seen[1]))} (want {web})")
            # the anchor: the same calls with no plugin connected (containerd's own update: quota and shares)
            plugin.kill()
            for _ in range(rounds):
                for milli in (1000, 500):
                    await asyncio.sleep(pause)
                    t0 = time.perf_counter()
                    await k.update_container_resources(gcid, kubelet_resources(milli))
                    anchor.append((time.perf_counter() - t0) * 1000)
            for sid in (*(p[0] for p in pods), gsid):
                await remove_pod(k, sid)
    finally:
        plugin.stop()
    served = served_ms(plugin.log, "UpdateContainer")
    return {"shared_containers": shared, "rounds": rounds, "pause_s": pause,
            "call_to_answer": {k: stats_ms(v) for k, v in samples.items()},
            "plugin_service_time": {"grow": stats_ms(served[0::2]), "shrink": stats_ms(served[1::2])},
            "same_calls_without_plugin": stats_ms(anchor),
            "kernel_showed_the_new_cpusets_at_the_answer": f"{agreed}/{total}", "mismatches": wrong,
            "goal_p99_ms": 100}


# -- CPU at kubelet's steady state ----------------------------------------------------------------------------
async def pod_churn(k: CRIClient, seconds: float) -> int:
    """Pods created and deleted one after another (a shared container each) for ``seconds``; returns how many."""
    n, start = 0, time.monotonic()
    while time.monotonic() - start < seconds:
        sid, _, _ = await run_pod(k, f"churn-{n}", 100)
        await remove_pod(k, sid)
        n += 1
    return n


async def measure(pid: int, load: Callable[[], Awaitable[object]]) -> tuple[float, float, object]:
    """(CPU seconds per minute of ``pid``, wall seconds, what ``load`` returned) while ``load`` runs."""
    c0, t0 = cpu_seconds(pid), time.monotonic()
    got = await load()
    elapsed = time.monotonic() - t0
    return round((cpu_seconds(pid) - c0) / elapsed * 60, 3), round(elapsed, 1), got


def per_pod(cpu_per_minute: float, pods_per_minute: float) -> float | None:
    """CPU milliseconds per pod created and deleted (the churn's CPU over its rate; it includes the idle share)."""
    return round(cpu_per_minute / pods_per_minute * 1000, 1) if pods_per_minute else None


async def bench_cpu(work: Path, lab: ContainerdLab, pods: int, seconds: float) -> dict:
    out: dict = {"pods": pods, "containers": pods, "seconds_each": seconds}
    async with CRIClient(lab.socket) as k:
        plugin = plugin_in(work, lab, "cpu-plugin")
        await asyncio.to_thread(plugin.start)
        sids = [(await run_pod(k, f"steady-{i}", 100))[0] for i in range(pods)]
        await asyncio.sleep(3)  # the creations' after-effects are over
        assert plugin.proc is not None
        ppid = plugin.proc.pid
        idle, t_idle, calls = await measure(ppid, lambda: kubelet_load(k, seconds))

        async def churn_and_load() -> object:
            return await asyncio.gather(pod_churn(k, seconds), kubelet_load(k, seconds))

        churn, t_churn, got = await measure(ppid, churn_and_load)
        out["nri_plugin"] = {"idle_cpu_seconds_per_minute": idle, "churn_cpu_seconds_per_minute": churn,
                             "kubelet_calls_per_second": round(int(calls) / t_idle, 1),  # type: ignore[call-overload]
                             "pods_created_and_deleted_per_minute": round(got[0] / t_churn * 60, 1)}  # type: ignore[index]
        out["nri_plugin"]["churn_cpu_ms_per_pod_created_and_deleted"] = per_pod(churn, got[0] / t_churn * 60)  # type: ignore[index]
        plugin.stop()
        # the proxy in front of the same containerd and pods, kubelet's calls through it
        pw = work / "cpu-proxy"
        pw.mkdir()
        proxy = start_proxy(pw, lab.socket, log_level="INFO")
        try:
            async with CRIClient(str(pw / "proxy.sock")) as via:
                await asyncio.sleep(3)
                idle, t_idle, calls = await measure(proxy.pid, lambda: kubelet_load(via, seconds))

                async def churn_via() -> object:
                    return await asyncio.gather(pod_churn(via, seconds), kubelet_load(via, seconds))

                churn, t_churn, got = await measure(proxy.pid, churn_via)
                out["criproxy"] = {"idle_cpu_seconds_per_minute": idle, "churn_cpu_seconds_per_minute": churn,
                                   "kubelet_calls_per_second": round(int(calls) / t_idle, 1),  # type: ignore[call-overload]
                                   "pods_created_and_deleted_per_minute": round(got[0] / t_churn * 60, 1)}  # type: ignore[index]
                out["criproxy"]["churn_cpu_ms_per_pod_created_and_deleted"] = per_pod(churn, got[0] / t_churn * 60)  # type: ignore[index]
        finally:
            stop_process(proxy)
        for sid in sids:
            await remove_pod(k, sid)
    return out


async def run(args: argparse.Namespace) -> dict:
    work = Path(tempfile.mkdtemp(prefix="npx-bench-nri-", dir="/tmp"))
    lab = ContainerdLab(work / "ctrd", containerd_bin_dir(args.containerd), nri=True)
    lab.start()
    result: dict = {"containerd": lab.version, "machine_cpus": str(ALL), "reserved": str(RESERVED)}
    try:
        if "create" in args.only:
            result["create_overhead"] = await bench_create(work, lab, 10 if args.quick else 25, 2 if args.quick else 4,
                                                           args.running)
        if "resize" in args.only:
            rounds = args.rounds if args.rounds is not None else 10 if args.quick else 30
            result["resize"] = await bench_resize(work, lab, args.shared, rounds,
                                                  args.pause)
        if "cpu" in args.only:
            result["cpu"] = await bench_cpu(work, lab, 30 if args.quick else args.pods,
                                            20.0 if args.quick else args.seconds)
        result["load_average"] = os.getloadavg()
    finally:
        lab.stop()
        if args.keep:
            print(f"logs kept in {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--containerd", default="2.x", choices=("1.7", "2.x"), help="the lab containerd (default 2.x)")
    ap.add_argument("--only", help="run only these parts (comma-separated: create, resize, cpu)")
    ap.add_argument("--keep", action="store_true", help="keep the work directory (the plugins' and proxy's logs)")
    ap.add_argument("--quick", action="store_true", help="fewer samples, 30 pods, 20 s per CPU figure")
    ap.add_argument("--running", type=int, default=4,
                    help="running shared containers while creates are measured (default 4)")
    ap.add_argument("--shared", type=int, default=20, help="shared containers beside the resized one (default 20)")
    ap.add_argument("--rounds", type=int, help="resize rounds of a growth and a shrink (default 30, 10 with --quick)")
    ap.add_argument("--pause", type=float, default=0.5, help="seconds between two resizes (default 0.5)")
    ap.add_argument("--pods", type=int, default=110, help="pods running for the CPU figures (default 110)")
    ap.add_argument("--seconds", type=float, default=60.0, help="seconds of each CPU figure (default 60)")
    args = ap.parse_args()
    parts = ("create", "resize", "cpu")
    args.only = parts if args.only is None else tuple(p for p in args.only.split(",") if p)
    if not args.only or set(args.only) - set(parts):
        ap.error(f"--only: comma-separated parts among {', '.join(parts)}")
    bad_rounds = args.rounds is not None and args.rounds < 1
    if min(args.running, args.shared, args.pods) < 0 or bad_rounds or args.seconds <= 0 or args.pause < 0:
        ap.error("counts must be >= 0, --rounds >= 1, --seconds > 0 and --pause >= 0")
    print(json.dumps(asyncio.run(run(args)), indent=1))


if __name__ == "__main__":
    main()
