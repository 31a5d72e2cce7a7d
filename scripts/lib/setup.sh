# Shared set-up for scripts/test.sh and scripts/demo.sh (sourced, not run).
# numapin_setup [test|demo]: installs the Debian packages numapin needs when missing, then a virtualenv
# ($NUMAPIN_VENV, default ./.venv) with numapin installed in editable mode (with the test extras for "test", the
# demo's for "demo").

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
    apt-get install -y -qq ${NUMAPIN_APT_OPTS:-} "$@" >/dev/null
}

numapin_setup() {
    local want=${1:-test} pkgs=() vm_pkgs=()
    command -v python3 >/dev/null || pkgs+=(python3)
    python3 -c 'import ensurepip, venv' 2>/dev/null || pkgs+=(python3-venv)
    # containerd + runc + a static busybox (for the container image) run the real pods of the
    # end-to-end tests and the demo.
    command -v containerd >/dev/null || pkgs+=(containerd)
    command -v runc >/dev/null || pkgs+=(runc)
    if ! command -v busybox >/dev/null || ldd "$(command -v busybox)" 2>&1 | grep -q '=>'; then
        pkgs+=(busybox-static)
    fi
    if [ "$want" = test ]; then
        # etcd for the tests' real control plane (numapin_lab/k8s: beside kube-apiserver from shared/k8s-bin).
        # promtool (the alert rules' unit tests) is unpacked from Debian's prometheus package by the tests
        # (tests/debian_tools.py): installing the package would start a Prometheus server on this machine
        command -v etcd >/dev/null || vm_pkgs+=(etcd-server)
        # the CRI validation suite (tests/cri_validation) runs pods on a CNI bridge network: Debian's plugins
        [ -x /usr/lib/cni/bridge ] || pkgs+=(containernetworking-plugins)
    fi
    if [ "$want" = test ] || [ "${NUMAPIN_NUMA_VM_PACKAGES:-}" = 1 ]; then
        # the multi-NUMA end-to-end tests (tests/numa) and `numapin demo --topology` boot this machine's Debian
        # kernel in QEMU with numa-lab's numa-vm.sh: its packages (as `numa-vm.sh install` names them) plus what
        # it uses to extract the kernel (file, readelf, xz)
        command -v qemu-system-x86_64 >/dev/null || vm_pkgs+=(qemu-system-x86)
        ls /lib/modules/*/kernel/fs/9p >/dev/null 2>&1 && ls /boot/vmlinuz-* >/dev/null 2>&1 \
            || vm_pkgs+=(linux-image-amd64)
        command -v modprobe >/dev/null || vm_pkgs+=(kmod)
        command -v cpio >/dev/null || vm_pkgs+=(cpio)
        command -v file >/dev/null || vm_pkgs+=(file)
        command -v readelf >/dev/null || vm_pkgs+=(binutils)
        command -v xz >/dev/null || vm_pkgs+=(xz-utils)
    fi
    if [ ${#pkgs[@]} -gt 0 ]; then _numapin_apt "${pkgs[@]}"; fi
    if [ ${#vm_pkgs[@]} -gt 0 ]; then NUMAPIN_APT_OPTS=--no-install-recommends _numapin_apt "${vm_pkgs[@]}"; fi

    if [ ! -x "$NUMAPIN_VENV/bin/python" ]; then
        _numapin_log "creating virtualenv $NUMAPIN_VENV"
        python3 -m venv "$NUMAPIN_VENV"
    fi
    local extra=""
    case "$want" in test) extra="[test]" ;; demo) extra="[demo]" ;; esac
    local stamp="$NUMAPIN_VENV/.numapin-installed$extra"
    if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
        _numapin_log "installing numapin$extra into $NUMAPIN_VENV"
        "$NUMAPIN_VENV/bin/python" -m pip install -q --disable-pip-version-check -e ".$extra"
        touch "$stamp"
    fi
}
