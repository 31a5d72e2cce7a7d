"""tests.numa.background, which runs the multi-NUMA boots beside the rest of the session: one job at a time in the
order started, each result (or exception) handed to whoever waits for it, and close() stopping the running job and
dropping the others. Synchronised with events, never with timings (the waits' limits only keep a broken runner
from hanging the suite)."""

from __future__ import annotations

import threading

import pytest

from tests.numa.background import Background, Cancelled

LIMIT = 60.0  # a guard: the events below are set long before


def test_jobs_run_one_at_a_time_in_the_order_started() -> None:
    log: list[str] = []
    running = 0
    most = 0
    lock = threading.Lock()

    def job(key: str, cancel: threading.Event) -> str:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
            log.append(f"begin {key}")
        with lock:
            log.append(f"end {key}")
            running -= 1
        return key.upper()

    jobs: Background[str, str] = Background(job)
    try:
        jobs.start(["b", "a", "b"])
        jobs.start(["c", "a"])
        assert jobs.started() == ["b", "a", "c"]
        assert [jobs.result(k) for k in ("c", "a", "b")] == ["C", "A", "B"]
    finally:
        jobs.close()
    assert log == ["begin b", "end b", "begin a", "end a", "begin c", "end c"]
    assert most == 1


def test_a_result_not_started_is_started_when_asked_for() -> None:
    jobs: Background[int, int] = Background(lambda key, cancel: key * 2)
    try:
        assert jobs.result(21) == 42
        assert jobs.started() == [21]
    finally:
        jobs.close()


def test_a_jobs_exception_reaches_everyone_waiting_for_it() -> None:
    def job(key: str, cancel: threading.Event) -> str:
        if key == "bad":
            raise LookupError("no such VM")
        return key

    jobs: Background[str, str] = Background(job)
    try:
        jobs.start(["bad", "good"])
        for _ in range(2):
            with pytest.raises(LookupError, match="no such VM"):
                jobs.result("bad")
        assert jobs.result("good") == "good"  # the next job ran anyway
    finally:
        jobs.close()


def test_close_stops_the_running_job_and_drops_the_queued_ones() -> None:
    began = threading.Event()
    saw_cancel = threading.Event()
    ran: list[str] = []

    def job(key: str, cancel: threading.Event) -> str:
        ran.append(key)
        began.set()
        if not cancel.wait(LIMIT):
            raise AssertionError("never told to stop")
        saw_cancel.set()
        raise Cancelled(f"{key}: stopped")

    jobs: Background[str, str] = Background(job)
    jobs.start(["long", "queued"])
    assert began.wait(LIMIT)
    jobs.close()  # returns once the running job has stopped
    assert saw_cancel.is_set()
    assert ran == ["long"]
    with pytest.raises(Cancelled, match="long: stopped"):
        jobs.result("long")
    with pytest.raises(Cancelled, match="queued: the background runner was closed"):
        jobs.result("queued")
    with pytest.raises(Cancelled, match="later: the background runner is closed"):
        jobs.result("later")


def test_boots_queue_longest_first_with_the_extra_jobs_after_the_lanes_first_boots() -> None:
    from tests.numa.boots import BOOT_LANES, boot_order
    from tests.numa.shapes import SHAPES

    by_length = sorted(SHAPES, key=lambda n: -SHAPES[n].seconds)
    order = boot_order(reversed(list(SHAPES)), ["systemd-host"])
    assert order == [*by_length[:BOOT_LANES], "systemd-host", *by_length[BOOT_LANES:]]
    assert boot_order(["2s4n"], ["systemd-host"]) == ["2s4n", "systemd-host"]  # fewer shapes than lanes
    assert boot_order([], ["systemd-host"]) == ["systemd-host"]
    assert boot_order(["1s2n-nosmt", "2s4n", "2s4n"]) == ["2s4n", "1s2n-nosmt"]  # each once
