"""The "Where does it pay?" tab: trick and axis from the registry, a background run drawn, Stop
keeping the rows so far, bad values as one message.

Without a browser: set `.value`, click(), and check the figures' data (fixtures in conftest.py: a
tiny random Llama, `dash` over it). The trick is kv-cache over two short lengths, one repeat."""

from __future__ import annotations

import html

import pytest
from app_helpers import message, trace_of

from explorer import plots
from explorer.costs import hardware
from explorer.sweeps import pays


@pytest.fixture(autouse=True)
def fixed_peaks(monkeypatch):
    """Peaks given, not measured (the tab's wiring is under test; a peaks run costs seconds)."""
    peaks = hardware.Peaks(
        device="cpu", dtype="float32", bandwidth_gbps=10.0, flops=1e11, method="modelled"
    )
    monkeypatch.setattr(hardware, "measure", lambda *a, **k: peaks)


def _tab(dash):
    return next(t for t in dash.tab_list if t.name == "pays")


def _choose(dash, trick: str, over: str, values: str) -> None:
    dash.parts["pays-trick"].value = trick
    dash.parts["pays-axis"].value = over
    dash.parts["pays-values"].value = values
    dash.parts["pays-repeats"].value = 1


def test_choices_come_from_the_trick_registry_and_bad_values_are_one_message(dash):
    assert [v for _, v in dash.parts["pays-trick"].options] == pays.names()
    dash.parts["pays-trick"].value = "continuous"
    axes = [a.name for a in pays.get_trick("continuous").axes]
    assert [v for _, v in dash.parts["pays-axis"].options] == axes
    assert dash.parts["pays-axis"].value == axes[0]
    # the box holds the axis's name, never its (clipped) help: the status line says the help
    assert [label for label, _ in dash.parts["pays-axis"].options] == axes
    assert html.escape(pays.get_trick("continuous").axes[0].help) in dash.parts["pays-status"].value
    default = pays.get_trick("continuous").axes[0].default
    assert dash.parts["pays-values"].value == ", ".join(f"{v:g}" for v in default)
    # bad values: one message, nothing started
    _choose(dash, "kv-cache", "length", "four")
    assert not _tab(dash).start()
    assert "--values" in message(dash) and "must be a whole number" in message(dash)
    assert dash.guard.busy is None and not dash.parts["pays-run"].disabled
    _choose(dash, "kv-cache", "length", "")
    assert not _tab(dash).start() and "give at least one value" in message(dash)
    _choose(dash, "kv-cache", "length", "8, inf")  # was: nothing happened, no message
    assert not _tab(
        dash
    ).start() and "whole number &gt;= 2 and &lt;= 10,000,000, got &#x27;inf" in message(dash)


def test_a_run_draws_the_speedup_the_crossovers_and_the_why(dash):
    _choose(dash, "kv-cache", "length", "4, 8")
    dash.parts["pays-run"].click()
    assert dash.parts["pays-run"].disabled and not dash.parts["pays-stop"].disabled
    dash.wait(180)
    tab = _tab(dash)
    df = tab.frame
    assert list(df["value"]) == [4, 8] and not df.attrs["partial"]
    chart = dash.parts["pays-chart"]
    measured = trace_of(chart, "speedup (measured)")
    assert list(measured.x) == [4, 8]
    assert list(measured.y) == pytest.approx(list(df["speedup"]))
    assert list(trace_of(chart, "speedup (modelled: cost model)").y) == pytest.approx(
        list(df["predicted_speedup"])
    )
    # the baseline's regime behind each setting: one shaded band per run of equal regimes
    bands = [s for s in chart.layout.shapes if s.type == "rect"]
    assert (
        len(bands) == len({*df["regime"]})
        or len(bands) == df["regime"].ne(df["regime"].shift()).sum()
    )
    assert any(s.type == "line" and s.y0 == 1 == s.y1 for s in chart.layout.shapes)  # the 1x line
    shown = dash.parts["pays-why"].value
    lines = plots.pays_why_lines(df)
    assert lines and all(html.escape(line) in shown for line in lines)
    assert all(any(w in line for w in df["why"]) for line in lines)  # each region: a row's why
    assert dash.parts["pays-progress"].value == dash.parts["pays-progress"].max == 2
    assert "finished" in message(dash) and "pays-kv-cache.csv" in dash.parts["pays-status"].value
    assert not dash.parts["pays-run"].disabled and dash.guard.errors == [], dash.guard.errors


def test_stop_keeps_the_rows_so_far_marked_partial(dash):
    _choose(dash, "kv-cache", "length", "4, 8, 16")
    tab = _tab(dash)
    # Stop as soon as the first setting is measured (the progress moves after each timed repeat)
    dash.parts["pays-progress"].observe(
        lambda ch: tab.stop() if ch["new"] >= 1 else None, names="value"
    )
    assert tab.start()
    dash.wait(180)
    df = tab.frame
    assert list(df["value"]) == [4] and df.attrs["partial"] and df["partial"].all()
    assert "PARTIAL" in dash.parts["pays-status"].value
    assert "PARTIAL" in dash.parts["pays-chart"].layout.title.text
    assert list(trace_of(dash.parts["pays-chart"], "speedup (measured)").x) == [4]
