"""A proxy without ``--metrics-address`` imports no HTTP server and no YAML parser: aiohttp is a third of the
proxy's import time, which is most of a start on a slow node (a proxy restarted after a kill -9 is back that much
sooner). Checked in a fresh interpreter, as ``numapin criproxy`` imports its modules."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("aiohttp", "yaml", "nodeagent.serve.http_server")


def imported_after(*modules: str) -> set[str]:
    code = ("import importlib, json, sys\n"
            f"for m in {list(modules)!r}:\n"
            "    importlib.import_module(m)\n"
            "print(json.dumps(sorted(sys.modules)))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    return set(json.loads(out.stdout))


def test_the_proxys_modules_import_no_http_server_or_yaml() -> None:
    loaded = imported_after("numapin.cli", "criproxy.cli", "criproxy.app")
    assert "criproxy.app" in loaded
    assert not {m for m in loaded if m in HEAVY or m.split(".")[0] in HEAVY}, sorted(loaded & set(HEAVY))


def test_the_http_server_brings_aiohttp() -> None:
    """The check above can fail: the module it keeps out does import aiohttp."""
    assert "aiohttp" in imported_after("nodeagent.serve.http_server")
