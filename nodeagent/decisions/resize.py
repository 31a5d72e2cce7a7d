"""kubelet's in-place resize of a running container (``UpdateContainerResources``), applied with the guarantees of
creation.

kubelet (``cpuManagerPolicy: none``) resizes a container by sending its new CFS values and no cpuset. For a container
numapin tracks, the call is read as the pod after the resize (``resized_pod``: the new limit exact from quota and
period, checked against the shares and the pod's QoS class from its intent) and the allocator decides
(``NodeAllocator.resize_container``). Then:

- **refused**: nothing changes (kernel, both states and both files, quota: the call is not forwarded) and the
  call fails with FAILED_PRECONDITION (RESOURCE_EXHAUSTED when CPUs are short, as for a create), the message naming
  kubelet's reason, the policy and the numbers (a resize giving new exclusive CPUs while kubelet writes cpusets too
  is refused, ``KubeletDrift``, as a create); kubelet shows it on the pod (``PodResizeInProgress``, reason
  ``Error``) and retries on its next syncs;
- **nothing to change** (kubelet's memory pass without ``memoryManagerPolicy: Static``, a retry of a resize
  already applied, a share-less update): the call is forwarded with the container's current cpuset (its
  ``cpuset.mems`` the Memory Manager's nodes when it holds some) and, for a pinned container, no CFS quota;
- **memory** (``memoryManagerPolicy: Static``, a container the Memory Manager accounts): kubelet's memory pass is
  accounted (``NodeAllocator.resize_memory``: the new limit on the container's nodes, extended by kubelet's rules
  when they cannot hold it; kubelet itself refuses it as ``Infeasible`` unless its alpha gate
  ``InPlacePodVerticalScalingExclusiveMemory`` is on). A limit no placement holds is refused (FAILED_PRECONDITION,
  ``Deferred`` or ``Infeasible`` and the numbers per NUMA node); a growth is on disk before the runtime raises the
  limit (and widens ``cpuset.mems`` when the nodes were extended);
- **the pool shrinks** (a growth, or a move from the shared pool to CPUs of its own): under the allocation lock and
  the pool gate, the shared containers are narrowed and the kernel is read; only when no other running container
  has a CPU the pool lost is the decision written to the checkpoint and kubelet's call forwarded with the wider
  cpuset (a narrowing the kernel refused is rolled back: both states, pool and kernel as before, UNAVAILABLE, kubelet
  retries). A kill -9 before the checkpoint leaves the old decision on disk, after it the new one: the restarted
  proxy's reconcile and convergence repair the kernel to it either way, and no window opens (the shared
  containers were off the new CPUs before the checkpoint said so);
- **otherwise** (a shrink, a move to the shared pool): the checkpoint is written, kubelet's call forwarded with the
  narrower cpuset, and only then the shared pool widened.

Door-neutral: ``Resizer.resize`` takes kubelet's request and the door's own step (``apply``) that has the runtime
apply the container's resources (``TargetResources``; None: untouched), called where the forwarded call was: the
proxy edits and forwards kubelet's call there (``criproxy.intercept``). The shared containers are narrowed and
widened through the cpuset pusher (``nodeagent.ports.RecordWriter`` for the runtime's part).

The answer goes back once the kernel shows the container's new cpuset (read, repaired if it does not). Every
resize is logged in one line, counted (``on_resize``), kept for ``/status`` (``recent``) and republished in the
NodeResourceTopology (``Pinning.on_change``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import grpc

from allocator.cpuset import CPUSet
from allocator.errors import PodSpecError
from allocator.intent import INTENT_ANNOTATION, decode_intent
from allocator.memory.resize import MemoryResize
from allocator.memory.state import MemoryState
from allocator.pod import CPU_MANAGER_ANNOTATION, PodInfo, QOSClass, is_bypassed, normalize_cpu_manager
from allocator.resize import ResizeOutcome
from allocator.state import CPUState
from nodeagent.decisions.cri_intent import container_from_cri, qos_from_cgroup_parent
from nodeagent.decisions.pinning import Pinning
from nodeagent.decisions.pod_events import pod_event
from nodeagent.decisions.registry import Tracked, TrackedMode
from nodeagent.decisions.resized_pod import carries_cpu, cfs_summary, with_cri_size
from nodeagent.decisions.target import TargetResources
from nodeagent.node.cfs import QUOTA_PERIOD, milli_cpu_to_quota, milli_cpu_to_shares, quota_to_milli_cpu
from nodeagent.node.converge import Converger
from nodeagent.ports import RuntimeCallError
from nodeagent.rejection import Rejection
from protos import cri_pb2

__all__ = ["ResizeRecord", "Resizer"]

log = logging.getLogger("numapin.criproxy.resize")

_HISTORY = 64  # resizes kept for /status

Snapshot = tuple[CPUState, MemoryState | None]  # MemoryNodes.snapshot(): both states
R = TypeVar("R")
Apply = Callable[[TargetResources | None], Awaitable[R]]  # the door's step: the runtime applies the resources


@dataclass(frozen=True)
class ResizeRecord:
    """One resize as people see it (``/status``, ``numapin status``)."""

    pod: str
    container: str
    result: str          # resized | refused | rolled-back | failed
    size_from: str
    size_to: str
    cpus_from: str
    cpus_to: str
    at: str              # UTC, ISO 8601
    seconds: float
    reason: str | None
    message: str

    def to_dict(self) -> dict[str, Any]:
        return {"pod": self.pod, "container": self.container, "result": self.result, "from": self.size_from,
                "to": self.size_to, "cpusFrom": self.cpus_from, "cpusTo": self.cpus_to, "at": self.at,
                "ms": round(self.seconds * 1000, 1), "reason": self.reason, "message": self.message}


@dataclass(frozen=True)
class _Sandbox:
    """What the pod model needs of a sandbox (immutable for the sandbox's life)."""

    uid: str
    namespace: str
    name: str
    annotations: dict[str, str]


class _NarrowingFailed(Exception):
    pass


class Resizer:
    def __init__(self, pinning: Pinning, converger: Converger, *, lift_cfs_quota: bool = True,
                 on_resize: Callable[[str, float], None] | None = None) -> None:
        self.pinning = pinning
        self.converger = converger
        self.lift_cfs_quota = lift_cfs_quota
        self.on_resize = on_resize or (lambda result, seconds: None)
        self.models: dict[str, PodInfo] = {}        # pod uid -> the pod after its last resize
        self._sandboxes: dict[str, _Sandbox] = {}   # sandbox id -> its identity and annotations
        self._qos: dict[str, QOSClass] = {}         # pod uid -> its QoS class (CRI pod model)
        self.history: deque[ResizeRecord] = deque(maxlen=_HISTORY)
        self.phases: dict[str, float] = {}          # milliseconds of each step of the last resize applied (log)
        # container id -> (cpu_period, cpu_quota) kubelet last sent for it: what ContainerStatus reports back
        self.kubelet_cfs = pinning.kubelet_cfs

    # -- the call -------------------------------------------------------------------------------------------
    async def resize(self, req: cri_pb2.UpdateContainerResourcesRequest, apply: Apply[R]) -> R:
        """kubelet's ``UpdateContainerResources``: decide, narrow the shared pool first where it shrinks, have the
        door ``apply`` the container's resources (None: kubelet's request untouched), widen the pool after where
        it grows, check the kernel; returns what ``apply`` returned. Raises Rejection (``apply`` not called)."""
        t0 = time.perf_counter()
        t = self.pinning.registry.containers.get(req.container_id)
        if t is None or t.mode == "bypass" or t.cpus is None or not carries_cpu(req.linux):
            return await self._relay(req, apply, t)
        try:
            pod = await self._pod_after(t, req.linux)
        except PodSpecError as e:
            message = (f"numapin: pod {t.pod_ref} container {t.name}: resize not understood ({e}); the container "
                       "keeps running as it was")
            self._record(t, "refused", "", "", t.cpus, t.cpus, t0, "InvalidResize", message)
            raise Rejection(grpc.StatusCode.INVALID_ARGUMENT, message) from None
        if pod.bypass:
            return await self._relay(req, apply, t)
        alloc = self.pinning.allocator
        # judged first without the allocation lock, on the loop (the state is only replaced whole, never changed in
        # place, by decisions in worker threads): kubelet's calls that change no set and no accounted memory
        # (retries, Burstable containers) never wait for an allocation in progress
        dry = alloc.resize_container(pod, t.name, dry_run=True)
        if not dry.admitted:
            self._refuse(t, dry, t0)
        dry_memory = alloc.resize_memory(pod, t.name, dry_run=True)
        if not dry_memory.admitted:
            self._refuse_memory(t, dry_memory, t0)
        if not dry.changed and not dry_memory.changed:
            self._remember(t, pod, req)
            return await self._relay(req, apply, t)
        async with self.pinning.lock, self.pinning.pusher.gate.exclusive():
            before = self.pinning.mems.snapshot()  # both states: a refusal or a roll-back restores the pair
            # on the loop, as the dry run just was (the same work): a worker thread would only add its hand-over
            outcome = alloc.resize_container(pod, t.name)
            if not outcome.admitted:  # cannot differ from the dry run under the lock; be safe
                self.pinning.mems.restore(before)
                self._refuse(t, outcome, t0)
            memory = alloc.resize_memory(pod, t.name)  # kubelet's memory pass: the new limit accounted
            if not memory.admitted:
                self.pinning.mems.restore(before)
                self._refuse_memory(t, memory, t0)
            self._refuse_on_drift(t, outcome, before, t0)
            if memory.changed:
                outcome = replace(outcome, mems_after=CPUSet(memory.mems_after))
            claims = memory.changed and (memory.bytes_after or 0) > (memory.bytes_before or 0)
            response = await self._apply(t, outcome, before, req, apply, t0, claims_memory=claims)
            self._remember(t, pod, req)
        self.pinning.pusher.on_resized()
        seconds = time.perf_counter() - t0
        said = f"{outcome.message}; {memory.message}" if memory.changed else outcome.message
        self._record(t, "resized", _size(outcome.mode_before, outcome.cpus_before),
                     _size(outcome.mode_after, outcome.cpus_after), outcome.cpus_before, outcome.cpus_after, t0, None,
                     said)
        steps = ", ".join(f"{k} {v:.1f}" for k, v in self.phases.items())
        log.info("resize pod=%s container=%s: %s -> %s, cpus %s -> %s, mems %s -> %s, shared pool %s -> %s (%s) in "
                 "%.1f ms (%s)", t.pod_ref, t.name, _size(outcome.mode_before, outcome.cpus_before),
                 _size(outcome.mode_after, outcome.cpus_after), outcome.cpus_before, outcome.cpus_after,
                 outcome.mems_before, outcome.mems_after, outcome.pool_before, outcome.pool_after,
                 cfs_summary(req.linux), seconds * 1000, steps)
        return response

    def _refuse_memory(self, t: Tracked, memory: MemoryResize, t0: float) -> None:
        """A memory limit the Memory Manager cannot account (its reason ``Deferred`` or ``Infeasible``, as
        kubelet's resize statuses): nothing changes, the call fails with FAILED_PRECONDITION."""
        message = f"numapin: pod {t.pod_ref} container {t.name}: resize refused ({memory.reason}): {memory.message}"
        size = _size(t.mode, t.cpus) if t.cpus is not None else ""
        self._record(t, "refused", size, "", t.cpus, t.cpus, t0, memory.reason, message)
        log.info("resize pod=%s container=%s refused (%s): %s", t.pod_ref, t.name, memory.reason, memory.message)
        raise Rejection(grpc.StatusCode.FAILED_PRECONDITION, message)

    def _refuse_on_drift(self, t: Tracked, outcome: ResizeOutcome, before: Snapshot, t0: float) -> None:
        """A resize giving a container CPUs of its own while kubelet writes cpusets too (kubelet drift) is
        refused as a create would be: both states restored."""
        if outcome.mode_before != "shared" or outcome.mode_after == "shared":
            return
        drift = self.pinning.refuse_exclusive()
        if drift is None:
            return
        self.pinning.mems.restore(before)
        self.pinning.on_rejected("KubeletDrift")
        message = f"numapin: pod {t.pod_ref} container {t.name}: resize refused: no new exclusive CPUs while {drift}"
        self._record(t, "refused", _size(outcome.mode_before, outcome.cpus_before), "", outcome.cpus_before,
                     outcome.cpus_before, t0, "KubeletDrift", message)
        log.info("resize pod=%s container=%s refused (KubeletDrift): %s", t.pod_ref, t.name, drift)
        raise Rejection(grpc.StatusCode.FAILED_PRECONDITION, message)

    def _refuse(self, t: Tracked, outcome: ResizeOutcome, t0: float) -> None:
        code = (grpc.StatusCode.RESOURCE_EXHAUSTED if outcome.reason == "UnexpectedAdmissionError"
                else grpc.StatusCode.FAILED_PRECONDITION)
        message = f"numapin: pod {t.pod_ref} container {t.name}: resize refused ({outcome.reason}): {outcome.message}"
        self._record(t, "refused", _size(outcome.mode_before, outcome.cpus_before), "", outcome.cpus_before,
                     outcome.cpus_before, t0, outcome.reason, message)
        log.info("resize pod=%s container=%s refused (%s): %s", t.pod_ref, t.name, outcome.reason, outcome.message)
        raise Rejection(code, message)

    async def _relay(self, req: cri_pb2.UpdateContainerResourcesRequest, apply: Apply[R], t: Tracked | None) -> R:
        """Apply a call that changes no CPU set: the container's current cpuset on it (numapin owns cpusets) and,
        for a pinned container, no CFS quota. The pool gate is held shared (never between a narrowing's decision
        and its updates, which would put the wide pool back)."""
        if t is None or t.mode == "bypass" or t.cpus is None:
            return await apply(None)
        if t.pinned and req.linux.cpu_quota:
            self.kubelet_cfs[t.id] = (req.linux.cpu_period, req.linux.cpu_quota)
        async with self.pinning.pusher.gate.shared():
            own = self.pinning.allocator.container_cpus(t.pod_uid, t.name)
            cpus = own if own is not None else self.pinning.allocator.shared_pool()
            mems = self.pinning.mems.of(t.pod_uid, t.name, cpus)  # the Memory Manager's nodes when it holds some
            target = self._target(req, cpus, mems, own is not None)
            if (req.linux.cpuset_cpus, req.linux.cpuset_mems) != (str(cpus), str(mems)) and req.linux.cpuset_cpus:
                log.info("update pod=%s container=%s: cpuset %r kept as %s (numapin owns cpusets)", t.pod_ref, t.name,
                         req.linux.cpuset_cpus, cpus)
            return await apply(target)

    def _target(self, req: cri_pb2.UpdateContainerResourcesRequest, cpus: CPUSet, mems: CPUSet,
                pinned: bool) -> TargetResources:
        return TargetResources(cpus, mems, bool(pinned and self.lift_cfs_quota and req.linux.cpu_quota))

    # -- applying -------------------------------------------------------------------------------------------
    async def _apply(self, t: Tracked, outcome: ResizeOutcome, before: Snapshot,
                     req: cri_pb2.UpdateContainerResourcesRequest, apply: Apply[R], t0: float, *,
                     claims_memory: bool = False) -> R:
        """The decision is in the allocator's state; the lock and the pool gate are held. ``claims_memory``: the
        Memory Manager accounted more bytes (perhaps on more nodes): on disk before the runtime raises the limit."""
        alloc = self.pinning.allocator
        mark = time.perf_counter()
        phases = self.phases = {"decide": (mark - t0) * 1000}

        def lap(name: str) -> None:
            nonlocal mark
            now = time.perf_counter()
            phases[name] = (now - mark) * 1000
            mark = now

        old_mode = t.mode
        new_mode: TrackedMode = outcome.mode_after
        pinned = new_mode != "shared"
        lost = outcome.pool_before - outcome.pool_after
        t.mode = new_mode
        if lost:
            # 1. the shared containers leave the CPUs the pool loses, and 2. the decision goes on disk, at once (a
            # kill meanwhile: the restarted agent converges every container to what is on disk, old or new)
            narrowed, saved = await asyncio.gather(self._narrow(t, lost), self.pinning.save(),
                                                   return_exceptions=True)
            if isinstance(narrowed, _NarrowingFailed):
                e = narrowed
                self.pinning.mems.restore(before)  # the CPU and the memory state as before the resize
                t.mode = old_mode
                await self._widen()
                await self.converger.repair(self.converger.live(), "rolling back a resize")
                await self.pinning.save()          # on disk as before the resize again
                message = (f"numapin: pod {t.pod_ref} container {t.name}: resize rolled back: the shared pool could "
                           f"not be narrowed off CPUs {lost} ({e}); the container keeps running as it was, every "
                           "cpuset restored; retried on kubelet's next sync")
                self._record(t, "rolled-back", _size(outcome.mode_before, outcome.cpus_before),
                             _size(outcome.mode_after, outcome.cpus_after), outcome.cpus_before, outcome.cpus_after,
                             t0, "NarrowingFailed", message)
                log.warning("resize pod=%s container=%s rolled back: %s", t.pod_ref, t.name, e)
                raise Rejection(grpc.StatusCode.UNAVAILABLE, message) from None
            for problem in (narrowed, saved):  # both finished: no state write outlives the locks
                if isinstance(problem, BaseException):
                    raise problem
            self.pinning.on_change()
            lap("narrow and checkpoint")
        cpus, mems = outcome.cpus_after, outcome.mems_after
        if not pinned:
            cpus = alloc.shared_pool()
            mems = self.pinning.mems.of(t.pod_uid, t.name, cpus)
        records = self.pinning.pusher.records
        records.drop(t.id)
        await records.quiesce(t.id)
        target = self._target(req, cpus, mems, pinned)
        if lost or claims_memory:
            if not lost:
                await self.pinning.save()        # 2. the decision on disk (more memory claimed)
                self.pinning.on_change()
                lap("checkpoint")
            response = await apply(target)       # 3. the container takes its new set (kubelet's values with it)
            lap("runtime")
        else:
            # nothing becomes the container's own: the decision goes on disk while the container moves, and both
            # are done before the pool widens (a kill before the checkpoint is on disk leaves the old decision,
            # which the restarted proxy restores; the pool was not widened)
            answered, saved = await asyncio.gather(apply(target), self.pinning.save(), return_exceptions=True)
            self.pinning.on_change()
            lap("checkpoint and runtime")
            for failure in (saved, answered):  # both finished: no state write outlives the locks
                if isinstance(failure, BaseException):
                    raise failure
            assert not isinstance(answered, BaseException)
            response = answered
        t.cpus, t.mems = cpus, mems
        if not pinned:
            self.kubelet_cfs.pop(t.id, None)
        if outcome.pool_after - outcome.pool_before:
            await self._widen()                  # 4. CPUs given back: the shared pool widens after
            lap("widen")
        # the kernel, not the runtime's answer, is the truth: the container's set is read (and repaired). The shared
        # containers were read (and repaired) by a narrowing under the pool gate held since; a widening's writes
        # were answered by the kernel, and the convergence pass it kicks (``on_resized``) reads them right after
        # the answer: a widened container can only be short of CPUs, never on another's
        await self.converger.repair([t], "after a resize")
        lap("kernel check")
        return response

    async def _narrow(self, t: Tracked, lost: CPUSet) -> None:
        await self._widen()  # the pool is pool_after now: narrows
        # one read of the kernel for both: the shared containers checked (and repaired), then no other container
        # left on the lost CPUs (the repaired ones as read after their repair)
        live = self.converger.live()
        others = [o for o in live if o.id != t.id]
        views = await self.converger.views(live)
        await self.converger.repair(self.pinning.registry.on_shared_pool(), "before a resize", views=views)
        blockers = []
        for o in others:
            v = views.get(o.id)
            if v is not None and v.running and not v.all_cpus.isdisjoint(lost):
                blockers.append(f"pod={o.pod_ref} container={o.name} still runs on {v.all_cpus & lost}")
        if blockers:
            raise _NarrowingFailed("; ".join(blockers))

    async def _widen(self) -> None:
        """Bring every shared container to the current pool (the gate is held by the caller)."""
        pool, mems = self.pinning.shared_pool()
        result = await self.pinning.pusher.push((s, pool, mems, None) for s in self.pinning.registry.on_shared_pool())
        if result.changed or result.failed:
            self.pinning.on_narrow(result.seconds)
            log.info("shared pool -> cpus=%s mems=%s: %d containers updated, %d failed in %.1f ms", pool, mems,
                     result.changed, result.failed, result.seconds * 1000)

    # -- the pod model --------------------------------------------------------------------------------------
    async def _pod_after(self, t: Tracked, linux: cri_pb2.LinuxContainerResources) -> PodInfo:
        pod = self.models.get(t.pod_uid) or await self._pod_model(t)
        if not pod.has_container(t.name):
            pod = replace(pod, containers=(*pod.containers, container_from_cri(t.name, linux, pod.qos_class)))
        return with_cri_size(pod, t.name, linux)

    async def _pod_model(self, t: Tracked) -> PodInfo:
        """The pod as numapin knows it: the webhook's intent on the sandbox, else what CRI showed of its
        containers (the CRI pod model), with the QoS class from the container's cgroup."""
        sb = await self._sandbox(t)
        intent = sb.annotations.get(INTENT_ANNOTATION)
        if intent is not None:
            return decode_intent(intent, uid=sb.uid, namespace=sb.namespace, name=sb.name,
                                 annotations=sb.annotations)
        qos = await self._qos_of(t)
        cri = self.pinning.registry.pods.get(t.pod_uid)
        known = dict(cri.resources) if cri is not None else {}
        containers = tuple(replace(container_from_cri(n, r, qos), role=cri.roles.role(n) if cri else "app")
                           for n, r in known.items())
        raw_mode = sb.annotations.get(CPU_MANAGER_ANNOTATION)
        return PodInfo(uid=sb.uid, namespace=sb.namespace, name=sb.name, qos_class=qos,
                       cpu_manager=None if raw_mode is None else normalize_cpu_manager(raw_mode),
                       bypass=is_bypassed(sb.annotations), containers=containers)

    async def _sandbox(self, t: Tracked) -> _Sandbox:
        sb = self._sandboxes.get(t.sandbox_id)
        if sb is not None:
            return sb
        try:
            listed = await self.pinning.runtime.list_sandboxes(cri_pb2.PodSandboxFilter(id=t.sandbox_id),
                                                               timeout=10.0)
        except RuntimeCallError as e:
            raise Rejection(grpc.StatusCode.UNAVAILABLE,
                            f"numapin: pod {t.pod_ref}: its sandbox cannot be read from the runtime "
                            f"({e.code().name}); resize retried on kubelet's next sync") from None
        # the pod is the registry's (its uid decides whose CPUs these are); the sandbox adds names and annotations
        item = next((i for i in listed if i.id == t.sandbox_id), None)
        ns, _, name = t.pod_ref.partition("/")
        if item is None:
            sb = _Sandbox(t.pod_uid, ns, name, {})
        else:
            sb = _Sandbox(t.pod_uid, item.metadata.namespace or ns, item.metadata.name or name,
                          dict(item.annotations))
        if len(self._sandboxes) > 4096:
            self._sandboxes.clear()
        self._sandboxes[t.sandbox_id] = sb
        return sb

    async def _qos_of(self, t: Tracked) -> QOSClass:
        qos = self._qos.get(t.pod_uid)
        if qos is not None:
            return qos
        path = self.pinning.pusher.cgroups.get(t.id)
        if path is None:
            await self.converger.locate([t])
            path = self.pinning.pusher.cgroups.get(t.id)
        found = qos_from_cgroup_parent(path) if path else None
        if found is not None:
            self._qos[t.pod_uid] = found
            return found
        # no cgroup to read: as kubelet classes it, as far as CRI tells (every container's CPU limit set and its
        # shares those of the limit)
        cri = self.pinning.registry.pods.get(t.pod_uid)
        known = list(cri.resources.values()) if cri is not None else []
        if t.pinned or (known and all(_guaranteed_cfs(r) for r in known)):
            return "Guaranteed"
        return "Burstable"

    def _remember(self, t: Tracked, pod: PodInfo, req: cri_pb2.UpdateContainerResourcesRequest) -> None:
        """The pod after the resize is the model of the next one; kubelet's CFS values are what it reads back."""
        self.models[t.pod_uid] = pod
        cri = self.pinning.registry.pods.get(t.pod_uid)
        if cri is not None and t.name in cri.resources:
            resources = cri_pb2.LinuxContainerResources()
            resources.CopyFrom(req.linux)
            cri.resources[t.name] = resources
        if req.linux.cpu_quota and self.pinning.allocator.container_cpus(t.pod_uid, t.name) is not None:
            self.kubelet_cfs[t.id] = (req.linux.cpu_period, req.linux.cpu_quota)

    # -- what kubelet reads back -----------------------------------------------------------------------------
    def reported_cfs(self, t: Tracked) -> tuple[int, int] | None:
        """(cpu_period, cpu_quota) to report for a pinned container: what kubelet last sent, else (a proxy
        restarted since) the quota of its CPUs (an exclusive container's limit is its CPU count); None to report
        what the runtime says."""
        if not t.pinned or not self.lift_cfs_quota:
            return None
        sent = self.kubelet_cfs.get(t.id)
        if sent is not None:
            return sent
        own = self.pinning.allocator.container_cpus(t.pod_uid, t.name)
        if own is None or t.mode != "exclusive":
            return None
        return QUOTA_PERIOD, milli_cpu_to_quota(len(own) * 1000, QUOTA_PERIOD)

    # -- status ---------------------------------------------------------------------------------------------
    def _record(self, t: Tracked, result: str, size_from: str, size_to: str, cpus_from: CPUSet | None,
                cpus_to: CPUSet | None, t0: float, reason: str | None, message: str) -> None:
        seconds = time.perf_counter() - t0
        self.history.append(ResizeRecord(t.pod_ref, t.name, result, size_from, size_to, str(cpus_from or ""),
                                         str(cpus_to or ""), time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                                         seconds, reason, message))
        self.on_resize(result, seconds)
        if result == "resized":
            told = f"container {t.name}: {size_from} -> {size_to}, cpus {cpus_from} -> {cpus_to}"
        else:
            told = message.removeprefix(f"numapin: pod {t.pod_ref} ")
        self.pinning.on_event(pod_event(t.pod_ref, t.pod_uid, "Normal" if result == "resized" else "Warning",
                                        "Resized", told))

    def recent(self) -> list[dict[str, Any]]:
        """The last resizes, newest last."""
        return [r.to_dict() for r in self.history]

    def prune(self, live_uids: set[str]) -> None:
        """Forget what was kept of pods and containers no longer on the node (after reconcile)."""
        for uid in [u for u in {*self.models, *self._qos} if u not in live_uids]:
            self.models.pop(uid, None)
            self._qos.pop(uid, None)
        containers = self.pinning.registry.containers
        for cid in [c for c in self.kubelet_cfs if c not in containers]:
            del self.kubelet_cfs[cid]
        sandboxes = self.pinning.registry.sandboxes
        for sid in [s for s in self._sandboxes if s not in sandboxes]:
            del self._sandboxes[sid]


def _guaranteed_cfs(r: cri_pb2.LinuxContainerResources) -> bool:
    limit = quota_to_milli_cpu(r.cpu_quota, r.cpu_period or QUOTA_PERIOD)
    return limit is not None and r.cpu_shares == milli_cpu_to_shares(limit)


def _size(mode: str, cpus: CPUSet) -> str:
    return "shared pool" if mode == "shared" else f"{len(cpus)} CPU(s) {mode}"
