"""Operators as the unit of the cost model: their sums are the parts, exactly, for every model."""

from __future__ import annotations

import dataclasses
import functools
import json

import pytest

from explorer import costs
from explorer.costs import hardware
from explorer.costs.operators import EXTRA_BYTES, UnknownFamily, operators
from explorer.costs.optime import fp8_shape, summary, timed
from explorer.model.loader import ARCH_DIR
from explorer.model.loader import arch_info as _arch_info

ARCHS = sorted(p.stem for p in ARCH_DIR.glob("*.json"))
SIZES = [(1, 1, 64), (4, 1, 100), (2, 32, 32), (1, 16, 80)]  # (batch, fed, context)


@functools.cache
def arch_info(name: str, dtype: str = "bfloat16"):
    return _arch_info(name, dtype)


def assert_sums_equal_parts(info, batch, fed, context, **kw):
    fused = kw.pop("fused_attention", True)
    table = operators(info, batch=batch, tokens_fed=fed, context_len=context,
                      fused_attention=fused, **kw)  # fmt: skip
    cost = costs.forward_cost(info, batch=batch, tokens_fed=fed, context_len=context, **kw)
    got_b, got_f = table.part_bytes(), table.part_flops()
    assert set(got_b) <= set(cost.bytes) and set(got_f) <= set(cost.flops)
    for key, value in cost.bytes.items():  # a part no op has is 0 (weights/mlp of an all-MoE model)
        assert got_b.get(key, 0.0) == pytest.approx(value, rel=1e-12, abs=1e-9), key
    for key, value in cost.flops.items():
        assert got_f.get(key, 0.0) == pytest.approx(value, rel=1e-12, abs=1e-9), key
    return table


@pytest.mark.parametrize("name", ARCHS)
@pytest.mark.parametrize("fused", [True, False])
def test_operator_sums_equal_part_totals_every_arch(name, fused):
    info = arch_info(name)
    for batch, fed, context in SIZES:
        for positions in (1, None):
            assert_sums_equal_parts(info, batch, fed, context, logits_positions=positions,
                                    fused_attention=fused)  # fmt: skip


@pytest.mark.parametrize("name", ["bundled:target", "bundled:draft", "bundled:moe"])
def test_operator_sums_equal_part_totals_bundled(name):
    from explorer.model.loader import load

    info = load(name).info
    for batch, fed, context in SIZES:
        assert_sums_equal_parts(info, batch, fed, context, logits_positions=1)
    assert_sums_equal_parts(info, 1, 12, 12, use_cache=False)  # no cache: no KV bytes at all


def test_part_totals_unchanged_llama_8b_by_hand():
    """The parts are what they were (the hand formulas), and the operators add up to them."""
    info = arch_info("llama-3.1-8b")
    cost = costs.forward_cost(info, batch=1, tokens_fed=1, context_len=4096, logits_positions=1)
    h, kv, i, L, V, b = 4096, 1024, 14336, 32, 128256, 2
    assert cost.bytes["weights/attention"] == L * (2 * h * h + 2 * h * kv) * b
    assert cost.bytes["weights/mlp"] == L * 3 * h * i * b
    assert cost.bytes["kv_read"] == 2 * L * kv * b * 4095
    assert cost.bytes["kv_write"] == 2 * L * kv * b
    assert cost.flops["flops/lm_head"] == 2 * h * V
    table = assert_sums_equal_parts(info, 1, 1, 4096, logits_positions=1)
    assert table.part_bytes()["weights/lm_head"] == V * h * b


