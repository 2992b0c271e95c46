"""Operator times: the what-if's chip rule per operator against Vidur's measured GPU times."""

from __future__ import annotations

import json
import statistics

import pytest

from explorer.cli import main
from explorer.serving.simulate import operators as ops
from explorer.serving.simulate.operators import (
    OPERATORS,
    LayerShape,
    OperatorRow,
    blame,
    load_allreduce,
    load_compute,
    operator_rows,
    summarize,
)

FIELDS = ("operator", "chip", "tokens", "tp", "predicted_ms", "measured_ms", "error_pct")
LLAMA2_7B = LayerShape(32, 32, 4096, 11008, True)


@pytest.fixture(scope="module")
def rows():
    return operator_rows()


def test_bundled_data_loads_with_known_shapes_on_both_chips():
    compute = load_compute()
    assert {r["chip"] for r in compute} == {"a100", "h100"}
    assert {r["arch"] for r in compute} == {
        "arch:llama-2-7b",
        "arch:llama-3.1-8b",
        "arch:llama-3.1-70b",
    }
    assert {int(r["tp"]) for r in compute} == {1, 2, 4, 8}
    tokens = {int(r["tokens"]) for r in compute}
    assert {1, 128, 4096} <= tokens
    ar = load_allreduce()
    assert {r["chip"] for r in ar} == {"a100", "h100"} and {r["gpus"] for r in ar} == {
        "2",
        "4",
        "8",
    }


def test_rows_have_the_fields_and_every_operator(rows):
    assert {r.operator for r in rows} == {*OPERATORS, "all_reduce"}
    for r in rows:
        d = r.to_dict()
        assert all(f in d for f in FIELDS)
        assert d["measured_ms"] > 0 and d["predicted_ms"] >= 0
        assert d["error_pct"] == pytest.approx((d["predicted_ms"] / d["measured_ms"] - 1) * 100)
    assert {r.chip for r in rows} == {"A100 80GB", "H100 SXM"}


def test_predicted_never_below_the_roofline_floor(rows):
    for r in rows:
        assert r.predicted_ms >= max(r.memory_floor_ms, r.compute_floor_ms) * (1 - 1e-12), r


def test_qkv_projection_by_hand():
    """Llama-2-7B's fused q/k/v on one H100 at 4096 tokens: 2 x 4096 x 4096 x 12288 FLOPs at
    989 TFLOP/s x the FLOP efficiency binds (the bytes, weights + in + out rows, take less)."""
    from explorer.serving.simulate.whatif_settings import defaults_for

    p = ops.predict("attn_pre_proj", LLAMA2_7B, "H100 SXM", 4096, 1)
    flops = 2 * 4096 * 4096 * 12288
    assert p["flops"] == flops
    assert p["bytes"] == 2 * (4096 * 12288 + 4096 * (4096 + 12288))
    assert p["bound"] == "compute"
    efficiency = defaults_for("H100 SXM")["flop_efficiency"]
    assert p["predicted_ms"] == pytest.approx(flops / (989e12 * efficiency) * 1e3)
    assert p["compute_floor_ms"] == pytest.approx(flops / 989e12 * 1e3)
    # tp 2 halves the weights and the FLOPs of a column-parallel matmul
    half = ops.predict("attn_pre_proj", LLAMA2_7B, "H100 SXM", 4096, 2)
    assert half["flops"] == flops / 2


def test_elementwise_operators_have_no_flops_and_are_absent_from_the_whatif():
    for op in ("emb", "input_layernorm", "attn_rope", "mlp_act", "add"):
        nbytes, flops, counted = ops.operator_work(op, LLAMA2_7B, 64, 1)
        assert nbytes > 0 and flops == 0 and counted == 0
    nbytes, _, counted = ops.operator_work("mlp_down_proj", LLAMA2_7B, 64, 2)
    assert counted == 11008 // 2 * 4096 * 2 < nbytes  # the weights only
    with pytest.raises(ValueError, match="unknown operator"):
        ops.operator_work("attention", LLAMA2_7B, 1, 1)


