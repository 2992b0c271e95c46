"""What-if on other hardware, on paper: a known chip, N GPUs in tensor parallel, the same simulator.

Every figure here is modelled. By idea:

    work.py              one iteration's bytes and FLOPs (iteration_work), the one function the
                         step models, the capacity verdict and the tests read
    chip.py              the chip machine (ChipStepModel, CHIP_RULE): work -> seconds and what
                         limits the iteration
    memory.py            the memory plan: weights, activation reserve and KV blocks per GPU,
                         precisions (Precision), which tensor-parallel sizes fit
    whatif_settings.py   the declared settings with their ranges (WhatIf, Deployment)
    whatif.py            chip_model(): these put together; simulate_measured()

A mixture of experts reads, each iteration, only the experts its tokens touch (E x (1 - (1 -
k/E)^tokens) per MoE layer, uniform routing) and computes k experts per token; with expert
parallelism (expert_parallel=True) each of the N GPUs holds E/N whole experts instead of a 1/N
slice of every one (E must divide by N; moe_assumptions). The default efficiencies and overheads
were fitted to published GPU runs, and their error against those runs (fitted and held out) is
shown beside every answer (explorer.serving.simulate.published); edit them, and compare against
a measured result (vllm bench serve's JSON) wherever one exists.
"""

from __future__ import annotations

from explorer.costs.hardware import Chip, chip_dtype, chip_named
from explorer.costs.parts import Shape, shape_of
from explorer.serving.engines import check_context
from explorer.serving.simulate.chip import CHIP_RULE, ChipStepModel, chip_work
from explorer.serving.simulate.memory import (
    Precision,
    check_expert_parallel,
    check_tp,
    chip_bytes,
    fits,
    footprint,
    memory_plan,
    model_bytes,
    one_expert_bytes,
    reserved_per_gpu,
    suggest_tp,
    tp_sizes,
)
from explorer.serving.simulate.whatif_settings import (
    DEFAULTS,
    RANGES,
    WHOLE,
    Deployment,
    WhatIf,
    check_settings,
    defaults_for,
)
from explorer.serving.simulate.work import Footprint, weights_read

__all__ = [  # the names other modules and notebooks import from here
    "CHIP_RULE",
    "DEFAULTS",
    "RANGES",
    "WHOLE",
    "ChipStepModel",
    "Deployment",
    "Footprint",
    "Precision",
    "WhatIf",
    "check_context",
    "check_expert_parallel",
    "check_settings",
    "check_tp",
    "chip_bytes",
    "chip_model",
    "chip_work",
    "fits",
    "footprint",
    "memory_plan",
    "model_bytes",
    "one_expert_bytes",
    "reserved_per_gpu",
    "simulate_measured",
    "suggest_tp",
    "tp_sizes",
    "weights_read",
]


def chip_model(
    info,
    chip_name: str,
    tp: int = 1,
    *,
    dtype: str | None = None,
    kv_dtype: str | None = None,
    expert_parallel: bool = False,
    engine: str | None = None,
    **overrides,
) -> tuple[ChipStepModel, dict]:
    """(the on-paper step model, the engine knobs it implies: the KV blocks from memory).
    dtype: the weights' ("fp8": FP8 weights); kv_dtype: the KV cache's; expert_parallel: experts
    split whole across the `tp` GPUs; engine: the policy (its defaults_for values, if any)."""
    check_settings(overrides)
    chip = chip_named(chip_name)
    settings = {**defaults_for(chip.name, engine), **overrides}
    precision = Precision(chip_dtype(dtype or info.dtype), kv_dtype)
    precision.kv()  # refuses an unknown KV dtype
    shape = shape_of(info)
    check_expert_parallel(shape, tp, expert_parallel)
    check_tp(shape, chip, tp)
    tflops = chip.tflops(precision.dtype)
    plan = memory_plan(info, chip, tp, settings, precision)
    _, read, kv_bytes_per_token = model_bytes(info, precision)
    model = ChipStepModel(
        s_per_byte=0.0,  # unused: the chip's peaks x efficiencies set the speeds (CHIP_RULE)
        s_per_flop=0.0,
        iteration_s=settings["iteration_overhead_s"],
        request_s=settings["sequence_overhead_s"],
        token_s=0.0,
        method="modelled",
        rule=CHIP_RULE,
        key={
            "model": info.name,
            "dtype": precision.dtype,
            "kv_dtype": precision.kv(),
            "device": f"{tp}x {chip.name} (modelled)",
        },
        chip=chip.name,
        tp=tp,
        bandwidth_gbps=chip.bandwidth_gbps,
        tflops=tflops,
        interconnect_gbps=chip.interconnect_gbps,
        weight_bytes=read,
        expert_bytes=one_expert_bytes(shape, precision),
        expert_parallel=expert_parallel,
        kv_bytes_per_token=kv_bytes_per_token,
        request_latency_s=settings["request_latency_s"],
        settings=settings,
    )
    model.assumptions = assumptions(chip, tp, settings, plan, precision, tflops)
    model.assumptions += moe_assumptions(info, shape, model)
    knobs = {
        "num_blocks": plan["num_blocks"],
        "page_size": settings["page_size"],
        "max_batch_tokens": settings["max_batch_tokens"],
        "max_requests_per_batch": settings["max_batch"],
    }
    return model, {"knobs": knobs, "memory": plan}


