"""Run a pytest selection inside a multi-NUMA VM (numapin_lab.numa_vm) and read back each test's outcome.

The guest's pytest appends each test's outcome, as it happens, to a file in a host directory shared read-write
with the VM (tests.numa.guest_results); the host side turns it into one result per guest test, so each check
fails on its own with its own message, and the checks that finished keep their outcome when the VM is stopped
later (its time limit). Generic: any selection (files, node ids, ``-k``) in any topology;
tests/numa/test_multi_numa.py uses it for the shapes.

From the shell (e.g. the proxy's reliability churn, once, where exclusive CPUs are plentiful)::

    .venv/bin/python -m tests.numa.harness --topology 2s4n tests/criproxy/test_churn.py
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from numapin_lab.numa_vm import GUEST_STALLED, Heartbeat, VMSpec
from numapin_lab.systemd_vm import run_vm
from numapin_lab.vm_postmortem import DUMP_DONE, DUMP_REQUEST, KALLSYMS, collect
from tests.numa import guest_paths
from tests.numa.background import Cancelled
from tests.numa.guest_results import RESULTS
from tests.numa.guest_script import HEARTBEAT, guest_command
from tests.numa.shapes import IN_VM_ENV, SHARED_ENV

__all__ = ["CaseResult", "GuestRun", "run_pytest_in_vm"]

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("allocator", "nodeagent", "criproxy", "nriplugin", "numapin", "numapin_lab", "webhook", "protos", "tests")
# pytest options of the guest's run: no hypothesis plugin (importing it costs 10-15 s under emulation; no guest
# test uses it), no cache directory (the tree is read-only there)
GUEST_PYTEST = ("-p", "no:cacheprovider", "-p", "no:hypothesispytest", "-o", "addopts=")
# a guest whose heartbeat (rewritten every 10 s by a shell loop beside its pytest) has not changed for this long is
# frozen (seen once: an emulated kernel spinning on all its vCPUs for 20 min with the host idle): it is stopped and
# booted again, once; a hang of numapin's own code keeps the heartbeat going and still fails at the time limit
STALL_SECONDS = 240.0
RE_BOOTS = 1  # a frozen guest is booted again this many times


@dataclass(frozen=True)
class CaseResult:
    nodeid: str          # file::test[params], the file relative to its directory
    outcome: str         # passed, failed, error, skipped, unfinished (the VM stopped during it)
    message: str
    seconds: float

    @property
    def check(self) -> str:
        """The test function, without parameters."""
        return self.nodeid.split("[", 1)[0]


@dataclass(frozen=True)
class GuestRun:
    returncode: int      # the guest pytest's (0 all passed, 1 some failed), numa-vm.sh's 124/125/130, or 126 (stalled)
    boots: int           # QEMU boots, all of them: the watchdogs' re-boots included
    seconds: float
    cases: tuple[CaseResult, ...]
    log: Path            # the guest's pytest output and numa-vm.sh's messages
    guest_seconds: float | None = None   # the guest's pytest by the guest's clock (boot excluded)
    cpu_seconds: float = 0.0             # QEMU's CPU time: the work, whatever the host's load
    stalls: tuple[str, ...] = ()         # boots stopped as frozen before this one (what was running, where kept)
    churn: Mapping[str, Any] | None = None  # the guest's churn report (churn.json), read before the directory goes
    boot_hangs: int = 0  # boots numa-vm.sh stopped for not reaching the command in time, and booted again
    vm_failures: int = 0  # VMs that ended without the guest's exit code (numa-vm.sh's 125), run again

    @property
    def watchdog(self) -> str:
        """What the watchdogs saw: every boot, and why each one but the last was followed by another."""
        parts = []
        if self.boot_hangs:
            parts.append(f"{self.boot_hangs} hung while booting (booted again by numa-vm.sh)")
        if self.vm_failures:
            parts.append(f"{self.vm_failures} VM failure(s) (run again)")
        if self.stalls:
            gave_up = self.returncode == GUEST_STALLED
            parts.append(f"{len(self.stalls)} froze after booting (heartbeat watchdog: "
                         f"{len(self.stalls) - gave_up} booted again{', then gave up' if gave_up else ''})")
        return f"{self.boots} boot(s)" + (": " + "; ".join(parts) if parts else "")

    @property
    def boot_seconds(self) -> float | None:
        """Everything but the guest's pytest: boots (retries included), shutdown."""
        return None if self.guest_seconds is None else self.seconds - self.guest_seconds

    def slowest(self, count: int = 3) -> str:
        """The ``count`` checks that took longest in the guest (by its clock, all phases), slowest first: where a
        shape's time goes, printed in every summary so that a slow run's log says it."""
        ranked = sorted(self.cases, key=lambda c: c.seconds, reverse=True)[:count]
        return ", ".join(f"{c.nodeid} {c.seconds:.0f} s" for c in ranked)

    @property
    def clock_note(self) -> str:
        """A warning when the guest's clock ran faster than the host's (its timeouts were shorter than written)."""
        if self.guest_seconds is not None and self.guest_seconds > 1.1 * self.seconds:
            return (f" WARNING: the guest's clock ran fast ({self.guest_seconds:.0f} s in the guest for "
                    f"{self.seconds:.0f} s on the host)")
        return ""

    @property
    def stall_note(self) -> str:
        return "".join(f" WARNING: boot froze: {s}" for s in self.stalls)

    def of(self, check: str) -> list[CaseResult]:
        return [c for c in self.cases if c.check == check]

    def tail(self, lines: int = 60) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return f"(no log at {self.log})"


