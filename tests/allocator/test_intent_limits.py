"""The intent annotation is untrusted input: bounded length and nesting, checked without recursion, and every bad
text is a PodSpecError (issue 15: 1,250 nested '[' raised RecursionError and the pod was allowed unchecked)."""

from __future__ import annotations

import contextlib
import json
import random

import pytest

from allocator.errors import PodSpecError
from allocator.intent import MAX_INTENT_CHARS, MAX_INTENT_DEPTH, decode_intent, encode_intent, json_depth_exceeds
from allocator.pod import ContainerInfo, PodInfo


def _decode(text: str) -> PodInfo:
    return decode_intent(text, uid="u", namespace="ns", name="p")


@pytest.mark.parametrize("text", ["[" * 1250, "[" * 1250 + "]" * 1250, '{"v":' * 5000 + "1" + "}" * 5000,
                                  '{"v":1,"containers":[[[[[1]]]]]}'])
def test_deep_nesting_is_refused(text: str) -> None:
    with pytest.raises(PodSpecError, match=f"nested at most {MAX_INTENT_DEPTH} levels"):
        _decode(text)


def test_long_text_is_refused() -> None:
    with pytest.raises(PodSpecError, match=f"at most {MAX_INTENT_CHARS}"):
        _decode(" " * (MAX_INTENT_CHARS + 1))


def test_a_large_real_intent_still_reads() -> None:
    pod = PodInfo(uid="u", namespace="ns", name="p", qos_class="Guaranteed", cpu_manager="exclusive", bypass=False,
                  containers=tuple(ContainerInfo(name=f"c{i}", cpu_request_milli=1000, cpu_limit_milli=1000,
                                                 memory_request=2**30, memory_limit=2**30) for i in range(300)))
    text = encode_intent(pod)
    assert len(text) < MAX_INTENT_CHARS
    assert _decode(text).containers == pod.containers


@pytest.mark.parametrize(("text", "deeper"), [
    ("1", False), ("[]", False), ('[[[["x"]]]]', False), ('[[[[["x"]]]]]', True),
    ('["[[[[[[", {"a": "}}}}"}]', False), ('["\\"[[[[[["]', False), ('["\\\\", [[[[1]]]]]', True),
    ('{"a": [{"b": [1, 2]}]}', False), ('{"a": [{"b": [1, {"c": 2}]}]}', True),
    ('{"a": [{"b": [1, {"c": []}]}]}', True),
])
def test_depth_check_reads_strings_and_escapes_as_json_does(text: str, deeper: bool) -> None:
    assert json_depth_exceeds(text, 4) is deeper


def test_depth_check_agrees_with_the_parser_on_random_documents() -> None:
    rng = random.Random(15)

    def doc(depth: int) -> object:
        kind = rng.random()
        if depth == 0 or kind < 0.3:
            return rng.choice([1, None, "x", '"[{', "\\", "a\\\"]"])
        if kind < 0.65:
            return [doc(depth - 1) for _ in range(rng.randint(0, 3))]
        return {rng.choice(["k", "[", '"{']): doc(depth - 1) for _ in range(rng.randint(0, 3))}

    def depth(v: object) -> int:
        if isinstance(v, list):
            return 1 + max((depth(x) for x in v), default=0)
        if isinstance(v, dict):
            return 1 + max((depth(x) for x in v.values()), default=0)
        return 0

    for _ in range(2000):
        d = doc(7)
        assert json_depth_exceeds(json.dumps(d), 4) is (depth(d) > 4), d


@pytest.mark.parametrize("seed", range(5))
def test_random_bytes_only_raise_pod_spec_errors(seed: int) -> None:
    rng = random.Random(seed)
    alphabet = '[]{}",:\\0123456789.-eEtrufalsn "vcontainers'
    for _ in range(500):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 60)))
        with contextlib.suppress(PodSpecError):  # anything else fails the test
            _decode(text)


def test_an_intent_too_long_to_read_back_is_never_written() -> None:
    pod = PodInfo(uid="u", namespace="ns", name="p", qos_class="BestEffort", cpu_manager=None, bypass=False,
                  containers=tuple(ContainerInfo(name=f"container-{i:05d}") for i in range(2000)))
    with pytest.raises(PodSpecError, match="2000 containers"):
        encode_intent(pod)


@pytest.mark.parametrize("name", ["app", "a\x7fb", "tab\there", "quote\"back\\slash", "é", "\u2028", "<&>", "\x01"])
def test_the_intent_text_is_the_standard_librarys(name: str) -> None:
    """Issue 37: the intent is written by msgspec when that gives the standard library's text (sorted keys, compact,
    non-ASCII and DEL escaped): the text the proxy reads back and /validate compares must not change."""
    containers = (ContainerInfo(name=name, role="init", cpu_request_milli=500, cpu_limit_milli=None,
                                memory_request=1 << 30, memory_limit=1 << 30,
                                hugepages=(("hugepages-1Gi", 1 << 30), ("hugepages-2Mi", 4 << 20))),
                  ContainerInfo(name="z" + name, cpu_request_milli=2000, cpu_limit_milli=2000))
    for level in (False, True):
        pod = PodInfo(uid="u", namespace="ns", name="p", qos_class="Burstable", cpu_manager="share", bypass=False,
                      containers=containers, pod_level_resources=level)
        text = encode_intent(pod)
        doc = json.loads(text)
        assert text == json.dumps(doc, separators=(",", ":"), sort_keys=True)
        assert _decode(text).containers == containers
