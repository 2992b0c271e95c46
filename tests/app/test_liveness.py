"""The liveness banner's heartbeat.

Without a browser: set `.value`, click(), and check the Session and the figures' data
(fixtures in conftest.py: a tiny random Llama, `dash` over it)."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest


class _CountedHalt(threading.Event):
    """The heartbeat's halt event, counting the waits its loop starts: the loop checks for a ping
    (and beats or stays quiet) between two waits, so the n-th wait means n - 1 turns are done."""

    def __init__(self):
        super().__init__()
        self.waits = 0
        self._turned = threading.Condition()

    def wait(self, timeout=None):
        with self._turned:
            self.waits += 1
            self._turned.notify_all()
        return super().wait(timeout)

    def turns_done(self, n: int, timeout: float = 10) -> bool:
        with self._turned:
            return self._turned.wait_for(lambda: self.waits > n, timeout)


def test_liveness_beats_until_closed(monkeypatch):
    from explorer.app.voila import liveness
    from explorer.app.voila.liveness import Liveness

    with pytest.raises(ValueError, match="period_s"):
        Liveness(period_s=5, timeout_s=1)
    assert Liveness()._thread is None  # outside a kernel nobody listens: no thread
    sent = []
    monkeypatch.setattr(Liveness, "send", lambda self, msg: sent.append(msg))
    monkeypatch.setattr(
        liveness, "threading", SimpleNamespace(Event=_CountedHalt, Thread=threading.Thread)
    )
    live = Liveness(period_s=0.02, timeout_s=1, beat=True)
    assert "1 s" in live.text and "reload the page" in live.text
    assert live._halt.turns_done(3)  # three turns of the heartbeat's loop, with no ping yet
    assert sent == []  # no page has pinged: quiet, so a closed tab's kernel can be culled
    live._on_ping(live, {"ping": 1}, [])
    deadline = time.perf_counter() + 5
    while len(sent) < 3 and time.perf_counter() < deadline:
        time.sleep(0.01)
    assert [m["beat"] for m in sent[:3]] == [0, 1, 2]
    live.close()
    live._thread.join(timeout=2)
    assert not live._thread.is_alive()  # the loop has ended: nothing can beat after close
    assert len(sent) == live.beats  # every beat it counted was sent, none after it stopped
