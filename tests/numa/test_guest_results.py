"""The guest's per-test results (tests.numa.guest_results) as the host reads them back (harness.parse_results),
from a real pytest run on the host that stops dead in its last test as a VM stopped at its time limit would: the
tests that finished keep their outcome, the one it stopped in is "unfinished", one never started is absent."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.numa.guest_results import RESULTS
from tests.numa.harness import parse_results
from tests.numa.shapes import SHARED_ENV

ROOT = Path(__file__).resolve().parents[2]

CHECKS = '''
import os
import pytest

@pytest.fixture
def broken():
    raise RuntimeError("set-up broke")

def test_passes():
    assert True

def test_fails():
    assert 1 == 2, "one is not two"

def test_errors(broken):
    pass

def test_skips():
    pytest.skip("not here")

@pytest.mark.parametrize("n", [1, 2])
def test_param(n):
    assert n

def test_stops_dead():
    os._exit(124)  # as the VM stopping: no report for this test, nothing after it

def test_never_runs():
    pass
'''


def test_results_survive_a_run_stopped_in_the_middle(tmp_path: Path) -> None:
    (tmp_path / "test_checks.py").write_text(CHECKS)
    r = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "tests.numa.guest_results",
                        "-o", "addopts=", "-q", "--rootdir", str(tmp_path), str(tmp_path / "test_checks.py")],
                       cwd=ROOT, env={**os.environ, SHARED_ENV: str(tmp_path), "PYTHONPATH": str(ROOT)},
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 124, r.stdout + r.stderr
    got = {c.nodeid: c for c in parse_results(tmp_path / RESULTS)}
    assert {k: c.outcome for k, c in got.items()} == {
        "test_checks.py::test_passes": "passed", "test_checks.py::test_fails": "failed",
        "test_checks.py::test_errors": "error", "test_checks.py::test_skips": "skipped",
        "test_checks.py::test_param[1]": "passed", "test_checks.py::test_param[2]": "passed",
        "test_checks.py::test_stops_dead": "unfinished"}
    assert "one is not two" in got["test_checks.py::test_fails"].message
    assert "set-up broke" in got["test_checks.py::test_errors"].message
    assert got["test_checks.py::test_param[2]"].check == "test_checks.py::test_param"
    assert parse_results(tmp_path / "missing.jsonl") == ()
