"""What-if on other hardware, on paper: a known chip, N GPUs in tensor parallel, the same simulator.

Every figure here is modelled. One iteration on a chip (ChipStepModel, CHIP_RULE):

    seconds = max(bytes per GPU / (bandwidth x bw_efficiency), FLOPs per GPU / (FLOP/s x
              flop_efficiency)) + iteration overhead + TP all-reduces

Tensor parallelism over N GPUs splits every weight and the KV cache N ways (heads and KV heads must
divide by N) and adds two all-reduces per layer (after attention and after the MLP), each moving
2 (N - 1) / N x tokens x hidden x bytes over the interconnect (the chip table's per-direction
figure) plus a fixed latency. The KV budget is what is left of gpu_memory_utilization x memory
after the weights and an activation reserve; it sets the paged cache's blocks, so it decides the
largest batch. Default efficiencies are round figures from public measurements (decode on vLLM /
TensorRT-LLM reaches roughly 70-80% of HBM bandwidth; large prefills 50-70% of dense peak): edit
them, and compare against a measured result (vllm bench serve's JSON) wherever one exists.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from explorer.costs.hardware import KNOWN_CHIPS, Chip
from explorer.costs.parts import Shape, shape_of
from explorer.serving.simulate.steptime import StepModel, iteration_work

CHIP_RULE = (
    "seconds = max(bytes per GPU / (bandwidth x bw_efficiency), FLOPs per GPU / (FLOP/s x "
    "flop_efficiency)) + iteration overhead + 2 all-reduces per layer (2 (N-1)/N x tokens x hidden "
    "x bytes / interconnect + latency)"
)
DEFAULTS = {
    "bw_efficiency": 0.75,
    "flop_efficiency": 0.6,
    "iteration_overhead_s": 0.5e-3,  # scheduler + launch per iteration with CUDA graphs
    "allreduce_latency_s": 10e-6,
    "gpu_memory_utilization": 0.9,  # vLLM's default
    "activation_reserve_gb": 2.0,
    "page_size": 16,  # vLLM's default block size
    "max_batch_tokens": 8192,  # vLLM's default max_num_batched_tokens for chunked prefill
}
ALIASES = {
    "h100": "H100 SXM",
    "h200": "H200",
    "a100": "A100 80GB",
    "l4": "L4",
    "t4": "T4",
    "mi300x": "MI300X",
    "4090": "RTX 4090",
    "m2": "Apple M2",
    "m2-max": "Apple M2 Max",
    "m3-max": "Apple M3 Max",
}


def chip_named(name: str) -> Chip:
    key = ALIASES.get(name.lower(), name)
    if key not in KNOWN_CHIPS:
        known = ", ".join(sorted(set(ALIASES) | set(KNOWN_CHIPS)))
        raise ValueError(f"unknown chip {name!r}; known: {known}")
    return KNOWN_CHIPS[key]


def _tflops(chip: Chip, dtype: str) -> float:
    if dtype in ("bfloat16", "bf16"):
        value = chip.bf16_tflops
    elif dtype in ("float16", "fp16"):
        value = chip.fp16_tflops
    else:
        value = chip.fp32_tflops
    if value is None:
        raise ValueError(f"{chip.name} has no {dtype} matrix figure in the chip table")
    return value


def check_tp(shape: Shape, chip: Chip, tp: int) -> None:
    if not isinstance(tp, int) or tp < 1:
        raise ValueError(f"--tp must be a whole number >= 1, got {tp!r}")
    if tp == 1:
        return
    bad = [f"{n} {v}" for n, v in (("heads", shape.heads), ("KV heads", shape.kv_heads)) if v % tp]
    if bad:
        raise ValueError(f"tensor parallel {tp} does not divide the model's {' and '.join(bad)}")
    if not chip.interconnect_gbps:
        raise ValueError(
            f"{chip.name} has no GPU-to-GPU interconnect figure: tensor parallel is not modelled"
        )


@dataclass
class ChipStepModel(StepModel):
    """StepModel on paper for `tp` x `chip` (see CHIP_RULE); method 'modelled'."""

    chip: str = ""
    tp: int = 1
    bandwidth_gbps: float = 0.0
    tflops: float = 0.0
    interconnect_gbps: float | None = None
    settings: dict = field(default_factory=dict)

    def seconds(self, shape: Shape, passes: list[list[int]]) -> float:
        w = iteration_work(shape, passes)
        s = self.settings
        memory = w["bytes"] / self.tp / (self.bandwidth_gbps * 1e9 * s["bw_efficiency"])
        compute = w["flops"] / self.tp / (self.tflops * 1e12 * s["flop_efficiency"])
        return max(memory, compute) + self.iteration_s + self.allreduce_s(shape, w)

    def allreduce_s(self, shape: Shape, work: dict) -> float:
        if self.tp == 1:
            return 0.0
        moved = 2 * (self.tp - 1) / self.tp * work["tokens"] * shape.hidden * shape.bytes_per_value
        one = moved / (self.interconnect_gbps * 1e9) + self.settings["allreduce_latency_s"]
        return 2 * shape.layers * one


def memory_plan(info, chip: Chip, tp: int, settings: dict) -> dict:
    """Weights and KV per GPU, and the paged KV budget; refuses a model that cannot fit."""
    shape = shape_of(info)
    weights = info.weight_bytes  # the real tensors' bytes (embedding table included)
    per_gpu = weights / tp
    usable = chip.memory_gb * 1e9 * settings["gpu_memory_utilization"]
    free = usable - per_gpu - settings["activation_reserve_gb"] * 1e9
    kv_token = shape.kv_bytes_per_token / tp
    if free < kv_token * settings["page_size"]:
        need_gpus = math.ceil(
            (weights + settings["activation_reserve_gb"] * 1e9 * tp)
            / (chip.memory_gb * 1e9 * settings["gpu_memory_utilization"])
        )
        raise ValueError(
            f"{info.name} ({info.dtype}) needs {weights / 1e9:.1f} GB of weights, "
            f"{per_gpu / 1e9:.1f} GB per GPU at tp={tp}: more than {chip.name}'s "
            f"{chip.memory_gb:.0f} GB x {settings['gpu_memory_utilization']} leaves for weights, "
            f"activations and KV even at batch 1 (try --tp {max(need_gpus, tp + 1)} or more)"
        )
    tokens = int(free // kv_token)
    return {
        "weights_gb": weights / 1e9,
        "weights_per_gpu_gb": per_gpu / 1e9,
        "kv_budget_gb_per_gpu": free / 1e9,
        "kv_tokens": tokens,
        "num_blocks": tokens // settings["page_size"],
    }


def chip_model(info, chip_name: str, tp: int = 1, **overrides) -> tuple[ChipStepModel, dict]:
    """(the on-paper step model, the engine knobs it implies: the KV blocks from memory)."""
    unknown = set(overrides) - set(DEFAULTS)
    if unknown:
        raise ValueError(
            f"unknown what-if setting {', '.join(sorted(unknown))}; known: {', '.join(DEFAULTS)}"
        )
    settings = {**DEFAULTS, **overrides}
    chip = chip_named(chip_name)
    shape = shape_of(info)
    check_tp(shape, chip, tp)
    plan = memory_plan(info, chip, tp, settings)
    model = ChipStepModel(
        s_per_byte=0.0,  # unused: the chip's peaks x efficiencies set the speeds (CHIP_RULE)
        s_per_flop=0.0,
        iteration_s=settings["iteration_overhead_s"],
        request_s=0.0,
        token_s=0.0,
        method="modelled",
        rule=CHIP_RULE,
        key={"model": info.name, "dtype": info.dtype, "device": f"{tp}x {chip.name} (modelled)"},
        chip=chip.name,
        tp=tp,
        bandwidth_gbps=chip.bandwidth_gbps,
        tflops=_tflops(chip, info.dtype),
        interconnect_gbps=chip.interconnect_gbps,
        settings=settings,
    )
    model.assumptions = assumptions(info, chip, tp, settings, plan)
    knobs = {
        "num_blocks": plan["num_blocks"],
        "page_size": settings["page_size"],
        "max_batch_tokens": settings["max_batch_tokens"],
    }
    return model, {"knobs": knobs, "memory": plan}


def assumptions(info, chip: Chip, tp: int, s: dict, plan: dict) -> list[str]:
    out = [
        f"modelled, nothing measured: {tp} x {chip.name} ({chip.source})",
        f"{chip.bandwidth_gbps:.0f} GB/s x {s['bw_efficiency']:.0%} bandwidth efficiency, "
        f"{_tflops(chip, info.dtype):.0f} TFLOP/s {info.dtype} x {s['flop_efficiency']:.0%} FLOP "
        f"efficiency, {s['iteration_overhead_s'] * 1e3:.2f} ms overhead per iteration",
        f"weights {plan['weights_gb']:.1f} GB ({plan['weights_per_gpu_gb']:.1f} GB per GPU); KV "
        f"budget {plan['kv_budget_gb_per_gpu']:.1f} GB per GPU = {plan['kv_tokens']:,} tokens "
        f"({s['gpu_memory_utilization']:.0%} of {chip.memory_gb:.0f} GB, "
        f"{s['activation_reserve_gb']:.1f} GB activation reserve)",
        f"scheduler: continuous batching, FIFO, chunked prefill under {s['max_batch_tokens']} "
        f"tokens per iteration, {s['page_size']}-token KV blocks",
    ]
    if tp > 1:
        out.append(
            f"tensor parallel {tp}: weights and KV split {tp} ways; 2 all-reduces per layer over "
            f"{chip.interconnect} at {chip.interconnect_gbps:.0f} GB/s + "
            f"{s['allreduce_latency_s'] * 1e6:.0f} us each"
        )
    return out


def simulate_measured(info, path, chip: str, tp: int = 1, **overrides) -> list[dict]:
    """The model's error against a measured result file (vllm bench serve --save-result, or
    ours): its workload (request count, rate, median prompt and output lengths) simulated on
    `tp` x `chip`; rows as explorer.serving.simulate.validate.compare makes them."""
    import statistics

    from explorer.serving.metrics import load_result
    from explorer.serving.simulate.run import simulate
    from explorer.serving.simulate.validate import compare
    from explorer.serving.workload import Workload

    measured = load_result(path)
    rate = measured.get("request_rate")
    rate = None if rate in (None, "inf", float("inf")) else float(rate)
    wl = Workload(
        num_prompts=int(measured["completed"]),
        arrival="poisson" if rate else "burst",
        request_rate=rate,
        max_concurrency=measured.get("max_concurrency"),
        input_len=max(1, round(statistics.median(measured["input_lens"]))),
        output_len=max(2, round(statistics.median(measured["output_lens"]))),
    )
    model, extra = chip_model(info, chip, tp, **overrides)
    sim = simulate(info, wl, "continuous", model, **extra["knobs"])
    return compare(info.name, str(path), measured, sim.result)
