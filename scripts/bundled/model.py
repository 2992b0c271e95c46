"""The models: a Llama (target, draft) or a Qwen3-MoE (moe) built from its spec, and its summary."""

from __future__ import annotations

from typing import Any

import torch
from transformers import (
    GenerationConfig,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
    Qwen3MoeForCausalLM,
)

from scripts.bundled.settings import ModelSpec
from scripts.train_moe import MoeSpec, moe_config


def build_model(
    spec: ModelSpec | MoeSpec, tokenizer: PreTrainedTokenizerFast, seed: int
) -> LlamaForCausalLM | Qwen3MoeForCausalLM:
    """A freshly initialised Llama model following ``spec`` (Qwen3-MoE for a MoeSpec)."""
    ids = {
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }
    if isinstance(spec, MoeSpec):
        config, cls = moe_config(spec, len(tokenizer), ids), Qwen3MoeForCausalLM
    else:
        config = LlamaConfig(
            vocab_size=len(tokenizer),
            hidden_size=spec.hidden_size,
            intermediate_size=spec.intermediate_size,
            num_hidden_layers=spec.num_layers,
            num_attention_heads=spec.num_heads,
            num_key_value_heads=spec.num_kv_heads,
            max_position_embeddings=spec.max_position_embeddings,
            rms_norm_eps=1e-5,
            tie_word_embeddings=True,
            dtype="float32",
            **ids,
        )
        cls = LlamaForCausalLM
    torch.manual_seed(seed)
    model = cls(config)
    model.generation_config = GenerationConfig(**ids, do_sample=False, max_new_tokens=64)
    return model


def count_parameters(model: torch.nn.Module) -> int:
    """Unique parameters (tied embeddings counted once)."""
    return sum(p.numel() for p in model.parameters())


def config_summary(model: LlamaForCausalLM) -> dict[str, Any]:
    """The architecture numbers worth showing in training.json."""
    c = model.config
    return {
        "architecture": "LlamaForCausalLM",
        "vocab_size": c.vocab_size,
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "num_hidden_layers": c.num_hidden_layers,
        "num_attention_heads": c.num_attention_heads,
        "num_key_value_heads": c.num_key_value_heads,
        "head_dim": c.hidden_size // c.num_attention_heads,
        "max_position_embeddings": c.max_position_embeddings,
        "tie_word_embeddings": c.tie_word_embeddings,
        "rope_parameters": dict(c.rope_parameters or {}),
        "rms_norm_eps": c.rms_norm_eps,
        "hidden_act": c.hidden_act,
    }
