"""Hostile traffic against a real ``numapin webhook`` process on loopback (issue 15), shared by the suite's bounded
test (tests/webhook/test_hostile.py) and the longer form run by hand (benchmarks/webhook_hostile.py).

- ``WebhookProcess``: the webhook started as operators start it (``python -m numapin webhook``), its RSS read from
  /proc, its metrics scraped from /metrics;
- ``fuzz_bodies``: a seeded stream of AdmissionReview bodies, from well-formed to hostile (the payloads of the
  issue: quantities of thousands of digits, deeply nested intents, uids with unpaired surrogates, bodies that are
  not UTF-8, random byte flips, wrong types), each with what a correct answer must satisfy;
- the HTTP abuse: idle TLS connections, TCP connections that never handshake, slowloris headers, half-sent bodies;
- ``Prober``: GET /healthz on a fresh connection every ``interval`` seconds while an attack runs; its latencies
  measure how long the event loop was blocked (no assertion on the attack's own timing).
Everything is bounded in count and time and stays on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import re
import ssl
import subprocess
import sys
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.webhook.helpers import PKI, SERVER_NAME, make_pki
from tests.webhook.nrt_fixtures import machine, nrt, write_docs

ROOT = Path(__file__).resolve().parents[2]


# -- the server process --------------------------------------------------------------------------------------------
class WebhookProcess:
    def __init__(self, workdir: Path, *extra: str) -> None:
        self.workdir = workdir
        (workdir / "tls").mkdir(parents=True, exist_ok=True)
        (workdir / "nrt").mkdir(exist_ok=True)
        (workdir / "pods").mkdir(exist_ok=True)
        self.pki: PKI = make_pki(workdir / "tls")
        write_docs(workdir / "nrt" / "node-a.yaml", [nrt("node-a", machine(2, 14), reserved="0,28")])
        self.args = [sys.executable, "-m", "numapin", "webhook", "--cert", str(self.pki.cert), "--key",
                     str(self.pki.key), "--host", "127.0.0.1", "--port", "0", "--nrt-dir", str(workdir / "nrt"),
                     "--pods-dir", str(workdir / "pods"), "--log-level", "warning", *extra]
        self.log = workdir / "webhook.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0

    def start(self, timeout: float = 60.0) -> None:
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(self.args, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                         env={**os.environ, "PYTHONPATH": str(ROOT)})
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            m = re.search(r"listening on https://127\.0\.0\.1:(\d+)", self.log.read_text(errors="replace"))
            if m:
                self.port = int(m.group(1))
                return
            if self.proc.poll() is not None:
                raise RuntimeError(f"numapin webhook exited: {self.log.read_text(errors='replace')[-2000:]}")
            time.sleep(0.05)
        raise RuntimeError(f"numapin webhook did not start: {self.log.read_text(errors='replace')[-2000:]}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def rss_bytes(self) -> int:
        text = Path(f"/proc/{self.pid}/status").read_text()
        m = re.search(r"^VmRSS:\s+(\d+) kB", text, re.MULTILINE)
        assert m, text
        return int(m.group(1)) * 1024

    def ssl_context(self) -> ssl.SSLContext:
        return self.pki.client_context()

    @property
    def ca_file(self) -> Path:
        path = self.workdir / "tls" / "ca.crt"
        if not path.exists():
            path.write_bytes(self.pki.ca_pem)
        return path

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


# -- raw HTTPS ------------------------------------------------------------------------------------------------------
async def tls_open(port: int, ctx: ssl.SSLContext, timeout: float = 10.0
                   ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port, ssl=ctx, server_hostname=SERVER_NAME),
                                  timeout)


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    m = re.search(rb"(?i)\r\ncontent-length:\s*(\d+)", head)
    body = await reader.readexactly(int(m.group(1))) if m else await reader.read()
    return status, body


async def request(port: int, ctx: ssl.SSLContext, method: str, path: str, body: bytes = b"",
                  content_type: str = "application/json", timeout: float = 10.0) -> tuple[int, bytes]:
    """One request on a fresh connection (Connection: close)."""
    reader, writer = await tls_open(port, ctx, timeout)
    try:
        head = (f"{method} {path} HTTP/1.1\r\nHost: {SERVER_NAME}\r\nContent-Type: {content_type}\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
        writer.write(head + body)
        return await asyncio.wait_for(_read_response(reader), timeout)
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()


async def metrics(port: int, ctx: ssl.SSLContext) -> dict[str, float]:
    """The server's /metrics as {"name{labels}": value}."""
    status, body = await request(port, ctx, "GET", "/metrics")
    assert status == 200, status
    out: dict[str, float] = {}
    for line in body.decode().splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def metric_sum(values: dict[str, float], name: str, **labels: str) -> float:
    total = 0.0
    for key, v in values.items():
        base = key.split("{", 1)[0]
        if base != name:
            continue
        if all(f'{k}="{val}"' in key for k, val in labels.items()):
            total += v
    return total


