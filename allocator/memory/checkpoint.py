"""The Memory Manager's state file: kubelet's ``memory_manager_state`` format, with kubelet's checksum.

The JSON is kubelet's::

    {"policyName":"Static","machineState":{"0":{"numberOfAssignments":1,"memoryMap":{"memory":{"total":...,
     "systemReserved":...,"allocatable":...,"reserved":...,"free":...}},"cells":[0]}},
     "entries":{"<pod uid>":{"<container>":[{"numaAffinity":[0],"type":"memory","size":1073741824}]}},
     "checksum":1234567890}

The checksum is kubelet's (allocator.checkpoint explains the scheme): FNV-1a 32-bit over the checkpoint struct
(checksum 0) as go-spew's ``%#v`` prints it. For this struct the rendering is::

    (*state.MemoryManagerCheckpoint){PolicyName:(string)Static MachineState:(state.NUMANodeMap)map[0:<*>{
    NumberOfAssignments:(int)1 MemoryMap:(map[v1.ResourceName]*state.MemoryTable)map[memory:<*>{
    TotalMemSize:(uint64)... SystemReserved:(uint64)... Allocatable:(uint64)... Reserved:(uint64)... Free:(uint64)...}]
    Cells:([]int)[0]}] Entries:(state.ContainerMemoryAssignments)map[<uid>:map[<name>:[{NUMAAffinity:([]int)[0]
    Type:(v1.ResourceName)memory Size:(uint64)1073741824}]]] Checksum:(checksum.Checksum)0}

(one line; map keys sorted, map values and slice elements without their type, pointers inside maps as ``<*>``, a
nil slice as ``<nil>``). numapin writes this format, which every kubelet since v1.22 reads (newer ones as their
"v1"). It also reads the newer layouts: the struct with ``PodEntries`` (hashed with that field) and the
``data``/``dataChecksum`` envelope, and a checksum of 0. Unknown fields are ignored. Writes are atomic
(allocator.checkpoint.atomic_write).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..checkpoint import EXTRA_FIELD, atomic_write, fnv1a_32
from ..errors import CheckpointError
from ..state_schema import check_schema, schema_fields
from .state import Block, MemoryState, MemoryTable, NodeState

__all__ = ["POLICY_NAME", "MemoryCheckpointStore", "import_kubelet_memory_state", "memory_checksum",
           "parse_memory_checkpoint", "render_memory_checkpoint", "serialize_memory_checkpoint"]

POLICY_NAME = "Static"
_REMEDY = ("numapin will not overwrite it. Drain the node, then move the file away (numapin starts with a fresh "
           "memory state) or restore a good copy, and restart numapin")
_TABLE_FIELDS = (("TotalMemSize", "total"), ("SystemReserved", "systemReserved"), ("Allocatable", "allocatable"),
                 ("Reserved", "reserved"), ("Free", "free"))


def _ints(values: Any) -> str:
    return "<nil>" if values is None else "[" + " ".join(str(v) for v in values) + "]"


def _block(b: Mapping[str, Any]) -> str:
    return (f"{{NUMAAffinity:([]int){_ints(b.get('numaAffinity'))} Type:(v1.ResourceName){b.get('type', '')} "
            f"Size:(uint64){b.get('size', 0)}}}")


def _blocks(blocks: Any) -> str:
    return "<nil>" if blocks is None else "[" + " ".join(_block(b) for b in blocks) + "]"


def _table(t: Mapping[str, Any] | None) -> str:
    if t is None:
        return "<nil>"
    return "<*>{" + " ".join(f"{go}:(uint64){t.get(js, 0)}" for go, js in _TABLE_FIELDS) + "}"


def _node(n: Mapping[str, Any] | None) -> str:
    if n is None:
        return "<nil>"
    mm = n.get("memoryMap")
    mem = "<nil>" if mm is None else "map[" + " ".join(
        f"{r}:{_table(mm[r])}" for r in sorted(mm, key=lambda s: s.encode())) + "]"
    return (f"<*>{{NumberOfAssignments:(int){n.get('numberOfAssignments', 0)} "
            f"MemoryMap:(map[v1.ResourceName]*state.MemoryTable){mem} Cells:([]int){_ints(n.get('cells'))}}}")


def _str_map(m: Mapping[str, Any] | None, value: Any) -> str:
    if m is None:
        return "<nil>"
    return "map[" + " ".join(f"{k}:{value(m[k])}" for k in sorted(m, key=lambda s: s.encode())) + "]"


def render_memory_checkpoint(doc: Mapping[str, Any], checksum: int = 0, *, pod_entries: bool = False) -> str:
    """The text kubelet hashes, from the file's JSON fields (``machineState`` keys are node ids as strings; an
    absent ``entries`` is kubelet's pre-made empty map). ``pod_entries``: the newer struct with PodEntries (only
    empty pod entries are rendered)."""
    ms = doc.get("machineState", {})
    if ms is None:
        machine = "<nil>"
    else:
        machine = "map[" + " ".join(f"{k}:{_node(ms[k])}" for k in sorted(ms, key=int)) + "]"
    entries = doc.get("entries", {})
    rendered_entries = _str_map(entries, lambda containers: _str_map(containers, _blocks))
    extra = ""
    if pod_entries:
        pe = doc.get("podEntries", {})
        extra = f" PodEntries:(state.PodMemoryAssignments){_str_map(pe, _pod_entry)}"
    return (f"(*state.MemoryManagerCheckpoint){{PolicyName:(string){doc.get('policyName', '')} "
            f"MachineState:(state.NUMANodeMap){machine} "
            f"Entries:(state.ContainerMemoryAssignments){rendered_entries}{extra} "
            f"Checksum:(checksum.Checksum){checksum}}}")


def _pod_entry(e: Mapping[str, Any]) -> str:
    return f"{{MemoryBlocks:([]state.Block){_blocks(e.get('memoryBlocks'))}}}"


def memory_checksum(doc: Mapping[str, Any], *, pod_entries: bool = False) -> int:
    """kubelet's checksum of a memory checkpoint given as its JSON fields."""
    return fnv1a_32(render_memory_checkpoint(doc, 0, pod_entries=pod_entries).encode())