def test_kv_dtype_and_measured_experts_keep_the_sums():
    info = arch_info("qwen3-30b-a3b")
    t8 = assert_sums_equal_parts(info, 2, 1, 256, logits_positions=1, kv_dtype="fp8")
    t16 = operators(info, batch=2, tokens_fed=1, context_len=256, logits_positions=1)
    assert t8.part_bytes()["kv_read"] == pytest.approx(t16.part_bytes()["kv_read"] / 2)
    layers = info.moe_layers
    touched = [float(min(4 + li % 3, 16)) for li in range(layers)]
    t = assert_sums_equal_parts(info, 2, 1, 256, logits_positions=1, experts_touched=touched)
    experts = sum(op.bytes.get("weights/experts", 0) * op.count for op in t.ops)
    assert experts == pytest.approx(t.part_bytes()["weights/experts"])


@pytest.mark.parametrize(
    "name, fused, per_layer",
    [("llama-3.1-8b", True, 15), ("llama-3.1-8b", False, 17), ("gpt2", True, 11),
     ("qwen3-8b", True, 17), ("mixtral-8x7b", True, 17), ("qwen3-30b-a3b", True, 19),
     ("gpt-oss-20b", True, 17)],
)  # fmt: skip
def test_ops_per_layer_by_family(name, fused, per_layer):
    table = operators(arch_info(name), batch=1, tokens_fed=1, context_len=64,
                      fused_attention=fused)  # fmt: skip
    names = [op.name for op in table.layer_ops()]
    assert len(names) == per_layer and len(set(names)) == per_layer, names
    assert names[0] == "attn_norm" and names[-1] == "mlp_residual"
    assert ("qkv_proj" in names) == (name == "gpt2") and ("rope" in names) == (name != "gpt2")
    assert all(op.what.endswith(".") and op.shapes for op in table.ops)


def test_eager_attention_moves_the_score_matrix_fused_does_not():
    info = arch_info("llama-3.2-1b")
    eager = operators(info, batch=1, tokens_fed=64, context_len=64, fused_attention=False)
    fused = operators(info, batch=1, tokens_fed=64, context_len=64)
    scores = sum(op.bytes.get("scores", 0) * op.count for op in eager.ops)
    assert scores == 2 * 2 * info.attention_heads * 64 * 64 * 2 * info.layers  # qk + softmax + av
    assert not any("scores" in op.bytes for op in fused.ops)
    assert eager.part_bytes() == pytest.approx(fused.part_bytes())


def test_decode_memory_bound_prefill_compute_bound_on_h100():
    info, peaks = arch_info("llama-3.1-8b"), hardware.chip_peaks("h100", "bfloat16")
    kw = dict(logits_positions=1)
    decode = operators(info, batch=1, tokens_fed=1, context_len=4096, **kw)
    prefill = operators(info, batch=1, tokens_fed=512, context_len=512, **kw)
    for table, bound in ((decode, "memory"), (prefill, "compute")):
        rows = timed(table, peaks)
        mm = [r for r in rows if r["kind"] == "matmul" and r["stage"] == "layer"]
        assert {r["bound"] for r in mm} == {bound}, [(r["name"], r["bound"]) for r in mm]
        assert sum(r["share"] for r in rows) == pytest.approx(1.0)
        cost = costs.forward_cost(info, batch=1, tokens_fed=table.tokens_fed,
                                  context_len=table.context_len, **kw)  # fmt: skip
        floor, _ = costs.roofline(cost.total_flops, cost.bound_bytes, peaks)
        assert sum(r["time_s"] for r in rows) >= floor  # the ops' sum never beats the pass bound
    head = summary(decode, timed(decode, peaks))
    assert head["ops_per_layer"] == 15 and [t[0] for t in head["top"]][:1] == ["gate_proj"]


def test_tensor_parallel_halves_each_gpu_and_adds_all_reduces():
    info, peaks = arch_info("llama-3.1-8b"), hardware.chip_peaks("h100", "bfloat16")
    table = operators(info, batch=1, tokens_fed=1, context_len=1024, logits_positions=1)
    shape = costs.shape_of(info)
    one = {r["name"]: r for r in timed(table, peaks)}
    two = {r["name"]: r for r in timed(table, peaks, tp=2, interconnect_gbps=450, shape=shape)}
    assert set(two) - set(one) == {"allreduce_attn", "allreduce_mlp"}
    assert two["q_proj"]["total_bytes"] == pytest.approx(one["q_proj"]["total_bytes"] / 2)
    assert two["allreduce_mlp"]["bound"] == "interconnect"
    assert two["allreduce_mlp"]["total_bytes"] == pytest.approx(2 * 0.5 * 4096 * 2 * 32)


