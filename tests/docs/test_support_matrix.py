"""The support matrix (docs/node.md, "Support matrix") names the tests that prove each cell: every ``tests/...``
file it names exists, every ``::test_name`` is a test defined in that file, and every containerd version it claims
is one the suite's containerd fixture runs (``numapin_lab.cri.containerd_versions.CONTAINERDS``)."""

from __future__ import annotations

import re
from pathlib import Path

from numapin_lab.cri.containerd_versions import CONTAINERDS

ROOT = Path(__file__).resolve().parents[2]
_REF = re.compile(r"`(tests/[\w/]+\.py|[\w/]+\.py)(?:::(\w+))?")


def matrix_rows() -> list[str]:
    text = (ROOT / "docs/node.md").read_text()
    section = text.split("## Support matrix", 1)[1].split("\n## ", 1)[0]
    table = section.split("| Dimension", 1)[1].split("\n\n", 1)[0]  # the matrix: the first table, to its end
    return [line for line in table.splitlines()[1:] if line.startswith("| ")]


def test_every_test_the_matrix_names_exists() -> None:
    rows = matrix_rows()
    assert len(rows) >= 10
    checked = 0
    for row in rows:
        base = "tests/criproxy"
        for path, name in _REF.findall(row):
            if not path.startswith("tests/"):  # a file named after its directory's: tests/criproxy/x.py, then y.py
                if "/" in path and not path.startswith("guest/"):
                    continue  # a product module (numapin_lab/...)
                path = f"tests/numa/{path}" if path.startswith("guest/") else f"{base}/{path}"
            else:
                base = str(Path(path).parent)
            file = ROOT / path
            assert file.exists(), f"the support matrix names {path}, which does not exist: {row[:80]}"
            if name:
                assert re.search(rf"^(async )?def {name}\(", file.read_text(), re.MULTILINE), (
                    f"the support matrix names {path}::{name}, which is not a test there")
            checked += 1
    assert checked >= 20


def test_the_containerd_versions_it_claims_are_the_ones_the_suite_runs() -> None:
    claimed = [row.split("|")[2].strip() for row in matrix_rows() if row.split("|")[1].strip() == "containerd"]
    proven = [c for c in claimed if not c.startswith(("1.5", "other"))]
    assert [c.split()[0][:3] for c in proven] == ["1.6", "1.7", "2.1"]
    assert list(CONTAINERDS) == ["1.6", "1.7", "2.x"]
    assert {v.suite for v in CONTAINERDS.values()} == {None, "trixie", "sid"}
