"""The node agent's answers put on the wire: a container's resources (``TargetResources``) set in the CRI message
the proxy forwards, every other byte kept; and the container id of a ``StartContainer``/``ContainerStatus``
request read without decoding the message."""

from __future__ import annotations

from criproxy.relay import wire
from criproxy.relay.cri_api import CPU_QUOTA, CPUSET_CPUS, CPUSET_MEMS, UNLIMITED_QUOTA
from nodeagent.decisions.target import TargetResources

__all__ = ["container_id_of", "with_resources"]


def with_resources(message: bytes, path: tuple[int, ...], target: TargetResources) -> bytes:
    """``message`` with the ``LinuxContainerResources`` at ``path`` carrying ``target``'s cpuset (and, when it lifts
    the quota, no CFS quota)."""
    updates = {CPUSET_CPUS: wire.encode_string(CPUSET_CPUS, str(target.cpus))}
    if target.mems is not None:
        updates[CPUSET_MEMS] = wire.encode_string(CPUSET_MEMS, str(target.mems))
    if target.lift_quota:
        updates[CPU_QUOTA] = wire.encode_int64(CPU_QUOTA, UNLIMITED_QUOTA)
    return wire.set_fields(message, path, updates)


def container_id_of(request: bytes) -> str:
    """``container_id`` (field 1) of a ``StartContainerRequest`` or ``ContainerStatusRequest``."""
    for f in wire.fields(request):
        if f.number == 1 and f.wire_type == 2:
            try:
                return request[f.value_start:f.end].decode()
            except UnicodeDecodeError:
                raise wire.WireError("container_id is not UTF-8") from None
    return ""
