"""kubelet's CPU Manager static-policy options (``cpuManagerPolicyOptions``), parsed and checked.

The six options kubelet knows, their boolean values (Go ``strconv.ParseBool`` spellings), the combinations
kubelet refuses, and the machine / topology-manager checks it makes at start-up. kubelet's feature gates
for alpha and beta options are taken as enabled: numapin does not model feature gates.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from .errors import ConfigError
from .go_bool import parse_go_bool
from .topology import Topology

__all__ = [
    "ALIGN_BY_SOCKET",
    "DISTRIBUTE_CPUS_ACROSS_CORES",
    "DISTRIBUTE_CPUS_ACROSS_NUMA",
    "FULL_PCPUS_ONLY",
    "OPTION_NAMES",
    "PREFER_ALIGN_CPUS_BY_UNCORECACHE",
    "STRICT_CPU_RESERVATION",
    "StaticPolicyOptions",
    "parse_bool",
]

FULL_PCPUS_ONLY = "full-pcpus-only"
DISTRIBUTE_CPUS_ACROSS_NUMA = "distribute-cpus-across-numa"
ALIGN_BY_SOCKET = "align-by-socket"
DISTRIBUTE_CPUS_ACROSS_CORES = "distribute-cpus-across-cores"
STRICT_CPU_RESERVATION = "strict-cpu-reservation"
PREFER_ALIGN_CPUS_BY_UNCORECACHE = "prefer-align-cpus-by-uncorecache"

OPTION_NAMES: tuple[str, ...] = (
    FULL_PCPUS_ONLY,
    DISTRIBUTE_CPUS_ACROSS_NUMA,
    ALIGN_BY_SOCKET,
    DISTRIBUTE_CPUS_ACROSS_CORES,
    STRICT_CPU_RESERVATION,
    PREFER_ALIGN_CPUS_BY_UNCORECACHE,
)

_FIELDS = {
    FULL_PCPUS_ONLY: "full_pcpus_only",
    DISTRIBUTE_CPUS_ACROSS_NUMA: "distribute_cpus_across_numa",
    ALIGN_BY_SOCKET: "align_by_socket",
    DISTRIBUTE_CPUS_ACROSS_CORES: "distribute_cpus_across_cores",
    STRICT_CPU_RESERVATION: "strict_cpu_reservation",
    PREFER_ALIGN_CPUS_BY_UNCORECACHE: "prefer_align_cpus_by_uncorecache",
}

# kubelet checks these pairs in this order and reports the first one that is set.
_FORBIDDEN_PAIRS = (
    (FULL_PCPUS_ONLY, DISTRIBUTE_CPUS_ACROSS_CORES),
    (DISTRIBUTE_CPUS_ACROSS_NUMA, DISTRIBUTE_CPUS_ACROSS_CORES),
    (PREFER_ALIGN_CPUS_BY_UNCORECACHE, DISTRIBUTE_CPUS_ACROSS_CORES),
    (PREFER_ALIGN_CPUS_BY_UNCORECACHE, DISTRIBUTE_CPUS_ACROSS_NUMA),
)


def parse_bool(value: object, *, field: str) -> bool:
    """Go ``strconv.ParseBool``: ``true``/``false`` (and ``1 t T TRUE True``, ``0 f F FALSE False``).

    A real boolean (from YAML) is accepted as is. Anything else raises ConfigError naming the field.
    """
    parsed = parse_go_bool(value)
    if parsed is not None:
        return parsed
    raise ConfigError(f'bad value for option "{field}": {value!r} is not a boolean (use "true" or "false")')


@dataclass(frozen=True, slots=True)
class StaticPolicyOptions:
    """The parsed options; every flag defaults to off, as in kubelet."""

    full_pcpus_only: bool = False
    distribute_cpus_across_numa: bool = False
    align_by_socket: bool = False
    distribute_cpus_across_cores: bool = False
    strict_cpu_reservation: bool = False
    prefer_align_cpus_by_uncorecache: bool = False

    @classmethod
    def parse(cls, options: Mapping[str, object] | None) -> StaticPolicyOptions:
        """Parse ``{option name: "true"|"false"}``. ConfigError for an unknown option, a bad value, or a
        combination kubelet refuses ("static policy options A and B can not be used at the same time")."""
        if options is None:
            return cls()
        if not isinstance(options, Mapping):
            raise ConfigError("cpuManagerPolicyOptions must map option names to \"true\" or \"false\"")
        values: dict[str, bool] = {}
        for name, raw in options.items():
            if name not in _FIELDS:
                known = ", ".join(OPTION_NAMES)
                raise ConfigError(f'unknown CPU Manager Policy option: "{name}" (known options: {known})')
            values[_FIELDS[name]] = parse_bool(raw, field=name)
        opts = cls(**values)
        for a, b in _FORBIDDEN_PAIRS:
            if opts.enabled(a) and opts.enabled(b):
                raise ConfigError(f"static policy options {a} and {b} can not be used at the same time")
        return opts

    def enabled(self, name: str) -> bool:
        return bool(getattr(self, _FIELDS[name]))

    def validate(self, topology: Topology, topology_manager_policy: str = "none") -> None:
        """kubelet's ValidateStaticPolicyOptions: checks that need the machine and the topology manager policy."""
        if self.align_by_socket:
            if topology_manager_policy == "single-numa-node":
                raise ConfigError(
                    f"Topology manager single-numa-node policy is incompatible with CPUManager "
                    f"{ALIGN_BY_SOCKET} policy option"
                )
            if topology.num_sockets > len(topology.cpu_numa_nodes):
                raise ConfigError(
                    "Align by socket is not compatible with hardware where number of sockets are more than "
                    f"number of NUMA ({topology.num_sockets} sockets, {len(topology.cpu_numa_nodes)} NUMA nodes)"
                )

    def to_dict(self) -> dict[str, str]:
        """The options that are on, as kubelet configuration would spell them."""
        return {name: "true" for name in OPTION_NAMES if self.enabled(name)}
