"""CreateContainer, door-neutral (``_Creates``, a part of ``pinning.Pinning``), one step per method: ``admit``
waits for the start-up reconcile, builds the pod (the intent annotation, else CRI), decides and commits under the
allocation lock (allocator, checkpoint, narrowing) and waits for in-flight shared creates that may hold the CPUs the
pool lost; the door then puts ``Admission.target`` on the container and has the runtime create it, and calls
``register`` with the container's id (or ``give_back`` when the runtime refuses it, ``abandon`` when its caller gives
up). The CRI proxy edits the wire message and forwards it between the two (``criproxy.intercept``); the NRI plugin
knows the id at once and calls ``register`` right after ``admit``. A bypassed pod's container passes through
untouched.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field

import grpc

from allocator.cpuset import CPUSet
from allocator.errors import AllocatorError, PodSpecError
from allocator.intent import INTENT_ANNOTATION
from allocator.memory.state import MemoryState
from allocator.node import PodDecision
from allocator.pod import PodInfo
from allocator.state import CPUState
from nodeagent.decisions.allocation import _Allocation, _Flight
from nodeagent.decisions.cri_intent import (
    PodIdentity,
    container_from_cri,
    identity_of,
    pod_from_cri,
    qos_from_cgroup_parent,
)
from nodeagent.decisions.pod_events import PodEvent
from nodeagent.decisions.pod_roles import KIND_ANNOTATION, Instance
from nodeagent.decisions.registry import CriPod, Tracked, TrackedMode
from nodeagent.decisions.resized_pod import with_cri_size
from nodeagent.decisions.target import TargetResources
from nodeagent.node.cdi import cdi_numa_nodes
from nodeagent.node.cfs import QUOTA_PERIOD
from nodeagent.node.devices import devices_numa_nodes
from nodeagent.ports import RuntimeCallError
from nodeagent.rejection import Rejection
from protos import cri_pb2

__all__ = ["Admission", "Placement"]

log = logging.getLogger("numapin.criproxy")

# an admission waiting for the start-up reconcile answers this long before the call's deadline (UNAVAILABLE
# with a message, instead of the caller's bare DEADLINE_EXCEEDED); a call without a deadline waits this long
_GATE_MARGIN = 0.25
_GATE_NO_DEADLINE = 60.0


@dataclass(frozen=True)
class Placement:
    """Where one container runs, as decided and committed: its own CPUs (``pinned``) or the shared pool."""

    mode: TrackedMode
    cpus: CPUSet
    mems: CPUSet
    pinned: bool
    had_cpus: bool      # the container held these CPUs before (a re-created container)

    @property
    def reason(self) -> str:
        return "reused" if self.had_cpus else "allocated" if self.pinned else "shared pool"


@dataclass(eq=False)
class _Ticket:
    """What an admission holds until it is settled: its pod's create slot and its shared create's flight."""

    pod_lock: asyncio.Lock
    flight: _Flight | None
    settled: bool = False


@dataclass(frozen=True)
class Admission:
    """A container admitted (``_Creates.admit``): its pod, its name, where it runs (``placement``, None: a bypassed
    pod's container, passed through untouched) and the resources to put on it (``target``)."""

    ident: PodIdentity
    name: str
    placement: Placement | None
    target: TargetResources | None
    ticket: _Ticket | None = field(default=None, repr=False, compare=False)


class _Creates(_Allocation):
    """CreateContainer, door-neutral: ``admit``, then ``register`` or ``give_back`` (or ``abandon``)."""

    def _pod_lock(self, uid: str) -> asyncio.Lock:
        """The pod's lock; every call is paired with one ``_drop_pod_lock`` (the lock goes with its last user)."""
        lock, users = self._pod_locks.get(uid, (None, 0))
        if lock is None:
            lock = asyncio.Lock()
        self._pod_locks[uid] = (lock, users + 1)
        return lock

    def _drop_pod_lock(self, uid: str) -> None:
        lock, users = self._pod_locks[uid]
        if users <= 1:
            del self._pod_locks[uid]
        else:
            self._pod_locks[uid] = (lock, users - 1)

    async def admit(self, req: cri_pb2.CreateContainerRequest, timeout: float | None) -> Admission:
        """Admit the container's pod and commit the decision (state on disk, shared pool narrowed through the
        pusher) under the allocation lock; then, without it, wait for the in-flight shared creates that may hold
        the CPUs the pool lost. ``timeout``: the seconds the caller still has (None: no deadline). Raises
        Rejection (nothing held then).

        The admission holds the pod's create slot until ``register`` (the runtime created the container),
        ``give_back`` (it did not), ``abandon`` (the caller gave up) or ``settle`` (none of these) is called. A
        bypassed pod's container (``placement`` None) passes through untouched.

        Zero isolation window: a shared container whose create is in flight was decided with the pool of that
        moment; an admission that shrinks the pool narrows the registered shared containers under the lock and
        waits (without it) until every in-flight shared create that may hold the removed CPUs has registered
        and been narrowed, before it returns (before its own container reaches the runtime)."""
        ident = identity_of(req.sandbox_config)
        name = req.config.metadata.name
        verdict = self.bypass.verdict(ident.uid, ident.namespace, ident.name, ident.annotations)
        if verdict in ("self", "untouched"):
            return Admission(ident, name, None, None)
        if verdict == "ignored":
            self.on_bypass_ignored(ident.namespace)
            log.warning("pod=%s container=%s: %s; the annotation is ignored, the pod is treated by its QoS class and "
                        "mode", ident.ref, name, self.bypass.policy.denial(ident.namespace, None))
        await self._await_ready(timeout, ident, name)
        pod_lock = self._pod_lock(ident.uid)
        try:
            await pod_lock.acquire()
        except BaseException:
            self._drop_pod_lock(ident.uid)
            raise
        try:
            reallocate: tuple[str, ...] = ()
            if verdict == "shared":
                pod = _bypassed_model(req, ident)
            else:
                pod, reallocate = await self._pod_model(req, ident)
                pod = self.bypass.model(pod)
            devices = await self._devices(req)
            async with self.lock:
                placement, flights = await self._decide(pod, ident, name, devices, reallocate, req.pod_sandbox_id)
                flight = self._take_off(placement)
                self.creating.add((ident.uid, name))
        except BaseException:
            pod_lock.release()
            self._drop_pod_lock(ident.uid)
            raise
        lift = placement.pinned and self.options.lift_cfs_quota
        admission = Admission(ident, name, placement, TargetResources(placement.cpus, placement.mems, lift),
                              _Ticket(pod_lock, flight))
        try:
            await self._await_flights(flights, timeout, ident, name, placement)
        except asyncio.CancelledError:
            self.abandon(req, admission, None)
            raise
        except BaseException:
            self.settle(admission)
            raise
        return admission

    async def register(self, req: cri_pb2.CreateContainerRequest, container_id: str, admission: Admission) -> None:
        """The runtime created the container ``container_id`` as admitted: it is tracked (a shared one brought to
        the pool of now, which may have changed while it was created), and the admission settled."""
        try:
            if admission.placement is None:
                self._pass_through(req, container_id, admission.ident)
            else:
                await self._register(req, admission.ident, admission.placement, container_id)
        finally:
            self.settle(admission)

    async def give_back(self, admission: Admission, why: str) -> None:
        """The container will not be created (the runtime refused it): CPUs allocated for it go back and the pool
        widens; the admission is settled."""
        try:
            if admission.placement is not None:
                await self._give_back(admission.ident, admission.name, admission.placement, why)
        finally:
            self.settle(admission)

    def abandon(self, req: cri_pb2.CreateContainerRequest, admission: Admission, container_id: str | None) -> None:
        """The caller gave up (its deadline passed): the admission is settled now; a container not created yet
        (``container_id`` None) gives its CPUs back in the background (kubelet creates it again; nothing leaks),
        one the runtime created is tracked all the same, so that its removal releases them."""
        self.settle(admission)
        placement = admission.placement
        if placement is None:
            return
        if container_id is None:
            self._in_background(self._give_back(admission.ident, admission.name, placement, "the caller gave up"))
        else:
            self._in_background(self._register(req, admission.ident, placement, container_id))

    def settle(self, admission: Admission) -> None:
        """The create is over, one way or the other: the pod's next create may go. ``register``, ``give_back`` and
        ``abandon`` settle; a door whose create failed otherwise (its outcome unknown: the next reconcile decides)
        settles alone. Once per admission; later calls do nothing."""
        ticket = admission.ticket
        if ticket is None or ticket.settled:
            return
        ticket.settled = True
        self.creating.discard((admission.ident.uid, admission.name))
        if ticket.flight is not None:
            self._land(ticket.flight)
        ticket.pod_lock.release()
        self._drop_pod_lock(admission.ident.uid)

    def _pass_through(self, req: cri_pb2.CreateContainerRequest, cid: str, ident: PodIdentity) -> None:
        name = req.config.metadata.name
        self.registry.add(Tracked(cid, req.pod_sandbox_id, ident.uid, ident.ref, name, "bypass"))
        log.info("decision pod=%s container=%s mode=bypass (passed through untouched)", ident.ref, name)

    async def _await_ready(self, timeout: float | None, ident: PodIdentity, name: str) -> None:
        """Admissions wait for the start-up reconcile (bounded by the call's deadline): never decided on an
        empty picture of the node."""
        if self.ready.is_set():
            return
        budget = _GATE_NO_DEADLINE if timeout is None else timeout - _GATE_MARGIN
        log.info("pod=%s container=%s waits for the start-up reconcile (at most %.1f s)", ident.ref, name,
                 max(budget, 0.0))
        try:
            await asyncio.wait_for(self.ready.wait(), max(budget, 0.0))
        except TimeoutError:
            self._refused(ident, name, "NotReconciled", "the node agent has not finished its start-up reconcile "
                                                        "with the runtime; kubelet retries")
            raise Rejection(grpc.StatusCode.UNAVAILABLE,
                            f"numapin: pod {ident.ref} container {name} not admitted yet: the proxy "
                            "has not finished its start-up reconcile with the runtime (is the runtime reachable? "
                            "see the proxy's log); no CPUs are decided on an incomplete picture, retry") from None

    async def _pod_model(self, req: cri_pb2.CreateContainerRequest,
                         ident: PodIdentity) -> tuple[PodInfo, tuple[str, ...]]:
        """The pod as numapin knows it (the intent annotation, else CRI) and the containers to give new CPUs."""
        name = req.config.metadata.name
        try:
            if ident.annotations.get(INTENT_ANNOTATION) is not None:
                return _sized_by_kubelet(pod_from_cri(req), name, req), ()
            cri_pod = self.registry.pods.setdefault(ident.uid, CriPod())
            others = (await self._instances(req.pod_sandbox_id, cri_pod) if cri_pod.roles.judges_others(name)
                      else {})
            was_init = cri_pod.roles.on_create(name, req.config.annotations.get(KIND_ANNOTATION), others)
            pod = pod_from_cri(req, cri_pod.resources, cri_pod.roles)
        except PodSpecError as e:
            self._refused(ident, name, "InvalidIntent", str(e))
            raise Rejection(grpc.StatusCode.INVALID_ARGUMENT,
                            f"numapin: pod {ident.ref} container {name}: {e}") from None
        if was_init and self._passed_on(ident.uid, name):
            log.warning("pod=%s container=%s: taken for an init container (it had exited 0 before a sibling was "
                        "first created), its CPUs passed to a sibling; re-created now, it gets CPUs of its own",
                        ident.ref, name)
            return pod, (name,)
        return pod, ()

    def _passed_on(self, uid: str, name: str) -> bool:
        mine = self.allocator.container_cpus(uid, name)
        if mine is None:
            return False
        return any(n != name and not cpus.isdisjoint(mine)
                   for n, cpus in self.allocator.state.assignments.get(uid, {}).items())

    async def _instances(self, sandbox_id: str, cri_pod: CriPod) -> dict[str, Instance]:
        """The latest instance of each container of the sandbox (exit codes of the exited ones whose role is
        still open); empty when the runtime cannot tell (their roles then stay open: no CPU reuse)."""
        try:
            listed = await self.runtime.list_containers(cri_pb2.ContainerFilter(pod_sandbox_id=sandbox_id),
                                                        timeout=10.0)
        except RuntimeCallError as e:
            log.warning("cannot list the containers of sandbox %s (%s): their roles stay open", sandbox_id[:13],
                        e.code().name)
            return {}
        latest: dict[str, cri_pb2.Container] = {}
        for c in listed:
            seen = latest.get(c.metadata.name)
            if seen is None or (c.metadata.attempt, c.created_at) > (seen.metadata.attempt, seen.created_at):
                latest[c.metadata.name] = c
        out: dict[str, Instance] = {}
        for n, c in latest.items():
            exited = c.state == cri_pb2.CONTAINER_EXITED
            code, finished = None, 0
            if exited and n in cri_pod.roles.order and n not in cri_pod.roles.decided:
                status = await self._status(c.id)
                if status is None:
                    continue
                code, finished = status.exit_code, status.finished_at
            out[n] = Instance(n, c.metadata.attempt, c.created_at, exited, code, finished,
                              c.annotations.get(KIND_ANNOTATION))
        return out

    async def _status(self, cid: str) -> cri_pb2.ContainerStatus | None:
        try:
            return (await self.runtime.container_status(cid, timeout=10.0)).status
        except RuntimeCallError:
            return None

    async def _devices(self, req: cri_pb2.CreateContainerRequest) -> dict[str, frozenset[int]]:
        paths = [d.host_path for d in req.config.devices]
        cdi = [d.name for d in req.config.CDI_devices]
        if not paths and not cdi:
            return {}
        return await asyncio.to_thread(self._device_nodes, paths, cdi, req.config.metadata.name)

    def _device_nodes(self, paths: list[str], cdi: list[str], name: str) -> dict[str, frozenset[int]]:
        """The NUMA nodes of a container's devices: CRI's ``devices`` and its CDI devices' device nodes. A CDI
        device that does not resolve gives no hint, a log line and a count; never a failed create."""
        nodes = devices_numa_nodes(paths, self.options.sysfs) if paths else {}
        from_cdi, problems = cdi_numa_nodes(cdi, self.options.sysfs, self.options.cdi_spec_dirs)
        for p in problems:
            log.warning("container %s: %s (no device hint from it)", name, p.detail)
            self.on_cdi_problem(p.reason)
        return {**nodes, **from_cdi}

    async def _decide(self, pod: PodInfo, ident: PodIdentity, name: str, devices: Mapping[str, frozenset[int]],
                      reallocate: tuple[str, ...], sandbox_id: str) -> tuple[Placement, list[_Flight]]:
        """Admit the pod (call with the lock held) and commit: the state is on disk and the registered shared
        containers narrowed before the runtime hears of the container. Returns the placement and the in-flight
        shared creates to wait for (they may hold CPUs the pool just lost). Raises Rejection."""
        had_cpus = self.allocator.container_cpus(ident.uid, name) is not None and name not in reallocate
        before = self.mems.snapshot()
        pool_before = self.allocator.shared_pool()
        try:
            decision = await asyncio.to_thread(self.allocator.admit_pod, pod,
                                               devices={name: devices} if devices else None, reallocate=reallocate,
                                               only=name if self._admitted_before(ident.uid, sandbox_id) else None)
        except AllocatorError as e:
            self._refused(ident, name, getattr(e, "reason", type(e).__name__), str(e))
            raise Rejection(grpc.StatusCode.FAILED_PRECONDITION,
                            f"numapin: pod {ident.ref} container {name}: {e}") from None
        if not decision.admitted:
            self._reject(decision, ident, name)
        if not any(c.name == name for c in decision.containers):
            raise Rejection(grpc.StatusCode.INTERNAL,
                            f"numapin: pod {ident.ref}: the allocator made no decision for container {name}")
        self._refuse_new_exclusive(before, ident, name)
        # what the state says wins: a container holding CPUs runs on them (kubelet keeps an existing
        # assignment even if the container's request changed), anything else on the shared pool
        own = self.allocator.container_cpus(ident.uid, name)
        if own is not None:
            placement = Placement(self.allocator.state.mode(ident.uid, name),  # type: ignore[arg-type]
                                  own, self._mems_of(own, ident.uid, name), True, had_cpus)
        else:
            pool = self.allocator.shared_pool()
            placement = Placement("shared", pool, self._mems_of(pool, ident.uid, name), False, False)
        # the allocation on disk, and any shrink of the pool (this container's CPUs, or its pod's other containers'
        # admitted with it) in the kernel of the shared containers, both before the runtime hears of this one; the
        # two at once (a kill between them leaves either order harmless: the start-up reconcile drops a decision
        # whose container the runtime does not have, the convergence puts the pool back as the state says)
        saves = self.mems.snapshot() != before
        narrows = self.allocator.shared_pool() != pool_before
        steps = [*([self.save()] if saves else []), *([self._resize_shared()] if narrows else [])]
        failures = [r for r in await asyncio.gather(*steps, return_exceptions=True) if isinstance(r, BaseException)]
        if failures:
            raise failures[0]
        if saves:
            self.on_change()
        flights: list[_Flight] = []
        if narrows:
            lost = pool_before - self.allocator.shared_pool()
            flights = [f for f in self._flights if not f.cpus.isdisjoint(lost)]
        return placement, flights

    def _refuse_new_exclusive(self, before: tuple[CPUState, MemoryState | None], ident: PodIdentity,
                              name: str) -> None:
        """Undo the admission (both states) and raise Rejection when it gave CPUs of their own to containers that
        had none while new exclusive admissions are refused (a re-created container keeping its CPUs is no new
        admission)."""
        after = self.allocator.state.assignments
        if all(before[0].get(uid, c) is not None for uid, cs in after.items() for c in cs):
            return
        reason = self.refuse_exclusive()
        if reason is None:
            return
        self.mems.restore(before)
        self._refused(ident, name, "KubeletDrift", f"no new exclusive CPUs while {reason}")
        raise Rejection(grpc.StatusCode.FAILED_PRECONDITION,
                        f"numapin: pod {ident.ref} container {name}: no new exclusive CPUs while {reason}")

    def _admitted_before(self, uid: str, sandbox_id: str) -> bool:
        """Whether the runtime already created a container of this sandbox (kubelet admitted the pod before its
        first container's create; later creates only look their CPUs up)."""
        return any(t.sandbox_id == sandbox_id for t in self.registry.of_pod(uid))

    def _take_off(self, placement: Placement) -> _Flight | None:
        """A shared container's create leaves for the runtime with the pool of this moment (call under the lock)."""
        if placement.pinned:
            return None
        flight = _Flight(placement.cpus, asyncio.Event())
        self._flights.append(flight)
        return flight

    def _land(self, flight: _Flight) -> None:
        """The create is registered and narrowed to the current pool, or it failed."""
        flight.settled.set()
        self._flights.remove(flight)

    async def _await_flights(self, flights: list[_Flight], timeout: float | None, ident: PodIdentity, name: str,
                             placement: Placement) -> None:
        """Wait (without the lock) until the in-flight shared creates that may hold CPUs the pool lost are
        registered and narrowed; past the call's deadline the allocation is given back (UNAVAILABLE)."""
        pending = [f.settled.wait() for f in flights if not f.settled.is_set()]
        if not pending:
            return
        budget = None if timeout is None else max(timeout - _GATE_MARGIN, 0.0)
        try:
            await asyncio.wait_for(asyncio.gather(*pending), budget)
        except TimeoutError:
            await self._give_back(ident, name, placement, "shared containers being created were not narrowed "
                                                          "in time")
            raise Rejection(grpc.StatusCode.UNAVAILABLE,
                            f"numapin: pod {ident.ref} container {name}: shared containers whose creation was "
                            "under way could not be narrowed off its CPUs before the deadline; retry") from None

    async def _give_back(self, ident: PodIdentity, name: str, placement: Placement, why: str) -> None:
        """CPUs allocated for a container that will not be created go back, and the pool widens."""
        if not placement.pinned or placement.had_cpus:
            return
        async with self.lock:
            if self.allocator.container_cpus(ident.uid, name) is not None:
                freed = self.allocator.release_container(ident.uid, name)
                await self._after_release(f"pod={ident.ref} container={name} ({why})", freed)

    async def _register(self, req: cri_pb2.CreateContainerRequest, ident: PodIdentity, placement: Placement,
                        cid: str) -> None:
        """The runtime created the container: track it (a shared one is brought to the pool of now, which may
        have changed while it was being created), and (CRI pod model) remember what kubelet asked for it."""
        name = req.config.metadata.name
        t = Tracked(cid, req.pod_sandbox_id, ident.uid, ident.ref, name, placement.mode, placement.cpus,
                    placement.mems)
        limits = req.config.linux.resources
        if placement.pinned and limits.cpu_quota > 0:
            self.kubelet_cfs[cid] = (limits.cpu_period or QUOTA_PERIOD, limits.cpu_quota)
        async with self.lock:  # not amid a reconcile's rebuild of the registry; no push overtakes another
            self.registry.add(t)
            if not placement.pinned:
                pool = self.allocator.shared_pool()
                mems = self._mems_of(pool, ident.uid, name)
                if (pool, mems) != (placement.cpus, placement.mems):
                    await self.pusher.push([(t, pool, mems, None)])
                    log.info("pod=%s container=%s created with cpus=%s; the pool changed meanwhile: now cpus=%s",
                             ident.ref, name, placement.cpus, pool)
        if ident.annotations.get(INTENT_ANNOTATION) is None:
            resources = cri_pb2.LinuxContainerResources()
            resources.CopyFrom(req.config.linux.resources)
            self.registry.pods.setdefault(ident.uid, CriPod()).resources[name] = resources
        self.on_admitted(placement.mode)
        if placement.pinned:
            kept = " (kept from before: the container was created again)" if placement.had_cpus else ""
            self.on_event(PodEvent(ident.namespace, ident.name, ident.uid, "Normal", "Pinned",
                                   f"container {name}: {placement.mode} cpus {placement.cpus} on NUMA node(s) "
                                   f"{self.topology.numa_of(placement.cpus)}, memory on NUMA node(s) "
                                   f"{placement.mems}{kept}"))
        log.info("decision pod=%s container=%s id=%s mode=%s cpus=%s mems=%s reason=%s", ident.ref, name,
                 cid[:13], placement.mode, placement.cpus, placement.mems, placement.reason)

    def _reject(self, decision: PodDecision, ident: PodIdentity, name: str) -> None:
        self._refused(ident, name, decision.reason or "Rejected",
                      f"topology manager policy {self.policy} scope {self.scope}: {decision.message}")
        code = (grpc.StatusCode.RESOURCE_EXHAUSTED if decision.reason == "UnexpectedAdmissionError"
                else grpc.StatusCode.FAILED_PRECONDITION)
        msg = (f"numapin: pod {ident.ref} container {name} rejected ({decision.reason}) by topology manager "
               f"policy {self.policy} scope {self.scope}: {decision.message}")
        log.info("decision pod=%s container=%s mode=rejected reason=%s message=%s", ident.ref, name,
                 decision.reason, decision.message)
        raise Rejection(code, msg)


def _sized_by_kubelet(pod: PodInfo, name: str, req: cri_pb2.CreateContainerRequest) -> PodInfo:
    """The intent's pod with the container sized by kubelet's create: a container created again after an in-place
    resize carries the new size, while the intent (stamped when the pod was created) states the old one. Values that
    cannot be a resize of the container (kubelet never sends them) leave the intent as it is."""
    try:
        return with_cri_size(pod, name, req.config.linux.resources)
    except PodSpecError:
        return pod


def _bypassed_model(req: cri_pb2.CreateContainerRequest, ident: PodIdentity) -> PodInfo:
    """A honoured bypass: the container alone, which the allocator puts on the shared pool (no CPUs, no rejection,
    whatever the pod's intent annotation says)."""
    qos = qos_from_cgroup_parent(req.sandbox_config.linux.cgroup_parent) or "BestEffort"
    this = container_from_cri(req.config.metadata.name, req.config.linux.resources, qos)
    return PodInfo(uid=ident.uid, namespace=ident.namespace, name=ident.name, qos_class=qos, cpu_manager=None,
                   bypass=True, containers=(this,))
