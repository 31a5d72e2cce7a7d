"""A container's size as kubelet's CFS values state it: the pod after an in-place resize.

kubelet tells the runtime a container's CPU only as CFS values (``cpu_shares`` from the request, ``cpu_quota`` over
``cpu_period`` from the limit; nodeagent.node.cfs has its conversions), on ``UpdateContainerResources`` (a resize) and
on ``CreateContainer`` (a container created again after a resize carries the new size, while the pod's
``numapin.io/cpu-intent`` annotation, stamped at creation, still states the old one). ``resized_container`` turns
those values into the container's new request and limit: the limit is exact from the quota (kubelet's quota is
``limit * period / 1000``); the request comes from the shares, which must agree with it for a Guaranteed container
(its QoS class cannot change on a resize). ``with_cri_size`` puts the result into the pod model.
"""

from __future__ import annotations

from dataclasses import replace

from allocator.errors import PodSpecError
from allocator.pod import ContainerInfo, PodInfo, QOSClass
from nodeagent.node.cfs import (
    QUOTA_PERIOD,
    milli_cpu_to_quota,
    milli_cpu_to_shares,
    quota_to_milli_cpu,
    shares_to_milli_cpu,
)
from protos import cri_pb2

__all__ = ["carries_cpu", "cfs_summary", "resized_container", "with_cri_size"]


def carries_cpu(linux: cri_pb2.LinuxContainerResources) -> bool:
    """Whether kubelet stated a CPU size at all (a call with neither shares nor quota changes no CPU)."""
    return bool(linux.cpu_shares > 0 or linux.cpu_quota != 0)


def cfs_summary(linux: cri_pb2.LinuxContainerResources) -> str:
    return f"cpu_shares={linux.cpu_shares} cpu_quota={linux.cpu_quota} cpu_period={linux.cpu_period}"


def resized_container(c: ContainerInfo, linux: cri_pb2.LinuxContainerResources, qos: QOSClass) -> ContainerInfo:
    """``c`` with the CPU request and limit kubelet's CFS values state (and the memory limit, when sent). A value
    that maps to what ``c`` already states keeps ``c``'s exact number (shares lose precision). Raises PodSpecError
    when the values cannot be a resize of a ``qos`` container."""
    period = linux.cpu_period or QUOTA_PERIOD
    quota = linux.cpu_quota
    if quota > 0:
        same = c.cpu_limit_milli is not None and milli_cpu_to_quota(c.cpu_limit_milli, period) == quota
        limit = c.cpu_limit_milli if same else quota_to_milli_cpu(quota, period)
    elif quota < 0:
        limit = None  # -1: no limit (never sent by kubelet with cpuManagerPolicy none)
    else:
        limit = c.cpu_limit_milli if linux.cpu_shares == 0 else None  # no CPU field, or a Burstable without limit
    shares = linux.cpu_shares
    if qos == "Guaranteed":
        if limit is None:
            raise PodSpecError(f"container {c.name!r} of a Guaranteed pod is given no CPU limit "
                               f"({cfs_summary(linux)}); a resize cannot change a pod's QoS class")
        if shares and milli_cpu_to_shares(limit) != shares:
            raise PodSpecError(
                f"container {c.name!r} of a Guaranteed pod: cpu_shares {shares} (a request of about "
                f"{shares_to_milli_cpu(shares)}m) disagrees with the CPU limit {limit}m the quota states "
                f"({cfs_summary(linux)}); a Guaranteed container's request is its limit")
        request: int | None = limit
    elif qos == "BestEffort":
        request = None
    elif shares:
        same = c.cpu_request_milli is not None and milli_cpu_to_shares(c.cpu_request_milli) == shares
        request = c.cpu_request_milli if same else (shares_to_milli_cpu(shares) or None)
    else:
        request = c.cpu_request_milli
    memory = linux.memory_limit_in_bytes or c.memory_limit
    return replace(c, cpu_request_milli=request, cpu_limit_milli=limit, memory_limit=memory,
                   memory_request=memory if qos == "Guaranteed" else c.memory_request)


def with_cri_size(pod: PodInfo, name: str, linux: cri_pb2.LinuxContainerResources) -> PodInfo:
    """``pod`` with container ``name`` sized by kubelet's CFS values (unchanged when they state no CPU). Raises
    PodSpecError (the pod has no such container, or the values cannot be a resize of it)."""
    if not carries_cpu(linux):
        return pod
    new = resized_container(pod.container(name), linux, pod.qos_class)
    return replace(pod, containers=tuple(new if c.name == name else c for c in pod.containers))
