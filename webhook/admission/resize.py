"""``/validate`` for ``pods/resize`` (UPDATE): an in-place resize judged on the pod's node.

kube-apiserver sends the resize subresource's review (resource ``pods``, subResource ``resize``) with the whole pod
before and after; only container resources (and resize policies) differ. A pod bound to a node whose
NodeResourceTopology is known is judged there, under that node's topology manager policy and options:

- **never**: the pod after the resize could not be admitted on that node even empty (a container asking more CPUs of
  its own than a NUMA node has under ``single-numa-node``, an odd count under ``full-pcpus-only``, more than the node
  has): denied, naming the node, its policy, the container and its sizes before and after, and kubelet's reason;
- **not now**: the CPUs the resize adds (the pod's count of CPUs of its own after, less before) could not be found
  among the node's free CPUs today under its policy: allowed with a warning (the node's proxy refuses the resize,
  kubelet shows that on the pod and retries on its next syncs, so it goes through once CPUs free up).

A pod not bound, on a node without a published topology, or whose count of CPUs of its own does not grow, is not
judged further. The intent annotation is not re-stamped here: kube-apiserver keeps every metadata change out of a
resize (its resize strategy resets the metadata to the old pod's), so a mutation could not stick; the proxy takes
the new size from kubelet's calls instead, and the next ordinary UPDATE of the pod re-stamps it (``/mutate``). See
docs/resize.md.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import replace

from allocator.errors import PodSpecError
from allocator.pod import ContainerInfo, PodInfo, guaranteed_cpus
from webhook.admission.review import AdmissionRequest, Verdict
from webhook.admission.simulate import Simulator
from webhook.cluster.nodes import NodeStore

__all__ = ["ResizeValidator", "is_resize_request"]

log = logging.getLogger("numapin.webhook.resize")


def is_resize_request(req: AdmissionRequest) -> bool:
    return req.group == "" and req.resource == "pods" and req.sub_resource == "resize"


def _sizes(before: PodInfo, after: PodInfo) -> list[tuple[str, int, int]]:
    """(container, CPUs of its own before, after) for each container whose count changes."""
    out = []
    for c in after.containers:
        old = next((o for o in before.containers if o.name == c.name), None)
        n0 = guaranteed_cpus(before, old) if old is not None else 0
        n1 = guaranteed_cpus(after, c)
        if n0 != n1:
            out.append((c.name, n0, n1))
    return out


def _cpu(c: ContainerInfo) -> str:
    return f"{c.cpu_limit_milli}m" if c.cpu_limit_milli is not None else "no limit"


class ResizeValidator:
    def __init__(self, nodes: NodeStore, simulator: Simulator) -> None:
        self.nodes = nodes
        self.simulator = simulator

    async def validate(self, req: AdmissionRequest) -> Verdict:
        if req.operation != "UPDATE" or not isinstance(req.object, Mapping) or not isinstance(req.old_object, Mapping):
            return Verdict.allow()
        try:
            after = self.simulator.gated(PodInfo.from_pod(req.object))
            before = self.simulator.gated(PodInfo.from_pod(req.old_object))
        except PodSpecError as e:
            log.info("validate: resize of %s not judged (%s); allowed", req.describe(), e)
            return Verdict.allow(f"numapin: resize not checked: {e}")
        after = replace(after, namespace=after.namespace or req.namespace, name=after.name or req.name)
        sizes = _sizes(before, after)
        spec = req.object.get("spec")
        node_name = spec.get("nodeName") if isinstance(spec, Mapping) else None
        node = self.nodes.get(node_name) if isinstance(node_name, str) and node_name else None
        if not sizes or after.bypass or node is None:
            return Verdict.allow()
        change = ", ".join(
            f'container "{n}" {_size(n0)} -> {_size(n1)} (CPU {_cpu(before.container(n))} -> '
            f'{_cpu(after.container(n))})' for n, n0, n1 in sizes)
        policy = (f"topology manager policy {node.topology_manager_policy} (scope {node.topology_manager_scope}"
                  + (", cpuManagerPolicyOptions " + ", ".join(f"{k}={v}" for k, v in
                                                               sorted(node.cpu_manager_policy_options.items()))
                     if node.cpu_manager_policy_options else "") + ")")
        ever = await asyncio.to_thread(self.simulator.admit, node, after, occupied=False)
        if not ever.admitted:
            z = node.largest_numa
            numa = (f"its largest NUMA node (node-{z.numa}) has {z.allocatable} allocatable CPUs" if z is not None
                    else "it has no NUMA node with CPUs")
            why = f"{ever.reason}: {ever.message}" if ever.reason else ever.message
            return Verdict.deny(
                f"pod {after.ref}: resize ({change}) can never be satisfied on its node {node.name} under {policy}: "
                f"{numa}; kubelet would reject it ({why})", reason="Forbidden")
        grow = sum(n1 - n0 for _, n0, n1 in sizes)
        if grow > 0:
            extra = _growth_pod(after, grow)
            now = await asyncio.to_thread(self.simulator.admit, node, extra, occupied=True)
            if not now.admitted:
                return Verdict.allow(
                    f"numapin: node {node.name} cannot give pod {after.ref} {grow} more CPU(s) of its own right now "
                    f"(topology manager policy {node.topology_manager_policy}: {now.reason or 'refused'}): its proxy "
                    "refuses the resize, the pod shows PodResizeInProgress (Error) and kubelet retries until CPUs "
                    "free up")
        return Verdict.allow()


def _size(n: int) -> str:
    return f"{n} CPU(s) of its own" if n else "the shared pool"


def _growth_pod(pod: PodInfo, grow: int) -> PodInfo:
    """A stand-in asking only the CPUs a growth adds (the pod's own stay where they are), for the node's free CPUs."""
    milli = grow * 1000
    c = ContainerInfo(name="growth", role="app", cpu_request_milli=milli, cpu_limit_milli=milli)
    return replace(pod, uid=f"{pod.uid}-growth", qos_class="Guaranteed", containers=(c,))
