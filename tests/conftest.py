"""Shared pytest fixtures and the session's end check.

``sysfs_machine``: build a generated sysfs tree of a known machine (tests/fixtures).
``control_plane``: the session's real etcd + kube-apiserver v1.36.2, started once (tests/control_plane.py).
``kubelet_node``, ``kubelet_nri_node``: real kubelet v1.36.2 nodes (criproxy; nri), a scheduler (tests/kubelet_node.py).

The end check: the lab notes what it makes in a ledger (``numapin_lab.cri.ledger``; here one file per session, its
path in the environment so that child processes note too). When the session ends, anything the ledger names that is
still there (a pod's cgroup in any hierarchy, a containerd, shim, runc, proxy or container process, a mount, a lab or
scratch directory) FAILS the run, named one per line; it is then removed, so a failed run leaves the machine clean.

SIGTERM (a CI runner's time limit, ``kill``, systemd stopping the job) ends the session as Ctrl-C does, so that end
check still runs: the running test is interrupted, the background VMs are stopped (tests/numa), the end check sweeps
what the lab made; then the process dies of SIGTERM, as asked. A second SIGTERM kills at once.
"""

from __future__ import annotations

import os
import signal
import sys
import tempfile
import threading
from pathlib import Path

import pytest

from numapin_lab.cri import ledger
from tests.control_plane import control_plane
from tests.fixtures.make_sysfs import sysfs_machine
from tests.kubelet_node import kubelet_node, kubelet_nri_node
from tests.leak_check import find_leftovers, sweep

__all__ = ["control_plane", "kubelet_node", "kubelet_nri_node", "sysfs_machine"]

_LEDGER_KEY = pytest.StashKey[Path]()
_SIGTERM_KEY = pytest.StashKey[list[int]]()


def pytest_configure(config: pytest.Config) -> None:
    if ledger.ENV in os.environ or hasattr(config, "workerinput"):
        return  # an outer session (or xdist's controller) owns the ledger
    fd, path = tempfile.mkstemp(prefix="numapin-ledger-", suffix=".txt", dir="/tmp")
    os.close(fd)
    os.environ[ledger.ENV] = path
    config.stash[_LEDGER_KEY] = Path(path)
    _interrupt_on_sigterm(config)


def _interrupt_on_sigterm(config: pytest.Config) -> None:
    """Turn the first SIGTERM into KeyboardInterrupt in the main thread (pytest's Ctrl-C path: the session ends and
    pytest_sessionfinish runs), unless someone else already handles SIGTERM."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return
    received: list[int] = []

    def on_sigterm(signum: int, frame: object) -> None:
        received.append(signum)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second one kills at once
        raise KeyboardInterrupt("SIGTERM: ending the session (the end check still runs)")

    signal.signal(signal.SIGTERM, on_sigterm)
    config.stash[_SIGTERM_KEY] = received


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """After a SIGTERM and the session's end: die of that signal, so a caller sees what happened (status 143 in a
    shell, not pytest's 2 for Ctrl-C)."""
    if config.stash.get(_SIGTERM_KEY, None):
        sys.stdout.flush()
        sys.stderr.flush()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    path = session.config.stash.get(_LEDGER_KEY, None)
    if path is None:
        return
    try:
        found = find_leftovers(path)
        if found:
            still = sweep(path)
            lines = "\n".join(f"  {line}" for line in found.lines())
            after = "\nstill there after the sweep:\n  " + "\n  ".join(still) if still else "\n(removed now)"
            reporter = session.config.pluginmanager.get_plugin("terminalreporter")
            message = f"the tests left behind what the lab made:\n{lines}{after}"
            if reporter is not None:
                reporter.write_sep("=", "LEFTOVERS", red=True)
                reporter.write_line(message)
            else:
                print(message)
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
    finally:
        os.environ.pop(ledger.ENV, None)
        path.unlink(missing_ok=True)
