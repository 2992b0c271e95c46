"""The cost model: exact against real parameters, real caches and FlopCounterMode; roofline physics."""

from __future__ import annotations

import copy
import functools

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode
from transformers import AutoModelForCausalLM, DynamicCache
from transformers.initialization import no_init_weights

from explorer import costs
from explorer.costs import hardware
from explorer.engine import forward, kv_cache_bytes
from explorer.model.loader import ARCH_DIR, arch_config, model_info
from explorer.model.loader import arch_info as _arch_info


@functools.cache
def arch_info(name: str, dtype: str = "float32"):
    """explorer.model.loader.arch_info, once per shape (building even a meta-device model takes a moment)."""
    return _arch_info(name, dtype)


ARCHS = sorted(p.stem for p in ARCH_DIR.glob("*.json"))
VOCAB = 512  # small vocabulary for the cut-down forward passes (KV and per-layer costs do not depend on it)


def _cut_down(name: str, layers: int = 2):
    """A `layers`-layer version of a shipped architecture with the same attention shape (heads, kv_heads,
    head_dim, hidden). The 7-8B shapes also get a small MLP and bf16 so the test stays light."""
    config, _ = arch_config(name)
    config.num_hidden_layers = layers
    config.vocab_size = VOCAB
    big = config.hidden_size >= 2048
    if big:
        config.intermediate_size = 64
    moe = bool(getattr(config, "num_local_experts", None) or getattr(config, "num_experts", None))
    if moe:
        for key in ("num_local_experts", "num_experts"):  # MoE: 8 experts keep it light
            if getattr(config, key, None):
                setattr(config, key, min(8, getattr(config, key)))
        if getattr(config, "moe_intermediate_size", None):
            config.moe_intermediate_size = 64
    with no_init_weights():
        model = AutoModelForCausalLM.from_config(
            config,
            dtype=torch.bfloat16 if big else torch.float32,
            attn_implementation="eager",
            **(
                {"experts_implementation": "eager"} if moe else {}
            ),  # FlopCounter sees mm, not _grouped_mm
        )
    model.tie_weights()
    model.eval()
    return model, model_info(model, name=f"{name}-cut", source="arch", random_weights=True)


@pytest.fixture(scope="module", params=ARCHS)
def cut_down(request):
    model, info = _cut_down(request.param)
    return request.param, model, info


# --- exactness -------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ARCHS)
def test_parameter_bytes_equal_real_parameters_full_size(name):
    info = arch_info(name)  # the real shape on the meta device: nothing allocated
    parts = costs.parameter_bytes(info)
    assert sum(parts.values()) == info.weight_bytes
    assert list(parts)[0] == "weights/embedding"
    assert (parts["weights/lm_head"] == 0) == info.tied_embeddings  # tied embeddings counted once


def test_parameter_bytes_follow_dtype():
    fp32, bf16 = arch_info("qwen2.5-0.5b", "float32"), arch_info("qwen2.5-0.5b", "bfloat16")
    assert sum(costs.parameter_bytes(bf16).values()) == bf16.weight_bytes == fp32.weight_bytes // 2


def test_parameter_bytes_of_cut_down_models(cut_down):
    _, _, info = cut_down
    assert sum(costs.parameter_bytes(info).values()) == info.weight_bytes


def test_kv_bytes_per_token_equal_a_real_cache(cut_down):
    name, model, info = cut_down
    ids = torch.randint(0, VOCAB, (2, 7), generator=torch.Generator().manual_seed(0))
    _, cache = forward(model, ids, DynamicCache())
    held = kv_cache_bytes(cache)
    prefill = costs.forward_cost(info, batch=2, tokens_fed=7, context_len=7)
    assert prefill.bytes["kv_write"] == held
    assert prefill.bytes["kv_read"] == 0
    _, cache = forward(model, ids[:, :1], cache)  # one decode step: reads 7, writes 1 per row
    decode = costs.forward_cost(info, batch=2, tokens_fed=1, context_len=8)
    assert decode.bytes["kv_read"] == held
    assert decode.bytes["kv_read"] + decode.bytes["kv_write"] == kv_cache_bytes(cache)
    # scale the 2-layer figure to the shipped depth: equals the full shape's KV bytes per token
    full = arch_info(name, info.dtype)
    assert costs.shape_of(full).kv_bytes_per_token == held // (2 * 7) // 2 * full.layers
    assert costs.shape_of(full).kv_bytes_per_token == full.kv_bytes_per_token


