"""Where the lab finds the Kubernetes binaries and etcd.

Each binary is taken from its environment variable (``KUBE_APISERVER_BIN``, ``KUBECTL_BIN``, ``KUBELET_BIN``,
``KUBE_SCHEDULER_BIN``: the names ``shared/k8s-bin/unpack.sh`` prints), else from the unpacked cache
(``$NUMAPIN_K8S_BIN_CACHE``, default ``/var/cache/numapin-k8s-bin``), else ``unpack.sh`` is run from
``$NUMAPIN_K8S_BIN_DIR``, ``../shared/k8s-bin`` next to the source tree or ``/work/shared/k8s-bin`` (it checks the
archives' checksums and unpacks once, under a lock). etcd is ``$ETCD_BIN``, else ``etcd`` on the PATH (Debian's
``etcd-server``, which ``scripts/lib/setup.sh`` installs for the tests). What cannot be found raises
``K8sBinariesMissing`` saying what to do.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

__all__ = ["K8sBinaries", "K8sBinariesMissing", "find_k8s_binaries"]

K8S_VERSION = "1.36.2"
_SRC_ROOT = Path(__file__).resolve().parents[2]
_SHARED = (_SRC_ROOT.parent / "shared/k8s-bin", Path("/work/shared/k8s-bin"))
_ENV = {"kube_apiserver": "KUBE_APISERVER_BIN", "kubectl": "KUBECTL_BIN", "kubelet": "KUBELET_BIN",
        "kube_scheduler": "KUBE_SCHEDULER_BIN"}
_FILES = {"kube_apiserver": "kube-apiserver", "kubectl": "kubectl", "kubelet": "kubelet",
          "kube_scheduler": "kube-scheduler"}


class K8sBinariesMissing(RuntimeError):
    """A binary the control plane needs is not on this machine."""


@dataclass(frozen=True)
class K8sBinaries:
    etcd: Path
    kube_apiserver: Path
    kubectl: Path
    kubelet: Path
    kube_scheduler: Path


def _executable(p: Path) -> bool:
    return p.is_file() and os.access(p, os.X_OK)


def _unpacked(cache: Path) -> dict[str, Path] | None:
    found = {k: cache / f"k8s-{K8S_VERSION}" / f for k, f in _FILES.items()}
    return found if all(_executable(p) for p in found.values()) else None


def _unpack(cache: Path) -> dict[str, Path]:
    env_dir = os.environ.get("NUMAPIN_K8S_BIN_DIR")
    dirs = (Path(env_dir),) if env_dir else _SHARED
    script = next((d / "unpack.sh" for d in dirs if _executable(d / "unpack.sh")), None)
    if script is None:
        raise K8sBinariesMissing(
            f"kube-apiserver {K8S_VERSION} not found: set {', '.join(_ENV.values())} (as k8s-bin/unpack.sh prints "
            f"them), or unpack them into {cache}, or set $NUMAPIN_K8S_BIN_DIR to the k8s-bin directory (looked for "
            f"unpack.sh in {', '.join(map(str, dirs))})")
    r = subprocess.run([str(script), str(cache)], capture_output=True, text=True, timeout=600, check=False)
    if r.returncode != 0:
        raise K8sBinariesMissing(f"{script} {cache} failed ({r.returncode}): {r.stderr.strip()}")
    found = _unpacked(cache)
    if found is None:
        raise K8sBinariesMissing(f"{script} ran but {cache}/k8s-{K8S_VERSION} lacks a binary: {r.stdout.strip()}")
    return found


def _etcd() -> Path:
    env = os.environ.get("ETCD_BIN")
    path = Path(env) if env else (Path(w) if (w := shutil.which("etcd")) else None)
    if path is None or not _executable(path):
        raise K8sBinariesMissing(f"etcd not found ({'$ETCD_BIN=' + shlex.quote(env) if env else 'not on the PATH'}):"
                                 " install Debian's etcd-server (apt-get install etcd-server; scripts/lib/setup.sh "
                                 "does it for the tests) or set $ETCD_BIN")
    return path


def find_k8s_binaries() -> K8sBinaries:
    """The binaries (see the module's documentation for where they are looked for)."""
    from_env = {k: Path(os.environ[v]) for k, v in _ENV.items() if os.environ.get(v)}
    for k, p in from_env.items():
        if not _executable(p):
            raise K8sBinariesMissing(f"${_ENV[k]}={p}: not an executable file")
    if len(from_env) < len(_ENV):
        cache = Path(os.environ.get("NUMAPIN_K8S_BIN_CACHE", "/var/cache/numapin-k8s-bin"))
        rest = _unpacked(cache) or _unpack(cache)
        from_env = {**rest, **from_env}
    return K8sBinaries(etcd=_etcd(), **from_env)
