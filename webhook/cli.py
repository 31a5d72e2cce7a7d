"""``numapin webhook``: serve the admission webhook over HTTPS."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
from pathlib import Path

HELP = "run the admission webhook (HTTPS): mutates pods with their CPU intent, admits pods and bindings"
DESCRIPTION = """\
Serve /mutate and /validate (AdmissionReview v1 and v1beta1), /filter (kube-scheduler's extender filter,
nodeCacheCapable: manifests/scheduler/, docs/webhook.md "The scheduler extender") plus /healthz, /readyz and
/metrics over TLS 1.2+.
The certificate and key are re-read when the files change (cert-manager rotation) without a restart.
Node topology comes from NodeResourceTopology documents in --nrt-dir (default) or from the API server
(--in-cluster or --kubeconfig), which also feeds the cache of pending pods that bindings are judged against; a
binding for a pod not cached yet reads the pod from the API server (--pod-lookup-timeout).
A request that cannot be judged (pod or node unknown, node not simulable, pod unreadable, internal error) is
allowed with a warning or denied: --unjudged. Connections and bodies are bounded (see docs/webhook.md,
"Limits"); --client-ca-file makes /mutate, /validate and /filter answer only clients with a certificate from that
CA.
--workers N runs N webhook processes on the same port (SO_REUSEPORT), each with its own caches, as replicas.
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
    parser.add_argument("--max-body-bytes", type=int, default=None,
                        help=f"largest request body accepted (default {7 * 1024 * 1024})")
    judge = parser.add_argument_group("what cannot be judged")
    judge.add_argument("--unjudged", choices=("allow", "deny"), default="allow",
                       help="answer for a request the webhook cannot judge: allow it with a warning (default; the "
                            "node proxy remains the backstop) or deny it")
    judge.add_argument("--pod-lookup-timeout", type=float, default=1.0, metavar="SECONDS",
                       help="how long a binding waits for its pod from the API server on a cache miss (default 1)")
    judge.add_argument("--pod-cache-bytes", type=int, default=None,
                       help="memory bound of the pod cache (default 64 MiB)")
    judge.add_argument("--feature-gates", default="", metavar="A=true,B=false",
                       help="the kubelets' --feature-gates that change their CPU and Memory Managers, in kubelet's "
                            "syntax: PodLevelResourceManagers=true simulates kubelet 1.36's alpha pod-level resource "
                            "managers (docs/annotations.md); default: kubelet's defaults (off)")
    who = parser.add_argument_group("who may bypass numapin (docs/tenancy.md)")
    who.add_argument("--bypass-namespaces", default=None, metavar="NS[,NS...]",
                     help="namespaces whose pods may set numapin.io/bypass: \"true\"; elsewhere it is denied on CREATE "
                          "and on an UPDATE that sets it (default: the webhook's own namespace, from $POD_NAMESPACE "
                          "or the service account, else numapin; empty: nobody)")
    who.add_argument("--bypass-service-accounts", default=None, metavar="NS:NAME[,...]",
                     help="when given, a pod of --bypass-namespaces must also run as one of these service accounts to "
                          "set numapin.io/bypass (the node proxy cannot see service accounts: it checks namespaces)")
    lim = parser.add_argument_group("connection limits (docs/webhook.md, Limits)")
    lim.add_argument("--client-ca-file", "--client-ca", dest="client_ca", type=Path, metavar="FILE",
                     help="CA (PEM) of the client certificate kube-apiserver presents (its admission kubeconfig); "
                          "/mutate, /validate and /filter then refuse clients without one (401) and the TLS handshake "
                          "refuses "
                          "a certificate the CA did not sign; /healthz, /readyz and /metrics stay open (--client-ca: "
                          "the same flag's earlier name)")
    lim.add_argument("--max-connections", type=int, default=None, help="open connections at most (default 256)")
    lim.add_argument("--idle-timeout", type=float, default=None, metavar="SECONDS",
                     help="close a keep-alive connection idle this long (default 60)")
    lim.add_argument("--header-timeout", type=float, default=None, metavar="SECONDS",
                     help="a request's headers must arrive within this time (default 10)")
    lim.add_argument("--body-timeout", type=float, default=None, metavar="SECONDS",
                     help="a request's body must arrive within this time (default 10)")
    lim.add_argument("--inflight-bytes", type=int, default=None,
                     help="memory budget of request bodies being read and judged at once (default 128 MiB)")
    scale = parser.add_argument_group("processes (docs/performance.md, the admission webhook)")
    scale.add_argument("--workers", type=int, default=1,
                       help="webhook processes sharing --port (default 1); each is a whole webhook with its own caches "
                            "and API watches, as replicas are (docs/webhook.md, Scaling)")
    scale.add_argument("--reuse-port", action="store_true",
                       help="listen with SO_REUSEPORT, so several processes share --port (what --workers starts)")
    scale.add_argument("--worker-metrics-dir", type=Path, default=None, metavar="DIR",
                       help="set by --workers for its workers: each answers its own metrics on a unix socket in DIR, "
                            "and /metrics answers every worker's, counters summed (docs/metrics.md)")
    parser.add_argument("--cert-poll-seconds", type=float, default=5.0, help="how often to check the cert files")
    parser.add_argument("--nrt-poll-seconds", type=float, default=2.0, help="how often to re-read --nrt-dir")
    parser.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))


