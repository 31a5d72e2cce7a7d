"""The directory poll of the webhook's file sources (NodeResourceTopology and pod documents in a directory): a file
is read again when its (inode, mtime, size) changes, and while it is too recent to tell two versions apart."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

__all__ = ["RACY_NS", "poll_until_stopped", "settled"]

log = logging.getLogger("numapin.webhook.sources")

# A file modified this recently may be modified again within the file system's timestamp granularity (a jiffy, or a
# second on some) with the same size and inode: its (inode, mtime, size) cannot yet tell the two versions apart.
RACY_NS = 2_000_000_000

def settled(key: tuple[int, int, int] | None) -> tuple[int, int, int] | None:
    """``key`` (inode, mtime in ns, size) to remember for a file just read, or None (read it again next time) while its
    mtime is within ``RACY_NS`` of now: a rewrite in the same clock tick would otherwise go unseen for good."""
    if key is None or time.time_ns() - key[1] < RACY_NS:
        return None
    return key


async def poll_until_stopped(sync: Callable[[], Awaitable[None]], stop: asyncio.Event, every: float, what: str, *,
                             wait_first: bool = False) -> None:
    """Call ``sync`` every ``every`` seconds until ``stop`` is set; a failed sync is logged and retried.
    ``wait_first``: the first call after ``every`` seconds (the caller has just synced)."""
    if wait_first:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=every)
    while not stop.is_set():
        try:
            await sync()
        except Exception:
            log.exception("reading %s failed", what)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=every)
