"""The Why this time? tab: the split, the profile, calibration.

Without a browser: set `.value`, click(), and check the Session and the figures' data
(fixtures in conftest.py: a tiny random Llama, `dash` over it)."""

from __future__ import annotations

import pytest
from app_helpers import message, show_tab, trace_of

from explorer.app import Dashboard


def test_why_tab_splits_the_selected_step_profiles_it_and_calibrates(tiny, monkeypatch):
    from explorer.costs import calibrate

    monkeypatch.setattr(calibrate, "check_quiet", lambda cells: None)  # any load (test_calibrate)
    d = Dashboard(
        lm=tiny, prompt="abc", max_new_tokens=None
    )  # peaks measured: the split needs them
    for _ in range(3):
        d.parts["step"].click()
    show_tab(d, "why")
    split = d.parts["why-split"]
    last = d.session.steps[-1]
    assert sum(t.x[0] for t in split.data) == pytest.approx(last.latency_s * 1e3, rel=1e-9)
    assert (
        f"step {last.index} (decode)" in split.layout.title.text
        and "MBU" in split.layout.title.text
    )
    d.select(0)  # the prefill
    assert sum(t.x[0] for t in d.parts["why-split"].data) == pytest.approx(
        d.session.steps[0].latency_s * 1e3, rel=1e-9
    )
    assert "step 0 (prefill)" in d.parts["why-split"].layout.title.text
    for _ in range(3):  # the profiler attributes most of the wall time (a machine busy with
        d.parts["why-profile-run"].click()  # other work stretches one run's wall: profile again)
        prof = d.tab("why").profile
        if prof["coverage"] >= 0.9:
            break
    assert prof["step"] == 0 and prof["coverage"] >= 0.9
    bars = trace_of(d.parts["why-profile"], "time (measured)")
    assert len(bars.y) >= 3 and "framework/python" in bars.y
    assert "framework/Python" in d.parts["why-profile-text"].value
    assert len(d.parts["why-trust"].data[0].cells.values[0]) >= 1  # the bound vs measured rows
    d.parts["why-calibrate"].click()
    assert d.parts["step"].disabled and d.parts["why-profile-run"].disabled
    d.wait(180)
    assert d.guard.busy is None and not d.parts["why-calibrate"].disabled
    cal = d.tab("why").calibration
    assert cal is not None and cal.models == ["tiny"] and cal.n_heldout >= 1
    assert d.session.trace.calibration == cal.to_dict()
    assert (
        "held-out" in message(d)
        and "Calibration in use for tiny" in d.parts["why-calibration-text"].value
    )
    predictions = d.parts["why-trust"].data[0].cells.values[0]
    assert any("calibrated" in p for p in predictions), predictions
    assert d.guard.errors == [], d.guard.errors
    calibrate.use(None)


def test_why_tab_without_peaks_says_so_and_profile_errors_keep_the_tab(dash, monkeypatch):
    dash.parts["step"].click()
    show_tab(dash, "why")
    assert "no split" in dash.parts["why-split"].layout.title.text
    from explorer.inside.hooks import InsideUnavailable

    def unavailable(*a, **k):
        raise InsideUnavailable("profile unavailable: this model's layers are not where expected")

    monkeypatch.setattr(dash.session, "profile_step", unavailable)
    dash.parts["why-profile-run"].click()
    assert "not where expected" in message(dash)
    monkeypatch.undo()
    dash.parts["why-profile-run"].click()
    assert dash.tab("why").profile["step"] == 0 and "Profiled step 0" in message(dash)
