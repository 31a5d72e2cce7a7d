"""Benchmark of the admission webhook over TLS with keep-alive; prints JSON.

Starts ``numapin webhook`` as a separate process (its own interpreter, as in a cluster) with a fresh CA and serving
certificate and a directory of 1000 NodeResourceTopology documents (2-socket, 2 NUMA x 28-CPU nodes under
single-numa-node, each with its own free CPUs, so most nodes differ), then for 1, 16 and 64 concurrent clients
(one keep-alive TLS connection each) measures admissions per second and p50/p99 latency of:

- ``mutate``: pods CREATE of a realistic 8-container pod (2 init containers, a native sidecar, 5 app containers;
  Guaranteed, two of them with whole CPUs);
- ``binding``: pods/binding CREATE of that pod to each of the 1000 nodes in turn (the node simulated with its free
  CPUs; answers cached by node state);
- ``validate_pod``: pods CREATE of that pod, checked against all 1000 nodes (distinct node shapes simulated once).

Usage: python benchmarks/webhook.py [--requests N] [--concurrency 1,16,64] [--nodes 1000]
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
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from allocator.cpuset import CPUSet  # noqa: E402
from allocator.nrt import build_nrt  # noqa: E402
from allocator.topology import CPUInfo, Topology  # noqa: E402
from webhook.certs import make_ca, make_serving_cert, service_dns_names  # noqa: E402

SERVER_NAME = "numapin-webhook.numapin.svc"


def machine(numa_nodes: int = 2, cores_per_numa: int = 14, threads: int = 2) -> Topology:
    total = numa_nodes * cores_per_numa
    cpus = [CPUInfo(cpu=k + t * total, core=k, socket=k // cores_per_numa, numa=k // cores_per_numa,
                    uncore=k // cores_per_numa) for t in range(threads) for k in range(total)]
    dist = {a: tuple(10 if a == b else 21 for b in range(numa_nodes)) for a in range(numa_nodes)}
    return Topology(cpus=tuple(cpus), numa_nodes=tuple(range(numa_nodes)), numa_distances=dist)


def write_nodes(directory: Path, count: int, seed: int = 7) -> int:
    """``count`` NRT documents, one file each; returns how many distinct free-CPU states they have."""
    rnd = random.Random(seed)
    topo = machine()
    reserved = CPUSet([0, 28])
    states = set()
    for i in range(count):
        busy_cores = [c for c in range(1, 28) if rnd.random() < 0.4]
        busy = CPUSet(busy_cores) | CPUSet(c + 28 for c in busy_cores)
        free = topo.all_cpus - reserved - busy
        doc = build_nrt(f"node-{i:04d}", topo, free_cpus=free, reserved_cpus=reserved,
                        topology_manager_policy="single-numa-node", labels={"pool": "general"})
        states.add(tuple(len(free & topo.cpus_in_numa(n)) for n in (0, 1)))
        (directory / f"node-{i:04d}.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
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


async def run_load(port: int, ssl_ctx: Any, path: str, bodies: list[bytes], total: int,
                   concurrency: int) -> dict[str, Any]:
    latencies: list[float] = []
    errors = 0
    verdicts: dict[str, int] = {}
    next_index = 0

    async def worker() -> None:
        nonlocal next_index, errors
        conn = aiohttp.TCPConnector(limit=1, ssl=ssl_ctx)
        async with aiohttp.ClientSession(connector=conn) as s:
            while next_index < total:
                body = bodies[next_index % len(bodies)]
                next_index += 1
                t0 = time.perf_counter()
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

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed = time.perf_counter() - started
    latencies.sort()

    def pct(p: float) -> float:
        return round(latencies[min(len(latencies) - 1, int(p * len(latencies)))] * 1000, 3)

    return {"concurrency": concurrency, "requests": len(latencies), "errors": errors, "verdicts": verdicts,
            "admissions_per_second": round(len(latencies) / elapsed, 1), "p50_ms": pct(0.50), "p99_ms": pct(0.99),
            "mean_ms": round(statistics.fmean(latencies) * 1000, 3)}


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


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    import socket
    import ssl

    with tempfile.TemporaryDirectory(prefix="numapin-bench-") as tmp:
        d = Path(tmp)
        (d / "nrt").mkdir()
        ca = make_ca()
        pair = make_serving_cert(ca, service_dns_names("numapin-webhook", "numapin"))
        (d / "tls.crt").write_bytes(pair.cert_pem)
        (d / "tls.key").write_bytes(pair.key_pem)
        distinct = write_nodes(d / "nrt", args.nodes)
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        proc = subprocess.Popen(
            [sys.executable, "-m", "numapin", "webhook", "--cert", str(d / "tls.crt"), "--key", str(d / "tls.key"),
             "--host", "127.0.0.1", "--port", str(port), "--nrt-dir", str(d / "nrt"), "--log-level", "warning",
             "--nrt-poll-seconds", "60"],
            cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
        ssl_ctx = ssl.create_default_context(cadata=ca.cert_pem.decode())
        try:
            await wait_ready(port, ssl_ctx, proc)
            pod = realistic_pod("checkout-7d9f-abcde")
            # what the API server stores: the mutated pod; validating its CREATE puts it in the binding cache
            async with aiohttp.ClientSession() as s, s.post(
                    f"https://127.0.0.1:{port}/mutate", data=pod_review(pod, with_uid=False), ssl=ssl_ctx,
                    server_hostname=SERVER_NAME, headers={"Content-Type": "application/json"}) as r:
                patch = json.loads(base64.b64decode((await r.json())["response"]["patch"]))
            import jsonpatch

            stored = jsonpatch.JsonPatch(patch).apply(pod)
            mutate_bodies = [pod_review(pod, with_uid=False) for _ in range(50)]
            validate_bodies = [pod_review(stored, with_uid=True) for _ in range(50)]
            binding_bodies = [binding_review(pod["metadata"]["name"], f"node-{i:04d}") for i in range(args.nodes)]
            results: dict[str, Any] = {}
            for name, path, bodies in (("mutate", "/mutate", mutate_bodies),
                                       ("validate_pod", "/validate", validate_bodies),
                                       ("binding", "/validate", binding_bodies)):
                if name == "binding":
                    # the pod must be in the cache (validate CREATE) before bindings are judged
                    await run_load(port, ssl_ctx, "/validate", validate_bodies[:1], 1, 1)
                results[name] = [await run_load(port, ssl_ctx, path, bodies, args.requests, c)
                                 for c in args.concurrency]
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(10)
    return {"benchmark": "webhook", "tls": "TLSv1.2+, keep-alive, one connection per client",
            "pod": "8 containers (2 init, 1 native sidecar, 5 app), Guaranteed, cpu-manager exclusive",
            "nodes": args.nodes, "distinct_node_states": distinct, "cpu_count": os.cpu_count(),
            "results": results}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=2000, help="requests per (endpoint, concurrency)")
    p.add_argument("--concurrency", default="1,16,64", help="comma-separated client counts")
    p.add_argument("--nodes", type=int, default=1000)
    args = p.parse_args()
    args.concurrency = [int(x) for x in args.concurrency.split(",")]
    print(json.dumps(asyncio.run(main_async(args)), indent=2))


if __name__ == "__main__":
    main()
