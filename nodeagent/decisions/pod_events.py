"""What the decisions tell about a pod, for the Events ``kubectl describe pod`` shows (recorded by
``nodeagent.serve.events``): a value per happening, handed to a sink that never waits (``EventSink``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

__all__ = ["EventSink", "EventType", "PodEvent", "no_events", "pod_event"]

EventType = Literal["Normal", "Warning"]


@dataclass(frozen=True)
class PodEvent:
    """One happening on a pod: ``reason`` is one word (Pinned, Refused, Resized, ModeChanged, Repaired), ``message``
    the sentence an operator reads."""

    namespace: str
    name: str
    uid: str
    type: EventType
    reason: str
    message: str


EventSink = Callable[[PodEvent], None]  # called in the decision path: it must not wait or raise


def no_events(event: PodEvent) -> None:
    """The sink of an agent that records no Events."""


def pod_event(pod_ref: str, uid: str, type: EventType, reason: str, message: str) -> PodEvent:
    """The event of the pod ``namespace/name`` (``pod_ref``, as the registry keeps it)."""
    namespace, _, name = pod_ref.partition("/")
    return PodEvent(namespace, name, uid, type, reason, message)
