"""Ask a node's topology manager, as numapin's allocator emulates it, whether it would admit a pod.

The node is rebuilt from its NodeResourceTopology (``synthetic_node``: a synthetic machine with the node's NUMA
nodes, CPU counts, reserved and occupied CPUs, and its memory and huge pages per NUMA node when it publishes them)
and the pod goes through ``NodeAllocator.admit_pod(dry_run=True)``.
Answers depend only on the node's shape (and free CPUs, for "now") and on the pod's resources, so they are cached
by those keys: a thousand identical nodes cost one simulation. Allocators are cached too (dry runs leave them as
they were). Simulations run in worker threads; one lock keeps the caches and allocators consistent (the event
loop only peeks at the answers, without the lock).
"""

from __future__ import annotations

import contextlib
import logging
import operator
import threading
from collections import OrderedDict
from dataclasses import dataclass, fields, replace
from typing import Any

from allocator.errors import AllocatorError
from allocator.nrt import NodeTopology
from allocator.pod import ContainerInfo, PodInfo
from webhook.admission.synthetic_node import copy_allocator, synthetic_allocator

__all__ = ["Simulation", "Simulator", "pod_key"]

log = logging.getLogger("numapin.webhook.simulate")

SIMULATED_UID = "numapin.io/simulated-pod"
_NAME = "<pod>"  # stands for the pod's name in cached messages
# what a pod's key depends on besides its containers: every field of PodInfo but its identity
_OTHER_FIELDS = operator.attrgetter(*(f.name for f in fields(PodInfo) if f.name not in (
    "uid", "namespace", "name", "containers")))
_POD_KEYS = 1024  # distinct pods whose keys are remembered (then forgotten all at once)


@dataclass(frozen=True)
class Simulation:
    """A node's answer: admitted or not, kubelet's reason and message. ``known`` False: the node's configuration
    cannot be simulated (the answer is then "admitted", unchecked)."""

    admitted: bool
    reason: str | None = None
    message: str = ""
    known: bool = True


def pod_key(pod: PodInfo) -> PodInfo:
    """The pod without its identity: what the decision depends on."""
    return replace(pod, uid=SIMULATED_UID, namespace="", name=_NAME)


def _named(result: Simulation, pod: PodInfo) -> Simulation:
    if _NAME not in result.message:
        return result
    return replace(result, message=result.message.replace(_NAME, pod.ref or "(new pod)"))


class _LRU:
    def __init__(self, size: int) -> None:
        self.size = size
        self.data: OrderedDict[Any, Any] = OrderedDict()

    def get(self, key: Any) -> Any:
        value = self.data.get(key)
        if value is not None:
            self.data.move_to_end(key)
        return value

    def peek(self, key: Any) -> Any:
        """The value without the lock and without marking it used (a plain dictionary read: safe beside a writer
        holding the lock; the values are immutable)."""
        return self.data.get(key)

    def put(self, key: Any, value: Any) -> None:
        self.data[key] = value
        self.data.move_to_end(key)
        while len(self.data) > self.size:
            self.data.popitem(last=False)


class _Hashed:
    """A cache key part hashed once (a pod's resources are asked about for many nodes in one request)."""

    __slots__ = ("_hash", "value")

    def __init__(self, value: Any) -> None:
        self.value = value
        self._hash = hash(value)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Hashed) and self._hash == other._hash and self.value == other.value


