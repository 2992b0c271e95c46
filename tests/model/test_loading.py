"""Loading: architecture-only shapes, ModelInfo facts, clear errors."""

from __future__ import annotations

import json

import pytest
import torch

from explorer import ModelNotFoundError, available_models, load
from explorer.model.loader import ARCH_DIR, arch_info

# Published sizes of the real checkpoints (their model cards), in parameters.
PUBLISHED = {
    "gpt2": 124.4e6,
    "smollm2-135m": 134.5e6,
    "qwen2.5-0.5b": 494.0e6,
    "llama-3.2-1b": 1235.8e6,
    "llama-3.1-8b": 8030.3e6,
    "llama-2-7b": 6738.4e6,  # model card: 6.74B (Vidur's operator profiles use this shape)
    "llama-3.1-70b": 70.6e9,  # model card: 70.6B
    "llama-3.1-405b": 405.9e9,  # the Hugging Face card: 406B (published runs on 8x MI300X)
    "mistral-7b": 7248.0e6,
    "qwen3-8b": 8.2e9,  # model cards: 8.2B, 14.8B, 32.8B
    "qwen3-14b": 14.8e9,
    "qwen3-32b": 32.8e9,
    "mixtral-8x7b": 46.7e9,  # mixtures of experts (tests/model/test_moe.py checks active counts)
    "qwen3-30b-a3b": 30.5e9,
    "gpt-oss-20b": 20.91e9,  # the gpt-oss model card (arXiv 2508.10925), table 1
}


def test_available_models_lists_bundled_and_every_architecture():
    names = available_models()
    assert names[:2] == ["bundled:target", "bundled:draft"]
    for short in PUBLISHED:
        assert f"arch:{short}" in names
    assert len(list(ARCH_DIR.glob("*.json"))) == len(PUBLISHED)


@pytest.mark.parametrize("short", sorted(PUBLISHED))
def test_arch_info_matches_published_size_without_allocating(short):
    info = arch_info(f"arch:{short}")
    assert info.random_weights and info.source == "arch"
    assert info.parameters == pytest.approx(PUBLISHED[short], rel=0.005)
    assert info.weight_bytes == info.parameters * 4
    assert info.kv_bytes_per_token == 2 * info.layers * info.kv_heads * info.head_dim * 4
    assert info.hub_id


@pytest.mark.parametrize("short", ["gpt2", "smollm2-135m"])
def test_small_architectures_build_and_run(short):
    lm = load(f"arch:{short}")
    info = lm.info
    tensors = {id(p): p for p in lm.model.parameters()}
    assert info.parameters == sum(p.numel() for p in tensors.values())
    assert info.weight_bytes == sum(p.numel() * p.element_size() for p in tensors.values())
    assert info.random_weights is True
    assert info.tied_embeddings is True
    assert torch.isfinite(lm.model.lm_head.weight).all()
    with torch.no_grad():
        out = lm.model(torch.tensor([[1, 2, 3]]))
    assert out.logits.shape == (1, 3, info.vocab_size)
    assert torch.isfinite(out.logits).all()


def test_qwen_shape_builds_with_the_published_configuration():
    lm = load("arch:qwen2.5-0.5b")
    assert lm.info.parameters == arch_info("arch:qwen2.5-0.5b").parameters
    assert lm.info.parameters == sum(p.numel() for p in lm.model.parameters())
    assert lm.info.kv_heads == 2 and lm.info.attention_heads == 14 and lm.info.head_dim == 64
    assert lm.info.random_weights is True
    del lm


def test_untied_model_counts_lm_head_as_non_embedding():
    info = arch_info("arch:llama-3.1-8b")
    assert info.tied_embeddings is False
    emb = info.vocab_size * info.hidden_size
    assert info.non_embedding_parameters == info.parameters - emb


def test_gpt2_position_embeddings_are_not_counted_as_non_embedding():
    info = arch_info("arch:gpt2")
    assert info.non_embedding_parameters == info.parameters - info.vocab_size * 768 - 1024 * 768


def test_bundled_target_info(target):
    info = target.info
    assert info.source == "bundled" and not info.random_weights
    assert info.parameters == sum(p.numel() for p in target.model.parameters())
    assert info.dtype == "float32" and info.device == "cpu"
    json.dumps(info.to_dict())
    ids = target.tokenizer("The return statement")["input_ids"]
    # the bundled tokenizer prepends <|endoftext|>, as every training document starts with it
    assert ids[0] == target.tokenizer.bos_token_id and ids.count(ids[0]) == 1
    assert target.tokenizer.decode(ids[1:]) == "The return statement"


@pytest.mark.parametrize(
    "name", ["bundled:nope", "arch:gpt-99", "no-such-org/no-such-model-xyz", "./missing/folder"]
)
def test_unknown_model_gives_one_clear_error(name):
    with pytest.raises(ModelNotFoundError) as err:
        load(name)
    text = str(err.value)
    assert name in text or name.split(":", 1)[1] in text
    assert "bundled:target" in text  # it says what works offline


def test_hub_error_mentions_offline_switch():
    with pytest.raises(ModelNotFoundError, match="HF_HUB_OFFLINE=0"):
        load("no-such-org/no-such-model-xyz")


def test_folder_without_config_is_explained(tmp_path):
    with pytest.raises(ModelNotFoundError, match="config.json"):
        load(str(tmp_path))


def test_bad_dtype_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown dtype"):
        load("arch:gpt2", dtype="float8")


def test_a_local_model_too_big_for_memory_is_refused_before_its_weights_are_read(
    tmp_path, monkeypatch
):
    """A folder with a config and no weights: the refusal comes from the config alone (a load
    that read on would fail on the missing files instead)."""
    from explorer.app import models as app_models
    from explorer.model import device as device_module
    from explorer.model.memory import NotEnoughMemory

    config = json.loads((ARCH_DIR / "gpt2.json").read_text())
    config.pop("_explorer", None)
    (tmp_path / "config.json").write_text(json.dumps(config))
    monkeypatch.setattr(device_module, "available_bytes", lambda device: 50 * 2**20)
    with pytest.raises(NotEnoughMemory) as err:
        load(str(tmp_path))
    need = arch_info("arch:gpt2").weight_bytes
    assert f"the weights of {tmp_path} (float32)" in str(err.value)
    assert f"{need / 2**20:.0f} MiB needed (modelled)" in str(err.value)
    assert "50 MiB available" in str(err.value)
    with pytest.raises(MemoryError, match="still loaded; choose a smaller one"):
        app_models.check_fits(str(tmp_path))  # the dashboard says it in its own words
    monkeypatch.setattr(device_module, "available_bytes", lambda device: 64 * 2**30)
    with pytest.raises((OSError, ValueError)) as err:  # room enough: on to the missing weights
        load(str(tmp_path))
    assert not isinstance(err.value, NotEnoughMemory)
