"""The memory side of an in-place resize: a running container's memory limit changes and its bytes are accounted
again in its NUMA nodes.

The container's blocks are given back and taken again for the new size on the same nodes (its cpuset.mems); when
those nodes cannot hold the new size, they are extended as kubelet extends a topology hint (the best calculated
hint containing them: the narrowest) under kubelet's group rules; when no placement exists the resize is refused
and nothing changes. Huge pages cannot be resized (Kubernetes does not allow it): a resize that changes them is
refused. kubelet's own static policy refuses every memory resize of a Guaranteed pod (feature gate
``InPlacePodVerticalScalingExclusiveMemory``); numapin accounts it instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..bitmask import bits_of
from ..pod import PodInfo
from .policy import MemoryPolicy, fill, release, violates_groups
from .quantity_text import ByteQuantity
from .resources import MEMORY
from .state import Block, MemoryState

__all__ = ["MemoryResize", "plan_memory_resize"]


@dataclass(frozen=True)
class MemoryResize:
    """The outcome: admitted or refused (``reason`` ``Deferred``: it may fit later; ``Infeasible``: never on this
    node), the container's NUMA nodes and memory bytes before and after (None: not accounted)."""

    uid: str
    container: str
    admitted: bool
    reason: str | None
    message: str
    mems_before: tuple[int, ...]
    mems_after: tuple[int, ...]
    bytes_before: int | None
    bytes_after: int | None

    @property
    def changed(self) -> bool:
        return self.admitted and (self.mems_before, self.bytes_before) != (self.mems_after, self.bytes_after)

    def to_dict(self) -> dict[str, Any]:
        return {"uid": self.uid, "container": self.container, "admitted": self.admitted, "reason": self.reason,
                "message": self.message, "memsBefore": list(self.mems_before), "memsAfter": list(self.mems_after),
                "bytesBefore": self.bytes_before, "bytesAfter": self.bytes_after}


def _gi(n: int) -> str:
    return str(ByteQuantity(n, True))


def plan_memory_resize(policy: MemoryPolicy, state: MemoryState, pod: PodInfo, name: str
                       ) -> tuple[MemoryResize, MemoryState | None]:
    """Decide the resize of container ``name`` of ``pod`` (its model with the new limits). Returns the outcome and,
    when admitted with a change, the new state (``state`` itself is never changed)."""
    c = pod.container(name)
    req = policy.requested(pod, c)
    held = state.blocks(pod.uid, name)
    before = state.nodes_of(pod.uid, name)
    old_bytes = next((b.size for b in held or () if b.resource == MEMORY), None)

    def outcome(admitted: bool, reason: str | None, message: str, after: tuple[int, ...] = before,
                new_bytes: int | None = old_bytes) -> MemoryResize:
        return MemoryResize(pod.uid, name, admitted, reason, message, before, after, old_bytes, new_bytes)

    where = f"container {name!r} of pod {pod.ref}"
    if held is None:
        if not req:
            return outcome(True, None, f"{where}: its memory is not accounted per NUMA node"), None
        return outcome(False, "Deferred", f"{where} holds no memory yet: admit it before resizing it"), None
    old = {b.resource: b.size for b in held}
    if set(old) != set(req) or any(old[r] != q for r, q in req.items() if r != MEMORY):
        return outcome(False, "Infeasible", f"{where}: huge pages cannot be resized in place "
                                            f"(held {sorted(old.items())}, asked {sorted(req.items())})"), None
    new_bytes = req.get(MEMORY)
    if new_bytes == old_bytes:
        return outcome(True, None, f"{where}: memory unchanged ({_gi(old_bytes or 0)})"), None
    work = state.copy()
    work.reuse_pod, work.reuse = None, {}  # a resize reuses no init-container memory
    for b in held:
        release(work, b)
    work.delete(pod.uid, name)
    mask = 0
    for n in before:
        mask |= 1 << n
    target = mask
    refusal = ""
    if not policy.fits(work, mask, req):
        extended = policy.best_hint(work, pod, req, within=mask)
        if extended is None:
            refusal = "no wider set of NUMA nodes holding it is allowed by the memory manager's rules"
        else:
            target = extended.mask
    bits = tuple(bits_of(target))
    if not refusal and violates_groups(work, list(bits)):
        refusal = (f"NUMA nodes {list(bits)} would hold it, but some of them already serve other containers "
                   f"alone or in another group")
    if refusal:
        free = {n: _gi(s.table(MEMORY).free) for n, s in sorted(work.machine.items())}
        total = sum(s.table(MEMORY).allocatable for s in state.machine.values())
        reason = "Infeasible" if (new_bytes or 0) > total else "Deferred"
        return outcome(False, reason, f"{where}: memory {_gi(old_bytes or 0)} -> {_gi(new_bytes or 0)} does not fit "
                                      f"its NUMA nodes {list(before)} (free memory per NUMA node with its own given "
                                      f"back: {free}) and {refusal}"), None
    blocks = tuple(Block(bits, r, q) for r, q in req.items())
    for b in blocks:
        fill(work, bits, b.resource, b.size)
    work.set_blocks(pod.uid, name, blocks)
    grown = "" if bits == before else f", NUMA nodes {list(before)} -> {list(bits)}"
    return (outcome(True, None, f"{where}: memory {_gi(old_bytes or 0)} -> {_gi(new_bytes or 0)}{grown}", bits,
                    new_bytes), work)
