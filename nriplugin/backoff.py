"""How long to wait before connecting again: exponential, capped and jittered (so plugins restarted together do
not knock on a restarting runtime's socket in step)."""

from __future__ import annotations

import random
from dataclasses import dataclass

__all__ = ["Backoff"]


@dataclass(frozen=True)
class Backoff:
    initial: float = 0.1  # seconds before the first retry
    factor: float = 2.0
    cap: float = 5.0  # the longest wait
    jitter: float = 0.5  # each wait is cut by up to this fraction, at random

    def __post_init__(self) -> None:
        if not (0 < self.initial <= self.cap and self.factor >= 1 and 0 <= self.jitter < 1):
            raise ValueError(f"bad back-off {self}: need 0 < initial <= cap, factor >= 1, 0 <= jitter < 1")

    def delay(self, attempt: int, rng: random.Random) -> float:
        """The wait before retry number ``attempt`` (0-based)."""
        base = min(self.cap, self.initial * self.factor ** min(attempt, 64))
        return base * (1 - self.jitter * rng.random())
