"""``memory_manager_state`` in kubelet's format (allocator.memory.checkpoint) and the machine state it holds.

Checksum compatibility: the expected checksums below are kubelet's own for these documents (facts from kubelet's
state_checkpoint tests: the same fields and values, a checkpoint kubelet accepts), so a rendering that differs from
go-spew's in any character fails here."""

from __future__ import annotations

import json

import pytest

from allocator.errors import CheckpointError
from allocator.memory import (
    Block,
    MachineMemory,
    MemoryCheckpointStore,
    MemoryPolicy,
    MemoryState,
    memory_checksum,
    parse_memory_checkpoint,
    serialize_memory_checkpoint,
)
from allocator.memory.checkpoint import render_memory_checkpoint
from allocator.state_schema import STATE_SCHEMA_VERSION

GI = 1 << 30
MI = 1 << 20

# one NUMA node, 2048 bytes of memory with 512 reserved for the system, one container holding 512 on node 0
KUBELET_DOC = {
    "policyName": "static",
    "machineState": {"0": {"numberOfAssignments": 0, "memoryMap": {"memory": {
        "total": 2048, "systemReserved": 512, "allocatable": 1536, "reserved": 512, "free": 1024}}, "cells": []}},
    "entries": {"pod": {"container1": [{"numaAffinity": [0], "type": "memory", "size": 512}]}},
}
KUBELET_CHECKSUM = 4215593881  # what kubelet writes for KUBELET_DOC (its "v1" layout, every released kubelet)
KUBELET_CHECKSUM_POD_ENTRIES = 1278640530  # the newer struct, podEntries {"pod": {"memoryBlocks": [the block]}}
KUBELET_DATA_CHECKSUM = 1849615440  # the newer envelope: dataChecksum of KUBELET_DOC's compact JSON


def test_rendering_is_go_spews():
    assert render_memory_checkpoint(KUBELET_DOC) == (
        "(*state.MemoryManagerCheckpoint){PolicyName:(string)static MachineState:(state.NUMANodeMap)map[0:<*>{"
        "NumberOfAssignments:(int)0 MemoryMap:(map[v1.ResourceName]*state.MemoryTable)map[memory:<*>{"
        "TotalMemSize:(uint64)2048 SystemReserved:(uint64)512 Allocatable:(uint64)1536 Reserved:(uint64)512 "
        "Free:(uint64)1024}] Cells:([]int)[]}] Entries:(state.ContainerMemoryAssignments)map[pod:map[container1:["
        "{NUMAAffinity:([]int)[0] Type:(v1.ResourceName)memory Size:(uint64)512}]]] Checksum:(checksum.Checksum)0}")


def test_checksum_is_kubelets():
    assert memory_checksum(KUBELET_DOC) == KUBELET_CHECKSUM
    newer = dict(KUBELET_DOC, podEntries={"pod": {"memoryBlocks": [{"numaAffinity": [0], "type": "memory",
                                                                     "size": 512}]}})
    assert memory_checksum(newer, pod_entries=True) == KUBELET_CHECKSUM_POD_ENTRIES


def test_kubelets_files_are_read_in_every_layout():
    for doc in (dict(KUBELET_DOC, checksum=KUBELET_CHECKSUM), dict(KUBELET_DOC, checksum=0)):
        policy, state = parse_memory_checkpoint(json.dumps(doc))
        assert policy == "static"
        assert state.blocks("pod", "container1") == (Block((0,), "memory", 512),)
        assert state.machine[0].memory["memory"].free == 1024
    data = json.dumps(KUBELET_DOC, separators=(",", ":"))
    envelope = {"policyName": "other", "checksum": 1234, "data": data, "dataChecksum": KUBELET_DATA_CHECKSUM}
    assert parse_memory_checkpoint(json.dumps(envelope))[0] == "static"


@pytest.mark.parametrize(("doc", "match"), [
    (dict(KUBELET_DOC, checksum=101010), "checksum mismatch"),
    ({"data": "{}", "dataChecksum": 1}, "dataChecksum mismatch"),
    ({"machineState": {"x": {}}}, "not a NUMA node id"),
    ({"machineState": {"0": {"memoryMap": {"memory": {"free": -1}}}}}, "unsigned"),
    ({"entries": {"pod": {"c": [{"numaAffinity": "0"}]}}}, "malformed block"),
    ([], "JSON object"),
])
def test_untrustworthy_files_are_refused(doc, match):
    with pytest.raises(CheckpointError, match=match):
        parse_memory_checkpoint(json.dumps(doc))
    with pytest.raises(CheckpointError, match="not valid JSON"):
        parse_memory_checkpoint(b"{")


def _policy(machine: MachineMemory | None = None) -> MemoryPolicy:
    machine = machine or MachineMemory.uniform((0, 1), 4 * GI, ((GI, 1),))
    return MemoryPolicy(machine, {0: {"memory": 512 * MI}, 1: {"memory": 512 * MI}})


def test_default_machine_state_is_kubelets():
    state = MemoryState()
    _policy().start(state)
    t = state.machine[0].memory
    assert (t["hugepages-1Gi"].total, t["hugepages-1Gi"].allocatable, t["hugepages-1Gi"].free) == (GI, GI, GI)
    m = t["memory"]  # memory total includes the huge pages; allocatable excludes them and the reservation
    assert (m.total, m.system_reserved, m.allocatable) == (4 * GI, 512 * MI, 2560 * MI)
    assert (m.reserved, m.free) == (0, 2560 * MI)
    assert state.machine[1].cells == (1,) and state.machine[1].assignments == 0


