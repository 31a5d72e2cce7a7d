"""kubelet's configuration on the node, as far as the proxy can see it, checked for drift from what numapin needs.

numapin needs kubelet with ``cpuManagerPolicy: none`` and ``memoryManagerPolicy: None`` (the proxy is the only writer
of cpusets) and with the proxy as its container runtime endpoint. An upgrade can undo either (``kubeadm upgrade
node`` rewrites ``/var/lib/kubelet/config.yaml``). What is read, each source optional:

- kubelet's process (``<proc>/<pid>/comm`` is ``kubelet``): its flags ``--config``, ``--root-dir``,
  ``--container-runtime-endpoint``, ``--cpu-manager-policy``, ``--memory-manager-policy`` (flags win over the file;
  the paths it names are read through ``<proc>/<pid>/root``, so a proxy in a container with the host's PID namespace
  reads the host's files);
- ``<root dir>/kubeadm-flags.env`` (``KUBELET_KUBEADM_ARGS="..."``): the same flags, as kubeadm writes them;
- the config file (``--kubelet-config``, default ``/var/lib/kubelet/config.yaml``; the process's ``--config`` when
  seen): ``cpuManagerPolicy``, ``memoryManagerPolicy``, ``containerRuntimeEndpoint``;
- kubelet's state files ``<root dir>/cpu_manager_state`` and ``memory_manager_state``: their ``policyName`` says
  which policy kubelet ran with when it last wrote them.

A static CPU or Memory Manager is a ``fight`` (two writers of cpusets); a runtime endpoint that is not the proxy's
socket means kubelet's calls bypass the proxy. A source that is missing is no finding; one that cannot be read or
parsed is a note. ``check_kubelet`` does the reading (blocking: call it off the event loop).
"""

from __future__ import annotations

import json
import os
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["CPU_STATIC", "ENDPOINT", "FIGHTS", "MEMORY_STATIC", "DriftProblem", "DriftReport", "KubeletPaths",
           "check_kubelet", "same_socket"]

CPU_STATIC = "cpu-manager-static"
MEMORY_STATIC = "memory-manager-static"
ENDPOINT = "runtime-endpoint"
FIGHTS = (CPU_STATIC, MEMORY_STATIC)  # kubelet writes cpusets too: numapin's new exclusive admissions stop
_FLAGS = ("config", "root-dir", "container-runtime-endpoint", "cpu-manager-policy", "memory-manager-policy")
_MAX_FILE = 1 << 20


@dataclass(frozen=True)
class KubeletPaths:
    """Where kubelet's configuration is looked for (``root_dir`` is replaced by a ``--root-dir`` flag when seen)."""

    config: str = "/var/lib/kubelet/config.yaml"
    root_dir: str = "/var/lib/kubelet"
    proc_root: str = "/proc"


@dataclass(frozen=True)
class DriftProblem:
    """One drift: ``kind`` (``CPU_STATIC``, ``MEMORY_STATIC``, ``ENDPOINT``), where it was seen, and what it says."""

    kind: str
    source: str
    detail: str

    def to_dict(self) -> dict[str, str]:
        return {"kind": self.kind, "source": self.source, "detail": self.detail}


@dataclass(frozen=True)
class DriftReport:
    """The problems found and notes on what could not be read (``sources``: what was read)."""

    problems: tuple[DriftProblem, ...] = ()
    notes: tuple[str, ...] = ()
    sources: tuple[str, ...] = field(default=())

    @property
    def fights(self) -> tuple[DriftProblem, ...]:
        """The problems that make kubelet a second writer of cpusets."""
        return tuple(p for p in self.problems if p.kind in FIGHTS)

    def refusal(self) -> str | None:
        """Why new exclusive admissions are refused now (None: they are not)."""
        if not self.fights:
            return None
        return "kubelet would write cpusets too (" + "; ".join(p.detail for p in self.fights) + ")"

    def to_dict(self) -> dict[str, Any]:
        return {"problems": [p.to_dict() for p in self.problems], "notes": list(self.notes),
                "sources": list(self.sources), "refusingExclusive": bool(self.fights)}


def _read_small(path: Path) -> bytes | None:
    """A file's bytes (at most 1 MiB read); None when it does not exist; OSError otherwise."""
    try:
        with open(path, "rb") as f:
            return f.read(_MAX_FILE)
    except (FileNotFoundError, NotADirectoryError):
        return None


def _flags(args: Sequence[str]) -> dict[str, str]:
    """kubelet's flags of interest from an argument list (``--x=v`` or ``--x v``); the last one wins, as in Go."""
    out: dict[str, str] = {}
    for i, a in enumerate(args):
        if not a.startswith("--"):
            continue
        name, sep, value = a[2:].partition("=")
        if name not in _FLAGS:
            continue
        if not sep:
            if i + 1 >= len(args):
                continue
            value = args[i + 1]
        out[name] = value
    return out


