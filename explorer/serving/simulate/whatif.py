"""What-if on other hardware, on paper: a known chip, N GPUs in tensor parallel, the same simulator.

Every figure here is modelled. One iteration on a chip (ChipStepModel, CHIP_RULE):

    seconds = max(bytes per GPU / (bandwidth x bw_efficiency), FLOPs per GPU / (FLOP/s x
              flop_efficiency)) + iteration overhead + requests x sequence overhead
              + TP all-reduces;  TTFT and E2E of each request + a fixed request latency

Tensor parallelism over N GPUs splits every weight and the KV cache N ways (heads and KV heads must
divide by N) and adds two all-reduces per layer (after attention and after the MLP), each moving
2 (N - 1) / N x tokens x hidden x bytes over the interconnect (the chip table's per-direction
figure) plus a fixed latency. The KV budget is what is left of gpu_memory_utilization x memory
(a GPU's "80 GB" is GiB) after the weights and an activation reserve; it sets the paged cache's
blocks, so it decides the largest batch. A mixture of experts reads, each iteration, only the
experts its tokens touch (E x (1 - (1 - k/E)^tokens) per MoE layer, uniform routing) and computes
k experts per token; with expert parallelism (expert_parallel=True) each of the N GPUs holds E/N
whole experts instead of a 1/N slice of every one (E must divide by N; moe_assumptions). Weights
and KV cache may be FP8 (--dtype fp8: the matmul weights at 1 byte and the chip's FP8 FLOP/s;
--kv-dtype fp8: half the KV bytes, int8 / int4 with their group scales, explorer.costs.kvdtype:
more tokens fit the same budget). The
default efficiencies and overheads were fitted to published GPU runs, and their error against
those runs (fitted and held out) is shown beside every answer
(explorer.serving.simulate.published); edit them, and compare against a measured result
(vllm bench serve's JSON) wherever one exists.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from explorer.costs.hardware import DTYPE_BYTES, Chip, chip_dtype, chip_named
from explorer.costs.kvdtype import KV_DTYPES, kv_dtype_name
from explorer.costs.parts import Shape, shape_of
from explorer.serving.engines import check_context
from explorer.serving.simulate.steptime import StepModel

CHIP_RULE = (
    "seconds = max(bytes per GPU / (bandwidth x bw_efficiency), FLOPs per GPU / (FLOP/s x "
    "flop_efficiency)) + iteration overhead + requests x sequence overhead + 2 all-reduces per layer (2 (N-1)/N x tokens x hidden "
    "x bytes / interconnect + latency); each request's TTFT and E2E + a fixed request latency"
)
# The efficiencies and overheads were fitted (rounded) to the published runs of sources S3 and S9
# (vLLM 0.11 / 0.19 through `vllm bench serve`; `explorer bench simulate --published --fit`,
# assets/published/); the other sources are held out. The rest are vLLM's defaults.
DEFAULTS = {
    "bw_efficiency": 0.57,
    "flop_efficiency": 0.4,
    "iteration_overhead_s": 0.0,  # per iteration (fitted 0: CUDA graphs, async scheduling)
    "sequence_overhead_s": 0.0,  # per request in an iteration (not fitted: see published.py)
    "request_latency_s": 0.053,  # per request outside the engine: HTTP, tokenising, streaming
    "allreduce_latency_s": 10e-6,
    "gpu_memory_utilization": 0.9,  # vLLM's default
    "activation_reserve_gb": 2.0,
    "page_size": 16,  # vLLM's default block size
    "max_batch_tokens": 8192,  # vLLM's default max_num_batched_tokens for chunked prefill
    "max_batch": 256,  # vLLM's default max_num_seqs: requests per iteration at most
}
# (lowest, highest, whether the lowest is allowed) per setting; whole numbers where int
RANGES = {
    "bw_efficiency": (0.0, 1.0, False),
    "flop_efficiency": (0.0, 1.0, False),
    "iteration_overhead_s": (0.0, math.inf, True),
    "sequence_overhead_s": (0.0, math.inf, True),
    "request_latency_s": (0.0, math.inf, True),
    "allreduce_latency_s": (0.0, math.inf, True),
    "gpu_memory_utilization": (0.0, 1.0, False),
    "activation_reserve_gb": (0.0, math.inf, True),
    "page_size": (1, math.inf, True),
    "max_batch_tokens": (1, math.inf, True),
    "max_batch": (1, math.inf, True),
}
WHOLE = ("page_size", "max_batch_tokens", "max_batch")


def check_settings(settings: dict) -> None:
    """Refuse, in one line naming the field, a what-if setting out of its range (nan, inf too)."""
    for name, value in settings.items():
        if name not in RANGES:
            raise ValueError(f"unknown what-if setting {name!r}; known: {', '.join(DEFAULTS)}")
        low, high, low_ok = RANGES[name]
        whole = name in WHOLE
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        ok = ok and math.isfinite(value) and (not whole or float(value).is_integer())
        ok = ok and (value >= low if low_ok else value > low) and value <= high
        if not ok:
            lo = f">= {low}" if low_ok else f"> {low}"
            hi = "" if high == math.inf else f" and <= {high}"
            kind = "a whole number" if whole else "a finite number"
            raise ValueError(f"what-if setting {name} must be {kind} {lo}{hi}, got {value!r}")


def check_tp(shape: Shape, chip: Chip, tp: int) -> None:
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise ValueError(f"--tp must be a whole number >= 1, got {tp!r}")
    if tp == 1:
        return
    bad = [f"{n} {v}" for n, v in (("heads", shape.heads), ("KV heads", shape.kv_heads)) if v % tp]
    if bad:
        raise ValueError(
            f"tensor parallel {tp} does not divide the model's {' and '.join(bad)}; "
            f"sizes that do: {', '.join(map(str, tp_sizes(shape)))}"
        )
    if not chip.interconnect_gbps:
        raise ValueError(
            f"{chip.name} has no GPU-to-GPU interconnect figure: tensor parallel is not modelled"
        )


def tp_sizes(shape: Shape) -> list[int]:
    """Tensor-parallel sizes that divide both the heads and the KV heads."""
    return [
        n for n in range(1, shape.heads + 1) if shape.heads % n == 0 and shape.kv_heads % n == 0
    ]


@dataclass
class ChipStepModel(StepModel):
    """StepModel on paper for `tp` x `chip` (see CHIP_RULE); method 'modelled'."""

    chip: str = ""
    tp: int = 1
    bandwidth_gbps: float = 0.0
    tflops: float = 0.0
    interconnect_gbps: float | None = None
    weight_bytes: float = 0.0  # every weight once (fp8 matmuls: 1 byte per value)
    expert_bytes: float = 0.0  # one routed expert of one layer (MoE; 0: dense)
    expert_parallel: bool = False  # MoE: experts split whole across the GPUs (bytes as TP's)
    kv_bytes_per_token: float = 0.0  # K and V of one token, all layers, at the KV dtype
    act_bytes: int = 2  # bytes per activation value moved by the all-reduces
    request_latency_s: float = 0.0  # added to each request's TTFT and E2E (see run.simulate)
    settings: dict = field(default_factory=dict)

    def seconds(self, shape: Shape, passes: list[list[int]]) -> float:
        w = chip_work(shape, passes, self.weight_bytes, self.kv_bytes_per_token, self.expert_bytes)
        s = self.settings
        memory = w["bytes"] / self.tp / (self.bandwidth_gbps * 1e9 * s["bw_efficiency"])
        compute = w["flops"] / self.tp / (self.tflops * 1e12 * s["flop_efficiency"])
        overhead = self.iteration_s + self.request_s * len(passes)
        return max(memory, compute) + overhead + self.allreduce_s(shape, w)

    def allreduce_s(self, shape: Shape, work: dict) -> float:
        if self.tp == 1:
            return 0.0
        moved = 2 * (self.tp - 1) / self.tp * work["tokens"] * shape.hidden * self.act_bytes
        one = moved / (self.interconnect_gbps * 1e9) + self.settings["allreduce_latency_s"]
        return 2 * shape.layers * one


def chip_work(
    shape: Shape, passes, weight_bytes: float, kv_per_token: float, expert_bytes: float = 0.0
) -> dict:
    """Bytes and FLOPs of one iteration, in closed form (the same sums as
    steptime.iteration_work, at the what-if's weight and KV bytes): every weight once (a mixture
    of experts: the experts its tokens touch, weights_read), K/V read for each pass's
    past and written for its query; 2 FLOPs per matmul weight a token uses (k experts) per query
    token, 4 x heads x head_dim per query x key pair per layer, one logit row per pass."""
    query = past = pairs = 0
    for q, p in passes:
        query += q
        past += p
        pairs += q * (p + q)
    per_token = 2.0 * shape.matmul_params_per_token
    flops = (
        per_token * query
        + 4.0 * shape.layers * shape.heads * shape.head_dim * pairs
        + 2.0 * len(passes) * shape.hidden * shape.vocab
    )
    return {
        "bytes": weights_read(shape, query, weight_bytes, expert_bytes)
        + kv_per_token * (past + query),
        "flops": flops,
        "tokens": float(query),
    }


def weights_read(shape: Shape, tokens: int, weights: float, one_expert: float) -> float:
    """Weight bytes an iteration of `tokens` tokens reads, at the what-if's bytes per value:
    `weights` (every weight once) for a
    dense model; for a mixture of experts the routed experts it does not touch are taken out,
    E x (1 - (1 - k/E)^tokens) touched per MoE layer for uniform routing (one_expert: the bytes
    of one expert of one layer)."""
    if not shape.is_moe:
        return weights
    idle = shape.experts - shape.experts_touched(tokens)
    return weights - shape.moe_layers * idle * one_expert


@dataclass(frozen=True)
class Precision:
    """What the what-if stores and computes in: weights (and the matmuls' FLOP/s) and the KV cache."""

    dtype: str = "bfloat16"  # weights; "fp8": matmul weights 1 byte, FP8 tensor-core FLOP/s
    kv_dtype: str | None = None  # None: the weights' (bf16 activations for fp8 weights)

    def kv(self) -> str:
        if self.kv_dtype is not None:
            return kv_dtype_name(self.kv_dtype)  # fp8, int8, int4, ... (explorer.costs.kvdtype)
        return "bfloat16" if chip_dtype(self.dtype) == "fp8" else chip_dtype(self.dtype)


def model_bytes(info, precision: Precision) -> tuple[float, float, float]:
    """(weight bytes as stored, weight bytes one iteration reads, KV bytes per token) of `info`
    at `precision`. FP8 weights store the attention and MLP matrices at 1 byte per value and the
    embeddings, norms and lm_head at 16 bits (as FP8 checkpoints such as
    nvidia/Llama-3.1-8B-Instruct-FP8 do). An iteration reads every weight except the input
    embedding table, of which it gathers a few rows (explorer.costs.parts)."""
    shape = shape_of(info)
    dtype = chip_dtype(precision.dtype)
    matmul = shape.matmul_params
    parts = shape.weight_bytes_by_part()
    read = sum(parts.values()) * DTYPE_BYTES[dtype] / shape.bytes_per_value
    stored = info.parameters * DTYPE_BYTES[dtype]
    if dtype == "fp8":  # the matmuls at 1 byte, the rest at 2
        read = (sum(parts.values()) / shape.bytes_per_value - matmul) * 2 + matmul
        stored = (info.parameters - matmul) * 2 + matmul
    kv = 2 * shape.layers * shape.kv_heads * shape.head_dim * KV_DTYPES[precision.kv()]
    return float(stored), float(read), float(kv)


def one_expert_bytes(shape: Shape, precision: Precision) -> float:
    """Bytes of one routed expert of one layer at `precision` (FP8: its matrices at 1 byte, its
    biases at 2); 0 for a dense model."""
    if not shape.is_moe:
        return 0.0
    dtype = chip_dtype(precision.dtype)
    if dtype == "fp8":
        return float(
            shape.expert_matmul_params + 2 * (shape.expert_params - shape.expert_matmul_params)
        )
    return float(shape.expert_params * DTYPE_BYTES[dtype])


def check_expert_parallel(shape: Shape, tp: int, expert_parallel: bool) -> None:
    """Expert parallelism needs a mixture of experts whose E experts divide by the GPUs."""
    if not expert_parallel:
        return
    if not shape.is_moe:
        raise ValueError("expert parallel: the model is dense (no experts to split across GPUs)")
    if shape.experts % tp:
        fit = [n for n in tp_sizes(shape) if shape.experts % n == 0]
        raise ValueError(
            f"expert parallel over {tp} GPUs does not divide the model's {shape.experts} experts "
            f"per layer; GPU counts that divide them and the heads: {', '.join(map(str, fit))}"
        )


def reserved_per_gpu(weights: float, kv_bytes_per_token: float, tp: int, settings: dict) -> dict:
    """What each of `tp` GPUs holds: its share of the weights, the activation reserve, and the KV
    budget left of gpu_memory_utilization x memory (bytes; kv_tokens per GPU share)."""
    per_gpu = weights / tp
    reserve = settings["activation_reserve_gb"] * 1e9
    return {"weights": per_gpu, "reserve": reserve, "kv_bytes_per_token": kv_bytes_per_token / tp}


def chip_bytes(chip: Chip) -> float:
    """The chip's memory in bytes: a GPU's "80 GB" is 80 GiB (an H100 shows 81,559 MiB)."""
    return chip.memory_gb * 2**30


def fits(chip: Chip, weights: float, kv_bytes_per_token: float, tp: int, settings: dict) -> bool:
    r = reserved_per_gpu(weights, kv_bytes_per_token, tp, settings)
    usable = chip_bytes(chip) * settings["gpu_memory_utilization"]
    return usable - r["weights"] - r["reserve"] >= r["kv_bytes_per_token"] * settings["page_size"]


def suggest_tp(shape: Shape, chip: Chip, weights: float, kv_bytes_per_token: float, settings: dict):
    """The smallest tensor-parallel size that divides the heads and KV heads and whose GPUs each
    hold their weights, the activation reserve and at least one KV block (None: none does)."""
    for n in tp_sizes(shape):
        if fits(chip, weights, kv_bytes_per_token, n, settings):
            return n
    return None


def memory_plan(info, chip: Chip, tp: int, settings: dict, precision: Precision) -> dict:
    """Weights and KV per GPU, and the paged KV budget; refuses a model that cannot fit."""
    shape = shape_of(info)
    weights, _, kv_bytes_per_token = model_bytes(info, precision)
    r = reserved_per_gpu(weights, kv_bytes_per_token, tp, settings)
    usable = chip_bytes(chip) * settings["gpu_memory_utilization"]
    free = usable - r["weights"] - r["reserve"]
    if free < r["kv_bytes_per_token"] * settings["page_size"]:
        n = suggest_tp(shape, chip, weights, kv_bytes_per_token, settings)
        hint = f"try --tp {n}" if n else "no tensor-parallel size that divides the heads fits it"
        raise ValueError(
            f"{info.name} ({precision.dtype}) needs {weights / 1e9:.1f} GB of weights, "
            f"{r['weights'] / 1e9:.1f} GB per GPU at tp={tp}: more than {chip.name}'s "
            f"{chip.memory_gb:.0f} GiB x {settings['gpu_memory_utilization']} leaves for weights, "
            f"a {settings['activation_reserve_gb']:.1f} GB activation reserve and one KV block "
            f"({hint})"
        )
    tokens = int(free // r["kv_bytes_per_token"])
    return {
        "weights_gb": weights / 1e9,
        "weights_per_gpu_gb": r["weights"] / 1e9,
        "kv_budget_gb_per_gpu": free / 1e9,
        "kv_tokens": tokens,
        "kv_bytes_per_token_per_gpu": r["kv_bytes_per_token"],
        "num_blocks": tokens // settings["page_size"],
    }


def chip_model(
    info,
    chip_name: str,
    tp: int = 1,
    *,
    dtype: str | None = None,
    kv_dtype: str | None = None,
    expert_parallel: bool = False,
    **overrides,
) -> tuple[ChipStepModel, dict]:
    """(the on-paper step model, the engine knobs it implies: the KV blocks from memory).
    dtype: the weights' ("fp8" for FP8 weights; default the model's); kv_dtype: the KV cache's;
    expert_parallel: a mixture of experts' experts split whole across the `tp` GPUs."""
    check_settings(overrides)
    settings = {**DEFAULTS, **overrides}
    chip = chip_named(chip_name)
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
        f"overhead per iteration + {s['sequence_overhead_s'] * 1e3:.3f} ms per request in it, "
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
