"""The KV cache's dtype: bytes in the cost model, capacity in the what-if, the ladder's KV rungs."""

from __future__ import annotations

import math

import pytest

from explorer.costs.kvdtype import KV_DTYPES, kv_dtype_name, kv_value_bytes
from explorer.costs.parts import Shape, forward_bytes


def _shape(**kw) -> Shape:
    """A hand-made llama-like shape in bf16: 4 layers, 2 KV heads of 16."""
    base = dict(family="llama", layers=4, hidden=64, heads=4, kv_heads=2, head_dim=16, inter=128)
    base.update(vocab=100, max_positions=4096, tied=False, bytes_per_value=2, mlp="swiglu")
    base.update(norm="rmsnorm", learned_positions=False, qkv_bias=False, out_bias=False)
    base.update(mlp_bias=False)
    base.update(kw)
    return Shape(**base)


def test_kv_bytes_halve_from_bf16_to_fp8_and_count_int_scales():
    bf16 = _shape()
    assert bf16.kv_bytes_per_token == 2 * 4 * 2 * 16 * 2  # 2 (K, V) x layers x kv_heads x dim x 2 B
    assert bf16.with_kv_dtype(None) is bf16
    fp8 = bf16.with_kv_dtype("fp8")
    assert fp8.kv_bytes_per_token * 2 == bf16.kv_bytes_per_token
    a = forward_bytes(
        bf16, batch=3, tokens_fed=1, context_len=1000, use_cache=True, logits_positions=1
    )
    b = forward_bytes(
        fp8, batch=3, tokens_fed=1, context_len=1000, use_cache=True, logits_positions=1
    )
    assert b["kv_read"] * 2 == a["kv_read"] > 0 and b["kv_write"] * 2 == a["kv_write"] > 0
    # the weights do not change with the cache's dtype
    assert {k: v for k, v in a.items() if not k.startswith("kv")} == {
        k: v for k, v in b.items() if not k.startswith("kv")
    }
    values = 2 * 4 * 2 * 16
    assert bf16.with_kv_dtype("int8").kv_bytes_per_token == values * (1 + 4 / 64)
    assert bf16.with_kv_dtype("int4").kv_bytes_per_token == values * (0.5 + 4 / 64)
    assert kv_dtype_name("E4M3") == "fp8" and kv_value_bytes(None, 4) == 4
    with pytest.raises(ValueError, match="kv_dtype must be one of .*int4"):
        kv_dtype_name("int3")
    assert set(KV_DTYPES) >= {"bfloat16", "fp8", "int8", "int4"}


def test_whatif_holds_more_at_a_long_context_with_fp8_kv():
    from explorer.model.loader import arch_info
    from explorer.serving.simulate.capacity import Setup
    from explorer.serving.simulate.whatif import chip_model

    info = arch_info("arch:llama-3.1-8b", "bfloat16")
    model16, extra16 = chip_model(info, "h100", 1)
    model8, extra8 = chip_model(info, "h100", 1, kv_dtype="fp8")
    assert model8.kv_bytes_per_token * 2 == model16.kv_bytes_per_token == 128 * 1024
    # the same KV budget holds twice the tokens (to the block)
    assert extra8["memory"]["kv_tokens"] in (2 * extra16["memory"]["kv_tokens"] + d for d in (0, 1))
    said = " ".join(model8.assumptions)
    assert "KV cache fp8" in said and "64.0 KiB each in fp8" in said, said
    # at a 32k-token context the KV cache bounds the batch: the modelled capacity rises
    long = dict(input_len=32_000, output_len=512)
    with16, with8 = Setup(info, "h100", 1, **long), Setup(info, "h100", 1, kv_dtype="fp8", **long)
    assert with8.capacity > with16.capacity > 0
    # int4 holds more still; a dtype the table lacks is refused with the choices
    assert Setup(info, "h100", 1, kv_dtype="int4", **long).capacity > with8.capacity
    with pytest.raises(ValueError, match="kv_dtype must be one of"):
        chip_model(info, "h100", 1, kv_dtype="int3")


def test_fp8_cache_session_counts_and_holds_a_quarter_of_fp32(target):
    from explorer import Sampling, Session

    steps = {}
    for cache in ("dynamic", "fp8"):
        s = Session(target, "The built-in function len()", Sampling(greedy=True), cache=cache)
        s.run(3)
        steps[cache] = s.steps[-1]
    fp32, fp8 = steps["dynamic"], steps["fp8"]
    assert fp32.dtype == "float32" and fp8.cache_type == "fp8"
    assert fp8.bytes["kv_read"] * 4 == fp32.bytes["kv_read"] > 0  # modelled: 1 byte vs 4
    # measured: the cache's tensors (fp8 states + one fp32 scale per tensor) hold ~a quarter
    assert fp32.kv_cache_bytes / 4 <= fp8.kv_cache_bytes < fp32.kv_cache_bytes / 4 * 1.05


def test_kv_rungs_perplexity_through_the_cache_and_the_unrunnable_row(target):
    from transformers.utils import is_optimum_quanto_available

    from explorer.sweeps.ladder import _Ladder, heldout_ids, perplexity

    ids = heldout_ids(target, 96)
    plain = perplexity(target, ids)
    # fed through an unquantised cache in pieces, the same text scores the same
    assert perplexity(target, ids, kv_cache="dynamic") == pytest.approx(plain, rel=1e-4)
    fp8 = perplexity(target, ids, kv_cache="fp8")
    assert math.isfinite(fp8) and fp8 != plain and abs(fp8 / plain - 1) < 0.05
    if is_optimum_quanto_available():
        pytest.skip("optimum-quanto is installed here: the int4:quanto rung runs")
    row = _Ladder(target, ids[:8], 2, 1, 1.0, []).row(1, "kv int4:quanto")
    assert "optimum-quanto" in row["skipped"] and "not installed" in row["skipped"]
