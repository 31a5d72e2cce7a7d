"""A pytest plugin for the guest's run (``-p tests.numa.guest_results``, any selection): every test's start and
each of its phases, appended as they happen to ``$NUMAPIN_VM_SHARED/results.jsonl``, so that the host reads back
what finished even when the VM is stopped in the middle (its time limit) and names the check it stopped in."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from tests.numa.shapes import SHARED_ENV

RESULTS = "results.jsonl"


def _append(record: dict[str, Any]) -> None:
    shared = os.environ.get(SHARED_ENV)
    if shared:
        with open(Path(shared) / RESULTS, "a") as f:
            f.write(json.dumps(record) + "\n")


def pytest_runtest_logstart(nodeid: str, location: tuple[str, int | None, str]) -> None:
    _append({"nodeid": nodeid, "when": "start"})


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    message = report.longreprtext if report.failed or report.skipped else ""
    _append({"nodeid": report.nodeid, "when": report.when, "outcome": report.outcome,
             "seconds": round(report.duration, 3), "message": message})
