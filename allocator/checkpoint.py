"""The state file: kubelet's ``cpu_manager_state`` checkpoint format, with kubelet's checksum.

The file is the JSON kubelet's CPU manager writes (V2)::

    {"policyName":"numapin","defaultCpuSet":"0-1,4-111","entries":{"<pod uid>":{"<container>":"2-3"}},
     "checksum":1234567890,"numapin":{"modes":{"<pod uid>":{"<container>":"share"}},"checksum":42}}

so operators read it with the tools they know. The checksum is kubelet's: the checkpoint struct (with its
checksum set to 0) rendered the way go-spew's ``%#v`` renders it, hashed with FNV-1a 32-bit. numapin's own
data (the per-container mode, ``exclusive`` or ``share``) rides in the extra ``numapin`` field, which
kubelet's JSON decoder ignores, with a checksum of its own. A pod whose mode was changed while it ran
(``allocator.mode_change``) is listed in ``numapin.podModes`` (``{"<pod uid>": "share"}``) with its own
``podModesChecksum``; both keys are absent when no pod's mode was changed, so such a file is byte for byte what
earlier numapin versions wrote, and they read the newer files too (they ignore the extra keys). A container
whose CPUs a resize changed (``allocator.resize``) has the set it was admitted with in ``numapin.baselines``
(``{"<pod uid>": {"<container>": "2-3"}}``, a subset of its entry) with ``baselinesChecksum``; absent when no
container was resized, so kubelet's own checksum and parser never see them.

Loading tolerates unknown fields (newer kubelets add some) and a checksum of 0 (kubelet accepts it too).
A file that cannot be trusted (not JSON, wrong shape, checksum mismatch, another policy, V1 entries keyed by
container id) raises :class:`CheckpointError` and is never overwritten unless the caller says so.
Writes are atomic: a "."-prefixed temp file in the same directory, fsync, rename, fsync of the directory.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .cpuset import CPUSet
from .errors import CheckpointError
from .modes import PINNED_MODES
from .state import CPUState

__all__ = [
    "EXTRA_FIELD",
    "CheckpointFile",
    "CheckpointStore",
    "checkpoint_checksum",
    "fnv1a_32",
    "import_kubelet_state",
    "parse_checkpoint",
    "render_checkpoint",
    "serialize_checkpoint",
]

EXTRA_FIELD = "numapin"
MODES = PINNED_MODES  # what the state file records per pinned container (allocator.modes)
POD_MODES = ("none", "exclusive", "share", "kubelet")
_MAX_U64 = (1 << 64) - 1
_FNV32_OFFSET = 0x811C9DC5
_FNV32_PRIME = 0x01000193
_REMEDY = (
    "numapin will not overwrite it. Drain the node, then move the file away (numapin starts with a fresh state) "
    "or restore a good copy, and restart numapin"
)


def fnv1a_32(data: bytes) -> int:
    """FNV-1a, 32-bit (Go's ``hash/fnv.New32a``)."""
    h = _FNV32_OFFSET
    for b in data:
        h = ((h ^ b) * _FNV32_PRIME) & 0xFFFFFFFF
    return h


def _render_map(m: Mapping[str, Any] | None) -> str:
    """A map as go-spew prints a nested map in ``%#v`` mode with SortKeys: ``map[k:v k2:v2]``, no types."""
    if m is None:
        return "<nil>"
    parts = []
    for k in sorted(m, key=lambda s: s.encode()):
        v = m[k]
        parts.append(f"{k}:{v if isinstance(v, str) else _render_map(v)}")
    return "map[" + " ".join(parts) + "]"


def render_checkpoint(
    policy_name: str,
    default_cpuset: str,
    entries: Mapping[str, Any] | None,
    checksum: int = 0,
    *,
    v1: bool = False,
) -> str:
    """The text kubelet hashes: its checkpoint struct as go-spew ``%#v`` renders it.

    ``entries`` None is a nil map (``<nil>``), an empty mapping an empty one (``map[]``). ``v1`` renders the
    legacy struct (entries keyed by container id), after kubelet's rename of the type to the V2 name.
    """
    entries_type = "map[string]string" if v1 else "map[string]map[string]string"
    return (
        f"(*state.CPUManagerCheckpoint){{PolicyName:(string){policy_name} DefaultCPUSet:(string){default_cpuset} "
        f"Entries:({entries_type}){_render_map(entries)} Checksum:(checksum.Checksum){checksum}}}"
    )


def checkpoint_checksum(
    policy_name: str,
    default_cpuset: str,
    entries: Mapping[str, Any] | None = None,
    *,
    v1: bool = False,
) -> int:
    """kubelet's checksum of a checkpoint (entries None or empty: none; kubelet writes an empty, non-nil map)."""
    text = render_checkpoint(policy_name, default_cpuset, {} if entries is None else entries, 0, v1=v1)
    return fnv1a_32(text.encode())


def _extra_checksum(modes: Mapping[str, Any]) -> int:
    return fnv1a_32(json.dumps(modes, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode())


@dataclass(frozen=True)
class CheckpointFile:
    """A parsed, verified checkpoint. ``version``: 1 (entries keyed by container id), 2, or 4 (kubelet's ``data``
    string with ``dataChecksum``; pod-level entries in it are not used)."""

    policy_name: str
    default_cpuset: CPUSet
    entries: Mapping[str, Mapping[str, CPUSet]]  # V2: pod uid -> container -> cpus
    v1_entries: Mapping[str, CPUSet]  # V1: container id -> cpus
    modes: Mapping[str, Mapping[str, str]]
    checksum: int
    version: int
    unknown_fields: tuple[str, ...]
    pod_modes: Mapping[str, str] = field(default_factory=dict)  # pod uid -> cpu-manager mode set while running
    baselines: Mapping[str, Mapping[str, CPUSet]] = field(default_factory=dict)  # resized containers' admitted sets


def _is_u64(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= _MAX_U64


def _parse_cpuset(text: object, where: str, path: str) -> CPUSet:
    if not isinstance(text, str):
        raise CheckpointError(f"{path}: {where} must be a cpu-list string, got {text!r}. {_REMEDY}")
    try:
        return CPUSet.parse(text)
    except ValueError as e:
        raise CheckpointError(f"{path}: {where}: {e}. {_REMEDY}") from None


def parse_checkpoint(data: bytes | str, path: str = "<checkpoint>") -> CheckpointFile:
    """Parse and verify a checkpoint's bytes (kubelet's V2 first, then V1). Raises CheckpointError."""
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path} is corrupt: not valid JSON ({e}). {_REMEDY}") from None
    if not isinstance(doc, dict):
        raise CheckpointError(f"{path} is corrupt: expected a JSON object, got {type(doc).__name__}. {_REMEDY}")
    unknown = tuple(sorted(k for k in doc if _field_of(k) is None))
    doc = _go_fields(doc)
    if "data" in doc:
        return _parse_v4(doc, path, unknown)
    policy = doc.get("policyName", "")
    if not isinstance(policy, str):
        raise CheckpointError(f"{path} is corrupt: policyName must be a string, got {policy!r}. {_REMEDY}")
    default_text = doc.get("defaultCpuSet", "")
    if not isinstance(default_text, str):
        raise CheckpointError(f"{path} is corrupt: defaultCpuSet must be a string, got {default_text!r}. {_REMEDY}")
    checksum = doc.get("checksum", 0)
    if not _is_u64(checksum):
        raise CheckpointError(f"{path} is corrupt: checksum must be an unsigned integer, got {checksum!r}. {_REMEDY}")
    raw_entries = doc.get("entries", {})
    if raw_entries is not None and not isinstance(raw_entries, dict):
        raise CheckpointError(f"{path} is corrupt: entries must be an object, got {raw_entries!r}. {_REMEDY}")

    # kubelet decodes as V2 first (pod uid -> {container -> cpus}), then as V1 (container id -> cpus).
    entries_map: dict[str, Any] = raw_entries or {}
    is_v2 = all(v is None or (isinstance(v, dict) and all(isinstance(x, str) for x in v.values()))
                for v in entries_map.values())
    is_v1 = all(isinstance(v, str) for v in entries_map.values())
    if not is_v2 and not is_v1:
        raise CheckpointError(
            f"{path} is corrupt: entries must map pod UIDs to {{container: cpu-list}} objects. {_REMEDY}"
        )
    version = 2 if is_v2 else 1
    if checksum != 0:
        ok = is_v2 and checksum_ok(policy, default_text, raw_entries, checksum, v1=False)
        if not ok and is_v1:
            ok = checksum_ok(policy, default_text, raw_entries, checksum, v1=True)
            if ok:
                version = 1
        if not ok:
            raise CheckpointError(
                f"{path} is corrupt: checksum mismatch (the file says {checksum}, its content hashes to "
                f"{checkpoint_checksum(policy, default_text, raw_entries, v1=not is_v2)}); it was edited or "
                f"partly written. {_REMEDY}"
            )

    default_cpuset = _parse_cpuset(default_text, "defaultCpuSet", path)
    entries: dict[str, dict[str, CPUSet]] = {}
    v1_entries: dict[str, CPUSet] = {}
    if version == 2:
        for uid, containers in entries_map.items():
            entries[uid] = {
                name: _parse_cpuset(cpus, f"entries[{uid!r}][{name!r}]", path)
                for name, cpus in (containers or {}).items()
            }
    else:
        for cid, cpus in entries_map.items():
            v1_entries[cid] = _parse_cpuset(cpus, f"entries[{cid!r}]", path)

    modes = _parse_extra(doc.get(EXTRA_FIELD), entries, path) if EXTRA_FIELD in doc else {}
    pod_modes = _parse_pod_modes(doc.get(EXTRA_FIELD), path) if EXTRA_FIELD in doc else {}
    baselines = _parse_baselines(doc.get(EXTRA_FIELD), entries, path) if EXTRA_FIELD in doc else {}
    return CheckpointFile(
        policy_name=policy,
        default_cpuset=default_cpuset,
        entries=entries,
        v1_entries=v1_entries,
        modes=modes,
        checksum=checksum,
        version=version,
        unknown_fields=unknown,
        pod_modes=pod_modes,
        baselines=baselines,
    )


_FIELDS = ("policyName", "defaultCpuSet", "entries", "checksum", "data", "dataChecksum", EXTRA_FIELD)
_FOLDED = {f.lower(): f for f in _FIELDS}


def _field_of(key: str) -> str | None:
    return key if key in _FIELDS else _FOLDED.get(key.lower())


def _go_fields(doc: Mapping[str, Any]) -> dict[str, Any]:
    """Known fields as Go's JSON decoder finds them: names match case-insensitively, the last one wins."""
    out: dict[str, Any] = {}
    for key, value in doc.items():
        name = _field_of(key)
        if name is not None:
            out[name] = value
    return out


def _parse_v4(doc: Mapping[str, Any], path: str, unknown: tuple[str, ...]) -> CheckpointFile:
    """A V4 checkpoint (newer kubelets): ``data`` (a JSON string, authoritative) with ``dataChecksum``."""
    data = doc["data"]
    data_checksum = doc.get("dataChecksum", 0)
    if not isinstance(data, str):
        raise CheckpointError(f"{path} is corrupt: data must be a JSON string, got {data!r}. {_REMEDY}")
    if not _is_u64(data_checksum):
        raise CheckpointError(
            f"{path} is corrupt: dataChecksum must be an unsigned integer, got {data_checksum!r}. {_REMEDY}"
        )
    actual = fnv1a_32(("(string)" + data).encode())
    if data_checksum != actual:
        raise CheckpointError(
            f"{path} is corrupt: dataChecksum mismatch (the file says {data_checksum}, data hashes to {actual}). "
            f"{_REMEDY}"
        )
    try:
        inner = json.loads(data)
    except ValueError as e:
        raise CheckpointError(f"{path} is corrupt: data is not valid JSON ({e}). {_REMEDY}") from None
    if not isinstance(inner, dict):
        raise CheckpointError(f"{path} is corrupt: data must hold a JSON object. {_REMEDY}")
    inner = _go_fields(inner)
    policy = inner.get("policyName", "")
    if not isinstance(policy, str):
        raise CheckpointError(f"{path} is corrupt: data.policyName must be a string. {_REMEDY}")
    entries_raw = inner.get("entries") or {}
    if not isinstance(entries_raw, dict) or not all(
        v is None or (isinstance(v, dict) and all(isinstance(x, str) for x in v.values())) for v in entries_raw.values()
    ):
        raise CheckpointError(f"{path} is corrupt: data.entries must map pod UIDs to {{container: cpu-list}}. "
                              f"{_REMEDY}")
    entries = {
        uid: {name: _parse_cpuset(c, f"data.entries[{uid!r}][{name!r}]", path) for name, c in (cs or {}).items()}
        for uid, cs in entries_raw.items()
    }
    return CheckpointFile(
        policy_name=policy,
        default_cpuset=_parse_cpuset(inner.get("defaultCpuSet", ""), "data.defaultCpuSet", path),
        entries=entries,
        v1_entries={},
        modes={},
        checksum=data_checksum,
        version=4,
        unknown_fields=unknown,
    )


def checksum_ok(policy: str, default_text: str, entries: Mapping[str, Any] | None, checksum: int, *,
                v1: bool) -> bool:
    # A JSON null is Go's nil map; an absent field leaves kubelet's pre-made empty map.
    return fnv1a_32(render_checkpoint(policy, default_text, entries, 0, v1=v1).encode()) == checksum


def _parse_extra(extra: object, entries: Mapping[str, Mapping[str, CPUSet]], path: str) -> dict[str, dict[str, str]]:
    where = f"{path}: field {EXTRA_FIELD!r}"
    if not isinstance(extra, dict):
        raise CheckpointError(f"{where} must be an object with 'modes' and 'checksum'. {_REMEDY}")
    modes = extra.get("modes", {})
    checksum = extra.get("checksum")
    if not isinstance(modes, dict) or not all(
        isinstance(m, dict) and all(isinstance(v, str) for v in m.values()) for m in modes.values()
    ):
        raise CheckpointError(f"{where}.modes must map pod UIDs to {{container: mode}} objects. {_REMEDY}")
    if not _is_u64(checksum):
        raise CheckpointError(f"{where}.checksum must be an unsigned integer, got {checksum!r}. {_REMEDY}")
    actual = _extra_checksum(modes)
    if checksum != actual:
        raise CheckpointError(
            f"{where} is corrupt: checksum mismatch (the file says {checksum}, its content hashes to {actual}). "
            f"{_REMEDY}"
        )
    out: dict[str, dict[str, str]] = {}
    for uid, containers in modes.items():
        for name, mode in containers.items():
            if mode not in MODES:
                raise CheckpointError(
                    f"{where}.modes[{uid!r}][{name!r}] is {mode!r}; expected one of {', '.join(MODES)}. {_REMEDY}"
                )
            if name not in entries.get(uid, {}):
                raise CheckpointError(
                    f"{where}.modes names container {name!r} of pod {uid!r}, which has no CPU entry. {_REMEDY}"
                )
            out.setdefault(uid, {})[name] = mode
    return out


def _parse_pod_modes(extra: object, path: str) -> dict[str, str]:
    where = f"{path}: field {EXTRA_FIELD!r}"
    if not isinstance(extra, dict) or "podModes" not in extra:
        return {}
    pod_modes = extra.get("podModes")
    checksum = extra.get("podModesChecksum")
    if not isinstance(pod_modes, dict) or not all(isinstance(v, str) for v in pod_modes.values()):
        raise CheckpointError(f"{where}.podModes must map pod UIDs to modes. {_REMEDY}")
    if not _is_u64(checksum) or checksum != _extra_checksum(pod_modes):
        raise CheckpointError(
            f"{where}.podModes is corrupt: podModesChecksum {checksum!r} does not match its content "
            f"({_extra_checksum(pod_modes)}). {_REMEDY}"
        )
    for uid, mode in pod_modes.items():
        if mode not in POD_MODES:
            raise CheckpointError(
                f"{where}.podModes[{uid!r}] is {mode!r}; expected one of {', '.join(POD_MODES)}. {_REMEDY}"
            )
    return dict(pod_modes)


def _parse_baselines(extra: object, entries: Mapping[str, Mapping[str, CPUSet]],
                     path: str) -> dict[str, dict[str, CPUSet]]:
    where = f"{path}: field {EXTRA_FIELD!r}"
    if not isinstance(extra, dict) or "baselines" not in extra:
        return {}
    raw = extra.get("baselines")
    checksum = extra.get("baselinesChecksum")
    if not isinstance(raw, dict) or not all(
        isinstance(m, dict) and all(isinstance(v, str) for v in m.values()) for m in raw.values()
    ):
        raise CheckpointError(f"{where}.baselines must map pod UIDs to {{container: cpu-list}} objects. {_REMEDY}")
    if not _is_u64(checksum) or checksum != _extra_checksum(raw):
        raise CheckpointError(
            f"{where}.baselines is corrupt: baselinesChecksum {checksum!r} does not match its content "
            f"({_extra_checksum(raw)}). {_REMEDY}"
        )
    out: dict[str, dict[str, CPUSet]] = {}
    for uid, containers in raw.items():
        for name, text in containers.items():
            cpus = _parse_cpuset(text, f"{EXTRA_FIELD}.baselines[{uid!r}][{name!r}]", path)
            held = entries.get(uid, {}).get(name)
            if held is None:
                raise CheckpointError(
                    f"{where}.baselines names container {name!r} of pod {uid!r}, which has no CPU entry. {_REMEDY}"
                )
            if not cpus <= held:
                raise CheckpointError(
                    f"{where}.baselines[{uid!r}][{name!r}] is corrupt: {cpus} is not a subset of the container's "
                    f"CPUs {held}. {_REMEDY}"
                )
            out.setdefault(uid, {})[name] = cpus
    return out


def serialize_checkpoint(state: CPUState, policy_name: str) -> bytes:
    """The file's bytes for ``state``, laid out as kubelet's ``json.Marshal`` would (plus numapin's field)."""
    entries = {
        uid: {name: str(cpus) for name, cpus in sorted(containers.items())}
        for uid, containers in sorted(state.assignments.items())
        if containers
    }
    default_text = str(state.default_cpuset)
    doc: dict[str, Any] = {"policyName": policy_name, "defaultCpuSet": default_text}
    if entries:
        doc["entries"] = entries
    doc["checksum"] = checkpoint_checksum(policy_name, default_text, entries)
    modes: dict[str, dict[str, str]] = {}
    for uid, containers in sorted(state.assignments.items()):
        for name in sorted(containers):
            mode = state.mode(uid, name)
            if mode not in MODES:
                raise CheckpointError(f"container {name!r} of pod {uid!r} has mode {mode!r}, not one of "
                                      f"{', '.join(MODES)}")
            modes.setdefault(uid, {})[name] = mode
    doc[EXTRA_FIELD] = {"modes": modes, "checksum": _extra_checksum(modes)}
    if state.pod_modes:
        pod_modes = dict(sorted(state.pod_modes.items()))
        bad = [m for m in pod_modes.values() if m not in POD_MODES]
        if bad:
            raise CheckpointError(f"pod mode {bad[0]!r} is not one of {', '.join(POD_MODES)}")
        doc[EXTRA_FIELD].update(podModes=pod_modes, podModesChecksum=_extra_checksum(pod_modes))
    baselines = {uid: {name: str(cpus) for name, cpus in sorted(containers.items())}
                 for uid, containers in sorted(state.baselines.items()) if containers}
    if baselines:
        doc[EXTRA_FIELD].update(baselines=baselines, baselinesChecksum=_extra_checksum(baselines))
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode()


def _state_from(cp: CheckpointFile) -> CPUState:
    state = CPUState(default_cpuset=cp.default_cpuset)
    # (kubelet may keep a pod with an empty container map: it holds nothing and is dropped here)
    for uid, containers in cp.entries.items():
        for name, cpus in containers.items():
            state.set(uid, name, cpus, cp.modes.get(uid, {}).get(name, "exclusive"))
    state.pod_modes = dict(cp.pod_modes)
    for uid, containers in cp.baselines.items():
        for name, cpus in containers.items():
            state.set_baseline(uid, name, cpus)
    return state


def _from_v1(cp: CheckpointFile, path: str, container_ids: Mapping[str, tuple[str, str]] | None) -> CheckpointFile:
    if not cp.v1_entries:
        return cp
    if container_ids is None:
        raise CheckpointError(
            f"{path} is a V1 checkpoint: its entries are keyed by container id "
            f"({', '.join(sorted(cp.v1_entries)[:3])}...), not by pod UID and container name. numapin needs the "
            f"container id -> (pod UID, container name) map to migrate it (kubelet builds it from the runtime). "
            f"Start numapin's proxy, which reads it from containerd, or drain the node and move the file away"
        )
    entries: dict[str, dict[str, CPUSet]] = {}
    for cid, cpus in cp.v1_entries.items():
        ref = container_ids.get(cid)
        if ref is None:
            raise CheckpointError(f"{path}: V1 entry for container id {cid!r} matches no running container; "
                                  f"drain the node and move the file away")
        entries.setdefault(ref[0], {})[ref[1]] = cpus
    return CheckpointFile(cp.policy_name, cp.default_cpuset, entries, {}, cp.modes, cp.checksum, 2,
                          cp.unknown_fields, cp.pod_modes, cp.baselines)


class CheckpointStore:
    """numapin's state file at ``path``, in kubelet's checkpoint format with ``policyName`` = ``policy_name``."""

    def __init__(self, path: str | os.PathLike[str], policy_name: str = "numapin") -> None:
        self.path = Path(path)
        self.policy_name = policy_name

    def read(self, container_ids: Mapping[str, tuple[str, str]] | None = None) -> CheckpointFile | None:
        """The verified file, or None when there is none. Raises CheckpointError (file left untouched)."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as e:
            raise CheckpointError(f"cannot read {self.path}: {e.strerror or e}") from None
        cp = _from_v1(parse_checkpoint(data, str(self.path)), str(self.path), container_ids)
        if cp.policy_name != self.policy_name:
            raise CheckpointError(
                f"{self.path}: configured policy {self.policy_name!r} differs from state checkpoint policy "
                f"{cp.policy_name!r}. " + (
                    "It is kubelet's own CPU manager state: import it with import_kubelet_state, or drain the node "
                    "and move the file away" if cp.policy_name in ("static", "none")
                    else "Drain the node and move the file away, or point numapin at its own state file"
                )
            )
        return cp

    def load(self, container_ids: Mapping[str, tuple[str, str]] | None = None) -> CPUState | None:
        """The saved state, or None when the file does not exist. Raises CheckpointError (file left untouched)."""
        cp = self.read(container_ids)
        return None if cp is None else _state_from(cp)

    def clean_leftovers(self) -> list[Path]:
        """Remove temp files a writer killed between creating and renaming them left behind (``.<name>.<12
        hex digits>.tmp`` in the state's directory, regular files only); returns what was removed. Call at
        start, before the first save: the caller must be the file's only writer."""
        pattern = re.compile(rf"\.{re.escape(self.path.name)}\.[0-9a-f]{{12}}\.tmp")
        removed: list[Path] = []
        try:
            entries = list(os.scandir(self.path.parent))
        except FileNotFoundError:
            return removed
        for e in entries:
            if pattern.fullmatch(e.name) and e.is_file(follow_symlinks=False):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(e.path)
                    removed.append(Path(e.path))
        return removed

    def save(self, state: CPUState, *, force: bool = False) -> None:
        """Write ``state`` atomically. Refuses (CheckpointError) to replace an existing file that is not a valid
        checkpoint of this policy, unless ``force``: an operator's explicit reset."""
        data = serialize_checkpoint(state, self.policy_name)
        if not force:
            self._check_replaceable()
        atomic_write(self.path, data)

    def _check_replaceable(self) -> None:
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return
        except OSError as e:
            raise CheckpointError(f"refusing to overwrite {self.path}: cannot read it: {e.strerror or e}") from None
        try:
            cp = parse_checkpoint(data, str(self.path))
        except CheckpointError as e:
            raise CheckpointError(f"refusing to overwrite {self.path}: {e}") from None
        if cp.policy_name != self.policy_name:
            raise CheckpointError(
                f"refusing to overwrite {self.path}: it belongs to policy {cp.policy_name!r}, not "
                f"{self.policy_name!r}. Drain the node and move the file away first"
            )


def atomic_write(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Write ``data`` to ``path`` so a crash leaves either the old file or the new one, never a mix."""
    directory = path.parent
    tmp = directory / f".{path.name}.{secrets.token_hex(6)}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
        try:
            view = memoryview(data)
            while view:
                n = os.write(fd, view)
                view = view[n:]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise CheckpointError(f"cannot write {path}: {e.strerror or e}; the previous file is unchanged") from None
    try:  # make the rename itself durable
        dfd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError as e:
        if e.errno != errno.EINVAL:  # EINVAL: a filesystem that cannot sync directories
            raise CheckpointError(f"{path} was replaced but its directory could not be synced: "
                                  f"{e.strerror or e}") from None


def import_kubelet_state(
    path: str | os.PathLike[str],
    *,
    policy_name: str = "static",
    container_ids: Mapping[str, tuple[str, str]] | None = None,
) -> CPUState:
    """Read kubelet's own ``cpu_manager_state`` (static policy) as a CPUState, every container ``exclusive``.

    Used when a node moves from kubelet's static policy to numapin without a drain. Raises CheckpointError when
    the file is missing, corrupt, or written by another policy.
    """
    store = CheckpointStore(path, policy_name)
    cp = store.read(container_ids)
    if cp is None:
        raise CheckpointError(f"{path} does not exist: nothing to import")
    return _state_from(cp)
