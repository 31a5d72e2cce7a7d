#!/usr/bin/env python3
"""Where numapin stands against its performance goals (issues 37 and 35), in one go of about 4-6 minutes; prints
JSON.

Runs, each as its own process (one after the other, so they do not load each other):

- ``benchmarks/webhook.py`` (one webhook process, 16 TLS clients with keep-alive, 5,000 nodes, memory judged; a
  ``--cold-seconds`` window right after /readyz, then the warm window): admissions per second of /mutate, /validate
  pod CREATE and bindings beside the /healthz anchor of the same run, their p99, and the webhook's CPU per request;
- ``benchmarks/relay_containerd.py`` (the frame relay, default flags, in front of a real containerd): the overhead
  on ``Version`` and ``ContainerStatus`` beside calling containerd directly, and the proxy's CPU per 1,000 relayed
  calls beside containerd's own;
- ``benchmarks/resize.py`` (fewer rounds than its default): numapin's share of an in-place resize beside
  containerd's own update of the same cpuset;
- ``benchmarks/nri.py --quick --only create,resize`` (issue 35 part 6, the NRI door on the lab's containerd 2.x):
  CreateContainer with the plugin against without it, the plugin's own time and CPU per create, and an in-place
  resize through NRI with 20 shared containers, kernel-checked at every answer.

The JSON has one row per figure: its value, its anchor (the counterpart measured in the same run), the goal and
whether it is met, and each benchmark's whole output under ``raw``. A short table follows on stderr. A benchmark
that fails is named under ``errors`` (the others still run) and the exit status is 1. Wall-clock
figures are noisy on a shared machine: compare a figure with its anchor, and repeat.

    python benchmarks/summary.py [--webhook-seconds 5] [--relay-calls 1000] [--resize-rounds 8] [--nri-rounds 10]
                                 [--only NAME,...]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PARTS = ("webhook", "relay", "resize", "nri")

__all__ = ["PARTS", "rows_of", "table"]


def _run(args: list[str], timeout: float) -> dict[str, Any]:
    """One benchmark script's JSON (its stderr passes through)."""
    proc = subprocess.run([sys.executable, *args], cwd=ROOT, stdout=subprocess.PIPE, text=True, timeout=timeout,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} exited with {proc.returncode}")
    start = proc.stdout.find("{")
    return json.loads(proc.stdout[start:])  # type: ignore[no-any-return]


def _row(figure: str, value: float | str | None, anchor: float | str | None, goal: str, met: bool | None,
         unit: str = "") -> dict[str, Any]:
    return {"figure": figure, "value": value, "unit": unit, "anchor": anchor, "goal": goal, "met": met}


def webhook_rows(raw: dict[str, Any]) -> list[dict[str, Any]]:
    results = raw["results"]["replicas_1"]

    def warm(name: str) -> dict[str, Any]:
        return results[name][0]["warm"]  # type: ignore[no-any-return]

    def cold(name: str) -> dict[str, Any]:
        return results[name][0]["cold"]  # type: ignore[no-any-return]

    anchor = warm("healthz_anchor")
    healthz = anchor["admissions_per_second"]
    rows = [_row("webhook GET /healthz per second (anchor: TLS + HTTP alone)", healthz, None, "", None, "/s")]
    for name, label, floor in (("mutate", "/mutate", 8000), ("validate_pod", "/validate pod CREATE", 8000),
                               ("binding", "/validate pods/binding", 12000)):
        w, c = warm(name), cold(name)
        rate = w["admissions_per_second"]
        ratio = round(rate / healthz, 3) if healthz else None
        goal = f">= {floor}/s" + (" (40% of /healthz)" if floor == 8000 else "")
        rows.append(_row(f"webhook {label} per second", rate, healthz, goal,
                         rate >= floor, "/s") | {"ratio_to_anchor": ratio})
        if floor == 8000:  # the goal as a share of the anchor, the form that holds from one machine to another
            rows.append(_row(f"webhook {label} per second / /healthz per second", ratio, 1.0, ">= 0.4",
                             ratio is not None and ratio >= 0.4))
        rows.append(_row(f"webhook {label} p99", w["p99_ms"], anchor["p99_ms"], "<= 3 ms", w["p99_ms"] <= 3, "ms"))
        rows.append(_row(f"webhook {label} p99, first seconds on new connections", c["p99_ms"],
                         cold("healthz_anchor")["p99_ms"], "<= 5 ms", c["p99_ms"] <= 5, "ms"))
        rows.append(_row(f"webhook {label} CPU per request", w.get("server_cpu_ms_per_request"),
                         anchor.get("server_cpu_ms_per_request"), "", None, "ms"))
    return rows


