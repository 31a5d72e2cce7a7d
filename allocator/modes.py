"""numapin's container modes, each name with one meaning (the spellings are the wire and state-file format).

Crane's pod annotation ``qos.gocrane.io/cpu-manager`` asks for one of ``CPUManagerAnnotation``:

- ``none``: no CPUs of its own, even for a Guaranteed pod;
- ``exclusive``: CPUs of its own, taken out of the shared pool;
- ``share``: CPUs of its own that *stay in* the shared pool (other containers may run on them too).

What a container ends up with is a ``ContainerMode``: a ``PinnedMode`` (``exclusive`` or ``share``, as above:
the state file records these per container) or ``shared`` -- no CPUs of its own, it runs on the shared pool.
``share`` (a pinned mode) and ``shared`` (the pool) differ by one letter: use the constants below.
"""

from __future__ import annotations

from typing import Final, Literal

__all__ = [
    "ANNOTATION_NONE",
    "CPU_MANAGER_VALUES",
    "EXCLUSIVE",
    "PINNED_MODES",
    "SHARE",
    "SHARED_POOL",
    "CPUManagerAnnotation",
    "ContainerMode",
    "PinnedMode",
]

CPUManagerAnnotation = Literal["none", "exclusive", "share"]
PinnedMode = Literal["exclusive", "share"]
ContainerMode = Literal["exclusive", "share", "shared"]

ANNOTATION_NONE: Final = "none"
EXCLUSIVE: Final = "exclusive"  # own CPUs, out of the shared pool
SHARE: Final = "share"  # own CPUs, still in the shared pool (Crane's share)
SHARED_POOL: Final = "shared"  # no CPUs of its own: runs on the shared pool

CPU_MANAGER_VALUES: tuple[CPUManagerAnnotation, ...] = (ANNOTATION_NONE, EXCLUSIVE, SHARE)
PINNED_MODES: tuple[PinnedMode, ...] = (EXCLUSIVE, SHARE)