def test_fp8_weights_and_unknown_family():
    info = arch_info("llama-3.1-8b")
    table = operators(info, batch=1, tokens_fed=1, context_len=64, shape=fp8_shape(
        costs.shape_of(info)))  # fmt: skip
    plain = operators(info, batch=1, tokens_fed=1, context_len=64)
    assert table.part_bytes()["weights/mlp"] == pytest.approx(plain.part_bytes()["weights/mlp"] / 2)
    with pytest.raises(ValueError, match="no published dense fp8"):
        hardware.chip_peaks("a100", "fp8")
    odd = dataclasses.replace(info, family="phi3")
    with pytest.raises(UnknownFamily, match="no operator list for model family 'phi3'"):
        operators(odd, batch=1, tokens_fed=1, context_len=8)
    assert "sampling" in EXTRA_BYTES


def test_cli_ops_json_html_and_bad_input(capsys, tmp_path):
    from explorer.cli import main

    base = ["cost", "--model", "arch:llama-3.1-8b", "--ops", "--chip", "h100", "--dtype", "bf16"]
    assert main([*base, "--context", "4096", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ops_per_layer"] == 15 and out["phase"] == "decode"
    assert len(out["rows"]) == 2 + 15 + 3 + 1  # embedding + final norm, layer, sampling, head
    page = tmp_path / "ops.html"
    assert main([*base, "--context", "512", "--tokens-fed", "512", "--html", str(page)]) == 0
    assert "compute-bound" in page.read_text(encoding="utf-8")
    capsys.readouterr()
    for bad in (["--tp", "3"], ["--dtype", "fp8", "--chip", "a100"]):
        assert main([*base, *bad]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("explorer: ") and "\n" not in err, err


def test_coarse_operators_of_an_unknown_family_read_every_parameter_once():
    from explorer.costs.operators import coarse_operators

    info = dataclasses.replace(arch_info("llama-3.2-1b"), family="phi3")
    table = coarse_operators(info, batch=1, tokens_fed=1, context_len=64)
    weights = sum(v * op.count for op in table.ops for k, v in op.bytes.items()
                  if k.startswith("weights/") and k != "weights/embedding")  # fmt: skip
    assert weights == pytest.approx(info.parameters * 2)  # tied: the head is the embedding matrix
    assert [op.name for op in table.layer_ops()] == ["layer"] and table.layer_ops()[0].count == 16
    rows = timed(table, hardware.chip_peaks("h100", "bfloat16"))
    assert sum(r["share"] for r in rows) == pytest.approx(1.0)


def test_cli_ops_png_is_the_picture_drawn_by_chromium(capsys, tmp_path, monkeypatch):
    from explorer.app.voila import browser
    from explorer.cli import main

    if browser.browser_unavailable():
        pytest.skip(browser.browser_unavailable())
    base = ["cost", "--model", "arch:llama-3.1-8b", "--ops", "--chip", "h100", "--dtype", "bf16"]
    png = tmp_path / "ops.png"
    assert main([*base, "--png", str(png)]) == 0
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert width > 800 and height > 400  # the whole plot, not an empty page
    assert f"picture written to {png}" in capsys.readouterr().out
    # no browser: one line before any work, nothing written
    monkeypatch.setattr(browser, "browser_unavailable", lambda: "no chromium found")
    assert main([*base, "--png", str(tmp_path / "no.png")]) == 2
    err = capsys.readouterr().err.strip()
    assert "no chromium found" in err and "\n" not in err and not (tmp_path / "no.png").exists()
