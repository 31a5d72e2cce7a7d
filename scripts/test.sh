#!/usr/bin/env bash
# The whole numapin test suite, from a fresh Debian machine with Python 3.11, as root:
# Debian packages (containerd, runc, busybox-static for the end-to-end tests), a virtualenv with
# numapin and its test extras, ruff, mypy --strict on the product packages (pyproject.toml [tool.mypy]: which
# packages, the generated and lab modules it leaves out), then pytest, which ends with the 25 slowest steps (the
# CI log says where the time went; `--durations=N` overrides). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/setup.sh
numapin_setup test
echo "== ruff"
"$NUMAPIN_VENV/bin/ruff" check .
echo "== mypy --strict (pyproject.toml [tool.mypy] files)"
"$NUMAPIN_VENV/bin/mypy"
echo "== pytest"
exec "$NUMAPIN_VENV/bin/python" -m pytest --durations=25 "$@"
