"""``/validate``, pods CREATE and UPDATE.

- ``numapin.io/bypass: "true"`` is a privilege (allocator.bypass): denied outside the namespaces (and, when listed,
  service accounts) of ``--bypass-namespaces`` / ``--bypass-service-accounts``, on CREATE and on an UPDATE that sets
  it, naming the rule and the flag; a pod that carried it before (created before the rule) can still be updated
  (finalizers, labels), with a warning. The node's proxy ignores it there too.
- ``qos.gocrane.io/cpu-manager`` must be ``none``, ``exclusive`` or ``share`` (after trimming and lowercasing);
  on UPDATE only a new or changed bad value is denied, so a pod created before numapin can still be updated
  (finalizers, labels) and deleted.
- The intent annotation ``numapin.io/cpu-intent`` must say what the pod says (the proxy trusts it): a forged or
  stale one is denied; on UPDATE it may only change to what the pod says (``/mutate`` stamps it again when the mode
  changes) and cannot be removed.
- UPDATE changing the mode of a pod bound to a node (a change while it runs, applied by the node's proxy): denied
  when that node, judged from its published NodeResourceTopology, could never admit the pod in its new mode even
  empty, naming the node and its topology manager policy; a warning when it could not right now.
- ``exclusive``/``share`` with no container that qualifies (integer CPU limit >= 1 equal to its request) gets a
  warning.
- CREATE of a pod with pinned containers: among the known candidate nodes (``spec.nodeName``, ``nodeSelector``),
  if none could admit it even empty, it is denied naming the policy, the container and the largest NUMA node; if
  none can admit it with its current free CPUs, it is allowed with a warning.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from allocator.bypass import BypassPolicy
from allocator.errors import PodSpecError
from allocator.intent import INTENT_ANNOTATION, decode_intent
from allocator.memory.quantity_text import ByteQuantity
from allocator.memory.requests import container_requests
from allocator.nrt import NodeTopology
from allocator.pod import (
    BYPASS_ANNOTATION,
    CPU_MANAGER_ANNOTATION,
    CPU_MANAGER_VALUES,
    ContainerInfo,
    PodInfo,
    container_mode,
    guaranteed_cpus,
    normalize_cpu_manager,
    pod_guaranteed_cpus,
)
from webhook.admission.pod_model import pod_info
from webhook.admission.pod_text_memo import PodTextMemo
from webhook.admission.review import AdmissionRequest, FieldCause, Verdict
from webhook.admission.simulate import Simulation, Simulator
from webhook.admission.unjudged import UnjudgedRule
from webhook.cluster.node_index import FrozenShapeGroup, ShapeGroup
from webhook.cluster.nodes import NodeStore

__all__ = ["CREATE_CHECKS_MEMO_SIZE", "Feasibility", "PodValidator", "assumption_note", "feasibility", "judged",
           "pinned"]

log = logging.getLogger("numapin.webhook.validate")

CREATE_CHECKS_MEMO_SIZE = 1024  # distinct pods (less their identity) whose checks of a CREATE are remembered


def _annotations(obj: Any) -> Mapping[str, Any]:
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    ann = meta.get("annotations") if isinstance(meta, Mapping) else None
    return ann if isinstance(ann, Mapping) else {}


def pinned(pod: PodInfo) -> bool:
    """The pod has containers with CPUs of their own."""
    return not pod.bypass and any(container_mode(pod, c) != "shared" for c in pod.containers)


def judged(pod: PodInfo) -> bool:
    """A node's topology manager may refuse the pod: it has containers with CPUs of their own, or memory a Memory
    Manager places (a Guaranteed pod, a Crane-pinned container with a memory limit; on nodes publishing memory)."""
    return pinned(pod) or (not pod.bypass and any(container_requests(pod, c) for c in pod.containers))


@dataclass(frozen=True)
class Feasibility:
    candidates: int
    ever: bool                 # some candidate could admit the pod on an empty node (or cannot be simulated)
    now: bool                  # some candidate can admit it with its current free CPUs
    example: NodeTopology | None = None       # the candidate the denial talks about
    example_answer: Simulation | None = None


def feasibility(candidates: int, groups: Sequence[ShapeGroup | FrozenShapeGroup], pod: PodInfo, sim: Simulator, *,
                cached_only: bool = False) -> Feasibility | None:
    """Ask each distinct node shape among the candidates, then (for the shapes that could) their distinct free-CPU
    states, most free first, until one admits the pod. CPU-bound when answers are not cached: run it in a worker
    thread; ``cached_only`` answers from the simulator's cache alone (None when something is not cached)."""
    ask = sim.cached if cached_only else sim.admit
    ever: list[ShapeGroup | FrozenShapeGroup] = []
    worst: tuple[NodeTopology, Simulation] | None = None
    for group in groups:
        answer = ask(group.node, pod, occupied=False)
        if answer is None:
            return None
        if answer.admitted:
            ever.append(group)
        elif worst is None or _largest(group.node) > _largest(worst[0]):
            worst = (group.node, answer)
    if not ever:
        return Feasibility(candidates, ever=False, now=False,
                           example=worst[0] if worst else None, example_answer=worst[1] if worst else None)
    for group in ever:
        for node in group.states():
            answer = ask(node, pod, occupied=True)
            if answer is None:
                return None
            if answer.admitted:
                return Feasibility(candidates, ever=True, now=True)
    return Feasibility(candidates, ever=True, now=False, example=ever[0].node)