def _counted_flops(model, ids, cache):
    with FlopCounterMode(display=False) as counter:
        forward(model, ids, cache)
    counts = {str(k): v for k, v in counter.get_flop_counts()["Global"].items()}
    matmul = counts.get("aten.mm", 0) + counts.get("aten.addmm", 0)
    return matmul, counts.get("aten.bmm", 0)


def test_flops_match_flop_counter(cut_down):
    _, model, info = cut_down
    ids = torch.randint(0, VOCAB, (2, 9), generator=torch.Generator().manual_seed(1))
    cache = DynamicCache()
    matmul, scores = _counted_flops(model, ids, cache)  # prefill, all logits
    cost = costs.forward_cost(info, batch=2, tokens_fed=9, context_len=9)
    modelled = cost.total_flops - cost.flops["flops/attention_scores"]  # every matmul part
    assert modelled == pytest.approx(matmul, rel=0.10)
    assert cost.flops["flops/attention_scores"] == pytest.approx(
        scores, rel=0.10
    )  # eager attention: bmm
    matmul, scores = _counted_flops(model, ids[:, :1], cache)  # decode at context 10
    cost = costs.forward_cost(info, batch=2, tokens_fed=1, context_len=10)
    modelled = cost.total_flops - cost.flops["flops/attention_scores"]  # every matmul part
    assert modelled == pytest.approx(matmul, rel=0.10)
    assert cost.flops["flops/attention_scores"] == pytest.approx(scores, rel=0.10)


def test_last_logits_only_matches_flop_counter():
    model, info = _cut_down("smollm2-135m")
    ids = torch.randint(0, VOCAB, (1, 6), generator=torch.Generator().manual_seed(2))
    with FlopCounterMode(display=False) as counter:
        forward(model, ids, DynamicCache(), last_only=True)
    counted = sum(
        v
        for k, v in counter.get_flop_counts()["Global"].items()
        if str(k) in ("aten.mm", "aten.addmm")
    )
    cost = costs.forward_cost(info, batch=1, tokens_fed=6, context_len=6, logits_positions=1)
    assert cost.flops["flops/lm_head"] == 2 * info.hidden_size * info.vocab_size
    modelled = (
        cost.flops["flops/attention_proj"] + cost.flops["flops/mlp"] + cost.flops["flops/lm_head"]
    )
    assert modelled == pytest.approx(counted, rel=0.10)


# --- conventions and physics ---------------------------------------------------------------------


def test_decode_weight_reads_every_matrix_once_and_gathers_embedding_rows():
    info = arch_info("llama-3.1-8b", "bfloat16")  # untied
    params = costs.parameter_bytes(info)
    cost = costs.forward_cost(info, batch=4, tokens_fed=1, context_len=100)
    for part in ("weights/attention", "weights/mlp", "weights/norms", "weights/lm_head"):
        assert cost.bytes[part] == params[part]
    assert cost.bytes["weights/embedding"] == 4 * info.hidden_size * 2  # 4 rows gathered, bf16
    tied = arch_info("qwen2.5-0.5b")
    cost = costs.forward_cost(tied, batch=1, tokens_fed=1, context_len=10)
    assert (
        cost.bytes["weights/lm_head"] == tied.vocab_size * tied.hidden_size * 4
    )  # the shared matrix, once
    assert costs.parameter_bytes(tied)["weights/lm_head"] == 0


def test_gpt2_counts_position_embedding_and_biases():
    info = arch_info("gpt2")
    parts = costs.parameter_bytes(info)
    assert parts["weights/position_embedding"] == info.max_positions * info.hidden_size * 4
    cost = costs.forward_cost(info, batch=2, tokens_fed=3, context_len=3)
    assert cost.bytes["weights/position_embedding"] == 2 * 3 * info.hidden_size * 4


def test_kv_formula_and_no_cache_moves_no_kv():
    info = arch_info("mistral-7b", "bfloat16")
    per_token = 2 * info.layers * info.kv_heads * info.head_dim * 2
    cost = costs.forward_cost(info, batch=3, tokens_fed=2, context_len=50)
    assert cost.bytes["kv_read"] == per_token * 3 * 48
    assert cost.bytes["kv_write"] == per_token * 3 * 2
    uncached = costs.forward_cost(info, batch=3, tokens_fed=50, context_len=50, use_cache=False)
    assert uncached.bytes["kv_read"] == uncached.bytes["kv_write"] == 0
    assert (
        uncached.flops["flops/attention_scores"]
        == 4 * 3 * info.attention_heads * info.head_dim * 50 * 50 * info.layers
    )


