"""What the plugin's user implements: a ``Handler`` receives NRI's decoded requests (``protos.nri_pb2`` messages)
and returns NRI's responses, or raises ``PluginError(code, message)``, which becomes the ttrpc error status the
runtime sees (an error from CreateContainer or UpdateContainer fails kubelet's CRI call with that message).

Every call gets a ``CallContext`` with its deadline: the runtime drops a plugin that has not answered by then
(ConfigureRequest.request_timeout, 2 s when the runtime does not say) and carries on without its answer. A whole
Synchronize, split into chunks or not, shares one deadline, and the handler sees it once, with every pod and
container. ``BaseHandler`` answers everything with "no change", so an adapter overrides only what it needs."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Protocol

from protos import nri_pb2

from .events import CONTAINER_EVENTS, Event
from .wire.codes import Code

__all__ = ["BaseHandler", "CallContext", "Handler", "PluginError", "RuntimeInfo"]


@dataclass(frozen=True)
class RuntimeInfo:
    """Who the plugin is connected to (from ConfigureRequest)."""

    name: str
    version: str
    config: str  # the plugin's configuration text (pre-installed plugins only; empty for a socket plugin)
    request_timeout: float  # seconds the runtime waits for each answer
    registration_timeout: float  # seconds


@dataclass(frozen=True)
class CallContext:
    """One runtime call: its method, ttrpc stream id, and the deadline (``time.monotonic()`` seconds) after which
    the runtime no longer waits for the answer."""

    method: str
    stream_id: int
    deadline: float

    def remaining(self) -> float:
        """Seconds left until the deadline (negative when it has passed)."""
        return self.deadline - time.monotonic()


class PluginError(Exception):
    """A refusal: the runtime receives a ttrpc error with this status ``code`` and ``message``."""

    def __init__(self, code: Code, message: str) -> None:
        if code == Code.OK:
            raise ValueError("a PluginError needs a status code other than OK")
        super().__init__(message)
        self.code = code
        self.message = message


class Handler(Protocol):
    """A plugin's behaviour. ``events`` is the subscription (NRI v0.6.1/v0.8.0 events only)."""

    @property
    def events(self) -> frozenset[Event]: ...

    async def on_connected(self, runtime: RuntimeInfo) -> None:
        """A runtime configured the plugin (before Synchronize)."""

    async def on_disconnected(self, reason: str) -> None:
        """The connection that ``on_connected`` announced ended (the plugin reconnects by itself)."""

    async def synchronize(self, ctx: CallContext, request: Any) -> Any:
        """nri_pb2.SynchronizeRequest (every chunk joined, ``more`` false) -> nri_pb2.SynchronizeResponse."""

    async def create_container(self, ctx: CallContext, request: Any) -> Any:
        """nri_pb2.CreateContainerRequest -> nri_pb2.CreateContainerResponse."""

    async def update_container(self, ctx: CallContext, request: Any) -> Any:
        """nri_pb2.UpdateContainerRequest -> nri_pb2.UpdateContainerResponse."""

    async def stop_container(self, ctx: CallContext, request: Any) -> Any:
        """nri_pb2.StopContainerRequest -> nri_pb2.StopContainerResponse."""

    async def state_change(self, ctx: CallContext, event: Any) -> None:
        """nri_pb2.StateChangeEvent (RunPodSandbox, StopPodSandbox, RemovePodSandbox, PostCreate, StartContainer,
        PostStart, PostUpdate, RemoveContainer); raising fails RunPodSandbox / StartContainer, the rest are only
        logged by the runtime."""


class BaseHandler:
    """A handler that changes nothing; subclasses override what they need (and ``events``)."""

    events: frozenset[Event] = CONTAINER_EVENTS

    async def on_connected(self, runtime: RuntimeInfo) -> None:
        return None

    async def on_disconnected(self, reason: str) -> None:
        return None

    async def synchronize(self, ctx: CallContext, request: Any) -> Any:
        return nri_pb2.SynchronizeResponse()

    async def create_container(self, ctx: CallContext, request: Any) -> Any:
        return nri_pb2.CreateContainerResponse()

    async def update_container(self, ctx: CallContext, request: Any) -> Any:
        return nri_pb2.UpdateContainerResponse()

    async def stop_container(self, ctx: CallContext, request: Any) -> Any:
        return nri_pb2.StopContainerResponse()

    async def state_change(self, ctx: CallContext, event: Any) -> None:
        return None
