"""The side panel: model, prompt, sampling and engine settings, shared mode.

Without a browser: set `.value`, click(), and check the Session and the figures' data
(fixtures in conftest.py: a tiny random Llama, `dash` over it)."""

from __future__ import annotations

import json

import pytest
import torch
from app_helpers import message, trace_of

from explorer.app import Dashboard, controls
from explorer.engine.session import prompt_input


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
    dash.parts["model"].value = controls.CUSTOM_MODEL
    assert "Type a hub id" in message(dash) and dash.session is old
    dash.parts["model-custom"].value = "no-such-org/no-such-model-xyz"
    assert "could not load model" in message(dash)
    assert dash.session is old and dash.parts["model"].value == "tiny"
    dash.parts["step"].click()
    assert len(dash.session.steps) == 2


def test_a_model_too_big_for_memory_is_refused(dash, monkeypatch):
    from explorer.model import device as device_module

    monkeypatch.setattr(device_module, "available_bytes", lambda device: 1 << 30)  # 1 GiB free
    old = dash.session
    dash.parts["model"].value = "arch:qwen2.5-0.5b"
    assert "Out of memory" in message(dash) and "GiB needed (modelled)" in message(dash)
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
    earlier = dash.parts["latency"].data[0]
    assert earlier.name == "earlier run (cache on)" and list(earlier.y) == pytest.approx(cached)
    dash.parts["step"].click()
    dash.parts["step"].click()
    assert (
        dash.session.steps[1].tokens_fed == dash.session.steps[1].context_len
    )  # no cache: the whole sequence
    assert (
        len(trace_of(dash.parts["latency"], "decode").x) == 1
        and len(dash.parts["latency"].data[0].y) == 3
    )
    assert dash.guard.errors == [], dash.guard.errors


def test_batch_and_top_n_controls(dash):
    dash.parts["batch"].value = 3
    dash.parts["top-n"].value = 5
    dash.parts["step"].click()
    s = dash.session
    assert s.batch_size == 3 and len(s.steps[0].row_tokens) == 3
    assert len(trace_of(dash.dist.fig, "final").y) == 5
    assert dash.guard.errors == [], dash.guard.errors


def test_tokenizer_less_prompts_take_ids_or_bytes(tiny):
    assert prompt_input(tiny, "5 6, 7") == [5, 6, 7]
    assert prompt_input(tiny, "hé") == list("hé".encode())
    with pytest.raises(ValueError, match="no tokenizer"):
        prompt_input(tiny, "")


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
    dash.run_parts["cache-type"].value = "fp8"  # a quantized KV cache: its bytes counted at fp8
    step = dash.step()
    assert step.cache_type == "fp8" and dash.session.cache_type == "fp8"
    import importlib.util

    if importlib.util.find_spec("optimum") is None:  # the int4 backend's package is missing here
        dash.run_parts["cache-type"].value = "int4:quanto"
        assert "optimum-quanto" in message(dash), message(dash)
        assert dash.step() is not None  # the kernel and the session carry on


def test_shared_mode_offers_only_the_allow_list(tiny):
    d = Dashboard(
        lm=tiny, shared=True, allowed_models=["tiny", "bundled:draft"], measure_peaks=False
    )
    assert d.models.shared and "model-custom" not in d.parts
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
    assert (
        d.models.shared
        and d.models.allowed == ["tiny", "arch:gpt2"]
        and "model-custom" not in d.parts
    )
    monkeypatch.setenv("EXPLORER_SHARED", "0")
    monkeypatch.delenv("EXPLORER_MODELS_CONFIG")
    assert not Dashboard(lm=tiny, measure_peaks=False).models.shared
