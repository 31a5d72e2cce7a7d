"""The ``numapin`` entry point: a command loads its own module alone, the command list shows them all."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from numapin.cli import SUBCOMMANDS

ROOT = Path(__file__).resolve().parents[2]

# runs main(ARGV) in a fresh interpreter, then prints which subcommand modules it had loaded
PROBE = """
import json, sys
from numapin.cli import SUBCOMMANDS, main
try:
    code = main(json.loads(sys.argv[1]))
except SystemExit as e:
    code = e.code
print(json.dumps({"code": code, "loaded": [n for n, m in SUBCOMMANDS if m in sys.modules]}))
"""


def loaded_by(*argv: str) -> tuple[int, list[str], str]:
    r = subprocess.run([sys.executable, "-c", PROBE, json.dumps(argv)], cwd=ROOT, capture_output=True, text=True,
                       timeout=60)
    out = json.loads(r.stdout.strip().splitlines()[-1])
    return out["code"], out["loaded"], r.stdout + r.stderr


@pytest.mark.parametrize("command", ["wait-socket", "status", "mode", "export-kubelet-state"])
def test_a_command_loads_its_own_module_alone(command: str) -> None:
    code, loaded, _ = loaded_by(command, "--help")
    assert code == 0
    assert loaded == [command]


def test_the_command_list_shows_every_command() -> None:
    code, loaded, out = loaded_by("--help")
    assert code == 0
    assert loaded == [n for n, _ in SUBCOMMANDS]
    for name, _ in SUBCOMMANDS:
        assert name in out


def test_an_unknown_command_is_refused_naming_the_known_ones() -> None:
    code, _, out = loaded_by("wait-sockets", "/run/x.sock")
    assert code == 2
    assert "invalid choice: 'wait-sockets'" in out and "wait-socket" in out and "criproxy" in out


def test_a_command_runs_with_its_own_module_alone(tmp_path: Path) -> None:
    code, loaded, out = loaded_by("wait-socket", str(tmp_path / "none.sock"), "--timeout", "0")
    assert code == 1, out
    assert "nothing answered" in out
    assert loaded == ["wait-socket"]
