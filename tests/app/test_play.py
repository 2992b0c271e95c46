"""Play, Pause and the busy guard: one action at a time.

Without a browser: set `.value`, click(), and check the Session and the figures' data
(fixtures in conftest.py: a tiny random Llama, `dash` over it)."""

from __future__ import annotations

import threading
import time

from app_helpers import message, steps_taken, trace_of, wait_for

from explorer.app import Dashboard


def test_play_and_pause(dash):
    dash.parts["play"].click()
    wait_for(lambda: len(dash.session.steps) >= 3)
    assert dash.guard.busy == "Play"
    assert (
        dash.parts["step"].disabled
        and dash.parts["model"].disabled
        and not dash.parts["pause"].disabled
    )
    dash.parts["pause"].click()
    dash.wait(30)
    assert not dash.player.thread.is_alive()  # Play's thread ended: no step can come after this
    n = len(dash.session.steps)
    assert dash.guard.busy is None
    assert not dash.parts["step"].disabled and dash.parts["pause"].disabled
    assert "paused after" in message(dash) and "tokens/s" in message(dash)
    assert (
        list(dash.strip.fig.data[0].x)[-1] == n - 1 and steps_taken(dash) == n
    )  # every step drawn
    assert len(dash.session.tokens) == n
    assert dash.guard.errors == [], dash.guard.errors


def test_play_is_paced_so_the_page_keeps_up(tiny):
    d = Dashboard(
        lm=tiny, prompt="ab", measure_peaks=False, max_new_tokens=None, play_max_tokens_per_s=20
    )
    t0 = time.perf_counter()
    assert d.play()
    wait_for(lambda: len(d.session.steps) >= 1)
    time.sleep(0.5)  # then a while longer: the pace bounds what it took in all that time
    d.pause()
    d.wait(30)
    elapsed = time.perf_counter() - t0
    assert 1 <= len(d.session.steps) <= 20 * elapsed + 1  # never ahead of the pace
    assert "paced at up to 20/s" in message(d) and d.guard.errors == []


def test_conflicting_actions_are_refused_while_playing(dash):
    original = type(dash.session).step
    gate = threading.Event()

    def slow_step(self):
        gate.wait(5)
        return original(self)

    type(dash.session).step = slow_step
    try:
        assert dash.play()  # its first step waits on the gate, holding the session lock
        assert not dash.play()  # a second Play is refused at once
        dash.parts[
            "step"
        ].click()  # a double click reaches on_click even on a disabled button in tests
        assert "Play is running" in message(dash)
        dash._on_bar_click(
            trace_of(dash.dist.fig, "final"), type("P", (), {"point_inds": [0]})(), None
        )
        assert "Play is running" in message(dash)
        session = dash.session
        dash.parts["reset"].click()
        assert dash.session is session and "Play is running" in message(dash)
        gate.set()
        wait_for(lambda: len(dash.session.steps) >= 3)
        dash.parts[
            "temperature"
        ].value = 0.5  # sampling settings are allowed mid-run: from the next step
        n = len(dash.session.steps)
        wait_for(lambda: len(dash.session.steps) >= n + 2)
    finally:
        gate.set()
        dash.pause()
        dash.wait(30)
        type(dash.session).step = original
    assert dash.session.sampling.temperature == 0.5
    assert dash.session.steps[-1].sampling["temperature"] == 0.5
    assert len(dash.session.tokens) == len(dash.session.steps)  # nothing half-applied


def test_an_error_during_play_stops_it_with_a_message(dash, monkeypatch):
    dash.parts["step"].click()
    original = type(dash.session).step
    calls = {"n": 0}

    def flaky(self):
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("the device went away")
        return original(self)

    monkeypatch.setattr(type(dash.session), "step", flaky)
    dash.parts["play"].click()
    dash.wait(30)
    assert "device went away" in message(dash) and dash.guard.busy is None
    assert len(dash.session.steps) == 3 and list(dash.strip.fig.data[0].x) == [0, 1, 2]
