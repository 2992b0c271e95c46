"""A tiny random-weight Qwen3-MoE for the mixture-of-experts tests (sweep, views, what-if)."""

from __future__ import annotations

import torch
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

from explorer.model.loader import LoadedModel, model_info


def tiny_moe(
    experts: int = 16, k: int = 2, *, heads: int = 4, kv_heads: int = 2, name: str = "tiny-moe"
) -> LoadedModel:
    """Two MoE layers of `experts` experts (width 32), top-`k` renormalised, hidden 64, vocab
    512; no tokenizer (fed token ids are random)."""
    config = Qwen3MoeConfig(
        vocab_size=512,
        hidden_size=64,
        moe_intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=16,
        num_experts=experts,
        num_experts_per_tok=k,
        norm_topk_prob=True,
        max_position_embeddings=256,
        pad_token_id=0,
    )
    torch.manual_seed(0)
    model = Qwen3MoeForCausalLM(config).eval()
    info = model_info(model, name=name, source="local", random_weights=True)
    return LoadedModel(model=model, tokenizer=None, info=info)
