"""How long a large valid body holds the webhook's event loop; prints JSON.

Runs the webhook in this process (real TLS, the real decisions, the node topology of the test suite) and posts pods
UPDATE reviews of 1, 3 and 6.5 MiB (object and oldObject of a pod grown with environment variables; the API server
sends at most about 2 x 3 MiB) from a client process (curl), while a probe on the loop records its longest iteration,
in CPU time of the loop's thread (what the loop itself spent: not inflated by other processes on a busy machine) and
in wall-clock time. Each size is sent with the body parser process (bodies over 128 KiB parsed off the loop, the
default) and with every body parsed on the loop (the anchor: what the loop would stall for), in alternation.

Usage: python benchmarks/webhook_large.py [--sizes 1,3,6.5] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.webhook import large_update_review  # noqa: E402
from tests.webhook.helpers import make_pki  # noqa: E402
from tests.webhook.nrt_fixtures import write_cluster  # noqa: E402
from webhook.app import WebhookApp, WebhookOptions  # noqa: E402
from webhook.https.request_body import LARGE_BODY_BYTES, parse_slim  # noqa: E402


class LoopProbe:
    """Ticks the loop (``sleep(0)``) and keeps the longest time between two ticks, in CPU time of the loop's thread
    and in wall-clock time."""

    def __init__(self) -> None:
        self.longest = 0.0
        self.longest_wall = 0.0
        self.ticks = 0
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            before, before_wall = time.thread_time(), time.perf_counter()
            await asyncio.sleep(0)
            self.longest = max(self.longest, time.thread_time() - before)
            self.longest_wall = max(self.longest_wall, time.perf_counter() - before_wall)
            self.ticks += 1

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


async def _post(port: int, body_file: Path) -> str:
    proc = await asyncio.create_subprocess_exec(
        "curl", "-sk", "-o", "/dev/null", "-w", "%{http_code}", "-H", "Content-Type: application/json",
        "--data-binary", f"@{body_file}", f"https://127.0.0.1:{port}/validate", stdout=asyncio.subprocess.PIPE)
    out, _ = await proc.communicate()
    return out.decode()


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="numapin-large-") as tmp:
        d = Path(tmp)
        (d / "tls").mkdir()
        (d / "nrt").mkdir()
        pki = make_pki(d / "tls")
        write_cluster(d / "nrt")
        app = WebhookApp(WebhookOptions(cert=pki.cert, key=pki.key, host="127.0.0.1", port=0, nrt_dir=d / "nrt"))
        await app.start()
        assert app.port is not None
        results: list[dict[str, Any]] = []
        try:
            for mib in args.sizes:
                body = large_update_review(int(mib * 2**20))
                body_file = d / "body.json"
                body_file.write_bytes(body)
                before = time.thread_time()
                parse_slim(body)
                parse_cpu = time.thread_time() - before
                row: dict[str, Any] = {"mib": mib, "bytes": len(body),
                                       "parse_on_the_loop_cpu_ms (anchor)": round(parse_cpu * 1000, 2)}
                for mode, large in (("parser_process", LARGE_BODY_BYTES), ("on_the_loop", 1 << 40)):
                    app.server.parser.large = large
                    cpu, wall = [], []
                    for _ in range(args.rounds):
                        probe = LoopProbe()
                        probe.start()
                        status = await _post(app.port, body_file)
                        await probe.stop()
                        assert status == "200", status
                        cpu.append(probe.longest * 1000)
                        wall.append(probe.longest_wall * 1000)
                    row[f"{mode}: longest loop iteration, cpu_ms"] = round(min(cpu), 2)
                    row[f"{mode}: longest loop iteration, wall_ms"] = round(min(wall), 2)
                results.append(row)
        finally:
            await app.stop()
    return {"benchmark": "webhook_large", "rounds": args.rounds, "figures": "the least of the rounds",
            "load_average": os.getloadavg()[0], "results": results}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="1,3,6.5", help="body sizes in MiB, comma-separated")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    args.sizes = [float(x) for x in args.sizes.split(",")]
    print(json.dumps(asyncio.run(main_async(args)), indent=2))


if __name__ == "__main__":
    main()
