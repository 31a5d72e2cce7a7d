"""Issue 25: no body kills or stalls the parser. Nesting, numbers and strings of what a review carries into the
decisions are bounded (webhook/https/json_bounds.py) before anything can fail on them; a body over a bound gets a
400 naming it; the parser process (a real subprocess here) survives nesting at every depth up to the size limit."""

from __future__ import annotations

import pytest

from tests.webhook.helpers import Client
from tests.webhook.hostile import NEST_DEPTHS, NEST_PLACES, _dump, _pod, _review, nested_review
from webhook.https.json_bounds import MAX_DEPTH, MAX_STRING_BYTES, check_bounds
from webhook.https.request_body import LARGE_BODY_BYTES, BodyError, BodyParser, parse_slim
from webhook.https.server import DEFAULT_MAX_BODY


def nest(depth: int) -> object:
    value: object = 1
    for _ in range(depth):
        value = [value]
    return value


def test_each_bound_is_named_with_where_it_was_crossed() -> None:
    assert check_bounds({"a": nest(MAX_DEPTH - 1)}) is None
    problem = check_bounds({"a": nest(MAX_DEPTH)})
    assert problem is not None and problem.startswith("bound exceeded: nesting") and f"{MAX_DEPTH} levels" in problem
    assert "at a[0][0]" in problem
    assert check_bounds({"n": 10 ** 4000, "m": -(2 ** 63)}) is None  # integers: the parser bounds their digits
    assert "numbers: f is inf" in (check_bounds({"f": float("inf")}) or "")
    assert "not a finite number" in (check_bounds({"f": float("nan")}) or "")
    assert "strings: s is longer than" in (check_bounds({"s": "x" * (MAX_STRING_BYTES + 1)}) or "")
    assert "lone surrogate" in (check_bounds({"u": "a\ud800"}) or "")
    assert "a key of the document" in (check_bounds({"\udfff": 1}) or "")
    assert check_bounds({"é": "ü", "t": True, "n": None, "f": 0.5}) is None


def test_parse_refuses_a_review_over_a_bound_with_the_bound() -> None:
    with pytest.raises(BodyError, match=r"bound exceeded: nesting: .* \(at request\.resource\.group"):
        parse_slim(nested_review(800))
    with pytest.raises(BodyError, match="lone surrogate"):
        parse_slim(_dump(_review(_pod("2"), uid="UID")).replace(b'"UID"', b'"\\ud800"'))
    with pytest.raises(BodyError, match="4300 digits"):  # the parser's own bound
        parse_slim(_dump(_review(_pod("DIGITS"))).replace(b'"DIGITS"', b"1" * 4301))
    with pytest.raises(BodyError, match="not a finite number"):  # Python writes Infinity; JSON has none
        parse_slim(_dump(_review(_pod(float("inf")))))
    # what the slim review drops is never read: a deep volume list is no bound's business (the parsers refuse
    # what they cannot read themselves)
    assert parse_slim(nested_review(500, "volumes"))["request"]["uid"]


async def test_the_parser_process_survives_nesting_at_every_depth_up_to_the_size_limit() -> None:
    parser = BodyParser(large=0)  # every body to the parser process, whatever its size
    await parser.start()
    try:
        proc = parser._proc
        assert proc is not None
        # every depth to past the parsers' own limit, arrays and objects, where issue 25 found it
        bodies = [nested_review(d) for d in range(1, 1101)] + [nested_review(d, brace="{") for d in range(1, 1101, 5)]
        # every place (kept by the slim review or dropped) at the depths around each bound
        bodies += [nested_review(d, p, brace=b) for d in NEST_DEPTHS for p in NEST_PLACES for b in "[{"]
        # and up to the size limit
        depth = 2048
        while 2 * depth + 1024 <= DEFAULT_MAX_BODY:
            bodies.append(nested_review(depth))
            depth *= 2
        bodies.append(b"[" * (DEFAULT_MAX_BODY - 1))
        answers: dict[str, int] = {}
        for body in bodies:
            try:
                review = await parser.parse([body])
                assert check_bounds(review) is None
                key = "ok"
            except BodyError as e:
                key = str(e).split(":")[0] if str(e).startswith("bound") else str(e)[:40]
            answers[key] = answers.get(key, 0) + 1
        assert parser._proc is proc and proc.returncode is None and parser.restarts == 0, answers
        assert answers["ok"] >= 2 * (MAX_DEPTH - 2) and answers["bound exceeded"] > 1000, answers
    finally:
        await parser.close()


async def test_the_event_loop_path_refuses_the_same_bodies_the_same_way() -> None:
    parser = BodyParser(large=LARGE_BODY_BYTES)
    for d in NEST_DEPTHS:
        for p in NEST_PLACES:
            body = nested_review(d, p)
            if len(body) > LARGE_BODY_BYTES:
                continue
            try:
                await parser.parse([body])
            except BodyError as e:
                assert str(e).startswith(("bound exceeded: nesting", "body is not valid JSON")), e
    assert parser.offloaded == 0


async def test_a_review_over_a_bound_gets_400_naming_it_and_the_parser_lives_on(client: Client) -> None:
    for pad in (0, 140 * 1024):  # on the event loop, then in the parser process
        for _ in range(3):  # issue 25: two of these made the webhook answer 503 to everyone in flight
            status, text = await client.post("/validate", None, raw=nested_review(800, pad=pad))
            assert status == 400, (status, str(text)[:300])
            assert "bound exceeded: nesting" in text and "request.resource.group" in text
        good = _review(_pod("2", mode="share"))
        if pad:
            good["request"]["object"]["metadata"]["annotations"]["pad"] = "x" * pad
        status, answer = await client.post("/validate", good)
        assert status == 200 and answer["response"]["allowed"] is True, str(answer)[:300]


def test_the_quick_walk_and_the_naming_walk_agree() -> None:
    """Issue 37: ``check_bounds`` walks a review once without naming places and only walks it again, naming the
    place, when something is over a bound; both walks must find the same reviews within bounds."""
    from webhook.https.json_bounds import _first_problem, _within

    long, surrogate = "x" * (MAX_STRING_BYTES + 1), "a\ud800"
    docs: list[object] = [{"a": nest(MAX_DEPTH - 1)}, {"a": nest(MAX_DEPTH)}, nest(MAX_DEPTH), nest(MAX_DEPTH + 1),
                          {"k": {"deep": nest(MAX_DEPTH - 2)}}, {"k": {"deep": nest(MAX_DEPTH - 1)}},
                          [{"a": [{"b": nest(MAX_DEPTH - 4)}]}], [{"a": [{"b": nest(MAX_DEPTH - 3)}]}],
                          {"s": long}, {long: 1}, {"s": [surrogate]}, {surrogate: 1}, {"l": [1, 2.5, None, True]},
                          {"f": [float("inf")]}, {"f": {"g": float("nan")}}, {"é": "ü"}, "x", 1, None, [], {},
                          {"s": "x" * MAX_STRING_BYTES}]
    for doc in docs:
        assert _within(doc) == (_first_problem(doc) is None), repr(doc)[:200]
        assert check_bounds(doc) == _first_problem(doc)
    for doc in ({"t": (1, 2)}, {"b": b"x"}, {"t": ("x" * (MAX_STRING_BYTES + 1),)}):  # not JSON's: the naming walk
        assert not _within(doc) and check_bounds(doc) == _first_problem(doc)
