"""The v1 Pod manifests the demo and the tests run: as a user writes them (before numapin's /mutate). A module of
its own, light to import (the multi-NUMA VMs' guest imports it under emulation, where the demo's HTTP clients
would cost seconds)."""

from __future__ import annotations

from typing import Any

from allocator.pod import CPU_MANAGER_ANNOTATION

__all__ = ["make_pod"]


def make_pod(name: str, *, cpu: str, limit: str | None = None, mode: str | None = None) -> dict[str, Any]:
    """A v1 Pod as a user writes it: one busybox container ``app`` with a CPU request (and limit)."""
    resources: dict[str, Any] = {"requests": {"cpu": cpu, "memory": "32Mi"}}
    if limit is not None:
        resources["limits"] = {"cpu": limit, "memory": "32Mi"}
    meta: dict[str, Any] = {"name": name, "namespace": "default", "labels": {"app": name}}
    if mode is not None:
        meta["annotations"] = {CPU_MANAGER_ANNOTATION: mode}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": {"containers": [{"name": "app", "image": "localhost/busybox:latest", "command": ["sleep", "86400"],
                                     "resources": resources}],
                     "restartPolicy": "Always", "schedulerName": "default-scheduler"}}
