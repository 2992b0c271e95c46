"""One simulator core: one function gives an iteration's work, the machines time it from that
work and say what limits it, and the capacity verdict reads the very numbers the timing used."""

from __future__ import annotations

import pytest

from explorer.costs.parts import forward_flops, shape_of
from explorer.model.loader import arch_info
from explorer.serving.simulate.capacity import Setup
from explorer.serving.simulate.steptime import StepModel
from explorer.serving.simulate.whatif import DEFAULTS, chip_model
from explorer.serving.simulate.whatif_settings import WhatIf, check_replicas, check_settings
from explorer.serving.simulate.work import Footprint, iteration_work


@pytest.fixture(scope="module")
def llama8b():
    return arch_info("llama-3.1-8b", "bfloat16")


def test_the_closed_form_flops_are_the_cost_model_s(llama8b):
    shape = shape_of(llama8b)
    passes = [[1, 700], [1, 30], [300, 0], [64, 512]]
    w = iteration_work(shape, passes)
    by_pass = sum(sum(forward_flops(shape, 1, q, p + q, 1).values()) for q, p in passes)
    assert w.flops == pytest.approx(by_pass, rel=1e-12)
    kv = shape.kv_bytes_per_token * (1242 + 366)  # the past read, the query written
    assert w.bytes == pytest.approx(shape.weight_bytes_read(366) + kv)
    assert w["bytes"] == w.bytes and w.requests == 4 and w.tokens == 366


def test_the_verdict_reads_the_bytes_the_timing_used_fp8_weights_int4_kv(llama8b):
    """The issue's case: 8B on an H100, fp8 weights, int4 KV. The verdict once read the model's
    own bf16 bytes (about 20 GB for a 64-request decode step) while the timing read 9.4 GB."""
    setup = Setup(llama8b, "h100", 1, 512, 32, dtype="fp8", kv_dtype="int4")
    shape, model = shape_of(llama8b), setup.model
    decode = [[1, 576]] * 64
    timed = model.step(shape, decode).work
    # independently: fp8 matmul weights (embeddings, norms, lm_head 16-bit) + int4 K/V + scales
    kv_int4 = 2 * 32 * 8 * 128 * (0.5 + 2 * 2 / 64)  # int4:quanto, a 16-bit scale+zero per 64
    assert model.kv_bytes_per_token == pytest.approx(kv_int4, rel=0.02)
    assert timed.bytes == pytest.approx(model.weight_bytes + 64 * 577 * kv_int4, rel=0.01)
    assert 9.0e9 < timed.bytes < 9.8e9
    assert iteration_work(shape, decode).bytes > 19e9  # what the verdict read before
    res = setup.simulated(20.0, 60, {"ttft": 500})
    verdict = setup.binding(res)
    steps = [model.step(shape, it.passes) for it in res.iterations]
    assert verdict["bytes_per_iteration"] == pytest.approx(
        sum(s.work.bytes for s in steps) / len(steps)
    )
    # the verdict's steps are the simulation's: the same seconds as each iteration ran
    for it, s in zip(res.iterations, steps):
        assert it.end_s - it.start_s == pytest.approx(s.seconds + model.gap_s, rel=1e-9)
    assert sum(verdict["bound_shares"].values()) == pytest.approx(1.0)


def test_the_chip_costs_a_mixed_step_as_one_gemm_plus_each_attention(llama8b):
    model, _ = chip_model(llama8b, "h100")
    shape, s = shape_of(llama8b), model.settings
    bw = 3350e9 * s["bw_efficiency"]
    decode, prefill = [[1, 1000]] * 32, [[512, 0]]
    alone = [model.step(shape, p) for p in (decode, prefill)]
    mixed = model.step(shape, decode + prefill)
    # the weights are read once by the fused GEMM: cheaper than two passes, dearer than either
    assert max(a.seconds for a in alone) < mixed.seconds < sum(a.seconds for a in alone)
    # a decode step is memory-bound: weights + K/V over the sustained bandwidth
    assert alone[0].limit == "memory bandwidth"
    per_step = model.iteration_s + shape.layers * s["layer_overhead_s"]  # no TP: no all-reduce
    assert alone[0].seconds == pytest.approx(alone[0].work.bytes / bw + per_step)
    # a long prompt is compute-bound
    assert model.step(shape, [[8192, 0]]).limit == "FLOPs"


def test_the_fitted_machine_says_what_limits_it_too(llama8b):
    shape = shape_of(llama8b)
    m = StepModel(s_per_byte=1e-11, s_per_flop=0.0, iteration_s=1.0, request_s=0, token_s=0)
    step = m.step(shape, [[1, 10]])
    assert step.limit == "overheads" and step.seconds == pytest.approx(
        1.0 + 1e-11 * step.work.bytes
    )
    m.iteration_s = 0.0
    assert m.step(shape, [[1, 10]]).limit == "memory bandwidth"


def test_tensor_parallel_splits_the_work_per_gpu(llama8b):
    one, _ = chip_model(llama8b, "h100", 1)
    two, _ = chip_model(llama8b, "h100", 2)
    shape, passes = shape_of(llama8b), [[1, 511]] * 16
    assert two.footprint == Footprint(one.weight_bytes, one.kv_bytes_per_token, 0.0, 2)
    assert two.step(shape, passes).work.bytes == one.step(shape, passes).work.bytes
    per_step = one.iteration_s + shape.layers * one.settings["layer_overhead_s"]  # not split
    compute_and_memory = one.step(shape, passes).seconds - per_step
    assert two.step(shape, passes).seconds - two.allreduce_s(
        shape, two.work(shape, passes)
    ) == pytest.approx(compute_and_memory / 2 + per_step)


def test_settings_are_declared_once_with_their_ranges():
    assert DEFAULTS == WhatIf().__dict__
    check_settings({"max_batch": 128.0})  # a whole float is a whole number
    with pytest.raises(ValueError, match="what-if setting bw_efficiency must be a number > 0"):
        check_settings({"bw_efficiency": 0})
    with pytest.raises(ValueError, match="--replicas must be a whole number >= 1"):
        check_replicas(0)
