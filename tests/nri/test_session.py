"""The plugin session against a test peer playing the runtime over a real unix socket: registration and
configuration in containerd's order, split Synchronize, concurrent calls, unknown methods, refusals, unsolicited
updates, the start-up check, and bad input (closed, one log line, reconnected)."""

from __future__ import annotations

import asyncio
import logging
import struct
from pathlib import Path
from typing import Any

import pytest

from nriplugin import (
    Code,
    Event,
    NotConnected,
    NriPlugin,
    PluginConfig,
    PluginError,
    RuntimeCallError,
    UnsupportedRuntime,
)
from nriplugin.events import VALID_MASK
from protos import nri_pb2, ttrpc_pb2
from tests.nri.conftest import FAST
from tests.nri.peer import RUNTIME, Peer, PeerConn
from tests.nri.recorder import Recorder


def _pod(i: int) -> nri_pb2.PodSandbox:
    return nri_pb2.PodSandbox(id=f"pod{i}", name=f"p{i}", uid=f"u{i}", namespace="ns")


def _container(i: int) -> nri_pb2.Container:
    return nri_pb2.Container(id=f"c{i}", pod_sandbox_id=f"pod{i}", name="app", state=nri_pb2.CONTAINER_RUNNING)


def _update(cid: str, cpus: str) -> nri_pb2.ContainerUpdate:
    return nri_pb2.ContainerUpdate(container_id=cid, linux=nri_pb2.LinuxContainerUpdate(
        resources=nri_pb2.LinuxResources(cpu=nri_pb2.LinuxCPU(cpus=cpus))))


async def test_registers_is_configured_before_the_reply_and_subscribes(peer: Peer, plugin: NriPlugin,
                                                                       recorder: Recorder) -> None:
    conn = await peer.accept()
    register, configured = await conn.handshake(request_timeout=1500)
    assert (register.plugin_name, register.plugin_idx) == ("numapin-test", "42")
    assert configured.events == VALID_MASK and configured.events & ~0x7FF == 0
    assert [(r.name, r.version, r.request_timeout) for r in recorder.connected] == [("containerd", "2.1.9", 1.5)]
    await plugin.wait_synchronized()
    # every frame the plugin sent: a whole small message, or a 10-byte header followed by its whole payload
    assert all(n <= 4096 for _, n in conn.frames)


async def test_split_synchronize_is_answered_more_and_handed_over_once(peer: Peer, plugin: NriPlugin,
                                                                       recorder: Recorder) -> None:
    conn = await peer.accept()
    big = [_update(f"container-{i:04d}-{'x' * 40}", "0-1") for i in range(120)]

    async def sync(ctx: Any, request: Any) -> Any:
        return nri_pb2.SynchronizeResponse(update=big, more=True)  # ``more`` is the session's, not the handler's

    recorder.answers["Synchronize"] = sync
    stream, _ = await conn.plugin_call()
    sid = conn.send_call("Configure", nri_pb2.ConfigureRequest(runtime_name="containerd", runtime_version="2.1.9"))
    conn.reply(stream, b"")
    assert (await conn.response(sid)).status.code == 0
    for i in range(3):
        part = await conn.call("Synchronize", nri_pb2.SynchronizeRequest(pods=[_pod(i)], containers=[_container(i)],
                                                                         more=True), nri_pb2.SynchronizeResponse)
        assert part == nri_pb2.SynchronizeResponse(more=True)
    frames_before = len(conn.frames)
    last = await conn.call("Synchronize", nri_pb2.SynchronizeRequest(pods=[_pod(3)], more=False),
                           nri_pb2.SynchronizeResponse)
    assert not last.more and list(last.update) == big
    syncs = [r for n, r in recorder.calls if n == "Synchronize"]
    assert len(syncs) == 1 and [p.id for p in syncs[0].pods] == ["pod0", "pod1", "pod2", "pod3"]
    assert [c.id for c in syncs[0].containers] == ["c0", "c1", "c2"] and not syncs[0].more
    # the big answer (over 4096 bytes) went as two frames: its 10-byte header, then its whole payload
    header, payload = conn.frames[frames_before:]
    assert header == (1, 10) and payload[0] == 1 and payload[1] > 4096
    await plugin.wait_synchronized()


