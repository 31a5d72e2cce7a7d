"""Kubernetes resource quantities (``2``, ``1500m``, ``0.5``, ``2k``, ``1Gi``, ``1e3``) as exact fractions.

The grammar is Kubernetes' (k8s.io/apimachinery ``resource.Quantity``)::

    quantity       ::= signedNumber suffix
    signedNumber   ::= number | sign number          sign ::= "+" | "-"
    number         ::= digits | digits "." digits | digits "." | "." digits
    suffix         ::= binarySI | decimalExponent | decimalSI
    binarySI       ::= Ki | Mi | Gi | Ti | Pi | Ei
    decimalSI      ::= n | u | m | "" | k | M | G | T | P | E
    decimalExponent::= ("e" | "E") signedNumber      (an integer exponent)

with Kubernetes' value rules: a non-zero value finer than 1n is rounded away from zero to 1n, and a binarySI value
is capped at 2^63-1. The input is untrusted (it comes from pod specs), so parsing is a single left-to-right scan (no
backtracking regular expression) over a bounded input: a quantity longer than ``MAX_QUANTITY_CHARS`` characters or
with a decimal exponent beyond ``MAX_EXPONENT`` is refused with a PodSpecError (Kubernetes would accept it; no real
pod needs it), so no value ever reaches Python's int/str conversion limit.
"""

from __future__ import annotations

import functools
import math
from fractions import Fraction

from .errors import PodSpecError

__all__ = ["MAX_EXPONENT", "MAX_QUANTITY_CHARS", "cpu_milli", "memory_bytes", "parse_quantity"]

MAX_QUANTITY_CHARS = 64
MAX_EXPONENT = 100
_DIGITS = "0123456789"
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
_NANO = Fraction(1, 10**9)
_BINARY_MAX = 2**63 - 1


def _digits(text: str) -> tuple[str, str]:
    """The leading ASCII digits of ``text`` and the rest (C-speed, linear)."""
    rest = text.lstrip(_DIGITS)
    return text[: len(text) - len(rest)], rest


def _scan(text: str, shown: str) -> Fraction:
    """One pass over a quantity string (at most MAX_QUANTITY_CHARS long)."""
    negative = text[:1] == "-"
    body = text[1:] if text[:1] in ("+", "-") else text
    whole, rest = _digits(body)
    frac = ""
    if rest[:1] == ".":
        frac, rest = _digits(rest[1:])
    if not whole and not frac:
        raise PodSpecError(f"invalid quantity {shown}: no digits")
    value = Fraction(int(whole or "0") * 10 ** len(frac) + int(frac or "0"), 10 ** len(frac))
    if rest in _BINARY:
        value = min(value * _BINARY[rest], Fraction(_BINARY_MAX))
    elif rest in _DECIMAL:
        value *= _DECIMAL[rest]
    elif rest[:1] in ("e", "E"):
        exp_text = rest[1:]
        exp_sign = -1 if exp_text[:1] == "-" else 1
        exp_body = exp_text[1:] if exp_text[:1] in ("+", "-") else exp_text
        exp_digits, tail = _digits(exp_body)
        if not exp_digits or tail:
            raise PodSpecError(f"invalid quantity {shown}: bad suffix {rest!r}")
        exponent = exp_sign * int(exp_digits)
        if abs(exponent) > MAX_EXPONENT:
            raise PodSpecError(f"invalid quantity {shown}: exponent out of range (at most {MAX_EXPONENT} either way)")
        value *= Fraction(10) ** exponent
    else:
        raise PodSpecError(f"invalid quantity {shown}: bad suffix {rest[:8]!r}; expected one of "
                           "n, u, m, k, M, G, T, P, E, Ki, Mi, Gi, Ti, Pi, Ei or an exponent such as e3")
    if value and value.denominator > 10**9:
        value = math.ceil(value / _NANO) * _NANO  # Kubernetes keeps nano precision, rounding up
    return -value if negative else value


def parse_quantity(value: str | int | float) -> Fraction:
    """The exact value of a Kubernetes quantity. Raises PodSpecError quoting (the start of) the input when it is not
    one, or is longer than MAX_QUANTITY_CHARS characters."""
    if isinstance(value, bool):
        raise PodSpecError(f"invalid quantity {value!r}")
    if isinstance(value, int):
        if value.bit_length() > 200:  # ~60 digits; str() of it stays far from the int/str conversion limit
            raise PodSpecError(f"invalid quantity: a number of {value.bit_length()} bits is out of range")
        return Fraction(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise PodSpecError(f"invalid quantity {value!r}")
        return _scan(repr(value), repr(value))
    if not isinstance(value, str):
        raise PodSpecError(f"invalid quantity of type {type(value).__name__}: expected a string or a number")
    if len(value) > MAX_QUANTITY_CHARS:
        raise PodSpecError(f"invalid quantity {value[:16]!r}... ({len(value)} characters): numapin reads "
                           f"quantities of at most {MAX_QUANTITY_CHARS} characters")
    if not value:
        raise PodSpecError("invalid quantity '': empty")
    return _scan_text(value)


# perf (issue 13): a pod's quantities repeat across pods ("500m", "1Gi"); parsing one is a pure function of its text,
# so the last few thousand answers are remembered (bounded; errors are not cached, they raise every time)
@functools.lru_cache(maxsize=4096)
def _scan_text(value: str) -> Fraction:
    return _scan(value, repr(value))


def _non_negative(value: str | int | float, field: str) -> Fraction:
    try:
        q = parse_quantity(value)
    except PodSpecError as e:
        raise PodSpecError(f"{field}: {e}") from None
    if q < 0:
        raise PodSpecError(f"{field}: quantity {str(value)[:MAX_QUANTITY_CHARS]!r} must not be negative")
    return q


def cpu_milli(value: str | int | float, *, field: str = "cpu") -> int:
    """A non-negative CPU quantity in milli-CPUs, rounded up as Kubernetes' MilliValue() does."""
    if type(value) is str:
        try:
            return _scaled_text(value, 1000)
        except _NotPlain:
            pass  # the checked path below raises the error, naming the field
    return math.ceil(_non_negative(value, field) * 1000)


def memory_bytes(value: str | int | float, *, field: str = "memory") -> int:
    """A non-negative memory quantity in bytes, rounded up as Kubernetes' Value() does."""
    if type(value) is str:
        try:
            return _scaled_text(value, 1)
        except _NotPlain:
            pass
    return math.ceil(_non_negative(value, field))


class _NotPlain(Exception):
    """The text is not a valid non-negative quantity (the checked path says why)."""


# perf (issue 13): the integer a text gives (``"500m"`` -> 500 milli-CPUs) is remembered as well, so a pod whose
# quantities were seen before costs no Fraction arithmetic; invalid texts fall through to the checked path (errors
# are never cached and keep naming their field)
@functools.lru_cache(maxsize=4096)
def _scaled_text(value: str, scale: int) -> int:
    if len(value) > MAX_QUANTITY_CHARS or not value:
        raise _NotPlain
    try:
        q = _scan_text(value)
    except PodSpecError:
        raise _NotPlain from None
    if q < 0:
        raise _NotPlain
    return math.ceil(q * scale)
