"""``--workers N``: one scrape of /metrics reports every worker (counters and histograms summed, gauges by worker)."""

from __future__ import annotations

import asyncio
import json
import random
import signal
import ssl
import time
import urllib.request
from pathlib import Path

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from tests.webhook.test_cli import _alive, _serve_webhook, numapin, workers_listening
from webhook.https.metrics import WebhookMetrics
from webhook.https.worker_metrics import merge


def _samples(text: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text.decode()) for s in f.samples}


def test_merge_sums_counters_and_histograms_and_labels_gauges_by_worker() -> None:
    a, b = WebhookMetrics(), WebhookMetrics()
    a.observe("mutate", "patched", 0.002)
    a.observe("mutate", "patched", 0.2)
    b.observe("mutate", "patched", 0.002)
    b.observe("validate", "denied", 0.004)
    a.connections.set(3)
    b.connections.set(5)
    merged = _samples(merge({101: a.render(), 202: b.render()}))
    assert merged[("numapin_webhook_requests_total", (("endpoint", "mutate"), ("verdict", "patched")))] == 3
    assert merged[("numapin_webhook_requests_total", (("endpoint", "validate"), ("verdict", "denied")))] == 1
    mutate = (("endpoint", "mutate"),)
    assert merged[("numapin_webhook_request_duration_seconds_count", mutate)] == 3
    assert merged[("numapin_webhook_request_duration_seconds_bucket", (("endpoint", "mutate"), ("le", "0.0025")))] == 2
    assert abs(merged[("numapin_webhook_request_duration_seconds_sum", mutate)] - 0.204) < 1e-9
    assert merged[("numapin_webhook_connections", (("worker", "101"),))] == 3
    assert merged[("numapin_webhook_connections", (("worker", "202"),))] == 5
    assert ("numapin_webhook_connections", ()) not in merged
    assert merged[("numapin_webhook_workers_scraped", ())] == 2
    created = ("numapin_webhook_requests_created", (("endpoint", "mutate"), ("verdict", "patched")))
    assert merged[created] == min(_samples(x.render())[created] for x in (a, b))  # the earliest start
    alone = _samples(merge({7: a.render()}))
    assert alone[("numapin_webhook_requests_total", (("endpoint", "mutate"), ("verdict", "patched")))] == 2


def test_merge_of_seeded_random_workers_counts_as_one_process() -> None:
    """Seeded random traffic over 1-4 workers: the merge counts as one process seeing all of it would."""
    rng = random.Random(13)
    endpoints, verdicts = ("mutate", "validate"), ("allowed", "patched", "denied", "bad_request")
    for _ in range(40):
        workers = [WebhookMetrics() for _ in range(rng.randint(1, 4))]
        whole = WebhookMetrics()
        for _ in range(rng.randint(0, 60)):
            w = rng.choice(workers)
            call = (rng.choice(endpoints), rng.choice(verdicts), rng.choice((0.0004, 0.003, 0.02, 0.7, 9.0)))
            w.observe(*call)
            whole.observe(*call)
            if rng.random() < 0.2:
                reason = rng.choice(("pod_unknown", "node_unknown"))
                w.unjudged.labels("validate", reason, "allow").inc()
                whole.unjudged.labels("validate", reason, "allow").inc()
        merged = _samples(merge({pid: w.render() for pid, w in enumerate(workers, 100)}))
        expected = {k: v for k, v in _samples(whole.render()).items()
                    if k[0].endswith(("_total", "_bucket", "_count", "_sum"))}
        assert {k: round(v, 9) for k, v in merged.items() if k in expected} == {
            k: round(v, 9) for k, v in expected.items()}
        assert merged[("numapin_webhook_workers_scraped", ())] == len(workers)


def _worker_metrics(directory: Path, pid: int) -> bytes:
    async def get() -> bytes:
        async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=str(directory / f"worker-{pid}.sock"))
                                         ) as s, s.get("http://worker/metrics") as r:
            assert r.status == 200
            return await r.read()

    return asyncio.run(get())


def test_one_scrape_reports_every_worker(tmp_path: Path) -> None:
    """Two workers on one port, 24 admissions each on a new connection (the kernel spreads them over both): every
    scrape, whichever worker it lands on, counts all 24 and both workers' connections; each worker alone counts only
    its own (both some); the supervisor removes the sockets' directory when it stops."""
    certs = tmp_path / "certs"
    assert numapin("certs", "--out-dir", str(certs), "--ip-address", "127.0.0.1").returncode == 0
    proc, port = _serve_webhook(tmp_path, certs, "--workers", "2")
    try:
        workers = workers_listening(proc, port, 2)
        cmdline = Path(f"/proc/{workers[0]}/cmdline").read_bytes().split(b"\0")
        directory = Path(cmdline[cmdline.index(b"--worker-metrics-dir") + 1].decode())
        for _ in range(600):  # both answering their metrics (bounded: 60 s)
            if all((directory / f"worker-{w}.sock").exists() for w in workers):
                break
            time.sleep(0.1)
        ctx = ssl.create_default_context(cafile=str(certs / "ca.crt"))
        body = json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
            "uid": "abc", "operation": "CREATE", "resource": {"group": "", "version": "v1", "resource": "pods"},
            "object": {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c"}]}}}}).encode()
        for _ in range(24):  # urllib: a new connection each time
            req = urllib.request.Request(f"https://127.0.0.1:{port}/mutate", data=body,
                                         headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, context=ctx, timeout=10) as r:
                assert json.loads(r.read())["response"]["allowed"] is True
        key = ("numapin_webhook_requests_total", (("endpoint", "mutate"), ("verdict", "patched")))
        own = [_samples(_worker_metrics(directory, w)).get(key, 0.0) for w in workers]
        assert sum(own) == 24 and all(n > 0 for n in own), own
        for _ in range(8):
            with urllib.request.urlopen(f"https://127.0.0.1:{port}/metrics", context=ctx, timeout=10) as r:
                scraped = _samples(r.read())
            assert scraped[key] == 24
            assert scraped[("numapin_webhook_workers_scraped", ())] == 2
            assert {labels for name, labels in scraped if name == "numapin_webhook_known_nodes"} == {
                (("worker", str(w)),) for w in workers}
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        assert not directory.exists()
        assert not any(_alive(w) for w in workers)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
