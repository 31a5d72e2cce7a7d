"""The seeded kubelet-like churn (numapin_lab.cri.churn) in its CI form: a fixed number of operations against a
real containerd and ``numapin criproxy`` as a child process, with proxy kills (often mid-narrowing),
containerd restarts and cpusets written behind the proxy's back; every invariant judged from the kernel.
The long form: ``python benchmarks/churn.py --ops 2000 --seed N``."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from numapin_lab.cri.churn import ChurnConfig, run_churn
from numapin_lab.cri.containerd import ContainerdLab
from numapin_lab.cri.ledger import scratch_dir

# 1.6 (the host's) and 2.x (the 2026 node's); 1.7's behaviour under kill -9 and restarts is the e2e stories' matrix
pytestmark = [pytest.mark.containerd, pytest.mark.containerd_matrix("1.6", "2.x")]

SEED = 20261123
OPS = 60


@pytest.fixture
def work() -> Iterator[Path]:
    d = scratch_dir("npx-churn-")
    yield d
    shutil.rmtree(d, ignore_errors=True)


async def test_seeded_churn_keeps_every_invariant_in_the_kernel(work: Path, containerd_bin: Path | None) -> None:
    lab = ContainerdLab(work / "ctrd", containerd_bin)
    lab.start()
    try:
        report = await run_churn(ChurnConfig(seed=SEED, ops=OPS, reserved_cpus="0"), lab, work / "proxy")
    finally:
        lab.stop()
    doc = report.to_json()
    print(json.dumps(doc, indent=1))
    assert doc["violations"] == [], json.dumps(doc["violations"], indent=1)
    # the run did what it is for: pods came and went, containers were restarted, faults happened
    assert doc["podsCreated"] >= 10 and doc["containersStarted"] >= 10
    assert doc["tenantPods"] >= 1  # pods that asked to bypass numapin or forged what it reads (issue 25)
    assert doc["proxyKills"] >= 1 and doc["samples"] >= 50
    assert sum(doc["resizes"].values()) >= 1  # kubelet's in-place resizes, some with a kill of the proxy in them
    assert sum(doc["operations"].values()) == OPS
