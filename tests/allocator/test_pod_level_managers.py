"""kubelet v1.36's alpha ``PodLevelResourceManagers`` gate (``NodeConfig.pod_level_resource_managers``, read from
``--feature-gates``): with topology manager scope ``container`` (or policy ``none``) a pod with pod-level resources
goes through the container-level flow, and a container of such a Guaranteed pod gets CPUs and memory of its own when
it is Guaranteed on its own (IsContainerEquivalentQOSGuaranteed) -- kubelet's own test expectations, by name. Scope
``pod`` with the gate (kubelet's pod "bubble") is not modelled: numapin refuses such a pod (only), saying why."""

from __future__ import annotations

import pytest

from allocator import CPUSet, NodeAllocator, NodeConfig
from allocator.errors import ConfigError
from allocator.feature_gates import FeatureGates, parse_feature_gates
from allocator.memory import MachineMemory, parse_reserved_memory
from allocator.memory.config import MemoryConfig
from allocator.pod import PodInfo, equivalent_guaranteed
from tests.topologies import xeon_gold_6258r

GI = 1 << 30
MACHINE = MachineMemory.uniform((0, 1), 64 * GI, ())


def ctr(name: str, cpu: str | None = None, mem: str | None = None) -> dict:
    res = {k: v for k, v in (("cpu", cpu), ("memory", mem)) if v}
    return {"name": name, "resources": {"requests": res, "limits": res} if res else {}}


def pod(name: str, cpu: str | tuple[str, str], mem: str | tuple[str, str], *containers: dict) -> dict:
    """A pod with pod-level ``cpu``/``mem`` (one value: request = limit; a pair: (request, limit))."""
    (cr, cl), (mr, ml) = ((v, v) if isinstance(v, str) else v for v in (cpu, mem))
    return {"metadata": {"name": name, "namespace": "default", "uid": name},
            "spec": {"containers": list(containers),
                     "resources": {"requests": {"cpu": cr, "memory": mr}, "limits": {"cpu": cl, "memory": ml}}}}


def node(gate: bool = True, *, policy: str = "best-effort", scope: str = "container") -> NodeAllocator:
    return NodeAllocator(NodeConfig(
        topology=xeon_gold_6258r(), num_reserved_cpus=2, topology_manager_policy=policy,
        topology_manager_scope=scope, pod_level_resource_managers=gate,
        memory=MemoryConfig(MACHINE, "Static", parse_reserved_memory("0:memory=100Mi"))))


# (kubelet's test, the pod, {container: (exclusive CPUs, Memory Manager's NUMA nodes or None: not accounted)})
CONTAINER_SCOPE = [
    pytest.param(pod("gu-pod-level-gu-ctn-ctn-scope", "100m", "128Mi", ctr("gu-container", "100m", "128Mi")),
                 {"gu-container": (0, (0,))},
                 id="e2e_node/memory_manager/scope: container, should allocate exclusive memory to a guaranteed pod "
                    "with pod-level resources and guaranteed container, PodLevelResourceManagers enabled"),
    pytest.param(pod("gu-pod-level-ngu-ctn-ctn-scope", "100m", "128Mi", ctr("ngu-container", "100m")),
                 {"ngu-container": (0, None)},
                 id="e2e_node/memory_manager/scope: container, should not allocate exclusive memory to a guaranteed "
                    "pod with pod-level resources and non-guaranteed containers, PodLevelResourceManagers enabled"),
    pytest.param(pod("gu-pod-level-mix-ctn-ctn-scope", "200m", "128Mi", ctr("gu-container", "100m", "64Mi"),
                     ctr("ngu-container", "100m")),
                 {"gu-container": (0, (0,)), "ngu-container": (0, None)},
                 id="e2e_node/memory_manager/scope: container, should allocate exclusive memory to a guaranteed pod "
                    "with pod-level resources and mix of guaranteed and non-guaranteed containers, "
                    "PodLevelResourceManagers enabled"),
    pytest.param(pod("pod1", "2", "256Mi", ctr("c1", "2", "128Mi")), {"c1": (2, (0,))},
                 id="topologymanager/TestAdmitWithPodLevelResources/container scope, feature enabled, uses "
                    "container-level flow"),
    pytest.param(pod("mix", "3", "1Gi", ctr("gu", "2", "256Mi"), ctr("cpu-only", "1"), ctr("free")),
                 {"gu": (2, (0,)), "cpu-only": (0, None), "free": (0, None)},
                 id="cpumanager/guaranteedCPUs: a container not Guaranteed on its own (no memory) is not eligible"),
    pytest.param(pod("ngu-pod-level", ("2", "3"), "1Gi", ctr("gu-container-1", "1", "100Mi")),
                 {"gu-container-1": (0, None)},
                 id="cpumanager/TestStaticPolicyAllocatePod/should not allocate exclusive CPUs to a non-guaranteed "
                    "pod with pod-level resources and guaranteed containers"),
]


