"""``numapin`` entry point. Each subcommand lives in its own module exposing ``HELP``,
``add_arguments(parser)`` and ``run(args) -> int``; modules are imported only when needed: ``numapin COMMAND ...``
imports COMMAND's module alone (the node's units run ``numapin wait-socket`` before and after every proxy start,
and it need not load the proxy's, the webhook's and the planner's code), ``numapin`` and ``numapin --help`` all of
them (the list of commands shows each one's help line)."""

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
    ("nri", "nriplugin.cli"),
    ("webhook", "webhook.cli"),
    ("certs", "webhook.https.certs_cli"),
    ("status", "numapin.cmd_status"),
    ("mode", "numapin.cmd_mode"),
    ("export-kubelet-state", "numapin.cmd_export"),
    ("wait-socket", "numapin.cmd_wait_socket"),
    ("demo", "numapin.cmd_demo"),
)


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The command line's parser: every subcommand, or only the one named ``only`` (with all of them when it is
    not one this build has)."""
    parser = argparse.ArgumentParser(
        prog="numapin",
        description="Topology-aware CPU pinning and NUMA-local memory for Kubernetes pods, "
        "without patching kubelet.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    chosen = [(n, m) for n, m in SUBCOMMANDS if n == only]
    added = False
    for name, module_name in chosen or SUBCOMMANDS:
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
        added = True
    if chosen and not added:  # this build has no such subcommand: argparse lists the ones it has
        return build_parser()
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(argv[0] if argv else None)
    args = parser.parse_args(argv)
    try:
        return int(args._run(args) or 0)
    except KeyboardInterrupt:
        print("numapin: interrupted", file=sys.stderr)
        return 130
