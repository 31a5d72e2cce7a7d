"""Reading critest's JUnit report and comparing two runs (numapin_lab.cri.critest), on reports written here in
ginkgo's shape; and finding the Kubernetes binaries (numapin_lab.k8s_bin) fails loudly on a bad setting."""

from __future__ import annotations

from pathlib import Path

import pytest

from numapin_lab.cri.critest import CritestRun, compare, critest_args, parse_junit
from numapin_lab.k8s_bin import K8sBinError, find_binary

REPORT = """<?xml version="1.0" encoding="UTF-8"?>
<testsuites tests="4" failures="1"><testsuite name="CRI validation" tests="4">
<testcase name="[BeforeSuite]" status="passed" time="0"></testcase>
<testcase name="[It] [k8s.io] a runs" status="passed" time="1"></testcase>
<testcase name="[It] [k8s.io] b runs" status="{b}" time="1">{b_failure}</testcase>
<testcase name="[It] [k8s.io] c fails" status="failed" time="1">
<failure message="Expected&#xA;    &lt;string&gt;: x&#xA;to be empty" type="failed">[FAILED]</failure></testcase>
<testcase name="[It] [k8s.io] d skipped" status="skipped" time="0"><skipped message="skipped"></skipped></testcase>
</testsuite></testsuites>
"""


def _run(tmp_path: Path, label: str, b_fails: bool) -> CritestRun:
    path = tmp_path / f"{label}.xml"
    failure = '<failure message="rpc error: code = Unknown" type="failed"></failure>' if b_fails else ""
    path.write_text(REPORT.format(b="failed" if b_fails else "passed", b_failure=failure))
    return CritestRun(label, parse_junit(path), 1, 1.0, path)


def test_a_spec_lost_through_numapin_is_named_and_a_direct_failure_is_not_ours(tmp_path: Path) -> None:
    direct, same, worse = _run(tmp_path, "d", False), _run(tmp_path, "s", False), _run(tmp_path, "w", True)
    assert direct.outcome("passed") == ["[It] [k8s.io] a runs", "[It] [k8s.io] b runs"]
    assert direct.outcome("skipped") == ["[It] [k8s.io] d skipped"]
    assert direct.specs["[It] [k8s.io] c fails"].message == "Expected <string>: x to be empty"
    ok = compare(direct, same)
    assert not ok.lost and not ok.missing and list(ok.direct_failures) == ["[It] [k8s.io] c fails"]
    assert compare(direct, worse).lost == {"[It] [k8s.io] b runs": "rpc error: code = Unknown"}
    gone = CritestRun("g", {k: v for k, v in same.specs.items() if "a runs" not in k}, 0, 1.0, tmp_path)
    assert compare(direct, gone).missing == ("[It] [k8s.io] a runs",)


def test_critest_is_pointed_at_one_socket_for_both_services() -> None:
    args = critest_args("/run/x.sock", Path("/tmp/r.xml"), focus=("A",), skip={"B": "why"})
    assert "--runtime-endpoint=unix:///run/x.sock" in args and "--image-endpoint=unix:///run/x.sock" in args
    assert "--ginkgo.focus=A" in args and "--ginkgo.skip=B" in args


def test_a_bad_binary_setting_fails_loudly(tmp_path: Path) -> None:
    with pytest.raises(K8sBinError, match="CRITEST_BIN"):  # (not the process's environment: other threads read it)
        find_binary("critest", env={"CRITEST_BIN": str(tmp_path / "nothing")})
    with pytest.raises(K8sBinError, match="unknown binary"):
        find_binary("kubeadm")