def _largest(node: NodeTopology) -> int:
    z = node.largest_numa
    return z.allocatable if z is not None else 0


def _culprit(pod: PodInfo, node: NodeTopology) -> str:
    """Which container (or the pod total) a NUMA-bound policy stumbles on, in words."""
    if node.topology_manager_scope == "pod":
        total = pod_guaranteed_cpus(pod)
        names = ", ".join(f'"{c.name}"' for c in pod.containers if guaranteed_cpus(pod, c))
        return f"the pod needs {total} CPUs of its own in total (containers {names})"
    big = max(pod.containers, key=lambda c: guaranteed_cpus(pod, c))
    return f'container "{big.name}" needs {guaranteed_cpus(pod, big)} CPUs of its own'


def _memory_words(pod: PodInfo, node: NodeTopology) -> str:
    """``; the pod asks 100Gi of memory and NUMA nodes have at most 63Gi allocatable`` for a node publishing
    memory, "" otherwise."""
    asked: dict[str, int] = {}
    for c in pod.containers:
        for r, q in container_requests(pod, c).items():
            asked[r] = max(asked.get(r, 0), q)
    if not asked or node.memory_manager_policy == "None" or not any(z.memory for z in node.zones):
        return ""
    parts = []
    for r, q in sorted(asked.items()):
        most = max((z.memory[r][1] for z in node.zones if r in z.memory), default=0)
        parts.append(f"{ByteQuantity(q, True)} of {r} (a NUMA node has at most {ByteQuantity(most, True)} allocatable)")
    return "; its largest container asks " + ", ".join(parts)


def assumption_note(node: NodeTopology) -> str:
    """What the judgement of ``node`` assumed (its NodeResourceTopology left it out), for a message; "" if
    nothing."""
    if not node.assumptions:
        return ""
    return f"; judged from a NodeResourceTopology that leaves things out, assuming: {'; '.join(node.assumptions)}"


def never_message(pod: PodInfo, f: Feasibility) -> str:
    node, answer = f.example, f.example_answer
    head = f"no known node can ever admit pod {pod.ref or '(new pod)'} ({f.candidates} candidate node(s))"
    if node is None or answer is None:
        return head
    z = node.largest_numa
    numa = (f"the largest NUMA node (node-{z.numa}) has {z.allocatable} allocatable CPUs" if z is not None
            else "it has no NUMA node with CPUs")
    memory = _memory_words(pod, node)
    why = f"{answer.reason}: {answer.message}" if answer.reason else answer.message
    return (f"{head}: on node {node.name}, under topology manager policy {node.topology_manager_policy} "
            f"(scope {node.topology_manager_scope}), {_culprit(pod, node)} and {numa}{memory}; kubelet would reject it "
            f"({why}){assumption_note(node)}")


@dataclass(frozen=True)
class _Cleared:
    """A pod CREATE that passed every check reading the pod alone: its model (without its uid and name), the
    warnings of those checks, and whether a node's topology manager may refuse it."""

    info: PodInfo
    warnings: tuple[str, ...]
    judged: bool


