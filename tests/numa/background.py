"""Jobs run in background threads (``lanes`` at a time, one by default), in the order they were started, their
results waited for by key.

The multi-NUMA boots (tests.numa.boots) run this way so that they overlap the rest of the test session: each boot
keeps one host core busy (single-threaded TCG) while most other tests wait on containerd, sockets and
subprocesses. Two lanes for the boots: the suite's VM work (five boots, about 20 minutes of one core) is longer than
the rest of the suite (about 11 minutes at 45% of one core), so one VM at a time would make the VMs the critical
path; two VMs and the rest together ask about 2.4 cores of a 2-core machine. A job's exception is raised again to
everyone waiting for its result, so a test waiting on a boot fails
with the boot's own error.

``close()`` drops the jobs not begun, sets the ``cancel`` event every job receives (a job should stop soon once it
is set: the harness stops its VM) and waits for the running ones.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Iterable
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor
from typing import Generic, TypeVar

__all__ = ["Background", "Cancelled"]

K = TypeVar("K", bound=Hashable)
T = TypeVar("T")


class Cancelled(RuntimeError):
    """A job dropped or stopped because the background runner was closed."""


class Background(Generic[K, T]):
    def __init__(self, job: Callable[[K, threading.Event], T], name: str = "background", lanes: int = 1) -> None:
        self._job = job
        self._cancel = threading.Event()
        self._pool = ThreadPoolExecutor(max_workers=max(1, lanes), thread_name_prefix=name)
        self._futures: dict[K, Future[T]] = {}
        self._lock = threading.Lock()

    def start(self, keys: Iterable[K]) -> None:
        """Queue a job for each key not yet queued, in this order, behind those queued before."""
        with self._lock:
            for key in keys:
                if key not in self._futures:
                    if self._cancel.is_set():
                        raise Cancelled(f"{key}: the background runner is closed")
                    self._futures[key] = self._pool.submit(self._run, key)

    def result(self, key: K) -> T:
        """The job's result (queued now if it was not), waiting for it; its exception if it raised one."""
        self.start([key])
        try:
            return self._futures[key].result()
        except CancelledError:  # dropped by close() before it began
            raise Cancelled(f"{key}: the background runner was closed before it began") from None

    def started(self) -> list[K]:
        with self._lock:
            return list(self._futures)

    def close(self) -> None:
        """Drop the jobs not begun, tell the running ones to stop, wait for them."""
        with self._lock:
            self._cancel.set()
        self._pool.shutdown(wait=True, cancel_futures=True)

    def _run(self, key: K) -> T:
        if self._cancel.is_set():
            raise Cancelled(f"{key}: the background runner was closed before it began")
        return self._job(key, self._cancel)
