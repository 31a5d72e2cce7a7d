"""Which containerd the lab runs: the system's (Debian bookworm's 1.6) or one of a newer Debian suite's, unpacked
beside it into a cache directory and never installed over the system's.

``CONTAINERDS`` names the versions the suite runs (``"1.6"``, ``"1.7"``, ``"2.x"``) with the Debian suite each comes
from; ``containerd_bin_dir(version)`` gives the directory holding that version's ``containerd``,
``containerd-shim-runc-v2`` and ``ctr`` (None for the system's, found in ``PATH``). A suite's package is fetched
once with ``apt-get download`` against a private package list (the archive URI is this machine's own apt source;
the machine's package state is not touched), unpacked with ``dpkg -x`` and renamed into place, so later runs cost
nothing and a run that dies half-way leaves no half-unpacked cache. Every suite's containerd runs with the system's
runc (bookworm's 1.1.5: the newer suites' runc needs a newer glibc). What cannot be had raises ``LabError``: the
tests fail loudly, never skip.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .containerd import LabError, containerd_version

__all__ = ["CACHE", "CACHE_ENV", "CONTAINERDS", "ContainerdVersion", "containerd_bin_dir"]

CACHE_ENV = "NUMAPIN_CONTAINERD_CACHE"
CACHE = Path(os.environ.get(CACHE_ENV, "/var/cache/numapin-test-tools/containerd"))
KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"
FETCH_SECONDS = 900


@dataclass(frozen=True)
class ContainerdVersion:
    """A containerd the suite runs: its name in test ids, the Debian suite it comes from (None: the system's) and
    the version prefix its ``containerd --version`` must show."""

    name: str
    suite: str | None
    prefix: str


CONTAINERDS: dict[str, ContainerdVersion] = {v.name: v for v in (
    ContainerdVersion("1.6", None, "1.6."),
    ContainerdVersion("1.7", "trixie", "1.7."),
    ContainerdVersion("2.x", "sid", "2."),
)}


def _archive_uri() -> str:
    """The Debian archive this machine's apt uses (deb822 sources first, then the one-line format)."""
    for path, pattern in (("/etc/apt/sources.list.d/debian.sources", r"^URIs:\s*(\S+)"),
                          ("/etc/apt/sources.list", r"^deb\s+(?:\[[^]]*\]\s+)?(\S+)")):
        try:
            text = Path(path).read_text()
        except OSError:
            continue
        m = re.search(pattern, text, re.MULTILINE)
        if m:
            return m.group(1)
    raise LabError("no Debian archive URI in this machine's apt sources (/etc/apt/sources.list*)")


def _fetch(suite: str, into: Path) -> None:
    """Unpack ``suite``'s containerd package into ``into`` (a new, empty directory)."""
    with tempfile.TemporaryDirectory(prefix=f"fetch-containerd-{suite}-") as tmp:
        st = Path(tmp)
        for sub in ("lists/partial", "cache/archives/partial", "download"):
            (st / sub).mkdir(parents=True)
        (st / "sources.list").write_text(f"deb [signed-by={KEYRING}] {_archive_uri()} {suite} main\n")
        opts = ["-o", f"Dir::Etc::sourcelist={st}/sources.list", "-o", "Dir::Etc::sourceparts=-",
                "-o", f"Dir::State::Lists={st}/lists", "-o", f"Dir::Cache={st}/cache", "-o", "APT::Sandbox::User=root"]
        for args, cwd in ((["update"], st), (["download", "containerd"], st / "download")):
            r = subprocess.run(["apt-get", *opts, "-qq", *args], cwd=cwd, capture_output=True, text=True,
                               timeout=FETCH_SECONDS, check=False)
            if r.returncode != 0:
                raise LabError(f"apt-get {args[0]} for Debian {suite}'s containerd failed: {r.stderr.strip()[-800:]}")
        debs = list((st / "download").glob("containerd_*.deb"))
        if len(debs) != 1:
            raise LabError(f"apt-get download containerd ({suite}) gave {[d.name for d in debs]}")
        r = subprocess.run(["dpkg-deb", "-x", str(debs[0]), str(into)], capture_output=True, text=True, check=False,
                           timeout=FETCH_SECONDS)
        if r.returncode != 0:
            raise LabError(f"dpkg-deb -x {debs[0].name} failed: {r.stderr.strip()}")


def containerd_bin_dir(name: str, *, fetch: bool = True) -> Path | None:
    """The directory of containerd ``name`` (a key of ``CONTAINERDS``): None for the system's; for another suite's,
    its unpacked ``usr/bin`` in the cache, fetched first when missing (one fetcher at a time, by a lock file).
    ``fetch=False`` (inside a multi-NUMA VM, which sees the host's cache and must never download): a missing
    cache raises ``LabError``."""
    try:
        version = CONTAINERDS[name]
    except KeyError:
        raise LabError(f"unknown containerd {name!r} (known: {', '.join(CONTAINERDS)})") from None
    if version.suite is None:
        return None
    bin_dir = CACHE / version.suite / "usr/bin"
    if not fetch and not (bin_dir / "containerd").exists():
        raise LabError(f"containerd {name} (Debian {version.suite}'s) is not in the cache {CACHE} and may not be "
                       f"fetched here: the host fills it before it boots a VM that needs it (tests/numa/boots.py)")
    if not (bin_dir / "containerd").exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        with open(CACHE / f".{version.suite}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not (bin_dir / "containerd").exists():
                staging = Path(tempfile.mkdtemp(prefix=f".{version.suite}-", dir=CACHE))
                try:
                    _fetch(version.suite, staging)
                    shutil.rmtree(CACHE / version.suite, ignore_errors=True)
                    staging.rename(CACHE / version.suite)
                finally:
                    shutil.rmtree(staging, ignore_errors=True)
    found = containerd_version(bin_dir)
    if not found.startswith(version.prefix):
        raise LabError(f"Debian {version.suite}'s containerd is {found}, not {version.prefix}* (remove "
                       f"{CACHE / version.suite} to fetch it again, or update CONTAINERDS)")
    return bin_dir
