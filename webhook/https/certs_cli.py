"""``numapin certs``: a CA and a serving certificate for the webhook, for clusters without cert-manager."""

from __future__ import annotations

import argparse
import ipaddress
import re
import sys
from pathlib import Path

import yaml

HELP = "make a CA and the webhook's serving certificate; print or write the caBundle and a Secret manifest"
DESCRIPTION = """\
Creates an ECDSA P-256 CA and a serving certificate for <service>.<namespace>.svc (and its other names).
With --out-dir, writes ca.crt, tls.crt, tls.key, secret.yaml (a kubernetes.io/tls Secret) and ca-bundle.txt;
without it, prints the Secret manifest and the caBundle to standard output. Put the caBundle into both webhook
configurations (manifests/webhook/webhook-configurations.yaml) or pass --webhook-config to get them filled in.
For an API server that calls the webhook by address (clientConfig.url https://10.0.0.5:8443/...), add the address
with --ip-address: it becomes an IP SAN (an IP literal given to --dns-name becomes one too).
"""

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--service", default="numapin-webhook", help="Service name (default numapin-webhook)")
    parser.add_argument("--namespace", default="numapin", help="namespace (default numapin)")
    parser.add_argument("--secret-name", default="numapin-webhook-tls", help="Secret name")
    parser.add_argument("--days", type=int, default=365, help="serving certificate validity in days (default 365)")
    parser.add_argument("--dns-name", action="append", default=[],
                        help="extra DNS name (repeatable); an IP literal here becomes an IP SAN")
    parser.add_argument("--ip-address", action="append", default=[], metavar="IP",
                        help="extra IP address SAN, IPv4 or IPv6 (repeatable)")
    parser.add_argument("--out-dir", type=Path, help="write the files here instead of printing")
    parser.add_argument("--webhook-config", type=Path,
                        help="a webhook configurations YAML to copy with the caBundle filled in (to --out-dir)")


def _fail(msg: str) -> int:
    print(f"numapin certs: {msg}", file=sys.stderr)
    return 2


def fill_ca_bundle(docs: list[object], ca_bundle: str) -> list[object]:
    """Set ``clientConfig.caBundle`` in every webhook of the Mutating/ValidatingWebhookConfigurations given."""
    for d in docs:
        if isinstance(d, dict) and d.get("kind") in ("MutatingWebhookConfiguration",
                                                     "ValidatingWebhookConfiguration"):
            meta = d.get("metadata", {})
            if isinstance(meta, dict) and isinstance(meta.get("annotations"), dict):
                meta["annotations"].pop("cert-manager.io/inject-ca-from", None)
                if not meta["annotations"]:
                    del meta["annotations"]
            for w in d.get("webhooks") or []:
                w.setdefault("clientConfig", {})["caBundle"] = ca_bundle
    return docs


def _sans(cert_pem: bytes) -> str:
    from cryptography import x509

    sans = x509.load_pem_x509_certificate(cert_pem).extensions.get_extension_for_class(x509.SubjectAlternativeName)
    names = [f"DNS:{n}" for n in sans.value.get_values_for_type(x509.DNSName)]
    names += [f"IP:{ip}" for ip in sans.value.get_values_for_type(x509.IPAddress)]
    return ", ".join(names)


def run(args: argparse.Namespace) -> int:
    from webhook.https.certs import make_bundle, secret_manifest

    for value, what in ((args.service, "--service"), (args.namespace, "--namespace"),
                        (args.secret_name, "--secret-name")):
        if not _DNS_LABEL.match(value) or len(value) > 63:
            return _fail(f"{what} must be a DNS label (lowercase letters, digits, '-'), got {value!r}")
    ips = []
    for value in args.ip_address:
        try:
            ips.append(ipaddress.ip_address(value[1:-1] if value.startswith("[") and value.endswith("]") else value))
        except ValueError:
            return _fail(f"--ip-address must be an IPv4 or IPv6 address, got {value!r}")
    for value in args.dns_name:
        if not value or len(value) > 253 or any(c.isspace() for c in value):
            return _fail(f"--dns-name must be a DNS name or an IP address, got {value!r}")
    if not 1 <= args.days <= 3650:
        return _fail(f"--days must be between 1 and 3650, got {args.days}")
    config_docs = None
    if args.webhook_config is not None:
        if args.out_dir is None:
            return _fail("--webhook-config needs --out-dir")
        try:
            config_docs = list(yaml.safe_load_all(args.webhook_config.read_text()))
        except (OSError, yaml.YAMLError) as e:
            return _fail(f"cannot read --webhook-config {args.webhook_config}: {e}")
    bundle = make_bundle(args.service, args.namespace, days=args.days, extra_dns=args.dns_name, extra_ips=ips)
    secret = yaml.safe_dump(secret_manifest(bundle, args.secret_name, args.namespace), sort_keys=False)
    if args.out_dir is None:
        sys.stdout.write("---\n" + secret)
        sys.stdout.write(f"# caBundle for the webhook configurations:\n# {bundle.ca_bundle}\n")
        return 0
    try:
        args.out_dir.mkdir(parents=True, exist_ok=True)
        (args.out_dir / "ca.crt").write_bytes(bundle.ca.cert_pem)
        (args.out_dir / "tls.crt").write_bytes(bundle.serving.cert_pem)
        key = args.out_dir / "tls.key"
        key.touch(mode=0o600, exist_ok=True)
        key.chmod(0o600)
        key.write_bytes(bundle.serving.key_pem)
        (args.out_dir / "secret.yaml").write_text(secret)
        (args.out_dir / "ca-bundle.txt").write_text(bundle.ca_bundle + "\n")
        if config_docs is not None:
            out = args.out_dir / "webhook-configurations.yaml"
            out.write_text(yaml.safe_dump_all(fill_ca_bundle(config_docs, bundle.ca_bundle), sort_keys=False))
    except OSError as e:
        return _fail(f"cannot write to {args.out_dir}: {e}")
    print(f"wrote ca.crt, tls.crt, tls.key, secret.yaml, ca-bundle.txt to {args.out_dir}")
    print(f"serving certificate for: {_sans(bundle.serving.cert_pem)}")
    print(f"caBundle: {bundle.ca_bundle}")
    return 0
