"""Applying a change of a running pod's CPU mode in the proxy, with the guarantees of creation.

A ``ModeRequest`` (from the API watch or the local command) is decided by the allocator
(``NodeAllocator.change_mode``: transactional, topology-manager policy applied; a refusal changes nothing and the
pod keeps running as it was), written to the checkpoint, and then applied to the running containers:

- CPUs leave the shared pool (a container becomes ``exclusive``): every container of the shared pool is narrowed
  first, and only then are the pod's containers moved onto their own CPUs, so no exclusive CPU is ever in another
  container's cpuset. The narrowing is all-or-nothing: the kernel is read after it, and if any other running
  container still has one of the new exclusive CPUs (a cgroup the kernel refused to narrow, a runtime that died
  meanwhile) the change is rolled back: the allocator's state goes back to what it was, every cpuset the narrowing
  touched is widened back and checked in the kernel, the pod's containers never move, and the failure is logged,
  counted (``numapin_criproxy_mode_rollbacks_total``) and shown in ``/status`` (``podModes[].failure``). The
  checkpoint is written only once the narrowing is seen in the kernel, so a kill -9 of the proxy mid-narrowing
  leaves the old decision on disk and the restarted proxy's convergence widens the shared containers back;
- otherwise (``share``, ``none``, kubelet's rule without exclusive CPUs): the pod's containers are moved first and
  the shared pool is widened after (CPUs come back, nothing can overlap).

Pinned containers run without a CFS quota (``--keep-cfs-quota`` aside), as at creation; a container that goes back
to the shared pool gets its quota from its CPU limit again. The kernel is read afterwards and any container not on
its decision is repaired (``Converger.repair``). The NodeResourceTopology is republished, metrics count transitions
and refusals. Nothing here is used by CreateContainer: that path only sees the allocator's state, in which the new
mode is recorded (``CPUState.pod_modes``), so a restarted container gets the new mode and a restarted proxy's
reconcile and convergence apply it.

A request from the API the node refuses, or whose narrowing was rolled back, is kept and tried again whenever the
allocation changes (CPUs freed by a deleted pod may let the pod become ``exclusive``) and every ``retry_seconds``,
until it succeeds or another request for the pod replaces it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import replace

from allocator.cpuset import CPUSet
from allocator.errors import PodSpecError
from allocator.intent import INTENT_ANNOTATION, decode_intent
from allocator.memory.state import MemoryState
from allocator.mode_change import KUBELET_RULE, ModeChange, parse_target
from allocator.pod import CPU_MANAGER_ANNOTATION, ContainerInfo, PodInfo, QOSClass, qos_class
from allocator.state import CPUState
from nodeagent.decisions.cri_intent import container_from_cri, qos_from_cgroup_parent
from nodeagent.decisions.mode_request import ModeAnswer, ModeRequest
from nodeagent.decisions.pinning import Pinning
from nodeagent.decisions.pod_events import EventType, pod_event
from nodeagent.decisions.registry import Registry, Tracked, TrackedMode
from nodeagent.node.cfs import UNLIMITED_QUOTA, milli_cpu_to_quota
from nodeagent.node.converge import Converger
from nodeagent.ports import RuntimeCallError, RuntimeReader
from protos import cri_pb2

__all__ = ["ROLLED_BACK", "ModeApplier"]

log = logging.getLogger("numapin.criproxy.modes")

_QUOTA_PERIOD = 100000  # kubelet's default cpuCFSQuotaPeriod (100 ms)
ROLLED_BACK = "NarrowingFailed"  # the reason of a change rolled back because the shared pool could not be narrowed

Move = tuple[Tracked, CPUSet | None, int | None]  # a container of the pod, its own CPUs (None: the pool), CFS quota


class _NarrowingFailed(Exception):
    """The kernel still shows other running containers on CPUs that were to become exclusive."""

    def __init__(self, blockers: list[str]) -> None:
        super().__init__("; ".join(blockers))
        self.blockers = blockers


class ModeApplier:
    def __init__(self, pinning: Pinning, runtime: RuntimeReader, registry: Registry, converger: Converger, *,
                 lift_cfs_quota: bool = True, retry_seconds: float = 10.0,
                 on_transition: Callable[[str, str], None] | None = None,
                 on_refusal: Callable[[str], None] | None = None,
                 on_rollback: Callable[[str, str], None] | None = None) -> None:
        self.pinning = pinning
        self.allocator = pinning.allocator
        self.runtime = runtime
        self.registry = registry
        self.converger = converger
        self.lift_cfs_quota = lift_cfs_quota
        self.retry_seconds = retry_seconds
        self.on_transition = on_transition or (lambda old, new: None)
        self.on_refusal = on_refusal or (lambda reason: None)
        self.on_rollback = on_rollback or (lambda old, new: None)
        self.failures: dict[str, dict[str, object]] = {}  # pod uid -> its last change rolled back (for status)
        self.pending: dict[str, ModeRequest] = {}   # pod uid -> a refused request, tried again
        self.refs: dict[str, str] = {}               # pod uid -> namespace/name, for status
        self._kick = asyncio.Event()
        self.created: dict[str, str] = {}            # pod uid -> the mode its sandbox was created with (seen)
        self.models: dict[str, PodInfo] = {}         # pod uid -> the pod model of its last change
        # pod uid -> the pod after its last in-place resize (nodeagent.decisions.resize; its intent states the old size)
        self.resized: Callable[[str], PodInfo | None] = lambda uid: None

    # -- requests -----------------------------------------------------------------------------------------
    async def request(self, req: ModeRequest) -> ModeAnswer:
        """Apply ``req`` (the sink of the watch and of the control socket)."""
        try:
            answer = await self._request(req)
        except RuntimeCallError as e:
            answer = ModeAnswer("error", f"pod {req.ref}: the runtime cannot be reached ({e.code().name}: "
                                         f"{e.details()}); mode {req.mode} not applied")
        except PodSpecError as e:
            answer = ModeAnswer("error", f"pod {req.ref}: {e}")
        if req.source == "api" and (answer.outcome == "refused" or answer.reason == ROLLED_BACK):
            self.pending[req.uid] = req
        elif req.uid:
            self.pending.pop(req.uid, None)
        level = logging.INFO if answer.outcome in ("changed", "refused") else logging.DEBUG
        if answer.outcome == "error":
            level = logging.WARNING
        log.log(level, "mode change (%s) pod=%s -> %s: %s: %s", req.source, req.ref, req.mode, answer.outcome,
                answer.message)
        return answer

    async def _request(self, req: ModeRequest) -> ModeAnswer:
        target = parse_target(req.mode)
        sb = await self._sandbox(req)
        if sb is None:
            return ModeAnswer("ignored", f"pod {req.ref} has no running sandbox on this node")
        uid = sb.metadata.uid
        req = replace(req, uid=uid)
        ref = f"{sb.metadata.namespace}/{sb.metadata.name}"
        self.refs[uid] = ref
        annotations = dict(sb.annotations)
        if self.pinning.bypass.honours(uid, sb.metadata.namespace, sb.metadata.name, annotations):
            return ModeAnswer("ignored", f"pod {ref} bypasses numapin (numapin.io/bypass in a namespace of "
                                         "--bypass-namespaces, or the proxy's own pod): it has no mode")
        created = _created_mode(annotations)
        self.created[uid] = created
        pod = await self._pod_model(req, sb, annotations)
        pod = replace(pod, uid=uid, cpu_manager=None if created == KUBELET_RULE else created,  # type: ignore[arg-type]
                      bypass=False)  # a bypass outside --bypass-namespaces is ignored
        gate = self.pinning.pusher.gate
        async with self.pinning.lock:
            current = self.allocator.pod_mode(uid) or created
            if current == target:
                return ModeAnswer("unchanged", f"pod {ref} already runs in mode {target}")
            # the pool gate is held from the decision until the kernel shows it: no convergence pass (which
            # follows the state) can move the pod's containers before the shared ones are narrowed
            async with gate.exclusive():
                before = self.pinning.mems.snapshot()  # the CPU and the memory state (change_mode moves both)
                change = await asyncio.to_thread(self.allocator.change_mode, pod, target)
                self.models[uid] = pod
                if not change.admitted:
                    self.on_refusal(change.reason or "Refused")
                    self._tell(uid, ref, "Warning", f"mode {current} -> {target} refused ({change.reason}): "
                                                    f"{change.message}")
                    return ModeAnswer("refused", change.message, change.reason, change.to_dict())
                drift = self.pinning.refuse_exclusive() if any(
                    m.new_cpus is not None and m.old_cpus is None for m in change.moves) else None
                if drift is not None:  # kubelet writes cpusets too: no container gets new exclusive CPUs
                    self.pinning.mems.restore(before)
                    self.on_refusal("KubeletDrift")
                    self._tell(uid, ref, "Warning", f"mode {current} -> {target} refused (KubeletDrift): no new "
                                                    f"exclusive CPUs while {drift}")
                    return ModeAnswer("refused", f"pod {ref}: mode {target} refused: no new exclusive CPUs while "
                                                 f"{drift}", "KubeletDrift")
                try:
                    seconds = await self._apply(change)
                except _NarrowingFailed as e:
                    return await self._roll_back(change, before, ref, e)
            self.pinning.pusher.on_resized()
        self.failures.pop(uid, None)
        self.on_transition(change.old, change.new)
        moved = ", ".join(f"{m.name} {m.old_mode}->{m.new_mode} cpus={m.new_cpus or 'shared pool'}"
                          for m in change.moves if m.moved) or "no container moved"
        self._tell(uid, ref, "Normal", f"mode {change.old} -> {change.new}: {moved}")
        return ModeAnswer("changed", f"pod {ref}: mode {change.old} -> {change.new} ({moved}; applied in "
                                     f"{seconds * 1000:.0f} ms)", change=change.to_dict())

    async def _sandbox(self, req: ModeRequest) -> cri_pb2.PodSandbox | None:
        ready = cri_pb2.PodSandboxFilter(state=cri_pb2.PodSandboxStateValue(state=cri_pb2.SANDBOX_READY))
        for sb in await self.runtime.list_sandboxes(ready, timeout=10.0):
            if req.uid and sb.metadata.uid == req.uid:
                return sb
            if not req.uid and (sb.metadata.namespace, sb.metadata.name) == (req.namespace, req.name):
                return sb
        return None

    async def _pod_model(self, req: ModeRequest, sb: cri_pb2.PodSandbox, annotations: dict[str, str]) -> PodInfo:
        """The pod's containers and resources: from the API object, else the webhook's intent on the sandbox, else
        the model its containers were admitted with (since the proxy started), else what CRI showed of them."""
        if req.pod is not None:
            return req.pod
        md = sb.metadata
        resized = self.resized(md.uid)
        if resized is not None:
            return resized
        intent = annotations.get(INTENT_ANNOTATION)
        if intent is not None:
            return decode_intent(intent, uid=md.uid, namespace=md.namespace, name=md.name, annotations=annotations)
        # CRI alone tells only of the containers created so far: those that exist are moved (the others are admitted
        # when kubelet creates them, in the new mode)
        exist = {t.name for t in self.registry.of_pod(md.uid)}
        cri = self.registry.pods.get(md.uid)
        known = {n: r for n, r in cri.resources.items() if n in exist} if cri is not None else {}
        if not exist:
            # nothing runs yet: the new mode is recorded and applies to the containers created from now on
            return PodInfo(uid=md.uid, namespace=md.namespace, name=md.name, qos_class="BestEffort", cpu_manager=None,
                           bypass=False, containers=())
        if not known or cri is None:
            raise PodSpecError(
                f"its resources are unknown to the proxy: the pod has no {INTENT_ANNOTATION} annotation (created "
                "without numapin's webhook) and the runtime's record of its containers was not read; change the "
                "annotation on the API server instead (the proxy's watch reads the pod spec)")
        qos = await self._qos_of(md.uid)

        def containers_as(q: QOSClass) -> tuple[ContainerInfo, ...]:
            return tuple(replace(container_from_cri(n, r, q), role=cri.roles.role(n)) for n, r in known.items())

        containers = containers_as(qos or "Burstable")
        if qos is None:  # as kubelet classes it, as far as CRI tells: every CPU limit set and equal to its request
            qos = "Guaranteed" if all(c.cpu_limit_milli and c.cpu_request_milli == c.cpu_limit_milli
                                      for c in containers) else qos_class(containers)
            if qos == "Guaranteed":  # a Guaranteed container's memory request is its limit (the Memory Manager's)
                containers = containers_as(qos)
        return PodInfo(uid=md.uid, namespace=md.namespace, name=md.name, qos_class=qos, cpu_manager=None,
                       bypass=False, containers=containers)

    async def _qos_of(self, uid: str) -> QOSClass | None:
        """The pod's QoS class from its containers' cgroup path (kubelet's ``kubepods/<class>/pod<uid>``)."""
        for t in self.registry.of_pod(uid):
            try:
                resp = await self.runtime.container_status(t.id, verbose=True, timeout=10.0)
                info = json.loads(resp.info.get("info", "{}"))
            except (RuntimeCallError, ValueError):
                continue
            spec = info.get("runtimeSpec") if isinstance(info, dict) else None
            path = ((spec or {}).get("linux") or {}).get("cgroupsPath") if isinstance(spec, dict) else None
            qos = qos_from_cgroup_parent(str(path)) if path else None
            if qos is not None:
                return qos
        return None

    # -- applying -------------------------------------------------------------------------------------------
    async def _apply(self, change: ModeChange) -> float:
        """Move the pod's running containers and the shared pool (zero-window order), the pool gate held by the
        caller, the change's state in the allocator; returns the seconds taken. Raises _NarrowingFailed (nothing
        of the pod moved, the container modes as they were) when the kernel keeps another container on the new
        exclusive CPUs."""
        t0 = time.perf_counter()
        moves, modes = self._moves(change)
        if change.narrows_pool:
            try:
                await self._narrow(change, moves)  # 1. the shared containers leave the new exclusive CPUs
            except _NarrowingFailed:
                for t, mode in modes:
                    t.mode = mode
                raise
            await self._commit()               # the narrowing is in the kernel: the new decision goes on disk
            await self._push_pod(moves)        # 2. then the pod's containers take the CPUs
        else:
            await self._commit()               # on disk before any container moves: a restart converges to it
            await self._push_pod(moves)        # 1. the pod's containers move (nothing new is exclusive)
            await self._resize_shared()        # 2. then the shared pool widens
        # the kernel, not the updates' answers, is the truth
        await self.converger.repair(self.converger.live(), "after a mode change")
        return time.perf_counter() - t0

    async def _commit(self) -> None:
        await self.pinning.save()
        self.pinning.on_change()

    def _moves(self, change: ModeChange) -> tuple[list[Move], list[tuple[Tracked, TrackedMode]]]:
        """The pod's live containers with their new CPUs and quota (their modes set to the new ones), and their
        modes before."""
        info = self.models.get(change.uid)
        moves: list[Move] = []
        modes: list[tuple[Tracked, TrackedMode]] = []
        for t in self.registry.of_pod(change.uid):
            m = change.move(t.name)
            if t.exited or t.mode == "bypass" or m is None:
                continue
            c = next((x for x in info.containers if x.name == t.name), None) if info is not None else None
            quota = None
            if self.lift_cfs_quota and m.new_mode != "shared" and m.old_mode == "shared":
                quota = UNLIMITED_QUOTA
            elif self.lift_cfs_quota and m.new_mode == "shared" and m.old_mode != "shared":
                quota = milli_cpu_to_quota(c.cpu_limit_milli, _QUOTA_PERIOD) if c and c.cpu_limit_milli else None
            modes.append((t, t.mode))
            t.mode = m.new_mode
            moves.append((t, m.new_cpus, quota))
        return moves, modes

    async def _narrow(self, change: ModeChange, moves: list[Move]) -> None:
        """Narrow the shared pool's containers, repair from the kernel, and read the kernel again: raises
        _NarrowingFailed naming every other running container that still has a CPU becoming exclusive."""
        await self._resize_shared()
        await self.converger.repair(self.registry.on_shared_pool(), "before a mode change")
        taken = CPUSet()
        for m in change.moves:
            if m.new_mode == "exclusive" and m.new_cpus is not None:
                taken = taken | m.new_cpus
        moving = {t.id for t, own, _ in moves if own is not None}
        others = [t for t in self.converger.live() if t.id not in moving]
        views = await self.converger.views(others)
        blockers = []
        for t in others:
            view = views.get(t.id)
            if view is not None and view.running and not view.all_cpus.isdisjoint(taken):
                blockers.append(f"pod={t.pod_ref} container={t.name} id={t.id[:13]} still runs on "
                                f"{view.all_cpus & taken} (cgroup cpuset.cpus {view.cpus or '(empty)'})")
        if blockers:
            raise _NarrowingFailed(blockers)

    async def _roll_back(self, change: ModeChange, before: tuple[CPUState, MemoryState | None], ref: str,
                         e: _NarrowingFailed) -> ModeAnswer:
        """Undo a change whose narrowing failed (the pool gate held): the allocator's state as before (the
        checkpoint was not written), every shared container widened back, the kernel checked."""
        self.allocator.state, self.allocator.memory_state = before
        await self._resize_shared()
        checked, repairs = await self.converger.repair(self.converger.live(), "rolling back a mode change")
        self.pinning.pusher.on_resized()
        still = [f"pod={r.pod} container={r.name}" for r in repairs if not r.ok]
        self.on_rollback(change.old, change.new)
        restored = (f"every cpuset restored ({checked} running containers checked in the kernel)" if not still else
                    f"not yet restored in the kernel: {', '.join(still)} (the convergence keeps trying)")
        message = (f"pod {ref}: mode {change.old} -> {change.new} rolled back: the shared pool could not be narrowed "
                   f"off the new exclusive CPUs ({e}); the pod keeps running in mode {change.old}, {restored}; "
                   "fix the cause (see the proxy's log) and ask again")
        log.warning("mode change rolled back: %s", message)
        self._tell(change.uid, ref, "Warning", message.removeprefix(f"pod {ref}: "))
        self.failures[change.uid] = {"mode": change.new, "reason": ROLLED_BACK, "message": message,
                                     "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        return ModeAnswer("error", message, ROLLED_BACK, change.to_dict())

    def _tell(self, uid: str, ref: str, type: EventType, message: str) -> None:
        """An Event ModeChanged on the pod (``ref``: namespace/name)."""
        self.pinning.on_event(pod_event(ref, uid, type, "ModeChanged", message))

    async def _resize_shared(self) -> None:
        pool, mems = self.pinning.shared_pool()
        result = await self.pinning.pusher.push((t, pool, mems, None) for t in self.registry.on_shared_pool())
        if result.changed or result.failed:
            self.pinning.on_narrow(result.seconds)
            log.info("shared pool -> cpus=%s mems=%s: %d containers updated, %d failed in %.1f ms", pool, mems,
                     result.changed, result.failed, result.seconds * 1000)

    async def _push_pod(self, moves: list[Move]) -> None:
        pool, pool_mems = self.pinning.shared_pool()
        topology = self.pinning.topology
        items = []
        for t, own, quota in moves:
            cpus, mems = (own, topology.numa_of(own)) if own is not None else (pool, pool_mems)
            items.append((t, cpus, mems, quota))
            if quota is not None:
                t.cpus = None  # pushed even when the cpuset stays: the quota changes
        await self.pinning.pusher.push(items)

    # -- refused requests, tried again ------------------------------------------------------------------------
    def kick(self) -> None:
        """The node's allocation changed (CPUs freed, say): try refused requests again now."""
        if self.pending:
            self._kick.set()

    async def run(self) -> None:
        """Try refused requests again after every change of the allocation and every ``retry_seconds``, for ever."""
        while True:
            with contextlib.suppress(TimeoutError):  # asyncio.timeout: see Converger.run
                async with asyncio.timeout(self.retry_seconds):
                    await self._kick.wait()
            self._kick.clear()
            for uid, req in list(self.pending.items()):
                if self.pending.get(uid) is req:
                    with contextlib.suppress(Exception):
                        await self.request(req)

    # -- status and housekeeping -------------------------------------------------------------------------------
    def prune(self, live_uids: set[str]) -> list[str]:
        """Forget the modes of pods that no longer run on the node (after reconcile); returns their uids."""
        state = self.allocator.state
        gone = [uid for uid in state.pod_modes if uid not in live_uids]
        for uid in gone:
            del state.pod_modes[uid]
        for uid in [u for u in {*self.refs, *self.created, *self.models, *self.failures} if u not in live_uids]:
            self.refs.pop(uid, None)
            self.created.pop(uid, None)
            self.models.pop(uid, None)
            self.pending.pop(uid, None)
            self.failures.pop(uid, None)
        return gone

    def modes(self) -> list[dict[str, object]]:
        """Every pod of the node with its CPU mode (``changed``: set while it ran)."""
        out: list[dict[str, object]] = []
        changed = self.allocator.state.pod_modes
        seen: set[str] = set()
        for t in sorted(self.registry.containers.values(), key=lambda t: (t.pod_ref, t.name)):
            if t.pod_uid in seen or t.exited:
                continue
            seen.add(t.pod_uid)
            mode = changed.get(t.pod_uid) or ("bypass" if t.mode == "bypass" else
                                              self.created.get(t.pod_uid, "as created"))
            out.append({"pod": t.pod_ref, "uid": t.pod_uid, "mode": mode,
                        "changed": t.pod_uid in changed,
                        "pending": self.pending[t.pod_uid].mode if t.pod_uid in self.pending else None,
                        "failure": self.failures.get(t.pod_uid)})
        return out


def _created_mode(annotations: dict[str, str]) -> str:
    """The mode the pod's sandbox was created with: the intent's, else the annotation's (kubelet's rule if bad)."""
    intent = annotations.get(INTENT_ANNOTATION)
    if intent is not None:
        try:
            return parse_target(decode_intent(intent, uid="", namespace="", name="").cpu_manager)
        except PodSpecError:
            pass
    try:
        return parse_target(annotations.get(CPU_MANAGER_ANNOTATION))
    except PodSpecError:
        return KUBELET_RULE
