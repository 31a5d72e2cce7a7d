"""``numapin`` entry point. Each subcommand lives in its own module exposing ``HELP``,
``add_arguments(parser)`` and ``run(args) -> int``; modules are imported only when needed."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# (subcommand, module): keep in the order --help shows them.
SUBCOMMANDS: tuple[tuple[str, str], ...] = (
    ("topology", "numapin.cmd_topology"),
    ("plan", "numapin.cmd_plan"),
    ("criproxy", "criproxy.cli"),
    ("webhook", "webhook.cli"),
    ("certs", "webhook.https.certs_cli"),
    ("status", "numapin.cmd_status"),
    ("mode", "numapin.cmd_mode"),
    ("export-kubelet-state", "numapin.cmd_export"),
    ("wait-socket", "numapin.cmd_wait_socket"),
    ("demo", "numapin.cmd_demo"),
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="numapin",
        description="Topology-aware CPU pinning and NUMA-local memory for Kubernetes pods, "
        "without patching kubelet.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, module_name in SUBCOMMANDS:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as e:
            if e.name == module_name:
                continue  # this build has no such subcommand
            raise
        p = sub.add_parser(name, help=module.HELP, description=getattr(module, "DESCRIPTION", module.HELP),
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        module.add_arguments(p)
        p.set_defaults(_run=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args._run(args) or 0)
    except KeyboardInterrupt:
        print("numapin: interrupted", file=sys.stderr)
        return 130
