"""``numapin status``: the node as numapin's proxy holds it, checked against the containers' real cpusets."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

HELP = ("show the node's pinned containers, shared pool and free CPUs, and containers whose real cpuset disagrees; "
        "--cluster: every node's NUMA nodes and where a pod fits")
DESCRIPTION = """\
Show what numapin's CRI proxy holds on this node: the CPU topology with every pinned container's CPUs marked
(* = reserved, a letter per pinned container, . = shared pool only), the shared pool, the free CPUs per NUMA node,
with memoryManagerPolicy Static the memory and huge pages per NUMA node (free, held, reserved for the system) and
every container's memory blocks (what, how much, on which NUMA nodes), and every running container whose real
cpuset (its process's Cpus_allowed_list, read through the runtime's ContainerStatus) disagrees with the proxy's
state.

Where the proxy's view comes from:
  --status-url URL    the proxy's live /status endpoint (on its --metrics-address, e.g.
                      http://127.0.0.1:9464/status)
  --state-dir DIR     otherwise: the proxy's state checkpoint and published NodeResourceTopology in its
                      --state-dir (default /var/lib/numapin; works while the proxy is down), topology from --sysfs

Containers are checked against --runtime-endpoint (containerd's socket or the proxy's; --no-runtime skips it).

Exit status: 0 all agree, 1 some container's real cpuset disagrees with the state, 2 the state cannot be read
or bad arguments, 3 the runtime cannot be reached.

--cluster: the whole cluster instead, from the NodeResourceTopology objects numapin's node agents publish (read
with --kubeconfig FILE, else $KUBECONFIG, else the pod's in-cluster credentials): every node's sockets and NUMA
nodes with free, pinned and reserved CPUs (and memory where the node publishes it) and its topology manager policy.
--fits cpu=4,memory=8Gi[,hugepages-2Mi=1Gi][,mode=exclusive|share|none] says, per node, whether a Guaranteed pod of
that shape would be admitted now under the node's policy (the webhook's own simulation), or only on the empty
node, or never. A malformed object, or a Node without one, is reported and skipped.
Exit status with --cluster: 0 every node shown, 1 some node skipped, 2 the API server cannot be asked or bad
arguments.
"""


def _fits(text: str) -> object:
    from .fits import FitsError, parse_fits

    try:
        return parse_fits(text)
    except FitsError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cluster", action="store_true",
                        help="the whole cluster, from its NodeResourceTopology objects (see below)")
    parser.add_argument("--kubeconfig", metavar="FILE", help="with --cluster: the kubeconfig (default $KUBECONFIG, "
                        "else in-cluster credentials)")
    parser.add_argument("--fits", metavar="SHAPE", type=_fits,
                        help="with --cluster: where a pod of this shape fits, e.g. cpu=4,memory=8Gi")
    src = parser.add_mutually_exclusive_group()
    src.add_argument("--status-url", metavar="URL", help="the proxy's /status endpoint")
    src.add_argument("--state-dir", metavar="DIR", default=None,
                     help="the proxy's --state-dir (default /var/lib/numapin)")
    parser.add_argument("--nrt-file", metavar="FILE",
                        help="the published NodeResourceTopology (default in --state-dir)")
    parser.add_argument("--sysfs", default="/sys", metavar="ROOT", help="sysfs root for the topology (default /sys)")
    parser.add_argument("--reserved-cpus", metavar="LIST", help="the proxy's reserved CPUs, to mark them (state files "
                        "only; default: from the NodeResourceTopology when it says)")
    parser.add_argument("--runtime-endpoint", default="unix:///run/containerd/containerd.sock", metavar="ENDPOINT",
                        help="CRI socket to check containers against (default unix:///run/containerd/containerd.sock)")
    parser.add_argument("--no-runtime", action="store_true", help="do not check containers against the runtime")
    parser.add_argument("--format", choices=("text", "json"), default="text", help="output format (default text)")


def _fail(msg: str, code: int = 2) -> int:
    print(f"numapin status: {msg}", file=sys.stderr)
    return code


def run(args: argparse.Namespace) -> int:
    if args.cluster:
        return _run_cluster(args)
    if args.fits is not None or args.kubeconfig is not None:
        return _fail("--fits and --kubeconfig go with --cluster")
    import grpc.aio

    from allocator.cpuset import CPUSet

    from .cri_view import list_runtime_containers
    from .node_status import StatusError, check_runtime, fetch_proxy_status, from_proxy_status, from_state_dir
    from .node_status import render_text as render

    reserved = None
    if args.reserved_cpus is not None:
        try:
            reserved = CPUSet.parse(args.reserved_cpus)
        except ValueError as e:
            return _fail(f"--reserved-cpus: {e}")
    try:
        if args.status_url:
            status = from_proxy_status(fetch_proxy_status(args.status_url), f"proxy status {args.status_url}")
        else:
            state_dir = args.state_dir or "/var/lib/numapin"
            status = from_state_dir(state_dir, sysfs=args.sysfs, nrt_file=args.nrt_file, reserved=reserved)
    except StatusError as e:
        return _fail(str(e))
    runtime_down = False
    if not args.no_runtime:
        try:
            containers = asyncio.run(list_runtime_containers(args.runtime_endpoint))
        except ValueError as e:
            return _fail(f"--runtime-endpoint: {e}")
        except grpc.aio.AioRpcError as e:
            runtime_down = True
            status.notes.append(f"runtime {args.runtime_endpoint} not reachable ({e.code().name}: {e.details()}); "
                                "containers not checked")
        else:
            check_runtime(status, containers)
    if args.format == "json":
        print(json.dumps(status.to_dict(), indent=1))
    else:
        print(render(status))
    if status.disagreements:
        return 1
    return 3 if runtime_down else 0


def _run_cluster(args: argparse.Namespace) -> int:
    from .cluster_picture import build_picture, render_text
    from .cluster_source import ClusterSourceError, list_cluster, pick_kubeconfig

    if args.status_url or args.state_dir or args.nrt_file:
        return _fail("--cluster reads the API server: --status-url, --state-dir and --nrt-file are for one node")
    try:
        listing = asyncio.run(list_cluster(pick_kubeconfig(args.kubeconfig)))
    except ClusterSourceError as e:
        return _fail(str(e))
    picture = build_picture(listing.nrts, listing.node_names, args.fits)
    for s in picture.skipped:
        print(f"numapin status: skipped node {s.node}: {s.why}", file=sys.stderr)
    if listing.note:
        print(f"numapin status: {listing.note}", file=sys.stderr)
    if args.format == "json":
        print(json.dumps(picture.to_dict(), indent=1))
    else:
        print(render_text(picture))
    return 1 if picture.skipped else 0
