"""``/filter``: numapin as a kube-scheduler extender filter (``nodeCacheCapable: true``: node names in, node names out).

kube-scheduler (``extenders`` in its KubeSchedulerConfiguration) POSTs an ``ExtenderArgs`` for every pod it schedules,
after its own filters: the pod and the names of the nodes still feasible. Each node is judged as the binding check
judges a binding to it (``BindingValidator.fit``: the node's NodeResourceTopology as the webhook sees it now, the
pods just bound to it counted, the same simulation). The answer is an ``ExtenderFilterResult``:

- ``NodeNames``: the nodes that can hold the pod, and those that cannot be judged when ``--unjudged=allow`` (no
  NodeResourceTopology, a configuration numapin cannot emulate, a pod numapin's model cannot read), as the binding
  check allows them; with ``--unjudged=deny`` those go to ``FailedNodes``;
- ``FailedAndUnresolvableNodes``: the nodes whose topology manager would reject the pod, with numapin's reason. Not
  ``FailedNodes``: the scheduler's preemption would pick victims on such a node by its own filters only (an
  extender without a preempt verb is not asked again), evicting pods whether or not their CPUs free a whole NUMA
  node for this one; unresolvable keeps preemption off the node;
- ``Error``: only when deciding raised (a bug; logged). kube-scheduler treats it as a failed call: with
  ``ignorable: true`` it schedules as if numapin were not configured.

The scheduler (Go's ``encoding/json``, no field tags) writes the field names ``Pod``, ``Nodes``, ``NodeNames`` and
reads the result's names in any case; the parser matches them in any case too. A body that is not an ExtenderArgs
with ``NodeNames`` (an extender configured without ``nodeCacheCapable`` sends ``Nodes``) raises ExtenderArgsError,
answered 400.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from allocator.errors import PodSpecError
from webhook.admission.binding import BindingValidator
from webhook.admission.unjudged import UnjudgedRule
from webhook.admission.validate import judged
from webhook.cluster.pods_cache import pod_model

__all__ = ["ExtenderArgs", "ExtenderArgsError", "ExtenderFilter", "FilterResult", "parse_extender_args"]

log = logging.getLogger("numapin.webhook.extender")


class ExtenderArgsError(ValueError):
    """The body is not an ExtenderArgs numapin's filter can answer."""


@dataclass(frozen=True)
class ExtenderArgs:
    pod: Mapping[str, Any]
    node_names: tuple[str, ...]

    @property
    def pod_ref(self) -> str:
        meta = self.pod.get("metadata")
        meta = meta if isinstance(meta, Mapping) else {}
        return f"{meta.get('namespace') or ''}/{meta.get('name') or ''}"


def parse_extender_args(body: Any) -> ExtenderArgs:
    """Validate an ExtenderArgs (field names in any case, as Go reads them). Raises ExtenderArgsError naming the
    field at fault."""
    if not isinstance(body, Mapping):
        raise ExtenderArgsError("body must be a JSON object (kube-scheduler's ExtenderArgs)")
    fields = {k.lower(): v for k, v in body.items() if isinstance(k, str)}
    pod = fields.get("pod")
    if not isinstance(pod, Mapping):
        raise ExtenderArgsError("Pod must be an object (the pod being scheduled)")
    if not isinstance(pod.get("metadata"), Mapping) or not isinstance(pod.get("spec"), Mapping):
        raise ExtenderArgsError("Pod must have metadata and spec objects")
    names = fields.get("nodenames")
    if names is None:
        if fields.get("nodes") is not None:
            raise ExtenderArgsError("NodeNames is missing and Nodes is given: configure numapin's extender with "
                                    "nodeCacheCapable: true (it judges nodes by name, from their NodeResourceTopology)")
        raise ExtenderArgsError("NodeNames must be a list of node names (nodeCacheCapable: true)")
    if not isinstance(names, list) or not all(isinstance(n, str) and n for n in names):
        raise ExtenderArgsError("NodeNames must be a list of non-empty strings")
    return ExtenderArgs(pod=pod, node_names=tuple(names))


@dataclass(frozen=True)
class FilterResult:
    passed: tuple[str, ...]
    failed: Mapping[str, str] = field(default_factory=dict)        # may pass after a change (unjudged, denied)
    unresolvable: Mapping[str, str] = field(default_factory=dict)  # the topology manager would reject the pod
    error: str = ""

    def render(self) -> dict[str, Any]:
        """kube-scheduler's ExtenderFilterResult (``NodeNames`` always a list: a null would filter out every node)."""
        return {"NodeNames": list(self.passed), "FailedNodes": dict(self.failed),
                "FailedAndUnresolvableNodes": dict(self.unresolvable), "Error": self.error}

    @property
    def label(self) -> str:
        """For metrics: ``error``, ``filtered`` (some node failed) or ``passed``."""
        if self.error:
            return "error"
        return "filtered" if self.failed or self.unresolvable else "passed"


def _listed(names: list[str], most: int = 5) -> str:
    more = f" and {len(names) - most} more" if len(names) > most else ""
    return ", ".join(names[:most]) + more


class ExtenderFilter:
    def __init__(self, binding: BindingValidator, unjudged: UnjudgedRule) -> None:
        self.binding = binding
        self.unjudged = unjudged

    async def filter(self, body: Any) -> FilterResult:
        """The answer to one filter call. Raises ExtenderArgsError for a body that is not an ExtenderArgs."""
        args = parse_extender_args(body)
        names = tuple(dict.fromkeys(args.node_names))  # each node judged once, in the scheduler's order
        try:
            info = self.binding.simulator.gated(pod_model(args.pod))
        except PodSpecError as e:
            return self._unjudged(names, "pod_unreadable", f"pod {args.pod_ref} not checked on {len(names)} node(s): "
                                  f"{e}")
        if not judged(info):
            return FilterResult(passed=names)
        passed: list[str] = []
        unresolvable: dict[str, str] = {}
        unknown: list[str] = []
        unsupported: dict[str, str] = {}
        for name in names:
            fit = await self.binding.fit(info, name)
            if fit.outcome == "rejects":
                unresolvable[name] = f"numapin: {fit.message}"
            elif fit.outcome == "no_topology":
                unknown.append(name)
            elif fit.outcome == "unsupported":
                unsupported[name] = fit.message
            else:
                passed.append(name)
        failed: dict[str, str] = {}
        example = next(iter(unsupported.values()), "")
        for reason, nodes, why in (("node_unknown", unknown, "no NodeResourceTopology"),
                                   ("node_unsupported", list(unsupported), f"a configuration numapin cannot simulate: "
                                                                           f"{example}")):
            if not nodes:
                continue
            verdict = self.unjudged.verdict("filter", reason, f"pod {info.ref} not checked on {len(nodes)} node(s) "
                                                              f"({_listed(nodes)}): {why}")
            if verdict.allowed:
                passed.extend(nodes)
            else:
                failed.update((n, f"numapin: node {n} not checked ({why}); --unjudged=deny") for n in nodes)
        if unresolvable:
            log.info("filter: pod %s: %d of %d node(s) cannot hold it: %s", info.ref, len(unresolvable), len(names),
                     next(iter(unresolvable.values())))
        kept = set(passed)
        return FilterResult(passed=tuple(n for n in names if n in kept), failed=failed,
                            unresolvable=unresolvable)

    def _unjudged(self, names: tuple[str, ...], reason: str, what: str) -> FilterResult:
        verdict = self.unjudged.verdict("filter", reason, what)
        if verdict.allowed:
            return FilterResult(passed=names)
        return FilterResult(passed=(), failed={n: verdict.message for n in names})