def test_bytes_grow_with_context_and_flops_with_batch():
    info = arch_info("qwen2.5-0.5b")
    short, long = (
        costs.forward_cost(info, batch=1, tokens_fed=1, context_len=L) for L in (16, 1024)
    )
    assert long.total_bytes > short.total_bytes
    assert long.bytes["kv_read"] > short.bytes["kv_read"]
    assert long.total_flops > short.total_flops
    b1, b8 = (costs.forward_cost(info, batch=b, tokens_fed=1, context_len=128) for b in (1, 8))
    assert b8.total_flops == pytest.approx(8 * b1.total_flops)
    assert b8.intensity > 5 * b1.intensity  # the weights are shared by the rows


def test_prefill_has_higher_intensity_than_decode():
    info = arch_info("llama-3.2-1b", "bfloat16")
    prefill = costs.forward_cost(info, batch=1, tokens_fed=512, context_len=512)
    decode = costs.forward_cost(info, batch=1, tokens_fed=1, context_len=512)
    assert prefill.intensity > 100 * decode.intensity
    assert decode.intensity < 2  # about one multiply-add per weight read


def test_generation_without_cache_grows_quadratically():
    info = arch_info("smollm2-135m")

    def totals(n, cache):
        return costs.generation_cost(info, prompt_len=8, new_tokens=n, use_cache=cache).total_flops

    cached_ratio = totals(512, True) / totals(256, True)
    uncached_ratio = totals(512, False) / totals(256, False)
    assert 1.8 < cached_ratio < 2.3  # linear (plus the small attention term)
    assert uncached_ratio > 3.5  # quadratic
    no_cache = costs.generation_cost(info, prompt_len=8, new_tokens=64, use_cache=False)
    assert no_cache.bytes["kv_read"] == 0 and len(no_cache.per_step_flops) == 64
    cached = costs.generation_cost(info, prompt_len=8, new_tokens=64)
    assert cached.bytes["kv_write"] == info.kv_bytes_per_token * (
        8 + 63
    )  # every position written once


def test_step_roofline_contract():
    info = arch_info("qwen2.5-0.5b")
    peaks = hardware.Peaks(
        device="test", dtype="float32", bandwidth_gbps=10.0, flops=1e11, method="modelled"
    )
    out = costs.step_roofline(
        info, batch=1, tokens_fed=1, context_len=64, use_cache=True, latency_s=0.5, peaks=peaks
    )
    assert set(out) == set(costs.STEP_COST_FIELDS)
    counted = costs.bound_bytes(out["bytes"])
    assert counted < sum(out["bytes"].values())  # the activations estimate is shown, not counted
    assert out["bound"] == "memory"
    assert out["bound_s"] == pytest.approx(counted / 10e9)
    assert out["achieved_gbps"] == pytest.approx(counted / 0.5 / 1e9)
    assert out["pct_of_peak_bw"] == pytest.approx(100 * out["achieved_gbps"] / 10.0)
    bare = costs.step_roofline(
        info, batch=1, tokens_fed=1, context_len=64, use_cache=True, latency_s=None
    )
    assert (
        bare["bound_s"] is bare["bound"] is bare["achieved_gbps"] is bare["pct_of_peak_bw"] is None
    )
    assert bare["flops"] == out["flops"]
    prefill = costs.step_roofline(
        info,
        batch=1,
        tokens_fed=2048,
        context_len=2048,
        use_cache=True,
        latency_s=None,
        peaks=peaks,
    )
    assert prefill["bound"] == "compute"
    assert prefill["bound_s"] == pytest.approx(prefill["flops"] / 1e11)


def test_decode_knee_is_where_the_bound_switches():
    info = arch_info("qwen2.5-0.5b")
    peaks = hardware.Peaks(
        device="test", dtype="float32", bandwidth_gbps=10.0, flops=1e11, method="modelled"
    )
    knee = costs.decode_knee(info, context_len=128, peaks=peaks)
    assert knee is not None and knee > 1

    def bound(b):
        return costs.step_roofline(
            info,
            batch=b,
            tokens_fed=1,
            context_len=128,
            use_cache=True,
            latency_s=None,
            peaks=peaks,
        )["bound"]

    assert bound(knee - 1) == "memory" and bound(knee) == "compute"
    # a huge context makes the KV read per row outgrow the FLOPs per row: no knee
    assert costs.decode_knee(info, context_len=32768, peaks=peaks, max_batch=4096) is None


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(batch=0, tokens_fed=1, context_len=1), "batch"),
        (dict(batch=-2, tokens_fed=1, context_len=1), "batch"),
        (dict(batch=1, tokens_fed=0, context_len=1), "tokens_fed"),
        (dict(batch=1, tokens_fed=5, context_len=4), "cannot exceed"),
        (dict(batch=1, tokens_fed=1, context_len=10**6), "positions, more than"),
        (dict(batch=1.5, tokens_fed=1, context_len=4), "batch"),
        (dict(batch=1, tokens_fed=1, context_len=4, use_cache=False), "whole sequence"),
        (dict(batch=1, tokens_fed=4, context_len=4, logits_positions=5), "logits_positions"),
    ],
)
def test_bad_sizes_raise_clear_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        costs.forward_cost(arch_info("smollm2-135m"), **kwargs)


