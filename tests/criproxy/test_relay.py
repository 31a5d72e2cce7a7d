"""The transparent relay over real unix sockets, against the in-process CRI runtime."""

from __future__ import annotations

import asyncio
import os
import stat
from pathlib import Path

import grpc
import grpc.aio
import pytest

from criproxy.relay.grpc_relay import RelayHandler, Upstream
from criproxy.relay.relays import start_relay
from criproxy.relay.socket_server import SocketInUseError
from numapin_lab.cri.client import CRIClient, pb
from numapin_lab.cri.memory_runtime import MemoryRuntime


async def test_unary_call_answers_like_the_runtime(runtime: MemoryRuntime, client: CRIClient) -> None:
    direct = CRIClient(runtime.socket_path)
    try:
        assert await client.version() == await direct.version()
    finally:
        await direct.close()
    assert (await client.version()).runtime_name == "memory"


async def test_pod_and_container_calls_go_through(runtime: MemoryRuntime, client: CRIClient) -> None:
    cfg = client.sandbox_config("p", "uid-1")
    sid = await client.run_pod_sandbox(cfg)
    cid = await client.create_container(sid, client.container_config("c", cpu_milli=500), cfg)
    await client.start_container(cid)
    [c] = await client.list_containers()
    assert (c.id, c.pod_sandbox_id, c.metadata.name, c.state) == (cid, sid, "c", pb.CONTAINER_RUNNING)
    assert [s.id for s in await client.list_pod_sandbox()] == [sid]
    assert [i.repo_tags[0] for i in await client.list_images()] == ["localhost/busybox:latest"]


async def test_unknown_method_is_relayed_with_bytes_and_metadata(runtime: MemoryRuntime, relay: str) -> None:
    payload = b"\x0a\x03abc\xfa\x01\x02zz"  # a field our protos do not know (31) included
    async with grpc.aio.insecure_channel("unix:" + relay) as ch:
        call = ch.unary_unary("/runtime.v1.RuntimeService/Echo")(
            payload, metadata=(("x-trace", "t1"), ("x-bin-bin", b"\x00\x01")), timeout=10)
        assert await call == payload
        assert ("x-echo-initial", "yes") in tuple(await call.initial_metadata())
        assert ("x-echo-trailing", "done") in tuple(await call.trailing_metadata())
    [rec] = [c for c in runtime.calls if c.method == "Echo"]
    assert rec.request == payload
    assert ("x-trace", "t1") in rec.metadata
    assert ("x-bin-bin", b"\x00\x01") in rec.metadata


async def test_deadline_is_passed_on_and_no_deadline_stays_none(runtime: MemoryRuntime, client: CRIClient) -> None:
    await client.call("Version", pb.VersionRequest(), pb.VersionResponse, timeout=None)
    await client.call("Version", pb.VersionRequest(), pb.VersionResponse, timeout=7.0)
    none_call, timed_call = [c for c in runtime.calls if c.method == "Version"]
    assert none_call.time_remaining is None
    # grpc-timeout is rounded up on the wire: close to 7 s, not "none" and not a huge value
    assert timed_call.time_remaining is not None and 1 < timed_call.time_remaining < 8


async def test_error_status_and_details_come_back_unchanged(runtime: MemoryRuntime, client: CRIClient) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await client.container_status("nope")
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    assert err.value.details() == "container 'nope' not found"
    runtime.fail_next["Version"] = (grpc.StatusCode.RESOURCE_EXHAUSTED, "busy: try later")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await client.version()
    assert (err.value.code(), err.value.details()) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "busy: try later")
    details = (("grpc-status-details-bin", b"\x08\x09\x12\x04nope"), ("x-reason", "because"))
    runtime.fail_next["Version"] = (grpc.StatusCode.FAILED_PRECONDITION, "nope", details)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await client.version()
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert tuple(err.value.trailing_metadata()) == details  # rich status details pass unchanged


async def test_server_streaming_events(runtime: MemoryRuntime, client: CRIClient) -> None:
    stream = client.container_events()
    cfg = client.sandbox_config("p", "uid-ev")
    sid = await client.run_pod_sandbox(cfg)

    async def first_two() -> list[pb.ContainerEventResponse]:
        out = []
        async for ev in stream:
            out.append(ev)
            if len(out) == 2:
                return out
        return out

    reader = asyncio.ensure_future(first_two())
    while not runtime._events:  # the stream reached the runtime
        await asyncio.sleep(0.01)
    cid = await client.create_container(sid, client.container_config("c"), cfg)
    await client.start_container(cid)
    events = await asyncio.wait_for(reader, 20)
    assert [(e.container_id, e.container_event_type) for e in events] == [
        (cid, pb.CONTAINER_CREATED_EVENT), (cid, pb.CONTAINER_STARTED_EVENT)]
    stream.cancel()
    for _ in range(1000):  # the proxy cancels its upstream stream when kubelet goes away
        if not runtime._events:
            break
        await asyncio.sleep(0.02)
    assert not runtime._events


