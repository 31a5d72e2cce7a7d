"""A seeded, kubelet-like churn against ``numapin criproxy`` (a real child process) and a real containerd,
with the truth read from the kernel.

The driver plays what kubelet does: pods of every QoS class and mode (Guaranteed with whole CPUs, fractional
Guaranteed, Burstable, BestEffort, ``qos.gocrane.io/cpu-manager`` none/share/exclusive, with and without the
webhook's ``numapin.io/cpu-intent`` annotation), tenants' pods that ask to bypass numapin or forge what it reads
(``numapin.io/bypass`` outside the bypass namespaces, an intent that lies about their QoS class and CPUs, labels
and annotations that look like another namespace's; issue 25) and an operator's bypassed pod in numapin's own
namespace, init containers run to completion first, app containers
that crash (``sh -c 'sleep N; exit 1'``) and are created again with the same name and attempt+1 (the last
dead instance kept, older ones removed), bursts of concurrent pod starts, pod deletions; and faults: the
proxy SIGKILLed at a random moment of an operation (often while an exclusive pod is being admitted, i.e.
mid-narrowing) and started again, containerd SIGKILLed and started again, cpusets written into a cgroup
behind everybody's back. The number of operations and their kinds come from the seed.

A monitor checks, continuously and after every operation, from ``/proc/<pid>/status`` of every process of
every running container and the cgroup files (``kernel_truth``), against the proxy's decision (its
``/status``, or its state file while it is down):

(a) no CPU of an exclusive container is in another running container's cpuset; no reserved CPU is pinned;
(b) every running container's kernel cpuset and mems are the decision (pinned CPUs, else the shared pool;
    mems: their NUMA nodes), or are repaired within 2 s of the proxy being able to;
(c) after every pod is removed the pool is every non-reserved CPU and a pod asking for all of them is placed;
(d) every call returns within its deadline with a clear gRPC status;
(e) after a kill -9 the state file is whole, pinned containers keep their CPUs, no leftovers.

``python -m numapin_lab.cri.churn --seed 7 --ops 2000`` prints a JSON report (operations, calls by code, kills,
restarts, repairs, violations); exit status 1 when there is a violation. Needs root, containerd, runc and
busybox-static (see ``numapin_lab.cri.containerd``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

import grpc
import grpc.aio

from allocator.cpuset import CPUSet
from allocator.intent import INTENT_ANNOTATION, encode_intent
from allocator.pod import CPU_MANAGER_ANNOTATION, ContainerInfo, PodInfo
from allocator.topology import Topology

from .client import CRIClient, pb
from .containerd import ContainerdLab
from .kernel_truth import ContainerTruth, KernelTruth
from .proxy_process import ProxyProcess

__all__ = ["ChurnConfig", "ChurnReport", "main", "run_churn"]

T = TypeVar("T")

REPAIR_BOUND = 2.0        # seconds a disagreement may last while the proxy runs (invariant b)
CALL_DEADLINE = 30.0      # kubelet's default runtime request timeout is 2 min; ours is shorter
SLACK = 3.0               # a call may end this late after its deadline (scheduling on a loaded machine)
OP_KINDS = ("create", "burst", "sync", "delete", "kill-proxy", "restart-containerd", "drift", "wait", "resize")
OP_WEIGHTS = (30, 8, 25, 14, 8, 3, 5, 7, 10)
assert OP_KINDS[-1] == "resize"  # ChurnConfig.resizes=False weighs it 0: the other kinds' draws stay as they were


@dataclass(frozen=True)
class ChurnConfig:
    seed: int = 1
    ops: int = 60
    reserved_cpus: str = "0"
    sysfs: str = "/sys"
    max_pods: int = 6
    monitor_period: float = 0.2
    proxy_root: str | None = None   # another checkout's numapin to run as the proxy (e.g. to judge an old build)
    time_scale: float = 1.0         # multiplies every deadline and bound (e.g. 5 under software emulation)
    warm_proxy: bool = False        # proxy restarts pre-imported (numapin_lab.warm_start; under emulation)
    # kubelet's in-place resizes among the operations; without them a seed gives the schedule it gave before
    # resizes joined (resize is the last kind: a weight of 0 leaves every other kind's draw as it was)
    resizes: bool = True


@dataclass
class ChurnReport:
    seed: int
    ops: int
    operations: Counter[str] = field(default_factory=Counter)
    calls: Counter[str] = field(default_factory=Counter)      # "Method CODE"
    proxy_kills: int = 0
    kills_while_admitting_exclusive: int = 0
    containerd_restarts: int = 0
    drifts_written: int = 0
    pods_created: int = 0
    tenant_pods: int = 0            # pods that asked to bypass numapin or forged what it reads
    exclusive_admissions: int = 0   # CreateContainer answered OK for a container that narrows the shared pool
    exclusive_nodes: set[int] = field(default_factory=set)  # NUMA nodes the kernel ran exclusive containers on
    containers_started: int = 0
    restarts_attempt_plus_one: int = 0
    resizes: Counter[str] = field(default_factory=Counter)   # kubelet's in-place resizes, by outcome
    kills_mid_resize: int = 0
    samples: int = 0
    longest_disagreement_s: float = 0.0
    repairs_logged: int = 0
    start_refusals_logged: int = 0
    seconds: float = 0.0
    violations: list[dict[str, Any]] = field(default_factory=list)
    trace: list[str] = field(default_factory=list)      # "op kind @t" (and faults), to replay a failure

    def to_json(self) -> dict[str, Any]:
        return {"seed": self.seed, "ops": self.ops, "operations": dict(sorted(self.operations.items())),
                "calls": dict(sorted(self.calls.items())), "proxyKills": self.proxy_kills,
                "killsWhileAdmittingExclusive": self.kills_while_admitting_exclusive,
                "containerdRestarts": self.containerd_restarts, "driftsWritten": self.drifts_written,
                "podsCreated": self.pods_created, "tenantPods": self.tenant_pods,
                "exclusiveAdmissions": self.exclusive_admissions,
                "exclusiveNUMANodes": sorted(self.exclusive_nodes), "containersStarted": self.containers_started,
                "restartsAttemptPlusOne": self.restarts_attempt_plus_one,
                "resizes": dict(sorted(self.resizes.items())), "killsMidResize": self.kills_mid_resize,
                "samples": self.samples,
                "longestDisagreementSeconds": round(self.longest_disagreement_s, 3),
                "repairsLogged": self.repairs_logged, "startRefusalsLogged": self.start_refusals_logged,
                "seconds": round(self.seconds, 1), "violations": self.violations,
                **({"trace": self.trace} if self.violations else {})}


# -- pods ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ContainerPlan:
    name: str
    init: bool
    cpu: int | None       # request (milli-CPU)
    limit: int | None
    crash_after: int | None   # app containers: exit 1 after this many seconds (None: run until deleted)


@dataclass(frozen=True)
class PodPlan:
    name: str
    uid: str
    kind: str
    qos: str               # cgroup parent class: guaranteed | burstable | besteffort
    mode: str | None       # qos.gocrane.io/cpu-manager
    intent: bool
    containers: tuple[ContainerPlan, ...]
    namespace: str = "churn"
    forged: tuple[tuple[str, str], ...] = ()   # annotations a tenant wrote (bypass, a lying intent, ...)

    @property
    def tenant(self) -> bool:
        return self.kind.startswith("tenant-")

    @property
    def inits(self) -> list[ContainerPlan]:
        return [c for c in self.containers if c.init]

    @property
    def apps(self) -> list[ContainerPlan]:
        return [c for c in self.containers if not c.init]

    def annotations(self) -> dict[str, str]:
        out: dict[str, str] = {}
        if self.mode is not None:
            out[CPU_MANAGER_ANNOTATION] = self.mode
        if self.intent:
            qos = {"guaranteed": "Guaranteed", "burstable": "Burstable", "besteffort": "BestEffort"}[self.qos]
            pod = PodInfo(uid=self.uid, namespace="churn", name=self.name, qos_class=qos,  # type: ignore[arg-type]
                          cpu_manager=self.mode, bypass=False,  # type: ignore[arg-type]
                          containers=tuple(ContainerInfo(name=c.name, role="init" if c.init else "app",
                                                         cpu_request_milli=c.cpu, cpu_limit_milli=c.limit)
                                           for c in self.containers))
            out[INTENT_ANNOTATION] = encode_intent(pod)
        out.update(self.forged)
        return out


# what a tenant writes to escape isolation (the proxy must ignore or judge it: docs/tenancy.md)
_BYPASS = ("numapin.io/bypass", "true")
_LOOKALIKE = (("io.kubernetes.pod.namespace", "numapin"), ("io.kubernetes.pod.uid", "churn-00000-00000000"))


def plan_tenant(rng: random.Random, index: int, kind: str, allocatable: int) -> PodPlan:
    """A pod that asks to bypass numapin or forges what it reads: ``tenant-bypass`` (the bypass annotation and
    look-alike identity annotations, outside the bypass namespaces: ignored, the pod treated by its QoS class),
    ``tenant-intent`` (a Burstable pod whose intent claims Guaranteed and whole CPUs: it may get free CPUs, never
    another pod's), ``operator-bypass`` (numapin's own namespace: honoured, on the shared pool)."""
    uid = f"churn-{index:05d}-{rng.getrandbits(32):08x}"
    whole = 1000 * rng.randint(1, max(1, min(2, allocatable)))
    crash = rng.choice((None, None, 2))
    if kind == "tenant-bypass":
        qos = rng.choice(("guaranteed", "burstable", "besteffort"))
        cpu = limit = whole if qos == "guaranteed" else None
        if qos == "burstable":
            cpu, limit = 500, None
        return PodPlan(f"p{index:05d}-{kind}", uid, kind, qos, None, False,
                       (ContainerPlan("app", False, cpu, limit, crash),), forged=(_BYPASS, *_LOOKALIKE))
    if kind == "tenant-intent":
        claimed = PodInfo(uid=uid, namespace="churn", name=f"p{index:05d}-{kind}", qos_class="Guaranteed",
                          cpu_manager="exclusive", bypass=False,
                          containers=(ContainerInfo(name="app", role="app", cpu_request_milli=whole,
                                                    cpu_limit_milli=whole),))
        return PodPlan(f"p{index:05d}-{kind}", uid, kind, "burstable", None, False,
                       (ContainerPlan("app", False, 200, None, crash),),
                       forged=((INTENT_ANNOTATION, encode_intent(claimed)), _BYPASS))
    return PodPlan(f"p{index:05d}-{kind}", uid, kind, "guaranteed", None, False,
                   (ContainerPlan("app", False, whole, whole, crash),), namespace="numapin", forged=(_BYPASS,))


def plan_pod(rng: random.Random, index: int, allocatable: int, kind: str | None = None) -> PodPlan:
    kind = kind or rng.choice(("guaranteed-int", "guaranteed-int", "guaranteed-frac", "burstable", "besteffort",
                       "crane-exclusive", "crane-share", "crane-none", "guaranteed-two-apps", "tenant-bypass",
                       "tenant-intent", "operator-bypass"))
    if kind in ("tenant-bypass", "tenant-intent", "operator-bypass"):
        return plan_tenant(rng, index, kind, allocatable)
    whole = 1000 * rng.randint(1, max(1, min(2, allocatable)))
    qos, mode = "guaranteed", None
    if kind == "guaranteed-frac":
        cpu = limit = rng.choice((100, 250, 500, 1500))
    elif kind == "burstable":
        qos, cpu, limit = "burstable", rng.choice((100, 200, 1000)), rng.choice((None, 2000))
    elif kind == "besteffort":
        qos, cpu, limit = "besteffort", None, None
    elif kind.startswith("crane-"):
        mode = kind.removeprefix("crane-")
        qos = rng.choice(("guaranteed", "burstable")) if mode != "exclusive" else "guaranteed"
        cpu = limit = whole if qos == "guaranteed" else None
        if qos == "burstable":
            cpu, limit = 500, 1000
    else:
        cpu = limit = whole if kind == "guaranteed-int" else 1000
    intent = rng.random() < 0.4
    containers: list[ContainerPlan] = []
    if rng.random() < 0.3:
        icpu = rng.choice((cpu, 100 if qos != "besteffort" else None)) if qos != "besteffort" else None
        ilimit = icpu if qos == "guaranteed" else None
        containers.append(ContainerPlan("init", True, icpu, ilimit if qos == "guaranteed" else limit, None))
    apps = 2 if kind == "guaranteed-two-apps" else 1
    for i in range(apps):
        crash = rng.choice((None, None, 1, 2, 3))
        containers.append(ContainerPlan("app" if i == 0 else f"app{i}", False, cpu, limit, crash))
    uid = f"churn-{index:05d}-{rng.getrandbits(32):08x}"
    return PodPlan(f"p{index:05d}-{kind}", uid, kind, qos, mode, intent, tuple(containers))


@dataclass
class PodRun:
    plan: PodPlan
    config: pb.PodSandboxConfig
    sandbox: str = ""
    instances: dict[str, list[tuple[int, str]]] = field(default_factory=dict)   # name -> [(attempt, id)]
    inits_done: bool = False
    deleting: bool = False


# -- the harness -------------------------------------------------------------------------------------
class Churn:
    def __init__(self, cfg: ChurnConfig, lab: ContainerdLab, proxy: ProxyProcess, report: ChurnReport, *,
                 kubelet_socket: str | None = None) -> None:
        self.cfg = cfg
        self.lab = lab
        self.proxy = proxy
        self.report = report
        self.rng = random.Random(cfg.seed)
        # the operations' kinds come from their own generator: the same seed gives the same schedule of
        # operations and faults whatever the timing (the main one is also drawn from by concurrent operations)
        self.schedule = random.Random(f"schedule-{cfg.seed}")
        self.repair_bound = REPAIR_BOUND * cfg.time_scale
        self.slack = SLACK * cfg.time_scale
        self.topology = Topology.from_sysfs(cfg.sysfs)
        self.reserved = CPUSet.parse(cfg.reserved_cpus)
        self.allocatable = self.topology.all_cpus - self.reserved
        # kubelet's runtime endpoint: the proxy's socket, or (NRI door) containerd's own
        self.kubelet = CRIClient(kubelet_socket or proxy.socket, timeout=CALL_DEADLINE * cfg.time_scale)
        self.truth = KernelTruth(lab.socket)
        self.pods: dict[str, PodRun] = {}
        # every pod cgroup a sandbox was asked for: runc may have made it even when the call failed (containerd
        # killed mid-call), and kubelet removes the cgroups of pods that are gone; so does the churn at its end
        self.pod_cgroups: set[str] = set()
        self.index = 0
        self.op = 0
        self.fault_epoch = 0            # bumped by every kill: a call that spans one may time out
        self.up_since: float | None = time.monotonic()   # proxy and containerd both up and reconciled
        self.last_status: dict[str, Any] | None = None
        self.t0 = time.monotonic()
        self._disagree: dict[tuple[str, str], float] = {}
        self._flagged: set[tuple[str, ...]] = set()
        self._admitting_exclusive = 0
        self._exclusive_create = asyncio.Event()   # set while a CreateContainer that narrows the pool is sent
        self._drifted: dict[str, float] = {}       # container id -> when the harness wrote its cgroup
        self._resizing: set[tuple[str, str]] = set()  # (pod uid, container) being resized: old or new set after a kill

    # -- recording ---------------------------------------------------------------------------------
    def violation(self, invariant: str, detail: str, key: tuple[str, ...] | None = None) -> None:
        k = key or (invariant, detail)
        if k in self._flagged:
            return
        self._flagged.add(k)
        self.report.violations.append({"invariant": invariant, "op": self.op, "detail": detail,
                                       "t": round(time.monotonic() - self.t0, 2)})
        self.trace(f"VIOLATION {invariant}: {detail}")

    def trace(self, what: str) -> None:
        self.report.trace.append(f"{self.op} {what} @{time.monotonic() - self.t0:.2f}")

    def drift_excused(self, cid: str) -> bool:
        """A cgroup the harness itself wrote may be wrong until the proxy has had ``repair_bound`` seconds of
        being up to repair it (invariant b judges that); invariant a must not count it meanwhile."""
        at = self._drifted.get(cid)
        if at is None:
            return False
        if self.up_since is None:
            return True
        return time.monotonic() - max(at, self.up_since) <= self.repair_bound

    async def overlap_excused(self, exclusive: ContainerTruth, other: ContainerTruth) -> bool:
        """Whether ``other`` running on CPUs of ``exclusive`` is excused (invariant a): here, a cgroup the harness
        wrote itself (``drift_excused``); the NRI door adds containers created while the plugin was down."""
        return self.drift_excused(other.id)

    def fault_begins(self, cause: str) -> None:
        """Called just before the harness kills the door's process or containerd (the NRI door opens a window)."""

    async def door_back(self) -> bool:
        """After containerd's restart: whether the door is serving again (the proxy answers /status)."""
        return self.proxy.status() is not None

    async def call(self, method: str, call: Awaitable[T], deadline: float = CALL_DEADLINE, *,
                   fine: tuple[grpc.StatusCode, ...] = ()) -> tuple[bool, T | None]:
        """One CRI call through the proxy, judged by invariant (d): (succeeded, result). Codes in ``fine``
        count as success (NOT_FOUND for removals: already gone). ``deadline`` is scaled by ``time_scale``."""
        epoch, t0 = self.fault_epoch, time.monotonic()
        deadline *= self.cfg.time_scale
        try:
            result = await asyncio.wait_for(call, deadline + 2 * self.slack)
        except TimeoutError:
            self.report.calls[f"{method} HUNG"] += 1
            self.violation("d", f"{method} did not return within {deadline + 2 * self.slack:g} s "
                                f"(deadline {deadline:g} s)")
            return False, None
        except grpc.aio.AioRpcError as e:
            code, details = e.code(), e.details() or ""
            self.report.calls[f"{method} {code.name}"] += 1
            late = time.monotonic() - t0 > deadline + self.slack
            faulted = epoch != self.fault_epoch
            if late:
                self.violation("d", f"{method} returned {code.name} after {time.monotonic() - t0:.1f} s "
                                    f"(deadline {deadline:g} s)")
            elif code == grpc.StatusCode.DEADLINE_EXCEEDED and not faulted:
                self.violation("d", f"{method} hit its deadline without a fault: {details}")
            elif code == grpc.StatusCode.INTERNAL or (code == grpc.StatusCode.UNKNOWN and "numapin" in details):
                self.violation("d", f"{method} {code.name}: {details}")
            elif not details:
                self.violation("d", f"{method} {code.name} without a message")
            return code in fine, None
        self.report.calls[f"{method} OK"] += 1
        if time.monotonic() - t0 > deadline + self.slack:
            self.violation("d", f"{method} took {time.monotonic() - t0:.1f} s (deadline {deadline:g} s)")
        return True, result

    # -- kubelet's moves -----------------------------------------------------------------------------
    async def create_pod(self, kind: str | None = None) -> None:
        if len(self.pods) >= self.cfg.max_pods:
            await self.delete_pod()
            return
        plan = plan_pod(self.rng, self.index, len(self.allocatable), kind)
        self.index += 1
        cfg = CRIClient.sandbox_config(plan.name, plan.uid, namespace=plan.namespace, qos=plan.qos,
                                       annotations=plan.annotations())
        run = PodRun(plan, cfg)
        self.pods[plan.uid] = run
        self.pod_cgroups.add(cfg.linux.cgroup_parent)
        ok, sid = await self.call("RunPodSandbox", self.kubelet.run_pod_sandbox(cfg), 60.0)
        if not ok or not sid:
            return
        run.sandbox = sid
        self.report.pods_created += 1
        self.report.tenant_pods += plan.tenant or plan.kind == "operator-bypass"
        exclusive_like = plan.qos == "guaranteed" and plan.mode != "none" and any(
            c.cpu is not None and c.cpu % 1000 == 0 for c in plan.apps)
        self._admitting_exclusive += exclusive_like
        try:
            await self.sync_pod(run)
        finally:
            self._admitting_exclusive -= exclusive_like

    async def _start_existing(self, cid: str) -> bool:
        ok, _ = await self.call("StartContainer", self.kubelet.start_container(cid))
        self.report.containers_started += ok
        return ok

    async def _create_and_start(self, run: PodRun, c: ContainerPlan, attempt: int) -> str | None:
        if c.init:
            command: tuple[str, ...] = ("true",)
        elif c.crash_after is not None:
            command = ("sh", "-c", f"sleep {c.crash_after}; exit 1")
        else:
            command = ("sleep", "3600")
        config = CRIClient.container_config(c.name, cpu_milli=c.cpu, limit_milli=c.limit, command=command,
                                            attempt=attempt)
        narrowing = run.plan.qos == "guaranteed" and run.plan.mode != "none" and c.cpu is not None and \
            c.cpu % 1000 == 0
        if narrowing:
            self._exclusive_create.set()
        try:
            ok, cid = await self.call("CreateContainer",
                                      self.kubelet.create_container(run.sandbox, config, run.config))
        finally:
            if narrowing:
                self._exclusive_create.clear()
        if not ok or not cid:
            return None
        self.report.exclusive_admissions += narrowing
        if attempt > 0:
            self.report.restarts_attempt_plus_one += 1
        await self._start_existing(cid)
        return cid

    async def _observe(self, run: PodRun) -> dict[str, list[tuple[int, str, int]]] | None:
        """The pod's containers as the runtime lists them (kubelet's PLEG): name -> [(attempt, id, state)]."""
        ok, items = await self.call("ListContainers",
                                    self.kubelet.list_containers(pod_sandbox_id=run.sandbox))
        if not ok or items is None:
            return None
        out: dict[str, list[tuple[int, str, int]]] = {}
        for c in items:
            out.setdefault(c.metadata.name, []).append((c.metadata.attempt, c.id, int(c.state)))
        for v in out.values():
            v.sort()
        run.instances = {n: [(a, i) for a, i, _ in v] for n, v in out.items()}
        return out

    async def sync_pod(self, run: PodRun) -> None:
        """kubelet's SyncPod: init containers one by one to completion, then every app container running (a
        dead one is created again with attempt+1; the last dead instance is kept, older ones removed)."""
        if not run.sandbox or run.deleting:
            return
        seen = await self._observe(run)
        if seen is None:
            return
        for c in run.plan.inits if not run.inits_done else ():
            for _ in range(60):
                last = seen.get(c.name, [])[-1:] or [None]
                inst = last[0]
                if inst is not None and inst[2] == pb.CONTAINER_EXITED:
                    break
                if inst is None:
                    if await self._create_and_start(run, c, 0) is None:
                        return
                elif inst[2] == pb.CONTAINER_CREATED and not await self._start_existing(inst[1]):
                    return
                await asyncio.sleep(0.1)
                seen = await self._observe(run)
                if seen is None:
                    return
            else:
                return
        run.inits_done = True
        for c in run.plan.apps:
            insts = seen.get(c.name, [])
            if insts and insts[-1][2] == pb.CONTAINER_RUNNING:
                continue
            if insts and insts[-1][2] == pb.CONTAINER_CREATED:  # created, its start failed: start it again
                await self._start_existing(insts[-1][1])
                continue
            if await self._create_and_start(run, c, insts[-1][0] + 1 if insts else 0) is None:
                continue
            dead = [i for i in insts if i[2] == pb.CONTAINER_EXITED]
            for _, old, _ in dead[:-1]:  # kubelet's GC keeps the most recent dead instance
                await self.call("RemoveContainer", self.kubelet.remove_container(old),
                                fine=(grpc.StatusCode.NOT_FOUND,))

    async def delete_pod(self, run: PodRun | None = None) -> None:
        """kubelet's pod deletion: stop every container, stop the sandbox, remove the containers and the
        sandbox (what the runtime lists, not only what the driver remembers)."""
        if run is None:
            if not self.pods:
                return
            run = self.pods[self.rng.choice(sorted(self.pods))]
        run.deleting = True
        if not run.sandbox:
            self.pods.pop(run.plan.uid, None)
            return
        seen = await self._observe(run)
        if seen is None:
            return
        ids = [i for v in seen.values() for _, i, _ in v]
        gone = (grpc.StatusCode.NOT_FOUND,)
        for cid in ids:
            if not (await self.call("StopContainer", self.kubelet.stop_container(cid, 0), fine=gone))[0]:
                return
        if not (await self.call("StopPodSandbox", self.kubelet.stop_pod_sandbox(run.sandbox), fine=gone))[0]:
            return
        for cid in ids:
            if not (await self.call("RemoveContainer", self.kubelet.remove_container(cid), fine=gone))[0]:
                return
        if not (await self.call("RemovePodSandbox", self.kubelet.remove_pod_sandbox(run.sandbox),
                                fine=gone))[0]:
            return
        self.pods.pop(run.plan.uid, None)

    # -- faults -------------------------------------------------------------------------------------
    async def restart_proxy(self) -> None:
        before = self.last_status
        st = await asyncio.to_thread(self.proxy.start)
        self.up_since = time.monotonic()
        try:
            state = await asyncio.to_thread(self.proxy.state)
        except (OSError, ValueError) as e:
            self.violation("e", f"state file unreadable after kill -9: {e}")
            state = None
        left = self.proxy.leftovers()
        if left:
            self.violation("e", f"leftovers in the state directory after restart: {left}", ("e", "leftovers"))
        if before is not None and state is not None:
            running = await self.truth.running() or []
            live = {(c.pod_uid, c.name) for c in running}
            after = {(a["podUID"], a["container"]): a["cpus"] for a in st.get("assignments", [])}
            for a in before.get("assignments", []):
                k = (a["podUID"], a["container"])
                if k in live and after.get(k) != a["cpus"] and k not in self._resizing:
                    self.violation("e", f"running container {k} held cpus {a['cpus']} before the kill, "
                                        f"{after.get(k)} after")

    async def kill_proxy_during(self, carrier: Callable[[], Awaitable[None]], *, mid_create: bool,
                                delay: float | None = None) -> None:
        """SIGKILL the proxy while ``carrier`` runs: a random moment (or after ``delay`` seconds), or
        (``mid_create``) a few ms into the CreateContainer of an exclusive container (the proxy narrows the shared
        pool then)."""
        if delay is None:
            delay = self.rng.uniform(0.0, 0.03) if mid_create else self.rng.uniform(0.0, 1.0)

        async def killer() -> None:
            if mid_create:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._exclusive_create.wait(), 5.0 * self.cfg.time_scale)
            await asyncio.sleep(delay)
            if self._exclusive_create.is_set():
                self.report.kills_while_admitting_exclusive += 1
            self.up_since = None
            self.fault_epoch += 1
            self.fault_begins("door killed")
            await asyncio.to_thread(self.proxy.kill)
            self.report.proxy_kills += 1
            self.trace("proxy SIGKILLed" + (" during an exclusive CreateContainer"
                                            if self._exclusive_create.is_set() else ""))

        await asyncio.gather(carrier(), killer())
        await self.restart_proxy()

    async def restart_containerd_during(self, carrier: Callable[[], Awaitable[None]]) -> None:
        delay = self.rng.uniform(0.0, 0.4)

        async def killer() -> None:
            await asyncio.sleep(delay)
            self.up_since = None
            self.fault_epoch += 1
            self.fault_begins("containerd killed")
            await asyncio.to_thread(self.lab.stop_containerd, signal.SIGKILL)
            self.trace("containerd SIGKILLed")
            await asyncio.sleep(self.rng.uniform(0.0, 1.0))
            await asyncio.to_thread(self.lab.start_containerd)
            self.report.containerd_restarts += 1

        await asyncio.gather(carrier(), killer())
        for _ in range(int(100 * self.cfg.time_scale)):  # the proxy notices containerd is back by itself
            if await self.truth.running() is not None and await self.door_back():
                break
            await asyncio.sleep(0.1)
        self.up_since = time.monotonic()

    def resizable(self) -> list[tuple[PodRun, ContainerPlan]]:
        """Running app containers of Guaranteed pods (kubelet resizes them in place; the QoS class stays)."""
        out = []
        for run in self.pods.values():
            if run.deleting or run.plan.qos != "guaranteed" or run.plan.mode == "none":
                continue
            for c in run.plan.apps:
                if run.instances.get(c.name) and c.cpu is not None:
                    out.append((run, c))
        return out

    async def resize_pod(self, run: PodRun, c: ContainerPlan, milli: int) -> str:
        """kubelet's resize of a running container (``UpdateContainerResources``, the whole block, no cpuset); the
        plan follows on success (a later re-creation carries the new size, as kubelet's does). Returns the
        outcome."""
        cid = run.instances[c.name][-1][1]
        res = pb.LinuxContainerResources(cpu_period=100000, cpu_quota=milli * 100, cpu_shares=milli * 1024 // 1000,
                                         oom_score_adj=-997)
        refused = (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.RESOURCE_EXHAUSTED)
        try:
            await asyncio.wait_for(self.kubelet.update_container_resources(cid, res),
                                   CALL_DEADLINE * self.cfg.time_scale + 2 * self.slack)
        except grpc.aio.AioRpcError as e:
            outcome = "refused" if e.code() in refused else e.code().name
            if e.code() == grpc.StatusCode.INTERNAL or not e.details():
                self.violation("d", f"UpdateContainerResources {e.code().name}: {e.details()}")
            self.report.calls[f"UpdateContainerResources {e.code().name}"] += 1
            self.report.resizes[outcome] += 1
            return outcome
        except TimeoutError:
            self.violation("d", "UpdateContainerResources (a resize) did not return")
            return "hung"
        self.report.calls["UpdateContainerResources OK"] += 1
        self.report.resizes["resized"] += 1
        resized = replace(c, cpu=milli, limit=milli)
        run.plan = replace(run.plan, containers=tuple(resized if x.name == c.name else x
                                                      for x in run.plan.containers))
        return "resized"

    async def resize(self) -> None:
        """A resize of a random running Guaranteed container to a random size (sometimes more than the node has);
        a third of them with the proxy SIGKILLed a few ms in, then sent again (kubelet retries on its next sync)."""
        choices = self.resizable()
        if not choices:
            await self.create_pod("guaranteed-frac")
            return
        run, c = self.rng.choice(choices)
        milli = self.rng.choice((500, 1000, 1500, 1000 * max(1, min(2, len(self.allocatable))),
                                 1000 * (len(self.allocatable) + 1)))
        key = (run.plan.uid, c.name)
        self.trace(f"resize {run.plan.name}/{c.name} {c.cpu}m -> {milli}m")
        if self.schedule.random() < 0.34:
            self._resizing.add(key)
            try:
                self.report.kills_mid_resize += 1
                await self.kill_proxy_during(lambda: self._resize_quietly(run, c, milli), mid_create=False,
                                             delay=self.rng.uniform(0.0, 0.04))
                await self.resize_pod(run, c, milli)  # kubelet's next sync
            finally:
                self._resizing.discard(key)
        else:
            await self.resize_pod(run, c, milli)

    async def _resize_quietly(self, run: PodRun, c: ContainerPlan, milli: int) -> None:
        """The resize a kill cuts: any error is the kill's (judged by the retry after it)."""
        cid = run.instances[c.name][-1][1]
        res = pb.LinuxContainerResources(cpu_period=100000, cpu_quota=milli * 100, cpu_shares=milli * 1024 // 1000,
                                         oom_score_adj=-997)
        with contextlib.suppress(grpc.aio.AioRpcError, TimeoutError):
            await asyncio.wait_for(self.kubelet.update_container_resources(cid, res), 10 * self.cfg.time_scale)

    async def free_exclusive_cpus(self) -> None:
        """Delete the pods holding pinned CPUs (so that the next exclusive pod narrows the pool)."""
        st = self.last_status or {}
        holders = {a["podUID"] for a in st.get("assignments", [])}
        for uid in sorted(holders & set(self.pods)):
            await self.delete_pod(self.pods[uid])

    async def drift(self) -> None:
        """Write every CPU into a running container's cgroup, behind the proxy's and containerd's back."""
        def lasting(c: ContainerTruth) -> bool:
            run = self.pods.get(c.pod_uid)
            plan = next((p for p in run.plan.containers if p.name == c.name), None) if run else None
            return plan is not None and plan.crash_after is None and not plan.init

        running = [c for c in await self.truth.running() or [] if lasting(c)]
        if not running:
            return
        c = self.rng.choice(sorted(running, key=lambda x: x.id))
        lines = Path(f"/proc/{c.pid}/cgroup").read_text().splitlines()
        for line in lines:
            _, ctrls, path = line.split(":", 2)
            target = (Path("/sys/fs/cgroup/cpuset") / path.lstrip("/") if "cpuset" in ctrls.split(",")
                      else Path("/sys/fs/cgroup") / path.lstrip("/") if ctrls == "" else None)
            if target is not None and (target / "cpuset.cpus").exists():
                everything = self.topology.all_cpus
                wrong = everything if c.cgroup_cpus != everything else CPUSet([everything.max()])
                with contextlib.suppress(OSError):
                    (target / "cpuset.cpus").write_text(str(wrong))
                    self._drifted[c.id] = time.monotonic()
                    self.report.drifts_written += 1
                    self.trace(f"drift {c.pod} {c.name} {c.id[:13]} -> {wrong}")
                return

    # -- the monitor ----------------------------------------------------------------------------------
    def decision_of(self, status: dict[str, Any]) -> tuple[dict[tuple[str, str], tuple[CPUSet, str]], CPUSet]:
        pinned = {(a["podUID"], a["container"]): (CPUSet.parse(a["cpus"]), a["mode"])
                  for a in status.get("assignments", [])}
        return pinned, CPUSet.parse(status.get("sharedPool", "") or "")

    async def check(self) -> None:
        status = await asyncio.to_thread(self.proxy.status, 2.0) if self.proxy.running else None
        if status is not None:
            self.last_status = status
        running = await self.truth.running()
        if running is None:
            return
        self.report.samples += 1
        if status is None:  # the proxy is down: invariant (a) from its state file
            with contextlib.suppress(OSError, ValueError):
                state = await asyncio.to_thread(self.proxy.state)
                modes = (state.get("numapin") or {}).get("modes", {})
                pinned = {(uid, name): (CPUSet.parse(cpus), modes.get(uid, {}).get(name, "exclusive"))
                          for uid, cs in (state.get("entries") or {}).items() for name, cpus in cs.items()}
                await self.check_exclusive(running, pinned)
            return
        pinned, pool = self.decision_of(status)
        await self.check_exclusive(running, pinned)
        now = time.monotonic()
        seen: set[tuple[str, str]] = set()
        for c in running:
            cpus, mode = pinned.get((c.pod_uid, c.name), (pool, ""))
            mems = self.topology.numa_of(cpus)
            exact = c.exactly()
            if exact == (cpus, mems):
                if mode == "exclusive":
                    self.report.exclusive_nodes |= set(mems)
                continue
            key = (c.id, str(cpus))
            seen.add(key)
            if self.up_since is None:
                continue
            first = max(self._disagree.setdefault(key, now), self.up_since)
            lasted = now - first
            self.report.longest_disagreement_s = max(self.report.longest_disagreement_s, lasted)
            if lasted > self.repair_bound:
                self.violation("b", f"{c.pod} {c.name} (attempt {c.attempt}, id {c.id[:13]}) runs on "
                                    f"cpus {c.cpus} mems {c.mems} (cgroup {c.cgroup_cpus}/{c.cgroup_mems}), decision "
                                    f"cpus {cpus} mems {mems}, for {lasted:.1f} s", ("b", *key))
        for key in [k for k in self._disagree if k not in seen]:
            del self._disagree[key]

    async def check_exclusive(self, running: list[ContainerTruth],
                              pinned: dict[tuple[str, str], tuple[CPUSet, str]]) -> None:
        for (uid, name), (cpus, _) in pinned.items():
            if cpus & self.reserved:
                self.violation("a", f"reserved CPUs {cpus & self.reserved} pinned to pod {uid} container {name}")
        for x in running:
            own, mode = pinned.get((x.pod_uid, x.name), (CPUSet(), ""))
            if mode != "exclusive" or self.drift_excused(x.id):
                continue
            mine = x.cpus & own
            for y in running:
                if y.id == x.id or not (y.cpus & mine) or await self.overlap_excused(x, y):
                    continue
                # confirm: x runs (same process) before and after y is seen on its CPUs
                x1 = await self.truth.one(x.id)
                y1 = await self.truth.one(y.id)
                x2 = await self.truth.one(x.id)
                if x1 and y1 and x2 and (x1.cpus & x2.cpus & y1.cpus & own):
                    await asyncio.sleep(0.1)
                    y2 = await self.truth.one(y.id)
                    later = y2.describe() if y2 else "gone"
                    self.violation("a", f"exclusive {x.pod} {x.name} (cpus {own}, id {x.id[:13]}) shares cpus "
                                        f"{y1.cpus & own} with running {y.pod} {y.name} (attempt {y.attempt}, "
                                        f"id {y.id[:13]}, cpus {y1.cpus}): kernel {y1.describe()}; exclusive "
                                        f"{x1.describe()}; 0.1 s later: {later}", ("a", x.id, y.id))

    async def monitor(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self.check()
            except Exception as e:  # never let the oracle die silently
                self.violation("monitor", f"{type(e).__name__}: {e}")
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), self.cfg.monitor_period)

    # -- the run ------------------------------------------------------------------------------------
    async def step(self) -> None:
        kind = self.schedule.choices(OP_KINDS, OP_WEIGHTS if self.cfg.resizes else (*OP_WEIGHTS[:-1], 0))[0]
        self.report.operations[kind] += 1
        self.trace(kind)
        if kind == "create":
            await self.create_pod()
        elif kind == "burst":
            n = self.rng.randint(2, 4)
            await asyncio.gather(*(self.create_pod() for _ in range(n)))
        elif kind == "sync":
            for run in list(self.pods.values()):
                await self.sync_pod(run)
        elif kind == "delete":
            await self.delete_pod()
        elif kind == "kill-proxy":  # most often while an exclusive pod is admitted (the pool narrows)
            if self.schedule.random() < 0.6:
                await self.free_exclusive_cpus()
                await self.kill_proxy_during(lambda: self.create_pod("guaranteed-int"), mid_create=True)
            else:
                await self.kill_proxy_during(self.create_pod, mid_create=False)
        elif kind == "restart-containerd":
            await self.restart_containerd_during(lambda: self.create_pod("guaranteed-int"))
        elif kind == "drift":
            await self.drift()
        elif kind == "resize":
            await self.resize()
        else:
            await asyncio.sleep(self.rng.uniform(0.5, 2.0))

    async def finish(self) -> None:
        """Invariant (c): remove every pod, then the pool is every non-reserved CPU and a pod asking for all
        of them is placed."""
        for _ in range(5):
            for run in list(self.pods.values()):
                await self.delete_pod(run)
            if not self.pods:
                break
            await asyncio.sleep(1.0)
        if self.pods:
            self.violation("c", f"pods could not be deleted: {sorted(self.pods)}")
            return
        await asyncio.sleep(0.5)
        st = await asyncio.to_thread(self.proxy.status)
        if st is None:
            self.violation("c", "the proxy does not answer /status at the end")
            return
        if st.get("assignments"):
            self.violation("c", f"assignments left after every pod was removed: {st['assignments']}")
        free = sum(int(v) for v in st.get("freeCPUsPerNUMA", {}).values())
        if free != len(self.allocatable):
            self.violation("c", f"{free} CPUs free after every pod was removed, expected {len(self.allocatable)}")
        whole = PodPlan("all-cpus", f"churn-all-{self.cfg.seed}", "guaranteed-int", "guaranteed", None, False,
                        (ContainerPlan("app", False, 1000 * len(self.allocatable), 1000 * len(self.allocatable),
                                       None),))
        cfg = CRIClient.sandbox_config(whole.name, whole.uid, namespace="churn", qos="guaranteed")
        run = PodRun(whole, cfg)
        self.pods[whole.uid] = run
        self.pod_cgroups.add(cfg.linux.cgroup_parent)
        ok, sid = await self.call("RunPodSandbox", self.kubelet.run_pod_sandbox(cfg), 60.0)
        if not ok or not sid:
            self.violation("c", "the pod asking for every CPU got no sandbox")
            return
        run.sandbox = sid
        cid = await self._create_and_start(run, whole.containers[0], 0)
        got = None
        for _ in range(int(50 * self.cfg.time_scale)):
            got = next((c for c in await self.truth.running() or [] if c.id == cid), None)
            if got is not None and got.exactly() == (self.allocatable, self.topology.numa_of(self.allocatable)):
                break
            await asyncio.sleep(0.1)
        else:
            self.violation("c", f"the pod asking for all {len(self.allocatable)} allocatable CPUs was not placed "
                                f"on them: {got.cpus if got else 'not running'}")
        await self.delete_pod(run)

    async def run(self) -> None:
        self.t0 = time.monotonic()
        stop = asyncio.Event()
        mon = asyncio.create_task(self.monitor(stop))
        try:
            for op in range(self.cfg.ops):
                self.op = op
                await self.step()
                if not self.proxy.running:
                    await self.restart_proxy()
                await self.check()
            self.op = self.cfg.ops
            await asyncio.sleep(self.repair_bound + 0.5)   # let the last disagreements be repaired (or flagged)
            await self.check()
            await self.finish()
        finally:
            stop.set()
            await mon
            await self.kubelet.close()
            await self.truth.close()
        log = self.proxy.log.read_text(errors="replace") if self.proxy.log.exists() else ""
        self.report.repairs_logged = log.count(": repaired pod=")
        self.report.start_refusals_logged = log.count("could not be taken back")
        self.report.seconds = time.monotonic() - self.t0


