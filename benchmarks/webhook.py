"""Benchmark of the admission webhook over TLS with keep-alive; prints JSON.

Starts ``numapin webhook`` as a separate process (its own interpreter, as in a cluster) with a fresh CA and serving
certificate and a directory of 5000 (``--nodes``) NodeResourceTopology documents (2-socket, 2 NUMA x 28-CPU nodes under
single-numa-node, each with its own free CPUs and, with ``--memory static`` (the default), its memory per NUMA node
under kubelet's Memory Manager, so most nodes differ), then for 1, 16 and 64 concurrent clients
(one keep-alive TLS connection each) measures admissions per second, p50/p99 latency and the webhook's CPU per
request of:

- ``mutate``: pods CREATE of a realistic 8-container pod (2 init containers, a native sidecar, 5 app containers;
  Guaranteed, two of them with whole CPUs);
- ``binding``: pods/binding CREATE of that pod to each node in turn (the node simulated with its free
  CPUs; answers cached by node state);
- ``validate_pod``: pods CREATE of that pod, checked against every node (through the node index: each distinct
  shape and free-CPU state asked once).

Every figure stands beside its anchor, ``healthz_anchor`` (GET /healthz over the same connections: the cost of TLS
and HTTP alone). Each (endpoint, concurrency) is measured twice on new connections, and both are reported: ``cold``,
its first ``--cold-seconds`` (2; the very first of them starts right after /readyz turned ready: what a rollout's
first seconds look like), which is also the warm-up of ``warm``, the ``--seconds`` window after it.

The load comes from ``wrk`` when it is installed (``apt-get install wrk``; C, so the load generator takes a tenth of
the webhook's CPU per request, reported as ``client_cpu_ms_per_request``), else from a Python client in this process
(``--client python``; it takes about as much CPU as the webhook). ``--replicas 1,2`` repeats everything with that
many webhook processes on their own ports, the clients spread over them as the Service spreads connections;
``--workers 2`` with one webhook of that many worker processes on one port. ``--soak N`` then sends N more requests
to one webhook and reports its resident memory along the way (``--soak 1000000`` is the long form).

``--compare-root DIR`` (a ``git archive`` of other code, e.g. the code before a change) then runs one webhook of that
tree beside one of this tree, ``wrk`` alternating between them window by window (``compared``), so a change is
judged within one run, on the same load.

Usage: python benchmarks/webhook.py [--seconds 10] [--cold-seconds 2] [--concurrency 1,16,64] [--nodes 5000]
                                    [--memory static|none]
                                    [--replicas 1,2] [--workers 1,2] [--client auto|wrk|python] [--soak N]
                                    [--compare-root DIR] [--compare-rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import copy
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from allocator.cpuset import CPUSet  # noqa: E402
from allocator.memory.report import ASSIGNMENTS_ATTRIBUTE, CELLS_ATTRIBUTE  # noqa: E402
from allocator.nrt import build_nrt  # noqa: E402
from allocator.topology import CPUInfo, Topology  # noqa: E402
from benchmarks.wrk_load import available as wrk_available  # noqa: E402
from benchmarks.wrk_load import wrk_load  # noqa: E402
from webhook.admission.mutate import mutate_pod  # noqa: E402
from webhook.https.certs import make_ca, make_serving_cert, service_dns_names  # noqa: E402

SERVER_NAME = "numapin-webhook.numapin.svc"
GI = 1 << 30


def machine(numa_nodes: int = 2, cores_per_numa: int = 14, threads: int = 2) -> Topology:
    total = numa_nodes * cores_per_numa
    cpus = [CPUInfo(cpu=k + t * total, core=k, socket=k // cores_per_numa, numa=k // cores_per_numa,
                    uncore=k // cores_per_numa) for t in range(threads) for k in range(total)]
    dist = {a: tuple(10 if a == b else 21 for b in range(numa_nodes)) for a in range(numa_nodes)}
    return Topology(cpus=tuple(cpus), numa_nodes=tuple(range(numa_nodes)), numa_distances=dist)


def write_nodes(directory: Path, count: int, seed: int = 7, *, memory: bool = True) -> int:
    """``count`` NRT documents, one file each; returns how many distinct free states they have. ``memory``: the
    nodes publish memory per NUMA node (192Gi each, ``memoryManagerPolicy: Static``, 4Gi held per busy core), so
    every admission is judged by kubelet's Memory Manager too."""
    rnd = random.Random(seed)
    topo = machine()
    reserved = CPUSet([0, 28])
    states = set()
    for i in range(count):
        busy_cores = [c for c in range(1, 28) if rnd.random() < 0.4]
        busy = CPUSet(busy_cores) | CPUSet(c + 28 for c in busy_cores)
        free = topo.all_cpus - reserved - busy
        extra: dict[str, Any] = {}
        if memory:
            held = {n: 4 * GI * sum(1 for c in busy_cores if c // 14 == n) for n in (0, 1)}
            allocatable = 192 * GI - 50 * (1 << 20)
            extra = {"memory": {n: {"memory": (192 * GI, allocatable, allocatable - held[n])} for n in (0, 1)},
                     "memory_manager_policy": "Static",
                     "zone_attributes": {n: {ASSIGNMENTS_ATTRIBUTE: "1", CELLS_ATTRIBUTE: str(n)}
                                         for n in (0, 1) if held[n]}}
        doc = build_nrt(f"node-{i:04d}", topo, free_cpus=free, reserved_cpus=reserved,
                        topology_manager_policy="single-numa-node", labels={"pool": "general"}, **extra)
        states.add(tuple(len(free & topo.cpus_in_numa(n)) for n in (0, 1)))
        (directory / f"node-{i:04d}.json").write_text(json.dumps(doc))
    return len(states)


def container(name: str, cpu: str, mem: str) -> dict[str, Any]:
    res = {"cpu": cpu, "memory": mem}
    return {"name": name, "image": f"registry.example.com/{name}:1.0", "resources": {"requests": res, "limits": res},
            "ports": [{"containerPort": 8080}], "env": [{"name": "MODE", "value": "prod"}],
            "volumeMounts": [{"name": "data", "mountPath": "/data"}], "imagePullPolicy": "IfNotPresent",
            "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File"}


def realistic_pod(name: str) -> dict[str, Any]:
    proxy = container("proxy", "500m", "256Mi")
    proxy["restartPolicy"] = "Always"
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "shop", "labels": {"app": "checkout", "tier": "backend"},
                     "annotations": {"prometheus.io/scrape": "true", "qos.gocrane.io/cpu-manager": "exclusive"},
                     "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "checkout-7d9f",
                                          "uid": str(uuid.uuid4()), "controller": True}]},
        "spec": {
            "initContainers": [container("migrate", "1", "512Mi"), container("warmup", "500m", "256Mi"), proxy],
            "containers": [container("checkout", "6", "8Gi"), container("pricing", "4", "4Gi"),
                           container("log", "200m", "128Mi"), container("metrics", "100m", "64Mi"),
                           container("cache", "1500m", "2Gi")],
            "volumes": [{"name": "data", "emptyDir": {}}], "restartPolicy": "Always",
            "serviceAccountName": "checkout", "schedulerName": "default-scheduler", "priority": 0,
            "tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute",
                             "tolerationSeconds": 300}],
        },
        "status": {"phase": "Pending", "qosClass": "Guaranteed"},
    }


