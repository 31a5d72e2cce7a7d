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

The parsed review is cut down at once to what the decisions read (``slim.slim_review``). A body larger than
``LARGE_BODY_BYTES`` is parsed and cut down in a parser process (``BodyParser``): the event loop only hands it the
bytes and takes back the slim review, so a 6.5 MiB review (object and oldObject of a 3 MiB pod) costs the loop about
a millisecond instead of the whole parse (tens of milliseconds to a third of a second here).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import multiprocessing
from typing import Any

import msgspec

from .slim import slim_review

__all__ = ["LARGE_BODY_BYTES", "BodyError", "BodyParser", "ParserUnavailable", "decode_body", "parse_slim"]

log = logging.getLogger("numapin.webhook.body")

# bodies up to this size are parsed on the event loop (well under a millisecond here); larger ones in the parser
# process. A pod review as the API server sends it is 5-50 KiB.
LARGE_BODY_BYTES = 128 * 1024

_decoder = msgspec.json.Decoder()


class BodyError(ValueError):
    """The body is not UTF-8 JSON."""


class ParserUnavailable(Exception):
    """The parser process died (it is started again for the next body)."""


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
    """``decode_body`` then ``slim_review``: what the parser process runs."""
    return slim_review(decode_body(raw))


def _ready() -> bool:
    return True


class BodyParser:
    """Parses bodies: small ones on the event loop, those over ``large`` bytes in a parser process (one; bodies
    wait their turn). The process starts with ``start`` and again after it dies."""

    def __init__(self, *, large: int = LARGE_BODY_BYTES) -> None:
        self.large = large
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None
        self.offloaded = 0
        self.restarts = 0

    def _new_pool(self) -> concurrent.futures.ProcessPoolExecutor:
        # spawn, not fork: the webhook has threads (the simulator's workers, the executor's) that fork would copy
        # mid-flight; the parser process imports only this module
        return concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"))

    async def start(self) -> None:
        """Start the parser process (so the first large body does not wait for it)."""
        if self._pool is None:
            self._pool = self._new_pool()
        await asyncio.get_running_loop().run_in_executor(self._pool, _ready)

    async def parse(self, raw: bytes) -> Any:
        """The slim review of ``raw``. BodyError when it is not UTF-8 JSON; ParserUnavailable when the parser
        process died while reading it."""
        if len(raw) <= self.large:
            return parse_slim(raw)
        if self._pool is None:
            self._pool = self._new_pool()
        self.offloaded += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(self._pool, parse_slim, raw)
        except concurrent.futures.process.BrokenProcessPool:
            log.error("the body parser process died reading a body of %d bytes; starting a new one", len(raw))
            pool, self._pool = self._pool, None
            pool.shutdown(wait=False, cancel_futures=True)
            self.restarts += 1
            raise ParserUnavailable("the webhook's body parser process died; try again") from None

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
