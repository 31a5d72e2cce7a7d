"""``numapin status --cluster`` as a new user runs it: the real CLI in a subprocess with a kubeconfig, against the
session's real kube-apiserver v1.36.2 (tests/control_plane.py) holding the NodeResourceTopology CRD of manifests/
and several nodes' objects made by ``allocator.nrt.build_nrt`` from the project's topology fixtures, a malformed
object and a Node that publishes none."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from allocator.cpuset import CPUSet
from allocator.nrt import build_nrt
from allocator.topology import Topology
from numapin_lab.k8s.control_plane import ControlPlane
from numapin_lab.k8s.crds import install_nrt_crd
from tests import topologies

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.apiserver
GiB = 1 << 30


def _nrt(name: str, topo: Topology, *, policy: str, reserved: str = "", pinned: str = "",
         memory: dict[int, dict[str, tuple[int, int, int]]] | None = None) -> dict[str, Any]:
    reserved_cpus = CPUSet.parse(reserved)
    free = topo.all_cpus - reserved_cpus - CPUSet.parse(pinned)
    return build_nrt(name, topo, free_cpus=free, reserved_cpus=reserved_cpus, topology_manager_policy=policy,
                     memory=memory, memory_manager_policy="Static" if memory else None)


def _objects() -> list[dict[str, Any]]:
    e5 = topologies.e5_2680_v3()  # 24 CPUs per NUMA node: 20 of each pinned, 4 free
    e5_pinned = ",".join(str(CPUSet(sorted(e5.cpus_in_numa(n))[:20])) for n in (0, 1))
    broken = _nrt("st39-broken", topologies.dual_socket_ht(), policy="none")
    broken["attributes"] = [{"name": "topologyManagerPolicy", "value": "sometimes"}]
    return [
        _nrt("st39-xeon", topologies.xeon_gold_6258r(), policy="single-numa-node", reserved="0,28",
             memory={0: {"memory": (64 * GiB, 62 * GiB, 50 * GiB)}, 1: {"memory": (64 * GiB, 64 * GiB, 64 * GiB)}}),
        _nrt("st39-e5", e5, policy="single-numa-node", pinned=e5_pinned),
        _nrt("st39-small", topologies.dual_socket_ht(), policy="single-numa-node"),  # 6 CPUs per NUMA node
        _nrt("st39-epyc", topologies.epyc_4_numa_per_socket(), policy="none", pinned="0-99"),
        broken,
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "st39-bare"}},
    ]


@pytest.fixture(scope="module")
def cluster(control_plane: ControlPlane) -> Iterator[ControlPlane]:
    install_nrt_crd(control_plane)
    listing = json.dumps({"apiVersion": "v1", "kind": "List", "items": _objects()})
    control_plane.kubectl("apply", "--validate=false", "-f", "-", input=listing)
    try:
        yield control_plane
    finally:
        control_plane.kubectl("delete", "--ignore-not-found", "-f", "-", input=listing, check=False)


def numapin_status(cp: ControlPlane, *args: str, kubeconfig: Path | None = None,
                   env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "numapin", "status", "--cluster", *args]
    if env is None:
        cmd += ["--kubeconfig", str(kubeconfig or cp.kubeconfig)]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={"PATH": "/usr/bin:/bin", **(env or {})})


def test_every_node_is_drawn_with_where_a_pod_fits_and_bad_objects_are_skipped(cluster: ControlPlane) -> None:
    r = numapin_status(cluster, "--fits", "cpu=10,memory=8Gi", "--format", "json")
    assert r.returncode == 1, r.stdout + r.stderr  # some nodes skipped
    assert "Traceback" not in r.stderr
    doc = json.loads(r.stdout)
    nodes = {n["name"]: n for n in doc["nodes"] if n["name"].startswith("st39-")}
    assert sorted(nodes) == ["st39-e5", "st39-epyc", "st39-small", "st39-xeon"]
    xeon = nodes["st39-xeon"]
    assert xeon["topologyManagerPolicy"] == "single-numa-node" and xeon["memoryManagerPolicy"] == "Static"
    assert [(z["numaNode"], z["socket"], z["cpus"]) for z in xeon["numaNodes"]] == [
        (0, 0, {"capacity": 56, "allocatable": 55, "free": 55, "pinned": 0, "reserved": 1}),
        (1, 1, {"capacity": 56, "allocatable": 55, "free": 55, "pinned": 0, "reserved": 1})]
    assert xeon["numaNodes"][0]["memory"]["memory"] == {"capacity": 64 * GiB, "allocatable": 62 * GiB,
                                                         "free": 50 * GiB, "pinned": 12 * GiB}
    assert [z["cpus"]["pinned"] for z in nodes["st39-e5"]["numaNodes"]] == [20, 20]
    assert len(nodes["st39-epyc"]["numaNodes"]) == 8 and nodes["st39-epyc"]["cpus"]["free"] == 156
    verdicts = {name: n["fits"]["verdict"] for name, n in nodes.items()}
    assert verdicts == {"st39-xeon": "fits", "st39-e5": "full", "st39-small": "never", "st39-epyc": "fits"}
    assert nodes["st39-small"]["fits"]["reason"] == "TopologyAffinityError"
    assert sorted(n for n in doc["fits"]["now"] if n.startswith("st39-")) == ["st39-epyc", "st39-xeon"]
    skipped = {s["node"]: s["why"] for s in doc["skipped"] if s["node"].startswith("st39-")}
    assert set(skipped) == {"st39-broken", "st39-bare"}
    assert "unknown policy 'sometimes'" in skipped["st39-broken"]
    assert "no NodeResourceTopology" in skipped["st39-bare"]
    assert "skipped node st39-broken" in r.stderr and "skipped node st39-bare" in r.stderr


def test_the_text_picture_shows_sockets_numa_nodes_and_verdicts(cluster: ControlPlane) -> None:
    r = numapin_status(cluster, "--fits", "cpu=10,mode=exclusive")
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    out = r.stdout
    assert "node st39-e5: 8 of 48 allocatable CPUs free, topology manager single-numa-node/container" in out
    assert "cpu=10,mode=exclusive: does not fit now (would on the empty node)" in out
    assert "cpu=10,mode=exclusive: never fits under this policy (TopologyAffinityError" in out
    e5 = out.split("node st39-e5:")[1].split("\nnode ")[0]
    assert "  socket 0\n    NUMA 0  " + "#" * 20 + "...." in e5 and "  socket 1\n    NUMA 1  " in e5
    assert "memory 50Gi free of 62Gi" in out
    assert "skipped st39-bare: no NodeResourceTopology object" in out


@pytest.mark.parametrize("fits", ["cpu=four", "memory=8Gi", "cpu=2", "cpu=2,gpu=1",
                                  "cpu=2,mode=sometimes"])
def test_a_bad_fits_is_a_usage_error(cluster: ControlPlane, fits: str) -> None:
    r = numapin_status(cluster, "--fits", fits)
    assert r.returncode == 2 and "usage:" in r.stderr and "argument --fits" in r.stderr, r.stderr
    assert r.stdout == ""


def test_a_user_who_may_not_list_topologies_is_told_so(cluster: ControlPlane) -> None:
    r = numapin_status(cluster, kubeconfig=cluster.kubeconfig_for("st39-nobody"))
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "403" in r.stderr and "may not list noderesourcetopologies" in r.stderr


def test_the_kubeconfig_comes_from_kubeconfig_else_it_says_what_to_give(cluster: ControlPlane) -> None:
    r = numapin_status(cluster, "--format", "json", env={"KUBECONFIG": f"/nonexistent:{cluster.kubeconfig}"})
    assert r.returncode == 1 and "st39-xeon" in r.stdout, r.stderr
    r = numapin_status(cluster, env={})
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip() == ("numapin status: no kubeconfig: pass --kubeconfig FILE or set $KUBECONFIG (or run in "
                                "a pod, with its service account)")