def _fail(msg: str) -> int:
    print(f"numapin webhook: {msg}", file=sys.stderr)
    return 2


_SA_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def own_namespace() -> str:
    """The namespace the webhook runs in: $POD_NAMESPACE, else its service account's, else numapin's default."""
    from allocator.bypass import DEFAULT_BYPASS_NAMESPACE

    env = os.environ.get("POD_NAMESPACE", "").strip()
    if env:
        return env
    try:
        return _SA_NAMESPACE.read_text().strip() or DEFAULT_BYPASS_NAMESPACE
    except OSError:
        return DEFAULT_BYPASS_NAMESPACE


def run(args: argparse.Namespace) -> int:
    from webhook.https.workers import end_with_supervisor

    why = end_with_supervisor()  # a worker of --workers: first of all (before the imports), end with the supervisor
    if why is not None:
        return _fail(why)

    from allocator.bypass import BypassPolicy, parse_names, parse_service_accounts
    from allocator.errors import ConfigError
    from allocator.feature_gates import parse_feature_gates
    from webhook.app import WebhookApp, WebhookOptions
    from webhook.cluster.pods_cache import DEFAULT_POD_CACHE_BYTES
    from webhook.https.limits import ServerLimits
    from webhook.https.server import DEFAULT_MAX_BODY
    from webhook.https.tls import CertError

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
    if args.client_ca is not None and not args.client_ca.is_file():
        return _fail(f"--client-ca-file {args.client_ca} is not a file")
    if args.workers < 1:
        return _fail(f"--workers must be at least 1, got {args.workers}")
    if args.worker_metrics_dir is not None and not args.worker_metrics_dir.is_dir():
        return _fail(f"--worker-metrics-dir {args.worker_metrics_dir} is not a directory")
    for name in ("max_body_bytes", "cert_poll_seconds", "nrt_poll_seconds", "pod_lookup_timeout", "pod_cache_bytes",
                 "max_connections", "idle_timeout", "header_timeout", "body_timeout", "inflight_bytes"):
        value = getattr(args, name)
        if value is not None and value <= 0:
            return _fail(f"--{name.replace('_', '-')} must be positive, got {value}")
    try:
        bypass = BypassPolicy(
            namespaces=parse_names(own_namespace() if args.bypass_namespaces is None else args.bypass_namespaces,
                                   "--bypass-namespaces"),
            service_accounts=parse_service_accounts(args.bypass_service_accounts, "--bypass-service-accounts"))
        gates = parse_feature_gates(args.feature_gates)
    except ConfigError as e:
        return _fail(str(e))
    opts = WebhookOptions(
        cert=args.cert, key=args.key, host=args.host, port=args.port, nrt_dir=args.nrt_dir, pods_dir=args.pods_dir,
        kubeconfig=args.kubeconfig, in_cluster=args.in_cluster,
        max_body=args.max_body_bytes or DEFAULT_MAX_BODY, cert_poll_seconds=args.cert_poll_seconds,
        nrt_poll_seconds=args.nrt_poll_seconds,
        limits=ServerLimits(**{k: v for k, v in (
            ("max_connections", args.max_connections), ("idle_timeout", args.idle_timeout),
            ("header_timeout", args.header_timeout), ("body_timeout", args.body_timeout),
            ("inflight_bytes", args.inflight_bytes)) if v is not None}),
        client_ca=args.client_ca, unjudged=args.unjudged, pod_lookup_timeout=args.pod_lookup_timeout,
        pod_cache_bytes=args.pod_cache_bytes or DEFAULT_POD_CACHE_BYTES, reuse_port=args.reuse_port,
        settle_heap=True, worker_metrics_dir=args.worker_metrics_dir, bypass=bypass, feature_gates=gates,
    )
    if opts.max_body * 8 > opts.limits.inflight_bytes:
        return _fail(f"--inflight-bytes ({opts.limits.inflight_bytes}) must hold one body of --max-body-bytes "
                     f"({opts.max_body}) parsed, i.e. at least {opts.max_body * 8}")
    if args.workers > 1:  # after every check, so a bad option fails once, here
        if args.port == 0:
            return _fail("--workers needs a fixed --port (with port 0 each worker would listen on a port of its own)")
        if sys.argv[1:2] != ["webhook"]:
            return _fail("--workers works from the numapin command line only")
        from webhook.https.workers import supervise, worker_command

        return supervise(worker_command(sys.argv[2:]), args.workers)

    async def main() -> int:
        app = WebhookApp(opts)
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
