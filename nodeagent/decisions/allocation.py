"""What the node agent's decisions share (``_Allocation``, the base of ``create._Creates`` and ``pinning.Pinning``): the
allocator's node facade under one asyncio lock, the state pair on disk, the registry, the cpuset pusher and the
shared pool's narrowing, the options and the callbacks that count, and background work.

Every change of the allocation happens under the one lock (the relay of other methods never takes it), is written
to the checkpoint before the runtime hears of it, and is undone and written again when the runtime refuses the
container. Before an exclusive container is created every container of the shared pool has been narrowed; released
CPUs widen the pool again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from allocator.bypass import BypassPolicy
from allocator.checkpoint import CheckpointStore
from allocator.cpuset import CPUSet
from allocator.memory.checkpoint import MemoryCheckpointStore
from allocator.node import NodeAllocator, NodeConfig
from nodeagent.decisions.bypass import BypassRule
from nodeagent.decisions.cri_intent import PodIdentity, SelfPod
from nodeagent.decisions.memory_nodes import MemoryNodes
from nodeagent.decisions.pod_events import EventSink, PodEvent, no_events
from nodeagent.decisions.registry import Registry, TrackedMode
from nodeagent.decisions.state_files import save_pair
from nodeagent.node.cdi import DEFAULT_SPEC_DIRS
from nodeagent.node.cpuset_pusher import CpusetPusher
from nodeagent.ports import RuntimeReader

__all__ = ["PinningOptions"]

log = logging.getLogger("numapin.criproxy")


@dataclass(frozen=True)
class PinningOptions:
    lift_cfs_quota: bool = True          # pinned containers run without a CFS quota (kubelet >= 1.32)
    sysfs: str = "/sys"                  # for device NUMA nodes
    cdi_spec_dirs: tuple[str, ...] = DEFAULT_SPEC_DIRS  # where CDI devices are resolved to device nodes
    self_pod: tuple[str, str] | None = None   # (namespace, name) of the proxy's own pod: passed through
    self_pod_uid: str | None = None
    bypass: BypassPolicy = field(default_factory=BypassPolicy)  # who may bypass numapin (allocator.bypass)


@dataclass(frozen=True, eq=False)
class _Flight:
    """A shared container's create at the runtime, decided with the pool ``cpus``: an admission that takes CPUs
    from the pool waits for it to settle (``create``)."""

    cpus: CPUSet
    settled: asyncio.Event


class _Allocation:
    """The allocation and what changes it; ``pinning.Pinning`` is the whole, with its interceptors."""

    def __init__(self, config: NodeConfig, allocator: NodeAllocator, store: CheckpointStore, pusher: CpusetPusher,
                 registry: Registry, options: PinningOptions = PinningOptions(), *,
                 runtime: RuntimeReader,
                 memory_store: MemoryCheckpointStore | None = None,
                 ready: asyncio.Event | None = None,
                 on_change: Callable[[], None] | None = None,
                 on_admitted: Callable[[TrackedMode], None] | None = None,
                 on_rejected: Callable[[str], None] | None = None,
                 on_bypass_ignored: Callable[[str], None] | None = None,
                 on_narrow: Callable[[float], None] | None = None,
                 on_cdi_problem: Callable[[str], None] | None = None,
                 refuse_exclusive: Callable[[], str | None] | None = None,
                 on_event: EventSink = no_events) -> None:
        self.allocator = allocator
        self.store = store
        self.memory_store = memory_store  # memory_manager_state (memoryManagerPolicy Static), saved with the CPUs'
        self.mems = MemoryNodes(allocator)
        self.pusher = pusher
        self.registry = registry
        self.options = options
        self.runtime = runtime  # what the decisions read of the runtime (a pod's containers, a sandbox)
        self.bypass = BypassRule(SelfPod(options.self_pod, options.self_pod_uid), options.bypass)
        # set once the start-up reconcile has a complete picture: no admission is decided before
        self.ready = ready if ready is not None else _set_event()
        self.lock = asyncio.Lock()  # every change of the allocation (decisions, releases, reconcile)
        # one create at a time per pod, as kubelet's pod worker: pod uid -> (lock, callers holding or waiting)
        self._pod_locks: dict[str, tuple[asyncio.Lock, int]] = {}
        self._flights: list[_Flight] = []  # shared containers whose create is at the runtime
        self._background: set[asyncio.Task[None]] = set()
        # (pod uid, container) decided and at the runtime, not registered yet: reconcile keeps their CPUs
        self.creating: set[tuple[str, str]] = set()
        self.on_change = on_change or (lambda: None)
        self.on_admitted = on_admitted or (lambda mode: None)  # a container created, with its mode
        self.on_rejected = on_rejected or (lambda reason: None)  # a create refused, with kubelet's reason
        self.on_narrow = on_narrow or (lambda seconds: None)
        self.on_event = on_event  # an Event on a pod (Pinned, Refused): recorded in the background, never waited for
        # container id -> (cpu_period, cpu_quota) kubelet asked for a pinned container (which runs without a quota)
        self.kubelet_cfs: dict[str, tuple[int, int]] = {}
        # a bypass annotation the proxy ignored (outside --bypass-namespaces), with the pod's namespace
        self.on_bypass_ignored = on_bypass_ignored or (lambda namespace: None)
        self.on_cdi_problem = on_cdi_problem or (lambda reason: None)  # a CDI device gave no hint, with why
        # why no container may get new exclusive CPUs now (kubelet's drift: two writers of cpusets), or None
        self.refuse_exclusive = refuse_exclusive or (lambda: None)
        self.config = config
        self.policy = config.topology_manager_policy
        self.scope = config.topology_manager_scope
        self.topology = config.topology

    def _refused(self, ident: PodIdentity, name: str, reason: str, message: str) -> None:
        """A create refused: counted by kubelet's ``reason`` and told on the pod (a Warning Event)."""
        self.on_rejected(reason)
        self.on_event(PodEvent(ident.namespace, ident.name, ident.uid, "Warning", "Refused",
                               f"container {name}: {reason}: {message}"))

    def _mems_of(self, cpus: CPUSet, uid: str = "", name: str = "") -> CPUSet:
        return self.mems.of(uid, name, cpus)  # the Memory Manager's nodes for a container it accounts

    def shared_pool(self) -> tuple[CPUSet, CPUSet]:
        pool = self.allocator.shared_pool()
        return pool, self._mems_of(pool)

    async def save(self) -> None:
        await asyncio.to_thread(save_pair, self.store, self.memory_store, self.allocator)

    def passes_through(self, ident: PodIdentity) -> bool:
        return self.bypass.passes(ident.uid, ident.namespace, ident.name, ident.annotations)

    async def _resize_shared(self) -> None:
        pool, mems = self.shared_pool()
        result = await self.pusher.resize_shared(pool, mems)
        if result.changed or result.failed:
            self.on_narrow(result.seconds)
            log.info("shared pool -> cpus=%s mems=%s: %d containers updated (%d cgroups written directly), %d failed "
                     "in %.1f ms", pool, mems, result.changed, result.direct, result.failed, result.seconds * 1000)

    def _in_background(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def stop_background(self, timeout: float) -> None:
        """Let the background work (CPUs given back for creates their caller abandoned) finish within ``timeout``
        seconds, then cancel the rest: nothing runs afterwards (a give-back lost so is redone by the next start's
        reconcile, which drops assignments of containers that do not exist)."""
        if self._background:
            _, pending = await asyncio.wait(set(self._background), timeout=timeout)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)

    async def _after_release(self, what: str, freed: CPUSet) -> None:
        """The state on disk and the pool widened, at once (a kill between the two is harmless either way: the
        restarted agent converges the pool to what is on disk)."""
        log.info("release %s cpus=%s", what, freed)
        saved, widened = await asyncio.gather(self.save(), self._resize_shared(), return_exceptions=True)
        for problem in (saved, widened):
            if isinstance(problem, BaseException):
                raise problem
        self.on_change()


def _set_event() -> asyncio.Event:
    e = asyncio.Event()
    e.set()
    return e
