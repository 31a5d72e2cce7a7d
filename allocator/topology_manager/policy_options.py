"""Topology-manager policy options (kubelet's ``topologyManagerPolicyOptions``), parsed and checked.

- ``prefer-closest-numa-nodes``: a boolean (Go's ParseBool spellings). Needs the machine's NUMA distances.
  Ignored by ``single-numa-node`` (as kubelet does).
- ``max-allowable-numa-nodes``: an integer >= 8 (smaller is an error, as in kubelet). kubelet refuses
  machines with more NUMA nodes than this (default 8) because its merge explodes; numapin's merge does
  not, so numapin places **no** limit by default (up to 64 NUMA nodes, kubelet's mask width). The option
  is accepted for compatibility: when it is set explicitly, a machine with more NUMA nodes than the value
  is refused exactly as kubelet would refuse it (allocator.topology_manager.factory).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ..errors import ConfigError
from ..go_bool import parse_go_bool

__all__ = [
    "KNOWN_OPTIONS",
    "KUBELET_MIN_MAX_ALLOWABLE",
    "MAX_ALLOWABLE",
    "NEEDS_DISTANCES",
    "PREFER_CLOSEST",
    "PolicyOptions",
    "parse_policy_options",
]

PREFER_CLOSEST = "prefer-closest-numa-nodes"
MAX_ALLOWABLE = "max-allowable-numa-nodes"
KNOWN_OPTIONS = (PREFER_CLOSEST, MAX_ALLOWABLE)
KUBELET_MIN_MAX_ALLOWABLE = 8
NEEDS_DISTANCES = f"topology manager option {PREFER_CLOSEST} needs the NUMA distances of the machine"


@dataclass(frozen=True, slots=True)
class PolicyOptions:
    prefer_closest_numa: bool = False
    max_allowable_numa_nodes: int | None = None  # None: not set (numapin: no limit)


def parse_policy_options(options: Mapping[str, object] | None) -> PolicyOptions:
    """Validate ``topologyManagerPolicyOptions``; ConfigError naming the option on bad input."""
    prefer = False
    max_nodes: int | None = None
    for name, value in (options or {}).items():
        text = str(value).strip()
        if name == PREFER_CLOSEST:
            parsed = parse_go_bool(text)
            if parsed is None:
                raise ConfigError(f"topology manager option {name}: bad value {value!r}, expected true or false")
            prefer = parsed
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
