"""Memory resource names as Kubernetes spells them: ``memory`` and ``hugepages-<size>`` (``hugepages-2Mi``,
``hugepages-1Gi``), with the page size in bytes both ways.

A huge-page resource name carries the page size as a binary-SI quantity in its canonical form (the largest unit
that divides the size exactly: 2048 kB -> ``2Mi``, 1048576 kB -> ``1Gi``, 64 kB -> ``64Ki``), as kubelet names the
sizes it finds in sysfs."""

from __future__ import annotations

from ..errors import ConfigError

__all__ = ["HUGEPAGES_PREFIX", "MEMORY", "hugepage_resource", "hugepage_size", "is_hugepages", "is_memory_resource",
           "resource_order"]

MEMORY = "memory"
HUGEPAGES_PREFIX = "hugepages-"
_UNITS = (("Ei", 1 << 60), ("Pi", 1 << 50), ("Ti", 1 << 40), ("Gi", 1 << 30), ("Mi", 1 << 20), ("Ki", 1 << 10))


def hugepage_resource(page_size: int) -> str:
    """The resource name of huge pages of ``page_size`` bytes (``2097152`` -> ``hugepages-2Mi``)."""
    if page_size <= 0:
        raise ConfigError(f"huge page size must be positive, got {page_size}")
    for unit, scale in _UNITS:
        if page_size % scale == 0:
            return f"{HUGEPAGES_PREFIX}{page_size // scale}{unit}"
    return f"{HUGEPAGES_PREFIX}{page_size}"


def is_hugepages(name: str) -> bool:
    return name.startswith(HUGEPAGES_PREFIX)


def is_memory_resource(name: str) -> bool:
    """``memory`` or a huge-page size: what the Memory Manager accounts."""
    return name == MEMORY or is_hugepages(name)


def hugepage_size(name: str) -> int:
    """The page size in bytes a ``hugepages-<size>`` name stands for; ConfigError if it is not one."""
    if not is_hugepages(name):
        raise ConfigError(f"{name!r} is not a huge-page resource (hugepages-<size>, e.g. hugepages-2Mi)")
    text = name[len(HUGEPAGES_PREFIX):]
    for unit, scale in _UNITS:
        if text.endswith(unit) and text[:-len(unit)].isdigit():
            return int(text[:-len(unit)]) * scale
    if text.isdigit() and int(text) > 0:
        return int(text)
    raise ConfigError(f"{name!r}: the page size {text!r} is not a binary-SI quantity such as 2Mi or 1Gi")


def resource_order(name: str) -> tuple[int, int | str]:
    """A stable order for output: ``memory`` first, then huge-page sizes ascending."""
    if name == MEMORY:
        return (0, 0)
    try:
        return (1, hugepage_size(name))
    except ConfigError:
        return (2, name)
