"""``pods``: the stories' handle on one of the session's real nodes (tests/kubelet_node.py): ``kubelet_node``
(numapin criproxy) unless parametrized ``indirect`` with ``"nri"`` (``kubelet_nri_node``, numapin nri). It deletes
at the story's end the pods it made, so that a failed story leaves the nodes' CPUs to the next one."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from numapin_lab.k8s.lab_node import LabNode
from tests.k8s.kube_pods import Pods


@pytest.fixture
def pods(request: pytest.FixtureRequest) -> Iterator[Pods]:
    door = getattr(request, "param", "proxy")
    node: LabNode = request.getfixturevalue({"proxy": "kubelet_node", "nri": "kubelet_nri_node"}[door])
    handle = Pods(node)
    try:
        yield handle
    finally:
        handle.delete_all()
