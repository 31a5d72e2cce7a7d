"""Issue 37: the event loop reads the simulator's cached answers even while a simulation in a worker thread holds
the simulator's lock (before, it then sent the request to a thread of its own), and the answer is the one cached
for that node state: a node whose free CPUs changed is not answered from another state's entry."""

from __future__ import annotations

from dataclasses import replace

from allocator.nrt import parse_nrt
from allocator.pod import PodInfo
from tests.webhook.nrt_fixtures import machine, nrt
from webhook.admission.simulate import _POD_KEYS, Simulator, pod_key


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


def test_a_pod_key_found_by_its_containers_identity_still_tells_pods_apart() -> None:
    """The key of a pod is found by its containers tuple's identity and its other fields (perf, issue 37): pods
    sharing the tuple but differing in another field (mode, QoS class, bypass) get answers of their own, and equal
    pods read separately share one key object."""
    topo = machine(2, 4)
    node = parse_nrt(nrt("n1", topo))
    sim = Simulator()
    pod = _pod(3)
    assert sim.admit(node, pod, occupied=True).admitted  # 3 whole CPUs of a NUMA node of 4: granted
    kubelet_only = replace(pod, cpu_manager="none")
    assert kubelet_only.containers is pod.containers
    assert sim._pod_key(kubelet_only) is not sim._pod_key(pod)
    assert sim._pod_key(kubelet_only).value == pod_key(kubelet_only)
    for other in (replace(pod, qos_class="Burstable"), replace(pod, bypass=True), replace(pod, cpu_manager="share")):
        assert sim._pod_key(other).value == pod_key(other) != pod_key(pod)
    again = _pod(3)  # the same pod read again: another containers tuple, an equal key, the same key object
    assert again.containers is not pod.containers and again.containers == pod.containers
    assert sim._pod_key(again) is sim._pod_key(pod)


def test_pod_keys_forgotten_past_their_bound_still_give_the_cached_answers() -> None:
    topo = machine(2, 4)
    node = parse_nrt(nrt("n1", topo))
    sim = Simulator()
    big, three = _pod(20), _pod(3)  # the node has 16 CPUs
    assert not sim.admit(node, big, occupied=True).admitted and sim.admit(node, three, occupied=True).admitted
    for i in range(_POD_KEYS + 5):  # other pods fill the memo of keys, which is then cleared
        sim._pod_key(replace(three, containers=tuple(three.containers), uid=str(i)))
    simulations = sim.simulations
    for pod, admitted in ((_pod(20), False), (_pod(3), True)):
        answer = sim.cached(node, pod, occupied=True)
        assert answer is not None and answer.admitted is admitted
    assert sim.simulations == simulations
