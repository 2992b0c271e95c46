"""The MoE parts of the cost model on tiny random models built here: they add up to the real
parameter counts, FLOPs count the k active experts (FlopCounterMode agrees), bytes the experts touched."""

from __future__ import annotations

import functools
import warnings

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode
from transformers import (
    DynamicCache,
    Qwen2MoeConfig,
    Qwen2MoeForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)

from explorer import costs
from explorer.engine import forward
from explorer.model.loader import model_info

E, K, VOCAB = 6, 2, 128


@functools.cache
def tiny_qwen3_moe():
    config = Qwen3MoeConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=48, moe_intermediate_size=16,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
        num_experts=E, num_experts_per_tok=K, norm_topk_prob=True, max_position_embeddings=64,
    )  # fmt: skip
    torch.manual_seed(0)
    model = Qwen3MoeForCausalLM._from_config(config, experts_implementation="eager").eval()
    return model, model_info(model, name="tiny-qwen3-moe", source="local", random_weights=True)


@functools.cache
def tiny_qwen2_moe():
    """Shared experts, and one dense layer among the routed ones (mlp_only_layers)."""
    config = Qwen2MoeConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=48, moe_intermediate_size=16,
        shared_expert_intermediate_size=24, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, num_experts=E, num_experts_per_tok=K, mlp_only_layers=[1],
        max_position_embeddings=64,
    )  # fmt: skip
    torch.manual_seed(0)
    model = Qwen2MoeForCausalLM._from_config(config, experts_implementation="eager").eval()
    return model, model_info(model, name="tiny-qwen2-moe", source="local", random_weights=True)


def _expert_params(model) -> int:
    return sum(p.numel() for n, p in model.named_parameters() if ".experts." in n)


@pytest.mark.parametrize("build", [tiny_qwen3_moe, tiny_qwen2_moe])
def test_parts_add_up_to_the_real_parameter_count(build):
    model, info = build()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the cost model warns when its count differs
        shape = costs.shape_of(info)
    parts = costs.parameter_counts(shape)
    assert sum(parts.values()) == info.parameters == sum(p.numel() for p in model.parameters())
    assert parts["weights/experts"] == _expert_params(model)
    assert sum(costs.parameter_bytes(info).values()) == info.weight_bytes
    idle = _expert_params(model) * (E - K) // E
    assert shape.active_parameters() == info.active_parameters == info.parameters - idle


def test_shared_experts_and_dense_layers_are_their_own_parts():
    model, info = tiny_qwen2_moe()
    assert (info.moe_layers, info.layers, info.shared_experts) == (2, 3, 1)
    parts = costs.parameter_counts(costs.shape_of(info))
    shared = sum(p.numel() for n, p in model.named_parameters() if ".shared_expert" in n)
    assert parts["weights/shared_experts"] == shared
    dense = sum(p.numel() for p in model.model.layers[1].mlp.parameters())
    assert parts["weights/mlp"] == dense


@pytest.mark.parametrize("build", [tiny_qwen3_moe, tiny_qwen2_moe])
def test_flops_count_active_experts_as_flop_counter_does(build):
    model, info = build()
    ids = torch.randint(0, VOCAB, (3, 5), generator=torch.Generator().manual_seed(0))
    with FlopCounterMode(display=False) as counter:
        forward(model, ids, DynamicCache())
    counts = {str(k): v for k, v in counter.get_flop_counts()["Global"].items()}
    cost = costs.forward_cost(info, batch=3, tokens_fed=5, context_len=5)
    matmul = cost.total_flops - cost.flops["flops/attention_scores"]
    assert matmul == pytest.approx(counts["aten.mm"] + counts.get("aten.addmm", 0), rel=1e-6)


def test_expert_bytes_follow_experts_touched_and_flops_do_not():
    _, info = tiny_qwen3_moe()
    shape = costs.shape_of(info)
    one_expert = shape.expert_params * shape.bytes_per_value
    single = costs.forward_cost(info, batch=1, tokens_fed=1, context_len=4)
    assert single.bytes["weights/experts"] == info.moe_layers * K * one_expert  # k per layer
    for batch in (1, 4, 16):
        cost = costs.forward_cost(info, batch=batch, tokens_fed=1, context_len=4)
        expected = E * (1 - (1 - K / E) ** batch)  # per layer, uniform routing
        assert cost.bytes["weights/experts"] == pytest.approx(
            info.moe_layers * expected * one_expert
        )
        assert cost.flops["flops/experts"] == 2 * batch * info.moe_layers * K * (
            shape.expert_matmul_params
        )
    measured = costs.forward_cost(
        info, batch=4, tokens_fed=1, context_len=4, experts_touched=[3, 5]
    )
    assert measured.bytes["weights/experts"] == 8 * one_expert
    assert costs.parameter_bytes(info)["weights/experts"] == info.moe_layers * E * one_expert


@pytest.mark.parametrize("touched", [[3], [3, 7], [-1, 2], [3, 5, 1]])
def test_bad_experts_touched_is_one_clear_error(touched):
    _, info = tiny_qwen3_moe()
    with pytest.raises(ValueError, match="experts_touched must give one count per MoE layer"):
        costs.forward_cost(info, batch=2, tokens_fed=1, context_len=4, experts_touched=touched)


def test_dense_model_has_no_moe_parts(target):
    cost = costs.forward_cost(target.info, batch=8, tokens_fed=1, context_len=16)
    assert not any("expert" in k or "router" in k for k in (*cost.bytes, *cost.flops))
    assert costs.shape_of(target.info).experts_touched(8) == 0


def test_per_token_matmuls_and_bytes_read_for_serving_models():
    model, info = tiny_qwen3_moe()
    shape = costs.shape_of(info)
    cost = costs.forward_cost(info, batch=5, tokens_fed=1, context_len=3, logits_positions=1)
    lm_head = cost.flops["flops/lm_head"]
    per_token = (cost.total_flops - cost.flops["flops/attention_scores"] - lm_head) / 5
    assert 2 * shape.matmul_params_per_token == pytest.approx(per_token)
    stored = sum(p.numel() for p in model.parameters() if p.dim() >= 2)
    tables = (1 if info.tied_embeddings else 2) * info.vocab_size * info.hidden_size
    assert shape.matmul_params == stored - tables  # the router counts as a matmul weight
    weights = sum(v for k, v in cost.bytes.items() if k.startswith("weights/"))
    gathered = cost.bytes["weights/embedding"]
    assert shape.weight_bytes_read(5) == pytest.approx(weights - gathered)


def test_dense_per_token_matmuls_are_attention_and_mlp(target):
    shape = costs.shape_of(target.info)
    assert shape.matmul_params_per_token == shape.layers * (
        shape.attn_matmul_params + shape.mlp_matmul_params
    )
    assert shape.weight_bytes_read(7) == sum(shape.weight_bytes_by_part().values())
