"""The what-if against published GPU runs: the data, replay, FP8, the chip table, bad input."""

from __future__ import annotations

import json
import math
import statistics

import pytest

from explorer.cli import main
from explorer.costs.hardware import CHIP_ALIASES, KNOWN_CHIPS, chip_named
from explorer.model.loader import arch_info
from explorer.serving import replay
from explorer.serving.simulate import published
from explorer.serving.simulate.whatif import DEFAULTS, check_context, chip_model, tp_sizes


@pytest.fixture(scope="module")
def data():
    return published.load()


@pytest.fixture(scope="module")
def llama8b():
    return arch_info("arch:llama-3.1-8b", "bfloat16")


# --- the data ---------------------------------------------------------------------------------


def test_published_runs_cover_models_chips_and_both_load_kinds(data):
    points = data["points"]
    assert len(points) >= 20
    assert len({p["model"] for p in points}) >= 2
    assert len({p["chip"] for p in points}) >= 2
    rate = [p for p in points if p["workload"].get("request_rate")]
    closed = [p for p in points if p["workload"].get("max_concurrency")]
    assert rate and closed
    # several engines (each run's version: load() checks it), NVIDIA and AMD chips, some p99 TTFT
    assert {p["engine"].split()[0] for p in points} >= {"vLLM", "SGLang", "TensorRT-LLM"}
    assert {"h100", "mi300x"} <= {p["chip"] for p in points}
    assert any("p99_ttft_ms" in p["measured"] for p in points)
    for p in points:
        chip_named(p["chip"])  # every chip is in the table
        src = data["sources"][p["source"]]
        assert src.get("url") or (src["repo"] and src["path"] and len(src["commit"]) == 40)
        assert src["checked"]  # whether, and how, the numbers were checked


def test_fit_and_held_out_sources_are_disjoint_and_both_present(data):
    sources = {p["source"] for p in data["points"]}
    assert set(published.FIT_SOURCES) < sources
    assert sources - set(published.FIT_SOURCES)


def test_a_point_missing_its_workload_names_the_key(tmp_path, data):
    point = dict(data["points"][0])
    point.pop("workload")
    path = tmp_path / "runs.json"
    path.write_text(json.dumps({"sources": data["sources"], "points": [point]}))
    with pytest.raises(ValueError, match="missing workload"):
        published.load(path)
    point["workload"] = {"kind": "stats", "num_prompts": 10, "input_mean": 200}
    path.write_text(json.dumps({"sources": data["sources"], "points": [point]}))
    with pytest.raises(ValueError, match="output_mean, spread"):
        published.load(path)


def test_stored_comparison_matches_the_runs_file_and_the_defaults():
    s = published.validation_summary(compute=False)
    assert s is not None, "run `explorer bench simulate --published --save` after changing them"
    assert s["settings"]["bw_efficiency"] == DEFAULTS["bw_efficiency"]
    metrics = {x["metric"]: x for x in s["summary"]}
    for m in ("output_throughput", "median_tpot_ms", "median_ttft_ms"):
        assert metrics[m]["n_fitted"] and metrics[m]["n_held_out"]
    assert "held out" in published.summary_text(s)


def test_one_published_point_simulates_with_an_error_per_metric(data):
    point = next(p for p in data["points"] if p["id"] == "S9-qwen3-8b-h100-conc1")
    rows = published.errors(point, published.simulate_point(point), 0.05)
    assert {r["metric"] for r in rows} == set(point["measured"])
    for r in rows:
        assert r["error_pct"] == pytest.approx(
            (r["simulated"] - r["measured"]) / r["measured"] * 100
        )


def test_summary_splits_fitted_from_held_out():
    rows = [
        {"metric": "median_tpot_ms", "split": "fitted", "error_pct": e} for e in (-10, 20, 5)
    ] + [{"metric": "median_tpot_ms", "split": "held out", "error_pct": -30}]
    (line,) = published.summary(rows)
    assert line["fitted"] == 10 and line["held_out"] == 30 and line["n_fitted"] == 3


# --- workloads from published lengths ---------------------------------------------------------


def test_replay_keeps_each_requests_lengths_and_the_files_load():
    result = {"input_lens": [10, 300, 42], "output_lens": [5, 0, 17], "max_concurrency": 2}
    wl, reqs = replay.replay_result(result)
    assert [(len(r.prompt_ids), r.max_tokens) for r in reqs] == [(10, 5), (42, 17)]
    assert wl.max_concurrency == 2 and wl.arrival == "burst"
    wl, reqs = replay.replay_result({**result, "request_rate": 4.0})
    assert wl.arrival == "poisson" and reqs[1].arrival_s > 0


def test_replay_of_a_file_without_lengths_names_the_missing_key():
    with pytest.raises(ValueError, match="no output_lens"):
        replay.replay_result({"input_lens": [1]}, where="r.json")


def test_lengths_from_statistics_have_the_published_means():
    _, reqs = replay.from_stats(2000, input_mean=217, output_mean=194, spread=1.0, input_max=1024)
    assert statistics.fmean(len(r.prompt_ids) for r in reqs) == pytest.approx(217, rel=0.02)
    assert statistics.fmean(r.max_tokens for r in reqs) == pytest.approx(194, rel=0.02)
    assert max(len(r.prompt_ids) for r in reqs) <= 1024
    with pytest.raises(ValueError, match="input_mean"):
        replay.from_stats(3, input_mean=math.nan, output_mean=10)


