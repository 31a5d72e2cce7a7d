"""The start-up check: is the runtime that configured us one numapin can work with? Its NRI must be one whose wire
and semantics numapin was checked against (shared/reference/nri.md §1): containerd 1.7.16 and later vendor NRI
v0.6.1 or newer (1.7.0-1.7.15 carry v0.3.0-v0.6.0, whose events and update semantics were not checked). A runtime
numapin has no table entry for (CRI-O) is taken as it is."""

from __future__ import annotations

import re
from collections.abc import Mapping
from types import MappingProxyType

from .handler import RuntimeInfo

__all__ = ["MINIMUM_VERSIONS", "UnsupportedRuntime", "check_runtime", "parse_version"]

MINIMUM_VERSIONS: Mapping[str, tuple[int, ...]] = MappingProxyType({"containerd": (1, 7, 16)})


class UnsupportedRuntime(Exception):
    """The runtime lacks something numapin needs: the plugin refuses its Configure and does not retry."""


def parse_version(text: str) -> tuple[int, ...] | None:
    """``1.7.24~ds1`` -> (1, 7, 24); ``v2.1.9`` -> (2, 1, 9); None when it starts with no number."""
    m = re.match(r"v?(\d+(?:\.\d+)*)", text.strip())
    return tuple(int(p) for p in m.group(1).split(".")) if m else None


def check_runtime(info: RuntimeInfo, minimum: Mapping[str, tuple[int, ...]] = MINIMUM_VERSIONS) -> None:
    """Raise ``UnsupportedRuntime`` (naming the runtime, its version and what is missing) when ``info`` is not
    enough."""
    if not info.name:
        raise UnsupportedRuntime(f"the NRI runtime (version {info.version!r}) did not say its name in Configure")
    need = minimum.get(info.name)
    if need is None:
        return
    have = parse_version(info.version)
    wanted = ".".join(map(str, need))
    if have is None:
        raise UnsupportedRuntime(f"{info.name} {info.version!r}: its version is not a version number; numapin's NRI "
                                 f"plugin needs {info.name} >= {wanted}")
    if have < need:
        raise UnsupportedRuntime(f"{info.name} {info.version} lacks the NRI numapin needs: {info.name} >= {wanted} "
                                 f"(NRI v0.6.1 or newer: the oldest NRI whose protocol numapin was checked against)")
