"""The dashboard without a browser: set `.value`, click(), and check the Session and every figure's data.

Most tests run on a tiny random Llama built here (no tokenizer, so tokens show as <id>, as with
the arch: shapes); the last ones use the bundled target (tests/conftest.py) for real text.
"""

from __future__ import annotations

import base64
import dataclasses
import html
import json
import re
import threading
import time

import numpy as np
import pytest
import torch

from explorer import plots
from explorer.app import Dashboard
from explorer.app import controls as C
from explorer.app import dashboard as dashboard_module
from explorer.app import models as models_module
from explorer.engine.session import prompt_input
from explorer.engine.trace import Trace
from explorer.model.loader import MODELS_DIR, LoadedModel, model_info

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
HAS_BUNDLED = (MODELS_DIR / "target" / "config.json").exists() and (
    MODELS_DIR / "draft" / "config.json"
).exists()


def tiny_llama(name: str, seed: int, hidden: int = 64, layers: int = 2) -> LoadedModel:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=512,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        eos_token_id=None,
        bos_token_id=None,
        pad_token_id=0,
    )
    model = LlamaForCausalLM(cfg).eval()
    return LoadedModel(
        model=model,
        tokenizer=None,
        info=model_info(model, name=name, source="local", random_weights=True),
    )


@pytest.fixture(scope="module")
def tiny():
    return tiny_llama("tiny", seed=0)


@pytest.fixture(scope="module")
def tiny_draft():
    return tiny_llama("tiny-draft", seed=1, hidden=32, layers=1)


@pytest.fixture
def dash(tiny):
    d = Dashboard(lm=tiny, prompt="Hello there", measure_peaks=False, max_new_tokens=None)
    yield d
    d.pause()
    d.wait(10)


def click_point(fig, trace_name: str, point: int) -> None:
    """Deliver a click the way the browser does: plotly.js -> _js2py_pointsCallback -> trace.on_click."""
    index = next(i for i, t in enumerate(fig.data) if t.name == trace_name)
    trace = fig.data[index]
    fig._js2py_pointsCallback = {
        "event_type": "plotly_click",
        "points": {
            "trace_indexes": [index],
            "point_indexes": [point],
            "xs": [trace.x[point]],
            "ys": [trace.y[point]],
        },
        "device_state": None,
        "selector": None,
    }


def trace_of(fig, name: str):
    return next(t for t in fig.data if t.name == name)


def message(d: Dashboard) -> str:
    return re.sub(r"<[^>]+>", "", d.message.value)


def steps_taken(d: Dashboard) -> int:
    return int(re.search(r"step (\d+)", d.step_count.value).group(1))


# --- structure ---------------------------------------------------------------------------------------------


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
    assert C.CUSTOM_MODEL in dash.parts["model"].options and "model-custom" in dash.parts


def test_displays_as_a_widget_with_current_data(dash):
    dash.parts["step"].click()
    bundle = dash._repr_mimebundle_()
    assert bundle["application/vnd.jupyter.widget-view+json"]["model_id"] == dash.widget.model_id
    synced = dash.strip.fig._widget_data[0]["x"]
    assert list(synced) == [0]  # what a view created now would draw
    assert dash.session.lm.info.name == "tiny"


