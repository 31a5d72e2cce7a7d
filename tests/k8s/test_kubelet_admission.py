"""numapin's webhook registered with the real API server as manifests/webhook registers it (its rules,
matchConditions and failure policies; called by URL on loopback with its own CA, as ``numapin certs --ip-address``
makes it), reading the NodeResourceTopology the real node's proxy publishes: a pod is stamped with its CPU intent
and pinned by kubelet's runtime calls, a pod no node can hold is denied at admission with numapin's reason, and the real
kube-scheduler's binding to a node whose topology cannot hold the pod is denied, retried, and ends on one that can
(nodes made as API objects only, tests/k8s/api_nodes.py)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest

from allocator.cpuset import CPUSet
from numapin_lab.cri.proxy_process import free_port
from numapin_lab.k8s import manifests
from numapin_lab.k8s.control_plane import ControlPlane
from numapin_lab.k8s.lab_node import LabNode
from numapin_lab.k8s.scheduler import Scheduler
from numapin_lab.k8s.webhook_process import WebhookProcess
from tests.k8s import api_nodes
from tests.k8s.api_nodes import ApiNode
from tests.k8s.kube_pods import Pods, wait_for
from tests.topologies import xeon_gold_6258r

pytestmark = [pytest.mark.apiserver, pytest.mark.kubelet]

WEBHOOK_USER = "system:serviceaccount:numapin:numapin-webhook"  # the identity manifests/webhook/rbac.yaml binds


@pytest.fixture(scope="module")
def webhook(kubelet_node: LabNode) -> Iterator[WebhookProcess]:
    """numapin's webhook registered for this module's stories (removed at its end: the API server is shared)."""
    cp = kubelet_node.cp
    assert kubelet_node.dir is not None
    manifests.apply(cp, manifests.docs(manifests.WEBHOOK_RBAC))
    (kubelet_node.dir / "webhook").mkdir()
    hook = WebhookProcess(cp, kubelet_node.dir / "webhook", user=WEBHOOK_USER)
    try:
        hook.start()
        manifests.apply(cp, manifests.webhook_configurations_by_url(hook.url, hook.ca_pem))
        yield hook
    finally:
        cp.kubectl("delete", "--ignore-not-found", "mutatingwebhookconfiguration/numapin",
                   "validatingwebhookconfiguration/numapin", check=False)
        hook.stop()


def _free_cpus(pods: Pods) -> int | None:
    """The node's NodeResourceTopology as published: the CPUs its zones have available."""
    r = pods.cp.kubectl("get", "noderesourcetopologies", pods.node.name, "-o", "json", check=False)
    if r.returncode != 0:
        return None
    nrt: dict[str, Any] = json.loads(r.stdout)
    return sum(int(res["available"]) for zone in nrt.get("zones", []) for res in zone.get("resources", [])
               if res["name"] == "cpu")


def test_a_pod_gets_its_intent_at_admission_and_the_published_topology_follows(webhook: WebhookProcess,
                                                                                pods: Pods) -> None:
    wait_for(lambda: _free_cpus(pods) == 1, "the node's topology published with CPU 1 available")
    g = pods.create(pods.manifest("adm-g", cpu="1", cpu_limit="1"))
    assert "numapin.io/cpu-intent" in g["metadata"]["annotations"], g["metadata"]
    assert pods.cpus(g) == CPUSet.parse("1"), pods.kernel(g)
    wait_for(lambda: _free_cpus(pods) == 0, "the published topology without CPU 1")


def test_a_pod_no_node_can_hold_is_denied_at_admission(webhook: WebhookProcess, pods: Pods) -> None:
    manifest = pods.manifest("adm-too-big", cpu="2", cpu_limit="2")
    r = pods.cp.kubectl("create", "--validate=false", "-f", "-", input=json.dumps(manifest), check=False)
    assert r.returncode != 0
    assert ('admission webhook "validate.pods.numapin.io" denied the request: no known node can ever admit pod '
            "default/adm-too-big") in r.stderr, r.stderr
    assert "the largest NUMA node (node-0) has 1 allocatable CPUs" in r.stderr, r.stderr  # from the published NRT
    assert pods.cp.kubectl("get", "pod", "adm-too-big", check=False).returncode != 0



