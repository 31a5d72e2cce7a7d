"""CDI devices (CRI's ``ContainerConfig.CDI_devices``) resolved to the device nodes they give a container.

A CDI device is named ``vendor.com/class=name``. Its spec is a JSON or YAML file in one of the CDI spec
directories (``/etc/cdi`` then ``/var/run/cdi``; a later directory wins where two specs define the same device):
``kind: vendor.com/class`` and ``devices: [{name, containerEdits: {deviceNodes: [{path, hostPath}]}}]``, plus the
spec's own ``containerEdits``, which every device of the spec carries. A device node's host path is its
``hostPath``, else its ``path``. ``vendor.com/class=all`` is the spec's device named ``all`` when it has one, else
every device of the kind.

Nothing here fails a create: a name that is malformed, unknown, or whose spec cannot be read or parsed is a
``CDIProblem`` (the caller logs it and counts it) and gives no device node; the devices that resolve still do.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .devices import devices_numa_nodes

__all__ = ["DEFAULT_SPEC_DIRS", "CDIProblem", "CDIResolution", "CDISpecs", "cdi_numa_nodes", "load_specs", "resolve"]

DEFAULT_SPEC_DIRS = ("/etc/cdi", "/var/run/cdi")
_SPEC_SUFFIXES = (".json", ".yaml", ".yml")
_MAX_SPEC_BYTES = 4 << 20
# the CDI spec's qualified name: vendor (a domain-like name) / class = device name
_NAME = re.compile(r"^(?P<kind>[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9_-]*)"
                   r"=(?P<device>[A-Za-z0-9][A-Za-z0-9_.:-]*)$")


@dataclass(frozen=True)
class CDIProblem:
    """Why a CDI device gave no device node: ``reason`` is a metric label (``malformed``, ``unknown``,
    ``unreadable``, ``invalid``), ``detail`` the log line's text."""

    reason: str
    detail: str


@dataclass(frozen=True)
class CDISpecs:
    """The devices of every readable spec: ``{kind: {device name: host paths of its device nodes}}``, and the
    problems met reading the directories."""

    devices: Mapping[str, Mapping[str, tuple[str, ...]]] = field(default_factory=dict)
    problems: tuple[CDIProblem, ...] = ()


@dataclass(frozen=True)
class CDIResolution:
    """The device nodes (host paths, in order, without repeats) the named CDI devices give, and what did not
    resolve."""

    host_paths: tuple[str, ...]
    problems: tuple[CDIProblem, ...]


def _node_paths(edits: Any, where: str) -> tuple[str, ...]:
    """The host paths of ``containerEdits.deviceNodes``; ValueError for a malformed entry."""
    if edits is None:
        return ()
    if not isinstance(edits, dict):
        raise ValueError(f"{where}: containerEdits is not a mapping")
    nodes = edits.get("deviceNodes") or []
    if not isinstance(nodes, list):
        raise ValueError(f"{where}: deviceNodes is not a list")
    out = []
    for n in nodes:
        if not isinstance(n, dict):
            raise ValueError(f"{where}: a deviceNodes entry is not a mapping")
        path = n.get("hostPath") or n.get("path")
        if not isinstance(path, str) or not path.startswith("/"):
            raise ValueError(f"{where}: a device node without an absolute path ({n!r})")
        out.append(path)
    return tuple(out)


def _parse_spec(doc: Any, where: str) -> tuple[str, dict[str, tuple[str, ...]]]:
    """``(kind, {device name: host paths})`` of one spec document; ValueError when it is not a CDI spec."""
    if not isinstance(doc, dict):
        raise ValueError(f"{where}: not a mapping")
    kind = doc.get("kind")
    if not isinstance(kind, str) or not _NAME.match(f"{kind}=x"):
        raise ValueError(f"{where}: kind {kind!r} is not vendor.com/class")
    common = _node_paths(doc.get("containerEdits"), where)
    devices = doc.get("devices")
    if not isinstance(devices, list) or not devices:
        raise ValueError(f"{where}: no devices")
    out: dict[str, tuple[str, ...]] = {}
    for d in devices:
        if not isinstance(d, dict) or not isinstance(d.get("name"), str) or not d["name"]:
            raise ValueError(f"{where}: a device without a name")
        out[d["name"]] = _node_paths(d.get("containerEdits"), f"{where}: device {d['name']}") + common
    return kind, out


