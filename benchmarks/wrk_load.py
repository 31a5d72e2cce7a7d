"""Load from ``wrk`` (Debian's ``wrk``: a C HTTP benchmarking client, epoll, OpenSSL), so the load generator does
not eat the cores the webhook is measured on (a Python client at 2,000 requests a second takes most of a core).

``wrk_load`` runs one ``wrk`` per webhook port (the connections split over them, as the Service spreads them), each a
closed loop: every connection sends its next request as soon as the answer to the last one is in, so the offered
load is the number of connections, not a rate. Bodies come from a file, one JSON document a line, cycled. It
returns the figures of ``benchmarks/webhook.py``'s Python client, plus the CPU the webhook processes (with all their
children: workers, body parser processes) and ``wrk`` itself spent per request.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
from pathlib import Path
from typing import Any

__all__ = ["available", "process_tree_cpu_seconds", "wrk_load"]

LUA = r"""
-- numapin benchmark: POST the bodies of $WRK_BODIES (one a line, cycled) to $WRK_PATH; GET when there is no file
local bodies, n, i = {}, 0, 0
local path = os.getenv("WRK_PATH")
local file = os.getenv("WRK_BODIES")
function init(args)
  if file ~= nil and file ~= "" then
    for line in io.lines(file) do
      n = n + 1
      bodies[n] = wrk.format("POST", path, {["Content-Type"] = "application/json"}, line)
    end
    i = math.random(n) - 1
  end
end
function request()
  if n == 0 then return wrk.format("GET", path) end
  i = i % n + 1
  return bodies[i]
end
function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    '{"requests":%d,"duration_us":%d,"socket_errors":%d,"non2xx":%d,"p50_us":%d,"p99_us":%d,"max_us":%d}\n',
    summary.requests, summary.duration, e.connect + e.read + e.write + e.timeout, e.status,
    latency:percentile(50), latency:percentile(99), latency.max))
end
"""


def available() -> bool:
    return shutil.which("wrk") is not None


def _children() -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        out.setdefault(ppid, []).append(int(entry.name))
    return out


def process_tree_cpu_seconds(pids: list[int]) -> float:
    """User + system CPU time of ``pids`` and all their descendants alive now."""
    children = _children()
    todo, seen, total = list(pids), set(), 0.0
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        todo.extend(children.get(pid, ()))
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def wrk_load(workdir: Path, ports: list[int], path: str, bodies_file: Path | None, seconds: float,
             connections: int, pids: list[int]) -> dict[str, Any]:
    """``connections`` keep-alive TLS connections for ``seconds`` against ``ports`` (split over them)."""
    script = workdir / "numapin-bench.lua"
    if not script.exists():
        script.write_text(LUA)
    share = [connections // len(ports) + (1 if i < connections % len(ports) else 0) for i in range(len(ports))]
    env = {**os.environ, "WRK_PATH": path, "WRK_BODIES": str(bodies_file) if bodies_file else ""}
    cpu0, wrk0 = process_tree_cpu_seconds(pids), _children_cpu()
    procs = [subprocess.Popen(["wrk", "-t1", f"-c{c}", f"-d{max(1, round(seconds))}s", "-s", str(script),
                               f"https://127.0.0.1:{port}{path}"], stdout=subprocess.PIPE, text=True, env=env)
             for port, c in zip(ports, share, strict=True) if c > 0]
    outs = [p.communicate()[0] for p in procs]
    cpu, wrk_cpu = process_tree_cpu_seconds(pids) - cpu0, _children_cpu() - wrk0
    runs = []
    for out in outs:
        line = next((x for x in out.splitlines() if x.startswith('{"requests"')), None)
        if line is None:
            raise RuntimeError(f"wrk printed no summary:\n{out}")
        runs.append(json.loads(line))
    requests = sum(r["requests"] for r in runs)
    return {
        "client": "wrk", "connections": connections, "requests": requests,
        "errors": sum(r["socket_errors"] + r["non2xx"] for r in runs),
        "admissions_per_second": round(sum(r["requests"] / (r["duration_us"] / 1e6) for r in runs), 1),
        # one wrk per port: the largest of their percentiles (a bound on the combined one)
        "p50_ms": round(max(r["p50_us"] for r in runs) / 1000, 3),
        "p99_ms": round(max(r["p99_us"] for r in runs) / 1000, 3),
        "max_ms": round(max(r["max_us"] for r in runs) / 1000, 3),
        "server_cpu_ms_per_request": round(cpu / requests * 1000, 3) if requests else None,
        "admissions_per_cpu_second": round(requests / cpu, 1) if cpu else None,
        "client_cpu_ms_per_request": round(wrk_cpu / requests * 1000, 3) if requests else None,
        "load_average": os.getloadavg()[0],
    }
