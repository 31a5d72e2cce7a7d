"""Kubernetes quantities: the grammar of k8s.io/apimachinery's resource.Quantity, Kubernetes' rounding and capping,
and bounded, linear parsing of untrusted input (long inputs refused with a PodSpecError, never another error)."""

from __future__ import annotations

import re
from decimal import Decimal, localcontext
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from allocator.errors import PodSpecError
from allocator.quantity import MAX_QUANTITY_CHARS, cpu_milli, memory_bytes, parse_quantity


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("0", Fraction(0)),
        ("1.", Fraction(1)),          # digits "." is a number
        ("1.G", Fraction(10**9)),
        ("+2", Fraction(2)),
        ("-1500m", Fraction(-3, 2)),
        ("1E", Fraction(10**18)),     # E alone is exa, not an exponent
        ("1e-3", Fraction(1, 1000)),
        ("2E+2", Fraction(200)),
        ("0.9n", Fraction(1, 10**9)),  # finer than nano: rounded away from zero to 1n
        ("1e-20", Fraction(1, 10**9)),
        ("16Ei", Fraction(2**63 - 1)),  # binarySI capped at 2^63-1
        ("007", Fraction(7)),
        (1e-05, Fraction(1, 100000)),
        (2.5e3, Fraction(2500)),
    ],
)
def test_kubernetes_grammar(text: str | float, value: Fraction) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize("text", [".", "+", "-", "e3", "1e", "1e+", "1 ", " 1", "1Ki2", "1KiB", "1K", "0x10",
                                  "1..2", "1e3.5", "١", "1e101", "1e-101", "1_000"])
def test_not_quantities(text: str) -> None:
    with pytest.raises(PodSpecError, match="invalid quantity"):
        parse_quantity(text)


@pytest.mark.parametrize("text", ["1" * 16000 + "x", "1" * 5000, "9" * 5000 + "E", "." + "0" * 8000 + "1",
                                  "1e" + "9" * 5000, "1" * (MAX_QUANTITY_CHARS + 1)])
def test_long_inputs_are_refused_by_the_length_rule(text: str) -> None:
    # issue 15: these blocked the event loop for seconds (backtracking) or hit Python's int/str conversion limit
    with pytest.raises(PodSpecError, match=f"at most {MAX_QUANTITY_CHARS} characters"):
        cpu_milli(text)
    with pytest.raises(PodSpecError, match=f"at most {MAX_QUANTITY_CHARS} characters"):
        memory_bytes(text)


def test_numbers_from_json() -> None:
    assert cpu_milli(3) == 3000
    with pytest.raises(PodSpecError, match="out of range"):
        cpu_milli(10**4000)  # json.loads hands such ints over (up to 4300 digits)
    with pytest.raises(PodSpecError, match="exponent out of range"):
        memory_bytes(1e300)


def test_longest_accepted_quantity_is_exact() -> None:
    text = "9" * 60 + "e99"
    assert len(text) <= MAX_QUANTITY_CHARS
    assert cpu_milli(text) == (10**60 - 1) * 10**99 * 1000


_GRAMMAR = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]+)?")


def _reference(text: str) -> Fraction | None:
    """An independent reading of the grammar (a regular expression, Decimal arithmetic) for short inputs."""
    if not _GRAMMAR.fullmatch(text):
        return None
    m = re.fullmatch(r"([+-]?[0-9.]+)(.*)", text)
    assert m
    number, suffix = m.groups()
    with localcontext() as ctx:
        ctx.prec = 400
        d = Decimal(number)
        binary = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
        decimal = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
        if suffix in binary:
            v = Fraction(d) * 2 ** binary[suffix]
            v = min(abs(v), Fraction(2**63 - 1)) * (1 if v >= 0 else -1)
        elif suffix in decimal:
            v = Fraction(d) * Fraction(10) ** decimal[suffix]
        else:
            exp = int(suffix[1:])
            if abs(exp) > 100:
                return None
            v = Fraction(d) * Fraction(10) ** exp
    if v and (v * 10**9).denominator != 1:
        mag = -((-abs(v) * 10**9) // 1) / Fraction(10**9)
        v = mag if v > 0 else -mag
    return v


@settings(max_examples=400, deadline=None, derandomize=True)
@given(st.text(alphabet="0123456789.+-eEnumkKMGTPi ", max_size=14))
def test_matches_an_independent_reading_of_the_grammar(text: str) -> None:
    want = _reference(text)
    try:
        got = parse_quantity(text)
    except PodSpecError:
        assert want is None, text
    else:
        assert got == want, text
