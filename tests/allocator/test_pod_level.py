"""Pod-level resources (``spec.resources``, beta and on by default since Kubernetes 1.34) as kubelet v1.36's static
CPU and Memory Manager policies treat them with the ``PodLevelResourceManagers`` gate off (the default): the QoS class
from the pod-level values (with API defaulting), no container with CPUs or memory of its own, no hint from either
manager (so the topology manager admits the pod whatever its policy), numapin's annotation modes still judging each
container by its own values; carried through the intent. The gate's alpha behaviour: test_pod_level_managers.py."""

from __future__ import annotations

import json

import pytest

from allocator import CPUSet, NodeAllocator, NodeConfig, Topology
from allocator.errors import PodSpecError
from allocator.intent import decode_intent, encode_intent
from allocator.memory import MachineMemory, parse_reserved_memory
from allocator.memory.config import MemoryConfig
from allocator.pod import CPU_MANAGER_ANNOTATION, PodInfo, container_mode, guaranteed_cpus, pod_guaranteed_cpus
from allocator.pod_level import aggregate_request, pod_level_resources
from tests.fixtures.make_sysfs import MACHINES, build
from tests.topologies import xeon_gold_6258r


def ctr(name: str, cpu: str | None = None, mem: str | None = None, *, init: bool = False,
        sidecar: bool = False) -> dict:
    res: dict = {}
    if cpu or mem:
        res = {"requests": {k: v for k, v in (("cpu", cpu), ("memory", mem)) if v},
               "limits": {k: v for k, v in (("cpu", cpu), ("memory", mem)) if v}}
    c: dict = {"name": name, "image": "pause", "resources": res}
    if sidecar:
        c["restartPolicy"] = "Always"
    return c


def pod(*containers: dict, resources: dict | None = None, init: tuple[dict, ...] = (), mode: str | None = None,
        status_qos: str | None = None) -> dict:
    meta: dict = {"name": "p", "namespace": "default", "uid": "uid-p"}
    if mode:
        meta["annotations"] = {CPU_MANAGER_ANNOTATION: mode}
    spec: dict = {"containers": list(containers), "initContainers": list(init)}
    if resources is not None:
        spec["resources"] = resources
    doc = {"metadata": meta, "spec": spec}
    if status_qos:
        doc["status"] = {"qosClass": status_qos}
    return doc


FOUR = {"limits": {"cpu": "4", "memory": "4Gi"}}


def test_a_guaranteed_pod_with_pod_level_resources_gives_no_container_cpus_of_its_own() -> None:
    info = PodInfo.from_pod(pod(ctr("app", "2", "2Gi"), ctr("side", "2", "2Gi"), resources=FOUR))
    assert info.pod_level_resources and info.qos_class == "Guaranteed"
    assert [guaranteed_cpus(info, c) for c in info.containers] == [0, 0]
    assert container_mode(info, info.container("app")) == "shared" and pod_guaranteed_cpus(info) == 0
    # the same containers without spec.resources: kubelet pins both
    plain = PodInfo.from_pod(pod(ctr("app", "2", "2Gi"), ctr("side", "2", "2Gi")))
    assert not plain.pod_level_resources and [guaranteed_cpus(plain, c) for c in plain.containers] == [2, 2]


@pytest.mark.parametrize(("resources", "containers", "qos"), [
    (FOUR, [ctr("app")], "Guaranteed"),                               # requests default to the limits
    ({"limits": {"cpu": "4"}}, [ctr("app")], "Burstable"),            # Guaranteed needs CPU and memory limits
    (FOUR, [ctr("app", "1", "1Gi")], "Burstable"),                    # requests default to the containers' sum
    (FOUR, [ctr("a", "2", "2Gi"), ctr("b", "2", "2Gi")], "Guaranteed"),
    ({"requests": {"cpu": "1", "memory": "1Gi"}}, [ctr("app")], "Burstable"),
    ({"requests": {"cpu": "4", "memory": "4Gi"}, "limits": {"cpu": "4", "memory": "4Gi"}}, [ctr("app", "500m")],
     "Guaranteed"),                                                   # the containers' own values do not count
])
def test_the_qos_class_comes_from_the_pod_level_values(resources: dict, containers: list, qos: str) -> None:
    assert PodInfo.from_pod(pod(*containers, resources=resources)).qos_class == qos


def test_status_qos_class_is_taken_as_the_api_server_computed_it() -> None:
    assert PodInfo.from_pod(pod(ctr("app"), resources=FOUR, status_qos="Burstable")).qos_class == "Burstable"


@pytest.mark.parametrize(("resources", "is_set"), [
    ({}, False), ({"limits": {}}, False), ({"limits": {"ephemeral-storage": "1Gi"}}, False),
    ({"requests": {"hugepages-2Mi": "2Mi"}}, True), ({"requests": {"memory": "1Gi"}}, True)])
def test_only_resources_kubelet_supports_at_pod_level_count(resources: dict, is_set: bool) -> None:
    assert PodInfo.from_pod(pod(ctr("app", "1", "1Gi"), resources=resources)).pod_level_resources is is_set


def test_bad_pod_level_values_name_the_field() -> None:
    with pytest.raises(PodSpecError, match=r"spec\.resources\.limits\.cpu"):
        PodInfo.from_pod(pod(ctr("app"), resources={"limits": {"cpu": "lots"}}))
    with pytest.raises(PodSpecError, match=r"spec\.resources must be a mapping"):
        PodInfo.from_pod(pod(ctr("app"), resources=["cpu"]))  # type: ignore[arg-type]


def test_the_annotation_still_pins_containers_by_their_own_values() -> None:
    info = PodInfo.from_pod(pod(ctr("app", "2", "1Gi"), ctr("free"), resources=FOUR, mode="exclusive"))
    assert [guaranteed_cpus(info, c) for c in info.containers] == [2, 0]
    assert container_mode(info, info.container("app")) == "exclusive"