def large_pod(name: str, size: int) -> dict[str, Any]:
    """``realistic_pod`` grown to about ``size`` bytes of JSON the way large pods grow: many environment variables
    (small objects, the costliest kind of JSON to parse)."""
    pod = realistic_pod(name)
    apps = pod["spec"]["containers"]
    base = len(json.dumps(pod))
    per_var = len(json.dumps({"name": "VAR_00000_000", "value": "v" * 48})) + 2
    count = max(0, (size - base) // per_var)
    for i in range(count):
        apps[i % len(apps)]["env"].append({"name": f"VAR_{i // 1000:05d}_{i % 1000:03d}", "value": "v" * 48})
    return pod


def large_update_review(size: int) -> bytes:
    """A pods UPDATE review of about ``size`` bytes: object and oldObject each a pod of half of it (the API server
    sends at most about 2 x 3 MiB)."""
    pod = large_pod("big-0", size // 2)
    return review({
        "uid": str(uuid.uuid4()), "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"}, "namespace": "shop",
        "name": pod["metadata"]["name"], "operation": "UPDATE", "object": pod, "oldObject": pod, "dryRun": False,
        "userInfo": {"username": "system:serviceaccount:kube-system:replicaset-controller"},
    })


def review(request: dict[str, Any]) -> bytes:
    return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}).encode()


