#!/usr/bin/env bash
# Build numapin's OCI image from Debian packages and Python wheels, without pulling any container image.
#
#   scripts/build-image.sh [--out FILE] [--image NAME:TAG] [--cache-dir DIR] [--suite SUITE] [--mirror MIRROR]
#                          [--node-install DIR]
#
# The image has two layers:
#   1. base: a Debian root file system made by mmdebstrap (variant "essential" + python3, no apt, no docs) and a
#      virtual environment /opt/numapin holding numapin's Python dependencies as wheels from PyPI. Debian's own
#      python3-* packages cannot serve: numapin's generated protobuf code needs the protobuf 7 runtime and grpcio
#      >= 1.85 (Debian 12 ships protobuf 3.21 and grpcio 1.51), and kubernetes-asyncio is not packaged by Debian.
#      This layer depends only on how this script builds it, the dependency list in pyproject.toml, the suite and
#      the architecture; it is cached under --cache-dir keyed by those (a cold build downloads ~60 MB and takes
#      about 4 minutes on 2 cores; a cached one is reused as is).
#   2. numapin itself: its packages copied from this checkout into the virtual environment, compiled, and the
#      command /usr/local/bin/numapin; and the self-contained node install (scripts/build-node.sh) at
#      /usr/share/numapin/node, which the installer DaemonSet copies to the hosts; rebuilt every time (a minute).
# The image runs as user 65532 with the entrypoint `numapin`. It serves three things: the webhook Deployment
# (`numapin webhook ...`), the node installer DaemonSet (which copies /usr/share/numapin/node to the host and asks
# the host's systemd to run the proxy from there) and the NRI plugin's DaemonSet (`numapin nri`, as root; containerd
# never needs the plugin to start a container, docs/nri.md). The proxy is never run from the image: kubelet's
# runtime must not depend on a pod kubelet runs (docs/node.md).
#
# The result is an OCI archive (a tar of an OCI image layout) whose index names the image NAME:TAG (default
# localhost/numapin:<version from pyproject.toml>, the name manifests/ uses). Import it into containerd with
#   ctr -n k8s.io images import build/numapin-image.tar
# or push it to a registry with skopeo (docs/image.md):
#   skopeo copy oci-archive:build/numapin-image.tar docker://<registry>/numapin:0.1.0
# --suite picks the Debian release (default bookworm), --mirror (repeatable) the Debian mirror(s) (default: Debian's).
# --node-install DIR puts DIR, a node install scripts/build-node.sh made of this same checkout (its prefix), into the
# image instead of building one (the test suite builds it once per run); one of another version is refused.
#
# Needs root (mmdebstrap's root mode, chroot) and the Debian packages mmdebstrap, umoci and python3-venv
# (installed when missing), and network access to a Debian mirror and to PyPI.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"

usage() {
    sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
}

VERSION=$(python3 -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')
IMAGE="localhost/numapin:$VERSION"
OUT="$ROOT/build/numapin-image.tar"
CACHE=${NUMAPIN_IMAGE_CACHE:-/var/cache/numapin-image}
SUITE=bookworm
MIRROR=()
NODE_INSTALL=""

while [ $# -gt 0 ]; do
    case "$1" in
        --out) OUT=$2; shift 2 ;;
        --image) IMAGE=$2; shift 2 ;;
        --cache-dir) CACHE=$2; shift 2 ;;
        --suite) SUITE=$2; shift 2 ;;
        --mirror) MIRROR+=("$2"); shift 2 ;;
        --node-install) NODE_INSTALL=$2; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) echo "build-image.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done

log() { echo "[build-image] $*" >&2; }
die() { echo "build-image.sh: $*" >&2; exit 1; }

if [ -n "$NODE_INSTALL" ]; then
    [ -f "$NODE_INSTALL/share/numapin/RELEASE" ] && [ -x "$NODE_INSTALL/bin/numapin" ] \
        || die "--node-install $NODE_INSTALL: not a node install made by scripts/build-node.sh (no share/numapin/RELEASE or bin/numapin)"
    case "$(cat "$NODE_INSTALL/share/numapin/RELEASE")" in
        "$VERSION"-*) ;;
        *) die "--node-install $NODE_INSTALL: release $(cat "$NODE_INSTALL/share/numapin/RELEASE"), not numapin $VERSION of this checkout" ;;
    esac
fi

case "$IMAGE" in
    *:*) ;;
    *) die "--image must be NAME:TAG, got $IMAGE" ;;
esac
[ "$(id -u)" = 0 ] || die "must run as root (mmdebstrap builds the root file system in root mode)"