def test_aggregate_request_is_kubelets() -> None:
    assert aggregate_request([("init", 3000), ("sidecar", 1000), ("init", 1000), ("app", 500)]) == 3000
    assert aggregate_request([("sidecar", 1000), ("init", 3000), ("app", 500)]) == 4000
    assert aggregate_request([("app", None)]) is None
    level = pod_level_resources(FOUR, [("init", 3000, None), ("app", 1000, None)])
    assert level is not None and (level.cpu_request_milli, level.memory_request) == (3000, 4 << 30)


def test_the_intent_carries_it_and_old_intents_read_as_without() -> None:
    info = PodInfo.from_pod(pod(ctr("app", "4", "4Gi"), resources=FOUR))
    assert info.qos_class == "Guaranteed"
    text = encode_intent(info)
    assert json.loads(text)["podLevel"] is True
    back = decode_intent(text, uid="uid-p", namespace="default", name="p")
    assert back.pod_level_resources and guaranteed_cpus(back, back.container("app")) == 0
    plain = encode_intent(PodInfo.from_pod(pod(ctr("app", "2", "1Gi"))))
    assert "podLevel" not in json.loads(plain)  # unchanged for every other pod
    assert not decode_intent(plain, uid="u", namespace="n", name="p").pod_level_resources
    with pytest.raises(PodSpecError, match="podLevel must be true or false"):
        decode_intent(text.replace('"podLevel":true', '"podLevel":"yes"'), uid="u", namespace="n", name="p")


def test_the_node_admits_it_on_the_shared_pool(tmp_path) -> None:
    topo = Topology.from_sysfs(build(MACHINES["e5-2680v3"], tmp_path))
    n = NodeAllocator(NodeConfig(topology=topo, reserved_cpus=CPUSet.parse("0,24"),
                                 topology_manager_policy="single-numa-node"))
    assert n.admit_pod(pod(ctr("app", "4", "4Gi")), dry_run=True).container("app").mode == "exclusive"
    d = n.admit_pod(pod(ctr("app", "4", "4Gi"), resources=FOUR))
    assert d.admitted and d.container("app").mode == "shared" and n.state.assignments == {}
    assert d.container("app").cpus == n.shared_pool()


# kubelet v1.36 with PodLevelResources on and PodLevelResourceManagers off: its own test cases, by name, as pods. In
# every one kubelet gives no container CPUs or memory of its own and both managers return no hint (admitted).
GI = 1 << 30
MACHINE = MachineMemory.uniform((0, 1), 64 * GI, ())


def _pl(cpu: str, mem: str) -> dict:
    """Pod-level requests equal to limits."""
    return {"requests": {"cpu": cpu, "memory": mem}, "limits": {"cpu": cpu, "memory": mem}}


def _ctr(name: str, cpu: str | None, mem: str | None) -> dict:
    res = {k: v for k, v in (("cpu", cpu), ("memory", mem)) if v}
    return {"name": name, "resources": {"requests": res, "limits": res} if res else {}}


GATE_OFF = [
    pytest.param(_pl("2", "300Mi"), [_ctr("container1", "1", "100Mi")],
                 id="cpumanager/TestCPUManagerRestoreState/Pod-level resources enabled, managers disabled"),
    pytest.param(_pl("1", "128Mi"), [_ctr("container1", "1", "100Mi")],
                 id="memorymanager/TestMemoryManagerRestoreState/PodLevelResources enabled, "
                    "PodLevelResourceManagers disabled"),
    pytest.param(_pl("1", "1Gi"), [_ctr("c1", None, None)],
                 id="podresources/PodLevelResourceManagers disabled, Pod Level Resources Only (No Exclusive CPUs)"),
    pytest.param(_pl("2", "1Gi"), [_ctr("c1", "2", "1Gi")],
                 id="topologymanager/TestAdmitWithPodLevelResources/pod scope, feature disabled, falls back to "
                    "container level flow"),
    pytest.param(_pl("300m", "128Mi"), [_ctr("gu-container", "100m", "128Mi")],
                 id="e2e_node/memory_manager/should not report any memory data during request to pod resources List "
                    "when pod has pod level resources, PodLevelResourceManagers disabled"),
    pytest.param({"limits": {"cpu": "4", "memory": "100Gi"}}, [_ctr("app", "4", "100Gi")],
                 id="numapin/memory no NUMA node holds: refused before, kubelet gives no hint"),
]


@pytest.mark.parametrize("scope", ["container", "pod"])
@pytest.mark.parametrize(("resources", "containers"), GATE_OFF)
def test_kubelet_1_36_gate_off_pins_neither_cpus_nor_memory(resources: dict, containers: list, scope: str) -> None:
    n = NodeAllocator(NodeConfig(topology=xeon_gold_6258r(), num_reserved_cpus=2,
                                 topology_manager_policy="single-numa-node", topology_manager_scope=scope,
                                 memory=MemoryConfig(MACHINE, "Static", parse_reserved_memory("0:memory=100Mi"))))
    before = n.memory_state.copy() if n.memory_state is not None else None
    p = pod(*containers, resources=resources)
    info = PodInfo.from_pod(p)
    assert info.qos_class == "Guaranteed" and info.pod_level_resources
    d = n.admit_pod(p)
    assert d.admitted, d.message
    assert n.state.assignments == {} and n.memory_state == before  # nothing of its own, nothing accounted
    for c in d.containers:
        assert c.mode == "shared" and c.cpus == n.shared_pool() and c.mems == CPUSet([0, 1])
        assert all(h is None for h in c.hints.values())  # neither manager gives a hint
