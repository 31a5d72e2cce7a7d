"""What the proxy makes of a pod's ``numapin.io/bypass``: the proxy's own pod and the operator's namespaces only.

The namespace comes from CRI's PodSandboxConfig metadata (kubelet sets it from the pod); the annotation is the
tenant's. ``BypassRule.verdict`` says, per pod:

- ``self``: the proxy's own pod: passed through untouched (it must not wait on itself).
- ``untouched``: a honoured bypass in a namespace the operator lets run on every CPU
  (``--bypass-all-cpus-namespaces``): passed through untouched, as numapin did for every bypass before.
- ``shared``: a honoured bypass elsewhere: no CPUs of its own, never rejected, but put on the shared pool and
  converged there like any shared container (never on another pod's exclusive CPUs).
- ``ignored``: the annotation outside ``--bypass-namespaces``: the pod is treated by its QoS class and mode, the
  proxy logs it and counts it.
- ``none``: no bypass asked.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Literal

from allocator.bypass import BypassPolicy
from allocator.pod import BYPASS_ANNOTATION, PodInfo
from nodeagent.decisions.cri_intent import SelfPod

__all__ = ["BypassRule", "BypassVerdict"]

BypassVerdict = Literal["self", "untouched", "shared", "ignored", "none"]


@dataclass(frozen=True)
class BypassRule:
    self_pod: SelfPod = field(default_factory=SelfPod)
    policy: BypassPolicy = field(default_factory=BypassPolicy)

    def verdict(self, uid: str, namespace: str, name: str, annotations: Mapping[str, str]) -> BypassVerdict:
        if self.self_pod.matches(uid, namespace, name):
            return "self"
        if not self.policy.asked(annotations):
            return "none"
        if not self.policy.allows(namespace):
            return "ignored"
        return "untouched" if self.policy.all_cpus(namespace) else "shared"

    def passes(self, uid: str, namespace: str, name: str, annotations: Mapping[str, str]) -> bool:
        """numapin leaves the pod wholly alone (no cpuset, never converged): its own pod, or an opted-in bypass."""
        return self.verdict(uid, namespace, name, annotations) in ("self", "untouched")

    def honours(self, uid: str, namespace: str, name: str, annotations: Mapping[str, str]) -> bool:
        """The pod gets no CPUs of its own and no mode: its own pod or a bypass the operator allows."""
        return self.verdict(uid, namespace, name, annotations) in ("self", "untouched", "shared")

    def model(self, pod: PodInfo) -> PodInfo:
        """``pod`` (read from annotations the tenant wrote) with ``bypass`` as the operator allows it."""
        honoured = self.honours(pod.uid, pod.namespace, pod.name, {BYPASS_ANNOTATION: "true"} if pod.bypass else {})
        return pod if pod.bypass == honoured else replace(pod, bypass=honoured)
