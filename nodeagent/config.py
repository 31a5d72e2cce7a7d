"""The node agent's configuration, the same behind both doors (policy, state directory, convergence, NRT, pod
watch, control socket, /status and /metrics, kubelet's checks, the Memory Manager): command-line flags over a
YAML/JSON config file over defaults. A door's configuration extends ``AgentConfig`` with its own settings
(``criproxy.config.ProxyConfig``) and loads it with ``load_settings`` and its own ``coerce``.

Every problem is a ``ConfigError`` whose message names the flag or key; the CLI exits 2 with it.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, TypeVar

from allocator.bypass import DEFAULT_BYPASS_NAMESPACE, BypassPolicy, parse_names
from allocator.cpuset import CPUSet
from allocator.errors import AllocatorError, ConfigError
from allocator.feature_gates import FeatureGates, feature_gates_of
from allocator.memory.reserved import MemoryReservation
from nodeagent.node.memory_settings import coerce_memory_setting, is_memory_setting

__all__ = ["AgentConfig", "coerce_count", "coerce_seconds", "coerce_setting", "load_settings", "parse_options"]

C = TypeVar("C", bound="AgentConfig")
N = TypeVar("N", int, float)


def parse_options(text: str | Mapping[str, Any] | None, what: str) -> dict[str, str]:
    """``"a=b,c=d"`` or a mapping -> ``{"a": "b", "c": "d"}``."""
    if text is None or text == "":
        return {}
    if isinstance(text, Mapping):
        return {str(k): str(v).lower() if isinstance(v, bool) else str(v) for k, v in text.items()}
    if not isinstance(text, str):
        raise ConfigError(f"{what}: expected key=value[,key=value...], got {text!r}")
    out: dict[str, str] = {}
    for item in text.split(","):
        k, sep, v = item.strip().partition("=")
        if not sep or not k.strip():
            raise ConfigError(f"{what}: expected key=value[,key=value...], got {text!r}")
        out[k.strip()] = v.strip()
    return out


@dataclass(frozen=True)
class AgentConfig:
    state_dir: str = "/var/lib/numapin"
    sysfs: str = "/sys"
    reserved_cpus: CPUSet | None = None
    num_reserved_cpus: int = 0
    topology_manager_policy: str = "none"
    topology_manager_scope: str = "container"
    topology_manager_policy_options: Mapping[str, str] = field(default_factory=dict)
    cpu_manager_policy_options: Mapping[str, str] = field(default_factory=dict)
    lift_cfs_quota: bool = True
    reconcile_period: float = 0.0  # seconds between reconciles with containerd's lists; 0 = only at start
    converge_period: float = 1.0   # seconds between checks of every container's real cpuset; 0 = only on changes
    # kernel: a running container's cgroup cpuset is written directly, containerd's record follows in the
    # background; runtime: only through containerd's UpdateContainerResources (one runc update each)
    cpuset_writes: str = "kernel"
    # systemd: a container whose cgroup is a systemd scope gets its cpuset through systemd first (SetUnitProperties,
    # so daemon-reload keeps it); auto: that on cgroup v2; cgroupfs: never (nodeagent.node.systemd_cpusets)
    cgroup_driver: str = "auto"
    proc_root: str = "/proc"       # the host's /proc (hostPID)
    cgroup_root: str = "/sys/fs/cgroup"  # the host's cgroup file systems
    node_name: str = ""
    nrt_file: str = ""
    kubeconfig: str | None = None
    publish_nrt: bool = False
    watch_pods: bool = False      # learn changes of pods' CPU mode from the API server (needs API credentials)
    # Events on pods (nodeagent.serve.events): None = when the agent has API credentials (--kubeconfig, or in-cluster
    # with --publish-nrt / --watch-pods); True = also in-cluster alone; False = never
    record_events: bool | None = None
    control_socket: str | None = None  # root-only socket of ``numapin mode``; None: the door's default
    metrics_address: str = "127.0.0.1:9464"
    import_kubelet_state: str | None = None
    self_pod_namespace: str | None = None
    self_pod_name: str | None = None
    self_pod_uid: str | None = None
    log_level: str = "INFO"
    # where numapin.io/bypass is honoured (allocator.bypass), and where a bypassed pod may run on every CPU
    bypass_namespaces: frozenset[str] = frozenset({DEFAULT_BYPASS_NAMESPACE})
    bypass_all_cpus_namespaces: frozenset[str] = frozenset()
    cdi_spec_dirs: str = "/etc/cdi:/var/run/cdi"  # where CDI specs are read from, ':'-separated, later ones win
    kubelet_config: str = "/var/lib/kubelet/config.yaml"  # kubelet's config file, checked for drift
    kubelet_root_dir: str = "/var/lib/kubelet"  # kubelet's state files (cpu_manager_state, memory_manager_state)
    kubelet_check_period: float = 60.0  # seconds between checks of kubelet's configuration; 0 = only at start
    # kubelet's Memory Manager (docs/memory.md): memoryManagerPolicy, reservedMemory, and what Node Allocatable
    # reserves of memory (system-reserved + kube-reserved + the hard eviction threshold memory.available)
    memory_manager_policy: str = "None"
    reserved_memory: tuple[MemoryReservation, ...] = ()
    system_reserved: Mapping[str, str] = field(default_factory=dict)
    kube_reserved: Mapping[str, str] = field(default_factory=dict)
    eviction_hard: str | None = None  # memory.available's threshold; None: kubelet's default (100Mi)
    import_kubelet_memory_state: str | None = None
    # kubelet's --feature-gates that change its CPU and Memory Managers (allocator.feature_gates): as the node's kubelet
    feature_gates: FeatureGates = field(default_factory=FeatureGates)

    @property
    def bypass(self) -> BypassPolicy:
        return BypassPolicy(namespaces=self.bypass_namespaces, all_cpus_namespaces=self.bypass_all_cpus_namespaces)

    @property
    def cdi_dirs(self) -> tuple[str, ...]:
        """The CDI spec directories, in priority order (a later one's device wins)."""
        return tuple(d for d in self.cdi_spec_dirs.split(":") if d)

    @property
    def memory_state_file(self) -> Path:
        """numapin's memory_manager_state, beside cpu_manager_state (never kubelet's: a kubelet with
        memoryManagerPolicy None refuses to start on a file saying Static)."""
        return Path(self.state_dir) / "memory_manager_state"

    @property
    def state_file(self) -> Path:
        return Path(self.state_dir) / "cpu_manager_state"

    @property
    def nrt_dir(self) -> Path:
        """Where the NodeResourceTopology goes by default, one ``<node name>.json`` (a directory the webhook can
        read)."""
        return Path(self.state_dir) / "nrt"

    @property
    def nrt_path(self) -> Path:
        if self.nrt_file:
            return Path(self.nrt_file)
        return self.nrt_dir / f"{self.node_name or 'node'}.json"

    @property
    def control_path(self) -> str | None:
        """The control socket's path (None: disabled with an empty ``control_socket``)."""
        if self.control_socket is None:
            return self.default_control_socket()
        return self.control_socket or None

    def default_control_socket(self) -> str:
        """The control socket when none is configured (a door may put it next to its own socket)."""
        return "/var/run/numapin/control.sock"

    @property
    def events_wanted(self) -> bool:
        """Whether Events on pods are recorded (``record_events``; unset: when the agent has API credentials)."""
        if self.record_events is not None:
            return self.record_events
        return bool(self.kubeconfig) or self.publish_nrt or self.watch_pods

    @property
    def self_pod(self) -> tuple[str, str] | None:
        if self.self_pod_namespace and self.self_pod_name:
            return (self.self_pod_namespace, self.self_pod_name)
        return None

    def metrics_endpoint(self) -> tuple[str, int] | None:
        if not self.metrics_address:
            return None
        host, _, port = self.metrics_address.rpartition(":")
        try:
            number = int(port)
        except ValueError:
            raise ConfigError(f"metrics-address: expected HOST:PORT, got {self.metrics_address!r}") from None
        if not 0 <= number <= 65535:
            raise ConfigError(f"metrics-address: port {number} is not in 0-65535 (0: any free port)")
        return (host.removeprefix("[").removesuffix("]") or "127.0.0.1", number)


def coerce_seconds(where: str, value: Any) -> float:
    return _non_negative(where, value, float, "seconds")


def coerce_count(where: str, value: Any) -> int:
    return _non_negative(where, value, int, "a whole number")


def _non_negative(where: str, value: Any, kind: Callable[[Any], N], expected: str) -> N:
    try:
        n = kind(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{where}: expected {expected}, got {value!r}") from None
    if n < 0:
        shown = repr(value) if kind is float else str(n)
        raise ConfigError(f"{where}: must not be negative, got {shown}")
    return n


def coerce_setting(name: str, value: Any) -> Any:
    """A setting of ``AgentConfig`` from a flag's text or a config file's value (ConfigError naming it)."""
    where = f"{name.replace('_', '-')}"
    if is_memory_setting(name):
        return coerce_memory_setting(name, value, where)
    if name == "reserved_cpus":
        if value in (None, ""):
            return None
        try:
            return CPUSet.parse(str(value))
        except ValueError as e:
            raise ConfigError(f"{where}: {e}") from None
    if name == "feature_gates":  # a flag's A=true,B=false, or a config file's mapping (kubelet's featureGates)
        return value if isinstance(value, FeatureGates) else feature_gates_of(value, where)
    if name in ("topology_manager_policy_options", "cpu_manager_policy_options"):
        return parse_options(value, where)
    if name in ("reconcile_period", "converge_period", "kubelet_check_period"):
        return coerce_seconds(where, value)
    if name == "cgroup_driver":
        if value not in ("auto", "systemd", "cgroupfs"):
            raise ConfigError(f"{where}: expected auto, systemd or cgroupfs, got {value!r}")
        return value
    if name == "cpuset_writes":
        if value not in ("kernel", "runtime"):
            raise ConfigError(f"{where}: expected kernel or runtime, got {value!r}")
        return value
    if name == "num_reserved_cpus":
        return coerce_count(where, value)
    if name in ("lift_cfs_quota", "publish_nrt", "watch_pods", "record_events"):
        if isinstance(value, bool):
            return value
        if str(value).lower() in ("true", "1", "yes"):
            return True
        if str(value).lower() in ("false", "0", "no"):
            return False
        raise ConfigError(f"{where}: expected true or false, got {value!r}")
    if name in ("bypass_namespaces", "bypass_all_cpus_namespaces"):
        if isinstance(value, frozenset):
            return value
        if value is not None and not isinstance(value, str | list):
            raise ConfigError(f"{where}: expected namespace names (a,b or a list), got {value!r}")
        return parse_names(value, where)
    if name == "cdi_spec_dirs" and isinstance(value, list):  # a config file's list of directories
        if not all(isinstance(d, str) and ":" not in d for d in value):
            raise ConfigError(f"{where}: expected a list of directories, got {value!r}")
        return ":".join(value)
    if value is not None and not isinstance(value, str):
        raise ConfigError(f"{where}: expected a string, got {value!r}")
    return value


def _normalize_key(key: str) -> str:
    out = []
    for ch in key:
        if ch.isupper():
            out.append("_" + ch.lower())
        else:
            out.append("_" if ch == "-" else ch)
    return "".join(out)


def load_settings(cls: type[C], file: str | None, overrides: Mapping[str, Any],
                  coerce: Callable[[str, Any], Any] = coerce_setting) -> C:
    """``cls`` (``AgentConfig`` or a door's extension of it): defaults <- ``file`` (YAML or JSON mapping, keys as
    flags: ``runtime-endpoint`` / ``runtimeEndpoint``) <- ``overrides`` (flags given on the command line; None = not
    given); each value through ``coerce`` (the door's settings, then ``coerce_setting``)."""
    names = {f.name for f in fields(cls)}
    values: dict[str, Any] = {}
    if file:
        import yaml  # only for a configuration file (a twentieth of the proxy's import time)

        try:
            doc = yaml.safe_load(Path(file).read_text())
        except OSError as e:
            raise ConfigError(f"--config {file}: {e.strerror or e}") from None
        except yaml.YAMLError as e:
            raise ConfigError(f"--config {file}: not valid YAML/JSON: {e}") from None
        if doc is None:
            doc = {}
        if not isinstance(doc, Mapping):
            raise ConfigError(f"--config {file}: expected a mapping of settings")
        for k, v in doc.items():
            name = _normalize_key(str(k))
            if name not in names:
                raise ConfigError(f"--config {file}: unknown setting {k!r}")
            values[name] = coerce(name, v)
    for k, v in overrides.items():
        if v is not None:
            values[k] = coerce(k, v)
    values.setdefault("node_name", os.environ.get("NODE_NAME") or socket.gethostname())
    for env, key in (("POD_NAMESPACE", "self_pod_namespace"), ("POD_NAME", "self_pod_name"),
                     ("POD_UID", "self_pod_uid")):
        if values.get(key) is None and os.environ.get(env):
            values[key] = os.environ[env]
    try:
        return cls(**values)
    except (TypeError, AllocatorError) as e:
        raise ConfigError(str(e)) from None
