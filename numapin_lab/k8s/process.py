"""A control-plane binary as a child process in its own session, its output in a log file; it is killed (SIGKILL)
when the thread that started it dies (``setpriv --pdeathsig``), so a test run killed with SIGKILL leaves no API
server nor etcd. Not SIGTERM: kube-apiserver's graceful shutdown waits on etcd, which stops at the same moment."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from numapin_lab.numa_vm import with_parent_death_signal

__all__ = ["Daemon", "wait_ready"]


class Daemon:
    def __init__(self, name: str, argv: Sequence[str], log: Path) -> None:
        self.name = name
        self.argv = list(argv)
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(with_parent_death_signal(self.argv, "KILL"), stdin=subprocess.DEVNULL,
                                         stdout=log, stderr=log, start_new_session=True)

    def exit_code(self) -> int | None:
        """None while it runs (or was never started)."""
        return None if self.proc is None else self.proc.poll()

    def tail(self, lines: int = 20) -> str:
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout`` seconds; waits for it."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None


def wait_ready(daemon: Daemon, ready: Callable[[], bool], *, timeout: float, what: str,
               error: type[Exception] = RuntimeError) -> None:
    """Poll ``ready()`` until it answers True; ``error`` quoting the daemon's log when it exits first or when
    ``timeout`` seconds pass (``what``: what was waited for)."""
    deadline = time.monotonic() + timeout
    while True:
        code = daemon.exit_code()
        if code is not None:
            raise error(f"{daemon.name} exited ({code}):\n{daemon.tail()}")
        if ready():
            return
        if time.monotonic() > deadline:
            raise error(f"{what}: not within {timeout:.0f} s:\n{daemon.tail()}")
        time.sleep(0.2)
