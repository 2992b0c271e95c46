"""The Feeder: sends requests at their arrival times, at most max_concurrency in flight."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class Feeder:
    """A thread that calls send(request, record) when each request is due.

    A request is due at t0 + arrival_s and, with max_concurrency=C, once fewer than C sent
    requests are unfinished (done(record) frees a slot). record.sent_s is set just before send.
    """

    def __init__(self, requests, records, max_concurrency: int | None, stop: threading.Event):
        self.requests = sorted(requests, key=lambda r: r.arrival_s)
        self.records = records
        self.slots = threading.Semaphore(max_concurrency) if max_concurrency else None
        self.stop = stop
        self.t0 = None
        self.sent = 0
        self.finished = threading.Event()  # every request sent (or the run stopped)
        self._thread = None

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def start(self, send: Callable) -> None:
        self.t0 = time.perf_counter()
        self._thread = threading.Thread(target=self._run, args=(send,), daemon=True)
        self._thread.start()

    def done(self, record) -> None:
        if self.slots is not None:
            self.slots.release()

    def join(self) -> None:
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self, send: Callable) -> None:
        try:
            for req in self.requests:
                if not self._wait_until(req.arrival_s) or not self._take_slot():
                    return
                rec = self.records[req.id]
                rec.sent_s = self.now()
                send(req, rec)
                self.sent += 1
        finally:
            self.finished.set()

    def _wait_until(self, t: float) -> bool:
        while not self.stop.is_set():
            left = t - self.now()
            if left <= 0:
                return True
            self.stop.wait(min(left, 0.05))
        return False

    def _take_slot(self) -> bool:
        if self.slots is None:
            return True
        while not self.stop.is_set():
            if self.slots.acquire(timeout=0.05):
                return True
        return False
