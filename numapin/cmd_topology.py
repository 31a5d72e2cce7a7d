"""``numapin topology``: show the node's CPU topology as numapin sees it (from sysfs)."""

from __future__ import annotations

import argparse
import json
import sys

HELP = "show this node's CPU topology: sockets, NUMA nodes, L3 groups, cores and threads"
DESCRIPTION = """\
Read the CPU topology from a sysfs root (/sys by default) the way numapin's allocator does: online CPUs with
their core (lowest thread id, as kubelet), socket, NUMA node and L3 (uncore) group, NUMA nodes with or without
CPUs, and NUMA distances.

  --format text   a drawing: sockets > NUMA nodes > L3 groups > cores [thread thread]
  --format json   numapin's topology JSON, usable as the `topology` of a `numapin plan` scenario
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sysfs", default="/sys", metavar="ROOT", help="sysfs root to read (default: /sys)")
    parser.add_argument("--format", choices=("text", "json"), default="text", help="output format (default: text)")


def run(args: argparse.Namespace) -> int:
    from allocator.errors import TopologyError
    from allocator.topology import Topology

    from .render import render_topology

    try:
        topo = Topology.from_sysfs(args.sysfs)
    except TopologyError as e:
        print(f"numapin topology: --sysfs {args.sysfs}: {e}", file=sys.stderr)
        return 2
    if args.format == "json":
        print(json.dumps(topo.to_dict(), indent=1))
    else:
        print(render_topology(topo))
    return 0
