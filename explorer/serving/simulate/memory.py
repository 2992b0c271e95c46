"""The memory plan of a what-if: what each GPU holds (its share of the weights, an activation
reserve, the paged KV cache in what is left) at a precision, and which GPU layouts fit.

Tensor parallelism over N GPUs splits every weight and the KV cache N ways (heads and KV heads
must divide by N); expert parallelism splits a mixture of experts' experts whole (E must divide
by N). The KV budget is what is left of gpu_memory_utilization x memory (a GPU's "80 GB" is GiB)
after the weights and an activation reserve; it sets the paged cache's blocks, so it decides the
largest batch. Weights and KV cache may be FP8 (the matmul weights at 1 byte; the embeddings,
norms and lm_head at 16 bits) and the KV cache int8 / int4 with their group scales
(explorer.costs.kvdtype): more tokens fit the same budget.
"""

from __future__ import annotations

from dataclasses import dataclass

from explorer.costs.hardware import DTYPE_BYTES, Chip, chip_dtype
from explorer.costs.kvdtype import KV_DTYPES, kv_dtype_name
from explorer.costs.parts import Shape, shape_of
from explorer.serving.simulate.work import Footprint


def tp_sizes(shape: Shape) -> list[int]:
    """Tensor-parallel sizes that divide both the heads and the KV heads."""
    return [
        n for n in range(1, shape.heads + 1) if shape.heads % n == 0 and shape.kv_heads % n == 0
    ]


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


def footprint(info, precision: Precision, tp: int = 1) -> Footprint:
    """The bytes iteration_work counts at `precision` over `tp` GPUs (explorer.serving.simulate.
    work): the weights one iteration reads, one routed expert, K and V per token."""
    shape = shape_of(info)
    _, read, kv_bytes_per_token = model_bytes(info, precision)
    return Footprint(read, kv_bytes_per_token, one_expert_bytes(shape, precision), tp)
