#!/usr/bin/env bash
# Build numapin's self-contained node install: the Python interpreter, its standard library, numapin's dependencies
# and numapin in one directory, run from /opt/numapin on a node by the systemd unit numapin-criproxy.service.
#
#   scripts/build-node.sh [--prefix DIR] [--tar FILE] [--deb FILE] [--python PYTHON]
#
# The directory (default build/numapin-node) holds:
#   bin/python3, bin/python3.X   Debian's interpreter (--python, default /usr/bin/python3), copied
#   bin/numapin                  the command: runs numapin with that interpreter, isolated (-I: no PYTHONPATH, no
#                                user site), with the bundled libraries first on the library path; relocatable
#   lib/python3.X/               the standard library (lib-dynload included; no tests, tkinter, idle, static libpython)
#   lib/python3/dist-packages/   numapin's dependencies (PyPI wheels) and numapin (a wheel of this checkout)
#   lib/so/                      the shared libraries the interpreter and its extension modules load, except glibc's
#   share/numapin/               install.sh (scripts/node/install.sh), the unit numapin-criproxy.service, kubelet's
#                                drop-in kubelet-numapin.conf, the default settings criproxy.yaml, RELEASE; the NRI
#                                plugin's unit numapin-nri.service and its default settings nri.yaml (--mode nri)
# RELEASE names the build: numapin's version and a digest of the directory's content (e.g. 0.1.0-3f9a1c2b7d4e).
#
# It needs the node's glibc to be at least the build machine's (Debian 12: 2.36): build on the oldest distribution
# of the fleet, as for any binary. --tar writes a .tar.gz of the directory (unpack anywhere, run
# share/numapin/install.sh); --deb writes a Debian package installing it under /opt/numapin-releases/<release>, whose
# postinst runs install.sh and whose prerm runs install.sh --uninstall (refused while kubelet uses the proxy).
# Needs Debian's python3 and python3-venv, and PyPI (or pip's configured index) for the dependencies.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }
log() { echo "[build-node] $*" >&2; }
die() { echo "build-node.sh: $*" >&2; exit 1; }

PREFIX="$ROOT/build/numapin-node"
TAR=""
DEB=""
PYTHON=/usr/bin/python3
while [ $# -gt 0 ]; do
    case "$1" in
        --prefix) PREFIX=$2; shift 2 ;;
        --tar) TAR=$2; shift 2 ;;
        --deb) DEB=$2; shift 2 ;;
        --python) PYTHON=$2; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) echo "build-node.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done

