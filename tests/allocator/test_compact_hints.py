"""Hint families: the CPU family lists exactly kubelet's CPU hints; merges with families at large NUMA
counts (16, 34 with CPU-less nodes, 64) agree with an exhaustive merge over the relevant nodes."""

from __future__ import annotations

import random

import pytest

from allocator.bitmask import bits_of
from allocator.compact_hints import HintFamily, cpu_hint_family
from allocator.cpuset import CPUSet
from allocator.hints import TopologyHint
from allocator.topology_manager import POLICIES, merge_hints
from tests.allocator.merge_reference import reference_merge
from tests.allocator.topomgr_helpers import kubelet_cpu_hints, make_topology


def _random_available(rng: random.Random, all_cpus: CPUSet) -> CPUSet:
    p = rng.choice([0.2, 0.5, 0.9, 1.0])
    return CPUSet(c for c in all_cpus if rng.random() < p)


@pytest.mark.parametrize("align", [False, True])
def test_cpu_family_lists_kubelets_hints(align: bool) -> None:
    rng = random.Random(11 if align else 12)
    shapes = [(1, 1, 2, 2, 0), (2, 1, 4, 2, 0), (2, 2, 2, 2, 0), (1, 4, 2, 1, 0), (2, 2, 3, 2, 2), (2, 3, 1, 2, 1)]
    for sockets, per_socket, cores, threads, cpu_less in shapes:
        topo = make_topology(sockets, per_socket, cores, threads, cpu_less)
        for _ in range(40):
            available = _random_available(rng, topo.all_cpus)
            reusable = CPUSet()
            if rng.random() < 0.3:
                taken = topo.all_cpus - available
                reusable = CPUSet(c for c in taken if rng.random() < 0.3)
            request = rng.randint(1, topo.num_cpus)
            fam = cpu_hint_family(topo, available, reusable, request, align_by_socket=align)
            assert fam is not None
            assert fam.hints() == kubelet_cpu_hints(topo, available, reusable, request, align)
    assert cpu_hint_family(make_topology(1, 1, 2), CPUSet(), CPUSet(), 0) is None


def test_cpu_family_never_covers_cpu_less_nodes() -> None:
    topo = make_topology(2, 1, 4, 2, cpu_less=32)  # GB200-like: 34 NUMA nodes, 2 with CPUs
    fam = cpu_hint_family(topo, topo.all_cpus, CPUSet(), 4)
    assert fam is not None
    assert fam.universe == 0b11
    assert [str(h) for h in fam.hints()] == ["{numa: 0, preferred: true}", "{numa: 1, preferred: true}",
                                             "{numa: 0,1, preferred: false}"]