def _events(cp: ControlPlane, uid: str) -> list[dict[str, Any]]:
    r = cp.kubectl("get", "events", "--field-selector", f"involvedObject.uid={uid}", "-o", "json")
    return list(json.loads(r.stdout)["items"])


def _denials(events: list[dict[str, Any]]) -> list[str]:
    """The scheduler's messages of the bindings the API server refused (with each event's repeat count)."""
    return [e["message"] for e in events if e["reason"] == "FailedScheduling"
            for _ in range((e.get("series") or {}).get("count", 1))]


def _first_answer(cp: ControlPlane, name: str) -> tuple[dict[str, Any], list[str]] | None:
    """The pod once it is bound or once a binding of it was refused: the pod and the refusals so far."""
    pod: dict[str, Any] = json.loads(cp.kubectl("get", "pod", name, "-o", "json").stdout)
    denials = _denials(_events(cp, pod["metadata"]["uid"]))
    return (pod, denials) if pod["spec"].get("nodeName") or denials else None


BIND_TRIES = 20


def _split_and_roomy(prefix: str, pool: dict[str, str]) -> tuple[ApiNode, ApiNode]:
    """Two API-only nodes, 112-CPU Xeon Gold 6258R, CPU 0 reserved, single-numa-node, equal for the scheduler:
    ``<prefix>-split`` with 3 free CPUs on each NUMA node, ``<prefix>-roomy`` with all free."""
    topo = xeon_gold_6258r()
    reserved = CPUSet.parse("0")
    numa0, numa1 = (topo.cpus_in_numa(n) - reserved for n in (0, 1))
    free = CPUSet.parse(",".join(map(str, numa0.sorted()[:3] + numa1.sorted()[:3])))
    return (ApiNode(f"{prefix}-split", topo, free, reserved, pool),
            ApiNode(f"{prefix}-roomy", topo, topo.all_cpus - reserved, reserved, pool))


def _create_known(pods: Pods, pool: dict[str, str], *nodes: ApiNode) -> None:
    """The nodes created, once the webhook knows them (labels and topology): a pod too big for any NUMA node of them
    is denied naming them all as candidates; before that, a binding to one would not be judged (allowed with a
    warning), nor would the filter judge it."""
    cp = pods.cp
    api_nodes.create(cp, *nodes)
    probe = pods.manifest("probe", cpu="60", cpu_limit="60")
    probe["spec"]["nodeSelector"] = pool
    wait_for(lambda: f"({len(nodes)} candidate node(s))" in cp.kubectl(
        "create", "--dry-run=server", "--validate=false", "-f", "-", input=json.dumps(probe),
        check=False).stderr, "the webhook knowing the nodes")


