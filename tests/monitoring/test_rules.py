"""numapin's alert rules (manifests/monitoring): the plain rules file and the PrometheusRule hold the same groups,
promtool accepts them and their unit tests (numapin.rules.test.yaml, one ``promtool test rules``) pass, every alert
has a test that fires it, and every metric the rules use is one numapin exports (names checked against the code's
metric definitions here, and against the /metrics pages of a running proxy and webhook in tests/e2e/test_stack.py).
"""

from __future__ import annotations

import re
import subprocess

import yaml

from numapin_lab.k8s.binaries import find_k8s_binaries
from tests.monitoring.rules import PROMETHEUS_RULE, RULES, UNIT_TESTS, metric_names, promtool, rule_groups, rules


def test_the_prometheus_rule_holds_the_plain_rules_file() -> None:
    doc = yaml.safe_load(PROMETHEUS_RULE.read_text())
    assert doc["kind"] == "PrometheusRule" and doc["apiVersion"] == "monitoring.coreos.com/v1"
    assert doc["spec"]["groups"] == rule_groups()


def test_promtool_accepts_the_rules_and_their_unit_tests_pass() -> None:
    r = subprocess.run([str(promtool()), "test", "rules", str(UNIT_TESTS)], capture_output=True, text=True,
                       timeout=120, cwd=UNIT_TESTS.parent)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS" in r.stdout


def test_every_alert_has_a_unit_test_that_fires_it() -> None:
    tests = yaml.safe_load(UNIT_TESTS.read_text())["tests"]
    fired = {a["alertname"] for t in tests for a in t.get("alert_rule_test", []) if a.get("exp_alerts")}
    assert {r["alert"] for r in rules() if "alert" in r} == fired
    assert str(RULES.relative_to(UNIT_TESTS.parents[2])) in "".join(yaml.safe_load(UNIT_TESTS.read_text())
                                                                     ["rule_files"])


def test_the_rules_use_numapin_metrics_only() -> None:
    used = set().union(*(metric_names(r["expr"]) for r in rules()))
    assert used and all(n.startswith(("numapin_criproxy_", "numapin_webhook_")) for n in used), used


def test_every_alert_is_documented() -> None:
    text = (RULES.parents[2] / "docs/metrics.md").read_text().split("## Alerts", 1)[1]
    documented = set(re.findall(r"^\| (Numapin\w+) \|", text, re.M))
    assert documented == {r["alert"] for r in rules() if "alert" in r}


def test_the_monitoring_kustomization_renders_the_prometheus_rule() -> None:
    kubectl = find_k8s_binaries().kubectl
    r = subprocess.run([str(kubectl), "kustomize", str(PROMETHEUS_RULE.parent)], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    assert list(yaml.safe_load_all(r.stdout)) == [yaml.safe_load(PROMETHEUS_RULE.read_text())]
