"""Reading an AdmissionReview body: UTF-8 JSON only, parsed without unbounded recursion, large bodies off the loop.

kube-apiserver sends JSON in UTF-8. A body that is not valid UTF-8 (lone surrogates included) is refused with 400
rather than decoded leniently: a lenient decoding would answer with a uid that is not the request's (issue 15), and
the API server never sends one. Nesting deeper than the interpreter's recursion limit makes the (C) JSON parser
stop with RecursionError, refused with 400 as well; no code of the webhook walks the parsed document recursively
except along the few fields it reads.

Two parsers, one set of rules (perf, issue 13): msgspec's decoder reads every body first (two to four times faster
than the standard library's on large bodies, exact integers, strict UTF-8, the last of duplicate keys wins as in
the standard library); a body it refuses is read again by the standard library's, whose answer (a document, or the
400 and its reason) is the one given, so the rules above stay exactly the standard library's.

The parsed review is cut down at once to what the decisions read (``slim.slim_review``); a review of the usual
shape is decoded straight into that slim review (``slim_decode``: one C pass skipping what is dropped, perf issue
37). A body larger than ``LARGE_BODY_BYTES`` is parsed and cut down in a parser process (``BodyParser``): the event
loop only hands it the bytes and takes back the slim review, so a 6.5 MiB review (object and oldObject of a 3 MiB
pod) costs the loop about a millisecond instead of the whole parse (tens of milliseconds to a third of a second here).
"""

from __future__ import annotations

import asyncio
import json
import logging
import pickle
import sys
from typing import Any, BinaryIO

import msgspec

from webhook.admission.slim import slim_review
from webhook.https.json_bounds import check_bounds
from webhook.https.slim_decode import decode_slim

__all__ = ["LARGE_BODY_BYTES", "BodyError", "BodyParser", "ParserUnavailable", "decode_body", "parse_slim",
           "parse_slim_general"]

log = logging.getLogger("numapin.webhook.body")

# bodies up to this size are parsed on the event loop (well under a millisecond here); larger ones in the parser
# process. A pod review as the API server sends it is 5-50 KiB.
LARGE_BODY_BYTES = 128 * 1024

# the loop copies a body into the parser's pipe this many bytes at a time
_SLICE = 256 * 1024

_decoder = msgspec.json.Decoder()


class BodyError(ValueError):
    """The body is not UTF-8 JSON."""


class ParserUnavailable(Exception):
    """The parser process died (a new one starts for the next body)."""


def _standard(raw: bytes) -> Any:
    try:
        text = raw.decode("utf-8")  # strict: invalid sequences and encoded surrogates are errors
    except UnicodeDecodeError as e:
        raise BodyError(f"body is not valid UTF-8 (byte {e.start}: {e.reason})") from None
    if text.startswith("\ufeff"):
        raise BodyError("body starts with a byte order mark; JSON is sent without one")
    try:
        return json.loads(text)
    except RecursionError:
        raise BodyError("body is not valid JSON: nested too deeply") from None
    except ValueError as e:
        raise BodyError(f"body is not valid JSON: {e}"[:500]) from None


def decode_body(raw: bytes) -> Any:
    """The JSON document of ``raw``; BodyError with the reason when it is not UTF-8 JSON."""
    try:
        return _decoder.decode(raw)
    except (msgspec.DecodeError, UnicodeDecodeError, RecursionError, ValueError):
        return _standard(raw)  # the standard library's answer: the document, or its reason for refusing it


def parse_slim(raw: bytes) -> Any:
    """``decode_body``, ``slim_review``, then the bounds of ``json_bounds`` (BodyError naming the bound crossed): what
    the parser process runs, and the event loop for a small body. A review of the usual shape takes the one-pass
    ``slim_decode`` instead, which gives the same document (a quarter of the time)."""
    fast = decode_slim(raw)
    if fast is not None:
        return fast
    return parse_slim_general(raw)


def parse_slim_general(raw: bytes) -> Any:
    """``parse_slim`` without the one-pass path: every body through ``decode_body``, ``slim_review`` and the bounds."""
    slim = slim_review(decode_body(raw))
    problem = check_bounds(slim)
    if problem is not None:
        raise BodyError(problem)
    return slim


