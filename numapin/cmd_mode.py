"""``numapin mode``: change a running pod's CPU mode on this node through the proxy's local control socket."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

HELP = "change a running pod's CPU mode on this node (nodes without API access), or list the pods' modes"
DESCRIPTION = """\
Change the CPU mode (qos.gocrane.io/cpu-manager) of a pod running on this node, without restarting it, through
numapin's CRI proxy's local control socket (root only). For nodes whose proxy does not watch the API server; where it
does, annotate the pod instead (kubectl annotate pod NAME qos.gocrane.io/cpu-manager=share --overwrite): the API's
value wins at the next change or restart of the proxy.

  numapin mode NAMESPACE/NAME MODE     MODE: none | exclusive | share | kubelet (kubelet's rule, as without the
                                       annotation)
  numapin mode --list                  every pod of the node with its mode

The proxy applies the change as at creation (to exclusive: the shared containers are narrowed first) under the
node's topology manager policy; a change the node cannot satisfy is refused and the pod keeps running as it was.

Exit status: 0 changed (or already in that mode), 1 refused, 2 bad arguments, 3 the proxy cannot be reached.
"""

DEFAULT_SOCKET = "/var/run/numapin/control.sock"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("pod", nargs="?", metavar="NAMESPACE/NAME", help="the pod")
    parser.add_argument("mode", nargs="?", metavar="MODE", help="none, exclusive, share or kubelet")
    parser.add_argument("--list", action="store_true", help="list the node's pods and their modes")
    parser.add_argument("--socket", default=DEFAULT_SOCKET, metavar="PATH",
                        help=f"the proxy's control socket (its --control-socket, default {DEFAULT_SOCKET})")
    parser.add_argument("--format", choices=("text", "json"), default="text", help="output format (default text)")


def _fail(msg: str, code: int) -> int:
    print(f"numapin mode: {msg}", file=sys.stderr)
    return code


def run(args: argparse.Namespace) -> int:
    from allocator.errors import PodSpecError
    from allocator.mode_change import parse_target
    from nodeagent.serve.control import call_control

    if args.list:
        if args.pod or args.mode:
            return _fail("--list takes no pod or mode", 2)
        request: dict[str, object] = {"op": "modes"}
    else:
        if not args.pod or not args.mode:
            return _fail("give NAMESPACE/NAME and MODE (none, exclusive, share, kubelet), or --list", 2)
        if args.pod.count("/") != 1 or not all(args.pod.split("/")):
            return _fail(f"pod must be NAMESPACE/NAME, got {args.pod!r}", 2)
        try:
            parse_target(args.mode)
        except PodSpecError as e:
            return _fail(str(e), 2)
        request = {"op": "set-mode", "pod": args.pod, "mode": args.mode}
    try:
        answer = asyncio.run(call_control(args.socket, request))
    except (TimeoutError, OSError, ValueError) as e:
        return _fail(f"cannot reach the proxy at {args.socket}: {e}", 3)
    if args.format == "json":
        print(json.dumps(answer, indent=1))
    elif args.list:
        rows = answer.get("pods") or []
        print(f"{'POD':40} {'MODE':10} {'CHANGED':8} UID")
        for p in rows:
            print(f"{p.get('pod', ''):40} {p.get('mode', ''):10} {'yes' if p.get('changed') else 'no':8} "
                  f"{p.get('uid', '')}")
    else:
        if answer.get("outcome") == "refused":
            print(f"refused ({answer.get('reason')}): {answer.get('message', '')}")
        else:
            print(answer.get("message", ""))
        change = answer.get("change") if answer.get("outcome") == "changed" else None
        for c in (change or {}).get("containers", []):
            print(f"  {c['name']}: {c['from']} {c['cpusBefore'] or 'shared pool'} -> {c['to']} "
                  f"{c['cpusAfter'] or 'shared pool'}")
    outcome = answer.get("outcome")
    if outcome in ("changed", "unchanged", "ok"):
        return 0
    return 1 if outcome == "refused" else 2
