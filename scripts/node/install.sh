#!/bin/sh
# Install, upgrade, roll back or remove numapin's node agent as a host service (the CRI proxy, or the NRI plugin with
# --mode nri), from the self-contained install that scripts/build-node.sh builds (this script is part of it:
# share/numapin/install.sh).
#
#   install.sh [--mode proxy|nri] [--from DIR] [--host-root DIR] [--config FILE] [--systemctl CMD]   install/upgrade
#   install.sh --rollback [--host-root DIR] [--systemctl CMD]                         back to the previous release
#   install.sh --uninstall [--purge] [--force] [--host-root DIR] [--systemctl CMD]    remove from the node
#
# install: copies the release (DIR, default: the install this script belongs to) to /opt/numapin-releases/<release>,
#   points /opt/numapin at it (a symlink, switched in one rename), installs the unit numapin-criproxy.service, kubelet's
#   drop-in kubelet.service.d/90-numapin.conf and, when the node has none (or --config is given), the proxy's settings
#   /etc/numapin/criproxy.yaml; then daemon-reload, enable, and start the proxy, or restart it when the release, the
#   unit or the settings changed (an upgrade: the state in /var/lib/numapin is kept, running containers are not
#   touched; kubelet's calls fail UNAVAILABLE for the seconds of the restart and are retried). The release replaced
#   is kept for --rollback; older ones are removed. Running it again with the same release changes nothing. A new
#   release whose proxy does not start (systemctl start/restart fails: it exited, or its socket did not answer) is
#   rolled back at once to the release that ran, and the install fails (exit 1).
# --mode nri: numapin as containerd's NRI plugin instead (docs/nri.md): the unit numapin-nri.service and its settings
#   /etc/numapin/nri.yaml, no kubelet drop-in (kubelet keeps talking to containerd). The default is the mode the node
#   has (proxy on a new node), so an upgrade needs no --mode. Switching a node's mode (the same state, no drain):
#   --mode nri stops, disables and removes the proxy's unit and kubelet's drop-in, and is refused while kubelet's
#   configuration still names the proxy's socket; --mode proxy stops, disables and removes numapin-nri.service.
# --rollback: points /opt/numapin at the release before the current one and restarts the proxy.
# --uninstall: refused while kubelet's configuration still names the proxy's socket (switch kubelet back to
#   containerd first, docs/node.md; --force to skip the check); stops and disables the proxy, removes the unit,
#   kubelet's drop-in and the releases. --purge also removes /etc/numapin and the state /var/lib/numapin.
#
# --host-root: the host's root file system as this script sees it (default /; the installer DaemonSet mounts the
#   host's / at /host). --systemctl: how to reach the host's systemd (default "systemctl"; the DaemonSet uses
#   "nsenter --target 1 --mount --uts --ipc --net --pid -- systemctl", PID 1's namespaces).
# Exit status: 0 done, 1 refused or failed (nothing half-done is left pointing at a missing release), 2 bad arguments.
set -eu

usage() { sed -n '2,/^set -eu/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }
log() { echo "[numapin install] $*" >&2; }
die() { echo "numapin install: $*" >&2; exit 1; }
bad() { echo "numapin install: $*" >&2; exit 2; }

HERE=$(cd "$(dirname "$0")" && pwd)
FROM=$(cd "$HERE/../.." && pwd)
HOST=/
CONFIG=""
SYSTEMCTL=systemctl
ACTION=install
FORCE=0
PURGE=0
MODE=""
PROXY_UNIT=numapin-criproxy.service
NRI_UNIT=numapin-nri.service
DROPIN_NAME=90-numapin.conf
PROXY_SOCKET=/var/run/numapin/criproxy.sock

while [ $# -gt 0 ]; do
    case "$1" in
        --from) [ $# -ge 2 ] || bad "--from needs a directory"; FROM=$2; shift 2 ;;
        --mode) [ $# -ge 2 ] || bad "--mode needs proxy or nri"; MODE=$2; shift 2 ;;
        --host-root) [ $# -ge 2 ] || bad "--host-root needs a directory"; HOST=$2; shift 2 ;;
        --config) [ $# -ge 2 ] || bad "--config needs a file"; CONFIG=$2; shift 2 ;;
        --systemctl) [ $# -ge 2 ] || bad "--systemctl needs a command"; SYSTEMCTL=$2; shift 2 ;;
        --rollback) ACTION=rollback; shift ;;
        --uninstall) ACTION=uninstall; shift ;;
        --force) FORCE=1; shift ;;
        --purge) PURGE=1; shift ;;
        -h|--help) usage; exit 0 ;;
        *) bad "unknown argument $1 (see --help)" ;;
    esac
done
[ -d "$HOST" ] || bad "--host-root $HOST is not a directory"
HOST=$(cd "$HOST" && pwd)
[ "$HOST" = / ] && HOST=""   # paths below are "$HOST/etc/...": no double slash on the host itself

