"""Issue 37: the webhook reads a pod's containers once per distinct container spec (webhook/admission/pod_model.py).
The memo must give what ``PodInfo.from_pod`` gives, for every pod, and raise what it raises; specs the memo's key
could not carry faithfully are read directly."""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import pytest

from allocator.errors import PodSpecError
from allocator.pod import PodInfo
from tests.webhook.helpers import container, make_pod
from webhook.admission import pod_model
from webhook.admission.pod_model import pod_info


def _outcome(read: Any, pod: Mapping[str, Any]) -> PodInfo | str:
    try:
        return read(pod)  # type: ignore[no-any-return]
    except PodSpecError as e:
        return f"PodSpecError: {e}"


def _pods() -> list[Any]:
    base = make_pod("p", [container("app", cpu="2", mem="1Gi")], init=[container("init", cpu="500m", mem="64Mi")])
    pods: list[Any] = [base]
    odd_values = ["3", 2, 1.5, "1e3", "250m", "0.5", "-1", "abc", None, float("inf"), float("nan"), 10 ** 30, True,
                  [], {}, "", "2Gi", "\ud800", "1" * 70]
    for value in odd_values:
        for res in ("cpu", "memory", "hugepages-2Mi"):
            for kind in ("limits", "requests"):
                pod = copy.deepcopy(base)
                pod["spec"]["containers"][0]["resources"][kind][res] = value
                pods.append(pod)
    for field, value in (("containers", None), ("containers", "x"), ("containers", []), ("initContainers", {}),
                         ("containers", [None]), ("containers", [{"name": ""}]), ("containers", [{"name": "a"}] * 2),
                         ("containers", [{"name": "a", "resources": []}]),
                         ("containers", [{"name": "a", "resources": {"limits": "x"}}]),
                         ("initContainers", [{"name": "s", "restartPolicy": "Never"}])):
        pod = copy.deepcopy(base)
        pod["spec"][field] = value
        pods.append(pod)
    pods.append({**base, "spec": MappingProxyType(base["spec"])})
    proxy = copy.deepcopy(base)
    proxy["spec"]["containers"][0] = MappingProxyType(proxy["spec"]["containers"][0])
    pods.append(proxy)
    sidecar = copy.deepcopy(base)
    sidecar["spec"]["initContainers"][0]["restartPolicy"] = "Always"
    pods.append(sidecar)
    renamed = copy.deepcopy(base)  # the same resources under another name: another entry, never the first one's
    renamed["spec"]["containers"][0]["name"] = "other"
    pods.append(renamed)
    return pods


@pytest.mark.parametrize("round_", [1, 2])  # the second round reads from the memo
def test_the_memo_gives_what_the_pod_model_gives(round_: int) -> None:
    for pod in _pods():
        assert _outcome(pod_info, pod) == _outcome(PodInfo.from_pod, pod), json.dumps(pod, default=repr)[:300]


def test_a_repeated_spec_is_read_once_and_errors_are_never_remembered() -> None:
    pod = make_pod("p", [container("memo-once", cpu="3", mem="3Gi")])
    before = pod_model._read_text.cache_info()
    first, again = pod_info(pod), pod_info(copy.deepcopy(pod))
    after = pod_model._read_text.cache_info()
    assert (after.misses - before.misses, after.hits - before.hits) == (1, 1)
    assert first.containers is again.containers and first == again
    bad = make_pod("p", [container("memo-bad", cpu="x", mem="1Gi")])
    messages = {_outcome(pod_info, bad) for _ in range(2)}
    assert messages == {_outcome(PodInfo.from_pod, bad)} and str(messages.pop()).startswith("PodSpecError")


def test_random_specs_agree() -> None:
    rnd = random.Random(37)
    quantities = ["1", "2", "500m", "1.5", "64Mi", "1Gi", "0", "x", None, 3, 0.25]
    for _ in range(300):
        items = [{"name": rnd.choice(["a", "b", "c", "nullish"]),
                  "resources": {kind: {res: rnd.choice(quantities) for res in ("cpu", "memory") if rnd.random() < 0.8}
                                for kind in ("limits", "requests") if rnd.random() < 0.9}}
                 for _ in range(rnd.randint(0, 3))]
        pod = make_pod("p", items or [container("a", cpu="1", mem="1Gi")])
        if rnd.random() < 0.3:
            pod["spec"]["initContainers"] = [{"name": "i", "restartPolicy": rnd.choice([None, "Always"])}]
        assert _outcome(pod_info, pod) == _outcome(PodInfo.from_pod, pod)
