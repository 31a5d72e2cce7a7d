"""The intent annotation carries a container's huge pages (allocator.intent), and only when it asks some."""

from __future__ import annotations

import json

import pytest

from allocator.errors import PodSpecError
from allocator.intent import decode_intent, encode_intent
from allocator.pod import PodInfo

POD = {"metadata": {"uid": "u", "namespace": "ns", "name": "p"}, "spec": {"containers": [
    {"name": "app", "resources": {"limits": {"cpu": "2", "memory": "1Gi", "hugepages-2Mi": "64Mi"}}},
    {"name": "plain", "resources": {"limits": {"cpu": "1", "memory": "1Gi"}}}]}}


def test_huge_pages_round_trip_through_the_annotation():
    info = PodInfo.from_pod(POD)
    assert info.container("app").hugepages == (("hugepages-2Mi", 64 << 20),)
    text = encode_intent(info)
    doc = json.loads(text)
    assert doc["containers"][0]["hugepages"] == {"hugepages-2Mi": 64 << 20}
    assert "hugepages" not in doc["containers"][1]  # texts of pods without huge pages are as before
    assert decode_intent(text, uid="u", namespace="ns", name="p") == info


@pytest.mark.parametrize("pages", [{"memory": 1}, {"hugepages-2Mi": -1}, {"hugepages-2Mi": "1Gi"}, ["x"]])
def test_bad_huge_pages_in_the_annotation(pages):
    doc = {"v": 1, "qosClass": "Guaranteed", "cpuManager": None, "containers": [
        {"name": "a", "role": "app", "cpu": [1000, 1000], "memory": [1, 1], "hugepages": pages}]}
    with pytest.raises(PodSpecError, match="hugepages"):
        decode_intent(json.dumps(doc), uid="u", namespace="ns", name="p")
