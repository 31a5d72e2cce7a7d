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

__all__ = ["PoolGate"]


class PoolGate:
    def __init__(self) -> None:
        self._readers = 0
        self._writer = False
        self._writers_waiting = 0
        self._cond = asyncio.Condition()

    def shared(self) -> _Hold:
        return _Hold(self, exclusive=False)

    def exclusive(self) -> _Hold:
        return _Hold(self, exclusive=True)

    async def _acquire(self, exclusive: bool) -> None:
        async with self._cond:
            if not exclusive:
                await self._cond.wait_for(lambda: not self._writer and not self._writers_waiting)
                self._readers += 1
                return
            self._writers_waiting += 1
            try:
                await self._cond.wait_for(lambda: not self._writer and not self._readers)
            finally:
                self._writers_waiting -= 1
                self._cond.notify_all()  # readers held off by this writer may go if it gave up
            self._writer = True

    async def _release(self, exclusive: bool) -> None:
        async with self._cond:
            if exclusive:
                self._writer = False
            else:
                self._readers -= 1
            self._cond.notify_all()

    @property
    def busy(self) -> bool:
        return self._writer or self._readers > 0


class _Hold:
    """``async with gate.shared()`` / ``gate.exclusive()`` (a plain context manager: exceptions raised inside,
    frozen ones included, pass through untouched)."""

    __slots__ = ("_exclusive", "_gate")

    def __init__(self, gate: PoolGate, *, exclusive: bool) -> None:
        self._gate = gate
        self._exclusive = exclusive

    async def __aenter__(self) -> None:
        await self._gate._acquire(self._exclusive)

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.shield(self._gate._release(self._exclusive))