RELEASES=/opt/numapin-releases
LINK="$HOST/opt/numapin"
UNITS="$HOST/etc/systemd/system"
DROPIN="$UNITS/kubelet.service.d/$DROPIN_NAME"

# the mode the node has now: the unit installed (none on a new node)
INSTALLED=""
if [ -f "$UNITS/$NRI_UNIT" ]; then INSTALLED=nri; elif [ -f "$UNITS/$PROXY_UNIT" ]; then INSTALLED=proxy; fi
case "${MODE:-${INSTALLED:-proxy}}" in
    proxy) MODE=proxy; UNIT=$PROXY_UNIT; OTHER_UNIT=$NRI_UNIT; SETTINGS_NAME=criproxy.yaml ;;
    nri) MODE=nri; UNIT=$NRI_UNIT; OTHER_UNIT=$PROXY_UNIT; SETTINGS_NAME=nri.yaml ;;
    *) bad "--mode must be proxy or nri, got '$MODE'" ;;
esac
UNIT_FILE="$UNITS/$UNIT"
SETTINGS="$HOST/etc/numapin/$SETTINGS_NAME"

# systemctl on the host; word splitting of $SYSTEMCTL is wanted (a command with its arguments)
sysctl() {
    # shellcheck disable=SC2086
    $SYSTEMCTL "$@"
}

# install FILE as DEST (mode 0644, one rename) when its content differs, and then say changed=yes
put() {
    if [ -f "$2" ] && cmp -s "$1" "$2"; then return 0; fi
    mkdir -p "$(dirname "$2")"
    cp "$1" "$2.numapin-tmp"
    chmod 0644 "$2.numapin-tmp"
    mv -f "$2.numapin-tmp" "$2"
    changed=yes
}

# point /opt/numapin at release $1 (one rename: a reader sees the old target or the new one)
point_at() {
    ln -sfn "$RELEASES/$1" "$HOST/opt/.numapin.link-tmp"
    mv -T "$HOST/opt/.numapin.link-tmp" "$LINK"
}

current_release() {
    if [ -L "$LINK" ]; then basename "$(readlink "$LINK")"; fi
}

# the unit of this mode (and kubelet's drop-in, in proxy mode) from release $1
put_units_of() {
    put "$HOST$RELEASES/$1/share/numapin/$UNIT" "$UNIT_FILE"
    if [ "$MODE" = proxy ]; then put "$HOST$RELEASES/$1/share/numapin/kubelet-numapin.conf" "$DROPIN"; fi
}

restart_or_start() {
    if [ "$1" = yes ] && sysctl is-active --quiet "$UNIT"; then
        log "restarting $UNIT"
        sysctl restart "$UNIT"
    else
        log "starting $UNIT"
        sysctl start "$UNIT"
    fi
}

do_install() {
    meta="$FROM/share/numapin"
    [ -x "$FROM/bin/numapin" ] || die "$FROM is not a numapin install (no bin/numapin); build one with scripts/build-node.sh"
    [ -f "$meta/RELEASE" ] || die "$FROM has no share/numapin/RELEASE"
    release=$(cat "$meta/RELEASE")
    case "$release" in
        ""|*[!A-Za-z0-9._+-]*) die "$meta/RELEASE names no release: '$release'" ;;
    esac
    for f in "$UNIT" kubelet-numapin.conf "$SETTINGS_NAME"; do
        [ -f "$meta/$f" ] || die "$FROM has no share/numapin/$f (mode $MODE)"
    done
    if [ -e "$LINK" ] && [ ! -L "$LINK" ]; then
        die "$LINK exists and is not numapin's link to a release: move it away first"
    fi
    if [ -n "$CONFIG" ] && [ ! -f "$CONFIG" ]; then die "--config $CONFIG: no such file"; fi
    if [ "$MODE" = nri ] && [ "$INSTALLED" = proxy ] && [ "$FORCE" = 0 ] && where=$(kubelet_uses_proxy); then
        die "kubelet still uses the proxy ($where names $PROXY_SOCKET): stop kubelet, point it back at containerd
