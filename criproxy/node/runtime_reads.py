"""Reads the proxy makes of the runtime for its own housekeeping (start-up reconcile, rebuilding pod models)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

import grpc
import grpc.aio

from criproxy.relay.cri_api import RuntimeApi
from criproxy.relay.grpc_relay import Upstream
from protos import cri_pb2

__all__ = ["container_statuses"]


async def container_statuses(upstream: Upstream, api: RuntimeApi, container_ids: Iterable[str], *, timeout: float,
                             concurrency: int = 16) -> list[cri_pb2.ContainerStatus | None]:
    """``ContainerStatus`` of each container, in order, at most ``concurrency`` calls at once; None for a container
    removed meanwhile (NOT_FOUND). Any other runtime error is raised."""
    slots = asyncio.Semaphore(max(1, concurrency))

    async def one(cid: str) -> cri_pb2.ContainerStatus | None:
        req = cri_pb2.ContainerStatusRequest(container_id=cid).SerializeToString()
        async with slots:
            try:
                raw = await upstream.call(api.method("ContainerStatus"), req, timeout=timeout)
            except grpc.aio.AioRpcError as e:
                if e.code() == grpc.StatusCode.NOT_FOUND:
                    return None
                raise
        return cri_pb2.ContainerStatusResponse.FromString(raw).status

    return list(await asyncio.gather(*(one(cid) for cid in container_ids)))
