"""The Serving tab's scenario picker: a failure scenario broken and fixed, its verdict, Stop.

Without a browser: set `.value`, click(), check the figures' data (a tiny random Llama: each run
takes a second or two)."""

from __future__ import annotations

import html

from app_helpers import message, wait_for

from explorer.serving import scenarios
from explorer.serving.scenarios import overload


def test_the_picker_runs_a_scenario_and_draws_broken_beside_fixed(dash):
    tab, parts = dash.tab("serving"), dash.parts
    assert set(parts["scen-name"].options) == set(scenarios.names())
    parts["scen-name"].value = "kv-exhaustion"
    assert scenarios.get("kv-exhaustion").fix in html.unescape(parts["scen-about"].value)
    parts["scen-run"].click()
    assert parts["scen-run"].disabled and parts["serve-run"].disabled
    dash.wait(120)
    assert dash.guard.errors == [], dash.guard.errors
    res = tab.scenario
    assert res is not None and not res.partial and res.verdict in html.unescape(message(dash))
    shown = html.unescape(parts["scen-verdict"].value)
    assert res.verdict in shown and res.why in shown and "measured" in shown
    chart = parts["scen-chart"]
    assert (
        "kv-exhaustion" in chart.layout.title.text and res.verdict[:40] in chart.layout.title.text
    )
    runs = {t.name: t for t in chart.data if t.legendgroup in ("broken", "fixed")}
    broken = [t for t in chart.data if t.name == f"broken: {res.broken.label} (measured)"]
    fixed = [t for t in chart.data if t.name == f"fixed: {res.fixed.label} (measured)"]
    assert len(broken) == len(fixed) == 4, sorted(runs)  # queue, KV, TTFT, ITL
    assert len(broken[2].x) == res.broken.result["completed"]  # one TTFT per served request
    assert len(fixed[2].x) == res.fixed.result["completed"]
    # the evictions, counted by the engine, marked where they happened
    n = res.evidence["broken"]["preemptions"]
    assert n > 0 and res.evidence["fixed"]["preemptions"] == 0
    marks = [t for t in chart.data if t.name == f"broken: preemption ({n})"]
    assert marks and len(marks[0].x) == res.evidence["broken"]["iterations_after_eviction"]
    assert "scenario (broken vs fixed)" in tab.export_figures()
    assert not parts["scen-run"].disabled and parts["scen-stop"].disabled


def test_stop_mid_scenario_keeps_what_finished_marked_partial(dash, monkeypatch):
    from explorer.serving import run

    # a broken run long enough to be stopped in the middle
    sizes = {"input_len": 8, "output_len": 6, "num_prompts": 400, "fixed_prompts": 8}
    monkeypatch.setattr(overload, "LOCAL", {**sizes, "calibration": 8})
    calibration = overload.WARMUP + 8  # the warm-up and the calibration bursts' requests
    records = []

    class Seen(run.RequestRecord):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            records.append(self)

    monkeypatch.setattr(run, "RequestRecord", Seen)
    parts = dash.parts
    parts["scen-name"].value = "overload"
    parts["scen-run"].click()
    # the calibration burst has run and the broken run has served a request
    wait_for(lambda: len(records) > calibration and any(r.ok for r in records[calibration:]), 60)
    assert not parts["scen-stop"].disabled and parts["serve-stop"].disabled
    parts["scen-stop"].click()
    dash.wait(60)
    res = dash.tab("serving").scenario
    assert res.partial and res.fixed is None and res.broken.meta["partial"]
    assert "partial" in html.unescape(parts["scen-verdict"].value)
    assert "partial" in message(dash) and dash.guard.busy is None
    names = {t.name for t in parts["scen-chart"].data}
    assert f"broken: {res.broken.label} (measured, partial)" in names
