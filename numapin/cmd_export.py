"""``numapin export-kubelet-state``: write kubelet's own checkpoints from numapin's state, for a node going back to
kubelet's static policy without a drain (the way back of ``numapin criproxy --import-kubelet-state``)."""

from __future__ import annotations

import argparse
import json
import socket
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HELP = ("write kubelet's cpu_manager_state (static policy) and memory_manager_state (Static) from numapin's state: "
        "back to kubelet without a drain")
DESCRIPTION = """\
Write kubelet's CPU manager checkpoint for its static policy (policyName "static", kubelet's checksum) from numapin's
state, so that kubelet with cpuManagerPolicy: static takes over the node's pinned containers where they run: no
drain, no restart. Run it as root on the node with kubelet and numapin's proxy stopped (docs/node.md, "Back to
kubelet's static policy").

The node's settings are the proxy's: give the proxy's --config file and/or the same flags (--reserved-cpus,
--cpu-manager-policy-options, ...). kubelet must then run with the same reservedSystemCPUs, cpuManagerPolicyOptions
and topology manager settings; the command prints them. The result is checked with kubelet's own start-up rules for
this machine before anything is written.

  exclusive containers      kubelet entries with their CPUs
  share containers          --share keep (default): entries with their CPUs (they leave the shared pool at kubelet's
                            first reconcile); --share release: left out, their CPUs return to kubelet's shared pool

With the proxy's memoryManagerPolicy Static (--memory-manager-policy Static and the same --reserved-memory,
--system-reserved, --kube-reserved, --eviction-hard, or its --config file), kubelet's Memory Manager checkpoint
(policyName "Static", kubelet's checksum, without numapin's own field) goes to --memory-out as well: every container's
memory blocks where they are, checked with kubelet's restart check (the machine state must add up to the entries
and fit this machine's memory); kubelet must then run with memoryManagerPolicy: Static and the same reservedMemory.

No file is written while the proxy still answers on --listen (it could change the state after the export), nor
over an existing checkpoint other than kubelet's "none" (CPU) or "None" (memory) policy's (--force to replace
them); when the memory file is refused, the CPU file is not written either.

Exit status: 0 written (or shown, --dry-run), 1 refused (kubelet would refuse the state, the proxy runs, the file
exists), 2 bad arguments or an unreadable state.
"""

DEFAULT_OUT = "/var/lib/kubelet/cpu_manager_state"
DEFAULT_MEMORY_OUT = "/var/lib/kubelet/memory_manager_state"

# the proxy's settings that decide what kubelet accepts (flag, ProxyConfig field)
_NODE_FLAGS = (
    ("--state-dir", "state_dir", "the proxy's --state-dir (default /var/lib/numapin)"),
    ("--sysfs", "sysfs", "sysfs root of this machine (default /sys)"),
    ("--reserved-cpus", "reserved_cpus", "the proxy's reserved CPUs: kubelet's reservedSystemCPUs"),
    ("--num-reserved-cpus", "num_reserved_cpus", "the proxy's --num-reserved-cpus"),
    ("--cpu-manager-policy-options", "cpu_manager_policy_options", "the proxy's (and kubelet's) CPU manager options"),
    ("--topology-manager-policy", "topology_manager_policy", "the proxy's topology manager policy"),
    ("--topology-manager-scope", "topology_manager_scope", "the proxy's topology manager scope"),
    ("--topology-manager-policy-options", "topology_manager_policy_options", "the proxy's topology manager options"),
    ("--listen", "listen", "the proxy's CRI socket: nothing is written while it answers"),
    ("--memory-manager-policy", "memory_manager_policy", "the proxy's memory manager policy (Static: the memory "
                                                         "checkpoint is written too)"),
    ("--reserved-memory", "reserved_memory", "the proxy's (and kubelet's) reserved memory per NUMA node"),
    ("--system-reserved", "system_reserved", "the proxy's --system-reserved"),
    ("--kube-reserved", "kube_reserved", "the proxy's --kube-reserved"),
    ("--eviction-hard", "eviction_hard", "the proxy's --eviction-hard"),
)


@dataclass(frozen=True)
class KubeletFile:
    """One of kubelet's checkpoints this command writes: its option, default path and what goes in it (the CPU
    manager's always; the Memory Manager's when the proxy's memory manager policy is Static)."""

    option: str
    dest: str
    default: str
    what: str


