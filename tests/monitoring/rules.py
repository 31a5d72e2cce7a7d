"""numapin's alert rules as the tests read them: the plain rules file and the PrometheusRule of manifests/monitoring,
the metric names their expressions use, and the names a /metrics page exports."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import yaml

from tests.debian_tools import debian_program

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "manifests/monitoring/numapin.rules.yaml"
PROMETHEUS_RULE = ROOT / "manifests/monitoring/prometheusrule.yaml"
UNIT_TESTS = Path(__file__).with_name("numapin.rules.test.yaml")
# names in expressions that are not numapin's metrics: Prometheus's own, functions, keywords
_NOT_METRICS = {"up", "time", "sum", "min", "max", "by", "on", "and", "or", "unless", "rate", "increase",
                "histogram_quantile", "le"}


def rule_groups() -> list[dict[str, Any]]:
    groups: list[dict[str, Any]] = yaml.safe_load(RULES.read_text())["groups"]
    return groups


def rules() -> list[dict[str, Any]]:
    return [r for g in rule_groups() for r in g["rules"]]


def metric_names(expr: str) -> set[str]:
    """The metric names an expression selects (label matchers, strings and recording rules' names left out)."""
    bare = re.sub(r'\{[^}]*\}|"[^"]*"|\[[^\]]*\]|\b(?:by|on|without|ignoring)\s*\([^)]*\)', " ", expr)
    return {n for n in re.findall(r"[a-zA-Z_][a-zA-Z0-9_:]*", bare) if ":" not in n and n not in _NOT_METRICS
            and not n.isdigit()}


def exported_names(page: str) -> set[str]:
    """Every sample name a Prometheus text page can hold, from its ``# TYPE`` lines (a labelled metric with no
    sample yet has only those) and its samples."""
    names: set[str] = set()
    for line in page.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(maxsplit=3)
            base = name.removesuffix("_total")
            if kind == "counter":
                names |= {base + "_total", base + "_created"}
            elif kind in ("histogram", "summary"):
                names |= {base + s for s in ("_bucket", "_sum", "_count", "_created")}
            else:
                names.add(name)
        elif line and not line.startswith("#"):
            names.add(re.split(r"[{ ]", line, maxsplit=1)[0])
    return names


def promtool() -> Path:
    """promtool from Debian's prometheus package: the installed one, else unpacked from the package (installing
    it would start a Prometheus server)."""
    found = shutil.which("promtool")
    return Path(found) if found else debian_program("prometheus", "usr/bin/promtool")
