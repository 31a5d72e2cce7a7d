"""A client certificate for kube-apiserver to present to the webhook (``numapin webhook --client-ca-file``).

The API server presents one when its admission configuration (``--admission-control-config-file``) points, for the
webhook's Service name, to a kubeconfig with ``client-certificate``/``client-key``. This makes such a pair, signed
by a CA whose certificate is then given to the webhook as ``--client-ca-file`` (see docs/webhook.md, "Who may call the
webhook").
"""

from __future__ import annotations

import datetime as dt

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from webhook.https.certs import KeyPair

__all__ = ["make_client_cert"]


def make_client_cert(ca: KeyPair, common_name: str = "kube-apiserver-admission", days: int = 365) -> KeyPair:
    """An ECDSA P-256 certificate for TLS client authentication, signed by ``ca``."""
    ca_key = serialization.load_pem_private_key(ca.key_pem, password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(ca.certificate.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=False, key_cert_sign=False,
                                     crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    return KeyPair(cert.public_bytes(serialization.Encoding.PEM), key_pem)