class Simulator:
    def __init__(self, *, max_answers: int = 8192, max_allocators: int = 256,
                 pod_level_managers: bool = False) -> None:
        self.pod_level_managers = pod_level_managers  # kubelet's PodLevelResourceManagers gate (--feature-gates)
        self._answers = _LRU(max_answers)
        self._allocators = _LRU(max_allocators)
        self._lock = threading.Lock()
        self._last: tuple[PodInfo, _Hashed] | None = None  # the last pod asked about and its key
        self._pod_keys: dict[tuple[int, Any], tuple[tuple[ContainerInfo, ...], _Hashed]] = {}
        self._interned: dict[_Hashed, _Hashed] = {}
        self.simulations = 0

    def gated(self, pod: PodInfo) -> PodInfo:
        """``pod`` as the simulated kubelets see it: with their ``PodLevelResourceManagers`` gate."""
        gate = self.pod_level_managers
        return pod if pod.pod_level_managers == gate else replace(pod, pod_level_managers=gate)

    def _pod_key(self, pod: PodInfo) -> _Hashed:
        last = self._last
        if last is not None and last[0] is pod:
            return last[1]
        # (perf, issue 37) the pods read from one containers' text share their ``containers`` tuple (the memo of
        # ``pod_model``): their key is found by that tuple's identity and the pod's other fields, so a repeated
        # spec neither builds nor hashes a key again, and the answers' dictionary then finds its entry by identity
        # instead of comparing every container. The entry holds the tuple, so the identity stays its own.
        containers = pod.containers
        found = (id(containers), _OTHER_FIELDS(pod))
        known = self._pod_keys.get(found)
        if known is not None and known[0] is containers:
            key = known[1]
        else:
            if len(self._pod_keys) >= _POD_KEYS:
                self._pod_keys.clear()
                self._interned.clear()
            fresh = _Hashed(pod_key(pod))
            key = self._interned.setdefault(fresh, fresh)  # equal pods (other tuples, same text) share one key
            self._pod_keys[found] = (containers, key)
        self._last = (pod, key)
        return key

    def _key(self, node: NodeTopology, pod: PodInfo, occupied: bool, prior: tuple[PodInfo, ...]) -> tuple[Any, ...]:
        return (node.state_key if occupied else node.shape_key, node.memory_manager_policy, occupied,
                self._pod_key(pod), tuple(pod_key(p) for p in prior) if prior else ())

    def cached(self, node: NodeTopology, pod: PodInfo, *, occupied: bool, prior: tuple[PodInfo, ...] = ()
               ) -> Simulation | None:
        """The cached answer, if any (cheap: no simulation, and no wait for the lock a simulation in a worker thread
        holds: perf, issue 37; under load, refusing to read while a thread held the lock sent request after request
        to a thread of its own, each one more thread hop)."""
        key = self._key(node, pod, occupied, prior)
        result: Simulation | None
        if self._lock.acquire(blocking=False):
            try:
                result = self._answers.get(key)
            finally:
                self._lock.release()
        else:  # a simulation runs: read the answer as it is, without marking it used
            result = self._answers.peek(key)
        return None if result is None else _named(result, pod)

    def admit(self, node: NodeTopology, pod: PodInfo, *, occupied: bool = True, prior: tuple[PodInfo, ...] = ()
              ) -> Simulation:
        """Would ``node`` admit ``pod`` (``occupied``: with its current free CPUs; else empty)? ``prior``: pods to
        admit on the node first (bound to it but not yet in its published topology). CPU-bound: call it from a
        worker thread when it may not be cached."""
        key = self._key(node, pod, occupied, prior)
        with self._lock:
            result: Simulation | None = self._answers.get(key)
            if result is None:
                result = self._simulate(node, pod_key(pod), occupied, prior)
                self._answers.put(key, result)
        return _named(result, pod)

    def _allocator(self, node: NodeTopology, occupied: bool) -> Any:
        akey = (node.state_key if occupied else node.shape_key, node.memory_manager_policy, occupied)
        alloc = self._allocators.get(akey)
        if alloc is None:
            alloc = synthetic_allocator(node, occupied=occupied,  # with its Memory Manager when it publishes memory
                                        pod_level_managers=self.pod_level_managers)
            self._allocators.put(akey, alloc)
        return alloc

    def _simulate(self, node: NodeTopology, pod: PodInfo, occupied: bool, prior: tuple[PodInfo, ...]
                  ) -> Simulation:
        self.simulations += 1
        if occupied and node.total_available == 0 and not any(z.reserved for z in node.zones):
            # every CPU taken and none reserved (a document of another exporter can say so): the CPU state would
            # have an empty default set, which the static policy refuses to load, as kubelet's does; the node has
            # no CPU to give a pinned container
            return Simulation(admitted=False, reason="UnexpectedAdmissionError",
                              message="not enough cpus available to satisfy request: the node publishes no free CPU "
                                      "and no reserved CPU")
        try:
            alloc = self._allocator(node, occupied)
            if prior:
                alloc = copy_allocator(alloc)
                for i, p in enumerate(prior):
                    with contextlib.suppress(AllocatorError):
                        alloc.admit_pod(replace(pod_key(p), uid=f"numapin.io/prior-{i}"))
        except AllocatorError as e:
            log.warning("node %s cannot be simulated (its topology document says something numapin cannot "
                        "emulate): %s", node.name, e)
            return Simulation(admitted=True, message=str(e), known=False)
        try:
            decision = alloc.admit_pod(pod, dry_run=True)
        except AllocatorError as e:
            reason = getattr(e, "reason", None) or "UnexpectedAdmissionError"
            return Simulation(admitted=False, reason=reason, message=str(e))
        return Simulation(admitted=bool(decision.admitted), reason=decision.reason, message=decision.message)
