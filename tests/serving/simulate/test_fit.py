"""The what-if's fit (explorer.serving.simulate.fit): split by source, recovers what made the
runs, and the what-if's defaults are the values it found."""

from __future__ import annotations

import pytest

from explorer.serving.simulate import engine_map, fit, published
from explorer.serving.simulate.operators import OperatorRow
from explorer.serving.simulate.whatif_settings import (
    CHIP_FAMILIES,
    DEFAULTS,
    FAMILY_DEFAULTS,
    defaults_for,
)

TRUE = {"iteration_overhead_s": 1.5e-3, "stream_token_s": 3e-4, "request_latency_s": 0.02}
STAGE_ONE = {k: DEFAULTS[k] for k in ("bw_efficiency", "flop_efficiency", "kernel_floor_s",
                                      "layer_overhead_s", "allreduce_latency_s")}  # fmt: skip


def _point(name: str, workload: dict) -> dict:
    return {
        "id": name,
        "source": fit.TRAIN_SOURCES[0],
        "model": "arch:llama-3.1-8b",
        "chip": "h100",
        "tp": 1,
        "dtype": "bfloat16",
        "engine": "vLLM 0.11.0",
        "workload": {"kind": "fixed", "request_rate": None, **workload},
        "measured": {},
    }


def _measured_by_the_simulator(point: dict) -> dict:
    """The point with 'measured' metrics the simulator itself gives at TRUE."""
    sim = published.simulate_point(point, {**STAGE_ONE, **TRUE})
    latency_ms = TRUE["request_latency_s"] * 1e3
    measured = {m: sim[m] for m in ("output_throughput", "median_tpot_ms")}
    measured["median_ttft_ms"] = sim["median_ttft_ms"] + latency_ms
    return {**point, "measured": measured}


def test_the_split_is_by_source_never_by_point():
    points = published.load()["points"]
    train, held = fit.split(points)
    train_sources = {p["source"] for p in train}
    assert train_sources == set(fit.TRAIN_SOURCES)
    assert not train_sources & {p["source"] for p in held}
    assert len(train) + len(held) == len(points)
    light = fit.is_light(next(p for p in train if p["id"] == "S9-qwen3-8b-h100-conc1"))
    heavy = fit.is_decode_heavy(next(p for p in train if p["id"] == "S9-qwen3-14b-h100-sharegpt"))
    assert light and heavy
    assert not fit.is_decode_heavy(next(p for p in train if p["id"].endswith("h100-random-128-4")))


def test_the_fit_recovers_the_overheads_of_runs_the_simulator_made():
    light = _point("light", {"num_prompts": 4, "input_len": 64, "output_len": 16,
                             "max_concurrency": 2})  # fmt: skip
    heavy = _point("heavy", {"num_prompts": 48, "input_len": 32, "output_len": 32,
                             "max_concurrency": None})  # fmt: skip
    runs = [_measured_by_the_simulator(p) for p in (light, heavy)]
    values, terms = fit.fit_serving(runs, STAGE_ONE, {})
    assert values["iteration_overhead_s"] == pytest.approx(TRUE["iteration_overhead_s"], rel=0.05)
    assert values["stream_token_s"] == pytest.approx(TRUE["stream_token_s"], rel=0.1)
    assert values["request_latency_s"] == pytest.approx(TRUE["request_latency_s"], abs=1e-3)
    assert {t.name for t in terms} == {"iteration_overhead_s", "stream_token_s",
                                       "request_latency_s"}  # fmt: skip
    assert "light" in next(t.data for t in terms if t.name == "iteration_overhead_s")


def _row(chip: str, op_class: str, tokens: int, measured: float, floor: float) -> OperatorRow:
    return OperatorRow(op_class, op_class, chip, "m", "a", tokens, 1, 1.0, 1.0, 1.0,
                       measured, floor, floor, 0.0)  # fmt: skip


def test_stage_one_keeps_per_family_values_only_where_the_chips_differ():
    rows = []
    for chip, bw in (("A100 80GB", 0.6), ("H100 SXM", 0.9)):
        for n, measured in ((8, 0.05 / bw), (2048, 0.10 / 0.7)):
            floor_mem, floor_flop = (0.05, 0.0) if n == 8 else (0.0, 0.10)
            r = _row(chip, "mlp_up", n, measured, 0.0)
            r.memory_floor_ms, r.compute_floor_ms = floor_mem, floor_flop
            rows.append(r)
        rows += [_row(chip, c, 8, 0.004, 0.0) for c in fit.ELEMENTWISE]
        rows.append(_row(chip, "all_reduce", 0, 0.04, 0.0))
    pooled, families, terms = fit.operator_terms(rows)
    assert pooled["flop_efficiency"] == pytest.approx(0.7)
    assert families["hopper"]["bw_efficiency"] == pytest.approx(0.9)
    assert families["ampere"]["bw_efficiency"] == pytest.approx(0.6)
    assert "flop_efficiency" not in families["hopper"]  # equal on both: one value
    assert pooled["layer_overhead_s"] == pytest.approx(4 * 4e-6)


def test_the_what_if_defaults_are_the_values_the_fit_module_says():
    assert fit.FITTED, "fit.FITTED holds the last fit's values"
    for name, value in fit.FITTED.items():
        assert DEFAULTS[name] == value, name
    assert FAMILY_DEFAULTS == fit.FITTED_FAMILIES
    hopper = next(c for c, f in CHIP_FAMILIES.items() if f == "hopper")
    for name, value in FAMILY_DEFAULTS["hopper"].items():
        assert defaults_for(hopper)[name] == value
    assert defaults_for("MI300X") == DEFAULTS  # no measured family: the pooled values


