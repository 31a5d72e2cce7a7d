"""The proxy's reliability churn (numapin_lab.cri.churn) once on a real multi-NUMA kernel, where exclusive CPUs
are plentiful: a seeded kubelet-like mix of pods (exclusive ones among them) against this boot's containerd
and a ``numapin criproxy`` child process of its own, with the proxy SIGKILLed while exclusive containers are
being admitted, containerd SIGKILLed and restarted, cpusets written behind the proxy's back; every invariant
judged from ``/proc/<pid>/status`` and the cgroup files of the guest kernel.

The operation count is bounded for emulation (a pod takes seconds under TCG, a proxy start 10-20 s) and the
seed is one whose schedule (fixed by the seed alone) is: burst, burst, drift, a proxy kill during a create, a proxy
kill during an exclusive CreateContainer, a containerd restart (then every pod removed and one pod asking for every
allocatable CPU placed): the faults of the 10-operation schedule it replaced (create, create, drift, burst, burst,
sync, create, two kills, a restart) in 6 operations, for the suite's time budget. The churn runs without resizes
(``ChurnConfig.resizes``): they joined the operation kinds later and would change every seed's schedule; resizes
and kills mid-resize are the host churn's (tests/criproxy/test_churn.py) and, in this boot, the resize stories'
(test_resize.py).
Deadlines and the repair bound are scaled by
``TIME_SCALE`` (the kernel is the same; only the emulated CPU is slower). The report is written to the boot's
shared directory as ``churn.json`` (its operations and faults, timed, as ``churn-trace.txt``)."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

from allocator.topology import Topology
from numapin_lab.cri.churn import ChurnConfig, run_churn
from tests.numa.guest.node import WORK, GuestNode
from tests.numa.shapes import SHARED_ENV

SEED = 21086706
OPS = 6
TIME_SCALE = 4.0       # a call's deadline becomes 2 min (30 s x 4: kubelet's own runtime request timeout)
MONITOR_PERIOD = 1.0   # the monitor's own reads cost CPU the emulated machine has little of


def test_churn_keeps_every_invariant_on_a_multi_numa_kernel(guest_node: GuestNode, machine: Topology) -> None:
    node = guest_node
    node.release()  # one proxy per containerd: the churn starts its own
    cfg = ChurnConfig(seed=SEED, ops=OPS, reserved_cpus="0", monitor_period=MONITOR_PERIOD, time_scale=TIME_SCALE,
                      warm_proxy=True, resizes=False)
    report = asyncio.run(run_churn(cfg, node.lab, WORK / "churn"))
    doc = report.to_json()
    shared = os.environ.get(SHARED_ENV)
    if shared:
        (Path(shared) / "churn.json").write_text(json.dumps(doc, indent=1) + "\n")
        (Path(shared) / "churn-trace.txt").write_text("\n".join(report.trace) + "\n")
    print(json.dumps(doc, indent=1))
    assert doc["violations"] == [], json.dumps(doc["violations"], indent=1)
    assert sum(doc["operations"].values()) == OPS
    # the run did what it is for on this machine: exclusive containers admitted and seen by the kernel on
    # several NUMA nodes, the proxy killed while admitting one, containerd restarted, pods restarted
    assert doc["exclusiveAdmissions"] >= 3, doc
    assert len(doc["exclusiveNUMANodes"]) >= 2, doc
    assert doc["killsWhileAdmittingExclusive"] >= 1 and doc["proxyKills"] >= 2, doc
    assert doc["containerdRestarts"] == 1, doc
    assert doc["podsCreated"] >= 6 and doc["samples"] >= 20, doc
