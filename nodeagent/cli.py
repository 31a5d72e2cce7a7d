"""The node agent's command-line flags, the same behind both doors (``numapin criproxy``, ``numapin nri``): the
policy, the state directory, convergence, NRT publishing, the pod watch, the control socket, /status and /metrics,
kubelet's checks, the Memory Manager, bypass. A door adds them to its parser (``add_agent_arguments``) beside its
own and reads them back as ``load_settings`` overrides (``agent_overrides``)."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from allocator.errors import AllocatorError
from nodeagent.config import AgentConfig

if TYPE_CHECKING:
    from allocator.node import NodeParts

C = TypeVar("C", bound=AgentConfig)

__all__ = ["AGENT_FLAGS", "add_agent_arguments", "agent_overrides", "configure"]

DEFAULTS = AgentConfig()

AGENT_FLAGS: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("--state-dir", "state_dir", {"help": f"directory of the state file and NRT document (default "
                                           f"{DEFAULTS.state_dir})"}),
    ("--sysfs", "sysfs", {"help": "sysfs root to read the topology and device NUMA nodes from (default /sys)"}),
    ("--reserved-cpus", "reserved_cpus", {"help": "CPUs kept for the system (cpu-list, e.g. 0-1)"}),
    ("--num-reserved-cpus", "num_reserved_cpus", {"help": "reserve this many CPUs (by physical core) instead"}),
    ("--topology-manager-policy", "topology_manager_policy",
     {"help": "none | best-effort | restricted | single-numa-node (default none)"}),
    ("--topology-manager-scope", "topology_manager_scope", {"help": "container | pod (default container)"}),
    ("--topology-manager-policy-options", "topology_manager_policy_options",
     {"help": "key=value,... (e.g. prefer-closest-numa-nodes=true)"}),
    ("--cpu-manager-policy-options", "cpu_manager_policy_options",
     {"help": "key=value,... (e.g. full-pcpus-only=true)"}),
    ("--reconcile-period", "reconcile_period",
     {"help": "seconds between reconciles with containerd's container lists (default for the proxy 0: only at start; "
              "for the NRI plugin 10: containerd does not tell plugins of pods and exited containers removed after "
              "it restarted)"}),
    ("--converge-period", "converge_period",
     {"help": "seconds between checks of every running container's real cpuset in the kernel, repairing any "
              "that is not numapin's decision (default 1; 0: only at start and after pool changes)"}),
    ("--cpuset-writes", "cpuset_writes",
     {"choices": ("kernel", "runtime"),
      "help": "how cpusets of running containers change: kernel = their cgroup files are written directly and "
              "containerd's record follows in the background (default; narrowing 100 containers takes tens of ms); "
              "runtime = only through containerd's UpdateContainerResources, one runc process per container"}),
    ("--cgroup-driver", "cgroup_driver",
     {"choices": ("auto", "systemd", "cgroupfs"),
      "help": "kubelet's cgroup driver: with systemd, a container's cpuset is set through systemd's D-Bus API "
              "(SetUnitProperties on its scope) before its cgroup is written, so that systemctl daemon-reload "
              "keeps it; auto (default) = systemd for containers in systemd scopes on cgroup v2"}),
    ("--proc-root", "proc_root", {"help": "the host's /proc, to read container processes (default /proc)"}),
    ("--cgroup-root", "cgroup_root",
     {"help": "the host's cgroup mount, to read container cpusets (default /sys/fs/cgroup)"}),
    ("--node-name", "node_name", {"help": "NodeResourceTopology object name (default $NODE_NAME or hostname)"}),
    ("--nrt-file", "nrt_file", {"help": "where the NodeResourceTopology JSON goes (default in --state-dir)"}),
    ("--kubeconfig", "kubeconfig", {"help": "publish the NodeResourceTopology to this cluster (and watch its pods "
                                             "with --watch-pods)"}),
    ("--control-socket", "control_socket", {"help": "root-only unix socket for `numapin mode`, empty to disable "
                                                     "(default: control.sock next to --listen)"}),
    ("--metrics-address", "metrics_address", {"help": "HOST:PORT for /metrics and /status ([::1]:PORT for IPv6, "
                                                       "port 0: any free port), empty to disable "
                                                       f"(default {DEFAULTS.metrics_address})"}),
    ("--import-kubelet-state", "import_kubelet_state",
     {"help": "kubelet's cpu_manager_state to import once when numapin has no state yet"}),
    ("--cdi-spec-dirs", "cdi_spec_dirs",
     {"help": "CDI spec directories, ':'-separated, a later one's device winning: the CDI devices kubelet names "
              f"are resolved there to device nodes whose NUMA nodes join the device hints (default "
              f"{DEFAULTS.cdi_spec_dirs})"}),
    ("--kubelet-config", "kubelet_config",
     {"help": "kubelet's configuration file, checked at start and every --kubelet-check-period for drift: "
              "cpuManagerPolicy or memoryManagerPolicy static, or a containerRuntimeEndpoint that is not --listen "
              f"(kubelet's own --config flag wins when its process is visible) (default {DEFAULTS.kubelet_config})"}),
    ("--kubelet-root-dir", "kubelet_root_dir",
     {"help": "kubelet's root directory: its cpu_manager_state, memory_manager_state and kubeadm-flags.env "
              f"(default {DEFAULTS.kubelet_root_dir})"}),
    ("--kubelet-check-period", "kubelet_check_period",
     {"help": "seconds between checks of kubelet's configuration; while kubelet's CPU or Memory Manager is static "
              "new exclusive admissions are refused (default 60; 0: only at start)"}),
    ("--memory-manager-policy", "memory_manager_policy",
     {"help": "None | Static: kubelet's Memory Manager (memory and huge pages accounted per NUMA node, cpuset.mems "
              "= the nodes holding a Guaranteed container's memory; docs/memory.md) (default None)"}),
    ("--reserved-memory", "reserved_memory",
     {"help": "memory reserved per NUMA node in kubelet's format, e.g. 0:memory=1Gi,hugepages-2Mi=0;1:memory=2Gi "
              "(with Static: must add up to system-reserved + kube-reserved + the eviction threshold)"}),
    ("--system-reserved", "system_reserved", {"help": "kubelet's --system-reserved (e.g. memory=1Gi,cpu=500m)"}),
    ("--kube-reserved", "kube_reserved", {"help": "kubelet's --kube-reserved (e.g. memory=1Gi)"}),
    ("--eviction-hard", "eviction_hard",
     {"help": "kubelet's --eviction-hard; its memory.available threshold counts in Node Allocatable "
              "(default memory.available<100Mi)"}),
    ("--import-kubelet-memory-state", "import_kubelet_memory_state",
     {"help": "kubelet's memory_manager_state to import once when numapin has no memory state yet (Static)"}),
    ("--feature-gates", "feature_gates",
     {"metavar": "A=true,B=false",
      "help": "the node kubelet's --feature-gates that change its CPU and Memory Managers, in kubelet's syntax (a "
              "config file may give kubelet's featureGates mapping): PodLevelResourceManagers=true pins pods with "
              "pod-level resources as kubelet 1.36's alpha gate does (docs/annotations.md); an unknown gate exits 2 "
              "(default: kubelet's defaults, PodLevelResourceManagers off)"}),
    ("--log-level", "log_level", {"help": "DEBUG, INFO, WARNING (default INFO)"}),
    ("--bypass-namespaces", "bypass_namespaces",
     {"help": "namespaces (comma-separated) whose pods' numapin.io/bypass: \"true\" is honoured; elsewhere the "
              "annotation is ignored (logged, counted in numapin_criproxy_bypass_ignored_total) and the pod is "
              "treated by its QoS class and mode (default "
              f"{','.join(sorted(DEFAULTS.bypass_namespaces))}; empty: nobody)"}),
    ("--bypass-all-cpus-namespaces", "bypass_all_cpus_namespaces",
     {"help": "namespaces among --bypass-namespaces whose bypassed pods are passed through untouched and may run on "
              "every CPU, other pods' exclusive CPUs included (default none: a bypassed pod runs on the shared "
              "pool)"}),
)


def add_agent_arguments(parser: argparse.ArgumentParser) -> None:
    """``--config`` and the agent's flags (each None when not given: the file's value or the default wins)."""
    parser.add_argument("--config", metavar="FILE", help="YAML/JSON file with the same settings")
    for flag, dest, kw in AGENT_FLAGS:
        parser.add_argument(flag, dest=dest, default=None, **kw)
    q = parser.add_mutually_exclusive_group()
    q.add_argument("--keep-cfs-quota", dest="lift_cfs_quota", action="store_false", default=None,
                   help="keep the CFS quota of pinned containers (default: lifted, as kubelet >= 1.32)")
    parser.add_argument("--publish-nrt", dest="publish_nrt", action="store_true", default=None,
                        help="publish the NodeResourceTopology with in-cluster credentials")
    parser.add_argument("--watch-pods", dest="watch_pods", action="store_true", default=None,
                        help="watch this node's pods on the API server and apply changes of their CPU mode "
                             "(qos.gocrane.io/cpu-manager) while they run; credentials from --kubeconfig or in-cluster")
    e = parser.add_mutually_exclusive_group()
    e.add_argument("--record-events", dest="record_events", action="store_true", default=None,
                   help="record Events on pods (Pinned, Refused, Resized, ModeChanged, Repaired; kubectl describe "
                        "pod shows them) with --kubeconfig's or in-cluster credentials (default: on when the agent "
                        "has credentials: --kubeconfig, --publish-nrt or --watch-pods)")
    e.add_argument("--no-record-events", dest="record_events", action="store_false",
                   help="record no Events on pods, even with API credentials")


def agent_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The agent's settings given on the command line (None: not given)."""
    overrides = {dest: getattr(args, dest) for _, dest, _ in AGENT_FLAGS}
    overrides["lift_cfs_quota"] = args.lift_cfs_quota
    overrides["publish_nrt"] = args.publish_nrt
    overrides["watch_pods"] = args.watch_pods
    overrides["record_events"] = args.record_events
    return overrides


def configure(args: argparse.Namespace, door_flags: Sequence[tuple[str, str, dict[str, Any]]],
              load: Callable[[str | None, Mapping[str, Any]], C], prog: str) -> tuple[C, NodeParts] | int:
    """A door's command line read back: its settings (``load``: the door's config loader, over the agent's flags
    and ``door_flags``), the node built from them (topology and policy problems surface here, before anything
    starts) and logging set up; or the exit status 2 with a message on stderr naming the problem."""
    overrides = agent_overrides(args) | {dest: getattr(args, dest) for _, dest, _ in door_flags}
    try:
        config = load(args.config, overrides)
        config.metrics_endpoint()
        from nodeagent.app import node_parts_of
        parts = node_parts_of(config)
    except (AllocatorError, ValueError) as e:
        print(f"numapin {prog}: {e}", file=sys.stderr)
        return 2
    level = getattr(logging, config.log_level.upper(), None)
    if not isinstance(level, int):
        print(f"numapin {prog}: log-level: unknown level {config.log_level!r}", file=sys.stderr)
        return 2
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return config, parts
