"""The dashboard's shell: its parts, stepping, the strip and distribution, a long run, the default model.

Without a browser: set `.value`, click(), and check the Session and the figures' data
(fixtures in conftest.py: a tiny random Llama, `dash` over it)."""

from __future__ import annotations

import html
import re

import numpy as np
import pytest
from app_helpers import HAS_BUNDLED, click_point, message, steps_taken, trace_of

from explorer import plots
from explorer.app import Dashboard, controls
from explorer.app import dashboard as dashboard_module
from explorer.app import models as models_module

CONTRACT_CLASSES = [
    "model",
    "prompt",
    "temperature",
    "top-k",
    "top-p",
    "min-p",
    "repetition-penalty",
    "seed",
    "greedy",
    "cache",
    "batch",
    "top-n",
    "max-tokens",
    "stop-eos",
    "step",
    "play",
    "pause",
    "rewind",
    "reset",
    "message",
    "strip",
    "dist",
    "latency",
    "traffic",
    "roofline",
    "tabs",
    "sweeps",
    "speculative",
    "serving",
    "export",
    "strip-text",
    "step-count",
]


def test_every_contract_part_exists_with_its_css_class(dash):
    for name in CONTRACT_CLASSES:
        assert name in dash.parts, name
        assert f"ie-{name}" in dash.parts[name]._dom_classes, name
    labels = {
        name: dash.parts[name].description for name in ("step", "play", "pause", "rewind", "reset")
    }
    assert labels == {
        "step": "Step",
        "play": "Play",
        "pause": "Pause",
        "rewind": "Rewind",
        "reset": "Reset",
    }
    for name in ("prompt", "batch", "top-n", "max-tokens", "temperature", "top-p"):
        assert dash.parts[name].continuous_update is False, name
    assert dash.parts["step-count"].value.count("step 0") == 1
    assert (
        "bundled:target" in dash.parts["model"].options
        and "arch:gpt2" in dash.parts["model"].options
    )
    assert controls.CUSTOM_MODEL in dash.parts["model"].options and "model-custom" in dash.parts


def test_displays_as_a_widget_with_current_data(dash):
    dash.parts["step"].click()
    bundle = dash._repr_mimebundle_()
    assert bundle["application/vnd.jupyter.widget-view+json"]["model_id"] == dash.widget.model_id
    synced = dash.strip.fig._widget_data[0]["x"]
    assert list(synced) == [0]  # what a view created now would draw
    assert dash.session.lm.info.name == "tiny"


def test_step_updates_strip_and_distribution(dash):
    dash.parts["step"].click()
    assert len(dash.session.steps) == 1 and steps_taken(dash) == 1
    step = dash.session.steps[0]
    assert step.phase == "prefill"
    strip = dash.strip.fig.data[0]
    assert list(strip.x) == [0] and strip.text[0] == f"<{step.token_id}>"
    final = trace_of(dash.dist.fig, "final")
    assert list(final.y) == pytest.approx([t["final"] for t in step.top])
    assert list(final.customdata) == [t["id"] for t in step.top]
    assert "Step 0" in dash.dist.title.value
    assert 'data-step="0"' in dash.parts["strip-text"].value
    assert "Hello there" in dash.parts["strip-text"].value
    dash.parts["step"].click()
    assert list(dash.strip.fig.data[0].x) == [0, 1]
    assert list(trace_of(dash.parts["latency"], "prefill").x) == [0]
    assert list(trace_of(dash.parts["latency"], "decode").y) == pytest.approx(
        [dash.session.steps[1].latency_s * 1e3]
    )
    assert len(trace_of(dash.parts["traffic"], "KV cache").y) == 0  # hidden tab: nothing sent yet
    dash.parts["tabs"].selected_index = 1  # Memory traffic: catches up in one message
    assert list(trace_of(dash.parts["traffic"], "KV cache").y) == pytest.approx(
        [s.kv_cache_bytes / 1e6 for s in dash.session.steps]
    )
    assert len(trace_of(dash.parts["traffic"], "weights").y) == 2
    dash.parts["tabs"].selected_index = 2
    assert len(trace_of(dash.parts["roofline"], "decode").x) == 1
    dash.parts["step"].click()
    assert (
        len(trace_of(dash.parts["roofline"], "decode").x) == 2
    )  # the visible tab follows every step
    assert (
        len(trace_of(dash.parts["traffic"], "weights").y) == 2
        and len(dash.tab("traffic").chart.buffers["weights"]["y"]) == 3
    )
    assert "Step 2" in dash.dist.title.value
    assert dash.guard.errors == [], dash.guard.errors


