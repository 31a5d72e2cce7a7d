"""``pods``: the stories' handle on the session's real node (tests/kubelet_node.py), which deletes at the story's
end the pods it made, so that a failed story leaves the shared node's CPUs to the next one."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from numapin_lab.k8s.lab_node import LabNode
from tests.k8s.kube_pods import Pods


@pytest.fixture
def pods(kubelet_node: LabNode) -> Iterator[Pods]:
    handle = Pods(kubelet_node)
    try:
        yield handle
    finally:
        handle.delete_all()
