"""How often a multi-NUMA guest freezes: the 2s4n shape's boot (tests/numa/test_multi_numa.py's, the story and
the churn) run again and again, alternating QEMU's TCG threading modes (numa-vm.sh's ``NUMA_VM_TCG_THREAD``:
single, multi), one VM at a time. A frozen boot is examined and booted again by the harness as in the test run;
here every boot is counted. Prints one JSON line per run (mode, host seconds, boots, freezes, the post-mortem's
summary, the tests' outcomes), then a JSON summary per mode. A run's work directory (its guest logs, QEMU's runs,
the operations log) is kept under /var/tmp when the run was not green, and named in its line; a green run's is
removed (``--keep``: every run's is kept).

    .venv/bin/python benchmarks/numa_vm_freezes.py --runs 4 [--modes single,multi] [--shape 2s4n] [--keep]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.numa.boots import guest_files, vm_spec
from tests.numa.guest.node import OPLOG_ENV
from tests.numa.harness import run_pytest_in_vm
from tests.numa.shapes import SHAPE_ENV, SHAPES


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--runs", type=int, default=3, help="runs per mode (at least 1)")
    parser.add_argument("--modes", default="single,multi", help="NUMA_VM_TCG_THREAD values, comma-separated")
    parser.add_argument("--shape", default="2s4n", choices=sorted(SHAPES))
    parser.add_argument("--keep", action="store_true", help="keep every run's work directory (default: the red ones)")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    if not set(args.modes.split(",")) <= {"single", "multi"}:
        parser.error(f"--modes takes single and/or multi, not {args.modes!r}")
    shape = SHAPES[args.shape]
    modes = args.modes.split(",")
    totals = {m: {"runs": 0, "boots": 0, "boot_hangs": 0, "freezes": 0, "green": 0, "seconds": 0.0, "cpu": 0.0}
              for m in modes}
    for i in range(args.runs):
        for mode in modes:
            os.environ["NUMA_VM_TCG_THREAD"] = mode
            work = Path(tempfile.mkdtemp(prefix=f"numapin-freeze-{mode}-", dir="/var/tmp"))
            t0 = time.time()
            run = run_pytest_in_vm(vm_spec(shape), [str(f) for f in guest_files(shape)], work,
                                   env={SHAPE_ENV: shape.name, OPLOG_ENV: str(work / "operations.log")},
                                   test_timeout=shape.timeout // 2)
            passed = sum(c.outcome == "passed" for c in run.cases)
            green = run.returncode == 0 and passed == len(run.cases) > 0
            t = totals[mode]
            t["runs"] += 1
            t["boots"] += run.boots
            t["freezes"] += len(run.stalls)
            t["boot_hangs"] += run.boot_hangs
            t["green"] += green
            t["seconds"] += run.seconds
            t["cpu"] += run.cpu_seconds
            kept = args.keep or not green
            if not kept:
                shutil.rmtree(work, ignore_errors=True)
            print(json.dumps({"run": i + 1, "mode": mode, "start": time.strftime("%H:%M:%S", time.gmtime(t0)),
                              "seconds": round(run.seconds), "cpu": round(run.cpu_seconds),
                              "guest_seconds": round(run.guest_seconds or 0), "returncode": run.returncode,
                              "boots": run.boots, "boot_hangs": run.boot_hangs, "freezes": len(run.stalls),
                              "watchdog": run.watchdog, "stalls": run.stalls,
                              "passed": passed, "cases": len(run.cases),
                              "not_passed": [f"{c.nodeid} {c.outcome}" for c in run.cases if c.outcome != "passed"],
                              "load": os.getloadavg()[0], "dir": str(work) if kept else None}), flush=True)
    print(json.dumps({"summary": totals}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