def assumptions(chip: Chip, tp: int, s: dict, plan: dict, p: Precision, tflops: float) -> list:
    out = [
        f"modelled, nothing measured: {tp} x {chip.name} ({chip.source})",
        f"weights {p.dtype}, KV cache {p.kv()}: {chip.bandwidth_gbps:.0f} GB/s x "
        f"{s['bw_efficiency']:.0%} bandwidth efficiency, {tflops:.0f} TFLOP/s {p.dtype} x "
        f"{s['flop_efficiency']:.0%} FLOP efficiency, {s['iteration_overhead_s'] * 1e3:.2f} ms "
        f"overhead per iteration + {s['layer_overhead_s'] * 1e6:.1f} us per layer + "
        f"{s['sequence_overhead_s'] * 1e3:.3f} ms per request in it, GEMM kernels at least "
        f"{s['kernel_floor_s'] * 1e6:.1f} us each, at least {s['stream_token_s'] * 1e6:.0f} us "
        "per request per iteration in the API server, "
        f"{s['request_latency_s'] * 1e3:.1f} ms per request outside the engine",
        f"weights {plan['weights_gb']:.1f} GB ({plan['weights_per_gpu_gb']:.1f} GB per GPU); KV "
        f"budget {plan['kv_budget_gb_per_gpu']:.1f} GB per GPU = {plan['kv_tokens']:,} tokens "
        f"at {plan['kv_bytes_per_token_per_gpu'] / 1024:.1f} KiB each in {p.kv()} "
        f"({s['gpu_memory_utilization']:.0%} of {chip.memory_gb:.0f} GiB, "
        f"{s['activation_reserve_gb']:.1f} GB activation reserve)",
        f"scheduler: continuous batching, FIFO, chunked prefill under {s['max_batch_tokens']} "
        f"tokens and {s['max_batch']} requests per iteration, {s['page_size']}-token KV blocks",
    ]
    if tp > 1:
        out.append(
            f"tensor parallel {tp}: weights and KV split {tp} ways; 2 all-reduces per layer over "
            f"{chip.interconnect} at {chip.interconnect_gbps:.0f} GB/s + "
            f"{s['allreduce_latency_s'] * 1e6:.0f} us each"
        )
    return out


def moe_assumptions(info, shape: Shape, model: ChipStepModel) -> list[str]:
    """What the what-if assumes about a mixture of experts ([] for a dense model)."""
    if not shape.is_moe:
        return []
    e, k, n = shape.experts, shape.top_k, model.tp
    one, many = (shape.experts_touched(t) for t in (1, 256))
    split = (
        f"expert parallel: each of {n} GPUs holds {e // n} whole experts per layer (all-to-all "
        "modelled as the all-reduces above; the busiest GPU's extra experts are not modelled)"
        if model.expert_parallel
        else f"experts split {n} ways like every other matrix (tensor parallel)"
        if n > 1
        else "all experts on one GPU"
    )
    return [
        f"mixture of experts: {e} experts per layer in {shape.moe_layers} layers, {k} per token; "
        f"{info.active_parameters / 1e9:.1f}B of {info.parameters / 1e9:.1f}B parameters active "
        "per token (FLOPs count those only)",
        f"each iteration reads the experts its tokens touch, E x (1 - (1 - k/E)^tokens) per layer "
        f"for uniform routing: {one:.0f} at 1 token, {many:.0f} at 256 (a skewed router touches "
        "fewer at small batches, so bytes there are an upper estimate); " + split,
    ]


def simulate_measured(info, path, chip: str, tp: int = 1, **overrides) -> list[dict]:
    """The model's error against a measured result file (vllm bench serve --save-result, or
    ours): its requests replayed with their own prompt and output lengths (input_lens,
    output_lens; median lengths where the file has none) on `tp` x `chip`; rows as
    explorer.serving.simulate.validate.compare makes them."""
    from explorer.serving.metrics import load_result
    from explorer.serving.replay import replay_result
    from explorer.serving.simulate.run import simulate
    from explorer.serving.simulate.validate import compare

    measured = load_result(path)
    wl, requests = replay_result(measured, where=str(path))
    model, extra = chip_model(info, chip, tp, **overrides)
    check_context(info, requests)
    sim = simulate(info, wl, "continuous", model, requests=requests, **extra["knobs"])
    return compare(info.name, str(path), measured, sim.result)