missing=()
command -v mmdebstrap >/dev/null || missing+=(mmdebstrap)
command -v umoci >/dev/null || missing+=(umoci)
python3 -c 'import ensurepip, venv' 2>/dev/null || missing+=(python3-venv)
if [ ${#missing[@]} -gt 0 ]; then
    log "apt-get install ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq -o DPkg::Lock::Timeout=600 "${missing[@]}" >/dev/null
fi

ARCH=$(dpkg --print-architecture)
case "$ARCH" in
    amd64) MACHINE=x86_64 ;;
    arm64) MACHINE=aarch64 ;;
    *) die "no wheel platform known for architecture $ARCH" ;;
esac
# the wheel platforms the image's glibc runs (Debian 12 has glibc 2.36; older manylinux wheels run too)
PLATFORMS=()
for minor in $(seq 36 -1 17); do PLATFORMS+=(--platform "manylinux_2_${minor}_$MACHINE"); done
PLATFORMS+=(--platform "manylinux2014_$MACHINE")
DEPS=$(python3 -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]))')

WORK=$(mktemp -d "${TMPDIR:-/var/tmp}/numapin-image.XXXXXX")
BASE_TMP=""
cleanup() { rm -rf "$WORK" ${BASE_TMP:+"$BASE_TMP"}; }
trap cleanup EXIT