def pod_review(pod: dict[str, Any], *, with_uid: bool) -> bytes:
    pod = copy.deepcopy(pod)
    if with_uid:
        pod["metadata"]["uid"] = str(uuid.uuid4())
    return review({
        "uid": str(uuid.uuid4()), "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"}, "namespace": "shop",
        "name": pod["metadata"]["name"], "operation": "CREATE", "object": pod, "oldObject": None, "dryRun": False,
        "userInfo": {"username": "system:serviceaccount:kube-system:replicaset-controller"},
    })


def binding_review(name: str, node: str) -> bytes:
    return review({
        "uid": str(uuid.uuid4()), "kind": {"group": "", "version": "v1", "kind": "Binding"},
        "resource": {"group": "", "version": "v1", "resource": "pods"}, "subResource": "binding",
        "namespace": "shop", "name": name, "operation": "CREATE", "oldObject": None, "dryRun": False,
        "object": {"kind": "Binding", "apiVersion": "v1", "metadata": {"name": name, "namespace": "shop"},
                   "target": {"kind": "Node", "name": node}},
        "userInfo": {"username": "system:kube-scheduler"},
    })


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def run_load(ports: int | list[int], ssl_ctx: Any, path: str, bodies: list[bytes], total: int,
                   concurrency: int, pids: list[int] | None = None) -> dict[str, Any]:
    """``total`` requests from ``concurrency`` clients, client i on replica ``ports[i % len(ports)]`` (as the
    Service spreads connections); an empty ``bodies`` means GET."""
    ports = [ports] if isinstance(ports, int) else ports
    latencies: list[float] = []
    errors = 0
    verdicts: dict[str, int] = {}
    next_index = 0

    async def worker(port: int) -> None:
        nonlocal next_index, errors
        conn = aiohttp.TCPConnector(limit=1, ssl=ssl_ctx)
        async with aiohttp.ClientSession(connector=conn) as s:
            while next_index < total:
                next_index += 1
                t0 = time.perf_counter()
                if not bodies:
                    async with s.get(f"https://127.0.0.1:{port}{path}", server_hostname=SERVER_NAME) as r:
                        await r.read()
                    latencies.append(time.perf_counter() - t0)
                    errors += r.status != 200
                    continue
                body = bodies[next_index % len(bodies)]
                async with s.post(f"https://127.0.0.1:{port}{path}", data=body, server_hostname=SERVER_NAME,
                                  headers={"Content-Type": "application/json"}) as r:
                    raw = await r.read()
                latencies.append(time.perf_counter() - t0)
                if r.status != 200:
                    errors += 1
                    continue
                allowed = json.loads(raw)["response"]["allowed"]
                verdicts["allowed" if allowed else "denied"] = verdicts.get("allowed" if allowed else "denied",
                                                                            0) + 1

    cpu0 = [cpu_seconds(p) for p in pids or ()]
    started = time.perf_counter()
    await asyncio.gather(*(worker(ports[i % len(ports)]) for i in range(concurrency)))
    elapsed = time.perf_counter() - started
    cpu = sum(cpu_seconds(p) for p in pids or ()) - sum(cpu0)
    latencies.sort()

    def pct(p: float) -> float:
        return round(latencies[min(len(latencies) - 1, int(p * len(latencies)))] * 1000, 3)

    return {"concurrency": concurrency, "requests": len(latencies), "errors": errors, "verdicts": verdicts,
            "admissions_per_second": round(len(latencies) / elapsed, 1), "p50_ms": pct(0.50), "p99_ms": pct(0.99),
            "mean_ms": round(statistics.fmean(latencies) * 1000, 3),
            # the webhook processes' own CPU: the repeatable figure on a shared machine
            **({"server_cpu_ms_per_request": round(cpu / len(latencies) * 1000, 3),
                "admissions_per_cpu_second": round(len(latencies) / cpu, 1) if cpu else None} if pids else {})}


