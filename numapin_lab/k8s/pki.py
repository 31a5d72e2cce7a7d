"""The control plane's certificates: a CA (numapin's ``webhook.https.certs`` helpers), the API server's serving
certificate for the loopback addresses, and client certificates that name a user and its groups (CN and O, as
kube-apiserver's ``--client-ca-file`` authentication reads them)."""

from __future__ import annotations

import datetime as dt

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from webhook.https.certs import KeyPair, make_ca, make_serving_cert

__all__ = ["client_cert", "control_plane_ca", "loopback_serving_cert"]


def control_plane_ca() -> KeyPair:
    return make_ca(common_name="numapin-lab-kubernetes-ca", days=30)


def loopback_serving_cert(ca: KeyPair) -> KeyPair:
    return make_serving_cert(ca, ["localhost", "127.0.0.1", "kubernetes", "kubernetes.default.svc"], days=30)


def client_cert(ca: KeyPair, user: str, groups: tuple[str, ...] = ()) -> KeyPair:
    """A client certificate for ``user`` in ``groups``, signed by ``ca``."""
    ca_key = serialization.load_pem_private_key(ca.key_pem, password=None)
    key = ec.generate_private_key(ec.SECP256R1())
    subject = [x509.NameAttribute(NameOID.COMMON_NAME, user)]
    subject += [x509.NameAttribute(NameOID.ORGANIZATION_NAME, g) for g in groups]
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name(subject))
        .issuer_name(ca.certificate.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())  # type: ignore[arg-type]
    )
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    return KeyPair(cert.public_bytes(serialization.Encoding.PEM), key_pem)
