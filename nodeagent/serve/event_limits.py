"""The two memories of the Event recorder (``nodeagent.serve.events``), as kubelet's recorder keeps them: a token
bucket per pod (a burst of 25 Events, then one per 5 minutes: a pod in a retry loop cannot flood the API server),
and the Events already on the API server by what they say (a repeat increments the existing Event's count). Both
are bounded (least recently used forgotten first); the buckets read an injected clock."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["Aggregate", "AggregateKey", "Aggregates", "SpamFilter"]

BURST = 25               # kubelet's defaults (client-go's record package)
REFILL_SECONDS = 300.0
MAX_KEYS = 4096


def _touch(memory: dict[Any, Any], key: Any, value: Any, size: int) -> None:
    """``memory[key] = value`` as its most recent entry (a dict keeps insertion order), the oldest dropped past
    ``size``."""
    memory.pop(key, None)
    memory[key] = value
    if len(memory) > size:
        del memory[next(iter(memory))]


@dataclass(frozen=True)
class _Bucket:
    tokens: float
    at: float


class SpamFilter:
    """``allow(pod uid)``: whether one more Event of the pod may go now (takes a token)."""

    def __init__(self, *, burst: int = BURST, refill_seconds: float = REFILL_SECONDS, max_pods: int = MAX_KEYS,
                 clock: Callable[[], float]) -> None:
        if burst < 1 or refill_seconds <= 0:
            raise ValueError(f"a spam filter needs burst >= 1 and refill_seconds > 0, got {burst}, {refill_seconds}")
        self.burst = burst
        self.refill_seconds = refill_seconds
        self.clock = clock
        self.max_pods = max_pods
        self._buckets: dict[str, _Bucket] = {}  # pod -> its bucket, least recently used first

    def allow(self, pod: str) -> bool:
        now = self.clock()
        b = self._buckets.get(pod) or _Bucket(float(self.burst), now)
        tokens = min(float(self.burst), b.tokens + max(now - b.at, 0.0) / self.refill_seconds)
        allowed = tokens >= 1.0 - 1e-9  # (float sums of refills)
        _touch(self._buckets, pod, _Bucket(tokens - 1.0 if allowed else tokens, now), self.max_pods)
        return allowed


# (namespace, pod uid, type, reason, message): Events that say the same on the same pod are one Event with a count
AggregateKey = tuple[str, str, str, str, str]


@dataclass(frozen=True)
class Aggregate:
    """An Event on the API server: its name, how many times it happened, when first."""

    name: str
    count: int
    first_timestamp: str


class Aggregates:
    """The Events on the API server by ``AggregateKey`` (bounded: a forgotten one is created anew)."""

    def __init__(self, size: int = MAX_KEYS) -> None:
        self.size = size
        self._sent: dict[AggregateKey, Aggregate] = {}  # least recently used first

    def get(self, key: AggregateKey) -> Aggregate | None:
        found = self._sent.get(key)
        if found is not None:
            _touch(self._sent, key, found, self.size)
        return found

    def put(self, key: AggregateKey, value: Aggregate) -> None:
        _touch(self._sent, key, value, self.size)

    def forget(self, key: AggregateKey) -> None:
        self._sent.pop(key, None)