# -- loop lag --------------------------------------------------------------------------------------------------------
async def _probe_loop(port: int, ctx: ssl.SSLContext, interval: float, timeout: float, stop: asyncio.Event,
                      latencies: list[float], failures: list[str]) -> None:
    while not stop.is_set():
        started = time.perf_counter()
        try:
            status, _ = await request(port, ctx, "GET", "/healthz", timeout=timeout)
            if status == 200:
                latencies.append(time.perf_counter() - started)
            else:
                failures.append(f"HTTP {status}")
        except Exception as e:  # a timeout or a refused connection is what the probe is there to see
            failures.append(f"{type(e).__name__}: {e}")
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(interval):
                await stop.wait()


def _probe_main(port: int, ca_file: str, interval: float, timeout: float) -> None:
    """The prober's own process: probes until stdin closes, then prints its results as JSON."""
    ctx = ssl.create_default_context(cafile=ca_file)
    latencies: list[float] = []
    failures: list[str] = []

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        loop.add_reader(sys.stdin.fileno(), stop.set)
        await _probe_loop(port, ctx, interval, timeout, stop, latencies, failures)

    asyncio.run(main())
    print(json.dumps({"latencies": latencies, "failures": failures}), flush=True)


@dataclass
class Prober:
    """GET /healthz on a fresh connection every ``interval`` s from a separate process (so the attacking client's
    own work does not delay the probes); ``latencies`` of the answered, ``failures`` the rest."""

    port: int
    ca_file: Path
    interval: float = 0.1
    timeout: float = 5.0
    latencies: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    _proc: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        self._proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "tests.webhook.hostile", "probe", str(self.port), str(self.ca_file),
            str(self.interval), str(self.timeout), cwd=ROOT, stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(ROOT)})

    async def stop(self) -> None:
        assert self._proc is not None and self._proc.stdin is not None
        self._proc.stdin.close()
        out, _ = await asyncio.wait_for(self._proc.communicate(), 60)
        result = json.loads(out.decode().strip().splitlines()[-1])
        self.latencies, self.failures = result["latencies"], result["failures"]

    def summary(self) -> dict[str, Any]:
        lat = sorted(self.latencies)
        pick = (lambda q: round(lat[min(len(lat) - 1, int(q * len(lat)))] * 1000, 2)) if lat else (lambda q: None)
        return {"probes": len(lat) + len(self.failures), "failed": len(self.failures), "p50_ms": pick(0.5),
                "p99_ms": pick(0.99), "max_ms": round(lat[-1] * 1000, 2) if lat else None,
                "failures": self.failures[:5]}


