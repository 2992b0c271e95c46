"""The liveness banner's heartbeat.

Without a browser: set `.value`, click(), and check the Session and the figures' data
(fixtures in conftest.py: a tiny random Llama, `dash` over it)."""

from __future__ import annotations

import time

import pytest


def test_liveness_beats_until_closed(monkeypatch):
    from explorer.app.voila.liveness import Liveness

    with pytest.raises(ValueError, match="period_s"):
        Liveness(period_s=5, timeout_s=1)
    assert Liveness()._thread is None  # outside a kernel nobody listens: no thread
    sent = []
    monkeypatch.setattr(Liveness, "send", lambda self, msg: sent.append(msg))
    live = Liveness(period_s=0.02, timeout_s=1, beat=True)
    assert "1 s" in live.text and "reload the page" in live.text
    time.sleep(0.1)
    assert sent == []  # no page has pinged: quiet, so a closed tab's kernel can be culled
    live._on_ping(live, {"ping": 1}, [])
    deadline = time.perf_counter() + 5
    while len(sent) < 3 and time.perf_counter() < deadline:
        time.sleep(0.01)
    assert [m["beat"] for m in sent[:3]] == [0, 1, 2]
    live.close()
    live._thread.join(timeout=2)
    assert not live._thread.is_alive()
    n = len(sent)
    time.sleep(0.1)
    assert len(sent) == n