class BodyParser:
    """Parses bodies: small ones on the event loop, those over ``large`` bytes in a parser process (``python -m
    webhook.https.parser_process``: one, bodies take turns). The process starts with ``start``, and again after it dies.

    The exchange is a length-prefixed body in, a length-prefixed pickle of ``("ok", slim review)`` or
    ``("error", reason)`` out, over the process's stdin and stdout. The body goes in the pieces it arrived in, in
    slices (the loop copies at most ``_SLICE`` bytes at a time); the answer is the slim review, small whatever the
    body's size."""

    def __init__(self, *, large: int = LARGE_BODY_BYTES) -> None:
        self.large = large
        self._proc: asyncio.subprocess.Process | None = None
        self._lock: asyncio.Lock | None = None
        self.offloaded = 0
        self.restarts = 0

    async def start(self) -> None:
        """Start the parser process (so the first large body does not wait for it)."""
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            await self._ensure()

    async def _ensure(self) -> asyncio.subprocess.Process:
        if self._proc is not None and self._proc.returncode is not None:
            log.error("the body parser process ended (exit status %s); starting a new one", self._proc.returncode)
            self.restarts += 1
            self._proc = None
        if self._proc is None:
            self._proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "webhook.https.parser_process", stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE)
        return self._proc

    async def parse(self, pieces: list[bytes]) -> Any:
        """The slim review of the body made of ``pieces``. BodyError when it is not UTF-8 JSON; ParserUnavailable
        when the parser process died while reading it."""
        size = sum(len(p) for p in pieces)
        if size <= self.large:
            return parse_slim(pieces[0] if len(pieces) == 1 else b"".join(pieces))
        if self._lock is None:
            self._lock = asyncio.Lock()
        self.offloaded += 1
        async with self._lock:
            for attempt in (1, 2):  # a process found dead (killed while idle) is replaced and asked again, once
                try:
                    answer = await self._exchange(await self._ensure(), pieces, size)
                    break
                except BaseException as e:  # died, or this request was cancelled mid-exchange: the stream is lost
                    self._kill()
                    if not isinstance(e, ConnectionError | asyncio.IncompleteReadError):
                        raise
                    log.error("the body parser process died reading a body of %d bytes; starting a new one", size)
                    if attempt == 2:
                        raise ParserUnavailable("the webhook's body parser process died; try again") from None
        kind, value = pickle.loads(answer)  # from our own child: plain JSON values
        if kind != "ok":
            raise BodyError(value)
        return value

    @staticmethod
    async def _exchange(proc: asyncio.subprocess.Process, pieces: list[bytes], size: int) -> bytes:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(size.to_bytes(8, "big"))
        for piece in pieces:
            view = memoryview(piece)
            for at in range(0, len(piece), _SLICE):
                proc.stdin.write(view[at:at + _SLICE])
                await proc.stdin.drain()
        length = int.from_bytes(await proc.stdout.readexactly(8), "big")
        return await proc.stdout.readexactly(length)

    def _kill(self) -> None:
        proc, self._proc = self._proc, None
        self.restarts += 1
        if proc is not None and proc.returncode is None:
            proc.kill()

    async def close(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.returncode is None:
            assert proc.stdin is not None
            proc.stdin.close()  # the process ends at the end of its input
            try:
                await asyncio.wait_for(proc.wait(), 5)
            except TimeoutError:
                proc.kill()
                await proc.wait()


def serve(stdin: BinaryIO, stdout: BinaryIO) -> None:
    """The parser process: read length-prefixed bodies until the end of input, answer each with its slim review."""
    while True:
        head = stdin.read(8)
        if len(head) < 8:
            return
        raw = stdin.read(int.from_bytes(head, "big"))
        answer: tuple[str, Any]
        try:
            answer = ("ok", parse_slim(raw))
        except BodyError as e:
            answer = ("error", str(e))
        except Exception as e:
            answer = ("error", f"body cannot be read: {type(e).__name__}")
        del raw
        try:
            data = pickle.dumps(answer, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as e:
            data = pickle.dumps(("error", f"body cannot be read: {type(e).__name__}"), protocol=pickle.HIGHEST_PROTOCOL)
        stdout.write(len(data).to_bytes(8, "big"))
        stdout.write(data)
        stdout.flush()
