"""``numapin webhook --workers N``: N webhook processes on one port (SO_REUSEPORT), supervised by the first.

Each worker is a whole webhook (``numapin webhook ... --reuse-port``): its own event loop, API watches, node index,
pod cache, simulator caches and body parser process. The kernel spreads new connections over the workers'
listening sockets; a keep-alive connection stays with its worker. The workers share nothing, exactly as replicas
behind the Service share nothing: a binding allowed by one worker is remembered by that worker only, so two pods
bound to the same node within one publication of its topology through two workers are each judged against the
node's last published free CPUs (the node proxy remains the backstop, as with replicas).

``/metrics`` answers for the whole webhook: the workers answer each other's metrics on unix sockets in a directory the
supervisor makes (and removes), and the worker a scrape lands on merges them (``worker_metrics``).

The supervisor forwards SIGTERM and SIGINT to the workers and waits for them; a supervisor killed outright takes its
workers along: each worker, first thing, asks the kernel for SIGTERM when its parent dies (PR_SET_PDEATHSIG) and then
checks that its parent is still the supervisor named in ``$NUMAPIN_WEBHOOK_SUPERVISOR`` (it may have died before the
request), in its own code rather than between fork and exec (Python run there is unsafe in a process with threads,
and costs subprocess its fast spawn). When a worker ends on its own, the
supervisor stops the others and exits with that worker's status, so the container restarts whole (a half-sized
webhook would go on answering, slower, with nobody noticing).
"""

from __future__ import annotations

import ctypes
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from types import FrameType

__all__ = ["SUPERVISOR_ENV", "end_with_supervisor", "supervise", "worker_command"]

log = logging.getLogger("numapin.webhook.workers")

_PR_SET_PDEATHSIG = 1  # linux/prctl.h
SUPERVISOR_ENV = "NUMAPIN_WEBHOOK_SUPERVISOR"  # set by the supervisor for its workers: its pid


def worker_command(argv: list[str]) -> list[str]:
    """The command line of one worker: ``argv`` (the supervisor's arguments after ``webhook``) without
    ``--workers`` and ``--worker-metrics-dir``, with ``--reuse-port`` (``supervise`` adds the metrics directory)."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg in ("--workers", "--worker-metrics-dir"):
            skip = True
            continue
        if arg.startswith(("--workers=", "--worker-metrics-dir=")):
            continue
        out.append(arg)
    return [sys.executable, "-m", "numapin", "webhook", *out, "--reuse-port"]


def end_with_supervisor() -> str | None:
    """In a worker (``$NUMAPIN_WEBHOOK_SUPERVISOR`` names its supervisor; taken out of the environment, so the
    worker's own children do not see it): have the kernel send this process SIGTERM when its parent dies (even by
    SIGKILL), then make sure the parent is still that supervisor. Why the worker must not start, or None (also for a
    webhook that is no worker)."""
    value = os.environ.pop(SUPERVISOR_ENV, None)
    if value is None:
        return None
    if not value.isdigit():
        return f"${SUPERVISOR_ENV}={value!r} is not a process id"
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM) != 0:
        return f"prctl(PR_SET_PDEATHSIG) failed: {os.strerror(ctypes.get_errno())}"
    if os.getppid() != int(value):
        return f"the supervisor (pid {value}) ended before this worker started"
    return None


def supervise(command: list[str], workers: int, *, poll_seconds: float = 0.2) -> int:
    """Run ``workers`` copies of ``command`` until a signal (0 once they have all ended) or until one ends on its own
    (then the others are stopped and its exit status returned)."""
    metrics_dir = tempfile.mkdtemp(prefix="numapin-webhook-workers-")  # their metrics sockets (worker_metrics)
    try:
        return _supervise([*command, "--worker-metrics-dir", metrics_dir], workers, poll_seconds)
    finally:
        shutil.rmtree(metrics_dir, ignore_errors=True)


def _supervise(command: list[str], workers: int, poll_seconds: float) -> int:
    env = {**os.environ, SUPERVISOR_ENV: str(os.getpid())}
    procs = [subprocess.Popen(command, env=env) for _ in range(workers)]
    log.info("started %d webhook workers: pids %s", workers, " ".join(str(p.pid) for p in procs))
    stopping: list[int] = []

    def forward(signum: int, frame: FrameType | None) -> None:
        stopping.append(signum)
        for p in procs:
            if p.poll() is None:
                p.send_signal(signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, forward)
    status = 0
    while any(p.poll() is None for p in procs):
        for p in procs:
            code = p.poll()
            if code is not None and not stopping:
                log.error("webhook worker %d ended with status %s: stopping the others", p.pid, code)
                status = code or 1
                forward(signal.SIGTERM, None)
        time.sleep(poll_seconds)
    return status