@pytest.mark.parametrize(("spec", "expected"), CONTAINER_SCOPE)
def test_container_scope_gives_containers_guaranteed_on_their_own_cpus_and_memory(spec: dict, expected: dict
                                                                                  ) -> None:
    n = node()
    d = n.admit_pod(spec)
    assert d.admitted, d.message
    uid = spec["metadata"]["uid"]
    taken = CPUSet()
    for name, (cpus, mems) in expected.items():
        c = d.container(name)
        if cpus:
            assert c.mode == "exclusive" and len(c.cpus) == cpus and n.container_cpus(uid, name) == c.cpus
            assert not (c.cpus & n.shared_pool()) and not (c.cpus & taken)
            taken = taken | c.cpus
        else:
            assert c.mode == "shared" and c.cpus == n.shared_pool() and n.container_cpus(uid, name) is None
        assert n.container_mems(uid, name) == (None if mems is None else CPUSet(mems))
        assert c.mems == (CPUSet([0, 1]) if mems is None and not cpus else c.mems)
    # the same pods on a node with the gate off: nothing of their own (kubelet's default)
    off = node(False)
    d = off.admit_pod(spec)
    assert d.admitted and off.state.assignments == {} and all(c.mode == "shared" for c in d.containers)


def test_policy_none_takes_the_container_level_flow_too() -> None:
    n = node(policy="none", scope="pod")
    d = n.admit_pod(pod("p", "3", "1Gi", ctr("gu", "2", "256Mi"), ctr("free")))
    assert d.admitted and len(d.container("gu").cpus) == 2 and d.container("free").mode == "shared"


def test_single_numa_node_judges_the_eligible_containers_alone() -> None:
    """kubelet gives hints for the containers that qualify only: 2 CPUs with 100Gi of memory cannot be aligned."""
    spec = pod("p", "3", "101Gi", ctr("gu", "2", "100Gi"), ctr("free"))
    d = node(policy="single-numa-node").admit_pod(spec)
    assert not d.admitted and d.reason == "TopologyAffinityError" and "'gu'" in d.message
    assert node(False, policy="single-numa-node").admit_pod(spec).admitted  # gate off: no hints, admitted


def test_pod_scope_with_the_gate_refuses_pod_level_pods_only_saying_why() -> None:
    n = node(policy="restricted", scope="pod")
    before = n.state.copy()
    d = n.admit_pod(pod("p", "3", "1Gi", ctr("gu", "2", "256Mi"), ctr("free")))
    assert not d.admitted and d.reason == "UnexpectedAdmissionError" and n.state == before
    assert "pod default/p sets pod-level resources" in d.message and "does not model that yet" in d.message
    plain = {"metadata": {"name": "q", "uid": "q"}, "spec": {"containers": [ctr("gu", "2", "256Mi")]}}
    assert len(n.admit_pod(plain).container("gu").cpus) == 2  # every other pod: as before
    assert node(False, policy="restricted", scope="pod").admit_pod(pod("p", "3", "1Gi", ctr("gu", "2", "256Mi"))
                                                                   ).admitted  # gate off: kubelet's default


def test_the_rule_for_a_container_guaranteed_on_its_own() -> None:
    info = PodInfo.from_pod(pod("p", "4", "4Gi", ctr("gu", "1", "1Gi"), ctr("cpu", "1"), ctr("mem", None, "1Gi"),
                                {"name": "unequal", "resources": {"requests": {"cpu": "1", "memory": "1Gi"},
                                                                  "limits": {"cpu": "2", "memory": "1Gi"}}}))
    assert [equivalent_guaranteed(c) for c in info.containers] == [True, False, False, False]


@pytest.mark.parametrize(("text", "gate"), [
    ("", False), ("PodLevelResourceManagers=true", True), (" PodLevelResourceManagers = T ", True),
    ("PodLevelResources=true,PodLevelResourceManagers=1", True), ("PodLevelResourceManagers=False", False),
])
def test_feature_gates_in_kubelets_syntax(text: str, gate: bool) -> None:
    gates = parse_feature_gates(text)
    assert gates == FeatureGates(gate) and parse_feature_gates(gates.to_text()) == gates


@pytest.mark.parametrize(("text", "error"), [
    ("NoSuchGate=true", r"unrecognized feature gate 'NoSuchGate' \(numapin knows PodLevelResourceManagers"),
    ("PodLevelResourceManagers", r"'PodLevelResourceManagers' is not Name=true\|false"),
    ("PodLevelResourceManagers=yes", r"invalid value of PodLevelResourceManagers: 'yes'"),
    ("PodLevelResourceManagers=true,PodLevelResourceManagers=false", "given twice"),
    ("PodLevelResources=false", "PodLevelResources=false is not supported"),
])
def test_bad_feature_gates_are_named(text: str, error: str) -> None:
    with pytest.raises(ConfigError, match=error):
        parse_feature_gates(text)
