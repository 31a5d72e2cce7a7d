"""Reading an AdmissionReview body: UTF-8 JSON only, parsed without unbounded recursion.

kube-apiserver sends JSON in UTF-8. A body that is not valid UTF-8 (lone surrogates included) is refused with 400
rather than decoded leniently: a lenient decoding would answer with a uid that is not the request's (issue 15), and
the API server never sends one. Nesting deeper than the interpreter's recursion limit makes the (C) JSON parser
stop with RecursionError, refused with 400 as well; no code of the webhook walks the parsed document recursively
except along the few fields it reads.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["BodyError", "decode_body"]


class BodyError(ValueError):
    """The body is not UTF-8 JSON."""


def decode_body(raw: bytes) -> Any:
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
