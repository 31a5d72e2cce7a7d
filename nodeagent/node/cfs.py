"""CFS conversions between milli-CPUs and cgroup ``cpu.shares`` / ``cfs_quota_us`` (kubelet's constants).

kubelet turns a container's CPU request into shares and its limit into a quota; CRI carries only those, so
the proxy, lacking the webhook's intent annotation, recovers the request and the limit from them.
"""

from __future__ import annotations

__all__ = [
    "MAX_SHARES",
    "MILLI_CPU_TO_CPU",
    "MIN_QUOTA_PERIOD",
    "MIN_SHARES",
    "QUOTA_PERIOD",
    "SHARES_PER_CPU",
    "UNLIMITED_QUOTA",
    "milli_cpu_to_quota",
    "milli_cpu_to_shares",
    "quota_to_milli_cpu",
    "shares_to_milli_cpu",
]

MIN_SHARES = 2
MAX_SHARES = 262144
SHARES_PER_CPU = 1024
MILLI_CPU_TO_CPU = 1000
QUOTA_PERIOD = 100000  # microseconds
MIN_QUOTA_PERIOD = 1000
UNLIMITED_QUOTA = -1  # CRI's cpu_quota of a container without a CFS quota


def milli_cpu_to_shares(milli: int) -> int:
    """``cpu.shares`` for a CPU request (kubelet: 0 -> MIN_SHARES, clamped to [MIN_SHARES, MAX_SHARES])."""
    if milli < 0:
        raise ValueError(f"CPU request must not be negative, got {milli}m")
    if milli == 0:
        return MIN_SHARES
    return max(MIN_SHARES, min(MAX_SHARES, milli * SHARES_PER_CPU // MILLI_CPU_TO_CPU))


def milli_cpu_to_quota(milli: int, period: int = QUOTA_PERIOD) -> int:
    """``cfs_quota_us`` for a CPU limit over ``period`` (kubelet: 0 -> 0 = unset, at least MIN_QUOTA_PERIOD)."""
    if milli < 0 or period <= 0:
        raise ValueError(f"bad CPU limit {milli}m / period {period}")
    if milli == 0:
        return 0
    return max(MIN_QUOTA_PERIOD, milli * period // MILLI_CPU_TO_CPU)


def shares_to_milli_cpu(shares: int) -> int:
    """The smallest CPU request kubelet would have turned into ``shares`` (MIN_SHARES or less -> 0)."""
    if shares <= MIN_SHARES:
        return 0
    return -(-shares * MILLI_CPU_TO_CPU // SHARES_PER_CPU)


def quota_to_milli_cpu(quota: int, period: int) -> int | None:
    """The CPU limit behind ``quota``/``period``; None when there is no limit (quota <= 0 or no period)."""
    if quota <= 0 or period <= 0:
        return None
    return -(-quota * MILLI_CPU_TO_CPU // period)
