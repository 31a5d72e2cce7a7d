"""Run a pytest selection inside a multi-NUMA VM (numapin_lab.numa_vm) and read back each test's outcome.

The guest's pytest writes a JUnit XML file to a host directory shared read-write with the VM; the host side
turns it into one result per guest test, so each check fails on its own with its own message. Generic: any
selection (files, node ids, ``-k``) in any topology; tests/numa/test_multi_numa.py uses it for the shapes.

From the shell (e.g. the proxy's reliability churn, once, where exclusive CPUs are plentiful)::

    .venv/bin/python -m tests.numa.harness --topology 2s4n tests/criproxy/test_churn.py
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from numapin_lab.numa_vm import VMSpec, run_in_vm
from tests.numa.shapes import IN_VM_ENV

__all__ = ["CaseResult", "GuestRun", "run_pytest_in_vm"]

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class CaseResult:
    nodeid: str          # file::test[params], the file relative to its directory
    outcome: str         # passed, failed, error, skipped
    message: str
    seconds: float

    @property
    def check(self) -> str:
        """The test function, without parameters."""
        return self.nodeid.split("[", 1)[0]


@dataclass(frozen=True)
class GuestRun:
    returncode: int      # the guest pytest's (0 all passed, 1 some failed), or numa-vm.sh's 124/125/130
    boots: int
    seconds: float
    cases: tuple[CaseResult, ...]
    log: Path            # the guest's pytest output and numa-vm.sh's messages

    def of(self, check: str) -> list[CaseResult]:
        return [c for c in self.cases if c.check == check]

    def tail(self, lines: int = 60) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return f"(no log at {self.log})"


def parse_junit(path: Path) -> tuple[CaseResult, ...]:
    if not path.exists():
        return ()
    out = []
    for case in ET.parse(path).getroot().iter("testcase"):
        module = case.get("classname", "").rsplit(".", 1)[-1]
        nodeid = f"{module}.py::{case.get('name', '')}"
        outcome, message = "passed", ""
        for kind in ("failure", "error", "skipped"):
            el = case.find(kind)
            if el is not None:
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[kind]
                message = "\n".join(x for x in (el.get("message", ""), el.text or "") if x)
                if kind != "skipped":
                    break
        out.append(CaseResult(nodeid, outcome, message, float(case.get("time", "0") or 0)))
    return tuple(out)


def run_pytest_in_vm(spec: VMSpec, selection: Sequence[str], workdir: Path, *,
                     env: Mapping[str, str] | None = None, test_timeout: int = 600) -> GuestRun:
    """Boot ``spec``, run ``python -m pytest SELECTION`` in it (this source tree and virtualenv, seen at the same
    paths in the guest, with ``$NUMAPIN_IN_VM=1`` and a tmpfs on /tmp), return each test's outcome. ``workdir``
    (a host directory, not under /tmp) is shared with the guest and receives ``junit.xml`` and ``vm.log``."""
    workdir.mkdir(parents=True, exist_ok=True)
    junit = workdir / "junit.xml"
    junit.unlink(missing_ok=True)
    if workdir.resolve().is_relative_to("/tmp"):
        raise ValueError(f"{workdir}: the guest mounts a tmpfs on /tmp, so the shared directory must be elsewhere")
    pytest_argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-o", "addopts=", "-q", "-rfE",
                   f"--junitxml={junit}", f"--timeout={test_timeout}", *selection]
    # /tmp in the guest is the overlay root, where containerd's overlayfs snapshots cannot live: a tmpfs there
    # lets tests that keep their containerd under /tmp (the host's end-to-end tests) run unchanged
    command = ["/bin/sh", "-c", 'mount -t tmpfs -o mode=1777 numapin-tmp /tmp && exec "$@"', "sh", *pytest_argv]
    spec = replace(spec, shares=(*spec.shares, str(workdir)),
                   env={**spec.env, IN_VM_ENV: "1", "PYTHONUNBUFFERED": "1", **(env or {})})
    log = workdir / "vm.log"
    with open(log, "wb") as out:
        result = run_in_vm(spec, command, stdout=out, stderr=subprocess.STDOUT, cwd=str(ROOT))
    return GuestRun(result.returncode, result.boots, result.seconds, parse_junit(junit), log)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.numa.harness",
                                     description="run a pytest selection inside a multi-NUMA VM; prints each test's "
                                                 "outcome; exit 0 when all passed")
    parser.add_argument("--topology", default="2s4n", help="numa-vm.sh preset or <S>s<C>c<T>t<N>n (default 2s4n)")
    parser.add_argument("--cgroup", default="v1", choices=("v1", "v2"))
    parser.add_argument("--timeout", type=int, default=1800, help="whole VM run, seconds (default 1800)")
    parser.add_argument("selection", nargs="+", help="pytest arguments (files, node ids, -k ...)")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="numapin-vm-run-", dir="/var/tmp"))
    run = run_pytest_in_vm(VMSpec(topology=args.topology, cgroup=args.cgroup, timeout=args.timeout),
                           args.selection, work, test_timeout=args.timeout)
    for c in run.cases:
        print(f"{c.outcome:7} {c.seconds:7.1f} s  {c.nodeid}")
        if c.outcome not in ("passed", "skipped"):
            print("        " + c.message.replace("\n", "\n        ")[:4000])
    print(f"guest pytest exit {run.returncode}, {run.boots} boot(s), {run.seconds:.0f} s; log {run.log}")
    return 0 if run.returncode == 0 and run.cases else 1


if __name__ == "__main__":
    sys.exit(main())
