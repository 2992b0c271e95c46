"""What a class meets first: waits that say what is happening, runs that say why they stopped, no
stale state from an earlier session, figures that draw what they hold (no browser; see
tests/test_browser.py for what the page shows)."""

from __future__ import annotations

import html
import math
import re

import numpy as np
import pytest

from explorer import plots
from explorer.app import Dashboard, controls
from explorer.app import models as models_module
from explorer.engine.sampling import Sampling
from explorer.engine.settings import specs
from explorer.model.loader import LoadedModel, model_info


def _tiny(name: str) -> LoadedModel:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=300, n_embd=32, n_layer=1, n_head=2, n_positions=64)
    model = GPT2LMHeadModel(cfg).eval()
    info = model_info(model, name=name, source="local", random_weights=True)
    return LoadedModel(model=model, tokenizer=None, info=info)


@pytest.fixture(scope="module")
def small():
    return _tiny("small")


@pytest.fixture
def dash(small):
    d = Dashboard(lm=small, prompt="ab", measure_peaks=False, max_new_tokens=None)
    yield d
    d.pause()
    d.wait(10)


def text(d: Dashboard) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", d.message.value))


def test_a_model_switch_turns_step_and_play_off_and_says_so_until_ready(dash, monkeypatch):
    seen = {}
    other = _tiny("other")

    def slow_load(name):  # what the page shows while the model loads
        seen["disabled"] = {n: dash.parts[n].disabled for n in ("step", "play", "rewind", "model")}
        seen["message"] = text(dash)
        return other

    monkeypatch.setattr(models_module, "load", slow_load)
    monkeypatch.setattr(models_module, "check_fits", lambda name: None)
    dash.parts["model-custom"].value = "some/hub-id"  # typed: the dropdown says "other" by itself
    assert dash.parts["model"].value == controls.CUSTOM_MODEL
    assert seen["disabled"] == {"step": True, "play": True, "rewind": True, "model": True}
    assert "Loading some/hub-id" in seen["message"] and "Step and Play come back" in seen["message"]
    assert dash.session.lm is other and dash.guard.busy is None
    assert not dash.parts["step"].disabled and not dash.parts["play"].disabled
    assert dash.models.load_s["some/hub-id"] >= 0  # timed: the next switch says about how long


def test_a_random_weight_model_says_its_text_is_noise(dash):
    assert "the text is noise" in dash.parts["noise-note"].value
    assert "Only the costs are real" in text(dash)


def test_the_hint_goes_after_the_first_step_and_a_stop_says_why(small):
    d = Dashboard(lm=small, prompt="ab", measure_peaks=False, max_new_tokens=2)
    assert "Press Step or Play" in text(d)
    d.step()
    assert "Press Step or Play" not in text(d) and text(d).startswith("Stepping:")
    d.step()
    assert "max tokens reached" in text(d) and "raise 'max tokens'" in text(d)
    d.parts["reset"].click()
    assert d.play()
    d.wait(30)
    assert not d.player.thread.is_alive()  # Play stopped by itself (at max tokens), in time
    assert "Play stopped after 2 tokens" in text(d) and "max tokens reached" in text(d)


def test_an_error_goes_when_the_person_moves_to_another_tab(dash):
    dash.guard.call("the capacity run", lambda: 1 / 0)
    assert "division by zero" in text(dash)
    dash.tabs.selected_index = 2
    assert text(dash) == "" and dash.guard.last_error is None


def test_an_empty_distribution_drops_the_last_sessions_token_labels(dash):
    dash.step()
    assert len(dash.dist.fig.layout.xaxis.ticktext) > 0
    dash.parts["reset"].click()
    assert not dash.dist.fig.layout.xaxis.ticktext


def test_every_sampling_setting_has_a_widget_in_the_side_panel(dash):
    side = dash.widget.children[3].children[0]
    shown = set(side.children)
    for field in specs(Sampling):
        assert dash.parts[controls.widget_name(field)] in shown, field


def test_every_tab_has_an_about_line_and_export_offers_every_tabs_charts(dash):
    for page, tab in zip(dash.tabs.children, dash.tab_list):
        assert "ie-tab-about" in page.children[0]._dom_classes and tab.about
        assert page.children[1] is tab.widget
    names = dash.export_figures()
    assert {"token strip", "distribution", "latency", "traffic", "roofline"} <= set(names)
    export = dash.tab("export")
    export.what.value = "chart: roofline"
    assert "roofline" in export.prepare()


def test_capacity_slo_labels_sit_at_their_value_on_the_log_axis():
    rows = [
        dict(
            output_throughput=100.0 * i,
            p99_ttft_ms=40.0 * i,
            p99_tpot_ms=8.0 * i,
            meets_slos=i < 3,
            request_rate=float(i),
            model="m",
            tp=1,
            chip="h100",
        )
        for i in range(1, 5)
    ]
    fig = plots.capacity_figure(rows, {"ttft": 500, "tpot": 50})
    labels = {a.text: a for a in fig.layout.annotations if a.text.startswith("SLO")}
    assert labels["SLO 500 ms"].y == pytest.approx(math.log10(500))  # log10 units, not 10^500
    assert labels["SLO 50 ms"].y == pytest.approx(math.log10(50))
    assert sorted(s.y0 for s in fig.layout.shapes) == [50, 500]  # shapes take data values
    assert fig.layout.yaxis.type == "log" and fig.layout.yaxis.exponentformat == "SI"


