"""``numapin demo`` itself, end to end, as a user runs it (a real process, non-interactive), and ``--keep`` stopped
by Ctrl-C (SIGINT): its output tells the story, and nothing stays behind."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from numapin_lab.cri.ledger import scratch_dir
from numapin_lab.demo.stack import cgroup_mounts

pytestmark = pytest.mark.containerd

ROOT = Path(__file__).resolve().parents[2]


def _cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "numapin", *args]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}


@pytest.fixture
def workdir() -> Iterator[Path]:
    d = scratch_dir("npdemo-")
    yield d / "w"
    shutil.rmtree(d, ignore_errors=True)


def assert_nothing_left(workdir: Path) -> None:
    assert not workdir.exists()
    procs = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                cmd = (p / "cmdline").read_bytes()
            except OSError:
                continue
            if str(workdir).encode() in cmd:
                procs.append(cmd.replace(b"\0", b" ").decode(errors="replace"))
    assert procs == []
    with open("/proc/mounts") as f:
        assert str(workdir) not in f.read()
    assert [m for m in cgroup_mounts() if (m / "numapin-w").exists() or (m / workdir.name).exists()] == []


def test_demo_runs_the_whole_job_and_cleans_up(workdir: Path) -> None:
    r = subprocess.run(_cmd("demo", "--workdir", str(workdir), "--node-name", "demo-node"), cwd=ROOT, env=_env(),
                       capture_output=True, text=True, timeout=240)
    out = r.stdout
    assert r.returncode == 0, out + r.stderr
    assert "   FAIL " not in out and "MISMATCH" not in out
    # the webhook's view: mutate stamps the intent, bindings denied under single-numa-node with the message
    assert "/mutate   pod cache: allowed" in out and "numapin.io/cpu-intent" in out
    assert re.search(r"binding   pod \w+ -> node demo-node: DENIED: node demo-node would reject pod default/\w+ "
                     r"\(TopologyAffinityError", out)
    assert "/validate pod batch: DENIED" in out and "single-numa-node" in out and "largest NUMA node" in out
    # the proxy's view, checked against the kernel, share and exclusive side by side
    assert "mode=share cpus=" in out and "mode=exclusive cpus=" in out
    assert re.search(r"default/db app +exclusive +(\S+) / 0 +\1 / 0 / \1 +ok", out), out
    assert "share and exclusive side by side" in out
    # a live change of mode exclusive -> share: db keeps its CPUs, web gets them too (the real Cpus_allowed_list)
    db = re.search(r"kernel    db: Cpus_allowed_list (\S+) -> (\S+)", out)
    web = re.search(r"kernel    web: Cpus_allowed_list (\S+) -> (\S+)", out)
    assert db and web and db.group(1) == db.group(2) and web.group(1) != web.group(2), out
    assert "mode exclusive -> share" in out and "cpuManager=share" in out
    # a live resize of db (kubectl patch --subresource resize): /validate, then kubelet's call through the proxy
    assert "/validate UPDATE pods/resize db cpu=" in out and "resize pod=default/db container=app: " in out, out
    assert "web is not on any of db's CPUs (narrowed first)" in out
    assert "proxy answered FAILED_PRECONDITION" in out or "proxy answered RESOURCE_EXHAUSTED" in out
    assert "running containers checked against their real cpuset: 2, 0 disagree" in out
    assert "nothing left behind" in out and out.rstrip().endswith("demo finished: every check passed")
    assert_nothing_left(workdir)


def test_demo_keep_runs_until_ctrl_c_then_cleans_up(workdir: Path) -> None:
    proc = subprocess.Popen(_cmd("demo", "--keep", "--workdir", str(workdir)), cwd=ROOT, env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    lines: list[str] = []
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            if line.startswith("Press Ctrl-C"):
                break
        out = "".join(lines)
        assert "Press Ctrl-C" in out, out
        status_cmd = next(line.split() for line in lines if line.strip().startswith("numapin status --status-url"))
        r = subprocess.run(_cmd(*status_cmd[1:]), cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "default/db app: exclusive" in r.stdout and "0 disagree" in r.stdout
        assert workdir.exists()
    finally:
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, rest
    assert "interrupted: stopping and cleaning up" in rest and "nothing left behind" in rest
    assert_nothing_left(workdir)


def test_demo_bad_input_exits_2(workdir: Path) -> None:
    workdir.mkdir(parents=True)
    (workdir / "something").write_text("x")
    r = subprocess.run(_cmd("demo", "--workdir", str(workdir)), cwd=ROOT, env=_env(), capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2 and "--workdir" in r.stderr and "Traceback" not in r.stderr
    r = subprocess.run(_cmd("demo", "--reserved-cpus", "0-4095"), cwd=ROOT, env=_env(), capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2 and "--reserved-cpus" in r.stderr and "Traceback" not in r.stderr
    assert (workdir / "something").exists()


def test_demo_interrupted_mid_run_by_ctrl_c_twice_cleans_up(workdir: Path) -> None:
    """Ctrl-C in a terminal reaches the whole foreground process group; an impatient user presses it twice."""
    proc = subprocess.Popen(_cmd("demo", "--workdir", str(workdir)), cwd=ROOT, env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    assert proc.stdout is not None
    out = []
    try:
        for line in proc.stdout:
            out.append(line)
            if "kubelet   pod web:" in line:  # pods are running
                break
        assert workdir.exists(), "".join(out)
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        time.sleep(0.2)
        os.killpg(proc.pid, signal.SIGINT)
        rest, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, "".join(out) + rest
    assert "interrupted: stopping and cleaning up" in rest and "nothing left behind" in rest
    assert_nothing_left(workdir)
