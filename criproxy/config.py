"""The proxy's configuration: the node agent's settings (``nodeagent.config.AgentConfig``) and the proxy's own
(its socket, the runtime's, how calls are relayed): command-line flags over a YAML/JSON config file over defaults.

Every problem is a ``ConfigError`` whose message names the flag or key; the CLI exits 2 with it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from allocator.errors import ConfigError
from nodeagent.config import AgentConfig, coerce_count, coerce_seconds, coerce_setting, load_settings, parse_options

__all__ = ["DEFAULTS", "ProxyConfig", "load_config", "parse_options"]


@dataclass(frozen=True)
class ProxyConfig(AgentConfig):
    listen: str = "/var/run/numapin/criproxy.sock"
    runtime_endpoint: str = "unix:///run/containerd/containerd.sock"
    relay: str = "frames"         # how calls are relayed: "frames" (HTTP/2 frames) or "grpc" (a gRPC server)
    max_connections: int = 0      # clients the frame relay serves at once (two descriptors each); 0: as the
    #                               descriptors allow (criproxy.relay.conn_limits)
    connection_idle_timeout: float = 600.0  # seconds without a call or a byte before a client is asked to go; 0 never

    def default_control_socket(self) -> str:
        """control.sock next to ``listen``."""
        return str(Path(self.listen.removeprefix("unix://").removeprefix("unix:")).with_name("control.sock"))


DEFAULTS = ProxyConfig()


def _coerce(name: str, value: Any) -> Any:
    where = f"{name.replace('_', '-')}"
    if name == "connection_idle_timeout":
        return coerce_seconds(where, value)
    if name == "max_connections":
        return coerce_count(where, value)
    if name == "relay":
        if value not in ("frames", "grpc"):
            raise ConfigError(f"{where}: expected frames or grpc, got {value!r}")
        return value
    return coerce_setting(name, value)


def load_config(file: str | None, overrides: Mapping[str, Any]) -> ProxyConfig:
    """Defaults <- ``file`` (YAML or JSON mapping, keys as flags: ``runtime-endpoint`` / ``runtimeEndpoint``) <-
    ``overrides`` (flags given on the command line; None = not given)."""
    return load_settings(ProxyConfig, file, overrides, _coerce)