class PodValidator:
    def __init__(self, nodes: NodeStore, simulator: Simulator, unjudged: UnjudgedRule,
                 bypass: BypassPolicy | None = None, *, memo_size: int = CREATE_CHECKS_MEMO_SIZE) -> None:
        self.nodes = nodes
        self.simulator = simulator
        self.unjudged = unjudged
        self.bypass = bypass if bypass is not None else BypassPolicy()
        self._same_containers = _SameContainers()
        # (perf, issue 37 round 3) the checks of a CREATE that read the pod alone, once per distinct pod less its
        # identity and per context (``_create_checks``); memo_size 0: none remembered
        self._cleared: PodTextMemo[_Cleared | None] | None = (
            PodTextMemo(self._create_checks, memo_size) if memo_size > 0 else None)

    async def validate(self, req: AdmissionRequest) -> Verdict:
        pod = req.object
        if req.operation not in ("CREATE", "UPDATE") or not isinstance(pod, Mapping):
            log.info("validate: not handled, allowed: %s", req.describe())
            return Verdict.allow()
        if req.operation == "CREATE" and self._cleared is not None:
            # every input of the checks is in the key: the pod's text (less uid, name and labels, which they do not
            # decide on), the request's namespace (the bypass rule), the bypass policy and the kubelets' gate
            cleared = self._cleared.get(pod, (req.namespace, self.bypass, self.simulator.pod_level_managers))
            if cleared is not None:
                verdict = await self._on_nodes(pod, cleared.info, list(cleared.warnings), cleared.judged)
                if verdict.allowed:
                    return verdict
                # a denial names the pod: the whole path below again, with the pod's own identity
        ann = _annotations(pod)
        old_ann = _annotations(req.old_object) if req.operation == "UPDATE" else {}

        warnings: list[str] = []
        if _asks_bypass(self.bypass, ann):
            namespace = req.namespace or _meta_str(pod, "namespace")
            account = _service_account(pod)
            if not self.bypass.allows(namespace, account):
                why = self.bypass.denial(namespace, account)
                if req.operation == "UPDATE" and _asks_bypass(self.bypass, old_ann):
                    warnings.append(f"numapin: {why}; the node ignores it (the pod runs by its QoS class and mode)")
                else:
                    log.info("validate: %s denied: %s outside the bypass namespaces", req.describe(),
                             BYPASS_ANNOTATION)
                    return _invalid(pod, req, FieldCause(_annotation_field(BYPASS_ANNOTATION), f"Forbidden: {why}",
                                                         "FieldValueForbidden"))

        raw_mode = ann.get(CPU_MANAGER_ANNOTATION)
        if raw_mode is not None and (req.operation == "CREATE" or raw_mode != old_ann.get(CPU_MANAGER_ANNOTATION)):
            try:
                normalize_cpu_manager(raw_mode)
            except PodSpecError:
                supported = ", ".join(json.dumps(v) for v in CPU_MANAGER_VALUES)
                return _invalid(pod, req, FieldCause(
                    _annotation_field(CPU_MANAGER_ANNOTATION),
                    f"Unsupported value: {json.dumps(raw_mode)}: supported values: {supported} (numapin)",
                    "FieldValueNotSupported"))

        intent = ann.get(INTENT_ANNOTATION)
        intent_changed = req.operation == "UPDATE" and intent != old_ann.get(INTENT_ANNOTATION)
        if intent_changed and intent is None:
            return _invalid(pod, req, FieldCause(
                _annotation_field(INTENT_ANNOTATION),
                "Forbidden: set by numapin; it cannot be removed (it changes only with the pod's mode)",
                "FieldValueForbidden"))

        try:
            info = self.simulator.gated(pod_info(pod))
        except PodSpecError as e:
            if req.operation == "CREATE":
                return self.unjudged.verdict("validate", "pod_unreadable", f"pod not checked: {e}")
            log.info("validate: pod model cannot read %s (%s); allowed", req.describe(), e)
            return Verdict.allow(f"numapin: pod not checked: {e}")
        if (not info.namespace and req.namespace) or (not info.name and req.name):
            info = replace(info, namespace=info.namespace or req.namespace, name=info.name or req.name)

        mode_changed = req.operation == "UPDATE" and raw_mode != old_ann.get(CPU_MANAGER_ANNOTATION)
        if (req.operation == "CREATE" or intent_changed or mode_changed) and intent is not None:
            problem = _intent_problem(intent, info, ann, self._same_containers)
            if problem and req.operation == "UPDATE":  # only numapin's /mutate may change it, to what the pod says
                return _invalid(pod, req, FieldCause(_annotation_field(INTENT_ANNOTATION), f"Forbidden: {problem}",
                                                     "FieldValueForbidden"))
            if problem:
                return _invalid(pod, req, FieldCause(_annotation_field(INTENT_ANNOTATION), f"Invalid value: {problem}"))

        warnings.extend(_no_effect(info))

        if req.operation != "CREATE":
            return await self._mode_change(req, info, old_ann, warnings)
        return await self._on_nodes(pod, info, warnings, judged(info))

    def _create_checks(self, pod: Mapping[str, Any], context: tuple[str, BypassPolicy, bool]) -> _Cleared | None:
        """The checks of a CREATE above that read the pod alone, without a side effect: what they leave to the
        nodes when they all pass, None when one refuses or cannot read the pod (``validate`` then says which). A
        pure function of ``pod`` and ``context`` (the request's namespace, the bypass policy, the kubelets' gate),
        for ``PodTextMemo``; ``pod`` comes without its uid, name and labels, which none of them decides on."""
        namespace, bypass, gate = context
        ann = _annotations(pod)
        if _asks_bypass(bypass, ann) and not bypass.allows(namespace or _meta_str(pod, "namespace"),
                                                           _service_account(pod)):
            return None
        raw_mode = ann.get(CPU_MANAGER_ANNOTATION)
        try:
            if raw_mode is not None:
                normalize_cpu_manager(raw_mode)
            info = pod_info(pod)
        except PodSpecError:
            return None
        if info.pod_level_managers != gate:
            info = replace(info, pod_level_managers=gate)
        intent = ann.get(INTENT_ANNOTATION)
        if intent is not None and _intent_problem(intent, info, ann, self._same_containers):
            return None
        return _Cleared(info, tuple(_no_effect(info)), judged(info))

    async def _on_nodes(self, pod: Mapping[str, Any], info: PodInfo, warnings: list[str], is_judged: bool
                        ) -> Verdict:
        """CREATE: the candidate nodes asked, every time (their free CPUs as they are now)."""
        candidates, groups = self.nodes.candidate_groups(pod) if is_judged else (0, [])
        if candidates:
            f = feasibility(candidates, groups, info, self.simulator, cached_only=True)
            if f is None:  # something to simulate: off the event loop, on a copy of the groups
                frozen = [g.frozen() for g in groups]
                f = await asyncio.to_thread(feasibility, candidates, frozen, info, self.simulator)
            assert f is not None
            if not f.ever:
                return Verdict.deny(never_message(info, f), reason="Forbidden", warnings=tuple(warnings))
            if not f.now:
                warnings.append(
                    f"numapin: no node can admit this pod right now ({f.candidates} candidate node(s)): their free "
                    "CPUs (or memory per NUMA node) are too few or too scattered for their topology manager policy; "
                    "it stays Pending until they free up")
        return Verdict.allow(*warnings)


    async def _mode_change(self, req: AdmissionRequest, info: PodInfo, old_ann: Mapping[str, Any],
                           warnings: list[str]) -> Verdict:
        """UPDATE: a change of mode of a pod bound to a node with a published topology is judged on that node."""
        old_raw = old_ann.get(CPU_MANAGER_ANNOTATION)
        try:
            old_mode = None if old_raw is None else normalize_cpu_manager(old_raw)
        except PodSpecError:
            old_mode = None  # a pod created before numapin with a bad value: judged as kubelet's rule
        if old_mode == info.cpu_manager or not pinned(info):
            return Verdict.allow(*warnings)
        spec = req.object.get("spec") if isinstance(req.object, Mapping) else None
        node_name = spec.get("nodeName") if isinstance(spec, Mapping) else None
        node = self.nodes.get(node_name) if isinstance(node_name, str) and node_name else None
        if node is None:
            return Verdict.allow(*warnings)
        was_pinned = pinned(replace(info, cpu_manager=old_mode))
        ever = await asyncio.to_thread(self.simulator.admit, node, info, occupied=False)
        change = f"{old_mode or 'kubelet'} -> {info.cpu_manager or 'kubelet'}"
        if not ever.admitted:
            z = node.largest_numa
            numa = (f"the largest NUMA node (node-{z.numa}) has {z.allocatable} allocatable CPUs" if z is not None
                    else "it has no NUMA node with CPUs")
            why = f"{ever.reason}: {ever.message}" if ever.reason else ever.message
            return Verdict.deny(
                f"pod {info.ref}: changing {CPU_MANAGER_ANNOTATION} ({change}) can never be satisfied on its node "
                f"{node.name}: under topology manager policy {node.topology_manager_policy} (scope "
                f"{node.topology_manager_scope}), {_culprit(info, node)} and {numa}; kubelet would reject it ({why})",
                reason="Forbidden", warnings=tuple(warnings))
        if not was_pinned:
            now = await asyncio.to_thread(self.simulator.admit, node, info, occupied=True)
            if not now.admitted:
                warnings.append(
                    f"numapin: node {node.name} cannot give pod {info.ref} CPUs of its own right now (topology "
                    f"manager policy {node.topology_manager_policy}: {now.reason or now.message}); its proxy refuses "
                    f"the change ({change}) and the pod keeps running as it was")
        return Verdict.allow(*warnings)


