"""Reads the node agent makes of the runtime for its own housekeeping (start-up reconcile, rebuilding pod models)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

import grpc

from nodeagent.ports import RuntimeCallError, RuntimeReader
from protos import cri_pb2

__all__ = ["container_statuses"]


async def container_statuses(reader: RuntimeReader, container_ids: Iterable[str], *, timeout: float,
                             concurrency: int = 16) -> list[cri_pb2.ContainerStatus | None]:
    """``ContainerStatus`` of each container, in order, at most ``concurrency`` calls at once; None for a container
    removed meanwhile (NOT_FOUND). Any other runtime error is raised."""
    slots = asyncio.Semaphore(max(1, concurrency))

    async def one(cid: str) -> cri_pb2.ContainerStatus | None:
        async with slots:
            try:
                resp = await reader.container_status(cid, timeout=timeout)
            except RuntimeCallError as e:
                if e.code() == grpc.StatusCode.NOT_FOUND:
                    return None
                raise
        return resp.status

    return list(await asyncio.gather(*(one(cid) for cid in container_ids)))
