"""Topology manager scopes: who is merged and allocated together (kubelet's scope.go, scope_*.go).

- ``container`` (default): for each init container (sidecars included), then each app container, in spec
  order: gather every provider's hints for that container, merge, reject the whole pod if the policy does
  not admit the result, otherwise allocate the container in every provider with the merged affinity
  before looking at the next container (so later containers see earlier allocations).
- ``pod``: gather pod-level hints once, merge once, then allocate every container with that affinity.
- policy ``none`` (kubelet's none scope): no hints are gathered; every container is allocated without
  affinity.

The scope mutates the ``state`` it is given (providers allocate into it). A caller that wants
"rejected -> unchanged" works on a copy and keeps it only when the result is admitted.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol

from ..compact_hints import HintFamily
from ..errors import AdmitReason, AllocationError, ConfigError, SMTAlignmentError
from ..hints import TopologyHint
from ..merge import ProviderHints
from ..pod import PodInfo
from .policy import Policy
from .policy_none import NonePolicy

__all__ = [
    "SCOPES",
    "TOPOLOGY_AFFINITY_MESSAGE",
    "TOPOLOGY_AFFINITY_REASON",
    "AdmitResult",
    "ContainerResult",
    "ContainerScope",
    "HintProvider",
    "NoneScope",
    "PodScope",
    "Scope",
    "new_scope",
]

SCOPES = ("container", "pod")
TOPOLOGY_AFFINITY_REASON: Final = "TopologyAffinityError"
TOPOLOGY_AFFINITY_MESSAGE = "Resources cannot be allocated with Topology locality"

HintsView = tuple[TopologyHint, ...] | HintFamily | None


class HintProvider(Protocol):
    """What the topology manager asks of a resource manager (kubelet's HintProvider)."""

    def topology_hints(self, state: Any, pod: PodInfo, container_name: str) -> ProviderHints: ...

    def pod_topology_hints(self, state: Any, pod: PodInfo) -> ProviderHints: ...

    def allocate(self, state: Any, pod: PodInfo, container_name: str, affinity: TopologyHint | None) -> Any: ...


@dataclass(frozen=True, slots=True)
class ContainerResult:
    name: str
    hints: Mapping[str, HintsView]  # every provider's hints by resource (pod-level ones under pod scope)
    affinity: TopologyHint | None  # the merged hint; None under policy none


@dataclass(frozen=True, slots=True)
class AdmitResult:
    admitted: bool
    reason: AdmitReason | None  # None when admitted
    message: str
    containers: tuple[ContainerResult, ...]
    policy: str
    scope: str
    failed_container: str | None = None
    unaligned: tuple[str, ...] = ()  # resources that kept the merge from being admitted


def _hints_view(provider_hints: Sequence[ProviderHints]) -> dict[str, HintsView]:
    view: dict[str, HintsView] = {}
    for hints in provider_hints:
        for resource, res_hints in (hints or {}).items():
            key = resource
            i = 2
            while key in view:
                key = f"{resource}#{i}"
                i += 1
            if res_hints is None or isinstance(res_hints, HintFamily):
                view[key] = res_hints
            else:
                view[key] = tuple(res_hints)
    return view


class Scope(ABC):
    name = ""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy

    @abstractmethod
    def admit(self, state: Any, pod: PodInfo, providers: Sequence[HintProvider]) -> AdmitResult:
        """Merge, decide and allocate the pod's containers (see the module docstring)."""

    # -- helpers -------------------------------------------------------------------
    def _result(self, admitted: bool, containers: list[ContainerResult], *, reason: AdmitReason | None = None,
                message: str = "", failed: str | None = None, unaligned: tuple[str, ...] = ()) -> AdmitResult:
        return AdmitResult(admitted=admitted, reason=reason, message=message, containers=tuple(containers),
                           policy=self.policy.name, scope=self.name, failed_container=failed, unaligned=unaligned)

    def _allocate(self, state: Any, pod: PodInfo, name: str, affinity: TopologyHint | None,
                  providers: Sequence[HintProvider], containers: list[ContainerResult]) -> AdmitResult | None:
        try:
            for provider in providers:
                provider.allocate(state, pod, name, affinity)
        except SMTAlignmentError as e:
            return self._result(False, containers, reason=e.reason, message=str(e), failed=name)
        except AllocationError as e:
            return self._result(False, containers, reason=e.reason,
                                message=f"Allocate failed due to {e}, which is unexpected", failed=name)
        return None

    def _reject(self, provider_hints: Sequence[ProviderHints], containers: list[ContainerResult],
                who: str | None) -> AdmitResult:
        unaligned, impossible = self._unaligned(provider_hints)
        subject = f"container {who!r}" if who is not None else "the pod's resources"
        parts = []
        if impossible:
            parts.append(f"no NUMA placement can satisfy {', '.join(impossible)}")
        others = [r for r in unaligned if r not in impossible]
        if others:
            parts.append(f"{', '.join(others)} could not be aligned")
        if not parts:
            parts.append("no aligned placement")
        detail = (f"numapin: policy {self.policy.name}, scope {self.name}, {subject}: " + "; ".join(parts))
        return self._result(False, containers, reason=TOPOLOGY_AFFINITY_REASON,
                            message=f"{TOPOLOGY_AFFINITY_MESSAGE} ({detail})", failed=who,
                            unaligned=tuple(unaligned))

    def _unaligned(self, provider_hints: Sequence[ProviderHints]) -> tuple[list[str], list[str]]:
        """Which resources keep the merge from being admitted: those whose removal alone admits it, or,
        when no single one does, every resource with a preference. Also those that cannot be satisfied."""
        resources: list[tuple[int, str]] = []
        impossible: list[str] = []
        for i, hints in enumerate(provider_hints):
            for resource, res_hints in (hints or {}).items():
                if res_hints is None:
                    continue
                resources.append((i, resource))
                empty = res_hints.is_empty() if isinstance(res_hints, HintFamily) else len(res_hints) == 0
                if empty:
                    impossible.append(resource)
        culprits = []
        for i, resource in resources:
            reduced = [
                ({k: v for k, v in (h or {}).items() if k != resource} if j == i else h)
                for j, h in enumerate(provider_hints)
            ]
            if self.policy.merge(reduced)[1]:
                culprits.append(resource)
        if not culprits:
            culprits = [r for _, r in resources]
        return culprits, impossible


class NoneScope(Scope):
    """Policy none: allocate every container without affinity, gather no hints."""

    name = "none"

    def admit(self, state: Any, pod: PodInfo, providers: Sequence[HintProvider]) -> AdmitResult:
        containers: list[ContainerResult] = []
        for c in pod.containers:
            containers.append(ContainerResult(c.name, {}, None))
            failure = self._allocate(state, pod, c.name, None, providers, containers)
            if failure is not None:
                return failure
        return self._result(True, containers)


class ContainerScope(Scope):
    name = "container"

    def admit(self, state: Any, pod: PodInfo, providers: Sequence[HintProvider]) -> AdmitResult:
        containers: list[ContainerResult] = []
        for c in pod.containers:
            provider_hints = [p.topology_hints(state, pod, c.name) for p in providers]
            hint, admit = self.policy.merge(provider_hints)
            containers.append(ContainerResult(c.name, _hints_view(provider_hints), hint))
            if not admit:
                return self._reject(provider_hints, containers, c.name)
            failure = self._allocate(state, pod, c.name, hint, providers, containers)
            if failure is not None:
                return failure
        return self._result(True, containers)


class PodScope(Scope):
    name = "pod"

    def admit(self, state: Any, pod: PodInfo, providers: Sequence[HintProvider]) -> AdmitResult:
        provider_hints = [p.pod_topology_hints(state, pod) for p in providers]
        hint, admit = self.policy.merge(provider_hints)
        view = _hints_view(provider_hints)
        containers = [ContainerResult(c.name, view, hint) for c in pod.containers]
        if not admit:
            return self._reject(provider_hints, containers, None)
        done: list[ContainerResult] = []
        for c in containers:
            done.append(c)
            failure = self._allocate(state, pod, c.name, hint, providers, done)
            if failure is not None:
                return failure
        return self._result(True, done)


def new_scope(name: str, policy: Policy) -> Scope:
    """kubelet: policy none always uses the none scope; otherwise ``container`` or ``pod``."""
    if name not in SCOPES:
        raise ConfigError(f"unknown topology manager scope {name!r}: expected one of {', '.join(SCOPES)}")
    if isinstance(policy, NonePolicy):
        return NoneScope(policy)
    return ContainerScope(policy) if name == "container" else PodScope(policy)
