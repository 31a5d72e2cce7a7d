"""A runtime that is slow to answer a new connection (containerd starting up or a starved node; first seen in a
software-emulated multi-NUMA VM, where the HTTP/2 handshake took seconds): the proxy's channel waits for it instead
of failing every call with UNAVAILABLE "connection attempt timed out before receiving SETTINGS frame"."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

from criproxy.relay.grpc_relay import RelayHandler, Upstream
from criproxy.relay.relays import start_relay
from numapin_lab.cri.client import CRIClient
from numapin_lab.cri.memory_runtime import MemoryRuntime

DELAY = 1.5  # seconds before a new connection is served (longer than the 100 ms the channel once gave it)


class SlowFront:
    """A unix socket in front of ``target`` that serves each new connection only after ``delay`` seconds."""

    def __init__(self, target: str, path: str, delay: float) -> None:
        self.target, self.path, self.delay = target, path, delay
        self.server: asyncio.AbstractServer | None = None
        self.tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self.server = await asyncio.start_unix_server(self._serve, self.path)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(self.delay)
        up_reader, up_writer = await asyncio.open_unix_connection(self.target)

        async def pipe(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            with contextlib.suppress(ConnectionError):
                while data := await r.read(65536):
                    w.write(data)
                    await w.drain()
            w.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()


async def test_relay_waits_for_a_runtime_slow_to_accept(short_tmp: Path, runtime: MemoryRuntime,
                                                        relay_kind: str) -> None:
    front = SlowFront(runtime.socket_path, str(short_tmp / "slow.sock"), DELAY)
    await front.start()
    upstream = Upstream(front.path)
    server = await start_relay(str(short_tmp / "proxy.sock"), RelayHandler(upstream), relay_kind)
    try:
        async with CRIClient(str(short_tmp / "proxy.sock")) as kubelet:
            version = await kubelet.version()
        assert version.runtime_api_version
    finally:
        await server.stop(0)
        await upstream.close()
        await front.stop()