async def run_churn(cfg: ChurnConfig, lab: ContainerdLab, workdir: Path) -> ChurnReport:
    """Run the churn against ``lab`` (started) with a fresh proxy in ``workdir``; returns the report."""
    report = ChurnReport(cfg.seed, cfg.ops)
    kw = {"root": Path(cfg.proxy_root).resolve()} if cfg.proxy_root else {}
    proxy = ProxyProcess(workdir, lab.socket, reserved_cpus=cfg.reserved_cpus, sysfs=cfg.sysfs,
                         warm=cfg.warm_proxy, **kw)
    await drive(lab, proxy, lambda: Churn(cfg, lab, proxy, report))
    return report


async def drive(lab: ContainerdLab, door: ProxyProcess, make: Callable[[], Churn]) -> None:
    """Start the door's process, run the churn ``make`` gives, then stop the process and leave containerd empty."""
    await asyncio.to_thread(door.start)
    churn = make()
    try:
        await churn.run()
    finally:
        door.stop()
        await leave_empty(lab, churn)


async def leave_empty(lab: ContainerdLab, churn: Churn) -> None:
    """After a run: no sandbox left in containerd, and the churn's pod cgroups handed to the lab to clean."""
    async with CRIClient(lab.socket) as direct:  # leave containerd empty
        with contextlib.suppress(grpc.aio.AioRpcError):
            for sb in await direct.list_pod_sandbox():
                await direct.stop_pod_sandbox(sb.id)
                await direct.remove_pod_sandbox(sb.id)
    # and no pod of the churn's, as kubelet leaves none: a container containerd started after its sandbox was
    # removed (a start still under way in containerd when the churn's call timed out) or a sandbox containerd
    # lost to a kill keeps running with no record; the lab's stop() kills what runs in these cgroups (after
    # containerd is gone) and removes them
    lab.pod_cgroups.update(p for p in churn.pod_cgroups if p.strip("/"))