build_base() {
    local tmp="$CACHE/.tmp-base-$BASE_KEY-$$"
    BASE_TMP=$tmp   # removed on exit, whatever happens
    rm -rf "$tmp"
    # left by builds that were killed
    find "$CACHE" -mindepth 1 -maxdepth 1 -name '.tmp-base-*' -mmin +120 -exec rm -rf {} +
    mkdir -p "$tmp/out"
    log "base layer $BASE_KEY: mmdebstrap $SUITE ($ARCH) + numapin's dependencies (a few minutes)"
    # a throw-away virtual environment with pip, on the build machine, installs wheels into the image's tree
    python3 -m venv "$tmp/pip-venv"
    umoci init --layout "$tmp/out/oci"
    umoci new --image "$tmp/out/oci:base"
    umoci unpack --image "$tmp/out/oci:base" "$tmp/bundle" >/dev/null
    rmdir "$tmp/bundle/rootfs"
    mmdebstrap --mode=root --variant=essential --include=python3 --arch="$ARCH" --quiet \
        --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
        --dpkgopt='path-include=/usr/share/doc/*/copyright' --dpkgopt='path-exclude=/usr/share/locale/*' \
        --dpkgopt='path-exclude=/usr/share/info/*' \
        "$SUITE" "$tmp/bundle/rootfs" ${MIRROR[@]+"${MIRROR[@]}"}
    local rootfs="$tmp/bundle/rootfs"
    chroot "$rootfs" python3 -m venv --without-pip /opt/numapin
    local pyver site
    pyver=$(chroot "$rootfs" /opt/numapin/bin/python3 -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
    site="$rootfs/opt/numapin/lib/python$pyver/site-packages"
    # shellcheck disable=SC2086
    "$tmp/pip-venv/bin/python" -m pip --disable-pip-version-check -q install --target "$site" \
        --only-binary=:all: "${PLATFORMS[@]}" --python-version "$pyver" --implementation cp --no-compile $DEPS
    rm -rf "$site/bin"
    chroot "$rootfs" /opt/numapin/bin/python3 -m compileall -q -j0 "/opt/numapin/lib/python$pyver/site-packages" \
        >/dev/null
    echo "numapin:x:65532:" >> "$rootfs/etc/group"
    echo "numapin:x:65532:65532:numapin:/nonexistent:/usr/sbin/nologin" >> "$rootfs/etc/passwd"
    rm -rf "$rootfs"/var/cache/apt/* "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/log/* "$rootfs"/tmp/*
    umoci repack --image "$tmp/out/oci:base" "$tmp/bundle"
    umoci config --image "$tmp/out/oci:base" --author numapin --config.user 65532:65532 \
        --config.entrypoint /usr/local/bin/numapin --clear=config.cmd --config.cmd --help --config.workingdir / \
        --config.env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
    umoci gc --layout "$tmp/out/oci"
    echo "$pyver" > "$tmp/out/python-version"
    rm -rf "$tmp/bundle"
    # publish atomically; a build running at the same time may have published it first (then keep that one)
    mv -T "$tmp/out" "$BASE" 2>/dev/null || [ -f "$BASE/oci/index.json" ] || die "cannot move the base to $BASE"
    rm -rf "$tmp"
    # bases of earlier script versions or dependency lists are not used again: keep the cache to one
    find "$CACHE" -mindepth 1 -maxdepth 1 -name 'base-*' ! -name "base-$BASE_KEY" -exec rm -rf {} +
}

# the base layer's cache key: how it is built (this function's text, not the script's comments), what goes in
BASE_KEY=$( { declare -f build_base; echo "$DEPS"; echo "$SUITE $ARCH ${MIRROR[*]:-}"; } | sha256sum | cut -c1-16)
BASE="$CACHE/base-$BASE_KEY"   # oci/ (the image layout, tag "base") and python-version
mkdir -p "$CACHE" "$(dirname "$OUT")"

if [ -f "$BASE/oci/index.json" ] && [ -f "$BASE/python-version" ]; then
    log "base layer $BASE_KEY: cached in $BASE"
else
    build_base
fi
PYVER=$(cat "$BASE/python-version")

# numapin's layer: its packages, copied from this checkout (tracked and new files, no caches or build output),
# compiled, and the `numapin` command
log "numapin layer from $ROOT"
layer="$WORK/layer"
site_rel="opt/numapin/lib/python$PYVER/site-packages"
mkdir -p "$layer/$site_rel" "$layer/usr/local/bin"
git -C "$ROOT" ls-files -z --cached --others --exclude-standard -- allocator kubeapi nodeagent criproxy webhook numapin protos | \
    tar -C "$ROOT" --null --ignore-failed-read -T - -cf - 2>/dev/null | tar -C "$layer/$site_rel" -xf -
# the self-contained node install the installer DaemonSet copies to the hosts (manifests/criproxy/installer-daemonset.yaml)
if [ -n "$NODE_INSTALL" ]; then
    log "the node install $NODE_INSTALL (release $(cat "$NODE_INSTALL/share/numapin/RELEASE")) at /usr/share/numapin/node"
    mkdir -p "$layer/usr/share/numapin"
    cp -a "$NODE_INSTALL" "$layer/usr/share/numapin/node"
else
    log "the node install (scripts/build-node.sh) at /usr/share/numapin/node"
    bash "$ROOT/scripts/build-node.sh" --prefix "$layer/usr/share/numapin/node"
fi
cat > "$layer/usr/local/bin/numapin" <<'EOF_ENTRY'
#!/opt/numapin/bin/python3
import sys

from numapin.cli import main

if __name__ == "__main__":  # the webhook's parser process (multiprocessing "spawn") imports this file again
    sys.exit(main())
EOF_ENTRY
chmod 0755 "$layer/usr/local/bin/numapin"
if [ "$(python3 -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')" = "$PYVER" ]; then
    # byte-code for a read-only root file system; the paths recorded are those inside the image
    python3 -m compileall -q -j0 -s "$layer" -p / "$layer/$site_rel" >/dev/null
fi
find "$layer" -type d -exec chmod 0755 {} +
tar -C "$layer" --sort=name --owner=0 --group=0 --numeric-owner -cf "$WORK/layer.tar" .

# the image: a copy of the cached base layout (blobs hard-linked: they are never modified) plus the layer
mkdir "$WORK/oci"
cp -al "$BASE/oci/." "$WORK/oci/"
rm "$WORK/oci/index.json" && cp "$BASE/oci/index.json" "$WORK/oci/index.json"
TAG=${IMAGE##*:}
umoci raw add-layer --image "$WORK/oci:base" --tag "$TAG" --history.author numapin \
    --history.created_by "scripts/build-image.sh: numapin $VERSION" "$WORK/layer.tar"
umoci config --image "$WORK/oci:$TAG" \
    --config.label "org.opencontainers.image.title=numapin" \
    --config.label "org.opencontainers.image.version=$VERSION"
umoci rm --image "$WORK/oci:base"
umoci gc --layout "$WORK/oci"
# name the image in full in the index (umoci records the tag only), as containerd and skopeo read it
python3 - "$WORK/oci/index.json" "$IMAGE" <<'EOF'
import json
import sys

path, image = sys.argv[1:]
with open(path) as f:
    index = json.load(f)
for m in index["manifests"]:
    m.setdefault("annotations", {})["org.opencontainers.image.ref.name"] = image
with open(path, "w") as f:
    json.dump(index, f)
EOF
tar -C "$WORK/oci" --sort=name --owner=0 --group=0 --numeric-owner -cf "$OUT.tmp" .
mv "$OUT.tmp" "$OUT"
log "wrote $OUT ($(du -h "$OUT" | cut -f1)), image $IMAGE"
