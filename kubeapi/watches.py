"""The list/watch loops of numapin's API clients (the webhook's cluster view, the proxy's pod watch): a watch the API
server ends is listed and watched again, a 410 Gone lists again at once, a failure waits and retries."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from typing import Any

__all__ = ["WATCH_REQUEST_TIMEOUT", "WATCH_SECONDS", "run_watches", "watch_events", "watch_until_stopped"]

log = logging.getLogger("numapin.kubeapi.watches")

# A watch asks the API server to end it after WATCH_SECONDS; the client gives up a little later, so a connection
# that died without being closed (no FIN, e.g. a node gone) is noticed and the source lists and watches again.
WATCH_SECONDS = 300
WATCH_REQUEST_TIMEOUT = WATCH_SECONDS + 30


async def watch_until_stopped(once: Callable[[], Awaitable[None]], stop: asyncio.Event, retry_seconds: float,
                              what: str) -> None:
    """Call ``once`` (a list then a watch) again and again until ``stop`` is set. After a failure wait
    ``retry_seconds``, except after a 410 Gone (the watch's version was compacted away, routine on a busy API server):
    list again at once, unless the previous attempt ended the same way."""
    gone_before = False
    while not stop.is_set():
        try:
            await once()
            gone_before = False
            continue
        except asyncio.CancelledError:
            raise
        except Exception as e:
            gone = getattr(e, "status", None) == 410
            if gone and not gone_before:
                log.info("watching %s: 410 Gone; listing again", what)
                gone_before = True
                continue
            gone_before = gone
            log.warning("watching %s failed (%s); retrying in %ss", what, e, retry_seconds)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=retry_seconds)


async def run_watches(watches: Mapping[str, Callable[[], Awaitable[None]]], stop: asyncio.Event,
                      retry_seconds: float) -> None:
    """``watch_until_stopped`` for each ``{what: once}`` until ``stop`` is set. A watch blocks until the server ends
    it, so the loops run beside ``stop`` and are cancelled when it is set (or when one of them ends: only by an
    error, which is raised here)."""
    tasks = [asyncio.create_task(watch_until_stopped(once, stop, retry_seconds, what))
             for what, once in watches.items()]
    stopped = asyncio.create_task(stop.wait())
    try:
        await asyncio.wait((*tasks, stopped), return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in (*tasks, stopped):
            t.cancel()
        for t in (*tasks, stopped):
            with contextlib.suppress(asyncio.CancelledError):
                await t


async def watch_events(list_call: Callable[..., Any], *args: Any, resource_version: str | None,
                       **kwargs: Any) -> AsyncGenerator[tuple[str, Mapping[str, Any]], None]:
    """The events of a watch of ``list_call(*args, **kwargs)`` from ``resource_version`` (the list's), as (type,
    object as the API server sent it); bookmarks are skipped. The server ends it after ``WATCH_SECONDS``. Iterate
    it under ``contextlib.aclosing`` so that the stream is closed when the loop body raises."""
    from kubernetes_asyncio import watch

    async with watch.Watch().stream(list_call, *args, resource_version=resource_version,
                                    timeout_seconds=WATCH_SECONDS, _request_timeout=WATCH_REQUEST_TIMEOUT,
                                    **kwargs) as stream:
        async for event in stream:
            obj, kind = event.get("raw_object"), event.get("type")
            if isinstance(obj, Mapping) and kind != "BOOKMARK":
                yield str(kind), obj