def build_parser(prog: str = "python -m numapin_lab.cri.churn", description: str | None = None
                 ) -> argparse.ArgumentParser:
    """The churn's command line (the NRI door's adds its own options to it)."""
    p = argparse.ArgumentParser(prog=prog, description=description or __doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seed", type=int, default=1, help="the seed of the operations (default 1)")
    p.add_argument("--ops", type=int, default=2000, help="number of operations (default 2000)")
    p.add_argument("--reserved-cpus", default="0", help="the proxy's --reserved-cpus (default 0)")
    p.add_argument("--sysfs", default="/sys", help="sysfs of the topology (default /sys)")
    p.add_argument("--max-pods", type=int, default=6, help="pods alive at once at most (default 6)")
    p.add_argument("--workdir", help="where the lab and the proxy live (default: a new directory in /tmp, removed)")
    p.add_argument("--keep", action="store_true", help="keep the work directory (logs) after the run")
    p.add_argument("--proxy-root", help="run the proxy from this numapin checkout instead of this one")
    p.add_argument("--time-scale", type=float, default=1.0,
                   help="multiply every deadline and bound by this (default 1; e.g. 5 under software emulation)")
    return p


def config_of(p: argparse.ArgumentParser, args: argparse.Namespace) -> ChurnConfig:
    """The configuration the parsed ``args`` ask for (a bad value exits through ``p.error``)."""
    if args.ops < 0 or args.max_pods < 1 or args.time_scale <= 0:
        p.error("--ops must be >= 0, --max-pods >= 1 and --time-scale > 0")
    try:
        CPUSet.parse(args.reserved_cpus)
    except ValueError as e:
        p.error(f"--reserved-cpus: {e}")
    return ChurnConfig(seed=args.seed, ops=args.ops, reserved_cpus=args.reserved_cpus, sysfs=args.sysfs,
                       max_pods=args.max_pods, proxy_root=args.proxy_root, time_scale=args.time_scale)


Runner = Callable[[ChurnConfig, ContainerdLab, Path], Awaitable[ChurnReport]]


def run_printed(args: argparse.Namespace, cfg: ChurnConfig, lab_of: Callable[[Path], ContainerdLab], run: Runner,
                door: str) -> int:
    """A churn from the command line: the lab in ``--workdir`` (or a new directory in /tmp, removed unless
    ``--keep``), ``run`` with the door's process in ``<workdir>/<door>``; prints the JSON report, returns the exit
    status (1 on a violation)."""
    work = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="npx-churn-", dir="/tmp"))
    lab = lab_of(work / "ctrd")
    try:
        lab.start()
        report = asyncio.run(run(cfg, lab, work / door))
    finally:
        lab.stop()
        if not args.keep and not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    json.dump(report.to_json(), sys.stdout, indent=1)
    print()
    return 1 if report.violations else 0


def main(argv: list[str] | None = None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    return run_printed(args, config_of(p, args), ContainerdLab, run_churn, "proxy")


if __name__ == "__main__":
    sys.exit(main())
