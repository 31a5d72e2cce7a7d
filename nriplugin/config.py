"""The NRI plugin's configuration: the node agent's settings (``nodeagent.config.AgentConfig``: the same policy
flags, state directory, NRT, pod watch, control socket, /status and /metrics as the CRI proxy) and the plugin's own
(the runtime's NRI socket, the plugin's name and index, containerd's CRI socket for reads): command-line flags over
a YAML/JSON config file over defaults. Every problem is a ``ConfigError`` naming the flag or key."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from allocator.errors import ConfigError
from nodeagent.config import AgentConfig, coerce_setting, load_settings

__all__ = ["DEFAULTS", "NriConfig", "load_config"]


@dataclass(frozen=True)
class NriConfig(AgentConfig):
    nri_socket: str = "/var/run/nri/nri.sock"
    plugin_name: str = "numapin"
    plugin_index: str = "90"      # two digits: containerd calls plugins in ascending order
    # containerd's CRI socket: the plugin's reads (lists, statuses; never a write: those ride in NRI's answers)
    runtime_endpoint: str = "unix:///run/containerd/containerd.sock"
    # containerd keeps which pods and containers it told plugins of in memory only: after it restarts, a pod that
    # existed before is stopped and removed without an NRI event, and so is an exited container; the reconcile with
    # its lists gives their CPUs back
    reconcile_period: float = 10.0

    @property
    def listen(self) -> str:
        """Where the runtime reaches numapin (shown by /status)."""
        return f"nri:{self.nri_socket}"


DEFAULTS = NriConfig()


def _coerce(name: str, value: Any) -> Any:
    where = name.replace("_", "-")
    if name == "plugin_index":
        text = str(value)
        if not re.fullmatch(r"[0-9]{2}", text):
            raise ConfigError(f"{where}: NRI needs exactly two digits (00-99), got {value!r}")
        return text
    if name == "plugin_name":
        text = str(value)
        if not text or any(c.isspace() or c == "/" for c in text):
            raise ConfigError(f"{where}: a non-empty name without spaces or '/', got {value!r}")
        return text
    if name in ("nri_socket", "runtime_endpoint"):
        text = str(value)
        if not text.removeprefix("unix://").removeprefix("unix:").startswith("/"):
            raise ConfigError(f"{where}: an absolute unix socket path, got {value!r}")
        return text
    if name == "cpuset_writes" and value == "runtime":
        raise ConfigError(f"{where}: runtime is not available to the NRI plugin: containerd applies a plugin's "
                          "updates only with its answers to events, so running containers' cpusets are written in "
                          "the kernel (kernel, the default)")
    return coerce_setting(name, value)


def load_config(file: str | None, overrides: Mapping[str, Any]) -> NriConfig:
    """Defaults <- ``file`` (YAML or JSON mapping, keys as flags) <- ``overrides`` (flags given; None = not
    given)."""
    return load_settings(NriConfig, file, overrides, _coerce)