def test_a_binding_to_a_node_that_cannot_hold_the_pod_is_denied_and_retried_until_it_lands_where_it_fits(
        webhook: WebhookProcess, pods: Pods) -> None:
    """Two nodes the real kube-scheduler v1.36.2 sees as equal (same labels but the hostname, same capacity and
    allocatable, no pods), API objects only (no kubelet; the NodeResourceTopology of each is the document numapin's
    node agent publishes for the 112-CPU Xeon Gold 6258R, two NUMA nodes of 56, CPU 0 reserved, topology manager
    policy single-numa-node): ``lab-bind-split`` has 3 free CPUs on each NUMA node, ``lab-bind-roomy`` all of them.
    A Guaranteed pod of 4 CPUs fits either by the scheduler's counts; under single-numa-node only roomy can hold it.

    How kube-scheduler v1.36 picks among equal scores: not at random. ``schedulePod`` pops the best of a heap ordered
    by score, then by a ``Randomizer`` that only nodes scored by an extender get (kubernetes#135231; #141024 would
    give it to every node); without extenders equal nodes come out in the order the filters found them feasible:
    its node list's order (split was created first), starting at ``nextStartNodeIndex``, which does not move when
    every node is evaluated, unless the parallel filter goroutines finish out of order (here the first such race came
    after 14 and after 22 refused retries, 1 s apart). So the first binding goes to split (denied), and so does
    every retry after the back-off (1 s here, numapin_lab.k8s.scheduler): numapin's denial alone does not move the
    pod while the nodes stay equal. A pod
    whose first binding went straight to roomy (a goroutine race) shows no denial: it is deleted (roomy is empty
    again) and another made, up to 20; were the race a fair coin (it is far rarer), the story would fail by chance
    with probability 2^-20. Once the pod was refused twice (the scheduler retried), split gets what any node with
    its CPUs split over NUMA nodes has: a pod running there (Burstable, 8 CPUs requested, bound by name). Now
    split scores lower (NodeResourcesFit's least-allocated 94 against 97, balanced allocation 94 against 98) and
    the next retry binds the pod to roomy: no chance left in it."""
    cp = pods.cp
    pool = {"numapin.io/lab-pool": "binding-story"}
    split, roomy = _split_and_roomy("lab-bind", pool)
    made: list[str] = []
    try:
        _create_known(pods, pool, split, roomy)
        for i in range(BIND_TRIES):
            name = f"bind-{i}"
            manifest = pods.manifest(name, cpu="4", cpu_limit="4")
            manifest["spec"]["nodeSelector"] = pool
            made.append(name)
            cp.kubectl("create", "--validate=false", "-f", "-", input=json.dumps(manifest))
            pod, denials = wait_for(lambda n=name: _first_answer(cp, n),  # type: ignore[misc]
                                    f"pod {name} bound or its binding refused")
            if denials:
                break
            assert pod["spec"]["nodeName"] == roomy.name, pod["spec"]
            cp.kubectl("delete", "pod", name, "--grace-period=0", "--force")
        else:
            raise AssertionError(f"{BIND_TRIES} pods were all bound to {roomy.name} at their first try")
        uid = pod["metadata"]["uid"]
        denied = (f'admission webhook "validate.bindings.numapin.io" denied the request: node {split.name} would '
                  f"reject pod default/{name} (TopologyAffinityError: ")
        assert denied in denials[0], denials
        assert "topology manager policy single-numa-node, scope container, free CPUs per NUMA node: node-0=3, " \
               "node-1=3" in denials[0], denials[0]
        condition = next(c for c in pods.get(name)["status"]["conditions"] if c["type"] == "PodScheduled")
        assert condition["status"] == "False" and denied in condition["message"], condition  # what kubectl shows
        wait_for(lambda: len(_denials(_events(cp, uid))) >= 2 or _bound(cp, name), "the scheduler's retry")

        load = pods.manifest("bind-split-load", cpu="8")
        del load["spec"]["nodeSelector"]
        load["spec"]["nodeName"] = split.name
        made.append("bind-split-load")
        cp.kubectl("create", "--validate=false", "-f", "-", input=json.dumps(load))
        bound = wait_for(lambda: _bound(cp, name), f"pod {name} bound")
        assert bound["spec"]["nodeName"] == roomy.name, bound["spec"]
        events = _events(cp, uid)
        assert all(denied in m for m in _denials(events)), events  # every refusal was split's, none roomy's
        assert [e["message"] for e in events if e["reason"] == "Scheduled"] == [
            f"Successfully assigned default/{name} to {roomy.name}"], events
        condition = next(c for c in bound["status"]["conditions"] if c["type"] == "PodScheduled")
        assert condition["status"] == "True", condition
    finally:
        if made:
            cp.kubectl("delete", "pod", "--ignore-not-found", "--grace-period=0", "--force", *made, check=False)
        api_nodes.delete(cp, split.name, roomy.name)


def _bound(cp: ControlPlane, name: str) -> dict[str, Any] | None:
    pod: dict[str, Any] = json.loads(cp.kubectl("get", "pod", name, "-o", "json").stdout)
    return pod if pod["spec"].get("nodeName") else None


def _unbound_refusals(cp: ControlPlane, name: str) -> list[str] | None:
    pod: dict[str, Any] = json.loads(cp.kubectl("get", "pod", name, "-o", "json").stdout)
    assert not pod["spec"].get("nodeName"), pod["spec"]
    return _denials(_events(cp, pod["metadata"]["uid"])) or None


