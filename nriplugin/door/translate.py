"""NRI's pods, containers and resources in the CRI terms the node agent decides on, and back.

The core (``nodeagent``) reads CRI messages (``protos.cri_pb2``): what kubelet sends the CRI proxy. containerd builds
the NRI messages from the same CRI request (nri.md §4.3: the pod's metadata and annotations come from the sandbox's
CRI config, the container's resources from its OCI spec as built from kubelet's request), so the translation is
field for field:

- the pod: uid, namespace, name and annotations (kubelet's pod annotations, with containerd's own ``io.kubernetes.cri``
  keys merged in: numapin reads only its own keys), and the cgroup parent (kubelet's QoS class);
- the container: its name, annotations (kubelet's ``io.kubernetes.container.type`` names an init container),
  resources (shares, quota, period, memory limit, huge pages, the cpuset already in its spec) and devices (NRI's
  ``LinuxDevice`` is the OCI spec's: the path *inside* the container and the host device's numbers; CRI's device
  needs the host path, which the door finds from the numbers, ``host_paths``: a device plugin may mount a host
  device anywhere in the container);
- an in-place resize: NRI's requested resources with zero for "not set", as CRI has them.

Back: a container's cpuset (and no CFS quota for a pinned one) as NRI's ``LinuxResources``; an absent Optional field
leaves the runtime's value alone and an empty cpus/mems string means "unchanged" (nri.md §4.3)."""

from __future__ import annotations

from collections.abc import Mapping

from protos import cri_pb2, nri_pb2

__all__ = [
    "DeviceKey",
    "container_resources",
    "create_request",
    "device_key",
    "nri_resources",
    "resize_request",
    "sandbox_of",
]


DeviceKey = tuple[str, int, int]  # an OCI device's type, major and minor number: the host device it is


def device_key(d: nri_pb2.LinuxDevice) -> DeviceKey:
    return d.type, d.major, d.minor


def container_resources(r: nri_pb2.LinuxResources) -> cri_pb2.LinuxContainerResources:
    """NRI's resources as CRI's (an absent value is CRI's zero: "not set")."""
    out = cri_pb2.LinuxContainerResources()
    if r.HasField("cpu"):
        cpu = r.cpu
        if cpu.HasField("shares"):
            out.cpu_shares = int(cpu.shares.value)
        if cpu.HasField("quota"):
            out.cpu_quota = cpu.quota.value
        if cpu.HasField("period"):
            out.cpu_period = int(cpu.period.value)
        out.cpuset_cpus = cpu.cpus
        out.cpuset_mems = cpu.mems
    if r.HasField("memory") and r.memory.HasField("limit"):
        out.memory_limit_in_bytes = r.memory.limit.value
    for h in r.hugepage_limits:
        out.hugepage_limits.add(page_size=h.page_size, limit=h.limit)
    return out


def sandbox_of(pod: nri_pb2.PodSandbox) -> cri_pb2.PodSandboxConfig:
    """The sandbox's CRI configuration as far as numapin reads it."""
    config = cri_pb2.PodSandboxConfig(
        metadata=cri_pb2.PodSandboxMetadata(name=pod.name, uid=pod.uid, namespace=pod.namespace),
        linux=cri_pb2.LinuxPodSandboxConfig(cgroup_parent=pod.linux.cgroup_parent),
    )
    config.labels.update(pod.labels)
    config.annotations.update(pod.annotations)
    return config


def create_request(pod: nri_pb2.PodSandbox, container: nri_pb2.Container,
                   host_paths: Mapping[DeviceKey, str] | None = None) -> cri_pb2.CreateContainerRequest:
    """The CreateContainer kubelet sent, as NRI hands it to a plugin. ``host_paths``: each device's host path by its
    numbers (a device without one is left out: no hint from it)."""
    req = cri_pb2.CreateContainerRequest(pod_sandbox_id=container.pod_sandbox_id or pod.id,
                                         sandbox_config=sandbox_of(pod))
    config = req.config
    config.metadata.name = container.name
    config.labels.update(container.labels)
    config.annotations.update(container.annotations)
    config.linux.resources.CopyFrom(container_resources(container.linux.resources))
    hosts = host_paths or {}
    for d in container.linux.devices:
        host = hosts.get(device_key(d))
        if d.path and host:
            config.devices.add(container_path=d.path, host_path=host)
    return req


def resize_request(request: nri_pb2.UpdateContainerRequest) -> cri_pb2.UpdateContainerResourcesRequest:
    """kubelet's UpdateContainerResources (an in-place resize) as NRI relays it."""
    return cri_pb2.UpdateContainerResourcesRequest(container_id=request.container.id,
                                                   linux=container_resources(request.linux_resources))


def nri_resources(cpus: str, mems: str, quota: int | None = None) -> nri_pb2.LinuxResources:
    """A cpuset (and a CFS quota, None: unchanged) as NRI's resources."""
    out = nri_pb2.LinuxResources()
    out.cpu.cpus = cpus
    out.cpu.mems = mems
    if quota is not None:
        out.cpu.quota.value = quota
    return out
