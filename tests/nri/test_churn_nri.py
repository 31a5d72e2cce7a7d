"""The seeded kubelet-like churn through the NRI door (numapin_lab.cri.churn_nri) in its CI form: a short run on
containerd 2.1 (NRI on) with ``numapin nri`` as a child process, the plugin SIGKILLed mid-create and mid-resize
and kubelet creating pods while it is down, containerd SIGKILLed and restarted, cpusets written behind
everybody's back; every invariant judged from the kernel. Containers created while the plugin was down are the
one excused category (reported apart, bounded: converged within 2 s of the plugin's Synchronize).
The long form: ``python benchmarks/churn.py --door nri --ops 2000 --seed N``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from numapin_lab.cri.churn import ChurnConfig
from numapin_lab.cri.churn_nri import run_nri_churn
from numapin_lab.cri.containerd import ContainerdLab
from tests.criproxy import test_churn

pytestmark = pytest.mark.containerd

work = test_churn.work  # a scratch directory per test (the proxy churn's fixture)

SEED = 20261161
OPS = 30


@pytest.mark.parametrize("nri_lab", ["2.x"], indirect=True, ids=["containerd2.x"])
async def test_seeded_churn_through_nri_keeps_every_invariant_in_the_kernel(work: Path,
                                                                           nri_lab: ContainerdLab) -> None:
    report = await run_nri_churn(ChurnConfig(seed=SEED, ops=OPS, reserved_cpus="0"), nri_lab, work / "plugin")
    doc = report.to_json()
    print(json.dumps(doc, indent=1))
    assert doc["violations"] == [], json.dumps(doc["violations"], indent=1)
    assert doc["podsCreated"] >= 5 and doc["containersStarted"] >= 5
    assert doc["proxyKills"] >= 1 and doc["samples"] >= 20  # the plugin SIGKILLed at least once
    assert sum(doc["resizes"].values()) >= 1
    # the window NRI leaves was exercised and measured: pods created while the plugin was down, every one of them
    # converged from the kernel within the bound after the plugin's Synchronize
    down = doc["unpinnedWhilePluginDown"]
    assert doc["createdWhilePluginDown"] >= 1, down
    assert all(w["convergedAfterSyncSeconds"] is not None for w in down["windows"]), down
    assert sum(doc["operations"].values()) == OPS
