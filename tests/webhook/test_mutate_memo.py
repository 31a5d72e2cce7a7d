"""/mutate's memo of patches (``mutate.mutation``, perf issue 37) answers what working the patch out answers.

For fuzzed pods (well formed and malformed) and both settings of the pod-level gate: the warnings and patch from
the memo, asked twice, are those of ``mutate_pod`` and ``diff`` on the pod itself; a pod that differs from a
remembered one in any field the mutation reads gets its own answer; pods that cannot be a key (a non-finite number,
a lone surrogate) are worked out directly.
"""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from allocator.pod import CPU_MANAGER_ANNOTATION
from tests.webhook.helpers import container, make_pod
from tests.webhook.test_fuzz import pods
from tests.webhook.test_slim import wellformed_pods
from webhook.admission.jsonpatch_diff import diff
from webhook.admission.mutate import _mutation_of_text, mutate_pod, mutation


def _worked_out(pod: Any, gate: bool) -> tuple[tuple[str, ...], tuple[Any, ...]]:
    mutated, warnings = mutate_pod(copy.deepcopy(pod), pod_level_managers=gate)
    return tuple(warnings), tuple(diff(pod, mutated))


@settings(max_examples=150, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(pod=wellformed_pods() | pods, gate=st.booleans())
def test_the_memo_answers_as_the_mutation_itself(pod: Any, gate: bool) -> None:
    want = _worked_out(pod, gate)
    assert mutation(pod, pod_level_managers=gate) == want
    assert mutation(copy.deepcopy(pod), pod_level_managers=gate) == want  # from the memo when it could be a key


def test_a_pod_differing_in_what_the_mutation_reads_gets_its_own_answer() -> None:
    pod = make_pod("web", [container("app", "2", "2Gi")], annotations={CPU_MANAGER_ANNOTATION: "Exclusive"})
    first = mutation(pod)
    hits = _mutation_of_text.cache_info().hits
    assert mutation(copy.deepcopy(pod)) == first
    assert _mutation_of_text.cache_info().hits == hits + 1  # a repeated pod is answered from the memo
    variants = []
    for change in (lambda p: p["spec"]["containers"][0]["resources"]["limits"].__setitem__("cpu", "3"),
                   lambda p: p["metadata"]["annotations"].__setitem__(CPU_MANAGER_ANNOTATION, "share"),
                   lambda p: p["metadata"]["annotations"].pop(CPU_MANAGER_ANNOTATION),
                   lambda p: p["spec"].__setitem__("resources", {"limits": {"cpu": "4", "memory": "4Gi"}})):
        other = copy.deepcopy(pod)
        change(other)
        got = mutation(other)
        assert got == _worked_out(other, False)
        variants.append(got)
    assert all(v != first for v in variants)
    assert mutation(pod, pod_level_managers=True) == _worked_out(pod, True)


def test_pods_that_cannot_be_a_key_are_worked_out_directly() -> None:
    for odd in (float("inf"), "\ud800"):
        pod = make_pod("web", [container("app", "2", "2Gi")], annotations={"x": odd})
        misses = _mutation_of_text.cache_info().misses
        assert mutation(pod) == _worked_out(pod, False)
        assert _mutation_of_text.cache_info().misses == misses