def _no_effect(info: PodInfo) -> list[str]:
    """The warning for a pinning mode that pins no container."""
    if info.cpu_manager in ("exclusive", "share") and not any(guaranteed_cpus(info, c) for c in info.containers):
        return [f"numapin: {CPU_MANAGER_ANNOTATION}={info.cpu_manager} has no effect: no container has an integer "
                "CPU limit of at least 1 equal to its CPU request, so every container runs on the shared pool"]
    return []


def _asks_bypass(policy: BypassPolicy, annotations: Mapping[str, Any]) -> bool:
    value = annotations.get(BYPASS_ANNOTATION)
    return isinstance(value, str) and policy.asked({BYPASS_ANNOTATION: value})


def _meta_str(obj: Mapping[str, Any], key: str) -> str:
    meta = obj.get("metadata")
    value = meta.get(key) if isinstance(meta, Mapping) else None
    return value if isinstance(value, str) else ""


def _service_account(pod: Mapping[str, Any]) -> str:
    """The pod's service account (``spec.serviceAccountName``, the deprecated ``serviceAccount``, else default)."""
    spec = pod.get("spec")
    if isinstance(spec, Mapping):
        for key in ("serviceAccountName", "serviceAccount"):
            value = spec.get(key)
            if isinstance(value, str) and value:
                return value
    return "default"


