"""The benchmarks' timing loop and its summary (shared by benchmarks/allocator.py and bench_memory_merge.py): a
function called ``runs`` times, each call timed with ``time.perf_counter``, summarised as p50/p99/max in
milliseconds."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

__all__ = ["stats", "time_runs"]


def stats(samples: list[float]) -> dict[str, float]:
    """p50, p99 and max of ``samples`` (seconds) in milliseconds, and how many there were."""
    ms = sorted(s * 1000 for s in samples)
    p99 = ms[min(len(ms) - 1, max(0, round(0.99 * len(ms)) - 1))]
    return {"p50_ms": round(statistics.median(ms), 3), "p99_ms": round(p99, 3), "max_ms": round(ms[-1], 3),
            "runs": len(ms)}


def time_runs(fn: Callable[[], Any], runs: int) -> list[float]:
    """The seconds each of ``runs`` calls of ``fn`` took."""
    out = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out
