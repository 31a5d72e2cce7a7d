"""The bounds of what a review may carry into the webhook's decisions: nesting, numbers and strings.

The JSON parsers refuse what they cannot read (msgspec's and the standard library's both stop at about a thousand
levels of nesting, the standard library at integers of more than 4300 digits) without failing. What they accept is
then cut down to what the decisions read (``slim.slim_review``), and that slim review is what travels further: it
is pickled by the parser process to the event loop, walked by the decisions, logged and echoed. Pickling, ``repr``
and the decisions recurse, so the slim review is checked here first, by a walk that does not recurse:

- arrays and objects nest at most ``MAX_DEPTH`` levels (a pod review nests about a dozen; 800 levels of arrays in
  ``request.resource.group`` once killed the parser process in ``pickle``);
- numbers are finite (``NaN``, ``Infinity`` and ``1e400`` are not JSON the API server sends; integers are bounded
  by the parser already, at 4300 digits);
- strings are at most ``MAX_STRING_BYTES`` characters (the API server bounds a pod's annotations to 256 KiB in
  total) and are valid Unicode (no lone surrogate from a ``\\ud800`` escape, which no UTF-8 answer could carry).

A review over a bound is refused with 400 naming the bound and where it was crossed (``BoundExceeded``, a
``BodyError``).
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["MAX_DEPTH", "MAX_STRING_BYTES", "check_bounds"]

MAX_DEPTH = 64
MAX_STRING_BYTES = 1024 * 1024


def check_bounds(doc: Any) -> str | None:
    """The first bound ``doc`` crosses, in words naming it and where (None: within every bound)."""
    if _within(doc):
        return None
    return _first_problem(doc)


def _within(doc: Any) -> bool:
    """True when ``doc`` is within every bound, by a walk that builds no paths (perf, issue 37: naming where each
    value sits took most of the check); False when it crosses one or holds a type the walk does not know (then
    ``_first_problem`` walks it again, naming the place). Level by level: values at ``depth`` are in ``level``."""
    level = [doc]
    depth = 0
    while level:
        below: list[Any] = []
        for value in level:
            kind = type(value)
            if kind is str:
                if len(value) > MAX_STRING_BYTES or (not value.isascii() and not _encodes(value)):
                    return False
            elif kind is dict:
                if depth >= MAX_DEPTH:
                    return False
                for key in value:
                    if type(key) is not str or len(key) > MAX_STRING_BYTES or (
                            not key.isascii() and not _encodes(key)):
                        return False
                below.extend(value.values())
            elif kind is list:
                if depth >= MAX_DEPTH:
                    return False
                below.extend(value)
            elif kind is float:
                if not math.isfinite(value):
                    return False
            elif kind is not int and kind is not bool and value is not None:
                return False
        level = below
        depth += 1
    return True


def _encodes(s: str) -> bool:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _first_problem(doc: Any) -> str | None:
    stack: list[tuple[Any, int, str]] = [(doc, 0, "")]
    while stack:
        value, depth, where = stack.pop()
        if isinstance(value, dict):
            if depth >= MAX_DEPTH:
                return _nesting(where)
            for k, v in value.items():
                problem = _string(k, f"a key of {where or 'the document'}")
                if problem:
                    return problem
                stack.append((v, depth + 1, f"{where}.{k}" if where else k))
        elif isinstance(value, list):
            if depth >= MAX_DEPTH:
                return _nesting(where)
            stack.extend((v, depth + 1, f"{where}[{i}]") for i, v in enumerate(value))
        elif isinstance(value, str):
            problem = _string(value, where or "the document")
            if problem:
                return problem
        elif isinstance(value, float) and not math.isfinite(value):
            return f"bound exceeded: numbers: {_short(where)} is {value} (not a finite number)"
    return None


def _nesting(where: str) -> str:
    return (f"bound exceeded: nesting: arrays and objects nest deeper than {MAX_DEPTH} levels (at "
            f"{_short(where) or 'the document'})")


def _string(s: str, where: str) -> str | None:
    if len(s) > MAX_STRING_BYTES:
        return f"bound exceeded: strings: {_short(where)} is longer than {MAX_STRING_BYTES} characters"
    if not s.isascii():
        try:
            s.encode("utf-8")
        except UnicodeEncodeError:
            return f"bound exceeded: strings: {_short(where)} holds a lone surrogate (not valid Unicode)"
    return None


def _short(where: str) -> str:
    """A path for a message: a deep one shows its start and its end."""
    return where if len(where) <= 120 else f"{where[:60]}...{where[-50:]}"