async def test_calls_run_concurrently_with_their_deadlines(peer: Peer, plugin: NriPlugin, recorder: Recorder) -> None:
    conn = await peer.accept()
    await conn.handshake(request_timeout=1500)
    release = asyncio.Event()

    async def slow_create(ctx: Any, request: Any) -> Any:
        await release.wait()
        adjust = nri_pb2.ContainerAdjustment(linux=nri_pb2.LinuxContainerAdjustment(
            resources=nri_pb2.LinuxResources(cpu=nri_pb2.LinuxCPU(cpus="1", mems="0"))))
        return nri_pb2.CreateContainerResponse(adjust=adjust, update=[_update("other", "0")])

    recorder.answers["CreateContainer"] = slow_create
    create = conn.send_call("CreateContainer", nri_pb2.CreateContainerRequest(pod=_pod(1), container=_container(1)))
    event = conn.send_call("StateChange", nri_pb2.StateChangeEvent(event=nri_pb2.REMOVE_CONTAINER, pod=_pod(2),
                                                                   container=_container(2)),
                           timeout_nano=700_000_000)
    assert (await conn.response(event)).status.code == 0  # answered while CreateContainer still waits
    release.set()
    resp = await conn.response(create)
    out = nri_pb2.CreateContainerResponse.FromString(resp.payload)
    assert out.adjust.linux.resources.cpu.cpus == "1" and out.update[0].container_id == "other"
    by_name = {c.method: c for c in recorder.contexts}
    assert 0 < by_name["CreateContainer"].remaining() + 0 <= 1.5  # Configure's request timeout
    remove_ctx = recorder.contexts[[n for n, _ in recorder.calls].index("REMOVE_CONTAINER")]
    assert remove_ctx.deadline < by_name["CreateContainer"].deadline  # the call's own timeout_nano wins


async def test_unknown_methods_are_unimplemented_and_the_session_goes_on(peer: Peer, plugin: NriPlugin,
                                                                         caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="nriplugin")
    conn = await peer.accept()
    await conn.handshake()
    for method in ("UpdatePodSandbox", "ValidateContainerAdjustment", "RunPodSandbox"):
        resp = await conn.response(conn.send_call(method, nri_pb2.Empty()))
        assert resp.status.code == Code.UNIMPLEMENTED and not resp.payload
    resp = await conn.response(conn.send_call("Configure", nri_pb2.Empty(), service="some.Other"))
    assert resp.status.code == Code.UNIMPLEMENTED
    await conn.call("StateChange", nri_pb2.StateChangeEvent(event=nri_pb2.RUN_POD_SANDBOX, pod=_pod(1)), nri_pb2.Empty)
    assert plugin.connections == 1 and sum("UNIMPLEMENTED" in r.getMessage() for r in caplog.records) == 4


async def test_a_refusal_becomes_the_status_the_runtime_sees(peer: Peer, plugin: NriPlugin,
                                                             recorder: Recorder) -> None:
    conn = await peer.accept()
    await conn.handshake()

    async def refuse(ctx: Any, request: Any) -> Any:
        raise PluginError(Code.RESOURCE_EXHAUSTED, "numapin: not enough free CPUs on NUMA node 0")

    async def broken(ctx: Any, request: Any) -> Any:
        raise KeyError("bug")

    recorder.answers["UpdateContainer"] = refuse
    recorder.answers["StopContainer"] = broken
    sid = conn.send_call("UpdateContainer", nri_pb2.UpdateContainerRequest(container=_container(1)))
    resp = await conn.response(sid)
    assert (resp.status.code, resp.status.message, resp.payload) == (
        Code.RESOURCE_EXHAUSTED, "numapin: not enough free CPUs on NUMA node 0", b"")
    resp = await conn.response(conn.send_call("StopContainer", nri_pb2.StopContainerRequest(container=_container(1))))
    assert resp.status.code == Code.INTERNAL and "StopContainer" in resp.status.message
    await conn.call("StateChange", nri_pb2.StateChangeEvent(event=nri_pb2.START_CONTAINER), nri_pb2.Empty)


