"""A small handler for the tests: records what it was given and answers as each test tells it."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from nriplugin import BaseHandler, CallContext, Event, RuntimeInfo
from protos import nri_pb2

Answer = Callable[[CallContext, Any], Awaitable[Any]]


class Recorder(BaseHandler):
    events = frozenset(Event)

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []  # (method or event name, request)
        self.contexts: list[CallContext] = []
        self.connected: list[RuntimeInfo] = []
        self.disconnected: list[str] = []
        self.answers: dict[str, Answer] = {}  # method -> how to answer (default: no change)
        self.seen = asyncio.Condition()

    async def _note(self, name: str, ctx: CallContext, request: Any) -> None:
        async with self.seen:
            self.calls.append((name, request))
            self.contexts.append(ctx)
            self.seen.notify_all()

    async def wait_for(self, name: str, match: Callable[[Any], bool] = lambda _: True, timeout: float = 30) -> Any:
        async def found() -> Any:
            async with self.seen:
                while True:
                    for n, r in self.calls:
                        if n == name and match(r):
                            return r
                    await self.seen.wait()
        return await asyncio.wait_for(found(), timeout)

    async def _answer(self, name: str, ctx: CallContext, request: Any, default: Any) -> Any:
        await self._note(name, ctx, request)
        answer = self.answers.get(name)
        return await answer(ctx, request) if answer is not None else default

    async def on_connected(self, runtime: RuntimeInfo) -> None:
        self.connected.append(runtime)

    async def on_disconnected(self, reason: str) -> None:
        self.disconnected.append(reason)

    async def synchronize(self, ctx: CallContext, request: Any) -> Any:
        return await self._answer("Synchronize", ctx, request, nri_pb2.SynchronizeResponse())

    async def create_container(self, ctx: CallContext, request: Any) -> Any:
        return await self._answer("CreateContainer", ctx, request, nri_pb2.CreateContainerResponse())

    async def update_container(self, ctx: CallContext, request: Any) -> Any:
        return await self._answer("UpdateContainer", ctx, request, nri_pb2.UpdateContainerResponse())

    async def stop_container(self, ctx: CallContext, request: Any) -> Any:
        return await self._answer("StopContainer", ctx, request, nri_pb2.StopContainerResponse())

    async def state_change(self, ctx: CallContext, event: Any) -> None:
        await self._answer(Event(event.event).name, ctx, event, None)
