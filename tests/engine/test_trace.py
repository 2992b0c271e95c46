"""Step and Trace as plain data: lossless JSON round trip, one DataFrame row per step, bounded size."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from explorer import Sampling, Session, Step, Trace
from explorer.model.loader import LoadedModel, model_info


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    cfg = LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=300,
        max_position_embeddings=64,
        eos_token_id=None,
    )
    model = LlamaForCausalLM(cfg).eval()
    return LoadedModel(
        model, None, model_info(model, name="tiny", source="arch", random_weights=True)
    )


def rich_trace(lm) -> Trace:
    """A trace with every kind of step: prefill, decode, forced, settings changed mid-run, a stop, costs."""
    s = Session(
        lm,
        [[1, 2, 3], [4, 5]],
        Sampling(seed=0, top_k=20, repetition_penalty=1.1),
        max_new_tokens=6,
    )
    s.run(2)
    s.choose([7, 8])
    s.set_sampling(Sampling(seed=0, top_p=0.8))
    s.run()
    return s.trace


def test_json_round_trip_is_lossless(tiny):
    trace = rich_trace(tiny)
    text = trace.to_json()
    back = Trace.from_json(text)
    assert back == trace  # dataclass equality: every field of every step
    assert back.to_json() == text
    d = json.loads(text)
    assert {
        "prompt",
        "settings",
        "model",
        "steps",
        "device",
        "dtype",
        "hardware",
        "stop_reason",
    } <= set(d)
    assert d["stop_reason"] == "max_new_tokens" and d["steps"][-1]["stop"] == "max_new_tokens"
    assert [st["forced"] for st in d["steps"]] == [False, False, True, False, False, False]
    assert d["steps"][3]["sampling"]["top_p"] == 0.8 and d["steps"][0]["sampling"] is None
    assert d["steps"][0]["row_tokens"] and len(d["steps"][0]["row_tokens"]) == 2
    assert d["prompt"] == ["<1><2><3>", "<4><5>"] and d["settings"]["batch_size"] == 2


def test_floats_survive_json_exactly(tiny):
    trace = rich_trace(tiny)
    back = Trace.from_json(trace.to_json())
    for a, b in zip(trace.steps, back.steps):
        assert a.prob_raw == b.prob_raw and a.latency_s == b.latency_s and a.flops == b.flops
        assert a.top == b.top and a.stages == b.stages and a.draw == b.draw and a.bytes == b.bytes


def test_a_saved_trace_replays_without_a_model(tiny):
    trace = rich_trace(tiny)
    back = Trace.from_json(trace.to_json())
    assert back.tokens == [s.token_id for s in trace.steps]
    assert back.text == "".join(s.token_text for s in trace.steps)
    assert all(isinstance(s, Step) for s in back.steps)
    assert back.model["name"] == "tiny" and back.hardware["bandwidth_gbps"] > 0


def test_to_frame_gives_one_row_per_step(tiny):
    trace = rich_trace(tiny)
    df = trace.to_frame()
    assert isinstance(df, pd.DataFrame) and len(df) == len(trace.steps)
    assert list(df["index"]) == list(range(len(trace.steps)))
    assert list(df["phase"]) == ["prefill"] + ["decode"] * (len(trace.steps) - 1)
    assert {
        "token_id",
        "prob_final",
        "entropy_raw",
        "latency_s",
        "kv_cache_bytes",
        "draw_u",
        "bytes_total",
        "bytes/kv_read",
    } <= set(df.columns)
    first = trace.steps[1]
    assert df.loc[1, "bytes_total"] == pytest.approx(sum(first.bytes.values()))
    assert df.loc[1, "draw_u"] == first.draw["u"] and math.isnan(
        df.loc[2, "draw_u"]
    )  # forced: no draw


def test_unknown_keys_are_ignored_and_old_traces_load():
    d = {
        "index": 0,
        "phase": "prefill",
        "tokens_fed": 3,
        "context_len": 3,
        "token_id": 5,
        "token_text": "a",
        "from_the_future": 1,
    }
    step = Step.from_dict(d)
    assert step.token_id == 5 and step.flops is None and step.sampling is None
    trace = Trace.from_dict(
        {
            "prompt": "x",
            "settings": {},
            "model": {},
            "device": "cpu",
            "dtype": "float32",
            "steps": [d],
        }
    )
    assert trace.steps == [step] and trace.stop_reason is None


def test_step_size_is_bounded_at_top_n_20(tiny):
    s = Session(tiny, [1, 2, 3], Sampling(seed=1), top_n=20)
    for st in s.run(5):
        assert len(st.top) == 20
        assert len(json.dumps(st.to_dict())) < 4096
