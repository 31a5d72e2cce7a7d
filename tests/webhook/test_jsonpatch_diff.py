from __future__ import annotations

import copy
import json
from typing import Any

import jsonpatch
from hypothesis import given, settings
from hypothesis import strategies as st

from webhook.admission.jsonpatch_diff import diff, escape_pointer_token

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.text(alphabet="ab/~c.-0", max_size=6), children, max_size=4),
    max_leaves=20,
)


def _canon(v: Any) -> str:
    return json.dumps(v, sort_keys=True)


@settings(max_examples=150, deadline=None)
@given(json_values, json_values)
def test_diff_applied_with_jsonpatch_gives_the_target(a: Any, b: Any) -> None:
    ops = diff(a, b)
    result = jsonpatch.JsonPatch(ops).apply(copy.deepcopy(a))
    assert _canon(result) == _canon(b)


@settings(max_examples=60, deadline=None)
@given(json_values)
def test_equal_documents_give_an_empty_patch(a: Any) -> None:
    assert diff(a, copy.deepcopy(a)) == []


def test_annotation_keys_are_escaped() -> None:
    a = {"metadata": {"annotations": {"x": "1"}}}
    b = {"metadata": {"annotations": {"x": "1", "numapin.io/cpu-intent": "{}", "a~b/c": "v"}}}
    ops = diff(a, b)
    assert {"op": "add", "path": "/metadata/annotations/numapin.io~1cpu-intent", "value": "{}"} in ops
    assert {"op": "add", "path": "/metadata/annotations/a~0b~1c", "value": "v"} in ops
    assert jsonpatch.JsonPatch(ops).apply(a) == b


def test_json_types_are_distinguished() -> None:
    assert diff({"a": 1}, {"a": True}) == [{"op": "replace", "path": "/a", "value": True}]
    assert diff([1], [1.0]) == [{"op": "replace", "path": "/0", "value": 1.0}]


def test_escape_order() -> None:
    # "~1" in a key must become "~01", not "/"-escaped twice
    assert escape_pointer_token("~1") == "~01"
    assert escape_pointer_token("a/b") == "a~1b"
