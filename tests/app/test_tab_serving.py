"""The Serving tab: a workload through an engine, bad settings, Stop.

Without a browser: set `.value`, click(), and check the Session and the figures' data
(fixtures in conftest.py: a tiny random Llama, `dash` over it)."""

from __future__ import annotations

import html

import pytest
from app_helpers import message, wait_for


def test_serving_tab_runs_a_workload_and_draws_its_views(dash):
    tab = dash.tab("serving")
    dash.parts["serve-requests"].value = 6
    dash.parts["serve-input"].value = 8
    dash.parts["serve-output"].value = 5
    dash.parts["serve-num-blocks"].value = 16
    dash.parts["serve-page-size"].value = 16
    dash.parts["serve-run"].click()
    assert dash.parts["step"].disabled and dash.parts["serve-run"].disabled
    dash.wait(120)
    assert dash.guard.errors == [], dash.guard.errors
    res = tab.results[-1]
    assert res.result["completed"] == 6 and "6 of 6 requests" in message(dash)
    gantt = dash.parts["serve-gantt"]
    assert len(gantt.data) > 1 and "Requests over time" in gantt.layout.title.text
    assert (
        any(t.name and "ITL" in t.name for t in dash.parts["serve-itl"].data)
        or dash.parts["serve-itl"].data
    )
    assert len(dash.parts["serve-state"].data) >= 2  # batch and KV blocks per iteration
    assert "Successful requests:" in dash.parts["serve-summary"].value
    assert "serving-continuous-1.json" in dash.parts["serve-summary"].value
    # a second run on another engine: both CDFs are drawn, side by side
    dash.parts["serve-engine"].value = "static"
    dash.parts["serve-run"].click()
    dash.wait(120)
    labels = {t.name for t in dash.parts["serve-cdf"].data}
    assert {"continuous #1 (measured)", "static #2 (measured)"} <= labels
    assert not dash.parts["step"].disabled
    dash.parts["step"].click()
    assert len(dash.session.steps) == 1


@pytest.mark.parametrize(
    "part, value, text",
    [
        ("serve-requests", 0, "num_prompts must be a whole number >= 1"),
        ("serve-slos", "ttft=5", "unknown SLO"),
        ("serve-num-blocks", 1, "KV budget holds"),
        ("serve-output", 400, "context of 256 positions"),
    ],
)
def test_serving_tab_bad_settings_are_messages_and_it_keeps_working(dash, part, value, text):
    dash.parts["serve-requests"].value = 3
    dash.parts["serve-output"].value = 4
    dash.parts["serve-engine"].value = "continuous"
    old = dash.parts[part].value
    dash.parts[part].value = value
    dash.parts["serve-run"].click()
    dash.wait(60)
    assert text in html.unescape(message(dash)), message(dash)
    assert dash.guard.busy is None and not dash.parts["serve-run"].disabled
    dash.parts[part].value = old
    dash.parts["serve-run"].click()
    dash.wait(60)
    assert "3 of 3 requests" in message(dash), message(dash)


def test_serving_tab_stop_keeps_what_finished(dash, monkeypatch):
    from explorer.serving import run

    records = []  # every request's record, as the run creates them

    class Seen(run.RequestRecord):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            records.append(self)

    monkeypatch.setattr(run, "RequestRecord", Seen)
    dash.parts["serve-requests"].value = 40
    dash.parts["serve-arrival"].value = "fixed interval"
    dash.parts["serve-rate"].value = 10.0
    dash.parts["serve-output"].value = 6
    dash.parts["serve-run"].click()
    wait_for(lambda: any(r.ok for r in records), timeout=60)  # one request has finished
    assert not dash.parts["serve-stop"].disabled
    dash.parts["serve-stop"].click()
    dash.wait(60)
    res = dash.tab("serving").results[-1]
    assert res.meta["status"] == "partial" and 1 <= res.result["completed"] < 40
    assert "partial" in message(dash) and dash.guard.busy is None
