"""Helpers for the dashboard tests: a tiny random Llama, reading the message, clicking a point."""

from __future__ import annotations

import re
import time

import torch

from explorer.app import Dashboard
from explorer.model.loader import MODELS_DIR, LoadedModel, model_info

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


def wait_for(cond, timeout: float = 30.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise AssertionError("timed out")
        time.sleep(0.01)


def show_tab(d: Dashboard, name: str) -> None:
    d.parts["tabs"].selected_index = [t.name for t in d.tab_list].index(name)