def load_specs(spec_dirs: Sequence[str | os.PathLike[str]] = DEFAULT_SPEC_DIRS) -> CDISpecs:
    """Read every ``*.json``/``*.yaml``/``*.yml`` spec of ``spec_dirs`` (a missing directory has none; a later
    directory's device replaces an earlier one's of the same name). A spec that cannot be read or is not a CDI spec
    is a problem and contributes nothing."""
    import yaml  # only where a CDI device is named (the proxy imports no YAML parser otherwise: test_lean_import)

    devices: dict[str, dict[str, tuple[str, ...]]] = {}
    problems: list[CDIProblem] = []
    for d in spec_dirs:
        try:
            names = sorted(os.listdir(d))
        except FileNotFoundError:
            continue
        except OSError as e:
            problems.append(CDIProblem("unreadable", f"CDI spec directory {d}: {e.strerror or e}"))
            continue
        for name in names:
            path = Path(d) / name
            if not name.endswith(_SPEC_SUFFIXES) or not path.is_file():
                continue
            try:
                with open(path, "rb") as f:
                    raw = f.read(_MAX_SPEC_BYTES + 1)
                if len(raw) > _MAX_SPEC_BYTES:
                    raise ValueError(f"larger than {_MAX_SPEC_BYTES} bytes")
            except (OSError, ValueError) as e:
                problems.append(CDIProblem("unreadable", f"CDI spec {path}: {getattr(e, 'strerror', None) or e}"))
                continue
            try:
                doc = json.loads(raw) if name.endswith(".json") else yaml.safe_load(raw)
                kind, devs = _parse_spec(doc, str(path))
            except (ValueError, yaml.YAMLError) as e:
                problems.append(CDIProblem("invalid", f"CDI spec {path}: {str(e).splitlines()[0] if str(e) else e}"))
                continue
            devices.setdefault(kind, {}).update(devs)
    return CDISpecs(devices, tuple(problems))


def resolve(names: Iterable[str], specs: CDISpecs) -> CDIResolution:
    """The host paths of the device nodes of the CDI devices ``names`` (in order, without repeats). The specs'
    own problems are reported only when a name could not be resolved (an unreadable spec may have held it)."""
    paths: dict[str, None] = {}
    problems: list[CDIProblem] = []
    for name in names:
        m = _NAME.match(name)
        if not m:
            problems.append(CDIProblem("malformed", f"CDI device {name!r} is not vendor.com/class=name"))
            continue
        kind, device = m.group("kind"), m.group("device")
        of_kind = specs.devices.get(kind, {})
        if device in of_kind:
            found = of_kind[device]
        elif device == "all" and of_kind:
            found = tuple(p for dev in of_kind.values() for p in dev)
        else:
            problems.append(CDIProblem("unknown", f"CDI device {name!r} is in no readable spec"))
            continue
        paths.update(dict.fromkeys(found))
    if any(p.reason == "unknown" for p in problems):
        problems.extend(specs.problems)
    return CDIResolution(tuple(paths), tuple(problems))


def cdi_numa_nodes(names: Sequence[str], sysfs: str | os.PathLike[str] = "/sys",
                   spec_dirs: Sequence[str | os.PathLike[str]] = DEFAULT_SPEC_DIRS,
                   ) -> tuple[dict[str, frozenset[int]], tuple[CDIProblem, ...]]:
    """``({host path: NUMA nodes}, problems)`` for the CDI devices ``names``: their device nodes with a NUMA node,
    keyed as ``devices_numa_nodes`` keys CRI's ``devices`` (a node named both ways is one device)."""
    if not names:
        return {}, ()
    found = resolve(names, load_specs(spec_dirs))
    return devices_numa_nodes(found.host_paths, sysfs), found.problems
