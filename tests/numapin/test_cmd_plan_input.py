"""``numapin plan`` with bad scenarios: exit 2, a message naming the field, never a traceback."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from numapin.cli import main

REPO = Path(__file__).resolve().parents[2]
TOPOLOGY = str(REPO / "examples" / "topology-112.json")


def pod(name: str = "p", cpu: object = "2", annotations: dict | None = None) -> dict:
    meta: dict = {"name": name, "namespace": "default", "uid": f"uid-{name}"}
    if annotations:
        meta["annotations"] = annotations
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": {"containers": [{"name": "app", "resources": {"limits": {"cpu": cpu, "memory": "1Gi"}}}]}}


def base(**extra: object) -> dict:
    doc: dict = {"topology": TOPOLOGY, "reservedCPUs": "0,56", "pods": [pod()]}
    doc.update(extra)
    return {k: v for k, v in doc.items() if v is not None}


BAD = [
    ("not-a-mapping", ["a", "b"], "scenario must be a mapping"),
    ("typo", base(topologyManagerPolicyy="restricted"), "topologyManagerPolicyy: unknown scenario field"),
    ("no-topology", base(topology=None), "topology is required"),
    ("topology-file-missing", base(topology="missing.json"), "topology: cannot read"),
    ("topology-bad", base(topology={"cpus": 3}), "topology.cpus must be a list"),
    ("topology-cpu-bad", base(topology={"cpus": [{"cpu": 0, "core": 0, "socket": 0}]}), "topology.cpus[0].numa"),
    ("topology-sysfs-bad", base(topology="sysfs:/nonexistent-root"), "topology: /nonexistent-root"),
    ("topology-type", base(topology=5), "topology must be a mapping, a file name"),
    ("reserved-bad", base(reservedCPUs="3-1"), "reservedCPUs: invalid cpu-list"),
    ("reserved-type", base(reservedCPUs=[0, 56]), "reservedCPUs must be a cpu-list string"),
    ("reserved-off-machine", base(reservedCPUs="0,200"), "reservedCPUs: [cpumanager] unable to build the reserved "
     "physical CPUs from the reserved set: reservedCPUs 200 are not on this machine"),
    ("reserved-both", base(numReservedCPUs=2), "reservedCPUs and numReservedCPUs"),
    ("num-reserved-negative", base(reservedCPUs=None, numReservedCPUs=-1), "numReservedCPUs must be"),
    ("tm-policy", base(topologyManagerPolicy="strict"), "topologyManagerPolicy: unknown policy 'strict'"),
    ("tm-policy-type", base(topologyManagerPolicy=3), "topologyManagerPolicy must be a string"),
    ("tm-scope", base(topologyManagerScope="node"), "topologyManagerScope: unknown scope 'node'"),
    ("tm-option", base(topologyManagerPolicyOptions={"fast": "true"}),
     "topologyManagerPolicyOptions: unknown topology manager policy option 'fast'"),
    ("tm-max-numa", base(topologyManagerPolicyOptions={"max-allowable-numa-nodes": "4"}),
     "topologyManagerPolicyOptions: topology manager option max-allowable-numa-nodes: the minimum value is 8"),
    ("tm-closest-bool", base(topologyManagerPolicyOptions={"prefer-closest-numa-nodes": "yes please"}),
     "topologyManagerPolicyOptions: topology manager option prefer-closest-numa-nodes: bad value 'yes please'"),
    ("tm-align-single", base(topologyManagerPolicy="single-numa-node",
                             cpuManagerPolicyOptions={"align-by-socket": "true"}),
     "cpuManagerPolicyOptions: Topology manager single-numa-node policy is incompatible"),
    ("cpu-option-unknown", base(cpuManagerPolicyOptions={"bogus": "true"}),
     'cpuManagerPolicyOptions: unknown CPU Manager Policy option: "bogus"'),
    ("cpu-option-bool", base(cpuManagerPolicyOptions={"full-pcpus-only": "maybe"}),
     'cpuManagerPolicyOptions: bad value for option "full-pcpus-only"'),
    ("cpu-option-pair", base(cpuManagerPolicyOptions={"full-pcpus-only": "true",
                                                      "distribute-cpus-across-cores": "true"}),
     "cpuManagerPolicyOptions: static policy options full-pcpus-only and distribute-cpus-across-cores"),
    ("no-reserved", base(reservedCPUs=None), "numReservedCPUs: the static policy requires"),
    ("num-reserved-too-many", base(reservedCPUs=None, numReservedCPUs=113), "numReservedCPUs: [cpumanager] unable"),
    ("state-reserved-missing", base(state={"defaultCpuSet": "0-50"}), "state: not all reserved cpus"),
    ("state-overlap", base(state={"defaultCpuSet": "0-111", "entries": {"u": {"c": "1"}}}),
     "state: pod: u, container: c cpuset: \"1\" overlaps"),
    ("cpu-options-type", base(cpuManagerPolicyOptions=["full-pcpus-only"]), "cpuManagerPolicyOptions must be a"),
    ("pods-missing", base(pods=None), "pods must be a list"),
    ("pod-annotation", base(pods=[pod(annotations={"qos.gocrane.io/cpu-manager": "turbo"})]),
     "pods[0]: annotation qos.gocrane.io/cpu-manager='turbo'"),
    ("pod-quantity", base(pods=[pod("a"), pod("b", cpu="two")]), "pods[1]: spec.containers[0].resources.limits.cpu"),
    ("pod-twice", base(pods=[pod("a"), pod("a")]), "pods[1].metadata: pod 'uid-a' appears twice"),
    ("state-type", base(state="0-111"), "state must be a mapping"),
    ("state-cpus", base(state={"defaultCpuSet": "0-x"}), "state: defaultCpuSet"),
    ("state-checksum", base(state={"defaultCpuSet": "0-111", "checksum": 5}), "state is corrupt: checksum mismatch"),
    ("devices", base(devices={"p": {"app": {"gpu": "0"}}}), "devices['p']['app']['gpu'] must be a list"),
    ("gate-unknown", base(featureGates={"PodLevelResourceManager": True}),
     "featureGates: unrecognized feature gate 'PodLevelResourceManager'"),
    ("gate-type", base(featureGates=["PodLevelResourceManagers"]), "featureGates: expected a mapping of gate names"),
    ("gate-value", base(featureGates={"PodLevelResourceManagers": "maybe"}),
     "featureGates: invalid value of PodLevelResourceManagers: 'maybe'"),
    ("memory-type", base(memory="Static"), "memory must be a mapping"),
    ("memory-field", base(memory={"perNUMANode": {"memory": "64Gi"}, "reserve": "1Gi"}),
     "memory.reserve: unknown field"),
    ("memory-policy", base(memory={"policy": "static", "perNUMANode": {"memory": "64Gi"}}),
     'memory.policy: unknown policy: "static"'),
    ("memory-machine", base(memory={"policy": "Static"}), "memory: give the machine's memory as perNUMANode"),
    ("memory-quantity", base(memory={"perNUMANode": {"memory": "lots"}}), "memory.perNUMANode.memory"),
    ("memory-resource", base(memory={"perNUMANode": {"memory": "64Gi", "cpu": "2"}}),
     "memory.perNUMANode.cpu: only memory and hugepages-<size>"),
    ("memory-pages", base(memory={"perNUMANode": {"memory": "64Gi", "hugepages-1Gi": "1500Mi"}}),
     "is not a whole number of hugepages-1Gi pages"),
    ("memory-nodes", base(memory={"nodes": {0: {"memory": "64Gi"}}}),
     "memory.nodes lists NUMA nodes [0], the topology has [0, 1]"),
    ("memory-reserved-format", base(memory={"perNUMANode": {"memory": "64Gi"}, "reservedMemory": "0:memory"}),
     "the reserved limit has incorrect value, expected type=quantatity"),
    ("memory-reserved-sum", base(memory={"perNUMANode": {"memory": "64Gi"}, "reservedMemory": "0:memory=1Gi"}),
     'the total amount "1Gi" of type "memory" is not equal to the value "100Mi" determined by Node Allocatable'),
]


@pytest.mark.parametrize(("doc", "fragment"), [(d, f) for _, d, f in BAD], ids=[i for i, _, _ in BAD])
def test_bad_scenarios(tmp_path, capsys, doc, fragment):
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert main(["plan", str(path)]) == 2
    err = capsys.readouterr().err
    assert fragment in err, err
    assert str(path) in err


def test_unreadable_and_invalid_files(tmp_path, capsys):
    assert main(["plan", str(tmp_path / "missing.yaml")]) == 2
    assert "scenario: cannot read" in capsys.readouterr().err
    bad_yaml = tmp_path / "s.yaml"
    bad_yaml.write_text("pods: [unclosed\n")
    assert main(["plan", str(bad_yaml)]) == 2
    assert "is not valid YAML" in capsys.readouterr().err
    bad_json = tmp_path / "s.json"
    bad_json.write_text("{")
    assert main(["plan", str(bad_json)]) == 2
    assert "is not valid JSON" in capsys.readouterr().err


def test_no_traceback_from_the_real_command(tmp_path):
    path = tmp_path / "s.json"
    path.write_text(json.dumps(base(topologyManagerScope="node")))
    proc = subprocess.run([sys.executable, "-m", "numapin", "plan", str(path)], capture_output=True, text=True,
                          cwd=REPO, check=False)
    assert proc.returncode == 2, proc.stderr
    assert "topologyManagerScope" in proc.stderr and "Traceback" not in proc.stderr


def test_bad_max_hints(capsys):
    assert main(["plan", TOPOLOGY, "--max-hints", "-1"]) == 2
    assert "--max-hints must be >= 0" in capsys.readouterr().err
