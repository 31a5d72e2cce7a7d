#!/usr/bin/env bash
# The whole numapin test suite, from a fresh Debian machine with Python 3.11, as root:
# Debian packages (containerd, runc, busybox-static for the end-to-end tests), a virtualenv with
# numapin and its test extras, ruff, mypy --strict on the product packages (pyproject.toml [tool.mypy]: which
# packages, the generated and lab modules it leaves out), then pytest, which ends with the 25 slowest steps (the
# CI log says where the time went; `--durations=N` overrides). Extra arguments go to pytest.
#
# With no arguments (the README's command, CI), pytest runs as two sessions at once: the proxy's tests (tests/criproxy,
# about half of the host tests' wall time, mostly waiting on containerd) in the background, everything else (the
# multi-NUMA VM boots among it) in the foreground; the background session's output follows the foreground's, and the
# command fails when either does. Each session has its own lab ledger and end check (tests/conftest.py). With
# arguments, one session as given.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/setup.sh
numapin_setup test
echo "== ruff"
"$NUMAPIN_VENV/bin/ruff" check .
echo "== mypy --strict (pyproject.toml [tool.mypy] files)"
"$NUMAPIN_VENV/bin/mypy"
if [ $# -gt 0 ]; then
    echo "== pytest"
    exec "$NUMAPIN_VENV/bin/python" -m pytest --durations=25 "$@"
fi
PROXY_LOG=$(mktemp /tmp/numapin-pytest-criproxy-XXXXXX.log)
echo "== pytest: tests/criproxy in a second session at the same time (its output: $PROXY_LOG, shown at the end)"
echo "== pytest: everything else"
"$NUMAPIN_VENV/bin/python" -m pytest --durations=15 tests/criproxy >"$PROXY_LOG" 2>&1 &
proxy_tests=$!
"$NUMAPIN_VENV/bin/python" -m pytest --durations=25 --ignore=tests/criproxy &
other_tests=$!
# SIGTERM or Ctrl-C (a CI runner's time limit): both sessions end as pytest ends on SIGTERM (the end check runs)
trap 'kill -TERM $proxy_tests $other_tests 2>/dev/null' TERM INT
# the exit status of background job $1 into $rc (a trapped signal interrupts `wait`: wait again while it runs)
finished() { rc=0; wait "$1" || rc=$?; while [ "$rc" -gt 128 ] && kill -0 "$1" 2>/dev/null; do rc=0; wait "$1" || rc=$?; done; }
finished $other_tests; other_rc=$rc
finished $proxy_tests; proxy_rc=$rc
trap - TERM INT
echo "== pytest tests/criproxy (the second session): exit $proxy_rc"
cat "$PROXY_LOG"
rm -f "$PROXY_LOG"
echo "== pytest: everything else exit $other_rc, tests/criproxy exit $proxy_rc"
[ "$other_rc" = 0 ] && [ "$proxy_rc" = 0 ]
