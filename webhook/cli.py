"""``numapin webhook``: serve the admission webhook over HTTPS."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import sys
from pathlib import Path

HELP = "run the admission webhook (HTTPS): mutates pods with their CPU intent, admits pods and bindings"
DESCRIPTION = """\
Serve /mutate and /validate (AdmissionReview v1 and v1beta1) plus /healthz, /readyz and /metrics over TLS 1.2+.
The certificate and key are re-read when the files change (cert-manager rotation) without a restart.
Node topology comes from NodeResourceTopology documents in --nrt-dir (default) or from the API server
(--in-cluster or --kubeconfig), which also feeds the cache of pending pods that bindings are judged against.
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cert", required=True, type=Path, help="serving certificate (PEM), e.g. tls.crt")
    parser.add_argument("--key", required=True, type=Path, help="private key (PEM), e.g. tls.key")
    parser.add_argument("--host", default="0.0.0.0", help="address to listen on (default 0.0.0.0)")
    parser.add_argument("--port", type=int, default=8443, help="port to listen on (default 8443)")
    src = parser.add_argument_group("node topology and pods")
    src.add_argument("--nrt-dir", type=Path, help="directory of NodeResourceTopology (and Node) YAML/JSON documents")
    src.add_argument("--pods-dir", type=Path, help="directory of Pod documents known to bindings (demo, tests)")
    src.add_argument("--kubeconfig", help="read NodeResourceTopologies, Nodes and pending Pods from this cluster")
    src.add_argument("--in-cluster", action="store_true", help="as --kubeconfig, with the pod's service account")
    parser.add_argument("--max-body-bytes", type=int, default=None, help="largest request body accepted")
    parser.add_argument("--cert-poll-seconds", type=float, default=5.0, help="how often to check the cert files")
    parser.add_argument("--nrt-poll-seconds", type=float, default=2.0, help="how often to re-read --nrt-dir")
    parser.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))


def _fail(msg: str) -> int:
    print(f"numapin webhook: {msg}", file=sys.stderr)
    return 2


def run(args: argparse.Namespace) -> int:
    from .app import WebhookOptions, build_server
    from .server import DEFAULT_MAX_BODY
    from .tls import CertError

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not 0 <= args.port <= 65535:
        return _fail(f"--port must be between 0 and 65535, got {args.port}")
    if args.nrt_dir is None and not args.kubeconfig and not args.in_cluster:
        return _fail("give a node topology source: --nrt-dir DIR, --kubeconfig FILE or --in-cluster")
    if args.nrt_dir is not None and not args.nrt_dir.is_dir():
        return _fail(f"--nrt-dir {args.nrt_dir} is not a directory")
    if args.pods_dir is not None and not args.pods_dir.is_dir():
        return _fail(f"--pods-dir {args.pods_dir} is not a directory")
    if args.kubeconfig and not Path(args.kubeconfig).is_file():
        return _fail(f"--kubeconfig {args.kubeconfig} is not a file")
    for name in ("max_body_bytes", "cert_poll_seconds", "nrt_poll_seconds"):
        value = getattr(args, name)
        if value is not None and value <= 0:
            return _fail(f"--{name.replace('_', '-')} must be positive, got {value}")
    opts = WebhookOptions(
        cert=args.cert, key=args.key, host=args.host, port=args.port, nrt_dir=args.nrt_dir, pods_dir=args.pods_dir,
        kubeconfig=args.kubeconfig, in_cluster=args.in_cluster,
        max_body=args.max_body_bytes or DEFAULT_MAX_BODY, cert_poll_seconds=args.cert_poll_seconds,
        nrt_poll_seconds=args.nrt_poll_seconds,
    )

    async def main() -> int:
        app = build_server(opts)
        try:
            await app.start()
        except CertError as e:
            return _fail(f"cannot serve: {e}")
        except OSError as e:
            return _fail(f"cannot listen on {opts.host}:{opts.port}: {e}")
        print(f"numapin webhook listening on https://{opts.host}:{app.port}", file=sys.stderr, flush=True)
        done = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError):
                loop.add_signal_handler(sig, done.set)
        await done.wait()
        await app.stop()
        return 0

    return asyncio.run(main())
