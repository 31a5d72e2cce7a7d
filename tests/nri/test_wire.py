"""The trunk multiplexer and ttrpc framing on their own: reassembly under any chunking, the limits judged from the
headers, the Go-reader framing rule for what the plugin sends, the subscription mask, the back-off and the start-up
check."""

from __future__ import annotations

import random
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nriplugin import Backoff, Event, PluginConfig, RuntimeInfo, UnsupportedRuntime
from nriplugin.events import VALID_MASK, mask_of
from nriplugin.runtime_check import check_runtime, parse_version
from nriplugin.wire.errors import ProtocolError
from nriplugin.wire.mux import GO_READ_BUFFER, MAX_FRAME, Demuxer, frames_for_message
from nriplugin.wire.streams import IncomingStreams, OutgoingStreams
from nriplugin.wire.ttrpc import MAX_MESSAGE, Message, MessageReader, MessageType

frames_st = st.lists(st.tuples(st.sampled_from([1, 2, 7]), st.binary(max_size=300)), max_size=12)


def _frame(conn: int, payload: bytes) -> bytes:
    return struct.pack(">II", conn, len(payload)) + payload


def _cut(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    return [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]


@settings(max_examples=150, deadline=None)
@given(frames=frames_st, cuts=st.lists(st.integers(0, 10_000), max_size=20))
def test_demuxer_rebuilds_every_conn_stream_under_any_chunking(frames: list[tuple[int, bytes]],
                                                               cuts: list[int]) -> None:
    data = b"".join(_frame(c, p) for c, p in frames)
    demux = Demuxer()
    got: dict[int, bytes] = {}
    for piece in _cut(data, cuts):
        for conn, chunk in demux.feed(piece):
            got[conn] = got.get(conn, b"") + chunk
    want: dict[int, bytes] = {}
    for conn, payload in frames:
        want[conn] = want.get(conn, b"") + payload
    assert {c: b for c, b in got.items() if b} == {c: b for c, b in want.items() if b}
    assert not demux.mid_frame and demux.frames == len(frames)


@settings(max_examples=100, deadline=None)
@given(messages=st.lists(st.tuples(st.integers(1, 99), st.binary(max_size=5000)), max_size=6),
       cuts=st.lists(st.integers(0, 40_000), max_size=25))
def test_messages_survive_the_plugins_framing_and_any_rechunking(messages: list[tuple[int, bytes]],
                                                                  cuts: list[int]) -> None:
    sent = [Message(sid, MessageType.REQUEST, 0, data) for sid, data in messages]
    wire = b"".join(f for m in sent for f in frames_for_message(1, m.header(), m.data))
    demux, reader = Demuxer(), MessageReader(1)
    got: list[Message] = []
    for piece in _cut(wire, cuts):
        for conn, chunk in demux.feed(piece):
            assert conn == 1
            got += reader.feed(chunk)
    assert got == sent and not reader.mid_message


@pytest.mark.parametrize("size", [0, GO_READ_BUFFER - 10, GO_READ_BUFFER - 9, 100_000, MAX_MESSAGE])
def test_what_goes_to_go_is_one_frame_up_to_4096_bytes_else_header_then_whole_payload(size: int) -> None:
    m = Message(3, MessageType.RESPONSE, 0, b"x" * size)
    frames = frames_for_message(2, m.header(), m.data)
    lengths = [struct.unpack(">II", f[:8]) for f in frames]
    if 10 + size <= GO_READ_BUFFER:
        assert lengths == [(2, 10 + size)]
    else:
        assert lengths == [(2, 10), (2, size)]
        assert frames[0][8:] == m.header() and frames[1][8:] == m.data


def test_an_oversized_frame_is_refused_from_its_header() -> None:
    demux = Demuxer()
    with pytest.raises(ProtocolError, match=f"a mux frame of {MAX_FRAME + 1} bytes on ConnID 1"):
        demux.feed(struct.pack(">II", 1, MAX_FRAME + 1))  # nothing of the frame came: refused before keeping it
    assert Demuxer().feed(struct.pack(">II", 1, MAX_FRAME))  == []


def test_an_oversized_or_unknown_ttrpc_message_is_refused_from_its_header() -> None:
    with pytest.raises(ProtocolError, match=f"a ttrpc message of {MAX_MESSAGE + 1} bytes on ConnID 1 stream 5"):
        MessageReader(1).feed(struct.pack(">IIBB", MAX_MESSAGE + 1, 5, 1, 0))
    with pytest.raises(ProtocolError, match="unknown type 9"):
        MessageReader(2).feed(struct.pack(">IIBB", 3, 1, 9, 0))
    reader = MessageReader(1)
    assert reader.feed(struct.pack(">IIBB", 4, 1, 1, 0) + b"ab") == [] and reader.mid_message
    assert "2 of the 4 data bytes" in reader.describe_pending()


def test_stream_ids() -> None:
    out = OutgoingStreams()
    assert [out.next() for _ in range(3)] == [1, 3, 5]
    inc = IncomingStreams(1)
    inc.accept(1, "Configure")
    inc.accept(5, "Synchronize")
    with pytest.raises(ProtocolError, match="even stream id 6"):
        inc.accept(6, "CreateContainer")
    with pytest.raises(ProtocolError, match="re-using stream id 5"):
        inc.accept(5, "CreateContainer")


def test_the_mask_stays_within_the_events_of_nri_v0_8() -> None:
    assert mask_of([Event.CREATE_CONTAINER, Event.UPDATE_CONTAINER, Event.STOP_CONTAINER,
                    Event.REMOVE_CONTAINER]) == 0x688
    assert mask_of(Event) == VALID_MASK
    with pytest.raises(ValueError, match="at least one event"):
        mask_of([])
    with pytest.raises(ValueError):
        mask_of([12])  # type: ignore[list-item]


def test_backoff_is_capped_and_jittered() -> None:
    b = Backoff(initial=0.1, factor=2, cap=5, jitter=0.5)
    rng = random.Random(7)
    delays = [b.delay(n, rng) for n in range(40)]
    assert all(0.05 <= d <= 5 for d in delays) and max(delays[10:]) <= 5 and min(delays[10:]) >= 2.5
    assert len({round(d, 6) for d in delays[10:]}) > 1  # jittered
    with pytest.raises(ValueError):
        Backoff(initial=0)


def test_plugin_config_checks_name_and_index() -> None:
    assert PluginConfig("/x", index="07").index == "07"
    for bad in ("7", "100", "ab", ""):
        with pytest.raises(ValueError, match="two digits"):
            PluginConfig("/x", index=bad)
    with pytest.raises(ValueError, match="name"):
        PluginConfig("/x", name="")


def _info(name: str, version: str) -> RuntimeInfo:
    return RuntimeInfo(name, version, "", 2.0, 5.0)


def test_start_up_check_names_the_runtime_its_version_and_what_is_missing() -> None:
    assert parse_version("1.7.24~ds1") == (1, 7, 24) and parse_version("v2.1.9+unknown") == (2, 1, 9)
    for ok in (_info("containerd", "1.7.24~ds1"), _info("containerd", "2.1.9+unknown"), _info("cri-o", "1.30.0")):
        check_runtime(ok)
    with pytest.raises(UnsupportedRuntime, match=r"containerd 1\.7\.6 lacks .*containerd >= 1\.7\.16"):
        check_runtime(_info("containerd", "1.7.6"))
    with pytest.raises(UnsupportedRuntime, match="not a version number"):
        check_runtime(_info("containerd", "dev"))
    with pytest.raises(UnsupportedRuntime, match="did not say its name"):
        check_runtime(_info("", "1.0"))


def _bytes_field(number: int, data: bytes) -> bytes:
    assert len(data) < 128
    return bytes([number << 3 | 2, len(data)]) + data


def test_newer_runtimes_fields_are_tolerated_and_kept() -> None:
    from protos import nri_pb2

    # a v0.12 runtime's ConfigureRequest (NRI_version = 6) and a Container with fields numapin does not describe
    # (newer ones such as 14 and 15; mounts = 9 with a sub-message)
    configure = nri_pb2.ConfigureRequest(runtime_name="containerd", runtime_version="2.4.0").SerializeToString()
    configure += _bytes_field(6, b"v0.12.2")
    assert nri_pb2.ConfigureRequest.FromString(configure).runtime_version == "2.4.0"
    container = nri_pb2.Container(id="c1", name="app").SerializeToString()
    container += _bytes_field(9, b"\x0a\x01/") + bytes([14 << 3, 42]) + _bytes_field(15, b"busybox")
    request = nri_pb2.CreateContainerRequest.FromString(_bytes_field(2, container))
    assert request.container.id == "c1"
    assert request.SerializeToString() == _bytes_field(2, container)