def parse_results(path: Path) -> tuple[CaseResult, ...]:
    """Each test's outcome from the guest's ``results.jsonl`` (tests.numa.guest_results): failed (its call failed),
    error (its set-up or tear-down did), skipped, passed, or unfinished (started, never reported: the VM stopped)."""
    phases: dict[str, list[dict[str, Any]]] = {}
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return ()
    for line in lines:
        try:
            rec = json.loads(line)
        except ValueError:
            continue  # a line cut short when the VM stopped
        phases.setdefault(rec["nodeid"], []).append(rec)
    out = []
    for nodeid, recs in phases.items():
        done = [r for r in recs if r["when"] != "start"]
        failed = next((r for r in done if r["outcome"] == "failed"), None)
        skipped = next((r for r in done if r["outcome"] == "skipped"), None)
        if failed is not None:
            outcome, message = ("failed" if failed["when"] == "call" else "error"), failed["message"]
        elif skipped is not None:
            outcome, message = "skipped", skipped["message"]
        elif any(r["when"] == "teardown" for r in done):
            outcome, message = "passed", ""
        else:
            outcome, message = "unfinished", "started, never finished: the VM stopped during it"
        name = nodeid.rsplit("/", 1)[-1]  # file::test[params], the file by its name
        out.append(CaseResult(name, outcome, message, sum(r.get("seconds", 0.0) for r in done)))
    return tuple(out)


def warm_bytecode(selection: Sequence[str], environ: Mapping[str, str]) -> None:
    """Compile the source tree and let pytest rewrite the selection's test modules here, on the host, into the
    ``__pycache__`` directories the guest reads: the guest's root is the host's, read-only under a throw-away
    overlay, so whatever it compiles is lost with the boot (compiling costs it 10-20 s of emulated CPU per boot).
    Best effort: a failure here only leaves the guest to compile."""
    subprocess.run([sys.executable, "-m", "compileall", "-q", *PACKAGES], cwd=ROOT, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, check=False)
    subprocess.run([sys.executable, "-m", "pytest", *GUEST_PYTEST, "--collect-only", "-q", *selection], cwd=ROOT,
                   env={**{k: v for k, v in environ.items() if k != "PYTHONDONTWRITEBYTECODE"}, IN_VM_ENV: "1"},
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   check=False)