def relay_rows(raw: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    goals = raw["goals"]
    for method, r in raw["results"].items():
        frames, direct = r["frames"], r["direct"]
        rows.append(_row(f"relay {method} overhead p50", frames["overhead_p50_ms"], direct["p50_ms"],
                         f"<= +{goals['overhead_p50_ms']} ms", r["goals_met"]["overhead_p50_ms"], "ms"))
        rows.append(_row(f"relay {method} overhead p99", frames["overhead_p99_ms"], direct["p99_ms"],
                         f"<= +{goals['overhead_p99_ms']} ms", r["goals_met"]["overhead_p99_ms"], "ms"))
        rows.append(_row(f"relay {method} proxy CPU per 1,000 calls", frames["proxy_cpu_ms_per_1000_calls"],
                         r["runtime_cpu_ms_per_1000_calls_anchor"],
                         f"<= {goals['proxy_cpu_share_of_runtime']} x containerd's",
                         r["goals_met"]["proxy_cpu_share_of_runtime"], "ms"))
    return rows


def resize_rows(raw: dict[str, Any]) -> list[dict[str, Any]]:
    direct = raw["direct_update_on_containerd"]
    rows = []
    for key in ("grow", "shrink"):
        call = raw["call_to_answer_through_the_proxy"][key]
        own = round(call["p50_ms"] - direct["p50_ms"], 3)
        rows.append(_row(f"resize {key}: numapin's share at p50 (through the proxy - direct update)", own,
                         direct["p50_ms"], "<= 3 ms", own <= 3, "ms"))
        ratio = round(call["p99_ms"] / direct["p99_ms"], 3) if direct["p99_ms"] else None
        rows.append(_row(f"resize {key}: p99 through the proxy", call["p99_ms"], direct["p99_ms"],
                         "<= 1.3 x the direct update", ratio is not None and ratio <= 1.3, "ms")
                    | {"ratio_to_anchor": ratio})
    agreed = raw["kernel_showed_the_new_cpusets_at_the_answer"]
    done, total = (int(x) for x in agreed.split("/"))
    rows.append(_row("resize: the kernel showed the new cpusets at the answer", agreed, None, "every time",
                     done == total))
    return rows


def nri_rows(raw: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    create = raw.get("create_overhead")
    if create is not None:
        for kind in ("shared", "exclusive"):
            c = create[kind]
            own = create["plugin_service_time"][kind]["p50_ms"]
            rows.append(_row(f"NRI create {kind}: added p50 (with the plugin - without)", c["p50_overhead_ms"],
                             c["without_plugin"]["p50_ms"], "<= 1 ms", c["p50_overhead_ms"] <= 1, "ms"))
            rows.append(_row(f"NRI create {kind}: the plugin's own time p50", own, None, "", None, "ms"))
            cpu = create.get("plugin_cpu_ms_per_create_and_remove", {}).get(kind)
            rows.append(_row(f"NRI create {kind}: the plugin's CPU per create and removal", cpu, None, "", None, "ms"))
    resize = raw.get("resize")
    if resize is not None:
        anchor = resize["same_calls_without_plugin"]["p99_ms"]
        for key in ("grow", "shrink"):
            p99 = resize["call_to_answer"][key]["p99_ms"]
            rows.append(_row(f"NRI resize {key} with {resize['shared_containers']} shared containers: p99", p99,
                             anchor, "<= 100 ms", p99 <= 100, "ms"))
            rows.append(_row(f"NRI resize {key}: the plugin's own time p50",
                             resize["plugin_service_time"][key]["p50_ms"], None, "", None, "ms"))
        agreed = resize["kernel_showed_the_new_cpusets_at_the_answer"]
        done, total = (int(x) for x in agreed.split("/"))
        rows.append(_row("NRI resize: the kernel showed the new cpusets at the answer", agreed, None, "every time",
                         done == total))
    return rows


def rows_of(raw: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The summary rows of the benchmarks' outputs (``raw``: part name -> its JSON)."""
    makers = {"webhook": webhook_rows, "relay": relay_rows, "resize": resize_rows, "nri": nri_rows}
    return [row for part in PARTS if part in raw for row in makers[part](raw[part])]


def table(rows: list[dict[str, Any]]) -> str:
    """The rows as a plain-text table: figure, value, anchor, goal, met."""
    def cell(v: Any) -> str:
        return "" if v is None else str(v)

    lines = [("figure", "value", "anchor", "goal", "met")]
    lines += [(r["figure"], f"{cell(r['value'])} {r['unit']}".strip(), cell(r["anchor"]), r["goal"],
               {True: "yes", False: "NO", None: ""}[r["met"]]) for r in rows]
    widths = [max(len(line[i]) for line in lines) for i in range(5)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--webhook-seconds", type=float, default=5.0, help="warm window per webhook endpoint (default 5)")
    ap.add_argument("--relay-calls", type=int, default=1000, help="calls of each method on each path (default 1000)")
    ap.add_argument("--resize-rounds", type=int, default=8, help="rounds of a growth and a shrink (default 8)")
    ap.add_argument("--nri-rounds", type=int, default=10, help="NRI resize rounds (default 10)")
    ap.add_argument("--only", default=",".join(PARTS), help=f"comma-separated parts to run: {', '.join(PARTS)}")
    args = ap.parse_args()
    only = [p for p in args.only.split(",") if p]
    unknown = sorted(set(only) - set(PARTS))
    if unknown:
        ap.error(f"unknown part(s) {', '.join(unknown)}: choose from {', '.join(PARTS)}")
    if args.webhook_seconds <= 0 or min(args.relay_calls, args.resize_rounds, args.nri_rounds) < 1:
        ap.error("--webhook-seconds must be positive, --relay-calls, --resize-rounds and --nri-rounds at least 1")
    commands = {
        "webhook": ["benchmarks/webhook.py", "--concurrency", "16", "--seconds", str(args.webhook_seconds),
                    "--cold-seconds", "2", "--replicas", "1"],
        "relay": ["benchmarks/relay_containerd.py", "--calls", str(args.relay_calls)],
        "resize": ["benchmarks/resize.py", "--rounds", str(args.resize_rounds)],
        "nri": ["benchmarks/nri.py", "--quick", "--only", "create,resize", "--rounds", str(args.nri_rounds)],
    }
    raw: dict[str, dict[str, Any]] = {}
    seconds: dict[str, float] = {}
    errors: dict[str, str] = {}
    for part in PARTS:
        if part in only:
            started = time.monotonic()
            print(f"summary: running {' '.join(commands[part])}", file=sys.stderr, flush=True)
            try:
                raw[part] = _run(commands[part], timeout=600)
            except (RuntimeError, subprocess.TimeoutExpired, json.JSONDecodeError) as e:  # the others still run
                errors[part] = f"{type(e).__name__}: {e}"
                print(f"summary: {part} failed: {errors[part]}", file=sys.stderr, flush=True)
            seconds[part] = round(time.monotonic() - started, 1)
    rows = rows_of(raw)
    print(json.dumps({"benchmark": "summary", "cpu_count": os.cpu_count(), "load_average": os.getloadavg(),
                      "seconds": seconds, "errors": errors, "rows": rows, "raw": raw}, indent=1))
    print(table(rows), file=sys.stderr)
    if errors:
        sys.exit(1)


if __name__ == "__main__":
    main()
