"""Issue 25: the frame relay's bounds must not break a legitimate client. Many long-held connections are all served
(critest keeps a client per spec; a cap of 128 turned the 129th away), while what each connection may cost is
bounded: idle connections are asked to go and closed (no call lost), a frame flood is told GOAWAY ENHANCE_YOUR_CALM,
a frame larger than the runtime accepts closes the connection before it is buffered, and the proxy's memory stays
bounded with hundreds of connections held (a real ``numapin criproxy`` process)."""

from __future__ import annotations

import asyncio
import re
import shutil
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from criproxy.relay import h2wire as h2
from criproxy.relay.conn_limits import ConnectionLimits, descriptor_cap, raise_descriptor_limit
from criproxy.relay.frame_server import FrameRelayServer, start_frame_relay_server
from criproxy.relay.grpc_relay import Forward, RelayHandler, Upstream
from numapin_lab.cri.client import CRIClient, pb
from numapin_lab.cri.ledger import scratch_dir
from numapin_lab.cri.memory_runtime import MemoryRuntime
from numapin_lab.cri.proxy_process import ProxyProcess
from tests.criproxy.test_relay_frames import VERSION, RawClient, _runtime_process, eventually, grow

HELD = 400   # connections held at once: three times the old cap


async def version(c: RawClient, text: str = "x") -> str:
    sid, frames = c.request_frames(VERSION, pb.VersionRequest(version=text).SerializeToString())
    c.writer.write(b"".join(frames))
    headers, message = await asyncio.wait_for(c.response(sid), 60)
    assert headers["grpc-status"] == "0", headers
    return pb.VersionResponse.FromString(message).runtime_version


async def frames_until_closed(c: RawClient) -> list[tuple[int, bytes]]:
    """The frames the relay sends until it closes the connection."""
    got = []
    try:
        while True:
            ftype, _, _, payload = await asyncio.wait_for(c.read_frame(), 30)
            got.append((ftype, payload))
    except (asyncio.IncompleteReadError, ConnectionError):
        return got


def goaway_of(frames: list[tuple[int, bytes]]) -> tuple[int, int]:
    """(last stream id, error code) of the GOAWAY among ``frames``."""
    [payload] = [p for t, p in frames if t == h2.GOAWAY]
    return int.from_bytes(payload[:4], "big") & 0x7FFFFFFF, int.from_bytes(payload[4:8], "big")


class _Relay:
    def __init__(self, server: FrameRelayServer, closed: list[str], path: str) -> None:
        self.server, self.closed, self.path = server, closed, path


@pytest.fixture
async def relay(short_tmp: Path, runtime: MemoryRuntime, request: pytest.FixtureRequest) -> AsyncIterator[_Relay]:
    raise_descriptor_limit()  # as the command line does, before the cap is read from it
    limits: ConnectionLimits = getattr(request, "param", ConnectionLimits())
    upstream = Upstream(runtime.socket_path)
    closed: list[str] = []
    path = str(short_tmp / "lim.sock")
    server = await start_frame_relay_server(path, RelayHandler(upstream, {"Version": grow(1)}), limits=limits,
                                            on_closed=closed.append)
    try:
        yield _Relay(server, closed, path)
    finally:
        await server.stop(0)
        await upstream.close()


def test_the_default_cap_is_what_the_descriptors_allow() -> None:
    assert ConnectionLimits().cap() == descriptor_cap() >= 128
    assert ConnectionLimits(max_connections=5).cap() == 5


async def test_hundreds_of_long_held_connections_are_all_served(relay: _Relay) -> None:
    # this process holds both ends and the runtime's: three descriptors a connection (the fixture raised the limit)
    assert relay.server.max_connections >= HELD, "the test needs a larger open-files limit (ulimit -Hn)"
    clients = [await RawClient.connect(relay.path) for _ in range(HELD)]
    try:
        # every one answered while all are held, twice (critest's clients call again much later)
        for round_ in range(2):
            answers = await asyncio.gather(*(version(c, f"{round_}-{i}") for i, c in enumerate(clients)))
            assert len(answers) == HELD and all(a == "1r" for a in answers), answers[:5]  # through the interceptor
        assert relay.server.connections == HELD and relay.closed == []
    finally:
        for c in clients:
            await c.close()
    await eventually(lambda: relay.server.connections == 0, "every connection closes with its client")


