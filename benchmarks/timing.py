"""The benchmarks' timing loop and its summary: a function called ``runs`` times, each call timed with
``time.perf_counter`` (benchmarks/allocator.py, bench_memory_merge.py), and the p50/p99/max summary in milliseconds
that those and the proxy's end-to-end benchmarks (resize.py, mode_change.py) print."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

__all__ = ["stats", "stats_ms", "time_runs"]


def stats(samples: list[float]) -> dict[str, float]:
    """p50, p99 and max of ``samples`` (seconds) in milliseconds, and how many there were."""
    return stats_ms([s * 1000 for s in samples])


def stats_ms(samples_ms: list[float]) -> dict[str, float]:
    """p50, p99 (nearest rank) and max of ``samples_ms`` (milliseconds), and how many there were."""
    if not samples_ms:
        raise ValueError("no samples to summarise")
    ms = sorted(samples_ms)
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