async def test_unsolicited_updates(peer: Peer, plugin: NriPlugin) -> None:
    with pytest.raises(NotConnected):
        await plugin.update_containers([_update("c1", "0")])
    conn = await peer.accept()
    await conn.handshake()
    await plugin.wait_synchronized()
    call = asyncio.create_task(plugin.update_containers([_update("c1", "0"), _update("gone", "1")]))
    stream, req = await conn.plugin_call()
    assert (req.service, req.method) == (RUNTIME, "UpdateContainers")
    assert [u.container_id for u in nri_pb2.UpdateContainersRequest.FromString(req.payload).update] == ["c1", "gone"]
    conn.reply(stream, nri_pb2.UpdateContainersResponse(failed=[_update("gone", "1")]).SerializeToString())
    assert [u.container_id for u in await call] == ["gone"]
    call = asyncio.create_task(plugin.update_containers([_update("c1", "0")]))
    stream, _ = await conn.plugin_call()
    conn.reply(stream, code=Code.UNKNOWN, message="NRI update of some containers failed")
    with pytest.raises(RuntimeCallError, match="UNKNOWN: NRI update of some containers failed"):
        await call


async def test_an_unsupported_runtime_is_refused_with_its_name_and_version(peer: Peer, recorder: Recorder) -> None:
    plugin = NriPlugin(PluginConfig(peer.path, backoff=FAST), recorder)
    task = asyncio.create_task(plugin.run())
    conn = await peer.accept()
    stream, _ = await conn.plugin_call()
    sid = conn.send_call("Configure", nri_pb2.ConfigureRequest(runtime_name="containerd", runtime_version="1.7.6"))
    conn.reply(stream, b"")
    resp = await conn.response(sid)
    assert resp.status.code == Code.FAILED_PRECONDITION
    assert "containerd 1.7.6 lacks the NRI numapin needs: containerd >= 1.7.16" in resp.status.message
    assert await conn.closed_by_plugin()
    with pytest.raises(UnsupportedRuntime, match=r"containerd 1\.7\.6"):
        await asyncio.wait_for(task, 30)
    assert recorder.connected == []


async def test_waits_for_an_absent_socket_and_reconnects_after_the_runtime_closes(peer: Peer,
                                                                                 recorder: Recorder) -> None:
    path = str(Path(peer.path).with_name("later.sock"))
    plugin = NriPlugin(PluginConfig(path, backoff=FAST), recorder)
    task = asyncio.create_task(plugin.run())
    peer = await Peer(path).start()  # the runtime starts after the plugin
    try:
        conn = await peer.accept()
        await conn.handshake()
        await plugin.wait_synchronized(1)
        conn.close()  # the runtime goes away: a brand-new registration follows
        conn = await peer.accept()
        await conn.handshake(sync=nri_pb2.SynchronizeRequest(pods=[_pod(9)]))
        await plugin.wait_synchronized(2)
        assert [len(r.pods) for n, r in recorder.calls if n == "Synchronize"] == [0, 1]
        assert len(recorder.connected) == 2 and len(recorder.disconnected) == 1
    finally:
        await plugin.stop()
        await asyncio.wait_for(task, 30)
        await peer.stop()


def _envelope(method: str, payload: bytes) -> bytes:
    return ttrpc_pb2.Request(service="nri.pkg.api.v1alpha1.Plugin", method=method, payload=payload).SerializeToString()


def _oversized_frame(c: PeerConn) -> None:
    c.writer.write(struct.pack(">II", 1, 5 * 1024 * 1024))


def _oversized_message(c: PeerConn) -> None:
    c.write_frame(1, struct.pack(">IIBB", 4 * 1024 * 1024 + 1, 9, 1, 0))


def _truncated(c: PeerConn) -> None:
    c.writer.write(struct.pack(">II", 1, 100) + struct.pack(">IIBB", 90, 9, 1, 0) + b"\0" * 10)
    c.writer.write_eof()


def _truncated_message(c: PeerConn) -> None:
    c.write_frame(1, struct.pack(">IIBB", 90, 9, 1, 0) + b"\0" * 10)
    c.writer.write_eof()


def _even_stream(c: PeerConn) -> None:
    c.write_message(1, 10, 1, _envelope("StateChange", b""))


def _reused_stream(c: PeerConn) -> None:
    c.write_message(1, 3, 1, _envelope("StateChange", b""))  # the handshake's Synchronize used 3


def _undecodable_payload(c: PeerConn) -> None:
    c.write_message(1, 9, 1, _envelope("CreateContainer", b"\x0a\x05ab"))


def _undecodable_envelope(c: PeerConn) -> None:
    c.write_message(1, 9, 1, b"\xff\xff\xff")


def _response_on_conn1(c: PeerConn) -> None:
    c.write_message(1, 9, 2, b"")


