"""The CRI validation suite (critest v1.36.0, kubernetes-sigs/cri-tools) against REAL containerd 2.1.9 (Debian's)
three ways, compared spec by spec: (a) containerd directly, (b) through ``numapin criproxy`` with its default flags
(critest on the proxy's socket, as kubelet's ``containerRuntimeEndpoint``), (c) with ``numapin nri`` plugged into
containerd (critest on containerd's socket). Every spec that passes directly must pass through numapin; a spec that
fails directly is not ours: the session's summary names it with its reason.

Three labs, one per way, each with a CNI bridge network of its own (pods off the host's network) and every pull
served by one local registry (numapin_lab.cri.registry: no way out here); the three runs go at once, in the
background from the session's start (tests/cri_validation/background.py), and these checks run last and read them.
The specs: ``numapin_lab.cri.critest.FOCUS``. critest comes from ``$CRITEST_BIN`` or ``k8s-bin``
(numapin_lab.k8s_bin): missing, the checks fail, never skip.
"""

from __future__ import annotations

import pytest

from numapin_lab.cri.critest import Comparison, compare
from tests.cri_validation.background import Validated
from tests.cri_validation.conftest import report_lines

pytestmark = pytest.mark.containerd

MIN_PASSED = 48  # of the 54 specs FOCUS selects, 51 pass directly here (a run that passes fewer is broken)
MIN_ADMITTED = 20  # 31 containers here go through each door's admission: one that admitted fewer was not in the path


def test_critest_runs_against_containerd_itself(critest_runs: Validated,
                                                critest_report: list[str]) -> None:
    """The baseline is a real run: enough specs passed directly (a broken lab or image would fail most)."""
    direct = critest_runs.runs["containerd"]
    passed = direct.outcome("passed")
    critest_report.extend(report_lines(direct, None))
    assert len(passed) >= MIN_PASSED, (f"only {len(passed)} specs passed against containerd itself:\n"
                                       + "\n".join(f"  {n}: {direct.specs[n].message}"
                                                   for n in direct.outcome("failed")))


@pytest.mark.parametrize("door", ["criproxy", "nri"])
def test_every_spec_that_passes_directly_passes_through_numapin(critest_runs: Validated, door: str,
                                                               critest_report: list[str]) -> None:
    c: Comparison = compare(critest_runs.runs["containerd"], critest_runs.runs[door])
    critest_report.extend(report_lines(critest_runs.runs[door], c))
    critest_report.append(f"  numapin {door} admitted {critest_runs.admitted[door]:g} containers meanwhile")
    critest_report.extend(f"  failed once through {door}, passed when run again alone: {n}: {m[:160]}"
                          for n, m in critest_runs.retried.get(door, {}).items())
    assert critest_runs.admitted[door] >= MIN_ADMITTED, (  # critest's containers went through numapin's decisions
        f"numapin {door} admitted only {critest_runs.admitted[door]:g} containers during critest")
    assert not c.missing, f"specs that passed directly did not run through {door}: {c.missing}"
    assert not c.lost, f"specs that pass against containerd fail through numapin {door}:\n" + "\n".join(
        f"  {n}: {m}" for n, m in c.lost.items())
