"""kubelet's ``--feature-gates`` as numapin reads it: the gates that change what kubelet's CPU, Memory and Topology
Managers do, in kubelet's syntax (``A=true,B=false``).

- ``PodLevelResources`` (beta, on by default since Kubernetes 1.34): pods may set ``spec.resources``. numapin always
  models it on; ``PodLevelResources=false`` is refused (numapin has no model of a kubelet without it).
- ``PodLevelResourceManagers`` (alpha in 1.36, off by default; needs ``PodLevelResources``): kubelet's managers
  align and pin pods with pod-level resources (``allocator.pod``: who gets CPUs and memory of its own).

Values are Go's ``strconv.ParseBool`` words (``1 t T TRUE true True``, ``0 f F FALSE false False``), as kubelet
parses them. An unknown gate, a bad value or a gate given twice is a ConfigError naming it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from .errors import ConfigError

__all__ = ["KNOWN_GATES", "FeatureGates", "feature_gates_of", "parse_feature_gates"]

KNOWN_GATES = ("PodLevelResourceManagers", "PodLevelResources")
_TRUE = ("1", "t", "T", "TRUE", "true", "True")
_FALSE = ("0", "f", "F", "FALSE", "false", "False")


@dataclass(frozen=True, slots=True)
class FeatureGates:
    """The gates numapin models; the defaults are kubelet 1.36's."""

    pod_level_resource_managers: bool = False

    def to_text(self) -> str:
        """The gates in kubelet's syntax (what ``parse_feature_gates`` reads back)."""
        return f"PodLevelResourceManagers={'true' if self.pod_level_resource_managers else 'false'}"


def parse_feature_gates(text: str) -> FeatureGates:
    """Read ``--feature-gates`` (``A=true,B=false``; empty: the defaults). Raises ConfigError saying what is wrong."""
    values: dict[str, bool] = {}
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        name, sep, raw = (s.strip() for s in item.partition("="))
        if not sep or not name:
            raise ConfigError(f"--feature-gates: {item!r} is not Name=true|false")
        if name not in KNOWN_GATES:
            raise ConfigError(f"--feature-gates: unrecognized feature gate {name!r} (numapin knows "
                              f"{', '.join(KNOWN_GATES)})")
        if raw not in _TRUE + _FALSE:
            raise ConfigError(f"--feature-gates: invalid value of {name}: {raw!r} (true or false)")
        if name in values:
            raise ConfigError(f"--feature-gates: {name} is given twice")
        values[name] = raw in _TRUE
    if not values.get("PodLevelResources", True):
        raise ConfigError("--feature-gates: PodLevelResources=false is not supported: numapin models kubelet with "
                          "pod-level resources on (beta, the default since Kubernetes 1.34)")
    return FeatureGates(pod_level_resource_managers=values.get("PodLevelResourceManagers", False))


def feature_gates_of(value: object, what: str = "featureGates") -> FeatureGates:
    """``--feature-gates`` text, or kubelet's KubeletConfiguration ``featureGates`` mapping (``{Name: true}``), or
    None (the defaults). Raises ConfigError naming ``what``."""
    if value is None:
        return FeatureGates()
    if isinstance(value, Mapping):
        value = ",".join(f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in value.items())
    if not isinstance(value, str):
        raise ConfigError(f"{what}: expected a mapping of gate names to true or false, got {value!r}")
    return parse_feature_gates(value)
