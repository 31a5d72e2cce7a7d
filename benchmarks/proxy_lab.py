"""What the proxy benchmarks against a real containerd share (benchmarks/mode_change.py, benchmarks/resize.py): the
machine's CPUs split into reserved CPUs and the one CPU a pinned container takes, a container's CPUs as the kernel
shows them, and a ``numapin criproxy`` child process started in front of a lab containerd; and how a child process
is stopped (benchmarks/criproxy.py too)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from allocator.cpuset import CPUSet  # noqa: E402
from allocator.topology import Topology  # noqa: E402
from numapin_lab.cri.client import CRIClient  # noqa: E402

ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
ALL = Topology.from_sysfs("/sys").all_cpus
EXCL = CPUSet([ALL.max()])  # the CPU a pinned container takes: every other one is reserved
RESERVED = ALL - EXCL


def allowed(pid: int) -> str:
    """The CPUs the kernel lets ``pid`` run on (``Cpus_allowed_list`` of /proc/<pid>/status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Cpus_allowed_list:"):
            return line.split(":", 1)[1].strip()
    raise RuntimeError(f"pid {pid}: no Cpus_allowed_list")


async def pid_of(k: CRIClient, cid: str) -> int:
    st = await k.container_status(cid, verbose=True)
    return int(json.loads(st.info["info"])["pid"])


def start_proxy(work: Path, runtime: str, *, log_level: str = "WARNING", root: Path = ROOT,
                extra: Sequence[str] = ()) -> subprocess.Popen[bytes]:
    """``numapin criproxy`` in front of ``runtime``, its state and log in ``work``; returns once its start-up
    reconcile is done (the control socket is opened then). ``root``: the tree whose code runs (another one: a
    ``git archive`` to compare with); ``extra``: more command-line arguments."""
    log = open(work / "proxy.log", "ab")  # noqa: SIM115
    p = subprocess.Popen([sys.executable, "-m", "numapin", "criproxy", "--listen", str(work / "proxy.sock"),
                          "--runtime-endpoint", f"unix://{runtime}", "--state-dir", str(work / "state"),
                          "--sysfs", "/sys", "--reserved-cpus", str(RESERVED), "--metrics-address", "",
                          "--log-level", log_level, *extra], cwd=root, env={**ENV, "PYTHONPATH": str(root)},
                         stdout=log, stderr=log)
    log.close()
    deadline = time.monotonic() + 60
    while not (work / "control.sock").exists():
        if p.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"proxy did not start:\n{(work / 'proxy.log').read_text()[-2000:]}")
        time.sleep(0.02)
    return p


def stop_process(p: subprocess.Popen[bytes] | None) -> None:
    """Stop a child process (a proxy from ``start_proxy``, a runtime; None: none was started): SIGTERM, 20 s to
    finish its calls and exit, then SIGKILL."""
    if p is None:
        return
    p.send_signal(signal.SIGTERM)
    try:
        p.wait(timeout=20)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
