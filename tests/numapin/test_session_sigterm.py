"""tests/conftest.py's SIGTERM rule, on a real pytest process: a session killed with SIGTERM (a CI runner's time
limit, ``kill``) still runs its end check, which names and sweeps what the lab made, and then dies of SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from numapin_lab.cri import ledger

ROOT = Path(__file__).resolve().parents[2]

_WAITING_TEST = '''
import os, time
from pathlib import Path
from numapin_lab.cri import ledger

import pytest

@pytest.fixture
def slow_teardown():
    yield
    if os.environ.get("SLOW_TEARDOWN"):
        with open(os.environ["REPORT"], "a") as f:
            f.write("tearing down\\n")
        try:
            time.sleep(120)
        except KeyboardInterrupt:  # the second SIGTERM was handled, not fatal
            with open(os.environ["REPORT"], "a") as f:
                f.write("interrupted again\\n")
            time.sleep(120)

def test_makes_a_scratch_directory_and_waits(slow_teardown):
    d = ledger.scratch_dir("npx-sigterm-")
    Path(os.environ["REPORT"]).write_text(f"{d}\\n{os.environ[ledger.ENV]}\\n")
    time.sleep(120)
'''


def _session(tmp_path: Path, **extra_env: str) -> tuple[subprocess.Popen[str], Path]:
    test = tmp_path / "test_waiting.py"
    test.write_text(_WAITING_TEST)
    report = tmp_path / "report"
    env = {k: v for k, v in os.environ.items() if k != ledger.ENV}  # the child owns its ledger, as a session does
    env["REPORT"] = str(report)
    env.update(extra_env)
    child = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-p", "tests.conftest", "-p", "no:cacheprovider", "-q", str(test)],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        _wait_for_lines(child, report, 2)
    except BaseException:
        _stop(child)
        raise
    return child, report


def _stop(child: subprocess.Popen[str]) -> None:
    """A child a failed check left running (it would sleep for minutes) goes."""
    if child.poll() is None:
        child.kill()
        child.communicate()


def _wait_for_lines(child: subprocess.Popen[str], report: Path, n: int) -> None:
    deadline = time.monotonic() + 60
    while not report.exists() or report.read_text().count("\n") < n:
        assert child.poll() is None, child.communicate()[0]
        assert time.monotonic() < deadline, f"the child session did not write {n} lines in 60 s"
        time.sleep(0.05)


def _remove(child: subprocess.Popen[str], scratch: str, ledger_file: str) -> None:
    """The child, and what it made, if still there (the rule under test failed, or was not meant to run)."""
    _stop(child)
    if Path(scratch).exists():
        Path(scratch).rmdir()
    Path(ledger_file).unlink(missing_ok=True)


def test_sigterm_ends_the_session_through_the_end_check_and_then_kills(tmp_path: Path) -> None:
    child, report = _session(tmp_path)
    scratch, ledger_file = report.read_text().split()
    assert Path(scratch).is_dir() and Path(ledger_file).exists()
    try:
        child.send_signal(signal.SIGTERM)
        out, _ = child.communicate(timeout=60)
        assert child.returncode == -signal.SIGTERM, out
        assert "LEFTOVERS" in out and f"path {scratch}" in out and "(removed now)" in out, out
        assert not Path(scratch).exists(), out
        assert not Path(ledger_file).exists(), out
    finally:
        _remove(child, scratch, ledger_file)


def test_a_second_sigterm_kills_at_once(tmp_path: Path) -> None:
    """The first SIGTERM's handler gives SIGTERM back to the kernel's default, so a caller that insists is obeyed
    even while the session's end is stuck (here a fixture's teardown that sleeps)."""
    child, report = _session(tmp_path, SLOW_TEARDOWN="1")
    scratch, ledger_file = report.read_text().split()
    try:
        child.send_signal(signal.SIGTERM)
        _wait_for_lines(child, report, 3)  # the test was interrupted, the end check ran; a teardown now sleeps
        child.send_signal(signal.SIGTERM)
        out, _ = child.communicate(timeout=30)
        assert child.returncode == -signal.SIGTERM, out
        assert "interrupted again" not in report.read_text(), out  # killed where it stood, not interrupted once more
    finally:
        _remove(child, scratch, ledger_file)