def _state_doc(state: MemoryState, policy_name: str) -> dict[str, Any]:
    machine = {
        str(n): {
            "numberOfAssignments": s.assignments,
            "memoryMap": {r: {"total": t.total, "systemReserved": t.system_reserved, "allocatable": t.allocatable,
                              "reserved": t.reserved, "free": t.free} for r, t in sorted(s.memory.items())},
            "cells": list(s.cells),
        }
        for n, s in sorted(state.machine.items())
    }
    entries = {
        uid: {name: [{"numaAffinity": list(b.numa), "type": b.resource, "size": b.size} for b in blocks]
              for name, blocks in sorted(containers.items())}
        for uid, containers in sorted(state.assignments.items()) if containers
    }
    doc: dict[str, Any] = {"policyName": policy_name, "machineState": machine}
    if entries:
        doc["entries"] = entries
    return doc


def serialize_memory_checkpoint(state: MemoryState, policy_name: str = POLICY_NAME, *, numapin: bool = True) -> bytes:
    """The file's bytes, as kubelet's json.Marshal lays them out (``entries`` omitted when empty), with numapin's
    field (``numapin``: its state schema version and release, which kubelet's decoder ignores and its checksum does
    not cover) unless ``numapin`` is False (kubelet's own file, ``numapin export-kubelet-state``)."""
    doc = _state_doc(state, policy_name)
    doc["checksum"] = memory_checksum(doc)
    if numapin:
        doc[EXTRA_FIELD] = schema_fields()
    return json.dumps(doc, separators=(",", ":")).encode()


def _u64(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 1 << 64


def _corrupt(path: str, what: str) -> CheckpointError:
    return CheckpointError(f"{path} is corrupt: {what}. {_REMEDY}")


def parse_memory_checkpoint(data: bytes | str, path: str = "<memory checkpoint>") -> tuple[str, MemoryState]:
    """Parse and verify a memory checkpoint: (policy name, state). CheckpointError when it cannot be trusted."""
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError) as e:
        raise _corrupt(path, f"not valid JSON ({e})") from None
    if not isinstance(doc, dict):
        raise _corrupt(path, "expected a JSON object")
    if "data" in doc:  # the newer envelope: authoritative data string with its own checksum
        inner = doc["data"]
        cs = doc.get("dataChecksum", 0)
        if not isinstance(inner, str) or not _u64(cs):
            raise _corrupt(path, "data must be a JSON string and dataChecksum an unsigned integer")
        if fnv1a_32(("(string)" + inner).encode()) != cs:
            raise _corrupt(path, "dataChecksum mismatch")
        try:
            doc = json.loads(inner)
        except ValueError as e:
            raise _corrupt(path, f"data is not valid JSON ({e})") from None
        if not isinstance(doc, dict):
            raise _corrupt(path, "data must hold a JSON object")
    else:
        checksum = doc.get("checksum", 0)
        if not _u64(checksum):
            raise _corrupt(path, f"checksum must be an unsigned integer, got {checksum!r}")
        _check_shape(doc, path)
        if checksum and checksum not in (memory_checksum(doc), memory_checksum(doc, pod_entries=True)):
            raise _corrupt(path, f"checksum mismatch (the file says {checksum}, its content hashes to "
                                 f"{memory_checksum(doc)}); it was edited or partly written")
    _check_shape(doc, path)
    extra = doc.get(EXTRA_FIELD)
    check_schema(extra if isinstance(extra, dict) else None, path)  # a newer numapin's state: refused, kept
    policy = doc.get("policyName", "")
    return policy, _state_of(doc)


