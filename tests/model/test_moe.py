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


def test_info_gives_the_model_cards_active_count_beside_its_own(capsys):
    """gpt-oss-20b's card says 3.6B active: the count without the input embedding (ours: 4.19B)."""
    from explorer.cli import main

    assert main(["info", "arch:gpt-oss-20b", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert round(out["active_parameters"] / 1e9, 2) == 4.19
    card = out["active_parameters_without_embedding"]
    assert out["active_parameters"] - card == out["vocab_size"] * out["hidden_size"]
    assert round(card / 1e9, 1) == 3.6
    assert main(["info", "arch:gpt-oss-20b"]) == 0
    assert "quote 3.61B, without it" in capsys.readouterr().out


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


# --- the bundled MoE model ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def moe():
    from explorer import load

    return load("bundled:moe")


@pytest.fixture(scope="module")
def records():
    from explorer.model.loader import MODELS_DIR

    def read(name):
        return json.loads((MODELS_DIR / name).read_text(encoding="utf-8"))

    return read("training.json"), read("samples.json")


def test_bundled_moe_loads_through_the_loader(moe, records):
    from explorer import costs
    from explorer.model.loader import MODELS_DIR

    info, record = moe.info, records[0]["models"]["moe"]
    assert (info.source, info.family, info.random_weights) == ("bundled", "qwen3_moe", False)
    assert (info.num_experts, info.experts_per_token, info.moe_layers) == (16, 2, info.layers)
    assert info.parameters == record["parameters"]
    assert info.active_parameters == record["config"]["active_parameters"] < info.parameters / 2
    assert costs.shape_of(info).parameters() == info.parameters
    same = (MODELS_DIR / "moe" / "tokenizer.json").read_bytes()
    assert same == (MODELS_DIR / "target" / "tokenizer.json").read_bytes()  # one tokenizer


def test_bundled_moe_reproduces_its_samples(moe, records):
    import torch

    samples = records[1]["moe"]
    assert samples
    for sample in samples:
        inputs = moe.tokenizer(sample["prompt"], return_tensors="pt")
        assert inputs["input_ids"][0].tolist() == sample["prompt_ids"]
        with torch.no_grad():
            out = moe.model.generate(
                **inputs, do_sample=False, max_new_tokens=sample["max_new_tokens"]
            )
        assert out[0, len(sample["prompt_ids"]) :].tolist() == sample["new_token_ids"]


def test_bundled_moe_is_trained_and_scored_beside_the_target(records):
    models = records[0]["models"]
    moe, target = models["moe"], models["target"]
    assert moe["final_val_loss"] < moe["history"][0]["val_loss"] - 1.0
    assert moe["final_val_loss"] < 6.6  # below a unigram guess on this corpus (test_bundled_models)
    assert moe["seq_len"] == target["seq_len"]  # the same held-out rows score both


def test_bundled_moe_decode_reads_k_experts_per_layer(moe):
    from explorer import Session

    session = Session(moe, "The return statement", max_new_tokens=2, roofline=False)
    session.run()
    decode = session.routing(step=1)["steps"][0]
    assert decode["experts_touched"] == [2] * moe.info.moe_layers
    assert decode["experts_touched_formula"] == 2
