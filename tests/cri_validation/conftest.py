"""The CRI validation suite's lines in the session's summary: each run's counts and wall time, the specs that fail
against containerd itself (not numapin's: with their reason) and any spec lost through numapin."""

from __future__ import annotations

import pytest

from numapin_lab.cri.critest import Comparison, CritestRun

REPORT = pytest.StashKey[list[str]]()


@pytest.fixture
def critest_report(request: pytest.FixtureRequest) -> list[str]:
    """The summary's lines (this session's), appended to by the tests."""
    return request.config.stash.setdefault(REPORT, [])


def report_lines(run: CritestRun, comparison: Comparison | None) -> list[str]:
    counts = ", ".join(f"{len(run.outcome(o))} {o}" for o in ("passed", "failed"))
    lines = [f"critest {run.label}: {counts} in {run.seconds:.0f} s (exit {run.returncode}; {run.output.name})"]
    if comparison is None:
        lines += [f"  fails against containerd itself (not numapin's): {n}: {run.specs[n].message}"
                  for n in run.outcome("failed")]
    else:
        lines += [f"  LOST through {run.label}: {n}: {m}" for n, m in comparison.lost.items()]
    return lines


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    lines = config.stash.get(REPORT, [])
    if lines:
        terminalreporter.write_sep("-", "CRI validation (critest)")
        for line in lines:
            terminalreporter.write_line(line)