async def test_v1alpha2_is_relayed(runtime: MemoryRuntime, relay: str) -> None:
    c = CRIClient(relay, api="runtime.v1alpha2")
    try:
        assert (await c.version()).runtime_name == "memory"
    finally:
        await c.close()
    assert runtime.calls[-1].method == "Version"


async def test_socket_is_0660_and_refuses_a_live_owner(relay: str, runtime: MemoryRuntime, relay_kind: str) -> None:
    assert stat.S_IMODE(os.stat(relay).st_mode) == 0o660
    with pytest.raises(SocketInUseError, match="another server is listening"):
        await start_relay(relay, RelayHandler(Upstream(runtime.socket_path)), relay_kind)


async def test_stale_socket_is_replaced_and_non_socket_refused(short_tmp: Path, runtime: MemoryRuntime,
                                                               relay_kind: str) -> None:
    import socket

    path = str(short_tmp / "stale.sock")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(path)
    s.close()  # a socket file nobody listens on: what a SIGKILLed proxy leaves behind
    upstream = Upstream(runtime.socket_path)
    server = await start_relay(path, RelayHandler(upstream), relay_kind)
    try:
        async with CRIClient(path) as c:
            assert (await c.version()).runtime_name == "memory"
    finally:
        await server.stop(0)
        await upstream.close()
    regular = short_tmp / "file.sock"
    regular.write_text("not a socket")
    with pytest.raises(SocketInUseError, match="not a socket"):
        await start_relay(str(regular), RelayHandler(Upstream(runtime.socket_path)), relay_kind)
    assert regular.read_text() == "not a socket"


async def test_runtime_down_fails_fast_then_reconnects(short_tmp: Path, relay_kind: str) -> None:
    rt_path = str(short_tmp / "late.sock")
    upstream = Upstream(rt_path)
    path = str(short_tmp / "p.sock")
    server = await start_relay(path, RelayHandler(upstream), relay_kind)
    client = CRIClient(path)
    try:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await client.call("Version", pb.VersionRequest(), pb.VersionResponse, timeout=30)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        rt = await MemoryRuntime(rt_path).start()
        try:
            for _ in range(300):  # the channel reconnects with back-off (at most 2 s apart)
                try:
                    assert (await client.version()).runtime_name == "memory"
                    break
                except grpc.aio.AioRpcError as e:
                    assert e.code() == grpc.StatusCode.UNAVAILABLE
                    await asyncio.sleep(0.1)
            else:
                pytest.fail("the relay never reconnected to the runtime")
        finally:
            await rt.stop()
    finally:
        await client.close()
        await server.stop(0)
        await upstream.close()


async def test_interceptors_run_on_the_event_loop_and_their_outcomes_reach_the_caller(
        short_tmp: Path, runtime: MemoryRuntime, relay_kind: str) -> None:
    """An interceptor (a coroutine of the proxy's loop) forwards changed bytes, rejects with a status, or fails;
    meanwhile relayed calls go on (they do not wait for the loop)."""
    from criproxy.relay.grpc_relay import Rejection

    loop = asyncio.get_running_loop()
    seen: list[tuple[bytes, object]] = []
    release = asyncio.Event()

    async def version(request: bytes, forward) -> bytes:
        seen.append((request, asyncio.get_running_loop()))
        return await forward(pb.VersionRequest(version="changed").SerializeToString())

    async def status(request: bytes, forward) -> bytes:
        raise Rejection(grpc.StatusCode.FAILED_PRECONDITION, "numapin: not now")

    async def list_images(request: bytes, forward) -> bytes:
        raise ValueError("boom")

    async def stop_container(request: bytes, forward) -> bytes:
        await release.wait()  # a slow decision
        return await forward(request)

    upstream = Upstream(runtime.socket_path)
    path = str(short_tmp / "i.sock")
    server = await start_relay(path, RelayHandler(upstream, {
        "Version": version, "Status": status, "ListImages": list_images, "StopContainer": stop_container}), relay_kind)
    try:
        async with CRIClient(path) as c:
            assert (await c.version()).runtime_name == "memory"
            assert seen and seen[0][1] is loop
            assert runtime.requests("Version")[-1] == pb.VersionRequest(version="changed").SerializeToString()
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await c.call("Status", pb.StatusRequest(), pb.StatusResponse)
            assert (err.value.code(), err.value.details()) == (grpc.StatusCode.FAILED_PRECONDITION,
                                                               "numapin: not now")
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await c.list_images()
            assert err.value.code() == grpc.StatusCode.INTERNAL
            assert "ValueError: boom" in (err.value.details() or "")
            stopping = asyncio.ensure_future(c.call("StopContainer", pb.StopContainerRequest(container_id="x"),
                                                    pb.StopContainerResponse))
            await asyncio.sleep(0.2)
            cfg = c.sandbox_config("p", "uid-slow")
            assert await c.run_pod_sandbox(cfg)  # relayed while the StopContainer decision waits
            assert not stopping.done()
            release.set()
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stopping
            assert err.value.code() == grpc.StatusCode.NOT_FOUND  # the runtime's answer came back
    finally:
        await server.stop(0)
        await upstream.close()
