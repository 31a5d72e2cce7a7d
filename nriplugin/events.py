"""NRI's events and the subscription mask a plugin answers Configure with: bit (event - 1) per event. The runtimes
numapin targets (NRI v0.6.1 in containerd 1.7, v0.8.0 in 2.1) accept only bits within 0x7FF and close a plugin that
sets another one, and a mask of 0 means "every event": so a subscription is a non-empty set of these eleven."""

from __future__ import annotations

from collections.abc import Iterable
from enum import IntEnum

__all__ = ["CONTAINER_EVENTS", "VALID_MASK", "Event", "mask_of"]

VALID_MASK = 0x7FF


class Event(IntEnum):
    """The values of NRI's ``Event`` enum (StateChangeEvent.event)."""

    RUN_POD_SANDBOX = 1
    STOP_POD_SANDBOX = 2
    REMOVE_POD_SANDBOX = 3
    CREATE_CONTAINER = 4
    POST_CREATE_CONTAINER = 5
    START_CONTAINER = 6
    POST_START_CONTAINER = 7
    UPDATE_CONTAINER = 8
    POST_UPDATE_CONTAINER = 9
    STOP_CONTAINER = 10
    REMOVE_CONTAINER = 11


# what a pinning plugin needs at least: containers created, updated (kubelet's resize), stopped and removed
CONTAINER_EVENTS = frozenset({Event.CREATE_CONTAINER, Event.UPDATE_CONTAINER, Event.STOP_CONTAINER,
                              Event.REMOVE_CONTAINER})


def mask_of(events: Iterable[Event]) -> int:
    """ConfigureResponse.events for ``events`` (``ValueError`` for none: 0 would subscribe every event)."""
    mask = 0
    for event in events:
        mask |= 1 << (Event(event) - 1)
    if mask == 0:
        raise ValueError("a plugin must subscribe to at least one event (a mask of 0 means every event)")
    assert mask & ~VALID_MASK == 0
    return mask
