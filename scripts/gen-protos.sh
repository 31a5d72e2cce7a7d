#!/usr/bin/env bash
# Regenerate the Python code of numapin's protos with grpcio-tools (messages only: the proxy relays
# raw bytes and needs no generated service stubs). Reproducible: same grpcio-tools, same output.
#   scripts/gen-protos.sh            write protos/{cri,nri,ttrpc}_pb2.py and numapin_lab/cri/cri_full_pb2.py
#   scripts/gen-protos.sh OUTDIR     write them under OUTDIR instead (used by the test that checks
#                                    the committed code is current)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-}
if [[ -z "$PY" ]]; then
    if [[ -x .venv/bin/python ]]; then PY=.venv/bin/python
    else PY=python3; fi
fi
out=${1:-.}
gen() {  # $1 = proto dir, $2 = proto file name
    mkdir -p "$out/$1"
    "$PY" -m grpc_tools.protoc -I"$1" --python_out="$out/$1" "$1/$2"
    local py="$out/$1/${2%.proto}_pb2.py"
    # generated code: not linted (a file-level noqa keeps ruff quiet wherever it lives)
    { echo "# ruff: noqa"; cat "$py"; } > "$py.tmp" && mv "$py.tmp" "$py"
}
gen protos cri.proto
gen protos nri.proto
gen protos ttrpc.proto
gen numapin_lab/cri cri_full.proto
