"""Small builders of v1 Pod dicts for the allocator tests (kubelet's makePod / makeMultiContainerPod)."""

from __future__ import annotations

from typing import Any


def container(name: str, request: str | None, limit: str | None, *, restart: str | None = None) -> dict[str, Any]:
    """A container with CPU (and, like kubelet's makePod, 1G memory) requests and limits."""
    requests: dict[str, str] = {}
    limits: dict[str, str] = {}
    if request is not None:
        requests = {"cpu": request, "memory": "1G"}
    if limit is not None:
        limits = {"cpu": limit, "memory": "1G"}
    c: dict[str, Any] = {"name": name, "resources": {"requests": requests, "limits": limits}}
    if restart is not None:
        c["restartPolicy"] = restart
    return c


def pod(
    uid: str,
    containers: list[dict[str, Any]],
    init: list[dict[str, Any]] | None = None,
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": containers}
    if init:
        spec["initContainers"] = init
    meta: dict[str, Any] = {"uid": uid, "name": uid, "namespace": "default"}
    if annotations:
        meta["annotations"] = annotations
    return {"metadata": meta, "spec": spec}


def make_pod(uid: str, name: str, request: str, limit: str) -> dict[str, Any]:
    """kubelet's makePod: one app container."""
    return pod(uid, [container(name, request, limit)])


def make_multi_container_pod(
    init: list[tuple[str, str] | tuple[str, str, str]], app: list[tuple[str, str]], uid: str = "fakePod"
) -> dict[str, Any]:
    """kubelet's makeMultiContainerPodWithOptions: initContainer-N and appContainer-N; a third init field is
    the restartPolicy ("Always" makes a sidecar)."""
    inits = []
    for i, spec in enumerate(init):
        restart = spec[2] if len(spec) > 2 else None  # type: ignore[misc]
        inits.append(container(f"initContainer-{i}", spec[0], spec[1], restart=restart))
    apps = [container(f"appContainer-{i}", r, lim) for i, (r, lim) in enumerate(app)]
    return pod(uid, apps, inits)
