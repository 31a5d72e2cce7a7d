# Shared set-up for scripts/test.sh and scripts/demo.sh (sourced, not run).
# numapin_setup [test|demo]: installs the Debian packages numapin needs when missing, then a virtualenv
# ($NUMAPIN_VENV, default ./.venv) with numapin installed in editable mode (with test extras for "test").

NUMAPIN_VENV=${NUMAPIN_VENV:-$PWD/.venv}
export NUMAPIN_VENV

_numapin_log() { echo "[numapin setup] $*" >&2; }

_numapin_apt() {
    if [ "$(id -u)" != 0 ]; then
        _numapin_log "missing Debian packages ($*) and not root: install them, or run as root"
        return 1
    fi
    _numapin_log "apt-get install $*"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq "$@" >/dev/null
}

numapin_setup() {
    local want=${1:-test} pkgs=()
    command -v python3 >/dev/null || pkgs+=(python3)
    python3 -c 'import ensurepip, venv' 2>/dev/null || pkgs+=(python3-venv)
    # containerd + runc + a static busybox (for the container image) run the real pods of the
    # end-to-end tests and the demo.
    command -v containerd >/dev/null || pkgs+=(containerd)
    command -v runc >/dev/null || pkgs+=(runc)
    if ! command -v busybox >/dev/null || ldd "$(command -v busybox)" 2>&1 | grep -q '=>'; then
        pkgs+=(busybox-static)
    fi
    if [ ${#pkgs[@]} -gt 0 ]; then _numapin_apt "${pkgs[@]}"; fi

    if [ ! -x "$NUMAPIN_VENV/bin/python" ]; then
        _numapin_log "creating virtualenv $NUMAPIN_VENV"
        python3 -m venv "$NUMAPIN_VENV"
    fi
    local extra=""
    [ "$want" = test ] && extra="[test]"
    local stamp="$NUMAPIN_VENV/.numapin-installed$extra"
    if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
        _numapin_log "installing numapin$extra into $NUMAPIN_VENV"
        "$NUMAPIN_VENV/bin/python" -m pip install -q --disable-pip-version-check -e ".$extra"
        touch "$stamp"
    fi
}