# -- HTTP abuse ------------------------------------------------------------------------------------------------------
class Attack:
    """Connections held open on purpose; ``close()`` drops them all."""

    def __init__(self, port: int, ctx: ssl.SSLContext) -> None:
        self.port = port
        self.ctx = ctx
        self.writers: list[asyncio.StreamWriter] = []
        self.readers: list[asyncio.StreamReader] = []
        self.tasks: list[asyncio.Task[None]] = []
        self.errors = 0

    async def _open(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        try:
            r, w = await tls_open(self.port, self.ctx, timeout=20)
        except Exception:
            self.errors += 1
            return None
        self.readers.append(r)
        self.writers.append(w)
        return r, w

    async def idle(self, n: int, concurrency: int = 50) -> int:
        """``n`` TLS connections that send nothing."""
        sem = asyncio.Semaphore(concurrency)

        async def one() -> bool:
            async with sem:
                return await self._open() is not None

        return sum(await asyncio.gather(*(one() for _ in range(n))))

    async def no_handshake(self, n: int) -> int:
        """``n`` TCP connections that never start TLS."""
        opened = 0
        for _ in range(n):
            try:
                r, w = await asyncio.open_connection("127.0.0.1", self.port)
            except OSError:
                self.errors += 1
                continue
            self.readers.append(r)
            self.writers.append(w)
            opened += 1
        return opened

    async def slowloris(self, n: int, every: float = 0.5) -> int:
        """``n`` connections sending a request's headers one byte every ``every`` seconds, forever."""
        head = (f"POST /validate HTTP/1.1\r\nHost: {SERVER_NAME}\r\nContent-Type: application/json\r\n"
                "X-Slow: " + "a" * 4000).encode()
        opened = 0
        for _ in range(n):
            conn = await self._open()
            if conn is None:
                continue
            opened += 1

            async def drip(w: asyncio.StreamWriter = conn[1]) -> None:
                with contextlib.suppress(Exception):
                    for i in range(len(head)):
                        w.write(head[i:i + 1])
                        await w.drain()
                        await asyncio.sleep(every)

            self.tasks.append(asyncio.create_task(drip()))
        return opened

    async def half_bodies(self, n: int, announced: int, sent: int) -> int:
        """``n`` POSTs announcing ``announced`` body bytes, sending ``sent`` of them, then stalling."""
        opened = 0
        for _ in range(n):
            conn = await self._open()
            if conn is None:
                continue
            opened += 1
            w = conn[1]
            w.write((f"POST /validate HTTP/1.1\r\nHost: {SERVER_NAME}\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {announced}\r\n\r\n").encode() + b"[" + b" " * (sent - 1))
            with contextlib.suppress(Exception):
                await asyncio.wait_for(w.drain(), 5)
        return opened

    async def closed_by_server(self) -> int:
        """How many held connections the server has closed (an answer such as 408 may come first, then EOF)."""
        closed = 0
        for r in self.readers:
            try:
                while not r.at_eof():
                    if await asyncio.wait_for(r.read(65536), 0.05) == b"":
                        break
                closed += 1
            except TimeoutError:
                pass
            except Exception:  # reset
                closed += 1
        return closed

    async def close(self) -> None:
        for t in self.tasks:
            t.cancel()
        for t in self.tasks:
            with contextlib.suppress(BaseException):
                await t
        for w in self.writers:
            with contextlib.suppress(Exception):
                w.transport.abort()
        self.writers.clear()
        self.readers.clear()


# -- fuzzed AdmissionReview bodies -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Case:
    kind: str                # what the body is, for reports
    path: str
    body: bytes
    must_deny: bool = False  # a hostile pod: with --unjudged=deny any answer but a denial is failing open


def _pod(cpu: Any, *, intent: str | None = None, mode: str | None = "exclusive", name: str = "p") -> dict[str, Any]:
    ann: dict[str, Any] = {}
    if mode is not None:
        ann["qos.gocrane.io/cpu-manager"] = mode
    if intent is not None:
        ann["numapin.io/cpu-intent"] = intent
    res = {"requests": {"cpu": cpu, "memory": "1Gi"}, "limits": {"cpu": cpu, "memory": "1Gi"}}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default", "uid": str(uuid.uuid4()), "annotations": ann},
            "spec": {"containers": [{"name": "c", "image": "x", "resources": res}]}}


def _review(obj: Any, *, uid: str | None = None, sub: str = "", operation: str = "CREATE") -> dict[str, Any]:
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": uid or str(uuid.uuid4()), "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"}, "subResource": sub,
        "name": obj.get("metadata", {}).get("name", "") if isinstance(obj, dict) else "", "namespace": "default",
        "operation": operation, "userInfo": {"username": "fuzz"}, "object": obj, "oldObject": None,
        "dryRun": False}}


def _dump(doc: Any) -> bytes:
    return json.dumps(doc, separators=(",", ":")).encode()


def hostile_cases() -> list[Case]:
    """The payloads of issue 15, each on /mutate and /validate."""
    cases: list[Case] = []
    pods = {
        "cpu-16000-digits-then-x": _pod("1" * 16000 + "x"),
        "cpu-5000-digits": _pod("1" * 5000),
        "memory-5000-nines-E": _pod("2", mode=None) | {},
        "intent-1250-nested": _pod("2", intent="[" * 1250),
        "intent-deep-valid": _pod("2", intent='{"v":' * 900 + "1" + "}" * 900),
        "cpu-huge-json-int": _pod(int("9" * 4000)),
    }
    pods["memory-5000-nines-E"]["spec"]["containers"][0]["resources"]["limits"]["memory"] = "9" * 5000 + "E"
    for kind, pod in pods.items():
        for path in ("/mutate", "/validate"):
            cases.append(Case(kind, path, _dump(_review(pod)), must_deny=path == "/validate"))
    return cases


