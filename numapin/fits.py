"""``--fits cpu=4,memory=8Gi``: the shape of a pod to place, as the pod the webhook would judge.

Keys: ``cpu`` (required), ``memory``, ``hugepages-<size>`` (Kubernetes quantities) and ``mode`` (the
``qos.gocrane.io/cpu-manager`` annotation: ``exclusive``, ``share`` or ``none``). The pod has one container whose
requests equal its limits (Guaranteed: an integer ``cpu`` gets exclusive CPUs by kubelet's rule); ``memory`` is
required unless ``mode`` is given (without it the pod would not be Guaranteed and would run on the shared pool).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from allocator.errors import AllocatorError
from allocator.pod import CPU_MANAGER_ANNOTATION, PodInfo
from allocator.quantity import cpu_milli, memory_bytes

__all__ = ["FitsError", "PodShape", "parse_fits"]

_MODES = ("exclusive", "share", "none")


class FitsError(ValueError):
    """A ``--fits`` value that is not a pod shape (the message says which part)."""


@dataclass(frozen=True)
class PodShape:
    text: str  # as given
    resources: tuple[tuple[str, str], ...]  # (resource, quantity) in the order given
    mode: str | None
    pod: PodInfo

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(self.resources)
        if self.mode is not None:
            out["mode"] = self.mode
        return out


def parse_fits(text: str) -> PodShape:
    resources: dict[str, str] = {}
    mode: str | None = None
    for part in text.split(","):
        key, sep, value = (s.strip() for s in part.partition("="))
        if not sep or not key or not value:
            raise FitsError(f"{part.strip()!r}: expected KEY=VALUE (e.g. cpu=4,memory=8Gi)")
        if key in resources or (key == "mode" and mode is not None):
            raise FitsError(f"{key} given twice")
        if key == "mode":
            if value not in _MODES:
                raise FitsError(f"mode={value}: expected one of {', '.join(_MODES)}")
            mode = value
            continue
        try:
            if key == "cpu":
                cpu_milli(value, field=key)
            elif key == "memory" or key.startswith("hugepages-"):
                memory_bytes(value, field=key)
            else:
                raise FitsError(f"unknown key {key!r}: expected cpu, memory, hugepages-<size> or mode")
        except AllocatorError as e:
            raise FitsError(str(e)) from None
        resources[key] = value
    if "cpu" not in resources:
        raise FitsError("cpu=<quantity> is required (e.g. cpu=4)")
    if cpu_milli(resources["cpu"]) == 0:
        raise FitsError("cpu must be more than 0")
    if "memory" not in resources and mode is None:
        raise FitsError("memory=<quantity> is required unless mode= is given: without it the pod is not "
                        "Guaranteed and runs on the shared pool (e.g. cpu=4,memory=8Gi, or cpu=4,mode=exclusive)")
    manifest: dict[str, Any] = {
        "metadata": {"name": "fits", "namespace": "", "uid": "",
                     "annotations": {CPU_MANAGER_ANNOTATION: mode} if mode else {}},
        "spec": {"containers": [{"name": "app", "resources": {"requests": resources, "limits": resources}}]},
    }
    try:
        pod = PodInfo.from_pod(manifest)
    except AllocatorError as e:
        raise FitsError(str(e)) from None
    return PodShape(text, tuple(resources.items()), mode, pod)