def test_strip_click_selects_a_step(dash):
    for _ in range(4):
        dash.parts["step"].click()
    click_point(dash.strip.fig, "tokens", 1)
    assert dash.selected == 1 and dash.parts["inspect"].value == 1
    step1 = dash.session.steps[1]
    assert list(trace_of(dash.dist.fig, "final").customdata) == [t["id"] for t in step1.top]
    assert "Step 1" in dash.dist.title.value
    dash.parts["inspect"].value = 3  # the box does the same for any step
    assert "Step 3" in dash.dist.title.value
    dash.parts["inspect"].value = 99
    assert "does not exist" in message(dash) and "Step 3" in dash.dist.title.value


def test_bar_click_branches_at_the_selected_step(dash):
    for _ in range(4):
        dash.parts["step"].click()
    before = list(dash.session.tokens)
    click_point(dash.strip.fig, "tokens", 2)  # select step 2
    wanted = dash.session.steps[2].top[3]["id"]
    click_point(dash.dist.fig, "final", 3)  # the 4th bar: choose it at step 2
    s = dash.session
    assert len(s.steps) == 3 and s.tokens[:2] == before[:2] and s.tokens[2] == wanted
    assert s.steps[2].forced and s.steps[2].token_id == wanted
    strip = dash.strip.fig.data[0]
    assert list(strip.x) == [0, 1, 2] and list(strip.marker.pattern.shape) == ["", "", "x"]
    assert "Branched at step 2" in message(dash)
    dash.parts["step"].click()  # continues from the branch
    assert len(dash.session.steps) == 4 and dash.session.tokens[2] == wanted
    assert dash.guard.errors == [], dash.guard.errors


def test_branch_failure_leaves_the_session_as_it_was(dash, monkeypatch):
    for _ in range(3):
        dash.parts["step"].click()
    session, tokens = dash.session, list(dash.session.tokens)
    with pytest.raises(ValueError):
        dash.branch(7, 1)
    monkeypatch.setattr(
        type(session), "choose", lambda self, t: (_ for _ in ()).throw(RuntimeError("boom"))
    )
    click_point(dash.dist.fig, "final", 1)
    assert "boom" in message(dash)
    assert (
        dash.session is session and session.tokens == tokens and len(dash.strip.fig.data[0].x) == 3
    )


def test_rewind_restores_the_earlier_strip(dash):
    for _ in range(3):
        dash.parts["step"].click()
    strip_x, strip_text = list(dash.strip.fig.data[0].x), dash.parts["strip-text"].value
    latency = list(trace_of(dash.parts["latency"], "decode").y)
    dash.parts["step"].click()
    assert dash.parts["strip-text"].value != strip_text
    dash.parts["rewind"].click()
    assert list(dash.strip.fig.data[0].x) == strip_x
    assert dash.parts["strip-text"].value == strip_text
    assert list(trace_of(dash.parts["latency"], "decode").y) == latency
    assert len(dash.session.steps) == 3 and steps_taken(dash) == 3
    assert dash.session._cache.get_seq_length() == len(dash.session.trace.prompt_ids) + 3 - 1
    assert dash.guard.errors == [], dash.guard.errors


def test_reset_starts_a_fresh_session(dash):
    dash.parts["step"].click()
    old = dash.session
    dash.parts["reset"].click()
    assert (
        dash.session is not old and dash.session.steps == [] and len(dash.strip.fig.data[0].x) == 0
    )
    assert steps_taken(dash) == 0


