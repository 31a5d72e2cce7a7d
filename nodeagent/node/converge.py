"""Kernel-truth convergence: every running container's real cpuset is made the proxy's decision again.

The decision for a container is its own CPUs when the allocator's state pins it, else the current shared
pool; the memory nodes are the Memory Manager's nodes for a container it accounts, else the NUMA nodes of those
CPUs. The truth is read from the kernel (the container's
cgroup and its processes' ``/proc/<pid>/status``, see ``kernel``), never from containerd's record: a cgroup
written behind the proxy's back, an update lost to a kill -9 of the proxy mid-narrowing, a record containerd
rolled back after the kernel had changed, an update that failed while containerd was down, a stale record
containerd or runc wrote back into the cgroup all show up the same way and are repaired like any push (the
cgroup written, then containerd's record with ``UpdateContainerResources``, see ``narrowing``). Record updates
containerd refused are sent again on every pass.

A pass runs at start-up (after reconcile), every ``period`` seconds, and right after the pool moved. Reading
is batched in one worker thread; the repairs hold the pool gate exclusively, so they never race a narrowing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from allocator.cpuset import CPUSet
from allocator.node import NodeAllocator
from allocator.topology import Topology
from nodeagent.decisions.pod_events import EventSink, no_events, pod_event
from nodeagent.decisions.registry import Registry, Tracked
from nodeagent.node.cpuset_pusher import CpusetPusher
from nodeagent.node.kernel import CgroupLayout, KernelReader, KernelView, cgroup_of_pid, cgroup_of_spec
from nodeagent.ports import RuntimeCallError, RuntimeReader

__all__ = ["ConvergeReport", "Converger", "Decider", "Decision", "Repair"]

log = logging.getLogger("numapin.criproxy")

@dataclass(frozen=True)
class Decision:
    cpus: CPUSet
    mems: CPUSet


class Decider:
    """What each container must run on now: ``decider(container)`` (None: numapin does not manage it). The
    NUMA nodes of a cpuset are remembered: a pass asks for the same few cpusets (the pool's, above all) again
    and again."""

    def __init__(self, allocator: NodeAllocator, topology: Topology) -> None:
        self.allocator = allocator
        self.topology = topology
        self._mems: dict[CPUSet, CPUSet] = {}

    def __call__(self, t: Tracked) -> Decision | None:
        if t.mode == "bypass":
            return None
        own = self.allocator.container_cpus(t.pod_uid, t.name)
        cpus = own if own is not None else self.allocator.shared_pool()
        held = self.allocator.container_mems(t.pod_uid, t.name)  # the Memory Manager's nodes win
        if held is not None:
            return Decision(cpus, held)
        mems = self._mems.get(cpus)
        if mems is None:
            if len(self._mems) > 4096:
                self._mems.clear()
            mems = self._mems[cpus] = self.topology.numa_of(cpus)
        return Decision(cpus, mems)


@dataclass(frozen=True)
class Repair:
    id: str
    pod: str
    name: str
    found: str           # what the kernel showed that disagreed
    cpus: CPUSet         # what was applied
    mems: CPUSet
    ok: bool             # the kernel shows the decision afterwards


@dataclass(frozen=True)
class ConvergeReport:
    checked: int                  # running containers whose kernel cpuset was read
    repairs: tuple[Repair, ...]
    seconds: float

    @property
    def repaired(self) -> int:
        return sum(1 for r in self.repairs if r.ok)

    @property
    def failed(self) -> int:
        return sum(1 for r in self.repairs if not r.ok)


# the checks whose repairs are told on the pod (a Repaired Event): containers found off a decision that was already
# in place; the checks right after numapin's own moves (a mode change, a resize) finish those moves
_TOLD_ON_THE_POD = frozenset({"periodic", "after a pool change", "start-up reconcile", "after start",
                              "before an exclusive start"})


class Converger:
    def __init__(self, reader: RuntimeReader, registry: Registry, pusher: CpusetPusher, layout: CgroupLayout,
                 decide: Callable[[Tracked], Decision | None], *, period: float = 1.0, timeout: float = 10.0,
                 on_repair: Callable[[str, bool], None] | None = None,
                 on_pass: Callable[[float], None] | None = None, on_event: EventSink = no_events) -> None:
        self.runtime = reader
        self.registry = registry
        self.pusher = pusher
        self.layout = layout
        self.decide = decide
        self.period = period
        self.timeout = timeout
        self.on_repair = on_repair or (lambda trigger, ok: None)
        self.on_pass = on_pass or (lambda seconds: None)
        self.on_event = on_event  # Repaired on the pod of a container put back on its decision
        self._cgroups = pusher.cgroups            # container id -> cgroup (fixed for the container's life)
        self.reader = KernelReader(layout)
        self._retry_at: dict[str, float] = {}      # container id -> when to ask the runtime again
        self._kick = asyncio.Event()
        self._slots = asyncio.Semaphore(16)

    # -- finding and reading -------------------------------------------------------------------------
    async def _locate_one(self, t: Tracked) -> tuple[str, str | None, int]:
        try:
            async with self._slots:
                resp = await self.runtime.container_status(t.id, verbose=True, timeout=self.timeout)
        except RuntimeCallError:
            return t.id, None, 0
        try:
            info = json.loads(resp.info.get("info", "{}"))
        except ValueError:
            info = {}
        spec = info.get("runtimeSpec") if isinstance(info, dict) else None
        path = None
        if isinstance(spec, dict):
            path = cgroup_of_spec(str((spec.get("linux") or {}).get("cgroupsPath") or ""))
        pid = info.get("pid", 0) if isinstance(info, dict) else 0
        return t.id, path, pid if isinstance(pid, int) else 0

    async def locate(self, containers: Iterable[Tracked]) -> None:
        """Learn the cgroups of the containers not known yet (ContainerStatus, verbose)."""
        now = time.monotonic()
        todo = [t for t in containers if t.id not in self._cgroups and self._retry_at.get(t.id, 0.0) <= now]
        if not todo:
            return
        found = await asyncio.gather(*(self._locate_one(t) for t in todo))
        by_pid = [(cid, pid) for cid, path, pid in found if path is None and pid > 0]
        pid_paths = dict(await asyncio.to_thread(
            lambda: [(cid, cgroup_of_pid(self.layout.roots, pid)) for cid, pid in by_pid])) if by_pid else {}
        for cid, path, _ in found:
            path = path or pid_paths.get(cid)
            if path:
                self._cgroups[cid] = path
                self._retry_at.pop(cid, None)
            else:  # not started yet, or a runtime that does not tell (asked again a little later)
                self._retry_at[cid] = now + max(self.period, 1.0) * 5

    def knows(self, container_id: str) -> bool:
        """Whether the container's cgroup is known (its kernel cpuset can be read once it runs)."""
        return container_id in self._cgroups

    def forget(self, container_id: str) -> None:
        self._cgroups.pop(container_id, None)
        self._retry_at.pop(container_id, None)

    async def views(self, containers: Iterable[Tracked]) -> dict[str, KernelView | None]:
        """The kernel's view of each container (None: not running, or its cgroup is unknown)."""
        ts = list(containers)
        await self.locate(ts)
        paths = [(t.id, self._cgroups[t.id]) for t in ts if t.id in self._cgroups]
        views = await asyncio.to_thread(self.reader.views, paths) if paths else {}
        return {t.id: views.get(t.id) for t in ts}

    def live(self) -> list[Tracked]:
        return [t for t in self.registry.containers.values() if not t.exited and t.mode != "bypass"]

    # -- repairing -----------------------------------------------------------------------------------
    def _disagreements(self, ts: Iterable[Tracked], views: dict[str, KernelView | None]
                       ) -> list[tuple[Tracked, Decision, str]]:
        out = []
        for t in ts:
            view = views.get(t.id)
            d = self.decide(t)
            if view is None or not view.running or d is None:
                continue
            why = view.disagreement(d.cpus, d.mems)
            if why is not None:
                out.append((t, d, why))
        return out

    async def repair(self, containers: Iterable[Tracked], trigger: str, *,
                     views: dict[str, KernelView | None] | None = None) -> tuple[int, tuple[Repair, ...]]:
        """Read the containers' kernel cpusets and repair those that disagree. Call with the pool gate held
        (exclusively, or shared for containers only the caller moves). Returns (running checked, repairs).
        ``views``: the containers' views the caller has just read under the same gate (not read again); the
        views of the repaired containers as read after the repair are put in it."""
        ts = list(containers)
        if views is None:
            views = await self.views(ts)
        bad = self._disagreements(ts, views)
        if not bad:
            return sum(1 for t in ts if (v := views.get(t.id)) is not None and v.running), ()
        await self.pusher.push(((t, d.cpus, d.mems, None) for t, d, _ in bad), force=True)
        after = await self.views([t for t, _, _ in bad])
        views.update(after)
        still = {t.id for t, _, _ in self._disagreements([t for t, _, _ in bad], after)}
        repairs = []
        for t, d, why in bad:
            ok = t.id not in still
            repairs.append(Repair(t.id, t.pod_ref, t.name, why, d.cpus, d.mems, ok))
            self.on_repair(trigger, ok)
            if ok and trigger in _TOLD_ON_THE_POD:
                self.on_event(pod_event(t.pod_ref, t.pod_uid, "Warning", "Repaired",
                                        f"container {t.name} ({t.mode}) ran on {why}, not its decision: put back "
                                        f"on cpus {d.cpus} mems {d.mems} ({trigger})"))
                log.warning("converge (%s): repaired pod=%s container=%s id=%s (%s): the kernel showed %s, "
                            "the decision is cpus=%s mems=%s", trigger, t.pod_ref, t.name, t.id[:13], t.mode, why,
                            d.cpus, d.mems)
            else:
                log.warning("converge (%s): could not repair pod=%s container=%s id=%s (%s): the kernel shows %s, "
                            "the decision is cpus=%s mems=%s; retried in the next pass", trigger, t.pod_ref, t.name,
                            t.id[:13], t.mode, why, d.cpus, d.mems)
        return sum(1 for t in ts if (v := views.get(t.id)) is not None and v.running), tuple(repairs)

    async def converge_once(self, trigger: str = "periodic") -> ConvergeReport:
        """One pass over every live container. Reads without the gate; repairs (re-reading first, as the
        pool may have moved meanwhile) with the gate held exclusively."""
        t0 = time.perf_counter()
        live = self.live()
        ids = set(self.registry.containers)
        for cid in [c for c in self._cgroups if c not in ids]:
            self.forget(cid)
        for cid in [c for c in self._retry_at if c not in ids]:
            self._retry_at.pop(cid, None)
        self.reader.retain(self._cgroups.values())
        self.pusher.records.retry(t.id for t in live)  # containerd's records it refused: sent again
        views = await self.views(live)
        checked = sum(1 for v in views.values() if v is not None and v.running)
        repairs: tuple[Repair, ...] = ()
        suspects = [t for t, _, _ in self._disagreements(live, views)]
        if suspects:
            async with self.pusher.gate.exclusive():
                _, repairs = await self.repair([t for t in suspects if not t.exited], trigger)
        seconds = time.perf_counter() - t0
        self.on_pass(seconds)
        return ConvergeReport(checked, repairs, seconds)

    def kick(self) -> None:
        """Run a pass soon (the pool moved)."""
        self._kick.set()

    async def run(self) -> None:
        """Passes every ``period`` seconds and after every kick, for ever (errors are logged, never fatal)."""
        while True:
            # asyncio.timeout, not wait_for: Python 3.11's wait_for loses a cancellation that arrives as the kick
            # is set (it returns the result), and stop() then waited for this loop for ever
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.period):
                    await self._kick.wait()
            trigger = "after a pool change" if self._kick.is_set() else "periodic"
            self._kick.clear()
            try:
                await self.converge_once(trigger)
            except RuntimeCallError as e:
                log.warning("converge: runtime not reachable (%s: %s); next pass in %.1f s", e.code().name,
                            e.details(), self.period)
            except OSError as e:
                log.warning("converge: cannot read the kernel's cpusets: %s", e)
            except Exception:  # a bug must not end the convergence for the life of the proxy
                log.exception("converge: pass failed; next pass in %.1f s", self.period)