def _check_shape(doc: Mapping[str, Any], path: str) -> None:
    if not isinstance(doc.get("policyName", ""), str):
        raise _corrupt(path, "policyName must be a string")
    ms = doc.get("machineState") or {}
    if not isinstance(ms, dict):
        raise _corrupt(path, "machineState must be an object")
    for key, node in ms.items():
        if not key.lstrip("-").isdigit():
            raise _corrupt(path, f"machineState key {key!r} is not a NUMA node id")
        if not isinstance(node, dict):
            raise _corrupt(path, f"machineState[{key}] must be an object")
        if not _u64(node.get("numberOfAssignments", 0)):
            raise _corrupt(path, f"machineState[{key}].numberOfAssignments must be a non-negative integer")
        cells = node.get("cells") or []
        if not isinstance(cells, list) or not all(isinstance(c, int) and not isinstance(c, bool) for c in cells):
            raise _corrupt(path, f"machineState[{key}].cells must be a list of NUMA node ids")
        mm = node.get("memoryMap") or {}
        if not isinstance(mm, dict):
            raise _corrupt(path, f"machineState[{key}].memoryMap must be an object")
        for r, t in mm.items():
            if not isinstance(t, dict) or not all(_u64(t.get(js, 0)) for _, js in _TABLE_FIELDS):
                raise _corrupt(path, f"machineState[{key}].memoryMap[{r!r}] must hold unsigned byte counts")
    entries = doc.get("entries") or {}
    if not isinstance(entries, dict):
        raise _corrupt(path, "entries must be an object")
    for uid, containers in entries.items():
        if not isinstance(containers, dict):
            raise _corrupt(path, f"entries[{uid!r}] must map container names to blocks")
        for name, blocks in containers.items():
            if not isinstance(blocks, list):
                raise _corrupt(path, f"entries[{uid!r}][{name!r}] must be a list of blocks")
            for b in blocks:
                ok = (isinstance(b, dict) and isinstance(b.get("type", ""), str) and _u64(b.get("size", 0))
                      and isinstance(b.get("numaAffinity") or [], list)
                      and all(isinstance(n, int) and not isinstance(n, bool) for n in b.get("numaAffinity") or []))
                if not ok:
                    raise _corrupt(path, f"entries[{uid!r}][{name!r}] holds a malformed block")


def _state_of(doc: Mapping[str, Any]) -> MemoryState:
    state = MemoryState()
    for key, node in (doc.get("machineState") or {}).items():
        state.machine[int(key)] = NodeState(
            assignments=node.get("numberOfAssignments", 0),
            memory={r: MemoryTable(*(t.get(js, 0) for _, js in _TABLE_FIELDS))
                    for r, t in (node.get("memoryMap") or {}).items()},
            cells=tuple(node.get("cells") or ()),
        )
    for uid, containers in (doc.get("entries") or {}).items():
        for name, blocks in containers.items():
            state.set_blocks(uid, name, tuple(Block(tuple(sorted(b.get("numaAffinity") or ())), b.get("type", ""),
                                                    b.get("size", 0)) for b in blocks))
    return state


class MemoryCheckpointStore:
    """numapin's ``memory_manager_state`` at ``path`` (policy name ``Static``, as kubelet's static policy)."""

    def __init__(self, path: str | os.PathLike[str], policy_name: str = POLICY_NAME) -> None:
        self.path = Path(path)
        self.policy_name = policy_name

    def load(self) -> MemoryState | None:
        """The saved state, or None without a file. CheckpointError (the file is left untouched)."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as e:
            raise CheckpointError(f"cannot read {self.path}: {e.strerror or e}") from None
        policy, state = parse_memory_checkpoint(data, str(self.path))
        if policy != self.policy_name:
            raise CheckpointError(f'{self.path}: [memorymanager] configured policy "{self.policy_name}" differs from '
                                  f'state checkpoint policy "{policy}". Drain the node and move the file away')
        return state

    def save(self, state: MemoryState, *, force: bool = False) -> None:
        """Write atomically; refuses to replace a file that is not a valid checkpoint of this policy unless
        ``force``."""
        data = serialize_memory_checkpoint(state, self.policy_name)
        if not force and self.path.exists():
            try:
                self.load()
            except CheckpointError as e:
                raise CheckpointError(f"refusing to overwrite {self.path}: {e}") from None
        atomic_write(self.path, data)


def import_kubelet_memory_state(path: str | os.PathLike[str]) -> MemoryState:
    """kubelet's own ``memory_manager_state`` (static policy) as a MemoryState, for a node moving from kubelet's
    Memory Manager to numapin without a drain (check it with ``MemoryPolicy.start``, as kubelet does at a restart).
    CheckpointError when the file is missing, corrupt or written by another policy."""
    state = MemoryCheckpointStore(path, POLICY_NAME).load()
    if state is None:
        raise CheckpointError(f"{path} does not exist: nothing to import")
    return state