def test_max_tokens_stops_and_disables_step(tiny):
    d = Dashboard(lm=tiny, prompt="ab", measure_peaks=False, max_new_tokens=2)
    d.parts["step"].click()
    d.parts["step"].click()
    assert d.session.done and d.parts["step"].disabled and d.parts["play"].disabled
    d.step()
    assert "stopped" in message(d).lower() and len(d.session.steps) == 2
    d.parts["rewind"].click()
    assert not d.parts["step"].disabled


def test_stop_at_eos_toggle_starts_a_session_that_runs_past_eos(tiny):
    d = Dashboard(lm=tiny, prompt="ab", measure_peaks=False, max_new_tokens=None)
    d.parts["step"].click()
    old = d.session
    assert old.stop_at_eos and d.parts["stop-eos"].value
    d.parts["stop-eos"].value = False
    assert d.session is not old and not d.session.stop_at_eos and d.session.steps == []
    assert "stop at end-of-text changed" in message(d)
    d.parts["step"].click()
    assert len(d.session.steps) == 1 and d.guard.errors == []


def test_color_by_entropy(dash):
    for _ in range(3):
        dash.parts["step"].click()
    dash.parts["color-by"].value = "entropy"
    colors = list(dash.strip.fig.data[0].marker.color)
    assert colors == list(
        plots.strip_colors([s.entropy_final for s in dash.session.steps], "entropy")
    )
    assert "entropy" in dash.strip.fig.layout.title.text
    assert dash.strip.fig.layout.coloraxis.colorbar.title.text == "H (nats)"
    assert dash.guard.errors == [], dash.guard.errors


def test_views_stay_bounded_over_a_long_run(tiny):
    d = Dashboard(lm=tiny, prompt="a", measure_peaks=False, max_new_tokens=None)
    d.strip_text.window = 10
    d.strip.keep_last = 12
    for _ in range(30):
        d.step()
    assert len(d.strip.fig.data[0].x) == 12  # the strip chart keeps a window
    assert list(d.strip.fig.data[0].x)[-1] == 29
    assert d.parts["strip-text"].value.count('class="ie-tok"') == 10
    assert "[… 20 earlier tokens]" in d.parts["strip-text"].value
    assert len(trace_of(d.parts["latency"], "decode").x) == 29  # charts keep every step
    assert isinstance(
        trace_of(d.parts["latency"], "decode").y, np.ndarray
    )  # sent as binary buffers
    assert d.guard.errors == [], d.guard.errors


@pytest.mark.skipif(
    not HAS_BUNDLED, reason="bundled models not trained yet (scripts/train_bundled.py)"
)
def test_default_dashboard_runs_the_bundled_target():
    d = Dashboard(prompt="Once upon a time", measure_peaks=False)
    assert d.session.lm.info.name == "bundled:target" and d.session.lm.tokenizer is not None
    for _ in range(5):
        d.parts["step"].click()
    text = html.unescape(
        re.sub(r"<[^>]+>", "", d.parts["strip-text"].value)
    )  # tags off, then entities
    assert text.startswith("Once upon a time") and text.endswith(d.session.text)
    assert not re.search(
        r"<\d+>", d.session.text
    )  # real tokens, not <id> (<|endoftext|> may be drawn)


def test_missing_bundled_models_fall_back_to_an_architecture_shape(tiny, monkeypatch):
    from explorer.model.loader import ModelNotFoundError

    def fake_load(name):
        if name.startswith("bundled:"):
            raise ModelNotFoundError(
                "the bundled model files are missing from assets/models/target"
            )
        return tiny

    monkeypatch.setattr(models_module, "load", fake_load)
    d = Dashboard(measure_peaks=False)
    assert d.run_settings.model == dashboard_module.FALLBACK_MODEL and d.session.lm is tiny
    assert "bundled model files are missing" in message(
        d
    ) and f"Showing {dashboard_module.FALLBACK_MODEL}" in message(d)
    with pytest.raises(ModelNotFoundError):  # a model asked for by name is never swapped silently
        Dashboard(model="bundled:target", measure_peaks=False)