def test_chip_rule_is_the_whatifs_own():
    """The terms of an iteration's three groups (the fused GEMM, decode and prefill attention),
    each its larger term, give ChipStepModel.seconds, and one all-reduce is a 2-per-layer share of
    its allreduce_s (so a change to the what-if's rule shows up here)."""
    from explorer.costs.parts import shape_of
    from explorer.model.loader import arch_info
    from explorer.serving.simulate.whatif import chip_model, chip_work
    from explorer.serving.simulate.whatif_settings import defaults_for

    info = arch_info("arch:llama-2-7b", "bfloat16")
    model, _ = chip_model(info, "h100", 2)
    shape, passes = shape_of(info), [[512, 0], [1, 300]]
    w = chip_work(shape, passes, model.weight_bytes, model.kv_bytes_per_token)
    m = ops.machine("H100 SXM", 2)
    assert m.settings == defaults_for("H100 SXM")
    groups = ((w.weight_bytes, w.gemm_flops), (w.kv_bytes_decode, w.attn_flops_decode),
              (w.kv_bytes_prefill, w.attn_flops_prefill))  # fmt: skip
    step = sum(max(ops.chip_terms(m, b / 2, f / 2)) for b, f in groups)
    one = ops.allreduce_seconds(m, w["tokens"] * shape.hidden * 2)
    per_step = model.iteration_s + shape.layers * m.settings["layer_overhead_s"]
    assert step + 2 * shape.layers * one + per_step == pytest.approx(model.seconds(shape, passes))


def _row(cls, chip, predicted, measured, bound="memory", tokens=1, **kw) -> OperatorRow:
    return OperatorRow(
        cls, cls, chip, "m", "arch:x", tokens, 1, 1.0, 0.0, predicted, measured,
        memory_floor_ms=predicted / 2, compute_floor_ms=predicted / 4, whatif_ms=0.0, bound=bound,
    )  # fmt: skip


def test_blame_names_the_term():
    rows = blame(
        [
            _row("add", "A", 0.5, 1.0),  # below the class's fastest time (1.0): launch floor
            _row("add", "A", 3.0, 2.0),  # memory-bound, 50% off
            _row("mlp_up", "A", 3.0, 2.0, bound="compute"),
            _row("mlp_up", "A", 1.1, 1.0, bound="compute"),  # within 20%
        ]
    )
    assert [r.blame for r in rows] == [
        "launch floor",
        "sustained bandwidth",
        "achieved FLOP/s",
        "",
    ]


def test_summary_groups_by_class_and_chip_in_the_layers_order():
    rows = blame(
        [
            _row("mlp_up", "A", 2.0, 1.0, bound="compute", tokens=2048),  # +100%
            _row("mlp_up", "A", 1.0, 1.0, bound="compute"),  # 0%
            _row("mlp_up", "A", 0.5, 1.0, bound="compute"),  # -50%
            _row("norm", "B", 1.0, 1.0),
            _row("norm", "A", 1.0, 4.0, tokens=2),
        ]
    )
    summary = summarize(rows)
    assert [(s.op_class, s.chip) for s in summary] == [
        ("norm", "A"),
        ("norm", "B"),
        ("mlp_up", "A"),
    ]
    up = summary[-1]
    assert up.rows == 3 and up.median_abs_error_pct == pytest.approx(50.0)
    assert up.median_error_pct == pytest.approx(0.0)
    assert up.misses == 2 and up.blames == {"achieved FLOP/s": 1, "launch floor": 1}
    assert up.blame_large == "achieved FLOP/s" and up.blame_small == "launch floor"
    assert up.launch_floor_ms == 1.0
    assert (
        up.achieved_flop_frac == statistics.median([0.5, 0.25, 0.125])
        and up.achieved_bw_frac is None
    )


COLUMNS = ",".join(ops.COMPUTE_FIELDS)


