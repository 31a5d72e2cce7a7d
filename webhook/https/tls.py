"""The serving TLS context (TLS 1.2 or newer) and its certificate, re-read when the files change.

cert-manager (or a Secret volume update, or an operator) replaces the certificate and key files while the server
runs. ``CertReloader.check()`` notices the change (stat, then contents), reads both files once into memory,
validates the pair in a scratch context, and only then loads that same snapshot into the live context with
``load_cert_chain``. OpenSSL copies a context's certificate into each connection when the connection is created,
so connections already open keep working and new handshakes present the new certificate: no restart, no dropped
request. A half-written or mismatched pair is refused (the old certificate stays) and retried at the next poll.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import logging
import os
import ssl
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509

__all__ = ["CertError", "CertInfo", "CertReloader", "require_client_certificates", "server_context"]

log = logging.getLogger("numapin.webhook.tls")


class CertError(Exception):
    """The certificate or key cannot be used (missing, unreadable, malformed, not a pair)."""


@dataclass(frozen=True)
class CertInfo:
    subject: str
    serial: int
    not_after: dt.datetime
    dns_names: tuple[str, ...]
    digest: str  # sha256 of cert + key file contents


def server_context() -> ssl.SSLContext:
    """A server context that refuses TLS 1.0 and 1.1 (and SSL), without a certificate yet."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.options |= ssl.OP_NO_COMPRESSION | ssl.OP_CIPHER_SERVER_PREFERENCE
    ctx.set_alpn_protocols(["http/1.1"])
    return ctx


def _memfds(contents: tuple[bytes, ...]) -> list[int] | None:
    memfd = getattr(os, "memfd_create", None)
    if memfd is None or not os.path.isdir("/proc/self/fd"):
        return None
    fds: list[int] = []
    try:
        for data in contents:
            fd = memfd("numapin-tls", getattr(os, "MFD_CLOEXEC", 0))
            fds.append(fd)
            os.write(fd, data)
    except OSError:
        for fd in fds:
            os.close(fd)
        return None
    return fds


@contextlib.contextmanager
def _in_memory_files(*contents: bytes) -> Iterator[list[str]]:
    """Paths that read back the given bytes: memfds (the key never touches a disk) or a private temp dir."""
    fds = _memfds(contents)
    if fds is not None:
        try:
            yield [f"/proc/self/fd/{fd}" for fd in fds]
        finally:
            for fd in fds:
                os.close(fd)
        return
    with tempfile.TemporaryDirectory(prefix="numapin-tls-") as d:
        paths = []
        for i, data in enumerate(contents):
            p = os.path.join(d, f"f{i}.pem")
            with open(os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as f:
                f.write(data)
            paths.append(p)
        yield paths


def _stat_key(path: Path) -> tuple[int, int, int, int] | None:
    try:
        st = os.stat(path)  # follows symlinks: a Secret volume swaps its ..data link
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)


class CertReloader:
    """Keeps ``context`` serving the certificate found in ``cert_path``/``key_path``."""

    def __init__(self, cert_path: str | os.PathLike[str], key_path: str | os.PathLike[str],
                 context: ssl.SSLContext | None = None) -> None:
        self.cert_path = Path(cert_path)
        self.key_path = Path(key_path)
        self.context = context if context is not None else server_context()
        self.info: CertInfo | None = None
        self.reloads = 0
        self.failures = 0
        self.last_error: str | None = None
        self._stat: tuple[object, object] | None = None

    @property
    def loaded(self) -> bool:
        return self.info is not None

    def load(self) -> CertInfo:
        """Load the files now (at start). Raises CertError with the reason."""
        self._stat = (_stat_key(self.cert_path), _stat_key(self.key_path))
        try:
            cert, key = self.cert_path.read_bytes(), self.key_path.read_bytes()
        except OSError as e:
            raise CertError(f"cannot read certificate or key: {e}") from None
        info = self._apply(cert, key)
        return info

    def check(self) -> bool:
        """Reload if the files changed. True when a new certificate is now served; never raises."""
        stat = (_stat_key(self.cert_path), _stat_key(self.key_path))
        if stat == self._stat:
            return False
        try:
            cert, key = self.cert_path.read_bytes(), self.key_path.read_bytes()
        except OSError as e:
            self._fail(f"cannot read certificate or key: {e}")
            return False
        digest = hashlib.sha256(cert + b"\0" + key).hexdigest()
        if self.info is not None and digest == self.info.digest:
            self._stat = stat
            return False
        try:
            old = self.info
            info = self._apply(cert, key)
        except CertError as e:
            # leave _stat alone so the next poll tries again (the writer may be half way through)
            self._fail(str(e))
            return False
        self._stat = stat
        self.reloads += 1
        log.info("serving certificate reloaded: serial %x -> %x, valid until %s",
                 old.serial if old else 0, info.serial, info.not_after.isoformat())
        return True

    def _fail(self, message: str) -> None:
        if message != self.last_error:
            log.warning("certificate not (re)loaded, keeping the current one: %s", message)
        self.failures += 1
        self.last_error = message

    def _apply(self, cert: bytes, key: bytes) -> CertInfo:
        try:
            parsed = x509.load_pem_x509_certificate(cert)
        except ValueError as e:
            raise CertError(f"{self.cert_path}: not a PEM certificate ({e})") from None
        with _in_memory_files(cert, key) as (cert_file, key_file):
            scratch = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            try:
                scratch.load_cert_chain(cert_file, key_file)
            except (ssl.SSLError, OSError) as e:
                raise CertError(f"{self.cert_path} and {self.key_path} are not a usable certificate and key ({e})"
                                ) from None
            try:
                self.context.load_cert_chain(cert_file, key_file)
            except (ssl.SSLError, OSError) as e:  # pragma: no cover - the scratch load just succeeded
                raise CertError(f"loading into the serving context failed: {e}") from None
        try:
            san = parsed.extensions.get_extension_for_class(x509.SubjectAlternativeName)
            dns = tuple(san.value.get_values_for_type(x509.DNSName))
        except x509.ExtensionNotFound:
            dns = ()
        info = CertInfo(
            subject=parsed.subject.rfc4514_string(),
            serial=parsed.serial_number,
            not_after=parsed.not_valid_after_utc,
            dns_names=dns,
            digest=hashlib.sha256(cert + b"\0" + key).hexdigest(),
        )
        self.info = info
        self.last_error = None
        return info


def require_client_certificates(context: ssl.SSLContext, ca_file: str | os.PathLike[str]) -> None:
    """Ask every client for a certificate and verify any it presents against ``ca_file`` (a handshake with a
    certificate the CA did not sign fails). Presenting none is left to the HTTP layer to refuse on the admission
    paths, so the kubelet's probes (which present none) still reach /healthz and /readyz. Raises CertError."""
    try:
        context.load_verify_locations(cafile=os.fspath(ca_file))
    except (OSError, ssl.SSLError) as e:
        raise CertError(f"client CA {ca_file} cannot be used: {e}") from None
    context.verify_mode = ssl.CERT_OPTIONAL
