"""``numapin wait-socket``: wait until a unix socket accepts connections (the node's systemd units use it to order
containerd -> numapin's proxy -> kubelet by their sockets, not only by their processes)."""

from __future__ import annotations

import argparse
import socket
import sys
import time

HELP = "wait until a unix socket accepts connections (systemd ordering of containerd, the proxy and kubelet)"
DESCRIPTION = """\
Wait until something accepts connections on a unix socket: a socket file left by a process that died does not
count. numapin's systemd unit waits with it for containerd's socket before the proxy starts, and for the proxy's own
socket before the unit counts as started (kubelet is ordered after it); kubelet's drop-in waits for the proxy's
socket too.

  numapin wait-socket /run/containerd/containerd.sock --timeout 120

Exit status: 0 the socket answers, 1 it did not within --timeout seconds, 2 bad arguments.
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("socket", metavar="PATH", help="the socket (a path, or unix:///path)")
    parser.add_argument("--timeout", type=float, default=60.0, metavar="SECONDS",
                        help="give up after this many seconds (default 60)")
    parser.add_argument("--interval", type=float, default=0.2, metavar="SECONDS",
                        help="time between attempts (default 0.2)")
    parser.add_argument("--quiet", action="store_true", help="no message while waiting")


def answers(path: str) -> bool:
    """Whether a connection to the unix socket ``path`` is accepted now."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(2.0)
        try:
            s.connect(path)
        except OSError:
            return False
    return True


def run(args: argparse.Namespace) -> int:
    path = args.socket.removeprefix("unix://")
    if not path.startswith("/"):
        print(f"numapin wait-socket: {args.socket!r} is not an absolute socket path", file=sys.stderr)
        return 2
    if args.timeout < 0 or args.interval <= 0:
        print("numapin wait-socket: --timeout must be >= 0 and --interval > 0", file=sys.stderr)
        return 2
    deadline = time.monotonic() + args.timeout
    told = False
    while True:
        if answers(path):
            return 0
        if time.monotonic() >= deadline:
            print(f"numapin wait-socket: nothing answered on {path} within {args.timeout:g} s", file=sys.stderr)
            return 1
        if not told and not args.quiet:
            print(f"numapin wait-socket: waiting for {path}", file=sys.stderr)
            told = True
        time.sleep(args.interval)