def _family_inputs(rng: random.Random, n_nodes: int, cpu_nodes: int) -> list:
    topo = make_topology(2, cpu_nodes // 2, 4, 2, cpu_less=n_nodes - cpu_nodes)
    available = _random_available(rng, topo.all_cpus)
    request = rng.randint(1, 8 * rng.randint(1, 4))
    fam = cpu_hint_family(topo, available, CPUSet(), request)
    providers: list = [{"cpu": fam}, None]
    for _ in range(rng.randint(0, 2)):
        dev_nodes = set(rng.sample(range(n_nodes), rng.randint(1, 2)))
        providers.append({f"dev{len(providers)}": HintFamily(
            universe=(1 << n_nodes) - 1, required=sum(1 << d for d in dev_nodes), preferred_size=len(dev_nodes))})
    return [topo, providers]


def _restricted_full(providers: list, relevant: list[int]) -> list:
    """Materialise families over the relevant nodes only (nodes outside them appear in no hint AND
    except through the all-nodes default, so they can be projected away for the comparison)."""
    out: list = []
    for p in providers:
        if p is None:
            out.append(None)
            continue
        res = {}
        for k, fam in p.items():
            rel = sum(1 << n for n in relevant)
            res[k] = HintFamily(universe=fam.universe & rel, required=fam.required, weights=fam.weights,
                                threshold=fam.threshold, preferred_size=fam.preferred_size).hints()
        out.append(res)
    return out


@pytest.mark.parametrize("n_nodes", [16, 34, 64])
def test_large_machines_merge_like_the_exhaustive_merge(n_nodes: int) -> None:
    """On N nodes with CPU nodes C and device nodes: every family member can be shrunk to C ∪ devices
    without changing any AND the policy can pick (other nodes are in no required set and weigh 0), so the
    exhaustive merge over those relevant nodes (the same machine mask) must give the same answer."""
    rng = random.Random(n_nodes)
    for _ in range(25):
        cpu_nodes = rng.choice([2, 4])
        topo, providers = _family_inputs(rng, n_nodes, cpu_nodes)
        relevant = sorted(set(topo.cpu_numa_nodes) | {
            n for p in providers if p for fam in p.values() for n in bits_of(fam.required)})
        if len(relevant) > 6:
            continue
        full = _restricted_full(providers, relevant)
        for policy in POLICIES:
            got = merge_hints(providers, policy=policy, numa_nodes=list(range(n_nodes)))
            want = reference_merge(full, policy=policy, numa_nodes=list(range(n_nodes)))
            if want[0].numa is not None and want[0].mask == (1 << n_nodes) - 1:
                # nothing reachable: both fall back to the default mask
                assert got == want
                continue
            assert got == want, (policy, providers)


def test_gb200_like_machine_admits_quickly() -> None:
    topo = make_topology(2, 1, 36, 2, cpu_less=32)
    fam = cpu_hint_family(topo, topo.all_cpus, CPUSet(), 8)
    gpu = HintFamily(universe=(1 << 34) - 1, required=1 << 0, preferred_size=1)
    hint, admit = merge_hints([{"cpu": fam}, None, {"gpu": gpu}], policy="single-numa-node",
                              numa_nodes=topo.numa_nodes)
    assert (hint, admit) == (TopologyHint(frozenset({0}), True), True)
    # a GPU whose memory node has no CPUs cannot be aligned with CPUs on one node
    gpu_mem = HintFamily(universe=(1 << 34) - 1, required=1 << 5, preferred_size=1)
    hint, admit = merge_hints([{"cpu": fam}, {"gpu": gpu_mem}], policy="restricted", numa_nodes=topo.numa_nodes)
    assert not admit


def test_wide_families_refuse_to_be_listed() -> None:
    fam = HintFamily(universe=(1 << 34) - 1, required=1)
    with pytest.raises(ValueError, match="too wide to list"):
        fam.hints()
    assert len(HintFamily(universe=0b111, required=1).hints()) == 4


@pytest.mark.parametrize("align", [False, True])
def test_cpu_family_lists_the_static_policy_generator(align: bool) -> None:
    """Cross-check with allocator.cpu_hints.generate_cpu_hints (the static policy's exact generator)."""
    from allocator.cpu_hints import generate_cpu_hints

    rng = random.Random(21 if align else 22)
    for sockets, per_socket, cores, threads, cpu_less in [(2, 2, 2, 2, 1), (2, 4, 1, 2, 0), (1, 6, 2, 1, 2),
                                                           (2, 5, 2, 2, 0)]:
        topo = make_topology(sockets, per_socket, cores, threads, cpu_less)
        for _ in range(25):
            available = _random_available(rng, topo.all_cpus)
            reusable = CPUSet(c for c in topo.all_cpus - available if rng.random() < 0.2)
            request = rng.randint(1, topo.num_cpus)
            fam = cpu_hint_family(topo, available, reusable, request, align_by_socket=align)
            assert fam is not None
            assert fam.hints() == generate_cpu_hints(topo, available, reusable, request, align)


@pytest.mark.parametrize("align", [False, True])
def test_family_and_full_list_merge_alike_on_10_numa_nodes(align: bool) -> None:
    """Where the full list is still small enough (10 CPU NUMA nodes: 1023 masks), a CPU family and its full
    list merge to the same result, with a device and for every policy."""
    from allocator.cpu_hints import generate_cpu_hints
    from allocator.device_hints import device_hints

    rng = random.Random(31 if align else 32)
    topo = make_topology(2, 5, 2, 2, cpu_less=1)
    for _ in range(8):
        available = _random_available(rng, topo.all_cpus)
        request = rng.randint(1, 24)
        fam = cpu_hint_family(topo, available, CPUSet(), request, align_by_socket=align)
        full = generate_cpu_hints(topo, available, CPUSet(), request, align)
        gpu = device_hints("gpu", {rng.choice(topo.numa_nodes)}, topo.numa_nodes, compact_above=64)
        for policy in POLICIES:
            for closest in ("false", "true"):
                opts = {"prefer-closest-numa-nodes": closest}
                kw = {"policy": policy, "numa_nodes": topo.numa_nodes, "distances": topo.numa_distances,
                      "options": opts}
                assert merge_hints([{"cpu": fam}, None, {"gpu": gpu}], **kw) == \
                    merge_hints([{"cpu": full}, None, {"gpu": gpu}], **kw), (policy, closest, request)


def test_small_families_read_like_lists() -> None:
    fam = HintFamily(universe=0b111, required=0b1, preferred_size=1)
    assert len(fam) == 4 and fam[0] == TopologyHint(frozenset({0}), True) and list(fam) == fam.hints()
    assert fam and not HintFamily(universe=0b1, required=0b10)
    wide = HintFamily(universe=(1 << 40) - 1, required=1)
    assert wide  # truth without listing 2^40 masks
    with pytest.raises(ValueError, match="too wide"):
        len(wide)


def test_static_policy_hands_families_on_many_numa_nodes() -> None:
    from allocator.pod import ContainerInfo, PodInfo
    from allocator.state import CPUState
    from allocator.static_policy import StaticPolicy

    topo = make_topology(2, 17, 4, 2, cpu_less=0)  # 34 NUMA nodes with CPUs
    policy = StaticPolicy(topo, num_reserved_cpus=2)
    state = CPUState()
    policy.start(state)
    c = ContainerInfo("c", "app", 12000, 12000, 1 << 30, 1 << 30)
    pod = PodInfo("u", "ns", "p", "Guaranteed", None, False, (c,))
    hints = policy.topology_hints(state, pod, "c")
    assert hints is not None and isinstance(hints["cpu"], HintFamily)
    hint, admit = merge_hints([hints, None], policy="restricted", numa_nodes=topo.numa_nodes)
    assert admit and hint.numa is not None and len(hint.numa) == 2  # 12 CPUs need two 8-CPU nodes
    cpus = policy.allocate(state, pod, "c", hint)
    assert len(cpus) == 12 and topo.numa_of(cpus) == CPUSet(hint.numa)


def test_family_description() -> None:
    fam = HintFamily(universe=0b1111, required=0b10, weights=((0, 4), (1, 0), (2, 8)), threshold=6,
                     preferred_size=2)
    assert str(fam) == "{every mask of NUMA 0,1,2,3 holding 1 with weight >= 6; preferred at width 2}"
    assert fam.to_dict() == {"family": {"nodes": [0, 1, 2, 3], "required": [1], "weights": {"0": 4, "2": 8},
                                        "threshold": 6, "preferredWidth": 2}}
