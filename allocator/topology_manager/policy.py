"""Topology manager policies: the interface, option parsing and validation, and the factory.

Options (kubelet's ``topologyManagerPolicyOptions``):

- ``prefer-closest-numa-nodes``: a boolean (kubelet's ParseBool spellings). Needs the machine's NUMA
  distances. Ignored by ``single-numa-node`` (as kubelet does).
- ``max-allowable-numa-nodes``: an integer >= 8 (smaller is an error, as in kubelet). kubelet refuses
  machines with more NUMA nodes than this (default 8) because its merge explodes; numapin's merge does
  not, so numapin places **no** limit by default (up to 64 NUMA nodes, kubelet's mask width). The option
  is accepted for compatibility: when it is set explicitly, a machine with more NUMA nodes than the value
  is refused exactly as kubelet would refuse it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ..bitmask import MAX_NUMA_ID
from ..errors import ConfigError
from ..hints import TopologyHint
from ..merge import POLICIES, ProviderHints, merge_hints

__all__ = [
    "KNOWN_OPTIONS",
    "POLICIES",
    "Policy",
    "PolicyOptions",
    "new_policy",
    "parse_policy_options",
]

PREFER_CLOSEST = "prefer-closest-numa-nodes"
MAX_ALLOWABLE = "max-allowable-numa-nodes"
KNOWN_OPTIONS = (PREFER_CLOSEST, MAX_ALLOWABLE)
KUBELET_MIN_MAX_ALLOWABLE = 8

_TRUE = ("1", "t", "T", "TRUE", "true", "True")
_FALSE = ("0", "f", "F", "FALSE", "false", "False")


@dataclass(frozen=True, slots=True)
class PolicyOptions:
    prefer_closest_numa: bool = False
    max_allowable_numa_nodes: int | None = None  # None: not set (numapin: no limit)

    def as_merge_options(self) -> dict[str, str]:
        return {PREFER_CLOSEST: "true" if self.prefer_closest_numa else "false"}


def parse_policy_options(options: Mapping[str, str] | None) -> PolicyOptions:
    """Validate ``topologyManagerPolicyOptions``; ConfigError naming the option on bad input."""
    prefer = False
    max_nodes: int | None = None
    for name, value in (options or {}).items():
        text = str(value).strip()
        if name == PREFER_CLOSEST:
            if text in _TRUE:
                prefer = True
            elif text in _FALSE:
                prefer = False
            else:
                raise ConfigError(f"topology manager option {name}: bad value {value!r}, expected true or false")
        elif name == MAX_ALLOWABLE:
            try:
                max_nodes = int(text, 10)
            except ValueError:
                raise ConfigError(f"topology manager option {name}: bad value {value!r}, expected an integer"
                                  ) from None
            if max_nodes < KUBELET_MIN_MAX_ALLOWABLE:
                raise ConfigError(f"topology manager option {name}: the minimum value is "
                                  f"{KUBELET_MIN_MAX_ALLOWABLE}, got {max_nodes}")
        else:
            raise ConfigError(f"unknown topology manager policy option {name!r}: known options are "
                              f"{', '.join(KNOWN_OPTIONS)}")
    return PolicyOptions(prefer_closest_numa=prefer, max_allowable_numa_nodes=max_nodes)


@dataclass(frozen=True)
class Policy(ABC):
    """A topology manager policy bound to a machine's NUMA nodes (kubelet's ``Policy``)."""

    numa_nodes: tuple[int, ...]
    distances: Mapping[int, Sequence[int]] | None = None
    options: PolicyOptions = field(default_factory=PolicyOptions)

    name = ""

    @abstractmethod
    def merge(self, providers_hints: Sequence[ProviderHints]) -> tuple[TopologyHint, bool]:
        """The best hint for these providers' hints and whether the pod may be admitted."""

    def _merge(self, providers_hints: Sequence[ProviderHints]) -> tuple[TopologyHint, bool]:
        return merge_hints(providers_hints, policy=self.name, numa_nodes=self.numa_nodes,
                           distances=self.distances, options=self.options.as_merge_options())


def new_policy(
    name: str,
    numa_nodes: Sequence[int],
    *,
    distances: Mapping[int, Sequence[int]] | None = None,
    options: Mapping[str, str] | None = None,
) -> Policy:
    """Build a policy, validating it against the machine as kubelet does at start-up (ConfigError)."""
    from .policy_best_effort import BestEffortPolicy
    from .policy_none import NonePolicy
    from .policy_restricted import RestrictedPolicy
    from .policy_single_numa_node import SingleNumaNodePolicy

    classes: dict[str, type[Policy]] = {
        "none": NonePolicy,
        "best-effort": BestEffortPolicy,
        "restricted": RestrictedPolicy,
        "single-numa-node": SingleNumaNodePolicy,
    }
    cls = classes.get(name)
    if cls is None:
        raise ConfigError(f"unknown topology manager policy {name!r}: expected one of {', '.join(POLICIES)}")
    opts = parse_policy_options(options)
    nodes = tuple(numa_nodes)
    if not nodes:
        raise ConfigError("the machine has no NUMA node")
    for n in nodes:
        if not isinstance(n, int) or isinstance(n, bool) or n < 0 or n > MAX_NUMA_ID:
            raise ConfigError(f"NUMA node id {n!r} is not supported: ids must be 0..{MAX_NUMA_ID}")
    if len(set(nodes)) != len(nodes):
        raise ConfigError(f"NUMA node ids must be unique, got {list(nodes)}")
    if opts.prefer_closest_numa:
        if distances is None:
            raise ConfigError(f"topology manager option {PREFER_CLOSEST} needs the NUMA distances of the machine")
        for n in nodes:
            row = distances.get(n)
            if row is None or len(row) != len(nodes):
                raise ConfigError(f"NUMA distances must give node {n} one distance per NUMA node ({len(nodes)})")
    if name != "none" and opts.max_allowable_numa_nodes is not None and len(nodes) > opts.max_allowable_numa_nodes:
        raise ConfigError(f"single-numa-node, restricted and best-effort topology manager policies are "
                          f"unsupported on machines with more than {opts.max_allowable_numa_nodes} NUMA Nodes "
                          f"({MAX_ALLOWABLE}={opts.max_allowable_numa_nodes}, the machine has {len(nodes)}); "
                          f"numapin needs no limit: leave {MAX_ALLOWABLE} unset")
    return cls(numa_nodes=nodes, distances=distances, options=opts)
