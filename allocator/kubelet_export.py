"""numapin's state as kubelet's own checkpoints, for a node going back to kubelet's static policy without a drain.

The way back of ``import_kubelet_state`` (allocator.checkpoint): kubelet's ``cpu_manager_state`` for its ``static``
CPU manager policy, ``policyName`` ``static``, ``defaultCpuSet``, ``entries`` (pod UID -> container -> CPUs) and
kubelet's checksum, laid out as kubelet's ``json.Marshal`` writes it, with nothing of numapin's. That is kubelet's V2
checkpoint, which every kubelet reads (kubelets with the ``PodLevelResourceManagers`` feature load it as their V3 with
no pod-level entries, and write V3 from then on).

What kubelet's static policy has no word for is settled here:

- ``exclusive`` containers are entries with their CPUs: they keep running where they run;
- ``share`` containers (own CPUs that stay in numapin's shared pool) are entries too by default (``share="keep"``):
  they keep their CPUs, which leave the shared pool at kubelet's first reconcile; with ``share="release"`` they are
  left out and their CPUs go back to ``defaultCpuSet`` (kubelet moves them onto its shared pool);
- numapin's pod modes (``numapin.podModes``) and its per-container modes do not travel: kubelet's rule decides
  for pods admitted after the switch.

The result is checked with kubelet's own start-up rules (``StaticPolicy.start``, kubelet's ``validateState``) for the
node's topology, reserved CPUs and policy options before any byte is written: a state kubelet would refuse is
refused here with kubelet's reason.

kubelet's ``memory_manager_state`` (its ``Static`` memory manager policy) is the second file of the way back; it
joins this module once the proxy keeps numapin's memory state (``allocator.memory``, already kubelet's format): a
function beside :func:`kubelet_cpu_checkpoint` taking that state and the node's ``MemoryPolicy``, checking it as
kubelet does at a restart and returning kubelet's bytes (``serialize_memory_checkpoint``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal

from .checkpoint import checkpoint_checksum
from .cpuset import CPUSet
from .errors import CheckpointError
from .modes import SHARE
from .state import CPUState
from .static_policy import StaticPolicy

__all__ = ["KUBELET_STATIC_POLICY", "KubeletCPUExport", "kubelet_cpu_checkpoint", "kubelet_cpu_state"]

KUBELET_STATIC_POLICY = "static"
ShareHandling = Literal["keep", "release"]
Containers = tuple[tuple[str, str, CPUSet], ...]  # (pod UID, container name, CPUs)


@dataclass(frozen=True)
class KubeletCPUExport:
    """kubelet's ``cpu_manager_state`` for ``state``: the file's bytes and what went into it."""

    data: bytes
    default_cpuset: CPUSet
    entries: dict[str, dict[str, CPUSet]]
    released: Containers  # share containers left to kubelet's shared pool (release)
    kept_share: Containers  # share containers exported with their CPUs (keep)


def kubelet_cpu_state(state: CPUState, *, share: ShareHandling = "keep") -> tuple[CPUState, Containers]:
    """The state kubelet's static policy would hold: every exported container ``exclusive``; the ``share``
    containers released to the default set (``share="release"``) are returned beside it."""
    out = CPUState(default_cpuset=state.default_cpuset)
    released: list[tuple[str, str, CPUSet]] = []
    for uid, containers in sorted(state.assignments.items()):
        for name, cpus in sorted(containers.items()):
            if state.mode(uid, name) == SHARE and share == "release":
                released.append((uid, name, cpus))
                out.default_cpuset = out.default_cpuset | cpus
            elif cpus:
                out.set(uid, name, cpus)
    return out, tuple(released)


def _kubelet_bytes(default_cpuset: CPUSet, entries: dict[str, dict[str, CPUSet]]) -> bytes:
    text_entries = {uid: {name: str(cpus) for name, cpus in sorted(cs.items())} for uid, cs in sorted(entries.items())}
    default_text = str(default_cpuset)
    # kubelet's json.Marshal: fields in struct order, entries omitted when empty, map keys sorted
    doc: dict[str, object] = {"policyName": KUBELET_STATIC_POLICY, "defaultCpuSet": default_text}
    if text_entries:
        doc["entries"] = text_entries
    doc["checksum"] = checkpoint_checksum(KUBELET_STATIC_POLICY, default_text, text_entries)
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode()


def kubelet_cpu_checkpoint(state: CPUState, policy: StaticPolicy, *, share: ShareHandling = "keep"
                           ) -> KubeletCPUExport:
    """kubelet's ``cpu_manager_state`` (static policy) for numapin's ``state`` on the node ``policy`` describes
    (its topology, reserved CPUs and options: kubelet's configuration after the switch). Raises CheckpointError with
    kubelet's reason when kubelet would refuse the file."""
    if share not in ("keep", "release"):
        raise ValueError(f"share must be 'keep' or 'release', got {share!r}")
    exported, released = kubelet_cpu_state(state, share=share)
    check = exported.copy()
    try:
        policy.start(check)  # kubelet's validateState, on a copy (it fills an empty state in)
    except CheckpointError as e:
        raise CheckpointError(
            f"kubelet's static policy would refuse this state at start ({e}); nothing was written. Give the reserved "
            f"CPUs and policy options kubelet will run with (they must be the proxy's), and check the state with "
            f"`numapin status`"
        ) from None
    if check.default_cpuset != exported.default_cpuset:  # an empty state: kubelet starts from its initial set
        exported.default_cpuset = check.default_cpuset
    kept = tuple((uid, name, cpus) for uid, cs in sorted(exported.assignments.items())
                 for name, cpus in sorted(cs.items()) if state.mode(uid, name) == SHARE)
    entries = {uid: dict(cs) for uid, cs in exported.assignments.items()}
    return KubeletCPUExport(_kubelet_bytes(exported.default_cpuset, entries), exported.default_cpuset, entries,
                            released, kept)
