"""The webhook's long-lived heap kept out of the cyclic garbage collector's full passes.

CPython collects its oldest generation when the objects that reached it since the last full pass number a quarter of
those it held then. At start the webhook's heap grows in steps (5,000 NodeResourceTopology documents and their
index, then the decision caches filling), and each step triggers a full pass over everything: 45-290 ms on this
2-core machine with 5,000 nodes known, the event loop held throughout, the first seconds' p99 set by it. ``settle``
runs one full pass before serving and moves what survives into the permanent generation (``gc.freeze``): later passes
visit only what was allocated after. Frozen objects are still freed by reference counting when dropped (node
documents and their index are trees, without cycles); only a cycle among them would outlive its last reference, so
the heap is settled once, after the first load, not over and over.
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass

__all__ = ["HeapSettled", "settle"]


@dataclass(frozen=True)
class HeapSettled:
    frozen_objects: int     # objects in the permanent generation after this settle
    collected: int          # unreachable objects the full pass found
    seconds: float          # how long the pass and the freeze held the thread


def settle() -> HeapSettled:
    """One full collection, then everything alive frozen out of later collections."""
    started = time.perf_counter()
    collected = gc.collect()
    gc.freeze()
    return HeapSettled(frozen_objects=gc.get_freeze_count(), collected=collected,
                       seconds=time.perf_counter() - started)
