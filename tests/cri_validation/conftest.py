"""The CRI validation suite: when the tests are collected and a check of test_critest.py is selected, its three
critest runs start in the background (tests/cri_validation/background.py) and those checks move to the end of the
session, where they wait for the runs; the session's end cancels runs still going and waits for their tear-down
(before the leftover check of tests/conftest.py). The summary gives each run's counts and wall time, the specs that
fail against containerd itself (not numapin's: with their reason) and any spec lost through numapin."""

from __future__ import annotations

import pytest

from numapin_lab.cri.critest import Comparison, CritestRun
from tests.cri_validation.background import Validated, Validation

REPORT = pytest.StashKey[list[str]]()
_VALIDATION = pytest.StashKey[Validation]()
MODULE = "test_critest.py"


def _waits(item: pytest.Item) -> bool:
    return item.path.name == MODULE and item.path.parent.name == "cri_validation"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The checks that read the runs go last (in their order), after everything that can run meanwhile."""
    waiting = [i for i in items if _waits(i)]
    if waiting:
        items[:] = [i for i in items if not _waits(i)] + waiting


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start the runs now, in the background (not for --collect-only, nor when no check of theirs is selected)."""
    if session.config.option.collectonly or not any(map(_waits, session.items)):
        return
    session.config.stash[_VALIDATION] = Validation()


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    validation = session.config.stash.get(_VALIDATION, None)
    if validation is not None:
        validation.close()


@pytest.fixture(scope="session")
def critest_runs(pytestconfig: pytest.Config) -> Validated:
    """The three runs (and what the doors admitted), waited for (started at collection)."""
    validation = pytestconfig.stash.get(_VALIDATION, None)
    if validation is None:
        validation = pytestconfig.stash[_VALIDATION] = Validation()
    return validation.result()


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