@pytest.mark.parametrize("relay", [ConnectionLimits(idle_timeout=0.3, drain_grace=0.3)], indirect=True)
async def test_an_idle_connection_is_asked_to_go_then_closed_and_no_call_is_lost(relay: _Relay) -> None:
    c = await RawClient.connect(relay.path)
    assert await version(c) == "1r"
    frames = await frames_until_closed(c)
    assert goaway_of(frames) == (0x7FFFFFFF, h2.NO_ERROR)  # every stream it sent is still served
    assert relay.closed == ["idle"]
    await c.close()
    # a gRPC client whose connection went idle just calls again (a new connection), with no error
    async with CRIClient(relay.path) as k:
        for _ in range(3):
            assert (await asyncio.wait_for(k.version(), 30)).runtime_version.endswith("r")
            assert relay.server.connections == 1
            # asked to go, the client closes it itself (or the relay does, DRAIN_GRACE later)
            await eventually(lambda: relay.server.connections == 0, "the gRPC client's idle connection closes")


async def test_a_call_in_flight_keeps_its_connection(short_tmp: Path, runtime: MemoryRuntime) -> None:
    """A long call (an interceptor deciding, as a create waits for the start-up reconcile) is no idleness."""
    release = asyncio.Event()

    async def slow(request: bytes, forward: Forward) -> bytes:
        await release.wait()
        return await forward(request)

    upstream = Upstream(runtime.socket_path)
    closed: list[str] = []
    path = str(short_tmp / "slow.sock")
    server = await start_frame_relay_server(path, RelayHandler(upstream, {"Version": slow}), on_closed=closed.append,
                                            limits=ConnectionLimits(idle_timeout=0.2, drain_grace=0.2))
    try:
        c = await RawClient.connect(path)
        sid, frames = c.request_frames(VERSION, pb.VersionRequest(version="x").SerializeToString())
        c.writer.write(b"".join(frames))
        await asyncio.sleep(1.0)  # five idle timeouts
        assert closed == [] and server.connections == 1
        release.set()
        headers, _ = await asyncio.wait_for(c.response(sid), 30)
        assert headers["grpc-status"] == "0"
        await eventually(lambda: closed == ["idle"], "idle once the call is done")
        await c.close()
    finally:
        await server.stop(0)
        await upstream.close()


async def test_a_frame_flood_is_told_to_calm_down_and_others_are_served(relay: _Relay) -> None:
    calm = await RawClient.connect(relay.path)
    flood = await RawClient.connect(relay.path)
    assert await version(flood) == "1r"
    # PRIORITY frames (relayed, answered by nobody): 400,000 at once, eight times the burst allowed
    flood.writer.write(h2.frame(h2.PRIORITY, 0, 1, b"\0\0\0\0\x0f") * 400_000)
    frames = await frames_until_closed(flood)
    assert goaway_of(frames)[1] == h2.ENHANCE_YOUR_CALM
    assert relay.closed == ["frames"]
    assert await version(calm) == "1r"  # the other client is served on
    await flood.close()
    await calm.close()


async def test_a_frame_larger_than_the_runtime_accepts_is_refused_before_it_is_buffered(relay: _Relay) -> None:
    c = await RawClient.connect(relay.path)
    assert await version(c) == "1r"
    # a DATA frame announcing 8 MiB, of which only the header and a little arrive
    c.writer.write(bytes.fromhex("800000") + bytes([h2.DATA, 0]) + (1).to_bytes(4, "big") + b"x" * 100)
    await frames_until_closed(c)
    assert relay.closed == ["memory"]
    await c.close()


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def _metric(port: int, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    return sum(float(m.group(1)) for m in re.finditer(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.M))


# what one held, idle client connection may cost the proxy process (its runtime connection included): measured
# ~6 KiB of Python objects and buffers; the bound leaves room for the allocator's arenas
PER_CONNECTION_BYTES = 32 * 1024


async def test_a_proxy_process_serves_hundreds_of_held_connections_with_bounded_memory() -> None:
    d = scratch_dir("npx-conn-")
    rt = _runtime_process(str(d / "rt.sock"), 0)
    proxy = ProxyProcess(d, str(d / "rt.sock"), reserved_cpus="0")
    clients: list[RawClient] = []
    try:
        await asyncio.to_thread(proxy.start)
        assert proxy.proc is not None
        warm = await RawClient.connect(proxy.socket)
        await version(warm)  # the relay's first call: what it imports and caches is not the connections' cost
        await warm.close()
        base = _rss(proxy.proc.pid)
        for _ in range(HELD):
            clients.append(await RawClient.connect(proxy.socket))
        for round_ in range(2):
            await asyncio.gather(*(version(c, f"{round_}-{i}") for i, c in enumerate(clients)))
        held = _rss(proxy.proc.pid)
        assert _metric(proxy.port, "numapin_criproxy_connections_turned_away_total") == 0
        print(f"proxy RSS: {base >> 20} MiB before, {held >> 20} MiB with {HELD} connections held "
              f"({(held - base) // HELD} bytes each)")
        assert held - base <= HELD * PER_CONNECTION_BYTES, (base, held)
    finally:
        for c in clients:
            await c.close()
        proxy.stop()
        rt.kill()
        rt.wait()
        shutil.rmtree(d, ignore_errors=True)