def _unexpected_reply(c: PeerConn) -> None:
    c.write_message(2, 77, 2, b"")


BAD = {
    "oversized-frame": (_oversized_frame, "a mux frame of 5242880 bytes on ConnID 1"),
    "oversized-message": (_oversized_message, "a ttrpc message of 4194305 bytes on ConnID 1 stream 9"),
    "truncated": (_truncated, "closed inside a mux frame (80 payload bytes of a frame on ConnID 1 missing)"),
    "truncated-message": (_truncated_message, "closed inside a ttrpc message (10 of the 90 data bytes of a type-1 "
                                               "message on ConnID 1 stream 9)"),
    "even-stream": (_even_stream, "a StateChange request on ConnID 1 with even stream id 10"),
    "reused-stream": (_reused_stream, "re-using stream id 3 (the last was 3)"),
    "undecodable-payload": (_undecodable_payload, "a CreateContainer request of 4 bytes on ConnID 1 stream 9 that "
                                                  "does not decode"),
    "undecodable-envelope": (_undecodable_envelope, "a ttrpc Request envelope of 3 bytes on ConnID 1 stream 9"),
    "response-where-requests-come": (_response_on_conn1, "a type-2 message of 0 bytes on ConnID 1 stream 9"),
    "reply-nobody-waits-for": (_unexpected_reply, "ConnID 2 stream 77, a stream no call of ours is waiting on"),
}


@pytest.mark.parametrize("bad", BAD, ids=list(BAD))
async def test_bad_input_closes_logs_one_line_and_reconnects(bad: str, peer: Peer, plugin: NriPlugin,
                                                             recorder: Recorder,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    send, said = BAD[bad]
    conn = await peer.accept()
    await conn.handshake()
    caplog.clear()
    caplog.set_level(logging.INFO, logger="nriplugin")
    send(conn)
    assert await conn.closed_by_plugin()
    again = await peer.accept()  # a brand-new registration
    await again.handshake()
    await plugin.wait_synchronized(2)
    lines = [r for r in caplog.records if r.name == "nriplugin" and r.levelno >= logging.WARNING]
    assert len(lines) == 1 and said in lines[0].getMessage()
    assert [r.getMessage().split(":")[0] for r in caplog.records if r.levelno < logging.WARNING] == [
        "NRI plugin 42-numapin-test synchronized with containerd 2.1.9"]  # the new connection's
    assert lines[0].exc_info is None and "Traceback" not in caplog.text
    assert recorder.disconnected and said in recorder.disconnected[-1]


async def test_the_subscription_never_leaves_nri_v0_8s_events(peer: Peer) -> None:
    rec = Recorder()
    rec.events = frozenset({Event.CREATE_CONTAINER, Event.UPDATE_CONTAINER})  # type: ignore[misc]
    plugin = NriPlugin(PluginConfig(peer.path, backoff=FAST), rec)
    task = asyncio.create_task(plugin.run())
    try:
        _, configured = await (await peer.accept()).handshake()
        assert configured.events == 0x088
    finally:
        await plugin.stop()
        await asyncio.wait_for(task, 30)


async def test_a_failed_synchronize_closes_and_registers_again(peer: Peer, plugin: NriPlugin,
                                                              recorder: Recorder) -> None:
    async def refuse(ctx: Any, request: Any) -> Any:
        recorder.answers.pop("Synchronize")  # the next connection's goes through
        raise PluginError(Code.FAILED_PRECONDITION, "numapin: state directory unreadable")

    recorder.answers["Synchronize"] = refuse
    conn = await peer.accept()
    stream, _ = await conn.plugin_call()
    sid = conn.send_call("Configure", nri_pb2.ConfigureRequest(runtime_name="containerd", runtime_version="1.7.24"))
    conn.reply(stream, b"")
    assert (await conn.response(sid)).status.code == 0
    resp = await conn.response(conn.send_call("Synchronize", nri_pb2.SynchronizeRequest()))
    assert (resp.status.code, resp.status.message) == (Code.FAILED_PRECONDITION, "numapin: state directory unreadable")
    assert await conn.closed_by_plugin()  # NRI v0.6.1 would keep it open and never send an event
    await (await peer.accept()).handshake()
    await plugin.wait_synchronized(1)
    assert "Synchronize with an error" in recorder.disconnected[0]
