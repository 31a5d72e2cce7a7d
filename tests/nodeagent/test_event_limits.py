"""The Event recorder's memories with a fake clock (nodeagent.serve.event_limits): the per-pod token bucket (a burst
of 25, then one Event per 5 minutes, pods apart), the bounded memory of Events sent; and the recorder's decision
path: ``record`` never waits, and past its bounded queue (or the pod's burst) an Event is dropped and counted by why.
The Events on a real API server: tests/criproxy/test_events_containerd.py."""

from __future__ import annotations

import pytest

from nodeagent.decisions.pod_events import PodEvent, pod_event
from nodeagent.serve.event_limits import Aggregate, Aggregates, SpamFilter
from nodeagent.serve.events import EventRecorder


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_pod_gets_a_burst_of_25_then_one_event_per_5_minutes_and_pods_are_apart() -> None:
    clock = Clock()
    spam = SpamFilter(clock=clock)
    assert [spam.allow("a") for _ in range(26)] == [True] * 25 + [False]
    assert spam.allow("b")  # another pod's bucket is full
    clock.now += 299.0
    assert not spam.allow("a")
    clock.now += 1.0
    assert spam.allow("a") and not spam.allow("a")
    clock.now += 100 * 300.0  # refilled up to the burst, never beyond
    assert [spam.allow("a") for _ in range(26)] == [True] * 25 + [False]


def test_a_spam_filter_refuses_settings_that_let_nothing_through() -> None:
    with pytest.raises(ValueError, match="burst >= 1"):
        SpamFilter(burst=0, clock=Clock())


def test_the_memory_of_sent_events_forgets_the_least_recently_used() -> None:
    sent = Aggregates(size=2)
    key = ("ns", "uid", "Warning", "Refused", "container main: no")
    sent.put(key, Aggregate("p.1", 1, "t"))
    sent.put(("ns", "uid", "Normal", "Pinned", "1"), Aggregate("p.2", 1, "t"))
    assert sent.get(key) == Aggregate("p.1", 1, "t")  # used: kept over the other
    sent.put(("ns", "uid", "Normal", "Pinned", "2"), Aggregate("p.3", 1, "t"))
    assert sent.get(key) is not None and sent.get(("ns", "uid", "Normal", "Pinned", "1")) is None
    sent.forget(key)
    assert sent.get(key) is None


def test_record_drops_past_the_bounded_queue_and_past_the_pods_burst_counting_why() -> None:
    dropped: list[str] = []
    recorder = EventRecorder(None, "node-a", queue_size=3, spam=SpamFilter(burst=4, clock=Clock()),
                             on_dropped=dropped.append, clock=Clock())
    for i in range(3):  # no loop runs the sender: they wait
        recorder.record(pod_event(f"ns/p{i}", f"u{i}", "Normal", "Pinned", "container main"))
    recorder.record(PodEvent("ns", "p0", "u0", "Normal", "Pinned", "again"))
    assert recorder.pending == 3 and dropped == ["queue-full"]
    for _ in range(4):
        recorder.record(PodEvent("ns", "p0", "u0", "Normal", "Pinned", "again"))
    # p0's 4 tokens: 1 queued, 3 dropped as queue-full; then none left
    assert dropped == ["queue-full"] * 3 + ["rate-limited"] * 2


def test_pod_event_splits_the_registry_reference() -> None:
    assert pod_event("kube-system/web-0", "u", "Warning", "Repaired", "m") == \
        PodEvent("kube-system", "web-0", "u", "Warning", "Repaired", "m")
