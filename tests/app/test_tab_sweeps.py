"""The Sweeps tab: background runs, their charts, failures halfway.

Without a browser: set `.value`, click(), and check the Session and the figures' data
(fixtures in conftest.py: a tiny random Llama, `dash` over it)."""

from __future__ import annotations

import dataclasses

import pytest
from app_helpers import message, trace_of


def test_sweep_runs_in_the_background_and_draws_its_table(dash):
    dash.parts["sweep-repeats"].value = 1
    dash.parts["sweep-cache-sizes"].value = "4"
    dash.parts["sweep-cache-run"].click()
    assert dash.parts["step"].disabled and dash.parts["sweep-batch-run"].disabled
    dash.wait(120)
    df = dash.tab("sweeps").frames["cache"]
    on = trace_of(dash.parts["sweep-cache"], "cache on: per step (measured)")
    off = trace_of(dash.parts["sweep-cache"], "cache off: cumulative (measured)")
    assert list(on.x) == [0, 1, 2, 3] and list(on.y) == pytest.approx(
        (df[df["mode"] == "cache on"]["latency_s_measured"] * 1e3).tolist()
    )
    assert off.y[-1] == pytest.approx(df[df["mode"] == "cache off"]["latency_s_measured"].sum())
    assert dash.parts["sweep-cache-progress"].value == dash.parts["sweep-cache-progress"].max == 2
    assert (
        "finished" in message(dash) and "sweep-cache.csv" in dash.parts["sweep-cache-status"].value
    )
    assert not dash.parts["step"].disabled
    dash.parts["step"].click()
    assert len(dash.session.steps) == 1
    assert dash.guard.errors == [], dash.guard.errors


def test_batch_sweep_marks_the_modelled_knee(dash):
    dash.parts["sweep-repeats"].value = 1
    dash.parts["sweep-batch-sizes"].value = "1, 2"
    dash.tab("sweeps").start("batch")
    dash.wait(120)
    chart = dash.parts["sweep-batch"]
    assert list(trace_of(chart, "total (measured)").x) == [1, 2]
    knee = dash.tab("sweeps").frames["batch"].attrs["knee_batch_modelled"]
    if knee:
        assert len(chart.layout.shapes) == 1 and chart.layout.shapes[0].x0 == knee
        assert f"knee at B = {knee}" in chart.layout.title.text
    else:
        assert not chart.layout.shapes
    assert dash.guard.errors == [], dash.guard.errors


def test_a_sweep_that_fails_halfway_keeps_the_chart(dash, monkeypatch):
    from explorer import sweeps

    dash.parts["sweep-repeats"].value = 1
    dash.parts["sweep-cache-sizes"].value = "3"
    dash.tab("sweeps").start("cache")
    dash.wait(120)
    before = list(trace_of(dash.parts["sweep-cache"], "cache on: per step (measured)").y)

    def broken(lm, progress=None, **kw):
        progress(1, 2)
        raise RuntimeError("the sweep broke halfway")

    monkeypatch.setitem(
        sweeps.SWEEPS.entries, "cache", dataclasses.replace(sweeps.get("cache"), run=broken)
    )
    dash.parts["sweep-cache-run"].click()
    dash.wait(60)
    assert "the sweep broke halfway" in message(dash) and dash.guard.busy is None
    assert list(trace_of(dash.parts["sweep-cache"], "cache on: per step (measured)").y) == before
    dash.parts["sweep-cache-sizes"].value = "four"
    dash.parts["sweep-cache-run"].click()
    assert "whole number" in message(dash) and dash.guard.busy is None
    dash.parts["step"].click()
    assert len(dash.session.steps) == 1


def test_regime_map_sweep_takes_both_grids(dash):
    dash.parts["sweep-repeats"].value = 1
    dash.parts["sweep-regime-map-sizes"].value = "1, 2"
    dash.parts["sweep-regime-map-contexts"].value = "8, 16"
    dash.tab("sweeps").start("regime-map")
    assert dash.parts["sweep-regime-map-contexts"].disabled
    dash.wait(120)
    df = dash.tab("sweeps").frames["regime-map"]
    assert sorted(zip(df.batch, df.context_len)) == [(1, 8), (1, 16), (2, 8), (2, 16)]
    cells = sum(
        len(trace_of(dash.parts["sweep-regime-map"], f"{r}-bound (measured)").x)
        for r in ("memory", "compute", "overhead")
    )
    assert cells == 4 and not dash.parts["sweep-regime-map-contexts"].disabled
    dash.parts["sweep-regime-map-contexts"].value = "eight"
    assert not dash.tab("sweeps").start(
        "regime-map"
    ) and "context lengths must be a whole number" in message(dash)
