"""The CRI validation suite (kubernetes-sigs/cri-tools' ``critest``) run against a CRI endpoint, its JUnit report read
spec by spec, and two runs compared: every spec that passes against the runtime itself must pass through what is put
in front of it (numapin's proxy) or plugged into it (numapin's NRI plugin).

``FOCUS`` and ``SKIP`` choose the specs: the runtime calls numapin sees or changes (sandboxes, containers and their
lifecycle, resources, exec, attach, logs, stats, sandbox networking and sysctls, the image calls it passes through),
each run taking well under a minute of the machine; ``SKIP`` names the specs that cannot run on a lab machine with no
way out and why.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["FOCUS", "SKIP", "Cancelled", "Comparison", "CritestRun", "SpecResult", "compare", "parse_junit",
           "run_critest"]

FOCUS: tuple[str, ...] = (
    r"PodSandbox runtime should support basic operations",
    r"PodSandbox runtime should support sysctls",
    r"Container runtime should support basic operations",
    r"Container runtime should support adding volume",
    r"Container runtime should support log",
    r"Idempotence",
    r"Runtime info",
    r"Streaming runtime should support streaming interfaces runtime should support (exec|attach)",
    r"Networking runtime should support networking runtime should support (DNS config|set hostname)",
    r"NamespaceOption runtime should support HostNetwork",
    r"Container OOM",
    r"Image Manager",
    r"Image Consistency",
)

# specs inside FOCUS that cannot run here at all (each with why); they would only cost time
SKIP: Mapping[str, str] = {}


@dataclass(frozen=True)
class SpecResult:
    """One spec of a run: ``outcome`` passed, failed or skipped; ``message``: the failure's first line."""

    name: str
    outcome: str
    message: str = ""


@dataclass(frozen=True)
class CritestRun:
    """A finished run: the specs by name, critest's exit status, its wall seconds and its output's file."""

    label: str
    specs: Mapping[str, SpecResult]
    returncode: int
    seconds: float
    output: Path

    def outcome(self, outcome: str) -> list[str]:
        return sorted(n for n, s in self.specs.items() if s.outcome == outcome)


@dataclass(frozen=True)
class Comparison:
    """``lost``: specs that passed directly and not through numapin (with the latter's message); ``direct_failures``:
    specs that failed directly (not ours), with their message; ``missing``: passed directly, absent from the other."""

    lost: Mapping[str, str]
    direct_failures: Mapping[str, str]
    missing: tuple[str, ...]


def parse_junit(path: Path) -> dict[str, SpecResult]:
    """The specs of a ginkgo JUnit report (``--ginkgo.junit-report``), by name (``[It] [k8s.io] ...``)."""
    root = ET.parse(path).getroot()
    out: dict[str, SpecResult] = {}
    for case in root.iter("testcase"):
        name = case.get("name", "")
        if not name.startswith("[It]"):
            continue  # the suite's Before/After nodes
        bad = case.find("failure")
        if bad is None:
            bad = case.find("error")
        if bad is not None:
            text = " ".join((bad.get("message") or bad.text or "").split())  # gomega's message, on one line
            out[name] = SpecResult(name, "failed", text[:400])
        elif case.find("skipped") is not None:
            out[name] = SpecResult(name, "skipped")
        else:
            out[name] = SpecResult(name, "passed")
    return out


def critest_args(endpoint: str, report: Path, focus: Sequence[str] = FOCUS,
                 skip: Mapping[str, str] = SKIP) -> list[str]:
    args = [f"--runtime-endpoint=unix://{endpoint}", f"--image-endpoint=unix://{endpoint}", "--ginkgo.no-color",
            f"--ginkgo.junit-report={report}", "--ginkgo.silence-skips"]
    args += [f"--ginkgo.focus={f}" for f in focus]
    args += [f"--ginkgo.skip={s}" for s in skip]
    return args


class Cancelled(RuntimeError):
    """A run stopped because its caller asked (the test session ended first)."""


def run_critest(binary: Path, endpoint: str, directory: Path, label: str, *, focus: Sequence[str] = FOCUS,
                skip: Mapping[str, str] = SKIP, timeout: float = 900.0, cancel: threading.Event | None = None,
                niceness: int = 0) -> CritestRun:
    """Run critest (under ``nice -n niceness``) against the CRI socket ``endpoint`` (runtime and image service) in
    ``directory`` (its report and output go there); ``cancel`` set kills it and raises ``Cancelled``."""
    directory.mkdir(parents=True, exist_ok=True)
    report, output = directory / "junit.xml", directory / "critest.log"
    start = time.monotonic()
    with open(output, "wb") as log:
        nice = ["nice", "-n", str(niceness)] if niceness else []
        proc = subprocess.Popen([*nice, str(binary), *critest_args(endpoint, report, focus, skip)], cwd=directory,
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                env={**os.environ, "GINKGO_NO_COLOR": "TRUE"})
        try:
            while True:
                try:
                    code = proc.wait(timeout=0.5)
                    break
                except subprocess.TimeoutExpired:
                    if (cancel is not None and cancel.is_set()) or time.monotonic() - start > timeout:
                        proc.kill()
                        proc.wait()
                        if cancel is not None and cancel.is_set():
                            raise Cancelled(f"critest ({label}) cancelled") from None
                        code = -1
                        break
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    seconds = time.monotonic() - start
    if not report.exists():
        tail = output.read_text(errors="replace")[-2000:]
        raise RuntimeError(f"critest ({label}) wrote no report (exit {code}):\n{tail}")
    return CritestRun(label, parse_junit(report), code, seconds, output)


def compare(direct: CritestRun, through: CritestRun) -> Comparison:
    lost = {n: through.specs[n].message or through.specs[n].outcome for n in direct.outcome("passed")
            if n in through.specs and through.specs[n].outcome != "passed"}
    failures = {n: direct.specs[n].message for n in direct.outcome("failed")}
    missing = tuple(n for n in direct.outcome("passed") if n not in through.specs)
    return Comparison(lost, failures, missing)
