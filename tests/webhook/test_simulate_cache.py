"""Issue 37: the event loop reads the simulator's cached answers even while a simulation in a worker thread holds
the simulator's lock (before, it then sent the request to a thread of its own), and the answer is the one cached
for that node state: a node whose free CPUs changed is not answered from another state's entry."""

from __future__ import annotations

from allocator.nrt import parse_nrt
from allocator.pod import PodInfo
from tests.webhook.nrt_fixtures import machine, nrt
from webhook.admission.simulate import Simulator


def _pod(cpus: int) -> PodInfo:
    res = {"cpu": str(cpus), "memory": "1Gi"}
    return PodInfo.from_pod({"metadata": {"name": "p", "namespace": "d", "uid": "u"},
                             "spec": {"containers": [{"name": "c", "resources": {"requests": res, "limits": res}}]}})


def test_cached_answers_are_read_while_a_simulation_holds_the_lock() -> None:
    topo = machine(2, 4)
    free = parse_nrt(nrt("n1", topo))
    busy = parse_nrt(nrt("n1", topo, busy="1-5,9-13"))  # no NUMA node has 6 free CPUs left
    sim = Simulator()
    pod = _pod(6)
    assert sim.admit(free, pod, occupied=True).admitted
    with sim._lock:  # a simulation of another node runs in a worker thread
        answer = sim.cached(free, pod, occupied=True)
        assert answer is not None and answer.admitted
        assert sim.cached(busy, pod, occupied=True) is None  # another state: never answered from the free one
    assert not sim.admit(busy, pod, occupied=True).admitted
    with sim._lock:
        answer = sim.cached(busy, pod, occupied=True)
        assert answer is not None and not answer.admitted
