"""What the webhook's data sources (node topologies, pods) share: a directory poll loop and an API client."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

__all__ = ["api_client", "poll_until_stopped"]

log = logging.getLogger("numapin.webhook.sources")


async def poll_until_stopped(sync: Callable[[], Awaitable[None]], stop: asyncio.Event, every: float, what: str) -> None:
    """Call ``sync`` every ``every`` seconds until ``stop`` is set; a failed sync is logged and retried."""
    while not stop.is_set():
        try:
            await sync()
        except Exception:
            log.exception("reading %s failed", what)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=every)


async def api_client(kubeconfig: str | None) -> Any:
    """A kubernetes-asyncio ApiClient from a kubeconfig file, or from the pod's in-cluster credentials."""
    from kubernetes_asyncio import client, config

    if kubeconfig:
        return await config.new_client_from_config(config_file=kubeconfig)
    config.load_incluster_config()
    return client.ApiClient()