def _annotation_field(key: str) -> str:
    """The field path kube-apiserver uses for an annotation."""
    return f"metadata.annotations[{key}]"


def _invalid(pod: Mapping[str, Any], req: AdmissionRequest, cause: FieldCause) -> Verdict:
    """An ``Invalid`` denial naming the pod (its name, or for a pod still to be named its generateName)."""
    meta = pod.get("metadata")
    meta = meta if isinstance(meta, Mapping) else {}
    name = next((v for v in (meta.get("name"), req.name, meta.get("generateName")) if isinstance(v, str) and v), "")
    return Verdict.invalid("Pod", name, (cause,))


class _SameContainers:
    """Whether two pods' containers are equal, the last pair found equal remembered by identity (perf, issue 37): an
    intent's containers and the pod model's come from memos keyed by their texts, so a workload's pods bring the same
    two tuples again and again; the tuples are immutable, and held here, so their identities stay theirs."""

    def __init__(self) -> None:
        self._last: tuple[tuple[ContainerInfo, ...], tuple[ContainerInfo, ...]] | None = None

    def __call__(self, a: tuple[ContainerInfo, ...], b: tuple[ContainerInfo, ...]) -> bool:
        last = self._last
        if last is not None and last[0] is a and last[1] is b:
            return True
        if a != b:
            return False
        self._last = (a, b)
        return True


def _intent_problem(text: str, info: PodInfo, annotations: Mapping[str, Any], same: _SameContainers) -> str | None:
    where = f"annotation {INTENT_ANNOTATION}"
    try:
        stated = decode_intent(text, uid=info.uid, namespace=info.namespace, name=info.name,
                               annotations={k: v for k, v in annotations.items() if isinstance(v, str)})
    except PodSpecError as e:
        return f"{e} (it is set by numapin's mutating webhook; remove it)"
    # podLevel too: an intent without it on a pod with pod-level resources would have the node agent pin
    # containers kubelet (its gate off) keeps on the shared pool
    if ((stated.qos_class, stated.cpu_manager, stated.pod_level_resources)
            != (info.qos_class, info.cpu_manager, info.pod_level_resources)
            or not same(stated.containers, info.containers)):
        return (f"{where} does not match the pod's containers, resources or {CPU_MANAGER_ANNOTATION}: it is set by "
                "numapin's mutating webhook from the pod spec; remove it")
    return None