# where a nesting goes in a review: kept by the slim review (and so checked against json_bounds) or dropped by it
NEST_PLACES = ("request.resource.group", "annotation", "cpu", "volumes", "userInfo")
# depths around every bound: json_bounds.MAX_DEPTH, where pickle gave up (~500), the parsers' own (~1000), far beyond
NEST_DEPTHS = (1, 2, 10, 62, 63, 64, 65, 66, 100, 400, 499, 500, 501, 800, 980, 990, 999, 1000, 1001, 5000, 100000)


def nested_review(depth: int, place: str = "request.resource.group", *, brace: str = "[", pad: int = 0) -> bytes:
    """A pod review carrying ``depth`` levels of arrays (``brace`` "[") or objects ("{") at ``place``, padded with an
    annotation of ``pad`` bytes (over ``request_body.LARGE_BODY_BYTES`` the parser process reads it; issue 25: 800
    levels of arrays in request.resource.group of a body over 128 KiB killed that process)."""
    pod = _pod("2")
    if pad:
        pod["metadata"]["annotations"]["pad"] = "x" * pad
    doc = _review(pod)
    mark = "NESTMARK"
    if place == "request.resource.group":
        doc["request"]["resource"]["group"] = mark
    elif place == "annotation":
        pod["metadata"]["annotations"]["deep"] = mark
    elif place == "cpu":
        pod["spec"]["containers"][0]["resources"]["limits"]["cpu"] = mark
    elif place == "volumes":
        pod["spec"]["volumes"] = mark
    else:
        doc["request"]["userInfo"]["extra"] = mark
    nest = ("[" * depth + "]" * depth) if brace == "[" else ('{"a":' * depth + "1" + "}" * depth)
    return _dump(doc).replace(f'"{mark}"'.encode(), nest.encode())


def nested_cases(depths: Iterable[int] = NEST_DEPTHS, *, pads: Iterable[int] = (0, 140 * 1024)) -> list[Case]:
    """Every place of ``NEST_PLACES`` at every depth, arrays and objects, on the event loop and in the parser
    process (by padding)."""
    return [Case(f"nested-{brace}{depth}-{place}{'-large' if pad else ''}", "/validate",
                 nested_review(depth, place, brace=brace, pad=pad))
            for depth in depths for place in NEST_PLACES for brace in "[{" for pad in pads]


def fuzz_bodies(seed: int, count: int) -> Iterator[Case]:
    """``count`` seeded bodies: valid reviews, hostile values, broken encodings and structures."""
    rng = random.Random(seed)
    digits = "0123456789"

    def quantity() -> Any:
        return rng.choice([
            lambda: rng.choice(["2", "1500m", "0.5", "1Gi", "1e3", ".5", "1.", "+2", "-1", "2k", "1E"]),
            lambda: "".join(rng.choice(digits) for _ in range(rng.randint(1, 9000))) + rng.choice(["", "x", "m"]),
            lambda: "".join(rng.choice("0123456789.+-eEnumkKMGTPi") for _ in range(rng.randint(0, 40))),
            lambda: rng.choice([10**rng.randint(1, 4000), 1e308, -5, 0.1, True, None, [], {}]),
            lambda: "1e" + str(rng.randint(-10**6, 10**6)),
        ])()

    def intent() -> str:
        return rng.choice([
            lambda: "[" * rng.randint(1, 5000),
            lambda: "{" * rng.randint(1, 3000),
            lambda: json.dumps({"v": 1, "qosClass": "Guaranteed", "cpuManager": "exclusive",
                                "containers": [{"name": "c", "role": "app", "cpu": [2000, 2000],
                                                "memory": [1, 1]}]}),
            lambda: '"' + "\\" * rng.randint(1, 4000),
            lambda: json.dumps([[[[[[1]]]]]]),
            lambda: "x" * rng.randint(0, 100000),
        ])()

    for i in range(count):
        roll = rng.random()
        if roll < 0.3:
            body, kind = _dump(_review(_pod(quantity()))), "quantity"
        elif roll < 0.45:
            body, kind = _dump(_review(_pod("2", intent=intent()))), "intent"
        elif roll < 0.55:
            # a binding (no pod in the cache: judged by the --unjudged rule)
            b = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": f"p{i}", "namespace": "default"},
                 "target": {"apiVersion": "v1", "kind": "Node", "name": rng.choice(["node-a", "nowhere", "", 5])}}
            body, kind = _dump(_review(b, sub="binding")), "binding"
        elif roll < 0.65:
            uid = rng.choice(["\\ud800", "\\udfff\\ud800", "a\\u0000b", "é", "x" * 10000])
            text = _dump(_review(_pod("2"), uid="UIDMARK")).replace(b"UIDMARK", uid.encode())
            body, kind = text, "uid"
        elif roll < 0.75:
            raw = bytearray(_dump(_review(_pod("2"))))
            for _ in range(rng.randint(1, 8)):
                raw[rng.randrange(len(raw))] = rng.randrange(256)
            body, kind = bytes(raw), "byte-flip"
        elif roll < 0.85:
            doc = _review(_pod("2"))
            target = rng.choice(["request", "object", "metadata", "spec", "containers", "annotations"])
            junk = rng.choice([None, 5, "s", [], {}, [None], {"a": {"b": []}}])
            req = doc["request"]
            if target == "request":
                doc["request"] = junk
            elif target == "object":
                req["object"] = junk
            elif target == "metadata":
                req["object"]["metadata"] = junk
            elif target == "spec":
                req["object"]["spec"] = junk
            elif target == "containers":
                req["object"]["spec"]["containers"] = junk
            else:
                req["object"]["metadata"]["annotations"] = junk
            body, kind = _dump(doc), "types"
        elif roll < 0.92:
            depth = rng.randint(100, 200000)
            body, kind = (b'{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":' + b"[" * depth
                          + b"]" * depth + b"}"), "deep-body"
        else:
            body = rng.choice([b"\xff\xfe{}", b'{"a":"\xed\xa0\x80"}', b"\xef\xbb\xbf{}", b"", b"null", b"[]",
                               "{\"k\":\"\u2028\"}".encode(), b"{" * 100])
            kind = "encoding"
        yield Case(kind, rng.choice(["/mutate", "/validate"]), body)


