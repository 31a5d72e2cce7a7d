"""How the node agent reaches the container runtime: two ports, in CRI terms (``protos.cri_pb2`` messages), that each
door supplies.

- :class:`RuntimeReader`: what the agent reads of the runtime (the start-up and periodic reconcile, the CRI pod
  models, the roles of a pod's containers at create, the convergence's cgroup lookup, mode changes, resize). The
  CRI proxy asks the runtime behind it; a door that must not call the runtime while it handles an event (NRI: a
  call from inside an event handler deadlocks) answers from what the runtime told it (Synchronize, the events).
- :class:`RecordWriter`: the one write, a container's resources in the runtime's record
  (``UpdateContainerResources``), used by the cpuset pusher for containers it cannot write in the kernel directly
  and for the runtime's record after a direct write. The proxy calls the runtime; the NRI door may instead collect
  the updates and return them in its answer to the event (see ``nodeagent.node.cpuset_pusher``).

A call that fails raises :class:`RuntimeCallError` with the gRPC status code (NOT_FOUND: the container or sandbox
is gone) and the runtime's words.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import grpc

from protos import cri_pb2

__all__ = ["RecordWriter", "RuntimeCallError", "RuntimeReader"]


class RuntimeCallError(Exception):
    """A runtime call that failed: ``code()`` and ``details()`` as gRPC's errors have them."""

    def __init__(self, code: grpc.StatusCode, details: str | None) -> None:
        super().__init__(code, details)
        self._code = code
        self._details = details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str | None:
        return self._details

    def __str__(self) -> str:
        return f"{self._code.name}: {self._details}"


class RuntimeReader(Protocol):
    """The runtime's pods and containers, as CRI lists and statuses them. Every method raises RuntimeCallError."""

    async def list_sandboxes(self, filter: cri_pb2.PodSandboxFilter | None = None, *,
                             timeout: float = 10.0) -> Sequence[cri_pb2.PodSandbox]:
        """``ListPodSandbox`` (with ``filter`` when given)."""
        ...

    async def list_containers(self, filter: cri_pb2.ContainerFilter | None = None, *,
                              timeout: float = 10.0) -> Sequence[cri_pb2.Container]:
        """``ListContainers`` (with ``filter`` when given)."""
        ...

    async def container_status(self, container_id: str, *, verbose: bool = False,
                               timeout: float = 10.0) -> cri_pb2.ContainerStatusResponse:
        """``ContainerStatus``; ``verbose``: with the runtime's ``info`` (its OCI spec: cgroup path, pid)."""
        ...


class RecordWriter(Protocol):
    """The runtime's record of one container's resources (``UpdateContainerResources``). Raises RuntimeCallError
    (NOT_FOUND: the container is gone)."""

    async def update_resources(self, container_id: str, resources: cri_pb2.LinuxContainerResources, *,
                               timeout: float = 10.0) -> None:
        ...