def _kubelet_processes(proc: Path) -> list[tuple[int, list[str]]]:
    out = []
    try:
        entries = list(proc.iterdir())
    except OSError:
        return []
    for p in entries:
        if not p.name.isdigit():
            continue
        try:
            if (p / "comm").read_text().strip() != "kubelet":
                continue
            args = (p / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        out.append((int(p.name), [a.decode(errors="replace") for a in args if a]))
    return out


def _socket_path(endpoint: str) -> str:
    e = endpoint.strip()
    for prefix in ("unix://", "unix:"):
        if e.startswith(prefix):
            return e[len(prefix):]
    return e


def same_socket(endpoint: str, listen: str) -> bool:
    """Whether a runtime endpoint (``unix:///path`` or a path) names the proxy's socket ``listen`` (symbolic links
    and ``/var/run`` -> ``/run`` followed; the same file when both exist)."""
    a, b = _socket_path(endpoint), _socket_path(listen)
    if a == b:
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


def _policy_from_state(text: bytes) -> str:
    doc = json.loads(text)
    if not isinstance(doc, Mapping) or not isinstance(doc.get("policyName"), str):
        raise ValueError("no policyName")
    return str(doc["policyName"])


def check_kubelet(paths: KubeletPaths, listen: str) -> DriftReport:
    """Read what can be seen of kubelet's configuration and report its drift from what numapin needs (``listen``:
    the proxy's CRI socket)."""
    problems: list[DriftProblem] = []
    notes: list[str] = []
    sources: list[str] = []
    flags: dict[str, str] = {}
    flag_source = ""
    procs = _kubelet_processes(Path(paths.proc_root))
    if len(procs) > 1:
        notes.append(f"{len(procs)} kubelet processes; the flags of pid {procs[0][0]} are read")
    seen_root = ""  # kubelet's file system as the proxy sees it, for the paths of its process's flags
    proc_flags: dict[str, str] = {}
    if procs:
        pid, args = procs[0]
        proc_flags, flag_source = _flags(args[1:]), f"kubelet's flags (pid {pid})"
        flags = dict(proc_flags)
        sources.append(flag_source)
        seen_root = str(Path(paths.proc_root) / str(pid) / "root")

    def seen(flag: str, default: str) -> Path:
        if flag in proc_flags:
            return Path(seen_root + proc_flags[flag])
        return Path(flags.get(flag) or default)

    root = seen("root-dir", paths.root_dir)
    env_path = root / "kubeadm-flags.env"
    try:
        env = _read_small(env_path)
        if env is not None:
            sources.append(str(env_path))
            for line in env.decode(errors="replace").splitlines():
                key, sep, value = line.partition("=")
                if sep and key.strip() == "KUBELET_KUBEADM_ARGS":
                    from_env = _flags(shlex.split(value.strip().strip('"').strip("'")))
                    flags = {**from_env, **flags}  # the running process's own flags win
                    flag_source = flag_source or str(env_path)
    except (OSError, ValueError) as e:
        notes.append(f"{env_path}: cannot be read ({e})")

    config_path = seen("config", paths.config)
    config: Mapping[str, Any] = {}
    import yaml  # off the proxy's import path (test_lean_import); imported once a check runs

    try:
        raw = _read_small(config_path)
        if raw is not None:
            doc = yaml.safe_load(raw)
            if not isinstance(doc, Mapping):
                raise ValueError("not a mapping")
            config = doc
            sources.append(str(config_path))
    except (OSError, ValueError, yaml.YAMLError) as e:
        notes.append(f"{config_path}: cannot be read as kubelet's configuration ({str(e).splitlines()[0]})")

    def setting(flag: str, key: str) -> tuple[str | None, str]:
        if flag in flags:
            return flags[flag], f"{flag_source} --{flag}"
        value = config.get(key)
        return (str(value), f"{config_path} {key}") if value is not None else (None, "")

    cpu, where = setting("cpu-manager-policy", "cpuManagerPolicy")
    if cpu is not None and cpu.lower() == "static":
        problems.append(DriftProblem(CPU_STATIC, where, f"kubelet's CPU Manager policy is static ({where})"))
    mem, where = setting("memory-manager-policy", "memoryManagerPolicy")
    if mem is not None and mem.lower() == "static":
        problems.append(DriftProblem(MEMORY_STATIC, where, f"kubelet's Memory Manager policy is Static ({where})"))
    for name, kind, what in (("cpu_manager_state", CPU_STATIC, "CPU"), ("memory_manager_state", MEMORY_STATIC,
                                                                         "Memory")):
        state = root / name
        try:
            raw = _read_small(state)
            if raw is None:
                continue
            sources.append(str(state))
            policy = _policy_from_state(raw)
        except (OSError, ValueError) as e:
            notes.append(f"{state}: cannot be read ({e})")
            continue
        if policy.lower() == "static" and not any(p.kind == kind for p in problems):
            problems.append(DriftProblem(kind, str(state), f"kubelet's {what} Manager state file {state} says "
                                         f"{policy}: kubelet ran with that policy when it last wrote it"))

    endpoint, where = setting("container-runtime-endpoint", "containerRuntimeEndpoint")
    if endpoint is None and config and flag_source:
        endpoint, where = "unix:///run/containerd/containerd.sock", "kubelet's default"
    if endpoint is not None and not same_socket(endpoint, listen):
        problems.append(DriftProblem(ENDPOINT, where, f"kubelet's container runtime endpoint is {endpoint} "
                                     f"({where}), not numapin's {listen}: its calls bypass the proxy"))
    elif endpoint is None and config:
        notes.append(f"kubelet's runtime endpoint is neither in {config_path} nor in flags the proxy can see")
    return DriftReport(tuple(problems), tuple(notes), tuple(sources))
