"""The bundled offline models in assets/models load, agree with their records, and work.

Everything is loaded from local paths; nothing here may touch the network.
Set ``BUNDLED_MODELS_DIR`` to check another output of scripts/train_bundled.py
(e.g. a ``--quick`` run) instead of assets/models.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

MODELS_DIR = Path(
    os.environ.get("BUNDLED_MODELS_DIR")
    or Path(__file__).resolve().parents[2] / "assets" / "models"
)
NAMES = ("target", "draft")

ROUND_TRIP_TEXTS = [
    "The return statement leaves the current function call.",
    "def f(x):\n    return [y * 2 for y in x]  # comment\n",
    "  leading spaces, trailing spaces  ",
    "tabs\tand\n\nblank lines\r\nand CRLF",
    "unicode: héllo wörld — naïve café, Ελληνικά, 日本語, emoji 🐍✓",
    "",
    "<|endoftext|> is special",
]


@pytest.fixture(scope="module")
def training() -> dict[str, Any]:
    return json.loads((MODELS_DIR / "training.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def samples() -> dict[str, Any]:
    return json.loads((MODELS_DIR / "samples.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def tokenizers() -> dict[str, Any]:
    return {name: AutoTokenizer.from_pretrained(MODELS_DIR / name) for name in NAMES}


@pytest.fixture(scope="module")
def models() -> dict[str, Any]:
    loaded = {}
    for name in NAMES:
        model = AutoModelForCausalLM.from_pretrained(MODELS_DIR / name)
        model.eval()
        loaded[name] = model
    return loaded


def unique_parameters(model: torch.nn.Module) -> int:
    """Parameter count with tied tensors counted once."""
    seen = {p.data_ptr(): p.numel() for p in model.parameters()}
    return sum(seen.values())


def test_folders_are_self_contained() -> None:
    for name in NAMES:
        folder = MODELS_DIR / name
        for file in (
            "config.json",
            "generation_config.json",
            "model.safetensors",
            "tokenizer.json",
            "tokenizer_config.json",
        ):
            assert (folder / file).is_file(), f"{folder / file} missing"


def test_models_are_llama_float32(models: dict[str, Any]) -> None:
    for model in models.values():
        assert model.config.model_type == "llama"
        assert model.dtype == torch.float32
        assert model.config.tie_word_embeddings
        assert model.generation_config.do_sample is False


def test_target_uses_grouped_query_attention(models: dict[str, Any]) -> None:
    config = models["target"].config
    assert config.num_key_value_heads < config.num_attention_heads


def test_draft_is_at_most_a_third_of_target(models: dict[str, Any]) -> None:
    target = unique_parameters(models["target"])
    draft = unique_parameters(models["draft"])
    assert 5_000_000 <= target <= 15_000_000
    assert 3 * draft <= target


def test_shared_vocabulary(tokenizers: dict[str, Any], models: dict[str, Any]) -> None:
    target_vocab = tokenizers["target"].get_vocab()
    assert target_vocab == tokenizers["draft"].get_vocab()
    for name in NAMES:
        assert models[name].config.vocab_size == len(tokenizers[name])


def test_special_tokens(tokenizers: dict[str, Any], models: dict[str, Any]) -> None:
    for name in NAMES:
        tok, config = tokenizers[name], models[name].config
        assert tok.bos_token == tok.eos_token == "<|endoftext|>"
        assert tok.pad_token == "<|pad|>"
        assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (
            config.bos_token_id,
            config.eos_token_id,
            config.pad_token_id,
        )
        assert tok("Return a new")["input_ids"][0] == tok.bos_token_id


@pytest.mark.parametrize("text", ROUND_TRIP_TEXTS)
def test_tokenizer_round_trip(tokenizers: dict[str, Any], text: str) -> None:
    tok = tokenizers["target"]
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert tok.decode(ids) == text
    with_bos = tok(text)["input_ids"]
    assert with_bos[1:] == ids or text == "<|endoftext|> is special"
    assert tok.decode(with_bos, skip_special_tokens=True) == text.replace("<|endoftext|>", "")


def test_tokenizer_is_byte_level(tokenizers: dict[str, Any]) -> None:
    tok = tokenizers["target"]
    ids = tok("日本語 🐍", add_special_tokens=False)["input_ids"]
    assert all(0 <= i < len(tok) for i in ids)
    assert tok.unk_token is None


def check_greedy(model: Any, tok: Any, sample: dict[str, Any]) -> None:
    inputs = tok(sample["prompt"], return_tensors="pt")
    assert inputs["input_ids"][0].tolist() == sample["prompt_ids"]
    with torch.no_grad():
        out = model.generate(**inputs, do_sample=False, max_new_tokens=sample["max_new_tokens"])
    new_ids = out[0, inputs["input_ids"].shape[1] :].tolist()
    assert new_ids == sample["new_token_ids"]
    assert tok.decode(new_ids) == sample["text"]


@pytest.mark.parametrize("name", NAMES)
def test_greedy_generate_reproduces_samples(
    models: dict[str, Any], tokenizers: dict[str, Any], samples: dict[str, Any], name: str
) -> None:
    assert samples[name], f"no samples recorded for {name}"
    for sample in samples[name]:
        check_greedy(models[name], tokenizers[name], sample)


def test_training_record_matches_models(training: dict[str, Any], models: dict[str, Any]) -> None:
    vocab = training["tokenizer"]["vocab_size"]
    for name in NAMES:
        record = training["models"][name]
        assert record["parameters"] == unique_parameters(models[name])
        assert record["config"]["num_hidden_layers"] == models[name].config.num_hidden_layers
        assert record["config"]["vocab_size"] == vocab


def test_models_are_trained(training: dict[str, Any]) -> None:
    vocab = training["tokenizer"]["vocab_size"]
    # Uniform guessing gives ln(4096) = 8.3 nats on validation; predicting each token by its training
    # frequency (add-one unigram) 6.6, measured once on this corpus; both models end near 4.1.
    for name in NAMES:
        record = training["models"][name]
        assert record["final_val_perplexity"] < vocab / 40  # loss < 4.6: far below the vocab size
        assert record["final_val_loss"] < record["history"][0]["val_loss"] - 1.5


def test_models_know_their_domain(models: dict[str, Any], tokenizers: dict[str, Any]) -> None:
    """Python-documentation text costs far fewer nats per token than a fairy tale (measured once
    here: about 4 vs 6.3 for both models; uniform guessing is ln(4096) = 8.3)."""
    docs = (
        "Return a new list containing all items from the iterable in ascending order. "
        "The return statement may only occur syntactically nested in a function "
        "definition."
    )
    story = (
        "Once upon a time, a little girl walked into the forest with her grandmother, and "
        "they picked berries until the sun went down."
    )
    for name in NAMES:
        losses = []
        for text in (docs, story):
            inputs = tokenizers[name](text, return_tensors="pt")
            with torch.no_grad():
                losses.append(models[name](**inputs, labels=inputs["input_ids"]).loss.item())
        assert losses[0] < 4.6 and losses[0] + 1.5 < losses[1], (name, losses)


def test_model_card_is_written_from_the_records(
    training: dict[str, Any], samples: dict[str, Any]
) -> None:
    """assets/models/README.md is exactly what the training script writes from its records."""
    import importlib.util
    import sys

    script = Path(__file__).resolve().parents[2] / "scripts" / "train_bundled.py"
    spec = importlib.util.spec_from_file_location("train_bundled", script)
    module = importlib.util.module_from_spec(spec)
    sys.modules["train_bundled"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    card = (MODELS_DIR / "README.md").read_text(encoding="utf-8")
    assert card == module.model_card(training, samples)
    assert f"**{training['models']['target']['final_val_loss']:.3f}**" in card
