"""A CA and a serving certificate for the webhook's Service, for clusters without cert-manager.

Keys are ECDSA P-256. The serving certificate names the Service as the API server dials it
(``<svc>.<ns>.svc``) and its other forms, plus any extra DNS names and IP addresses (an API server calling the
webhook by URL ``https://<ip>:<port>/...`` checks an IP SAN, never a DNS name spelled like an address); it is
signed by the CA whose PEM goes into the webhook configurations' ``caBundle``.
"""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = [
    "CertBundle",
    "KeyPair",
    "make_bundle",
    "make_ca",
    "make_serving_cert",
    "secret_manifest",
    "service_dns_names",
    "split_names",
]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


@dataclass(frozen=True)
class KeyPair:
    cert_pem: bytes
    key_pem: bytes

    @property
    def certificate(self) -> x509.Certificate:
        return x509.load_pem_x509_certificate(self.cert_pem)


@dataclass(frozen=True)
class CertBundle:
    ca: KeyPair
    serving: KeyPair

    @property
    def ca_bundle(self) -> str:
        """The base64 of the CA certificate PEM, as ``caBundle`` wants it."""
        return base64.b64encode(self.ca.cert_pem).decode("ascii")


def service_dns_names(service: str, namespace: str, cluster_domain: str = "cluster.local") -> list[str]:
    return [
        service,
        f"{service}.{namespace}",
        f"{service}.{namespace}.svc",
        f"{service}.{namespace}.svc.{cluster_domain}",
    ]


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def make_ca(common_name: str = "numapin-webhook-ca", days: int = 3650) -> KeyPair:
    key = _key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                     crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return KeyPair(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def split_names(names: Sequence[str]) -> tuple[list[str], list[IPAddress]]:
    """DNS names and IP literals apart (``127.0.0.1``, ``::1``, ``[fd00::1]`` are addresses), in order, without
    duplicates."""
    dns: list[str] = []
    ips: list[IPAddress] = []
    for n in names:
        try:
            ip = ipaddress.ip_address(n[1:-1] if n.startswith("[") and n.endswith("]") else n)
        except ValueError:
            if n not in dns:
                dns.append(n)
        else:
            if ip not in ips:
                ips.append(ip)
    return dns, ips


def make_serving_cert(ca: KeyPair, dns_names: list[str], days: int = 365,
                      ip_addresses: Sequence[IPAddress] = ()) -> KeyPair:
    """A serving certificate for ``dns_names`` (IP literals among them become IP SANs) and ``ip_addresses``."""
    dns_names, ips = split_names(dns_names)
    ips += [ip for ip in ip_addresses if ip not in ips]
    if not dns_names and not ips:
        raise ValueError("a serving certificate needs at least one DNS name or IP address")
    sans: list[x509.GeneralName] = [x509.DNSName(n) for n in dns_names]
    sans += [x509.IPAddress(ip) for ip in ips]
    common_name = dns_names[0] if dns_names else str(ips[0])
    ca_cert = ca.certificate
    ca_key = serialization.load_pem_private_key(ca.key_pem, password=None)
    key = _key()
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=False, key_cert_sign=False,
                                     crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_cert.public_key()),  # type: ignore[arg-type]
                       critical=False)
        .sign(ca_key, hashes.SHA256())  # type: ignore[arg-type]
    )
    return KeyPair(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def make_bundle(service: str, namespace: str, *, days: int = 365, extra_dns: list[str] | None = None,
                extra_ips: Sequence[IPAddress] = ()) -> CertBundle:
    """CA + serving certificate for the Service's names, ``extra_dns`` (IP literals become IP SANs) and
    ``extra_ips``."""
    ca = make_ca(days=max(days, 3650))
    serving = make_serving_cert(ca, service_dns_names(service, namespace) + list(extra_dns or []), days=days,
                                ip_addresses=extra_ips)
    return CertBundle(ca=ca, serving=serving)


def secret_manifest(bundle: CertBundle, name: str, namespace: str) -> dict[str, object]:
    """A ``kubernetes.io/tls`` Secret with the serving pair and the CA (``ca.crt``)."""

    def b64(data: bytes) -> str:
        return base64.b64encode(data).decode("ascii")

    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "kubernetes.io/tls",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app.kubernetes.io/name": "numapin-webhook"}},
        "data": {
            "tls.crt": b64(bundle.serving.cert_pem),
            "tls.key": b64(bundle.serving.key_pem),
            "ca.crt": b64(bundle.ca.cert_pem),
        },
    }
