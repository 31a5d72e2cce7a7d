"""What the node agent wants a container's own resources to be, in numapin's terms: the answer a door puts on the
container (the proxy in the CRI message it forwards, the NRI plugin in its adjustment)."""

from __future__ import annotations

from dataclasses import dataclass

from allocator.cpuset import CPUSet

__all__ = ["TargetResources"]


@dataclass(frozen=True)
class TargetResources:
    """``cpuset.cpus``; ``cpuset.mems`` (None: as the caller sent them); ``lift_quota``: the container runs without a
    CFS quota (``cpu_quota`` -1, a pinned container's); every other resource as the caller sent it."""

    cpus: CPUSet
    mems: CPUSet | None
    lift_quota: bool