def test_the_mi300x_stack_family_applies_to_vllm_v0_only_and_is_fitted_on_its_one_source():
    from explorer.serving.simulate import fit_stack
    from explorer.serving.simulate.whatif_settings import (
        STACK_DEFAULTS,
        STACK_FAMILIES,
        stack_family,
    )

    chip, policies, _ = STACK_FAMILIES["cdna3-vllm-v0"]
    assert (chip, policies) == ("MI300X", ("vllm-v0",))
    old = defaults_for("MI300X", "vllm-v0")
    assert old == {**DEFAULTS, **STACK_DEFAULTS["cdna3-vllm-v0"]} != DEFAULTS
    assert defaults_for("MI300X", "vllm") == defaults_for("MI300X") == DEFAULTS  # vLLM >= 0.8
    assert stack_family("H100 SXM", "vllm-v0") is None
    from explorer.serving.simulate.whatif import chip_model

    info = engine_map.run_shape("arch:llama-3.1-8b", "bfloat16")
    model, _ = chip_model(info, "mi300x", 1, engine="vllm-v0")  # the what-if reads it too
    assert model.settings["flop_efficiency"] == STACK_DEFAULTS["cdna3-vllm-v0"]["flop_efficiency"]
    model, _ = chip_model(info, "mi300x", 1, engine="vllm")
    assert model.settings["flop_efficiency"] == DEFAULTS["flop_efficiency"]
    mi300x_v0 = {"chip": "mi300x", "engine": "vLLM 0.6.1 (ROCm)"}
    got = fit.settings_for(mi300x_v0, dict(DEFAULTS), FAMILY_DEFAULTS)
    assert {k: got[k] for k in STACK_DEFAULTS["cdna3-vllm-v0"]} == STACK_DEFAULTS["cdna3-vllm-v0"]
    assert fit.settings_for({**mi300x_v0, "engine": "vLLM 0.10.0"}, {"x": 1}, {}) == {"x": 1}
    # split by source: S15 fits the family (a fitted source), the serving stages do not see it,
    # and the family's other runs (S13, S14 on MI300X) stay held out
    source = fit_stack.STACK_SOURCES["cdna3-vllm-v0"]
    assert source in published.FIT_SOURCES and source not in fit.TRAIN_SOURCES
    points = published.load()["points"]
    family = [p for p in points if fit_stack._family_of(p) == "cdna3-vllm-v0"]
    assert {p["source"] for p in family} == {"S13", "S14", "S15"}
    term_runs = {name: runs for name, runs, _ in fit_stack.stages(family)}
    for runs in term_runs.values():
        assert runs and {p["source"] for p in runs} <= {"S13", "S14", "S15"}
    train = [p for p in family if p["source"] == source]
    light, heavy, long = (runs for _, runs, _ in fit_stack.stages(train)[:3])
    assert [p["workload"]["num_prompts"] for p in light] == [1, 2, 4]
    assert min(p["workload"]["num_prompts"] for p in heavy) == 32
    assert {p["workload"]["input_mean"] for p in long} == {10000}


def test_offline_harnesses_have_no_api_server_and_s14_serves_llama_3_at_8k():
    """Data fixes (assets/published/sources.md): S11's benchmark_latency, S12's trtllm-bench and
    S14's run.py / benchmark_latency are offline (no request latency, no API server, as S7 and
    S8); S14's Meta-Llama-3-8B has an 8,192-token context (vLLM 0.6.1: no chunked prefill)."""
    points = published.load()["points"]
    for p in points:
        if p["source"] in ("S11", "S12", "S14"):
            assert p["what_if"]["request_latency_s"] == p["what_if"]["stream_token_s"] == 0.0
        if p["source"] == "S14" and p["chip"] == "mi300x":
            assert p["max_model_len"] == 8192


def test_sglang_and_trtllm_have_their_own_request_latency_fitted_on_s16_only():
    from explorer.serving.simulate.whatif_settings import ENGINE_DEFAULTS

    assert set(ENGINE_DEFAULTS) == set(fit.ENGINE_SOURCES) == {"sglang", "trtllm"}
    for engine, source in fit.ENGINE_SOURCES.items():
        assert source in published.FIT_SOURCES and source not in fit.TRAIN_SOURCES
        mine = ENGINE_DEFAULTS[engine]["request_latency_s"]
        assert defaults_for("H100 SXM", engine)["request_latency_s"] == mine
    assert ENGINE_DEFAULTS["sglang"]["request_latency_s"] < DEFAULTS["request_latency_s"]
    assert defaults_for("H100 SXM", "vllm")["request_latency_s"] == DEFAULTS["request_latency_s"]
    points = {p["id"]: p for p in published.load()["points"]}
    sglang = points["S1-8b-a100-sglang-rate4"]  # held out: its TTFT gets SGLang's latency
    assert published.request_latency(sglang) == ENGINE_DEFAULTS["sglang"]["request_latency_s"]
    assert (
        published.request_latency(points["S1-8b-a100-vllm-rate4"]) == DEFAULTS["request_latency_s"]
    )
    offline = next(p for p in points.values() if p["source"] == "S7")
    assert published.request_latency(offline) == 0.0  # an offline harness: no API server
    assert published.request_latency(sglang, 0.01) == 0.01  # a given value wins
