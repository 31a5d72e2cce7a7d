"""Hostile traffic against a real ``numapin webhook`` process on loopback, the longer form of
tests/webhook/test_hostile.py (issue 15); prints JSON.

Phases: (1) a seeded fuzz of AdmissionReview bodies plus issue 15's payloads and issue 25's nestings (every place,
depths around every bound up to 100000, small bodies and bodies the parser process reads), with /healthz probes on fresh
connections measuring the event loop's lag; (2) connection abuse held for ``--hold`` seconds: ``--idle`` idle TLS
connections, TCP connections that never handshake, slowloris headers, half-sent bodies of the largest accepted size,
while probes and real reviews keep going; (3) the attack dropped, the server drains. Reported: answers by HTTP status
and any wrong answer (5xx, wrong uid, internal error, a hostile pod not denied under --unjudged=deny), probe latency
percentiles and failures per phase, the server's RSS (baseline, peak, after) against the ceiling its limits give,
and the server's own counts (connections closed by why, requests by verdict).

    python benchmarks/webhook_hostile.py --idle 2500 --fuzz 3000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.webhook.hostile import (  # noqa: E402
    Attack,
    Case,
    Prober,
    WebhookProcess,
    _dump,
    _pod,
    _review,
    fuzz_bodies,
    hostile_cases,
    metric_sum,
    metrics,
    nested_cases,
    request,
    send_cases,
)
from webhook.https.limits import ServerLimits  # noqa: E402
from webhook.https.server import DEFAULT_MAX_BODY  # noqa: E402

MIB = 1024 * 1024


async def _legit_loop(port: int, ctx: Any, stats: dict[str, int], every: float = 0.25) -> None:
    """A real review every ``every`` s (as the API server would send) during the attack."""
    while True:
        case = Case("valid", "/validate", _dump(_review(_pod("2", mode="share"))))
        try:
            status, body = await request(port, ctx, "POST", case.path, case.body, timeout=10)
            ok = status == 200 and json.loads(body)["response"]["allowed"] is True
            stats["ok" if ok else "wrong"] += 1
        except Exception:
            stats["failed"] += 1
        await asyncio.sleep(every)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="numapin-hostile-") as tmp:
        server = WebhookProcess(Path(tmp), "--unjudged", "deny")
        server.start()
        ctx = server.ssl_context()
        port = server.port
        limits = ServerLimits()
        out: dict[str, Any] = {"limits": {"max_connections": limits.max_connections,
                                          "max_body_bytes": DEFAULT_MAX_BODY,
                                          "inflight_bytes": limits.inflight_bytes,
                                          "memory_ceiling_mib_without_pod_cache":
                                              round(limits.memory_ceiling_bytes() / MIB, 1)}}
        try:
            out["rss_baseline_mib"] = round(server.rss_bytes() / MIB, 1)

            # -- 1. bodies ---------------------------------------------------------------------------------------
            prober = Prober(port, server.ca_file, interval=0.05, timeout=5.0)
            await prober.start()
            started = time.perf_counter()
            cases = hostile_cases() + list(fuzz_bodies(seed=args.seed, count=args.fuzz)) + nested_cases()
            statuses, problems = await send_cases(port, ctx, cases, concurrency=args.concurrency)
            await prober.stop()
            out["bodies"] = {"sent": len(cases), "seconds": round(time.perf_counter() - started, 2),
                             "statuses": {str(k): v for k, v in sorted(statuses.items())},
                             "problems": len(problems), "first_problems": problems[:10],
                             "probe": prober.summary(), "rss_mib": round(server.rss_bytes() / MIB, 1)}

            # -- 2. connections ----------------------------------------------------------------------------------
            attack = Attack(port, ctx)
            prober = Prober(port, server.ca_file, interval=0.1, timeout=5.0)
            await prober.start()
            legit = {"ok": 0, "wrong": 0, "failed": 0}
            legit_task = asyncio.create_task(_legit_loop(port, ctx, legit))
            peak = server.rss_bytes()
            started = time.perf_counter()
            try:
                opened = {"idle": await attack.idle(args.idle)}
                peak = max(peak, server.rss_bytes())
                opened["no_handshake"] = await attack.no_handshake(args.no_handshake)
                opened["slowloris"] = await attack.slowloris(args.slowloris)
                opened["half_bodies"] = await attack.half_bodies(args.half_bodies, announced=DEFAULT_MAX_BODY,
                                                                 sent=DEFAULT_MAX_BODY - 256 * 1024)
                end = time.perf_counter() + args.hold
                connections_seen = 0.0
                while time.perf_counter() < end:
                    peak = max(peak, server.rss_bytes())
                    m = await metrics(port, ctx)
                    connections_seen = max(connections_seen, metric_sum(m, "numapin_webhook_connections"))
                    await asyncio.sleep(0.5)
                closed = await attack.closed_by_server()
            finally:
                legit_task.cancel()
                await prober.stop()
                await attack.close()
            out["connections"] = {"opened": opened, "client_errors": attack.errors,
                                  "seconds": round(time.perf_counter() - started, 2),
                                  "closed_by_server": closed, "max_server_connections": connections_seen,
                                  "probe": prober.summary(), "legit_reviews": legit,
                                  "rss_peak_mib": round(peak / MIB, 1)}

            # -- 3. after ----------------------------------------------------------------------------------------
            await asyncio.sleep(2)
            m = await metrics(port, ctx)
            out["after"] = {
                "rss_mib": round(server.rss_bytes() / MIB, 1),
                "connections": metric_sum(m, "numapin_webhook_connections"),
                "closed": {why: metric_sum(m, "numapin_webhook_connections_closed_total", why=why)
                           for why in ("timeout", "evicted", "handshake_failed")},
                "requests": {k.split("{", 1)[1].rstrip("}").replace('"', ""): v for k, v in m.items()
                             if k.startswith("numapin_webhook_requests_total{")},
                "internal_errors": metric_sum(m, "numapin_webhook_internal_errors_total"),
                "unjudged": metric_sum(m, "numapin_webhook_unjudged_total"),
            }
            out["log_tracebacks"] = server.log_text().count("Traceback")
            # issue 25: the body parser process must survive every body (nested_cases: every nesting place and
            # depth, on the loop and in the process)
            out["parser_process_deaths"] = server.log_text().count("parser process died") + \
                server.log_text().count("parser process ended")
        finally:
            server.stop()
    out["rss_growth_mib"] = round(out["connections"]["rss_peak_mib"] - out["rss_baseline_mib"], 1)
    out["ok"] = (out["bodies"]["problems"] == 0 and out["bodies"]["probe"]["failed"] == 0
                 and out["parser_process_deaths"] == 0 and out["bodies"]["statuses"].get("503", 0) == 0
                 and out["connections"]["probe"]["failed"] == 0 and out["connections"]["legit_reviews"]["wrong"] == 0
                 and out["after"]["internal_errors"] == 0
                 and out["connections"]["rss_peak_mib"] <= out["limits"]["memory_ceiling_mib_without_pod_cache"])
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--fuzz", type=int, default=3000, help="fuzzed bodies (default 3000)")
    p.add_argument("--seed", type=int, default=15)
    p.add_argument("--concurrency", type=int, default=16, help="fuzz requests in flight")
    p.add_argument("--idle", type=int, default=2500, help="idle TLS connections opened (default 2500)")
    p.add_argument("--no-handshake", type=int, default=200, help="TCP connections that never start TLS")
    p.add_argument("--slowloris", type=int, default=100, help="connections dripping headers")
    p.add_argument("--half-bodies", type=int, default=30, help="7 MiB bodies stopped 256 KiB short")
    p.add_argument("--hold", type=float, default=15.0, help="seconds the attack is held (default 15)")
    args = p.parse_args()
    result = asyncio.run(run(args))
    print(json.dumps(result, indent=2))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