def test_with_numapin_as_the_schedulers_extender_a_pod_is_bound_where_it_fits_at_the_first_attempt(
        webhook: WebhookProcess, pods: Pods) -> None:
    """A second kube-scheduler v1.36.2 (``schedulerName: numapin-extender``) with numapin's webhook as its extender
    filter as manifests/scheduler/ configures it (nodeCacheCapable, ignorable, the webhook's CA), and a third whose
    extender is down (a port nothing listens on). The API-only nodes of the binding story: ``lab-ext-split`` (3 free
    CPUs on each NUMA node) first, ``lab-ext-roomy`` (all free), equal for the scheduler. A Guaranteed pod of 4 CPUs
    under single-numa-node: bound to roomy at the first attempt, no binding refused (without the extender the
    scheduler binds such a pod to split first, again and again: the story above). A pod only split may hold by the
    scheduler's own filters: Pending, with numapin's reason in its FailedScheduling event and preemption not tried
    (unresolvable). With the extender down the other scheduler still binds its pod."""
    cp = pods.cp
    assert pods.node.dir is not None
    pool = {"numapin.io/lab-pool": "extender-story"}
    split, roomy = _split_and_roomy("lab-ext", pool)
    ca = webhook.certs / "ca.crt"
    up = Scheduler(cp, pods.node.dir / "scheduler-numapin-extender", scheduler_name="numapin-extender",
                   extenders=[manifests.scheduler_extender_by_url(webhook.url, ca)])
    down = Scheduler(cp, pods.node.dir / "scheduler-numapin-extender-down", scheduler_name="numapin-extender-down",
                     extenders=[manifests.scheduler_extender_by_url(f"https://127.0.0.1:{free_port()}", ca)])
    made: list[str] = []

    def create(name: str, scheduler: str, selector: dict[str, str]) -> None:
        manifest = pods.manifest(name, cpu="4", cpu_limit="4")
        manifest["spec"] |= {"nodeSelector": selector, "schedulerName": scheduler}
        made.append(name)
        cp.kubectl("create", "--validate=false", "-f", "-", input=json.dumps(manifest))

    try:
        for s in (up, down):
            s.dir.mkdir()
            s.start(settle=0.5)
        _create_known(pods, pool, split, roomy)

        create("ext-fit", "numapin-extender", pool)
        bound = wait_for(lambda: _bound(cp, "ext-fit"), "pod ext-fit bound")
        assert bound["spec"]["nodeName"] == roomy.name, bound["spec"]
        events = _events(cp, bound["metadata"]["uid"])
        assert [(e["reason"], e["message"]) for e in events] == [
            ("Scheduled", f"Successfully assigned default/ext-fit to {roomy.name}")], events  # no refusal

        create("ext-split-only", "numapin-extender", {"kubernetes.io/hostname": split.name})
        refusals = wait_for(lambda: _unbound_refusals(cp, "ext-split-only"), "pod ext-split-only refused")
        reason = (f"numapin: node {split.name} would reject pod default/ext-split-only (TopologyAffinityError: ")
        assert reason in refusals[0] and "free CPUs per NUMA node: node-0=3, node-1=3" in refusals[0], refusals
        # unresolvable: preemption sought no victims on any node (on split neither: "No preemption victims found")
        assert re.search(r"preemption: 0/(\d+) nodes are available: \1 Preemption is not helpful for scheduling\.",
                         refusals[0]), refusals

        create("ext-down", "numapin-extender-down", {"kubernetes.io/hostname": roomy.name})
        bound = wait_for(lambda: _bound(cp, "ext-down"), "pod ext-down bound with the extender down")
        assert bound["spec"]["nodeName"] == roomy.name, bound["spec"]
        assert "Skipping extender as it returned error and has ignorable flag set" in down.log.read_text()
    finally:
        if made:
            cp.kubectl("delete", "pod", "--ignore-not-found", "--grace-period=0", "--force", *made, check=False)
        for s in (up, down):
            s.stop()
        api_nodes.delete(cp, split.name, roomy.name)
