"""``numapin`` processes started before their command line is known: the Python imports the modules a subcommand
needs at once, then reads its arguments (one JSON list on stdin) and runs ``numapin`` with them, exactly as
``python -m numapin ARGS`` would (same process, signals, logs and exit code).

Under software emulation (the multi-NUMA VMs, tests/numa) a proxy start is mostly Python's imports (about two
thirds of 12-16 s): a harness that knows it will start a proxy soon starts one of these first, and the imports
overlap what it does meanwhile (containerd starting, pods being deleted, a proxy being killed) on the VM's other
host core. ``spawn_warm(...)`` … ``launch(proc, args)``; a process never launched exits at EOF on its stdin.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

__all__ = ["PROXY_MODULES", "discard", "launch", "spawn_warm"]

ROOT = Path(__file__).resolve().parents[1]
PROXY_MODULES = ("numapin.cli", "criproxy.cli", "criproxy.app")  # what ``numapin criproxy`` imports before serving
_LAUNCHER = ("import importlib, json, sys\n"
             "for m in sys.argv[1:]:\n"
             "    importlib.import_module(m)\n"
             "line = sys.stdin.readline()\n"
             "if not line:\n"
             "    raise SystemExit(0)  # never launched\n"
             "args = json.loads(line)\n"
             "sys.argv = ['numapin', *args]\n"
             "import numapin.cli\n"
             "raise SystemExit(numapin.cli.main(args))\n")


def spawn_warm(log: Path, *, modules: Sequence[str] = PROXY_MODULES, root: Path = ROOT,
               env: Mapping[str, str] | None = None, new_session: bool = False) -> subprocess.Popen[bytes]:
    """A Python importing ``modules`` from the checkout ``root``, output appended to ``log``, then waiting for
    ``launch``."""
    base = dict(os.environ if env is None else env)
    base["PYTHONPATH"] = os.pathsep.join(p for p in (str(root), base.get("PYTHONPATH", "")) if p)
    base["PYTHONUNBUFFERED"] = "1"
    with open(log, "ab") as out:
        return subprocess.Popen([sys.executable, "-c", _LAUNCHER, *modules], stdin=subprocess.PIPE, stdout=out,
                                stderr=out, env=base, cwd=root, start_new_session=new_session)


def launch(proc: subprocess.Popen[bytes], args: Sequence[str]) -> None:
    """Run ``numapin ARGS`` in the waiting ``proc``. OSError when it is gone (or was launched already)."""
    if proc.stdin is None or proc.stdin.closed or proc.poll() is not None:
        raise OSError(f"the warm numapin process {proc.pid} is gone or was launched already")
    try:
        proc.stdin.write(json.dumps(list(args)).encode() + b"\n")
    finally:
        proc.stdin.close()


def discard(proc: subprocess.Popen[bytes]) -> None:
    """Stop a warm process that will not be launched (EOF, then SIGKILL if it is still importing)."""
    if proc.stdin is not None and not proc.stdin.closed:
        with contextlib.suppress(OSError):
            proc.stdin.close()
    if proc.poll() is None:
        proc.kill()
    proc.wait()