def test_unknown_family_raises():
    info = copy.copy(arch_info("smollm2-135m"))
    info.family = "mamba"
    with pytest.raises(ValueError, match="no cost model for model family 'mamba'"):
        costs.forward_cost(info, batch=1, tokens_fed=1, context_len=1)


def test_bad_generation_sizes():
    info = arch_info("smollm2-135m")
    with pytest.raises(ValueError, match="new_tokens"):
        costs.generation_cost(info, prompt_len=4, new_tokens=0)
    with pytest.raises(ValueError, match="needs 8,499 positions, more than"):
        costs.generation_cost(info, prompt_len=8000, new_tokens=500)


# --- the roofline holds on real measured steps ----------------------------------------------------


@pytest.fixture
def one_thread(monkeypatch):
    """One thread (on a shared 2-core machine a 2-thread pool stalls on every op), and peaks measured
    afresh at the first step: a peak measured minutes earlier under someone else's load would be too
    low, and a bound from it too high -- the property is about the model, not the neighbours."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    monkeypatch.setattr(hardware, "_PEAKS", {})
    monkeypatch.setattr(hardware, "_BANDWIDTH", {})
    yield
    torch.set_num_threads(before)


def _assert_never_under_bound(steps):
    assert steps
    for s in steps:
        assert s.bound_s is not None and s.latency_s > 0
        assert s.latency_s >= s.bound_s, (
            f"step {s.index} measured {s.latency_s:.6f}s under its bound {s.bound_s:.6f}s"
        )
        assert s.achieved_gbps == pytest.approx(costs.bound_bytes(s.bytes) / s.latency_s / 1e9)


def test_measured_latency_never_under_bound_on_bundled_steps(target, one_thread):
    from explorer import Session

    session = Session(target, "Once upon a time", max_new_tokens=12)
    _assert_never_under_bound(session.run(12))
    uncached = Session(target, "Once upon a time", use_cache=False, max_new_tokens=6)
    _assert_never_under_bound(uncached.run(6))


def test_measured_latency_never_under_bound_on_arch_steps(tiny_arch, one_thread):
    from explorer import Session

    session = Session(tiny_arch, [1, 2, 3, 4, 5, 6, 7, 8], max_new_tokens=3, batch_size=2)
    _assert_never_under_bound(session.run(3))


# --- CLI -------------------------------------------------------------------------------------------


def test_cli_cost_prints_parts(capsys):
    import json

    from explorer.cli import main

    assert (
        main(
            [
                "cost",
                "--model",
                "arch:llama-3.1-8b",
                "--dtype",
                "bf16",
                "--chip",
                "H100 SXM",
                "--batch",
                "8",
                "--context",
                "1024",
                "--json",
            ]
        )
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    info = arch_info("llama-3.1-8b", "bfloat16")
    expected = costs.forward_cost(info, batch=8, tokens_fed=1, context_len=1024, logits_positions=1)
    assert out["bytes"] == expected.bytes and out["total_flops"] == expected.total_flops
    assert out["peaks"]["method"] == "modelled" and out["bound"] == "memory"
    assert (
        main(
            ["cost", "--model", "arch:gpt2", "--context", "64", "--no-cache", "--chip", "A100 80GB"]
        )
        == 0
    )
    text = capsys.readouterr().out
    assert "weights/position_embedding" in text and "kv_read" in text
    assert "(compute-bound)" in text  # no cache: fp32 GPT-2 recomputing 64 positions on an A100
    assert main(["cost", "--model", "arch:gpt2", "--context", "5000", "--chip", "L4"]) == 2
    assert (
        "context_len 5,000 needs 5,000 positions, more than arch:gpt2's context of 1,024"
        in capsys.readouterr().err
    )
