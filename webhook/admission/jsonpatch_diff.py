"""RFC 6902 JSON Patch computed as the difference of two JSON documents.

``diff(original, mutated)`` returns the operations that turn ``original`` into ``mutated``: ``add`` for new
object members, ``remove`` for dropped ones, ``replace`` where a value changed its type or scalar value, and a
recursion into objects and arrays present on both sides. Arrays are compared element by element over the common
length, then elements are appended or removed from the end (highest index first). Values are compared with
their JSON types (``true`` is not ``1``, ``1`` is not ``1.0``). Object keys are escaped as RFC 6901 JSON
pointers (``~`` -> ``~0``, ``/`` -> ``~1``), which annotation keys such as ``numapin.io/cpu-intent`` need.
"""

from __future__ import annotations

import copy
from typing import Any

__all__ = ["diff", "escape_pointer_token", "pointer"]


def escape_pointer_token(token: str | int) -> str:
    """One reference token of a JSON pointer (RFC 6901 section 3)."""
    return str(token).replace("~", "~0").replace("/", "~1")


def pointer(path: tuple[str | int, ...]) -> str:
    return "".join("/" + escape_pointer_token(t) for t in path)


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "str"
    if isinstance(value, dict):
        return "object"
    if isinstance(value, list):
        return "array"
    raise TypeError(f"not a JSON value: {type(value).__name__}")


def _same(a: Any, b: Any) -> bool:
    """Deep equality with JSON types (``True != 1``)."""
    ka, kb = _kind(a), _kind(b)
    if ka != kb:
        return False
    if ka == "object":
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if ka == "array":
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def diff(original: Any, mutated: Any) -> list[dict[str, Any]]:
    """The JSON Patch operations that turn ``original`` into ``mutated`` (an empty list when they are equal)."""
    ops: list[dict[str, Any]] = []
    _diff(original, mutated, (), ops)
    return ops


def _diff(a: Any, b: Any, path: tuple[str | int, ...], ops: list[dict[str, Any]]) -> None:
    if a is b:  # shared subtree (a mutation copies only what it changes)
        return
    ka, kb = _kind(a), _kind(b)
    if ka != kb:
        ops.append({"op": "replace", "path": pointer(path), "value": copy.deepcopy(b)})
        return
    if ka == "object":
        for key in a:
            if key not in b:
                ops.append({"op": "remove", "path": pointer((*path, key))})
        for key, value in b.items():
            if key in a:
                _diff(a[key], value, (*path, key), ops)
            else:
                ops.append({"op": "add", "path": pointer((*path, key)), "value": copy.deepcopy(value)})
        return
    if ka == "array":
        common = min(len(a), len(b))
        for i in range(common):
            _diff(a[i], b[i], (*path, i), ops)
        for i in range(common, len(b)):
            ops.append({"op": "add", "path": pointer((*path, i)), "value": copy.deepcopy(b[i])})
        for i in range(len(a) - 1, common - 1, -1):
            ops.append({"op": "remove", "path": pointer((*path, i))})
        return
    if not _same(a, b):
        ops.append({"op": "replace", "path": pointer(path), "value": b})