KUBELET_FILES = (KubeletFile("--out", "out", DEFAULT_OUT, "kubelet's CPU manager checkpoint"),
                 KubeletFile("--memory-out", "memory_out", DEFAULT_MEMORY_OUT,
                             "kubelet's Memory Manager checkpoint (with --memory-manager-policy Static)"))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE", help="the proxy's --config file (YAML/JSON)")
    for flag, dest, help_text in _NODE_FLAGS:
        parser.add_argument(flag, dest=dest, default=None, help=help_text)
    for f in KUBELET_FILES:
        parser.add_argument(f.option, dest=f.dest, default=f.default, metavar="FILE",
                            help=f"where {f.what} goes (default {f.default})")
    parser.add_argument("--share", choices=("keep", "release"), default="keep",
                        help="share-mode containers: keep their CPUs as kubelet entries (default) or release them "
                             "to kubelet's shared pool")
    parser.add_argument("--force", action="store_true", help="replace an existing checkpoint of another policy")
    parser.add_argument("--dry-run", action="store_true", help="check and show, write nothing")
    parser.add_argument("--format", choices=("text", "json"), default="text", help="output format (default text)")


def _fail(msg: str, code: int) -> int:
    print(f"numapin export-kubelet-state: {msg}", file=sys.stderr)
    return code


