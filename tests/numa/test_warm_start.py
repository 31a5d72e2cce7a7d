"""numapin_lab.warm_start: a numapin process started before its command line runs that command line as
``python -m numapin`` would (same output, same exit code), and one never launched goes away when discarded."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from numapin_lab.warm_start import discard, launch, spawn_warm

ROOT = Path(__file__).resolve().parents[2]


def cold(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "numapin", *args], cwd=ROOT, capture_output=True, text=True)


def test_a_launched_warm_process_runs_numapin_with_its_arguments(tmp_path: Path) -> None:
    for args, code in ((["criproxy", "--help"], 0), (["criproxy", "--no-such-flag"], 2)):
        log = tmp_path / f"warm-{code}.log"
        proc = spawn_warm(log)
        launch(proc, args)
        assert proc.wait(timeout=120) == code
        want = cold(*args)
        assert want.returncode == code
        assert log.read_text() == want.stdout + want.stderr


def test_a_warm_process_is_launched_once_and_discarded_when_unused(tmp_path: Path) -> None:
    proc = spawn_warm(tmp_path / "once.log")
    launch(proc, ["criproxy", "--help"])
    try:
        launch(proc, ["criproxy", "--help"])
        raise AssertionError("a second launch was accepted")
    except OSError:
        pass
    assert proc.wait(timeout=120) == 0
    unused = spawn_warm(tmp_path / "unused.log")
    discard(unused)
    assert unused.returncode is not None
    assert (tmp_path / "unused.log").read_text() == ""
