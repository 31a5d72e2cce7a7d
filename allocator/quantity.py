"""Kubernetes resource quantities (``2``, ``1500m``, ``0.5``, ``2k``, ``1Gi``, ``1e3``) as exact fractions."""

from __future__ import annotations

import math
import re
from fractions import Fraction

from .errors import PodSpecError

__all__ = ["cpu_milli", "memory_bytes", "parse_quantity"]

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 1000),
    "": Fraction(1),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
}
_QUANTITY = re.compile(r"^([+-]?)(\d+\.?\d*|\.\d+)(?:(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])|[eE]([+-]?\d+))?$")


def parse_quantity(value: str | int | float) -> Fraction:
    """The exact value of a Kubernetes quantity. Raises PodSpecError quoting the input when it is not one."""
    if isinstance(value, bool):
        raise PodSpecError(f"invalid quantity {value!r}")
    if isinstance(value, int):
        return Fraction(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise PodSpecError(f"invalid quantity {value!r}")
        return Fraction(str(value))
    if not isinstance(value, str):
        raise PodSpecError(f"invalid quantity {value!r}: expected a string or a number")
    m = _QUANTITY.match(value.strip())
    if not m:
        raise PodSpecError(f"invalid quantity {value!r}")
    sign, number, suffix, exponent = m.groups()
    q = Fraction(number)
    if exponent is not None:
        if abs(int(exponent)) > 60:
            raise PodSpecError(f"invalid quantity {value!r}: exponent out of range")
        q *= Fraction(10) ** int(exponent)
    elif suffix in _BINARY:
        q *= _BINARY[suffix]
    else:
        q *= _DECIMAL[suffix or ""]
    return -q if sign == "-" else q


def _non_negative(value: str | int | float, field: str) -> Fraction:
    try:
        q = parse_quantity(value)
    except PodSpecError as e:
        raise PodSpecError(f"{field}: {e}") from None
    if q < 0:
        raise PodSpecError(f"{field}: quantity {value!r} must not be negative")
    return q


def cpu_milli(value: str | int | float, *, field: str = "cpu") -> int:
    """A non-negative CPU quantity in milli-CPUs, rounded up as Kubernetes' MilliValue() does."""
    return math.ceil(_non_negative(value, field) * 1000)


def memory_bytes(value: str | int | float, *, field: str = "memory") -> int:
    """A non-negative memory quantity in bytes, rounded up as Kubernetes' Value() does."""
    return math.ceil(_non_negative(value, field))