PY_REAL=$(readlink -f "$(command -v "$PYTHON")") || die "no interpreter $PYTHON"
PYVER=$("$PY_REAL" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
STDLIB=$("$PY_REAL" -c 'import sysconfig; print(sysconfig.get_paths()["stdlib"])')
[ -f "$STDLIB/os.py" ] || die "$PY_REAL's standard library is not at $STDLIB"
"$PY_REAL" -c 'import ensurepip, venv' 2>/dev/null || die "$PY_REAL has no venv module (apt-get install python3-venv)"
VERSION=$("$PY_REAL" -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')

WORK=$(mktemp -d "${TMPDIR:-/tmp}/numapin-node.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
STAGE="$WORK/node"
mkdir -p "$STAGE/bin" "$STAGE/lib/so" "$STAGE/lib/python3/dist-packages" "$STAGE/share/numapin"

log "interpreter $PY_REAL (Python $PYVER), standard library $STDLIB"
cp "$PY_REAL" "$STAGE/bin/python$PYVER"
ln -s "python$PYVER" "$STAGE/bin/python3"
# the standard library, without what a node service never imports; Debian's sitecustomize links to /etc
tar -C "$(dirname "$STDLIB")" --exclude='__pycache__' --exclude='test' --exclude='tests' --exclude='idlelib' \
    --exclude='tkinter' --exclude='turtledemo' --exclude='ensurepip' --exclude='lib2to3' \
    --exclude='config-*' --exclude='dist-packages' --exclude='site-packages' --exclude='sitecustomize.py' \
    --exclude='EXTERNALLY-MANAGED' -cf - "$(basename "$STDLIB")" | tar -C "$STAGE/lib" -xf -
dangling=$(find "$STAGE" -xtype l)
[ -z "$dangling" ] || die "links to outside the install: $dangling"

# numapin's dependencies and numapin, with a throw-away pip
python_deps=$("$PY_REAL" -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]))')
"$PY_REAL" -m venv "$WORK/pip-venv"
PIP=("$WORK/pip-venv/bin/python" -m pip --disable-pip-version-check -q)
log "numapin's dependencies (wheels)"
# shellcheck disable=SC2086
"${PIP[@]}" install --target "$STAGE/lib/python3/dist-packages" --only-binary=:all: --no-compile $python_deps
log "numapin $VERSION (a wheel of $ROOT)"
# from a copy of the checkout's product files (tracked and new, no caches): setuptools builds in the source tree.
# The packages are the ones pyproject.toml ships.
mkdir "$WORK/src"
packages=$("$PY_REAL" -c 'import tomllib; print(" ".join(p.rstrip("*") for p in tomllib.load(open("pyproject.toml", "rb"))["tool"]["setuptools"]["packages"]["find"]["include"]))')
# shellcheck disable=SC2086
git -C "$ROOT" ls-files -z --cached --others --exclude-standard -- pyproject.toml README.md $packages | \
    tar -C "$ROOT" --null --ignore-failed-read -T - -cf - 2>/dev/null | tar -C "$WORK/src" -xf -
"${PIP[@]}" wheel --no-deps -w "$WORK/wheel" "$WORK/src" >/dev/null
"${PIP[@]}" install --target "$STAGE/lib/python3/dist-packages" --no-deps --no-compile "$WORK"/wheel/numapin-*.whl
rm -rf "$STAGE/lib/python3/dist-packages/bin"

# shared libraries outside glibc that the interpreter and the standard library's extension modules load
glibc='^(linux-vdso|ld-linux|libc\.so|libm\.so|libpthread\.so|libdl\.so|librt\.so|libutil\.so|libresolv\.so)'
{ ldd "$STAGE/bin/python$PYVER"; for so in "$STAGE/lib/python$PYVER/lib-dynload/"*.so; do ldd "$so"; done; } \
    | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | sort -u | while read -r name path; do
        if ! [[ $name =~ $glibc ]]; then cp -L "$path" "$STAGE/lib/so/$name"; fi
    done

cat > "$STAGE/bin/numapin" <<'EOF'
#!/bin/sh
# numapin, from the self-contained install this file is part of (scripts/build-node.sh): its own interpreter,
# isolated from the host's Python (-I), with the install's libraries first.
here=$(dirname "$(readlink -f "$0")")
LD_LIBRARY_PATH="$here/../lib/so${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "$here/python3" -I -m numapin "$@"
EOF
chmod 0755 "$STAGE/bin/numapin"

cp scripts/node/install.sh "$STAGE/share/numapin/install.sh"
chmod 0755 "$STAGE/share/numapin/install.sh"
cp manifests/criproxy/numapin-criproxy.service manifests/criproxy/kubelet-numapin.conf scripts/node/criproxy.yaml \
    manifests/nri/numapin-nri.service scripts/node/nri.yaml "$STAGE/share/numapin/"

# byte-code (content hashes, not times: the same sources give the same files)
"$STAGE/bin/python3" -I -m compileall -q -j0 --invalidation-mode unchecked-hash "$STAGE/lib" >/dev/null
find "$STAGE" -type d -exec chmod 0755 {} +

digest=$(cd "$STAGE" && find . -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum | cut -c1-12)
RELEASE="$VERSION-$digest"
echo "$RELEASE" > "$STAGE/share/numapin/RELEASE"

# the command runs from the install (outside this checkout: nothing of the source tree on its path)
out=$(cd / && env -i PATH=/usr/bin:/bin "$STAGE/bin/numapin" wait-socket --help 2>&1) \
    || die "the built numapin does not run: $out"

rm -rf "$PREFIX"
mkdir -p "$(dirname "$PREFIX")"
mv "$STAGE" "$PREFIX"
log "built $PREFIX: release $RELEASE ($(du -sh "$PREFIX" | cut -f1))"

if [ -n "$TAR" ]; then
    mkdir -p "$(dirname "$TAR")"
    tar -C "$PREFIX" --sort=name --owner=0 --group=0 --numeric-owner -czf "$TAR.tmp" .
    mv "$TAR.tmp" "$TAR"
    log "wrote $TAR"
fi

if [ -n "$DEB" ]; then
    command -v dpkg-deb >/dev/null || die "--deb needs dpkg-deb"
    pkg="$WORK/deb"
    mkdir -p "$pkg/DEBIAN" "$pkg/opt/numapin-releases"
    cp -a "$PREFIX" "$pkg/opt/numapin-releases/$RELEASE"
    arch=$(dpkg --print-architecture)
    cat > "$pkg/DEBIAN/control" <<EOF
Package: numapin-node
Version: ${VERSION}+${digest}
Architecture: $arch
Maintainer: numapin <numapin@localhost>
Section: admin
Priority: optional
Depends: libc6 (>= 2.36), systemd
Description: numapin's CRI proxy as a host service
 Topology-aware CPU pinning between kubelet and containerd: the proxy, its own
 Python interpreter and libraries under /opt/numapin-releases, the systemd unit
 numapin-criproxy.service and kubelet's drop-in (docs/node.md).
EOF
    cat > "$pkg/DEBIAN/postinst" <<EOF
#!/bin/sh
set -e
if [ "\$1" = configure ]; then
    /opt/numapin-releases/$RELEASE/share/numapin/install.sh --from /opt/numapin-releases/$RELEASE
fi
EOF
    cat > "$pkg/DEBIAN/prerm" <<EOF
#!/bin/sh
set -e
if [ "\$1" = remove ]; then
    /opt/numapin-releases/$RELEASE/share/numapin/install.sh --uninstall
fi
EOF
    chmod 0755 "$pkg/DEBIAN/postinst" "$pkg/DEBIAN/prerm"
    mkdir -p "$(dirname "$DEB")"
    dpkg-deb --root-owner-group -Zgzip --build "$pkg" "$DEB" >/dev/null
    log "wrote $DEB"
fi
