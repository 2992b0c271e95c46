"""The what-if on a mixture of experts: bytes follow the experts a batch touches (modelled)."""

from __future__ import annotations

import pytest
from moe_helpers import tiny_moe

from explorer.costs.parts import shape_of
from explorer.model.loader import arch_info
from explorer.serving.simulate.whatif import chip_model, chip_work


def small_moe_info(experts: int):
    """A tiny Qwen3-MoE's facts: 8 heads, 4 KV heads, `experts` experts, top-2."""
    return tiny_moe(experts, 2, heads=8, kv_heads=4, name=f"small-moe-{experts}").info


def test_bytes_follow_experts_touched():
    info = small_moe_info(16)
    shape = shape_of(info)
    model, _ = chip_model(info, "h100")
    kv = model.kv_bytes_per_token

    def work(batch: int) -> dict:
        return chip_work(shape, [[1, 511]] * batch, model.weight_bytes, kv, model.expert_bytes)

    one, big = work(1), work(256)
    layers, experts, k = shape.moe_layers, shape.experts, shape.top_k
    idle = layers * (experts - k) * model.expert_bytes
    # one token reads its k experts per layer and nothing of the other E - k
    assert one["bytes"] == pytest.approx(model.weight_bytes - idle + 512 * kv)
    # 256 tokens touch nearly every expert: all the weights
    touched = shape.experts_touched(256)
    assert experts - 0.01 < touched <= experts and shape.experts_touched(1) == k
    assert big["bytes"] == pytest.approx(model.weight_bytes + 256 * 512 * kv, rel=1e-3)
    extra = (big["bytes"] - 256 * 512 * kv) - (one["bytes"] - 512 * kv)
    assert extra == pytest.approx(layers * (touched - k) * model.expert_bytes)
    # while the FLOPs per token stay those of the k active experts
    assert big["flops"] / 256 == pytest.approx(one["flops"], rel=1e-9)
    assert any("mixture of experts" in a for a in model.assumptions)


def test_dense_bytes_do_not_depend_on_the_batch_s_experts():
    info = arch_info("llama-3.1-8b", "bfloat16")
    model, _ = chip_model(info, "h100")
    shape, kv = shape_of(info), model.kv_bytes_per_token
    for batch in (1, 64):
        w = chip_work(shape, [[1, 511]] * batch, model.weight_bytes, kv, model.expert_bytes)
        assert w["bytes"] == pytest.approx(model.weight_bytes + batch * 512 * kv)
    assert not any("mixture of experts" in a for a in model.assumptions)


def test_expert_parallel_needs_experts_that_divide():
    six = small_moe_info(6)
    model, _ = chip_model(six, "h100", 2, expert_parallel=True)  # 6 experts over 2 GPUs
    assert any("expert parallel" in a for a in model.assumptions)
    with pytest.raises(ValueError, match="does not divide the model's 6 experts") as err:
        chip_model(six, "h100", 4, expert_parallel=True)  # the heads divide by 4, the experts not
    assert "\n" not in str(err.value) and "2" in str(err.value).split(":")[-1]
    chip_model(six, "h100", 4)  # tensor parallel slices every expert: no division needed
    with pytest.raises(ValueError, match="dense"):
        chip_model(arch_info("llama-3.1-8b", "bfloat16"), "h100", 2, expert_parallel=True)
