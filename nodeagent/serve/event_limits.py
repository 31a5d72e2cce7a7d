"""The two memories of the Event recorder (``nodeagent.serve.events``), as kubelet's recorder keeps them: a token
bucket per pod (a burst of 25 Events, then one per 5 minutes: a pod in a retry loop cannot flood the API server),
and the Events already on the API server by what they say (a repeat increments the existing Event's count). Both
are bounded (least recently used forgotten first) and read an injected clock."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

__all__ = ["Aggregate", "AggregateKey", "Aggregates", "SpamFilter"]

BURST = 25               # kubelet's defaults (client-go's record package)
REFILL_SECONDS = 300.0
MAX_KEYS = 4096

K = TypeVar("K")
V = TypeVar("V")


class _Lru(Generic[K, V]):
    def __init__(self, size: int) -> None:
        self.size = size
        self._items: OrderedDict[K, V] = OrderedDict()

    def get(self, key: K) -> V | None:
        value = self._items.get(key)
        if value is not None:
            self._items.move_to_end(key)
        return value

    def put(self, key: K, value: V) -> None:
        self._items[key] = value
        self._items.move_to_end(key)
        while len(self._items) > self.size:
            self._items.popitem(last=False)

    def pop(self, key: K) -> None:
        self._items.pop(key, None)

    def __len__(self) -> int:
        return len(self._items)


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
        self._buckets: _Lru[str, _Bucket] = _Lru(max_pods)

    def allow(self, pod: str) -> bool:
        now = self.clock()
        b = self._buckets.get(pod) or _Bucket(float(self.burst), now)
        tokens = min(float(self.burst), b.tokens + max(now - b.at, 0.0) / self.refill_seconds)
        allowed = tokens >= 1.0 - 1e-9  # (float sums of refills)
        self._buckets.put(pod, _Bucket(tokens - 1.0 if allowed else tokens, now))
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
        self._lru: _Lru[AggregateKey, Aggregate] = _Lru(size)

    def get(self, key: AggregateKey) -> Aggregate | None:
        return self._lru.get(key)

    def put(self, key: AggregateKey, value: Aggregate) -> None:
        self._lru.put(key, value)

    def forget(self, key: AggregateKey) -> None:
        self._lru.pop(key)