async def wait_ready(port: int, ssl_ctx: Any, proc: subprocess.Popen[bytes]) -> None:
    async with aiohttp.ClientSession() as s:
        for _ in range(600):
            if proc.poll() is not None:
                raise SystemExit(f"webhook exited with {proc.returncode}")
            try:
                async with s.get(f"https://127.0.0.1:{port}/readyz", ssl=ssl_ctx, server_hostname=SERVER_NAME) as r:
                    if r.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.1)
    raise SystemExit("webhook never became ready")


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def start_replica(d: Path, port: int, workers: int = 1, root: Path = ROOT) -> subprocess.Popen[bytes]:
    """``numapin webhook`` of the tree at ``root`` (this one, or ``--compare-root``'s)."""
    return subprocess.Popen(
        [sys.executable, "-m", "numapin", "webhook", "--cert", str(d / "tls.crt"), "--key", str(d / "tls.key"),
         "--host", "127.0.0.1", "--port", str(port), "--nrt-dir", str(d / "nrt"), "--pods-dir", str(d / "pods"),
         "--log-level", "warning", "--nrt-poll-seconds", "60", "--workers", str(workers)],
        cwd=root, env={**os.environ, "PYTHONPATH": str(root)})


async def compare(d: Path, ssl_ctx: Any, other: Path, paths: dict[str, str], files: dict[str, Path | None],
                  seconds: float, rounds: int) -> dict[str, Any]:
    """One webhook of this tree and one of ``other`` side by side, ``wrk`` alternating between them (16
    connections, ``seconds`` per endpoint and tree, ``rounds`` times): the median CPU per request and throughput of
    each, judged on the same load."""
    trees = {"this": ROOT, "compared": other}
    ports = {name: free_port() for name in trees}
    procs = {name: start_replica(d, ports[name], root=root) for name, root in trees.items()}
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {name: {} for name in paths}
    try:
        for name, proc in procs.items():
            await wait_ready(ports[name], ssl_ctx, proc)
        for endpoint in paths:  # a first window each: caches filled, connections warm
            for name, proc in procs.items():
                wrk_load(d, [ports[name]], paths[endpoint], files[endpoint], 1, 16, [proc.pid])
        for _ in range(rounds):
            for endpoint in paths:
                for name, proc in procs.items():
                    runs[endpoint].setdefault(name, []).append(
                        wrk_load(d, [ports[name]], paths[endpoint], files[endpoint], seconds, 16, [proc.pid]))
    finally:
        for proc in procs.values():
            proc.send_signal(signal.SIGTERM)
        for proc in procs.values():
            proc.wait(30)

    def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
        return {"server_cpu_ms_per_request": statistics.median(r["server_cpu_ms_per_request"] for r in rows),
                "admissions_per_second": statistics.median(r["admissions_per_second"] for r in rows),
                "p99_ms": statistics.median(r["p99_ms"] for r in rows),
                "errors": sum(r["errors"] for r in rows), "windows": len(rows)}

    return {"compared_root": str(other), "load_average": os.getloadavg()[0],
            "results": {endpoint: {name: summary(rows) for name, rows in by_tree.items()}
                        for endpoint, by_tree in runs.items()}}


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def soak(ports: list[int], pid: int, ssl_ctx: Any, bodies: dict[str, list[bytes]], total: int,
               samples: int = 20) -> dict[str, Any]:
    """``total`` requests (mutate, validate, binding in turn, 16 clients) to one replica; its RSS every
    ``total / samples`` requests."""
    step = max(total // samples, 3)
    series = [rss_kib(pid)]
    done = 0
    while done < total:
        n = min(step, total - done)
        for path, key in (("/mutate", "mutate"), ("/validate", "validate_pod"), ("/validate", "binding")):
            await run_load(ports, ssl_ctx, path, bodies[key], max(n // 3, 1), 16)
        done += n
        series.append(rss_kib(pid))
    quarter = series[len(series) // 4]
    return {"requests": done, "rss_kib": series, "rss_growth_after_first_quarter_kib": series[-1] - quarter}


def tree_rss_kib(pid: int) -> dict[str, int]:
    """RSS of ``pid`` and of its descendants (workers, body parser processes) in KiB."""
    kids = _children_of(pid)
    return {"main": rss_kib(pid), "children": sum(rss_kib(k) for k in kids if os.path.exists(f"/proc/{k}"))}


def _children_of(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        parent = todo.pop()
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == parent:
                        out.append(int(entry.name))
                        todo.append(int(entry.name))
                except (OSError, IndexError, ValueError):
                    pass
    return out


def soak_wrk(d: Path, port: int, pid: int, files: dict[str, Path], total: int, seconds: float) -> dict[str, Any]:
    """Rounds of mutate, validate and binding (``seconds`` each, 16 connections) to one webhook until ``total``
    requests; its RSS after each round."""
    series = [{"requests": 0, **tree_rss_kib(pid)}]
    done = 0
    started = time.monotonic()
    while done < total:
        for path, key in (("/mutate", "mutate"), ("/validate", "validate_pod"), ("/validate", "binding")):
            done += wrk_load(d, [port], path, files[key], seconds, 16, [pid])["requests"]
        series.append({"requests": done, **tree_rss_kib(pid), "load_average": os.getloadavg()[0]})
    quarter = next(x for x in series if x["requests"] >= done // 4)
    return {"requests": done, "seconds": round(time.monotonic() - started), "rss_kib": series,
            "rss_growth_after_first_quarter_kib": series[-1]["main"] - quarter["main"]}


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    import ssl

    with tempfile.TemporaryDirectory(prefix="numapin-bench-") as tmp:
        d = Path(tmp)
        (d / "nrt").mkdir()
        ca = make_ca()
        pair = make_serving_cert(ca, service_dns_names("numapin-webhook", "numapin"))
        (d / "tls.crt").write_bytes(pair.cert_pem)
        (d / "tls.key").write_bytes(pair.key_pem)
        distinct = write_nodes(d / "nrt", args.nodes, memory=args.memory == "static")
        # as a directory written before the webhook started: a file read within 2 s of its mtime is read again at
        # the source's next poll (--nrt-poll-seconds 60: inside a measured window), which no steady cluster shows
        old = time.time() - 60
        for f in (d / "nrt").iterdir():
            os.utime(f, (old, old))
        pod = realistic_pod("checkout-7d9f-abcde")
        # the pod as the API server stores it (mutated), known to the webhooks' pod source for its bindings
        stored = json.loads(json.dumps(mutate_pod(pod)[0]))
        (d / "pods").mkdir()
        (d / "pods" / "pod.json").write_text(json.dumps(stored))
        ssl_ctx = ssl.create_default_context(cadata=ca.cert_pem.decode())
        bodies = {"healthz_anchor": [],
                  "mutate": [pod_review(pod, with_uid=False) for _ in range(50)],
                  "validate_pod": [pod_review(stored, with_uid=True) for _ in range(50)],
                  "binding": [binding_review(pod["metadata"]["name"], f"node-{i:04d}") for i in range(args.nodes)]}
        paths = {"healthz_anchor": "/healthz", "mutate": "/mutate", "validate_pod": "/validate",
                 "binding": "/validate"}
        files: dict[str, Path | None] = {"healthz_anchor": None}
        for name in ("mutate", "validate_pod", "binding"):
            files[name] = d / f"{name}.bodies"
            files[name].write_bytes(b"\n".join(bodies[name]))  # type: ignore[union-attr]
        deployments = [(r, 1) for r in args.replicas] + [(1, w) for w in args.workers if w > 1]
        results: dict[str, Any] = {}
        memory = None
        for replicas, workers in deployments:
            ports = [free_port() for _ in range(replicas)]
            procs = [start_replica(d, p, workers) for p in ports]
            try:
                for port, proc in zip(ports, procs, strict=True):
                    await wait_ready(port, ssl_ctx, proc)
                async with aiohttp.ClientSession() as s, s.post(  # the webhook's patch gives the same stored pod
                        f"https://127.0.0.1:{ports[0]}/mutate", data=pod_review(pod, with_uid=False), ssl=ssl_ctx,
                        server_hostname=SERVER_NAME, headers={"Content-Type": "application/json"}) as r:
                    patch = json.loads(base64.b64decode((await r.json())["response"]["patch"]))
                import jsonpatch

                assert jsonpatch.JsonPatch(patch).apply(pod) == stored
                key = f"replicas_{replicas}" + (f"_workers_{workers}" if workers > 1 else "")
                pids = [p.pid for p in procs]
                first = True
                for name in paths:
                    rows = []
                    for c in args.concurrency:
                        # the first seconds of this endpoint at this concurrency (new connections, caches filling;
                        # right after the webhook became ready for the first of them), then the warm window
                        cold = (wrk_load(d, ports, paths[name], files[name], args.cold_seconds, c, pids)
                                if args.client == "wrk" else
                                await run_load(ports, ssl_ctx, paths[name], bodies[name], max(args.requests // 4, 1),
                                               c, pids))
                        warm = (wrk_load(d, ports, paths[name], files[name], args.seconds, c, pids)
                                if args.client == "wrk" else
                                await run_load(ports, ssl_ctx, paths[name], bodies[name], args.requests, c, pids))
                        rows.append({"concurrency": c, "warm": warm,
                                     "cold": {**cold, "first_after_ready": first}})
                        first = False
                    results.setdefault(key, {})[name] = rows
                if args.soak and memory is None:
                    memory = (soak_wrk(d, ports[0], procs[0].pid, files, args.soak, args.soak_seconds)  # type: ignore[arg-type]
                              if args.client == "wrk" else
                              await soak(ports[:1], procs[0].pid, ssl_ctx, bodies, args.soak))
            finally:
                for proc in procs:
                    proc.send_signal(signal.SIGTERM)
                for proc in procs:
                    proc.wait(30)
        compared = (await compare(d, ssl_ctx, args.compare_root, paths, files, args.seconds, args.compare_rounds)
                    if args.compare_root is not None else None)
    out = {"benchmark": "webhook", "tls": "TLSv1.2+, keep-alive, one connection per client",
           "client": args.client + (" (one wrk process per port, closed loop: offered load = connections)"
                                    if args.client == "wrk" else " (Python, in this process)"),
           "pod": "8 containers (2 init, 1 native sidecar, 5 app), Guaranteed, cpu-manager exclusive",
           "anchor": "healthz_anchor: GET /healthz over the same connections (TLS + HTTP, no decision)",
           "windows": "per endpoint and concurrency: 'cold', the first seconds (new connections; the first of them "
                      "right after /readyz turned ready), then 'warm', the measured window after it",
           "nodes": args.nodes, "distinct_node_states": distinct, "memory_manager_policy": args.memory,
           "cpu_count": os.cpu_count(),
           "results": results}
    if memory is not None:
        out["memory"] = memory
    if compared is not None:
        out["compared"] = compared
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=2000, help="requests per (endpoint, concurrency)")
    p.add_argument("--concurrency", default="1,16,64", help="comma-separated client counts")
    p.add_argument("--nodes", type=int, default=5000)
    p.add_argument("--memory", choices=("static", "none"), default="static",
                   help="static: the nodes publish memory per NUMA node and admissions judge it (default); none: CPUs "
                        "only")
    p.add_argument("--replicas", default="1", help="comma-separated replica counts (webhook processes, clients "
                   "spread over them as the Service does), e.g. 1,2")
    p.add_argument("--soak", type=int, default=0, help="then send this many more requests to one replica and "
                   "report its RSS along the way (1000000 for the long form)")
    p.add_argument("--workers", default="1", help="comma-separated worker counts of one webhook (--workers N, one "
                   "port), e.g. 1,2")
    p.add_argument("--client", choices=("auto", "wrk", "python"), default="auto",
                   help="load generator: wrk (C, Debian's wrk; auto when installed) or the Python client")
    p.add_argument("--seconds", type=float, default=10.0, help="wrk: seconds of the warm window per (endpoint, "
                   "concurrency)")
    p.add_argument("--cold-seconds", type=float, default=2.0, help="wrk: seconds of the cold window before it (the "
                   "first seconds of each endpoint and concurrency; the first of them right after the webhook is "
                   "ready): reported as 'cold' beside the warm window, and the warm-up of it")
    p.add_argument("--soak-seconds", type=float, default=5.0, help="wrk: seconds of each endpoint per soak round")
    p.add_argument("--compare-root", type=Path, default=None,
                   help="a tree of other numapin code (e.g. `git archive <commit> | tar -x -C DIR`): then one webhook "
                        "of it and one of this tree side by side, wrk alternating between them (--compare-rounds "
                        "windows of --seconds per endpoint each), reported as 'compared'")
    p.add_argument("--compare-rounds", type=int, default=3, help="windows per endpoint and tree with --compare-root")
    args = p.parse_args()
    if args.client == "auto":
        args.client = "wrk" if wrk_available() else "python"
    if args.compare_root is not None:
        if not (args.compare_root / "numapin" / "__main__.py").is_file():
            p.error(f"--compare-root {args.compare_root}: not a numapin tree (no numapin/__main__.py)")
        if args.client != "wrk":
            p.error("--compare-root needs wrk")
    args.workers = [int(x) for x in args.workers.split(",")]
    args.concurrency = [int(x) for x in args.concurrency.split(",")]
    args.replicas = [int(x) for x in args.replicas.split(",")]
    print(json.dumps(asyncio.run(main_async(args)), indent=2))


if __name__ == "__main__":
    main()
