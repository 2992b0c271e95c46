"""Mixture-of-experts shapes: parameter counts against the published ones, dense models stay dense.

Counts come from the architecture-only shapes built on the meta device (nothing allocated).
Published figures (assets/architectures/*.json, "_explorer"):
  Mixtral 8x7B   46.7B total, 12.9B active  (mistral.ai/news/mixtral-of-experts)
  Qwen3-30B-A3B  30.5B total, 3.3B active   (huggingface.co/Qwen/Qwen3-30B-A3B model card)
  gpt-oss-20b    21B total, 3.6B active     (huggingface.co/openai/gpt-oss-20b model card; the
                 gpt-oss model card, arXiv 2508.10925, counts the unembedding but not the embedding)
"""

from __future__ import annotations

import functools
import json

import pytest

from explorer.model.loader import arch_config, arch_info
from explorer.model.moe import experts_touched_expected


@functools.cache
def _info(name: str):
    return arch_info(name)


def _billions(text: str) -> float:
    assert text.endswith("B"), text
    return float(text[:-1]) * 1e9


@pytest.mark.parametrize("name", ["mixtral-8x7b", "qwen3-30b-a3b", "gpt-oss-20b"])
def test_moe_shapes_match_published_parameter_counts(name):
    info = _info(name)
    _, meta = arch_config(name)
    assert info.parameters == pytest.approx(_billions(meta["published_parameters"]), rel=0.02)
    active = info.active_parameters
    if meta.get("published_active_excludes") == "weights/embedding":
        active -= info.vocab_size * info.hidden_size  # the token embedding is a gather, not counted
    assert active == pytest.approx(_billions(meta["published_active_parameters"]), rel=0.02)
    assert info.num_experts and info.experts_per_token < info.num_experts
    assert info.moe_layers == info.layers


def test_moe_facts_of_the_shapes():
    mixtral, qwen, oss = (_info(n) for n in ("mixtral-8x7b", "qwen3-30b-a3b", "gpt-oss-20b"))
    assert (mixtral.num_experts, mixtral.experts_per_token) == (8, 2)
    assert (qwen.num_experts, qwen.experts_per_token, qwen.expert_intermediate_size) == (
        128,
        8,
        768,
    )
    assert (oss.num_experts, oss.experts_per_token, oss.expert_intermediate_size) == (32, 4, 2880)
    assert mixtral.shared_experts == qwen.shared_experts == oss.shared_experts == 0


def test_dense_model_says_dense(tiny_arch):
    info = tiny_arch.info
    assert info.num_experts is None and info.experts_per_token is None
    assert info.moe_layers == 0 and not info.is_moe
    assert info.active_parameters == info.parameters


def test_info_json_prints_active_parameters(capsys):
    from explorer.cli import main

    assert main(["info", "arch:qwen3-30b-a3b", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["active_parameters"] == _info("qwen3-30b-a3b").active_parameters
    assert out["active_parameters"] < out["parameters"] / 5
    assert out["num_experts"] == 128


@pytest.mark.parametrize(
    "experts, k, tokens, expected",
    [
        (8, 2, 0, 0.0),
        (8, 2, 1, 2.0),  # one token reads its k experts
        (8, 2, 2, 8 * (1 - 0.75**2)),  # 3.5
        (16, 2, 4, 16 * (1 - (7 / 8) ** 4)),
        (4, 4, 3, 4.0),  # k = E: every expert, whatever the batch
    ],
)
def test_experts_touched_formula_on_hand_made_numbers(experts, k, tokens, expected):
    assert experts_touched_expected(experts, k, tokens) == pytest.approx(expected)


def test_experts_touched_tends_to_every_expert():
    assert experts_touched_expected(128, 8, 1) == 8
    assert experts_touched_expected(128, 8, 64) == pytest.approx(128 * (1 - (120 / 128) ** 64))
    assert 127 < experts_touched_expected(128, 8, 256) <= 128