def proxy_answers(path: str) -> bool:
    """Whether something accepts connections on the unix socket ``path`` (a stale socket file does not)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(1.0)
        try:
            s.connect(path)
        except OSError:
            return False
    return True


def replaceable(path: Path, *, memory: bool = False) -> str | None:
    """None when ``path`` may be written (absent, or an empty checkpoint of kubelet's "none" CPU policy, or of its
    "None" memory policy with ``memory``), else why not."""
    from allocator.checkpoint import parse_checkpoint
    from allocator.errors import CheckpointError
    from allocator.memory.checkpoint import parse_memory_checkpoint

    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as e:
        return f"cannot read {path}: {e.strerror or e}"
    try:
        if memory:
            policy, state = parse_memory_checkpoint(data, str(path))
            empty = not state.assignments
        else:
            cp = parse_checkpoint(data, str(path))
            policy, empty = cp.policy_name, not cp.entries
    except CheckpointError:
        return f"{path} exists and is not a valid kubelet checkpoint"
    if policy == ("None" if memory else "none") and empty:
        return None
    return f"{path} exists and holds policy {policy!r}"


@dataclass(frozen=True)
class MemoryExport:
    """kubelet's Memory Manager checkpoint made from numapin's memory state."""

    data: bytes
    containers: int
    pods: int
    settings: dict[str, Any]


def memory_export(config: Any, parts: Any) -> MemoryExport | str:
    """kubelet's ``memory_manager_state`` from numapin's, checked with kubelet's restart check for this node; the
    reason as text when it cannot be made."""
    from allocator.errors import CheckpointError
    from allocator.memory.checkpoint import POLICY_NAME, MemoryCheckpointStore, serialize_memory_checkpoint
    from allocator.memory.reserved import reservations_to_json

    try:
        state = MemoryCheckpointStore(config.memory_state_file).load()
    except CheckpointError as e:
        return str(e)
    if state is None:
        return f"{config.memory_state_file}: no numapin memory state (is --state-dir the proxy's?)"
    try:
        parts.memory_policy.start(state.copy())  # kubelet's check at its start: the machine state adds up
    except CheckpointError as e:
        return f"{config.memory_state_file}: kubelet's Memory Manager would refuse it: {e}"
    settings: dict[str, Any] = {"memoryManagerPolicy": POLICY_NAME,
                                "reservedMemory": reservations_to_json(config.reserved_memory)}
    for key, value in (("systemReserved", config.system_reserved), ("kubeReserved", config.kube_reserved)):
        if value:
            settings[key] = dict(value)
    if config.eviction_hard is not None:
        settings["evictionHard"] = {"memory.available": config.eviction_hard}
    return MemoryExport(serialize_memory_checkpoint(state, POLICY_NAME, numapin=False),
                        sum(len(cs) for cs in state.assignments.values()),
                        sum(1 for cs in state.assignments.values() if cs), settings)


def _kubelet_settings(config: Any, reserved: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"cpuManagerPolicy": "static", "reservedSystemCPUs": str(reserved)}
    if config.cpu_manager_policy_options:
        out["cpuManagerPolicyOptions"] = dict(config.cpu_manager_policy_options)
    out["topologyManagerPolicy"] = config.topology_manager_policy
    out["topologyManagerScope"] = config.topology_manager_scope
    if config.topology_manager_policy_options:
        out["topologyManagerPolicyOptions"] = dict(config.topology_manager_policy_options)
    return out


def run(args: argparse.Namespace) -> int:
    from allocator.checkpoint import CheckpointStore, atomic_write
    from allocator.errors import AllocatorError, CheckpointError
    from allocator.kubelet_export import kubelet_cpu_checkpoint
    from criproxy.app import node_parts_of
    from criproxy.config import load_config

    overrides = {dest: getattr(args, dest) for _, dest, _ in _NODE_FLAGS}
    try:
        config = load_config(args.config, overrides)
        parts = node_parts_of(config)
    except (AllocatorError, ValueError) as e:
        return _fail(str(e), 2)
    try:
        state = CheckpointStore(config.state_file, "numapin").load()
    except CheckpointError as e:
        return _fail(str(e), 2)
    if state is None:
        return _fail(f"{config.state_file}: no numapin state (is --state-dir the proxy's?)", 2)
    try:
        export = kubelet_cpu_checkpoint(state, parts.static_policy, share=args.share)
    except CheckpointError as e:
        return _fail(str(e), 1)
    memory = None
    if parts.memory_policy is not None:
        made = memory_export(config, parts)
        if isinstance(made, str):
            return _fail(made, 1)
        memory = made
    out = Path(args.out)
    memory_out = Path(args.memory_out)
    if not args.dry_run:
        if proxy_answers(config.listen):
            return _fail(f"numapin's proxy still answers on {config.listen}: it could change the state after the "
                         f"export. Stop kubelet, then the proxy (systemctl stop numapin-criproxy), and run this "
                         f"again", 1)
        targets = [(memory_out, memory.data, True)] if memory is not None else []
        targets.append((out, export.data, False))  # the memory file first, as the proxy writes the pair
        for path, _, is_memory in targets:
            why = None if args.force else replaceable(path, memory=is_memory)
            if why is not None:
                return _fail(f"{why}; move it away first (kubelet's checkpoint of another policy is refused by "
                             f"kubelet's static policies anyway), or give --force", 1)
        try:
            for path, data, _ in targets:
                path.parent.mkdir(parents=True, exist_ok=True)
                atomic_write(path, data, mode=0o644)
        except (CheckpointError, OSError) as e:
            return _fail(str(e), 1)
    settings = _kubelet_settings(config, parts.static_policy.reserved)
    if memory is not None:
        settings.update(memory.settings)
    pods = len(export.entries)
    containers = sum(len(cs) for cs in export.entries.values())
    if args.format == "json":
        memory_doc = {} if memory is None else {"memoryFile": str(memory_out),
                                                 "memoryCheckpoint": json.loads(memory.data)}
        print(json.dumps({"file": str(out), "written": not args.dry_run, "checkpoint": json.loads(export.data),
                          **memory_doc,
                          "kubeletConfiguration": settings,
                          "released": [{"podUID": u, "container": n, "cpus": str(c)} for u, n, c in export.released],
                          "keptShare": [{"podUID": u, "container": n, "cpus": str(c)} for u, n, c in
                                        export.kept_share]}, indent=1))
        return 0
    verb = "would write" if args.dry_run else "wrote"
    print(f"{verb} {out}: policy static, defaultCpuSet {export.default_cpuset or '(empty)'}, {containers} pinned "
          f"container(s) of {pods} pod(s)")
    for uid, name, cpus in export.kept_share:
        print(f"  share container {name} of pod {uid} keeps CPUs {cpus} (kubelet treats them as exclusive)")
    for uid, name, cpus in export.released:
        print(f"  share container {name} of pod {uid}: CPUs {cpus} returned to kubelet's shared pool")
    if memory is not None:
        print(f"{verb} {memory_out}: policy Static, memory of {memory.containers} container(s) of {memory.pods} "
              f"pod(s) where it is")
    print("kubelet's configuration must say (with the runtime endpoint back on containerd's socket):")
    for key, value in settings.items():
        print(f"  {key}: {json.dumps(value)}")
    return 0