first, then install the NRI plugin and start kubelet (docs/nri.md); --force skips this check"
    fi
    changed=no
    dest="$HOST$RELEASES/$release"
    if [ ! -x "$dest/bin/numapin" ]; then
        log "copying release $release to $RELEASES/$release"
        mkdir -p "$HOST$RELEASES"
        rm -rf "$dest.tmp"
        cp -a "$FROM" "$dest.tmp"
        rm -rf "$dest"
        mv "$dest.tmp" "$dest"
    fi
    previous=$(current_release)
    if [ "$previous" != "$release" ]; then
        point_at "$release"
        if [ -n "$previous" ]; then echo "$previous" > "$HOST$RELEASES/.previous"; fi
        log "/opt/numapin -> $RELEASES/$release${previous:+ (was $previous)}"
        changed=yes
    fi
    if [ -n "$INSTALLED" ] && [ "$INSTALLED" != "$MODE" ]; then
        # the node changes mode: the other door stops first (never two writers of cpusets); the state stays
        log "switching the node from $INSTALLED mode to $MODE mode: stopping and removing $OTHER_UNIT"
        sysctl disable --now "$OTHER_UNIT" || true
        rm -f "$UNITS/$OTHER_UNIT"
        changed=yes
    fi
    put "$meta/$UNIT" "$UNIT_FILE"
    if [ "$MODE" = proxy ]; then
        put "$meta/kubelet-numapin.conf" "$DROPIN"
    elif [ -f "$DROPIN" ]; then
        rm -f "$DROPIN"
        rmdir "$(dirname "$DROPIN")" 2>/dev/null || true
    fi
    if [ -n "$CONFIG" ]; then
        put "$CONFIG" "$SETTINGS"
    elif [ ! -f "$SETTINGS" ]; then
        put "$meta/$SETTINGS_NAME" "$SETTINGS"
        log "wrote the default settings $SETTINGS: check reservedCpus and the topology manager settings"
    fi
    # keep the current release and the one --rollback goes back to
    keep_prev=$(cat "$HOST$RELEASES/.previous" 2>/dev/null || true)
    for d in "$HOST$RELEASES"/*; do
        [ -d "$d" ] || continue
        name=$(basename "$d")
        if [ "$name" != "$release" ] && [ "$name" != "$keep_prev" ]; then
            log "removing release $name"
            rm -rf "$d"
        fi
    done
    sysctl daemon-reload
    sysctl enable "$UNIT"
    if restart_or_start "$changed"; then :
    elif [ -n "$previous" ] && [ "$previous" != "$release" ] && [ -x "$HOST$RELEASES/$previous/bin/numapin" ]; then
        # the new release does not come up: the node gets its runtime back with the release that ran
        log "numapin $release did not start; rolling back to $previous"
        point_at "$previous"
        echo "$release" > "$HOST$RELEASES/.previous"
        put_units_of "$previous"
        sysctl daemon-reload
        sysctl restart "$UNIT" || die "numapin $previous did not start again either: journalctl -u $UNIT"
        die "numapin $release did not start (journalctl -u $UNIT says why); $previous runs again"
    else
        die "numapin $release did not start: journalctl -u $UNIT says why"
    fi
    if [ "$changed" = no ]; then log "numapin $release was installed already: nothing changed"
    else log "numapin $release installed"; fi
}

do_rollback() {
    previous=$(cat "$HOST$RELEASES/.previous" 2>/dev/null || true)
    [ -n "$previous" ] || die "no previous release recorded in $RELEASES/.previous"
    [ -x "$HOST$RELEASES/$previous/bin/numapin" ] || die "the previous release $previous is gone from $RELEASES"
    current=$(current_release)
    [ -f "$HOST$RELEASES/$previous/share/numapin/$UNIT" ] || die "the previous release $previous has no $UNIT"
    point_at "$previous"
    if [ -n "$current" ]; then echo "$current" > "$HOST$RELEASES/.previous"; fi
    put_units_of "$previous"
    sysctl daemon-reload
    restart_or_start yes
    log "rolled back to $previous (was $current)"
}

kubelet_uses_proxy() {
    for f in "$HOST/var/lib/kubelet/config.yaml" "$HOST/var/lib/kubelet/kubeadm-flags.env" \
             "$HOST/etc/default/kubelet" "$HOST/etc/sysconfig/kubelet" \
             "$HOST"/etc/systemd/system/kubelet.service.d/*.conf; do
        [ -f "$f" ] || continue
        [ "$f" = "$DROPIN" ] && continue
        if grep -q "$PROXY_SOCKET" "$f"; then echo "$f"; return 0; fi
    done
    return 1
}

do_uninstall() {
    if [ "$FORCE" = 0 ] && where=$(kubelet_uses_proxy); then
        die "kubelet still uses the proxy ($where names $PROXY_SOCKET): point kubelet back at containerd (or at
kubelet's static policy with numapin export-kubelet-state) and restart it first, docs/node.md; --force skips this check"
    fi
    for u in $PROXY_UNIT $NRI_UNIT; do
        [ -f "$UNITS/$u" ] || continue
        log "stopping and disabling $u"
        sysctl disable --now "$u" || true
        rm -f "$UNITS/$u"
    done
    rm -f "$DROPIN"
    rmdir "$(dirname "$DROPIN")" 2>/dev/null || true
    sysctl daemon-reload
    rm -f "$LINK"
    rm -rf "$HOST$RELEASES"
    if [ "$PURGE" = 1 ]; then
        rm -rf "$HOST/etc/numapin" "$HOST/var/lib/numapin" "$HOST/var/run/numapin"
        log "removed numapin, its settings and its state"
    else
        log "removed numapin (kept $SETTINGS and the state /var/lib/numapin; --purge removes them)"
    fi
}

case "$ACTION" in
    install) do_install ;;
    rollback) do_rollback ;;
    uninstall) do_uninstall ;;
esac