# --- FP8, the chip table ----------------------------------------------------------------------


def test_fp8_weights_and_kv_halve_the_bytes_and_use_the_fp8_flops(llama8b):
    bf16, bf16_extra = chip_model(llama8b, "h100")
    fp8, fp8_extra = chip_model(llama8b, "h100", dtype="fp8", kv_dtype="fp8")
    assert (
        fp8.tflops == KNOWN_CHIPS["H100 SXM"].fp8_tflops == pytest.approx(2 * bf16.tflops, rel=0.01)
    )
    assert fp8.kv_bytes_per_token == bf16.kv_bytes_per_token / 2
    assert 0.5 < fp8.weight_bytes / bf16.weight_bytes < 0.6  # embeddings and lm_head stay 16-bit
    assert fp8_extra["knobs"]["num_blocks"] > 2 * bf16_extra["knobs"]["num_blocks"]
    kv_only, _ = chip_model(llama8b, "h100", kv_dtype="fp8")
    assert kv_only.weight_bytes == bf16.weight_bytes and kv_only.tflops == bf16.tflops


def test_a_dtype_or_chip_the_table_lacks_lists_the_known_ones(llama8b):
    with pytest.raises(ValueError, match="known dtypes for it: float32, bfloat16, float16"):
        chip_model(llama8b, "a100", dtype="fp8")
    with pytest.raises(ValueError, match="known: .*fp8"):
        chip_model(llama8b, "h100", dtype="int8")
    with pytest.raises(ValueError, match="known: .*a100-40gb"):
        chip_model(llama8b, "tpu-v9")


def test_every_chip_is_one_table_entry():
    assert chip_named("a100-40gb").memory_gb == 40
    for alias, name in CHIP_ALIASES.items():
        assert chip_named(alias) is KNOWN_CHIPS[name] is chip_named(name)
    from explorer.app.tabs.capacity import _chips

    assert set(_chips()) <= set(CHIP_ALIASES) and "a100-40gb" in _chips()


# --- every what-if setting checked ------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("bw_efficiency", 0),
        ("bw_efficiency", 1.5),
        ("bw_efficiency", math.nan),
        ("flop_efficiency", -1),
        ("flop_efficiency", math.inf),
        ("iteration_overhead_s", -1e-3),
        ("request_latency_s", math.nan),
        ("gpu_memory_utilization", 0),
        ("max_batch_tokens", 0),
        ("max_batch", 0),
        ("page_size", 2.5),
    ],
)
def test_out_of_range_what_if_settings_are_refused_naming_the_field(llama8b, name, value):
    with pytest.raises(ValueError, match=f"what-if setting {name} must be"):
        chip_model(llama8b, "h100", **{name: value})


def test_a_prompt_past_the_context_is_refused(llama8b):
    _, reqs = replay.from_stats(1, input_mean=200_000, output_mean=10)
    with pytest.raises(
        ValueError, match="more than arch:llama-3.1-8b's context of 131,072 positions"
    ):
        check_context(llama8b, reqs)


def test_a_model_that_does_not_fit_suggests_a_tp_that_fits_and_divides_the_heads():
    info = arch_info("arch:llama-3.1-70b", "bfloat16")
    with pytest.raises(ValueError, match=r"try --tp (\d+)") as err:
        chip_model(info, "h100", 1)
    tp = int(err.value.args[0].rsplit("--tp ", 1)[1].split(")")[0])
    assert tp in tp_sizes(__import__("explorer.costs.parts", fromlist=["x"]).shape_of(info))
    chip_model(info, "h100", tp)  # the suggestion is accepted
    with pytest.raises(ValueError, match="sizes that do: 1, 2, 4, 8"):
        chip_model(info, "h100", 3)


def test_cli_refuses_bad_what_if_input_in_one_line(capsys):
    args = ["simulate", "--model", "arch:llama-3.1-8b", "--hardware", "h100", "--num-prompts", "2"]
    assert main([*args, "--bw-efficiency", "0"]) == 2
    assert "bw_efficiency must be" in capsys.readouterr().err
    assert main([*args, "--dtype", "int8"]) == 2
    assert "unknown dtype 'int8'" in capsys.readouterr().err


def test_cli_simulates_fp8_on_a_chip_and_shows_the_published_error(capsys):
    args = ["simulate", "--model", "arch:llama-3.1-8b", "--hardware", "h100", "--num-prompts", "4"]
    assert main([*args, "--dtype", "fp8", "--kv-dtype", "fp8", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["error_vs_published"] and out["output_throughput"] > 0
    assert any("weights fp8, KV cache fp8" in a for a in out["assumptions"])


def test_cli_refuses_a_prompt_past_the_models_context(capsys):
    args = ["simulate", "--model", "arch:llama-3.1-8b", "--hardware", "h100", "--num-prompts", "1"]
    assert main([*args, "--input-len", "200000", "--output-len", "8"]) == 2
    assert "more than arch:llama-3.1-8b's context of 131,072 positions" in capsys.readouterr().err
