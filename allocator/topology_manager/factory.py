"""Topology-manager policies by name (kubelet's NewManager switch), with the checks kubelet makes at start-up.

``POLICIES`` is the one list of policy names; ``merge_hints`` runs one merge through the named policy.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ..errors import ConfigError
from ..hints import TopologyHint
from ..merge import ProviderHints
from .policy import Policy
from .policy_best_effort import BestEffortPolicy
from .policy_none import NonePolicy
from .policy_options import MAX_ALLOWABLE, NEEDS_DISTANCES, parse_policy_options
from .policy_restricted import RestrictedPolicy
from .policy_single_numa_node import SingleNumaNodePolicy

__all__ = ["POLICIES", "merge_hints", "new_policy"]

_CLASSES: dict[str, type[Policy]] = {
    cls.name: cls for cls in (NonePolicy, BestEffortPolicy, RestrictedPolicy, SingleNumaNodePolicy)
}
POLICIES: tuple[str, ...] = tuple(_CLASSES)


def _policy_class(name: str) -> type[Policy]:
    cls = _CLASSES.get(name)
    if cls is None:
        raise ConfigError(f"unknown topology manager policy {name!r}: expected one of {', '.join(POLICIES)}")
    return cls


def new_policy(
    name: str,
    numa_nodes: Sequence[int],
    *,
    distances: Mapping[int, Sequence[int]] | None = None,
    options: Mapping[str, object] | None = None,
) -> Policy:
    """Build a policy, validating it against the machine as kubelet does at start-up (ConfigError): kubelet
    reads the NUMA distances whenever ``prefer-closest-numa-nodes`` is set (whatever the policy), and refuses
    more NUMA nodes than an explicit ``max-allowable-numa-nodes``."""
    cls = _policy_class(name)
    opts = parse_policy_options(options)
    nodes = tuple(numa_nodes)
    if opts.prefer_closest_numa and distances is None:
        raise ConfigError(NEEDS_DISTANCES)
    limit = opts.max_allowable_numa_nodes
    if cls is not NonePolicy and limit is not None and len(nodes) > limit:
        raise ConfigError(f"single-numa-node, restricted and best-effort topology manager policies are "
                          f"unsupported on machines with more than {limit} NUMA Nodes "
                          f"({MAX_ALLOWABLE}={limit}, the machine has {len(nodes)}); "
                          f"numapin needs no limit: leave {MAX_ALLOWABLE} unset")
    return cls(numa_nodes=nodes, distances=distances, options=opts)


def merge_hints(
    providers: Sequence[ProviderHints],
    *,
    policy: str,
    numa_nodes: Sequence[int],
    distances: Mapping[int, Sequence[int]] | None = None,
    options: Mapping[str, object] | None = None,
) -> tuple[TopologyHint, bool]:
    """Merge the providers' hints as kubelet's topology manager does under ``policy``; returns (best hint, admit).

    ``providers``: one entry per hint provider, None (no preference) or {resource: None | hints}, where
    hints is a list of TopologyHint (``[]`` = cannot be satisfied) or a ``HintFamily``. ``numa_nodes``:
    the machine's NUMA node ids (the default mask; none at all gives kubelet's default hint). ``distances[n]``:
    distances from node n to every node of ``numa_nodes`` in that order (needed with
    ``prefer-closest-numa-nodes``, by the policies it changes). No start-up check: options that do not change
    the merge (``max-allowable-numa-nodes``) are parsed and otherwise ignored.
    """
    cls = _policy_class(policy)
    chosen = cls(numa_nodes=tuple(numa_nodes), distances=distances, options=parse_policy_options(options))
    return chosen.merge(providers)
