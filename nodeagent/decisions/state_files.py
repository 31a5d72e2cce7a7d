"""The proxy's two checkpoints as one pair: ``cpu_manager_state`` and, with ``memoryManagerPolicy: Static``,
``memory_manager_state`` (kubelet's formats, in numapin's state directory, never at kubelet's paths).

Order of writes: the memory file first, then the CPU file, both before the runtime hears of a decision. A kill -9
between the two leaves at most the decision being made in one file only; the start-up reconcile then drops every
entry, in either file, of a container the runtime does not have (nodeagent/decisions/reconcile.py), which is exactly
that decision (it was never forwarded). A memory file that does not add up (its machine state differs from what
its entries sum to, or from the machine numapin finds: other memory, other reservations) or is corrupt refuses
the start and is left untouched, with kubelet's message and the first difference, as kubelet refuses its own
(docs/memory.md "State file").
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from allocator.checkpoint import CheckpointStore, import_kubelet_state
from allocator.errors import CheckpointError
from allocator.memory.checkpoint import MemoryCheckpointStore, import_kubelet_memory_state
from allocator.memory.state import MemoryState
from allocator.node import NodeAllocator, NodeParts

__all__ = ["StateFiles", "save_pair"]

log = logging.getLogger("numapin.criproxy")


def save_pair(cpu: CheckpointStore, memory: MemoryCheckpointStore | None, allocator: NodeAllocator) -> None:
    """Write the allocator's memory state (if accounted) and then its CPU state, atomically each."""
    if memory is not None and allocator.memory_state is not None:
        memory.save(allocator.memory_state)
    cpu.save(allocator.state)


@dataclass(frozen=True)
class StateFiles:
    cpu: CheckpointStore
    memory: MemoryCheckpointStore | None  # None: memoryManagerPolicy None (memory not accounted)

    @classmethod
    def of(cls, state_file: Path, memory_state_file: Path, parts: NodeParts) -> StateFiles:
        memory = MemoryCheckpointStore(memory_state_file) if parts.memory_policy is not None else None
        return cls(CheckpointStore(state_file, "numapin"), memory)

    def clean_leftovers(self) -> list[Path]:
        """Temp files of writes a kill interrupted, removed (both files' directories)."""
        removed = self.cpu.clean_leftovers()
        if self.memory is not None:
            removed += CheckpointStore(self.memory.path, "numapin").clean_leftovers()
        return removed

    def load(self, parts: NodeParts, *, kubelet_cpu: str | None = None,
             kubelet_memory: str | None = None) -> NodeAllocator:
        """The allocator from the saved pair (or kubelet's files, imported once when numapin has none yet).
        CheckpointError when a file cannot be trusted or does not fit the node."""
        state = self.cpu.load()
        if state is None and kubelet_cpu:
            state = import_kubelet_state(kubelet_cpu)
            log.info("imported kubelet's CPU manager state from %s", kubelet_cpu)
        memory: MemoryState | None = None
        if self.memory is not None:
            memory = self.memory.load()
            if memory is None and kubelet_memory:
                memory = import_kubelet_memory_state(kubelet_memory)
                log.info("imported kubelet's Memory Manager state from %s", kubelet_memory)
        elif kubelet_memory:
            raise CheckpointError(f"import-kubelet-memory-state {kubelet_memory}: numapin's memory manager policy is "
                                  f"None; start it with --memory-manager-policy Static to import kubelet's memory "
                                  f"state")
        try:
            return NodeAllocator(parts, state, memory)
        except CheckpointError as e:
            if self.memory is None or not str(e).startswith("[memorymanager]"):
                raise
            raise CheckpointError(f"{self.memory.path}: {e}") from None

    def save(self, allocator: NodeAllocator) -> None:
        save_pair(self.cpu, self.memory, allocator)