def test_round_trip_through_the_store_and_start_checks(tmp_path):
    policy = _policy()
    state = MemoryState()
    policy.start(state)
    pod = _guaranteed("p1", GI)
    policy.allocate(state, pod, "app", None)
    store = MemoryCheckpointStore(tmp_path / "memory_manager_state")
    store.save(state)
    raw = json.loads((tmp_path / "memory_manager_state").read_text())
    assert raw["policyName"] == "Static" and raw["checksum"] == memory_checksum(raw)
    assert list(raw) == ["policyName", "machineState", "entries", "checksum", "numapin"]
    assert raw["numapin"]["schemaVersion"] == STATE_SCHEMA_VERSION
    loaded = store.load()
    assert loaded == state
    policy.start(loaded)  # adds up: accepted
    assert [p.name for p in tmp_path.iterdir()] == ["memory_manager_state"]  # no temp file left


def test_start_refuses_a_state_that_does_not_add_up(tmp_path):
    policy = _policy()
    state = MemoryState()
    policy.start(state)
    policy.allocate(state, _guaranteed("p1", GI), "app", None)
    bad = state.copy()
    bad.machine[0].memory["memory"].free += 1
    with pytest.raises(CheckpointError, match="the expected machine state is different from the real one"):
        policy.start(bad)
    drifted = _policy(MachineMemory.uniform((0, 1), 5 * GI, ((GI, 1),)))  # the node's memory changed after a reboot
    with pytest.raises(CheckpointError, match="node 0 memory: total"):
        drifted.start(state.copy())
    with pytest.raises(CheckpointError, match="machine state can not be empty when it has memory assignments"):
        policy.start(MemoryState(assignments={"p": {"c": (Block((0,), "memory", 1),)}}))
    orphan = state.copy()
    orphan.set_blocks("p2", "c", (Block((7,), "memory", 1),))
    with pytest.raises(CheckpointError, match="uses the NUMA that does not exist"):
        policy.start(orphan)


def test_store_refuses_to_overwrite_a_foreign_or_corrupt_file(tmp_path):
    path = tmp_path / "memory_manager_state"
    path.write_text("{garbage")
    store = MemoryCheckpointStore(path)
    with pytest.raises(CheckpointError, match="refusing to overwrite"):
        store.save(MemoryState())
    assert path.read_text() == "{garbage"
    store.save(MemoryState(), force=True)
    path.write_text(json.dumps(dict(KUBELET_DOC, checksum=KUBELET_CHECKSUM)))
    with pytest.raises(CheckpointError, match='configured policy "Static" differs from state checkpoint policy '
                                              '"static"'):
        store.load()
    assert MemoryCheckpointStore(tmp_path / "absent").load() is None


def test_serialized_bytes_are_stable():
    state = MemoryState()
    _policy().start(state)
    assert serialize_memory_checkpoint(state) == serialize_memory_checkpoint(state.copy())
    assert b'"entries"' not in serialize_memory_checkpoint(state)  # omitempty, as kubelet


def _guaranteed(uid: str, memory: int):
    from allocator.pod import ContainerInfo, PodInfo

    c = ContainerInfo("app", "app", 1000, 1000, memory, memory)
    return PodInfo(uid, "default", uid, "Guaranteed", None, False, (c,))


def test_kubelets_own_file_is_imported_and_checked(tmp_path):
    from allocator.memory import import_kubelet_memory_state

    policy = _policy()
    state = MemoryState()
    policy.start(state)
    policy.allocate(state, _guaranteed("p1", GI), "app", None)
    path = tmp_path / "memory_manager_state"
    doc = json.loads(serialize_memory_checkpoint(state))  # the bytes kubelet writes for this state
    path.write_text(json.dumps(doc))
    imported = import_kubelet_memory_state(path)
    policy.start(imported)
    assert imported == state
    with pytest.raises(CheckpointError, match="nothing to import"):
        import_kubelet_memory_state(tmp_path / "absent")
    other = {**doc, "policyName": "None"}
    other["checksum"] = memory_checksum(other)
    path.write_text(json.dumps(other))
    with pytest.raises(CheckpointError, match='differs from state checkpoint policy "None"'):
        import_kubelet_memory_state(path)


def test_a_state_of_a_newer_schema_is_refused_and_kept(tmp_path):
    state = MemoryState()
    _policy().start(state)
    path = tmp_path / "memory_manager_state"
    MemoryCheckpointStore(path).save(state)
    doc = json.loads(path.read_text())
    doc["numapin"] = {"schemaVersion": STATE_SCHEMA_VERSION + 1, "writtenBy": "9.9.9"}
    path.write_text(json.dumps(doc))  # kubelet's checksum does not cover numapin's field: it still holds
    before = path.read_bytes()
    newer = rf"written by numapin 9\.9\.9 \(state schema {STATE_SCHEMA_VERSION + 1}\)"
    with pytest.raises(CheckpointError, match=newer):
        MemoryCheckpointStore(path).load()
    with pytest.raises(CheckpointError, match="refusing to overwrite"):
        MemoryCheckpointStore(path).save(state)
    assert path.read_bytes() == before
    doc["numapin"] = {"schemaVersion": "two"}
    path.write_text(json.dumps(doc))
    with pytest.raises(CheckpointError, match="schemaVersion must be a positive integer"):
        MemoryCheckpointStore(path).load()
    del doc["numapin"]  # kubelet's own file, or one written before versions were recorded: schema 1
    path.write_text(json.dumps(doc))
    assert MemoryCheckpointStore(path).load() == state
    assert b'"numapin"' not in serialize_memory_checkpoint(state, numapin=False)