def run_pytest_in_vm(spec: VMSpec, selection: Sequence[str], workdir: Path, *,
                     env: Mapping[str, str] | None = None, test_timeout: int = 600,
                     cancel: threading.Event | None = None, environ: Mapping[str, str] | None = None) -> GuestRun:
    """Boot ``spec``, run ``python -m pytest SELECTION`` in it (this source tree and virtualenv, seen at the same
    paths in the guest wherever they are, with ``$NUMAPIN_IN_VM=1`` and a tmpfs on /tmp: tests.numa.guest_script),
    return each test's outcome. ``workdir`` (a host directory) is shared with the guest and receives
    ``results.jsonl`` (each test's outcome as it happens) and ``vm.log``. A path the guest cannot see raises
    guest_paths.GuestPathError (its message names the path and why) before any boot. A guest whose heartbeat
    stops is examined (numapin_lab.vm_postmortem, into ``stalled-N/post-mortem``), stopped and booted again, up
    to RE_BOOTS times. Safe in a thread beside other tests (tests.numa.boots): ``environ`` is the environment of
    the processes it starts (default: a copy of ours now; a thread passes one taken before the tests began, which
    may change it), and once ``cancel`` is set the VM is stopped and background.Cancelled raised."""
    environ = dict(os.environ if environ is None else environ)
    workdir.mkdir(parents=True, exist_ok=True)
    keep = guest_paths.plan(guest_paths.needed_paths(ROOT), [*map(Path, spec.shares), workdir])
    results = workdir / RESULTS
    results.unlink(missing_ok=True)
    pytest_argv = [sys.executable, "-m", "pytest", *GUEST_PYTEST, "-p", "tests.numa.guest_results", "-q", "-rfE",
                   f"--timeout={test_timeout}", *selection]
    warm_bytecode(selection, environ)
    command = guest_command(keep, pytest_argv)
    spec = replace(spec, shares=(*spec.shares, str(workdir)),
                   env={**spec.env, IN_VM_ENV: "1", SHARED_ENV: str(workdir), "PYTHONUNBUFFERED": "1",
                        **(env or {})})
    log = workdir / "vm.log"
    stalls: list[str] = []
    seconds = cpu = 0.0
    boots = hangs = failures = 0
    runs_dir = Path(tempfile.mkdtemp(prefix="numapin-vm-qemu-", dir="/var/tmp"))  # numa-vm.sh's, for post-mortems
    try:
        while True:
            for name in ("guest-start", "guest-end", "guest-clocksource", HEARTBEAT, "ps.txt", RESULTS, "churn.json",
                         KALLSYMS, DUMP_REQUEST, DUMP_DONE):
                (workdir / name).unlink(missing_ok=True)
            for value in (env or {}).values():  # files the guest appends to (the operation log): fresh per boot
                if value.startswith(str(workdir) + os.sep):
                    Path(value).unlink(missing_ok=True)
            kept = workdir / f"stalled-{len(stalls) + 1}"

            def post_mortem(why: str, kept: Path = kept) -> str:
                return "; " + collect(runs_dir, workdir, kept / "post-mortem").summary()

            with open(log, "wb") as out:
                result = run_vm(spec, command, stdout=out, stderr=subprocess.STDOUT, cwd=str(ROOT),
                                stalled=_Watch(Heartbeat(workdir / HEARTBEAT, STALL_SECONDS), cancel),
                                on_stall=post_mortem, runs_dir=runs_dir, environ=environ)
            seconds, cpu, boots = seconds + result.seconds, cpu + result.cpu_seconds, boots + result.boots
            failures += result.boots - 1
            for hung in sorted(runs_dir.glob("boot-hang-*.console.log")):  # numa-vm.sh's own re-boots
                (workdir / "boot-hangs").mkdir(exist_ok=True)
                hung.replace(workdir / "boot-hangs" / f"{hangs + 1}.console.log")
                hangs += 1
            if result.returncode != GUEST_STALLED:
                break
            kept.mkdir(exist_ok=True)
            for path in workdir.iterdir():
                if path.is_file():
                    path.replace(kept / path.name)
            running = next((c.nodeid for c in parse_results(kept / RESULTS) if c.outcome == "unfinished"), "?")
            stalls.append(f"{result.stall} during {running} ({result.seconds:.0f} s; kept in {kept})")
            if len(stalls) > RE_BOOTS:
                break
    finally:
        shutil.rmtree(runs_dir, ignore_errors=True)
    try:
        churn = json.loads((workdir / "churn.json").read_text())
    except (OSError, ValueError):
        churn = None
    return GuestRun(result.returncode, boots + hangs, seconds, parse_results(results), log, guest_seconds(workdir),
                    cpu, tuple(stalls), churn, hangs, failures)


class _Watch:
    """The heartbeat watchdog, which also stops the VM when ``cancel`` is set (run_in_vm stops it on the
    exception and lets it go on)."""

    def __init__(self, heartbeat: Heartbeat, cancel: threading.Event | None) -> None:
        self.heartbeat = heartbeat
        self.cancel = cancel

    def __call__(self) -> str | None:
        if self.cancel is not None and self.cancel.is_set():
            raise Cancelled("the test session ended before this VM's tests finished: the VM was stopped")
        return self.heartbeat()


def guest_seconds(workdir: Path) -> float | None:
    """How long the guest's pytest ran by the guest's clock (None when the guest did not get that far)."""
    try:
        return float((workdir / "guest-end").read_text()) - float((workdir / "guest-start").read_text())
    except (OSError, ValueError):
        return None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.numa.harness",
                                     description="run a pytest selection inside a multi-NUMA VM; prints each test's "
                                                 "outcome; exit 0 when all passed")
    parser.add_argument("--topology", default="2s4n", help="numa-vm.sh preset or <S>s<C>c<T>t<N>n (default 2s4n)")
    parser.add_argument("--cgroup", default="v1", choices=("v1", "v2"))
    parser.add_argument("--init", default="busybox", choices=("busybox", "systemd"),
                        help="PID 1 of the guest: numa-vm.sh's busybox, or systemd (needs --cgroup v2)")
    parser.add_argument("--timeout", type=int, default=1800, help="whole VM run, seconds (default 1800)")
    parser.add_argument("selection", nargs="+", help="pytest arguments (files, node ids, -k ...)")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="numapin-vm-run-", dir="/var/tmp"))
    try:
        run = run_pytest_in_vm(VMSpec(topology=args.topology, cgroup=args.cgroup, timeout=args.timeout,
                                      init=args.init),
                               args.selection, work, test_timeout=args.timeout)
    except guest_paths.GuestPathError as e:
        print(f"numapin: {e}", file=sys.stderr)
        return 2
    for c in run.cases:
        print(f"{c.outcome:7} {c.seconds:7.1f} s  {c.nodeid}")
        if c.outcome not in ("passed", "skipped"):
            print("        " + c.message.replace("\n", "\n        ")[:4000])
    print(f"guest pytest exit {run.returncode}, {run.watchdog}, {run.seconds:.0f} s "
          f"({run.guest_seconds or 0:.0f} s of tests by the guest's clock, {run.cpu_seconds:.0f} s of CPU)"
          f"{run.clock_note}{run.stall_note}; log {run.log}")
    return 0 if run.returncode == 0 and run.cases else 1


if __name__ == "__main__":
    sys.exit(main())
