"""One logical CPU's place in the machine: its core, socket, NUMA node and uncore (L3 cache) ids."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CPUInfo"]


@dataclass(frozen=True, slots=True)
class CPUInfo:
    cpu: int
    core: int
    socket: int
    numa: int
    uncore: int