# --- stepping -----------------------------------------------------------------------------------------------


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
    assert list(trace_of(dash.latency.fig, "prefill").x) == [0]
    assert list(trace_of(dash.latency.fig, "decode").y) == pytest.approx(
        [dash.session.steps[1].latency_s * 1e3]
    )
    assert len(trace_of(dash.traffic.fig, "KV cache").y) == 0  # hidden tab: nothing sent yet
    dash.parts["tabs"].selected_index = 1  # Memory traffic: catches up in one message
    assert list(trace_of(dash.traffic.fig, "KV cache").y) == pytest.approx(
        [s.kv_cache_bytes / 1e6 for s in dash.session.steps]
    )
    assert len(trace_of(dash.traffic.fig, "weights").y) == 2
    dash.parts["tabs"].selected_index = 2
    assert len(trace_of(dash.roofline.fig, "decode").x) == 1
    dash.parts["step"].click()
    assert len(trace_of(dash.roofline.fig, "decode").x) == 2  # the visible tab follows every step
    assert (
        len(trace_of(dash.traffic.fig, "weights").y) == 2
        and len(dash.traffic.buffers["weights"]["y"]) == 3
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
    latency = list(trace_of(dash.latency.fig, "decode").y)
    dash.parts["step"].click()
    assert dash.parts["strip-text"].value != strip_text
    dash.parts["rewind"].click()
    assert list(dash.strip.fig.data[0].x) == strip_x
    assert dash.parts["strip-text"].value == strip_text
    assert list(trace_of(dash.latency.fig, "decode").y) == latency
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


# --- settings -------------------------------------------------------------------------------------------------


def test_invalid_setting_shows_a_message_and_the_next_step_works(dash):
    dash.parts["step"].click()
    before = dash.session.sampling
    dash.parts["top-p"].value = 1.5
    assert "top_p must be a number &gt; 0 and &lt;= 1, got 1.5" in message(dash)
    assert "ie-message-error" in dash.message.value
    assert (
        dash.session.sampling == before and dash.parts["top-p"].value == before.top_p
    )  # control put back
    dash.parts["seed"].value = "abc"
    assert "seed must be a whole number" in message(dash) and dash.parts["seed"].value == ""
    dash.parts["step"].click()
    assert len(dash.session.steps) == 2 and "error" not in dash.message.value


def test_sampling_applies_from_the_next_step(dash):
    dash.parts["step"].click()
    dash.parts["temperature"].value = 0.0
    assert dash.session.sampling.is_greedy and "next step" in message(dash)
    dash.parts["step"].click()
    step = dash.session.steps[-1]
    assert step.draw["u"] is None and step.rank_final == 0
    assert step.sampling["temperature"] == 0.0  # recorded as a mid-run change


def test_prompt_change_starts_a_new_session_and_a_bad_one_keeps_the_old(dash):
    dash.parts["step"].click()
    dash.parts["prompt"].value = "Another prompt"
    assert dash.session.steps == [] and "Another prompt" in dash.parts["strip-text"].value
    dash.parts["step"].click()
    old = dash.session
    dash.parts["prompt"].value = "x" * 300  # 300 bytes > 256 positions
    assert "positions" in message(dash)
    assert dash.session is old and len(old.steps) == 1
    assert dash.parts["prompt"].value == "Another prompt"
    dash.parts["batch"].value = 0
    assert "batch size" in message(dash) and dash.parts["batch"].value == 1
    dash.parts["step"].click()
    assert len(dash.session.steps) == 2


def test_unknown_model_shows_a_message_and_keeps_the_old_session(dash):
    dash.parts["step"].click()
    old = dash.session
    dash.parts["model"].value = C.CUSTOM_MODEL
    assert "Type a hub id" in message(dash) and dash.session is old
    dash.parts["model-custom"].value = "no-such-org/no-such-model-xyz"
    assert "could not load model" in message(dash)
    assert dash.session is old and dash.parts["model"].value == "tiny"
    dash.parts["step"].click()
    assert len(dash.session.steps) == 2


def test_a_model_too_big_for_memory_is_refused(dash, monkeypatch):
    monkeypatch.setattr(models_module, "available_bytes", lambda device: 1 << 30)  # 1 GiB free
    old = dash.session
    dash.parts["model"].value = "arch:qwen2.5-0.5b"
    assert "Out of memory" in message(dash) and "GB" in message(dash)
    assert dash.session is old and dash.parts["model"].value == "tiny"


def test_out_of_memory_during_a_step_gets_its_own_message(dash, monkeypatch):
    dash.parts["step"].click()
    x = list(dash.strip.fig.data[0].x)

    def oom(self):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(type(dash.session), "step", oom)
    dash.parts["step"].click()
    assert message(dash).startswith("Out of memory") and "Nothing was changed" in message(dash)
    assert list(dash.strip.fig.data[0].x) == x and not dash.parts["step"].disabled
    monkeypatch.undo()
    dash.parts["step"].click()
    assert len(dash.session.steps) == 2


def test_cache_toggle_overlays_the_earlier_run(dash):
    for _ in range(3):
        dash.parts["step"].click()
    cached = [s.latency_s * 1e3 for s in dash.session.steps]
    dash.parts["cache"].value = False
    assert dash.session.use_cache is False and dash.session.steps == []
    earlier = dash.latency.fig.data[0]
    assert earlier.name == "earlier run (cache on)" and list(earlier.y) == pytest.approx(cached)
    dash.parts["step"].click()
    dash.parts["step"].click()
    assert (
        dash.session.steps[1].tokens_fed == dash.session.steps[1].context_len
    )  # no cache: the whole sequence
    assert len(trace_of(dash.latency.fig, "decode").x) == 1 and len(dash.latency.fig.data[0].y) == 3
    assert dash.guard.errors == [], dash.guard.errors


def test_batch_and_top_n_controls(dash):
    dash.parts["batch"].value = 3
    dash.parts["top-n"].value = 5
    dash.parts["step"].click()
    s = dash.session
    assert s.batch_size == 3 and len(s.steps[0].row_tokens) == 3
    assert len(trace_of(dash.dist.fig, "final").y) == 5
    assert dash.guard.errors == [], dash.guard.errors


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


def test_tokenizer_less_prompts_take_ids_or_bytes(tiny):
    assert prompt_input(tiny, "5 6, 7") == [5, 6, 7]
    assert prompt_input(tiny, "hé") == list("hé".encode())
    with pytest.raises(ValueError, match="no tokenizer"):
        prompt_input(tiny, "")


# --- play / pause / busy ------------------------------------------------------------------------------------------


def wait_for(cond, timeout: float = 30.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise AssertionError("timed out")
        time.sleep(0.01)


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
    n = len(dash.session.steps)
    time.sleep(0.05)
    assert len(dash.session.steps) == n and dash.guard.busy is None
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
    time.sleep(0.5)
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


# --- export ------------------------------------------------------------------------------------------------------


def decode_link(html: str) -> str:
    data = re.search(r'href="data:[^;]+;base64,([^"]+)"', html).group(1)
    return base64.b64decode(data).decode()


def test_export_trace_and_charts(dash):
    for _ in range(3):
        dash.parts["step"].click()
    dash.parts["export-what"].value = "trace JSON"
    dash.parts["export-button"].click()
    trace = Trace.from_json(decode_link(dash.parts["export-links"].value))
    assert trace.tokens == dash.session.trace.tokens
    dash.parts["export-what"].value = "trace CSV"
    dash.parts["export-button"].click()
    csv = decode_link(dash.parts["export-links"].value)
    assert csv.splitlines()[0].startswith("index,") and len(csv.splitlines()) == 4
    dash.parts["export-what"].value = "chart: latency"
    dash.parts["export-button"].click()
    assert 'download="latency-' in dash.parts["export-links"].value
    page = decode_link(dash.parts["export-links"].value)
    assert "Latency per step" in page and len(page) > 1_000_000
    assert json.loads(dash.export("json"))["steps"][0]["index"] == 0
    with pytest.raises(ValueError):
        dash.export("xml")
    assert dash.guard.errors == [], dash.guard.errors


# --- shared mode ---------------------------------------------------------------------------------------------------


def test_shared_mode_offers_only_the_allow_list(tiny):
    d = Dashboard(
        lm=tiny, shared=True, allowed_models=["tiny", "bundled:draft"], measure_peaks=False
    )
    assert d.shared and "model-custom" not in d.parts
    assert list(d.parts["model"].options) == ["tiny", "bundled:draft"]
    d.run_parts["model"].options = ["tiny", "arch:gpt2"]  # a tampered front end cannot load others
    d.parts["model"].value = "arch:gpt2"
    assert "not offered on this server" in message(d) and d.session.lm is tiny


def test_shared_mode_from_the_environment(tiny, tmp_path, monkeypatch):
    config = tmp_path / "models.json"
    config.write_text(json.dumps({"models": ["tiny", "arch:gpt2"]}))
    monkeypatch.setenv("EXPLORER_SHARED", "1")
    monkeypatch.setenv("EXPLORER_MODELS_CONFIG", str(config))
    d = Dashboard(lm=tiny, measure_peaks=False)
    assert d.shared and d.allowed_models == ["tiny", "arch:gpt2"] and "model-custom" not in d.parts
    monkeypatch.setenv("EXPLORER_SHARED", "0")
    monkeypatch.delenv("EXPLORER_MODELS_CONFIG")
    assert not Dashboard(lm=tiny, measure_peaks=False).shared


# --- measured peaks --------------------------------------------------------------------------------------------------


def test_roofline_and_traffic_show_the_measured_peaks(tiny):
    d = Dashboard(
        lm=tiny, prompt="abc", max_new_tokens=None
    )  # measures peaks on a background thread
    d.parts["step"].click()
    d.parts["step"].click()
    hw = d.session.trace.hardware
    assert hw is not None and hw["method"] == "measured"
    names = [t.name for t in d.roofline.fig.data]
    assert any(n.startswith("this machine (measured") for n in names)
    assert any("modelled: datasheet" in n for n in names)
    assert d.traffic.fig.layout.shapes[0].y0 == pytest.approx(hw["bandwidth_gbps"])
    assert d.traffic.fig.layout.yaxis2.range[1] > hw["bandwidth_gbps"]
    assert "error" not in d.message.value and d._ceilings_shown
    s = d.session.steps[1]
    assert s.achieved_gbps is not None
    d.parts["tabs"].selected_index = 1
    assert trace_of(d.traffic.fig, "achieved GB/s").y[1] == pytest.approx(s.achieved_gbps)
    assert d.guard.errors == [], d.guard.errors


# --- long runs stay cheap ----------------------------------------------------------------------------------------------


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
    assert len(trace_of(d.latency.fig, "decode").x) == 29  # charts keep every step
    assert isinstance(trace_of(d.latency.fig, "decode").y, np.ndarray)  # sent as binary buffers
    assert d.guard.errors == [], d.guard.errors


# --- speculative tab -----------------------------------------------------------------------------------------------------


def _speculative_dashboard(tiny, tiny_draft, k: int):
    """A dashboard over `tiny` whose Speculative tab drafts with `tiny_draft`, k tokens per round."""
    d = Dashboard(lm=tiny, prompt="abcd", measure_peaks=False, max_new_tokens=None)
    d._models["tiny-draft"] = tiny_draft
    spec = d.speculative
    spec.draft.options = [*spec.draft.options, "tiny-draft"]
    spec.draft.value = "tiny-draft"
    spec.k.value = k
    return d, spec


def test_speculative_rounds_fill_the_charts(tiny, tiny_draft):
    d, spec = _speculative_dashboard(tiny, tiny_draft, k=3)
    d.parts["spec-step"].click()
    d.parts["spec-step"].click()
    rounds = spec.session.rounds
    assert len(rounds) == 2
    cells = sum(len(t.x) for t in spec.rounds.fig.data if t.x is not None)
    assert cells == sum(len(r.drafts) + 1 for r in rounds)  # every draft plus the target's token
    assert sum(spec.hist.data[0].y) == 2
    alpha = trace_of(spec.alpha.fig, "running alpha (accepted / tested)").y[-1]
    assert alpha == pytest.approx(spec.session.stats()["alpha"])
    assert "2 rounds" in spec.status.value
    assert d.guard.errors == [], d.guard.errors
    d.parts["spec-k"].value = 0
    d.parts["spec-step"].click()
    assert "k (draft tokens per round)" in message(d) and len(spec.session.rounds) == 2


def test_speculative_benchmark_runs_in_the_background(tiny, tiny_draft):
    d, spec = _speculative_dashboard(tiny, tiny_draft, k=2)
    d.parts["spec-bench"].click()
    assert d.parts["step"].disabled  # conflicting controls are off while it runs
    d.wait(120)
    assert spec.progress.value == 2
    measured = trace_of(spec.speedup, "measured (forward passes)")
    assert list(measured.x) == [1, 2] and all(v > 0 for v in measured.y)
    assert "Benchmark done" in message(d) and not d.parts["step"].disabled
    assert d.guard.errors == [], d.guard.errors


def test_speculative_pair_mismatch_is_a_message(tiny):
    d = Dashboard(lm=tiny, prompt="abcd", measure_peaks=False)
    other = tiny_llama("other", seed=2)
    other.model.resize_token_embeddings(600)
    other.info = model_info(other.model, name="other", source="local", random_weights=True)
    d._models["other"] = other
    d.speculative.draft.options = [*d.speculative.draft.options, "other"]
    d.speculative.draft.value = "other"
    d.parts["spec-step"].click()
    assert "cannot pair" in message(d) and d.speculative.session is None


# --- the bundled target (real text) ----------------------------------------------------------------------------------------


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


# --- sweeps tab -------------------------------------------------------------------------------------------------------------


def test_sweep_runs_in_the_background_and_draws_its_table(dash):
    dash.parts["sweep-repeats"].value = 1
    dash.parts["sweep-cache-sizes"].value = "4"
    dash.parts["sweep-cache-run"].click()
    assert dash.parts["step"].disabled and dash.parts["sweep-batch-run"].disabled
    dash.wait(120)
    df = dash.sweeps.frames["cache"]
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
    dash.sweeps.start("batch")
    dash.wait(120)
    chart = dash.parts["sweep-batch"]
    assert list(trace_of(chart, "total (measured)").x) == [1, 2]
    knee = dash.sweeps.frames["batch"].attrs["knee_batch_modelled"]
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
    dash.sweeps.start("cache")
    dash.wait(120)
    before = list(trace_of(dash.parts["sweep-cache"], "cache on: per step (measured)").y)

    def broken(lm, progress=None, **kw):
        progress(1, 2)
        raise RuntimeError("the sweep broke halfway")

    monkeypatch.setitem(
        sweeps._REGISTRY, "cache", dataclasses.replace(sweeps.get("cache"), run=broken)
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


# --- serving tab ---------------------------------------------------------------------------------


def test_serving_tab_runs_a_workload_and_draws_its_views(dash):
    tab = dash.tab("serving")
    dash.parts["serve-requests"].value = 6
    dash.parts["serve-input"].value = 8
    dash.parts["serve-output"].value = 5
    dash.parts["serve-kv-blocks"].value = 16
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
        ("serve-kv-blocks", 1, "KV budget holds"),
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


def test_serving_tab_stop_keeps_what_finished(dash):
    dash.parts["serve-requests"].value = 40
    dash.parts["serve-arrival"].value = "fixed interval"
    dash.parts["serve-rate"].value = 10.0
    dash.parts["serve-output"].value = 6
    dash.parts["serve-run"].click()
    time.sleep(1.0)
    assert not dash.parts["serve-stop"].disabled
    dash.parts["serve-stop"].click()
    dash.wait(60)
    res = dash.tab("serving").results[-1]
    assert res.meta["status"] == "partial" and 1 <= res.result["completed"] < 40
    assert "partial" in message(dash) and dash.guard.busy is None


# --- why this time? and inside -------------------------------------------------------------------------------------


def show_tab(d: Dashboard, name: str) -> None:
    d.parts["tabs"].selected_index = [t.name for t in d.tab_list].index(name)


def test_why_tab_splits_the_selected_step_profiles_it_and_calibrates(tiny):
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
    d.parts["why-profile-run"].click()
    prof = d.tab("why").profile
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
    from explorer.costs import calibrate

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


def test_inside_tab_lens_attention_and_head_picker(dash, monkeypatch):
    for _ in range(3):
        dash.parts["step"].click()
    show_tab(dash, "inside")
    dash.parts["inside-lens-run"].click()
    lens = dash.tab("inside").lens
    heat = dash.parts["inside-lens"].data[0]
    assert len(lens) == 2 and list(heat.y) == [0, 1]
    assert heat.z[1][0] == pytest.approx(lens[1]["top"][0]["prob"])
    assert "chosen token" in dash.parts["inside-text"].value
    dash.parts["inside-attention-run"].click()
    att = dash.tab("inside").att
    assert att["heads"] == 4 and att["layers"] == 2
    assert len(att["positions"]) == dash.session.steps[-1].context_len
    z = dash.parts["inside-attention"].data[0].z
    assert [sum(row) for row in z] == pytest.approx(
        [1.0, 1.0], abs=1e-4
    )  # mean of rows that sum to 1
    assert ("head 3", 3) in dash.parts["inside-head"].options
    dash.parts["inside-head"].value = 3
    assert list(dash.parts["inside-attention"].data[0].z[0]) == pytest.approx(att["weights"][0][3])
    assert "head 3" in dash.parts["inside-attention"].layout.title.text
    from explorer.inside.hooks import InsideUnavailable

    def unavailable(*a, **k):
        raise InsideUnavailable("logit lens unavailable: no final norm found")

    monkeypatch.setattr(dash.session, "logit_lens", unavailable)
    dash.parts["inside-lens-run"].click()
    assert "no final norm" in message(dash)
    assert dash.parts["inside-lens"].data[0].z[1][0] == pytest.approx(lens[1]["top"][0]["prob"])
    dash.parts["step"].click()
    assert len(dash.session.steps) == 4 and dash.guard.busy is None


def test_regime_map_sweep_takes_both_grids(dash):
    dash.parts["sweep-repeats"].value = 1
    dash.parts["sweep-regime-map-sizes"].value = "1, 2"
    dash.parts["sweep-regime-map-contexts"].value = "8, 16"
    dash.sweeps.start("regime-map")
    assert dash.parts["sweep-regime-map-contexts"].disabled
    dash.wait(120)
    df = dash.sweeps.frames["regime-map"]
    assert sorted(zip(df.batch, df.context_len)) == [(1, 8), (1, 16), (2, 8), (2, 16)]
    cells = sum(
        len(trace_of(dash.parts["sweep-regime-map"], f"{r}-bound (measured)").x)
        for r in ("memory", "compute", "overhead")
    )
    assert cells == 4 and not dash.parts["sweep-regime-map-contexts"].disabled
    dash.parts["sweep-regime-map-contexts"].value = "eight"
    assert not dash.sweeps.start("regime-map") and "context lengths must be whole" in message(dash)


def test_speculative_tab_drafts_by_prompt_lookup(tiny):
    from explorer.app.tabs.speculative import PROMPT_LOOKUP

    d = Dashboard(lm=tiny, prompt="5 6 7 8 5 6 7", measure_peaks=False, max_new_tokens=None)
    spec = d.speculative
    assert PROMPT_LOOKUP in spec.draft.options
    spec.draft.value = PROMPT_LOOKUP
    spec.k.value = 2
    d.parts["spec-step"].click()
    first = spec.session.rounds[0]
    assert first.lookup == {"n": 3, "from": 3, "to": 5} and first.k == 2  # "5 6 7" seen: 8, 5
    assert first.draft_passes == [] and "copied 2 ids from positions 3..4" in spec.status.value
    d.parts["spec-bench"].click()
    assert "prompt lookup has none" in message(d) and d.guard.busy is None
    d.parts["spec-step"].click()
    assert len(spec.session.rounds) == 2 and len(d.guard.errors) == 1  # the refusal only


# --- engine controls: the optimisation ladder's rungs ------------------------------------------------


def test_engine_controls_build_a_session_on_the_rung_and_refuse_what_cannot_run(dash):
    dash.step()
    dash.run_parts["weights"].value = "int8:fbgemm"
    assert "weights changed" in message(dash)
    step = dash.step()
    assert step.weights == "int8:fbgemm" and dash.session.lm.info.weights == "int8:fbgemm"
    before = dash.session
    dash.run_parts["weights"].value = "int4"  # no int4 kernels on CPU
    if dash.session.lm.device.type == "cpu":
        assert "int4" in message(dash) and "not supported" in message(dash)
        assert dash.session is before and dash.run_parts["weights"].value == "int8:fbgemm"
    dash.run_parts["weights"].value = "as loaded"
    dash.run_parts["cache-type"].value = "static"
    assert dash.step().cache_type == "static"
    dash.run_parts["cache"].value = False  # a static cache without a cache: refused, said
    assert "use_cache" in message(dash) and dash.run_parts["cache"].value is True
    assert dash.step().cache_type == "static"


def test_capacity_tab_answers_on_paper_and_keeps_working_after_bad_input(dash):
    tab = dash.tab("capacity")
    dash.parts["cap-model"].value = "arch:llama-3.1-8b"
    dash.parts["cap-chip"].value = "h100"
    dash.parts["cap-gpus"].value = 2
    dash.parts["cap-run"].click()
    assert dash.guard.errors == [], dash.guard.errors
    rows = tab.rows
    assert len(rows) >= 5 and all(r["modelled"] for r in rows)
    answer = html.unescape(dash.parts["cap-answer"].value)
    assert "req/s" in answer and "per million" in answer and "(modelled)" in answer
    assert "H100" in answer and "tensor parallel 2" in answer  # the assumptions beside it
    chart = dash.parts["cap-chart"]
    assert "modelled" in chart.layout.title.text and len(chart.data) == 2
    # bad input: a message, the last curve stays, the next run works
    dash.parts["cap-gpus"].value = 3
    dash.parts["cap-run"].click()
    assert "does not divide" in html.unescape(message(dash))
    assert tab.rows is rows and len(chart.data) == 2
    dash.parts["cap-model"].value = "arch:llama-3.1-70b"
    dash.parts["cap-gpus"].value = 1
    dash.parts["cap-run"].click()
    assert "needs 141" in html.unescape(message(dash))
    dash.parts["cap-gpus"].value = 4
    dash.parts["cap-run"].click()
    assert tab.rows is not rows and tab.rows[0]["tp"] == 4


def test_capacity_tab_compares_with_a_measured_result(dash, tmp_path):
    from explorer.model.loader import arch_info
    from explorer.serving import Workload
    from explorer.serving.simulate import simulate
    from explorer.serving.simulate.whatif import chip_model

    # a result file of the same setup (here made by the simulator itself: the error must be 0)
    info = arch_info("arch:llama-3.1-8b", "bfloat16")
    model, extra = chip_model(info, "h100", 1)
    wl = Workload(40, "poisson", 10.0, input_len=256, output_len=64)
    path = tmp_path / "measured.json"
    simulate(info, wl, "continuous", model, **extra["knobs"]).save(path)
    dash.parts["cap-model"].value = "arch:llama-3.1-8b"
    dash.parts["cap-chip"].value = "h100"
    dash.parts["cap-gpus"].value = 1
    dash.parts["cap-measured"].value = str(path)
    dash.parts["cap-compare"].click()
    table = dash.parts["cap-comparison"].value
    assert "median_tpot_ms" in table and "+0.0%" in table and "n/a" not in table, table
    dash.parts["cap-measured"].value = str(tmp_path / "missing.json")
    dash.parts["cap-compare"].click()
    assert (
        "missing.json" in html.unescape(message(dash))
        and table == dash.parts["cap-comparison"].value
    )
