"""The pool gate: starts of containers that run on the shared pool exclude every change of the pool.

containerd's ``UpdateContainerResources`` on a container that is being started only changes its stored spec:
the task then starts on the old cpuset. So a shared container's ``StartContainer`` holds the gate *shared*
(starts of different containers still run together), and whatever moves the pool or needs the pool to stay
put holds it *exclusive*: narrowing and widening, the repair of drifted cpusets, the start of an exclusive
container (which checks the kernel first). Writers are preferred, so a burst of starts cannot hold a
narrowing off for ever.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

__all__ = ["PoolGate"]


class PoolGate:
    def __init__(self) -> None:
        self._readers = 0
        self._writer = False
        self._writers_waiting = 0
        self._cond = asyncio.Condition()

    @contextlib.asynccontextmanager
    async def shared(self) -> AsyncIterator[None]:
        async with self._cond:
            await self._cond.wait_for(lambda: not self._writer and not self._writers_waiting)
            self._readers += 1
        try:
            yield
        finally:
            async with self._cond:
                self._readers -= 1
                self._cond.notify_all()

    @contextlib.asynccontextmanager
    async def exclusive(self) -> AsyncIterator[None]:
        async with self._cond:
            self._writers_waiting += 1
            try:
                await self._cond.wait_for(lambda: not self._writer and not self._readers)
            finally:
                self._writers_waiting -= 1
                self._cond.notify_all()  # readers held off by this writer may go if it gave up
            self._writer = True
        try:
            yield
        finally:
            async with self._cond:
                self._writer = False
                self._cond.notify_all()

    @property
    def busy(self) -> bool:
        return self._writer or self._readers > 0