def _loads_deep(text: str) -> Any:
    """``json.loads`` with room for any nesting the webhook's parsers accept (up to about 1000 levels: how deep
    depends on the stack they run on, and the parser process's is shallower than this harness's)."""
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 5000))
    try:
        return json.loads(text)
    finally:
        sys.setrecursionlimit(limit)


def expected_uid(body: bytes) -> str | None:
    """The uid a correct answer echoes: the request's, read strictly (None when the body is not a valid review)."""
    try:
        doc = _loads_deep(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    req = doc.get("request") if isinstance(doc, dict) else None
    uid = req.get("uid") if isinstance(req, dict) else None
    return uid if isinstance(uid, str) else None


def check_answer(case: Case, status: int, body: bytes) -> str | None:
    """What is wrong with the answer to ``case`` (None when nothing is)."""
    if status >= 500:
        return f"{case.kind} {case.path}: HTTP {status}: {body[:200]!r}"
    if status != 200:
        return None if status in (400, 413, 415) else f"{case.kind} {case.path}: unexpected HTTP {status}"
    try:
        answer = json.loads(body.decode("utf-8"))
        response = answer["response"]
    except (UnicodeDecodeError, ValueError, KeyError, TypeError) as e:
        return f"{case.kind} {case.path}: 200 with an unreadable review ({e}): {body[:200]!r}"
    want = expected_uid(case.body)
    if want is None or response.get("uid") != want:
        return f"{case.kind} {case.path}: uid {response.get('uid')!r} answered, request had {want!r}"
    text = json.dumps(response)
    if "internal error" in text:
        return f"{case.kind} {case.path}: answered with an internal error: {text[:300]}"
    if case.must_deny and response.get("allowed") is not False:
        return f"{case.kind} {case.path}: hostile pod not denied (fails open): {text[:300]}"
    return None


async def send_cases(port: int, ctx: ssl.SSLContext, cases: list[Case], concurrency: int = 8
                     ) -> tuple[dict[int, int], list[str]]:
    """Send every case (fresh connection each); returns answers by HTTP status and the problems found."""
    statuses: dict[int, int] = {}
    problems: list[str] = []
    sem = asyncio.Semaphore(concurrency)

    async def one(case: Case) -> None:
        async with sem:
            try:
                status, body = await request(port, ctx, "POST", case.path, case.body, timeout=30)
            except Exception as e:
                problems.append(f"{case.kind} {case.path}: no answer ({type(e).__name__}: {e})")
                return
            statuses[status] = statuses.get(status, 0) + 1
            problem = check_answer(case, status, body)
            if problem:
                problems.append(problem)

    await asyncio.gather(*(one(c) for c in cases))
    return statuses, problems


if __name__ == "__main__" and sys.argv[1:2] == ["probe"]:
    _probe_main(int(sys.argv[2]), sys.argv[3], float(sys.argv[4]), float(sys.argv[5]))