def _compute_file(tmp_path, shape=(40, 40, 5120, 13824), chip="h100"):
    times = ",".join(["0.01"] * len(OPERATORS))
    path = tmp_path / "ops.csv"
    path.write_text(
        f"{COLUMNS}\n{chip},x/internlm,{','.join(map(str, shape))},True,103168,16,1,{times}\n"
    )
    return path


def test_an_unknown_shape_is_named_in_one_line(tmp_path, capsys):
    path = _compute_file(tmp_path)
    with pytest.raises(ValueError, match="matches no known model"):
        load_compute(path)
    assert main(["bench", "simulate", "--operators", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(path) in err and "hidden 5120" in err


def test_a_known_shape_in_a_file_of_ours_or_vidurs_runs(tmp_path, capsys):
    path = _compute_file(tmp_path, shape=(32, 32, 4096, 11008))
    assert main(["bench", "simulate", "--operators", str(path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["rows"]) == len(OPERATORS) and out["rows"][0]["arch"] == "arch:llama-2-7b"
    raw = tmp_path / "compute" / "a100" / "Llama-2-7b-hf" / "mlp.csv"
    raw.parent.mkdir(parents=True)
    head = [f"time_stats.{op}.median" for op in OPERATORS]
    head += ["n_head", "n_kv_head", "n_embd", "n_expanded_embd", "vocab_size", "use_gated_mlp"]
    head += ["num_tokens", "num_tensor_parallel_workers"]
    raw.write_text(
        ",".join(head)
        + "\n"
        + ",".join(["0.01"] * len(OPERATORS))
        + ",32,32,4096,11008,32768,True,8,2\n"
    )
    (row,) = load_compute(raw)
    assert (row["chip"], row["tokens"], row["tp"], row["arch"]) == (
        "a100",
        "8",
        "2",
        "arch:llama-2-7b",
    )


def test_bad_operator_files_are_one_line(tmp_path):
    missing = tmp_path / "few.csv"
    missing.write_text("chip,model\nh100,x\n")
    with pytest.raises(ValueError, match="missing columns"):
        load_compute(missing)
    with pytest.raises(ValueError, match="cannot read"):
        load_compute(tmp_path / "absent.csv")
    with pytest.raises(ValueError, match="unknown chip"):
        load_compute(_compute_file(tmp_path, shape=(32, 32, 4096, 11008), chip="a40"))


def test_cli_prints_the_table_and_summary(capsys):
    assert main(["bench", "simulate", "--operators"]) == 0
    out = capsys.readouterr().out
    assert "predicted_ms" in out and "measured_ms" in out and "median |error|" in out
    for cls in ("qkv_proj", "mlp_down", "all_reduce"):
        assert f"  {cls}" in out
    assert main(["bench", "simulate", "--operators", "--published"]) == 2


def test_implied_terms_read_the_right_rows():
    rows = [
        _row("mlp_up", "H100 SXM", 2.0, 1.0, bound="compute", tokens=4096),  # flop frac 0.5
        _row("mlp_up", "H100 SXM", 2.0, 2.0, tokens=1),  # bw frac 0.5
        _row("add", "H100 SXM", 0.1, 0.004, tokens=1),
        _row("add", "H100 SXM", 1.0, 1.0, tokens=2048),  # bw frac 0.5
    ]
    m = ops.implied(rows)["H100 SXM"]
    assert m["matmul_flop_frac_large"] == 0.5 and m["matmul_bw_frac_small"] == 0.5
    assert m["elementwise_bw_frac_large"] == 0.5 and m["elementwise_small_ms"] == 0.004
    assert m["allreduce_small_ms"] is None and m["interconnect_gbps"] == 450


def test_rows_under_the_dram_floor_are_counted():
    from explorer.serving.simulate.operators_report import under_floor

    rows = [_row("add", "A", 1.0, 0.4), _row("add", "A", 1.0, 0.6), _row("norm", "A", 1.0, 2.0)]
    (u,) = under_floor(rows)  # memory floor 0.5: the first is 20% under it, the others are not
    assert (u["op_class"], u["rows"]) == ("add", 1) and u["most_under_pct"] == pytest.approx(20)