def test_labels_that_would_overlap_are_moved_apart():
    from explorer.plots.serving import _label_positions

    # a capacity curve's knee: the last three rates pile up within a few percent on both axes
    xs, ys = [1000, 2200, 3300, 4700, 4720, 4710], [10, 13, 17, 46, 49, 52]
    where = _label_positions(xs, ys)
    assert where[:3] == ["top center"] * 3
    assert set(where[3:]) <= {"middle left", "middle right"}
    assert all(a != b for a, b in zip(where[3:], where[4:]))  # neighbours on opposite sides
    rows = [
        dict(output_throughput=x, p99_ttft_ms=10 * y, p99_tpot_ms=y, meets_slos=True,
             request_rate=float(i), utilization=0.2 * (i + 1))
        for i, (x, y) in enumerate(zip(xs, ys))
    ]  # fmt: skip
    fig = plots.capacity_figure(rows, {"ttft": 500, "tpot": 50})
    for slo in (a for a in fig.layout.annotations if a.text.startswith("SLO")):
        assert slo.x < 0.1 and slo.xanchor == "left"  # at the left end, away from the knee
    att = {
        "layers": 1, "heads": 1, "positions": [0, 1], "tokens": ["<|endoftext|>", "a"],
        "weights": [[[0.5, 0.5]]], "mean": [[0.5, 0.5]], "max": [[0.5, 0.5]], "sink": [0.5],
    }  # fmt: skip
    fig = plots.attention_figure(att)
    assert fig.layout.xaxis.title.standoff > 0 and len(fig.layout.xaxis.ticktext[0]) <= 10


def test_redraw_removes_what_the_new_figure_lacks():
    import plotly.graph_objects as go

    widget = go.FigureWidget(plots.placeholder_figure("Gantt"))
    sent = []  # the relayout messages that go to the browser
    send = widget._send_relayout_msg
    widget._send_relayout_msg = lambda data, **kw: (sent.append(dict(data)), send(data, **kw))
    new = go.Figure(
        go.Scatter(x=np.arange(3), y=np.arange(3)), layout=dict(title="run", xaxis=dict(title="s"))
    )
    plots.redraw(widget, new)
    assert any(m.get("annotations", "kept") is None for m in sent)  # the hint goes from the page
    assert any(m.get("xaxis.visible", "kept") is None for m in sent)  # the hidden axes come back
    assert not widget.layout.annotations and widget.layout.title.text == "run"


def test_a_new_model_shows_no_calibration_progress_of_another(dash, small):
    why, progress = dash.tab("why"), dash.parts["why-calibrate-progress"]
    progress.max, progress.value = 4, 4  # as a finished calibration of another model leaves it
    why.session_changed()
    text = dash.parts["why-calibration-text"].value
    assert progress.value == 0 and "No calibration for this model" in text


def test_the_runner_says_how_far_a_failed_run_came_and_marks_a_stopped_one_partial():
    import threading
    from types import SimpleNamespace

    import ipywidgets as W

    from explorer.app.guard import Guard
    from explorer.app.runner import Runner

    message, box = W.HTML(), W.Text()
    tab = SimpleNamespace(runners=[], dash=SimpleNamespace())
    guard = Guard(
        message, on_finish=lambda: [r.set_busy(guard.busy is not None) for r in tab.runners]
    )
    tab.dash.guard = guard
    stop = controls.stop_button("t-stop", "stop it")
    runner = Runner(
        tab, "The test run", controls=[box], stop=stop, progress=W.IntProgress(), unit="cells"
    )
    started = threading.Event()

    def fails():
        runner.tick(1, 3)
        raise RuntimeError("cell 2 broke")

    assert runner.start("Running…", fails)
    runner.thread.join(10)
    assert "The test run (after 1 of 3 cells) failed: RuntimeError: cell 2 broke" in message.value
    assert guard.busy is None and not box.disabled and stop.disabled
    assert runner.progress.value == 1 and runner.progress.max == 3

    def until_stopped():
        started.set()
        assert runner.stop_event.wait(10)
        runner.finished("2 cells kept")

    assert runner.start("Running…", until_stopped, doing="The second run")
    assert started.wait(10) and box.disabled and not stop.disabled  # Stop is on while it runs
    assert not Runner(tab, "Another").start("x", fails)  # one run at a time: refused
    assert "The second run is already running" in message.value
    stop.click()
    runner.thread.join(10)
    assert "2 cells kept (partial: stopped, what finished is kept)" in message.value
    assert "ie-message-info" in message.value and guard.busy is None and not box.disabled
