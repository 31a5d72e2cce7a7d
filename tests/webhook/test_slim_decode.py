"""The one-pass slim review (``slim_decode``, perf issue 37) gives what the general path gives, or stands aside.

For every body, ``parse_slim`` (the one-pass path first) answers as ``parse_slim_general`` (decode, ``slim_review``,
bounds): the same document, or the same refusal and reason. Bodies: fuzzed pods (well formed and malformed) and
Bindings in reviews carrying what real ones carry besides, the same with random bytes changed, and the shapes the
one-pass path must leave to the general one (a key ``slim`` keeps that the schema does not name, a value of another
type, bytes that are not ASCII, a surrogate escape, over-deep nesting, a non-finite number). The realistic reviews of
the benchmark must take the one-pass path, so a schema that stopped matching them fails here too.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks.webhook import binding_review, pod_review, realistic_pod
from tests.webhook.helpers import binding_request, review
from tests.webhook.test_fuzz import json_values, pods
from tests.webhook.test_slim import _bulk, wellformed_pods
from webhook.https.request_body import BodyError, parse_slim, parse_slim_general
from webhook.https.slim_decode import decode_slim

SETTINGS = settings(max_examples=200, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])


def _outcome(parse: Any, raw: bytes) -> tuple[str, Any]:
    try:
        return "doc", parse(raw)
    except BodyError as e:
        return "refused", str(e)


def _same(raw: bytes) -> None:
    got, want = _outcome(parse_slim, raw), _outcome(parse_slim_general, raw)
    assert got == want, (raw[:300], got, want)
    fast = decode_slim(raw)
    if fast is not None:
        assert want == ("doc", fast)


def _pod_review(pod: Any, old: Any, operation: str) -> dict[str, Any]:
    return review({"uid": "u-1", "kind": {"group": "", "version": "v1", "kind": "Pod"},
                   "resource": {"group": "", "version": "v1", "resource": "pods"}, "namespace": "default",
                   "name": "p", "operation": operation, "object": _bulk(pod),
                   "oldObject": _bulk(old) if operation == "UPDATE" else None, "dryRun": False,
                   "userInfo": {"username": "system:serviceaccount:kube-system:replicaset-controller",
                                "groups": ["system:serviceaccounts", "system:authenticated"]},
                   "options": {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"}})


@SETTINGS
@given(pod=wellformed_pods() | pods, old=wellformed_pods() | pods, operation=st.sampled_from(["CREATE", "UPDATE"]),
       flips=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), max_size=2),
       ascii_only=st.booleans())
def test_pod_reviews_read_as_the_general_path_reads_them(pod: Any, old: Any, operation: str,
                                                         flips: list[tuple[int, int]], ascii_only: bool) -> None:
    raw = bytearray(json.dumps(_pod_review(pod, old, operation), ensure_ascii=ascii_only).encode(
        "utf-8", "surrogatepass"))
    _same(bytes(raw))
    for at, byte in flips:
        raw[at % len(raw)] = byte
    _same(bytes(raw))


@SETTINGS
@given(name=st.sampled_from(["b1", "b2"]), node=st.sampled_from(["w-0", "nope"]),
       extra=st.dictionaries(st.sampled_from(["uid", "labels", "junk", "annotations"]), json_values, max_size=2),
       target=st.none() | json_values)
def test_binding_reviews_read_as_the_general_path_reads_them(name: str, node: str, extra: dict[str, Any],
                                                             target: Any) -> None:
    full = review(binding_request("default", name, node))
    full["request"]["object"]["metadata"].update(extra)
    if target is not None:
        full["request"]["object"]["target"] = target
    full["request"]["userInfo"] = {"username": "system:kube-scheduler", "groups": ["system:authenticated"]}
    _same(json.dumps(full).encode())


def _realistic() -> dict[str, Any]:
    return json.loads(pod_review(realistic_pod("checkout-7d9f-abcde"), with_uid=True))


def _altered() -> list[dict[str, Any]]:
    """Realistic reviews altered where the one-pass path must stand aside (or must still agree)."""
    out = []

    def alter(change: Any) -> None:
        doc = _realistic()
        change(doc)
        out.append(doc)

    req = "request"
    alter(lambda d: d[req].__setitem__("futureField", {"a": [1, 2]}))                 # a key slim keeps
    alter(lambda d: d.__setitem__("response", None))                                   # at the top too
    alter(lambda d: d[req].__setitem__("uid", 7))                                      # another type
    alter(lambda d: d[req]["object"]["spec"]["containers"][0]["resources"]["limits"].__setitem__("cpu", 1.5))
    alter(lambda d: d[req]["object"]["spec"]["containers"][0]["resources"]["limits"].__setitem__("cpu", True))
    alter(lambda d: d[req]["object"]["spec"]["containers"][0]["resources"]["limits"].__setitem__("cpu", 10**30))
    alter(lambda d: d[req]["object"]["spec"].__setitem__("containers", {"not": "a list"}))
    alter(lambda d: d[req]["object"]["metadata"]["annotations"].__setitem__("a", {"nested": 1}))
    alter(lambda d: d[req]["object"]["metadata"].__setitem__("labels", None))
    alter(lambda d: d[req]["object"].__setitem__("spec", None))
    alter(lambda d: d[req].__setitem__("object", None))
    alter(lambda d: d[req].__setitem__("userInfo", {"deep": [[[[[[[[["x"]]]]]]]]], "n": 1e300}))
    alter(lambda d: d[req]["object"]["spec"]["containers"][0].__setitem__("env", [{"value": "\u00e9\u2028"}]))
    alter(lambda d: d[req]["object"]["metadata"]["annotations"].__setitem__("x", "\u00e9 <&>"))
    alter(lambda d: d[req]["object"]["metadata"].__setitem__("name", "\ud800"))            # a lone surrogate
    alter(lambda d: d[req]["object"]["metadata"]["annotations"].__setitem__("x", "\U0001f600"))  # a surrogate pair
    alter(lambda d: d[req]["object"]["metadata"]["annotations"].__setitem__("x", "y" * (1024 * 1024 + 1)))
    alter(lambda d: d[req]["object"]["spec"].__setitem__("resources", {"limits": {"cpu": "2"}, "claims": [{}]}))
    alter(lambda d: d[req]["object"]["spec"].__setitem__("nodeSelector", {"a": ["b"] * 2}))
    deep: Any = "x"
    for _ in range(70):  # past json_bounds.MAX_DEPTH
        deep = [deep]
    alter(lambda d: d[req]["object"].__setitem__("status", {"qosClass": deep}))
    return out


@pytest.mark.parametrize("doc", _altered(), ids=lambda d: "")
def test_altered_reviews_read_as_the_general_path_reads_them(doc: dict[str, Any]) -> None:
    _same(json.dumps(doc, ensure_ascii=False).encode("utf-8", "surrogatepass"))
    _same(json.dumps(doc).encode())


@pytest.mark.parametrize("raw", [
    b'{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u","object":{"metadata":'
    b'{"name":"\\ud800"}}}}',
    b'{"request":{"uid":"u","userInfo":{"username":"\xff"}}}',                  # not UTF-8 where slim drops it
    b'{"request":{"uid":"u","userInfo":{"username":"\\x"}}}',                   # not JSON where slim drops it
    b'{"request":{"uid":"u","object":{"spec":{"containers":[{"name":"a","name":"b"}]}}}}',   # a repeated key
    b'{"request":{"uid":"u","uid":"v"}}',
    b'{"request":{"object":{"spec":{"containers":[{"resources":{"limits":{"cpu":1e400}}}]}}}}',
    b'[1]', b'"x"', b'{"request":[]}', b'{}', b'', b'{"request":{"uid":"u"}} x',
])
def test_edge_bodies_read_as_the_general_path_reads_them(raw: bytes) -> None:
    _same(raw)


def test_the_usual_reviews_take_the_one_pass_path() -> None:
    """The benchmark's pod CREATE (as sent, and as stored after /mutate) and a Binding: one pass, the same document."""
    pod = realistic_pod("checkout-7d9f-abcde")
    stored = copy.deepcopy(pod)
    stored["metadata"]["annotations"]["numapin.io/cpu-intent"] = '{"v":1}'
    for raw in (pod_review(pod, with_uid=False), pod_review(stored, with_uid=True),
                binding_review("checkout-7d9f-abcde", "node-0001")):
        fast = decode_slim(raw)
        assert fast is not None
        assert fast == parse_slim_general(raw)
        assert "userInfo" not in fast["request"]
        assert "env" not in fast["request"]["object"].get("spec", {}).get("containers", [{}])[0]


@pytest.mark.parametrize("escape", [b"\\ud800", b"\\uDC00", b"a\\udfff", b"\\ud83d\\u0041"])
def test_a_lone_surrogate_is_left_to_the_general_path(escape: bytes) -> None:
    """msgspec refuses a lone surrogate escape wherever it stands; the general path reads it and answers 400 naming
    the bound (a pair, a valid character, takes the one-pass path)."""
    raw = (b'{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u","object":{"metadata":'
           b'{"name":"' + escape + b'"}}}}')
    assert decode_slim(raw) is None
    _same(raw)
    assert decode_slim(raw.replace(escape, b"\\ud83d\\ude00")) is not None
