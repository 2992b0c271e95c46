"""Operators at a machine's roofs: each op's intensity, time and bound (modelled), on this machine's
measured peaks or a chip of the chip table, over `tp` GPUs in tensor parallel.

    time   = count x max(FLOPs / peak FLOP/s, bytes / bandwidth)   per op, per GPU
    bound  = "compute" if the FLOPs term is the larger, else "memory"

An op's bytes are everything it moves as modelled (weights, KV, its activations estimate and any
extra bytes: explorer.costs.operators), as if each op read its inputs and wrote its outputs in
memory (unfused, LLM-Viewer's convention); the bandwidth is the one the whole pass gets
(Peaks.bandwidth_for of its weight and KV bytes: cache speed when the pass fits the last-level
cache). So the ops' times add up to at least the pass's roofline bound, never less. Tensor
parallel over N GPUs splits every op's FLOPs and bytes N ways (heads and KV heads must divide by
N) and adds two all-reduces per layer (after o_proj and after the MLP), each 2 (N-1)/N x tokens x
hidden x 2 bytes over the chip's interconnect plus 10 us (explorer.serving.simulate.whatif's rule).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from explorer.costs.operators import Op, OpTable
from explorer.costs.parts import Shape, bound_bytes

ALLREDUCE_LATENCY_S = 10e-6
ACT_BYTES = 2  # bytes per activation value an all-reduce moves (16-bit activations)


def check_tp(heads: int, kv_heads: int, tp: int, interconnect_gbps: float | None, chip: str):
    """Refuse, in one line, a tensor-parallel size the model or the chip cannot take."""
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise ValueError(f"--tp must be a whole number >= 1, got {tp!r}")
    if tp == 1:
        return
    if heads % tp or kv_heads % tp:
        raise ValueError(
            f"tensor parallel {tp} does not divide the model's {heads} heads and {kv_heads} KV heads"
        )
    if not interconnect_gbps:
        raise ValueError(f"{chip} has no GPU-to-GPU interconnect figure: --tp needs one (--chip)")


def fp8_shape(shape: Shape) -> Shape:
    """The shape with its attention and MLP matmul weights at 1 byte (FP8 checkpoints); the
    embeddings, norms, lm_head and expert tensors stay at the dtype's size."""
    return replace(shape, linear_bytes=(("attention", 1.0), ("mlp", 1.0)))


def allreduce_ops(table: OpTable, hidden: int, layers: int, tp: int) -> list[Op]:
    """The two all-reduces per layer tensor parallel adds (per GPU)."""
    rows = table.batch * table.tokens_fed
    moved = 2 * (tp - 1) / tp * rows * hidden * ACT_BYTES
    return [
        Op(name, "layer", "comm", "tensor parallel",
           f"All-reduce of the {block} output across the {tp} GPUs.", f"[{rows}, {hidden}]",
           0.0, None, {"allreduce": moved * tp}, layers, block)
        for name, block in (("allreduce_attn", "attention"), ("allreduce_mlp", "mlp"))
    ]  # fmt: skip


def op_time(op: Op, peaks, bandwidth: float, tp: int, interconnect_gbps: float | None) -> dict:
    """One op's intensity, time (all its instances, per GPU) and bound at the roofs."""
    flops, nbytes = op.total_flops / tp, op.total_bytes / tp
    if op.kind == "comm":
        t = op.count * ALLREDUCE_LATENCY_S + nbytes / (interconnect_gbps * 1e9)
        return {"intensity": 0.0, "time_s": t, "bound": "interconnect"}
    compute, memory = flops / peaks.roofline_flops, nbytes / bandwidth
    return {
        "intensity": flops / nbytes if nbytes else None,
        "time_s": max(compute, memory),
        "bound": "compute" if compute > memory else "memory",
    }


def timed(
    table: OpTable, peaks, *, tp: int = 1, interconnect_gbps: float | None = None, shape=None
) -> list[dict[str, Any]]:
    """The table's ops as rows with their time and bound at `peaks` (per GPU over `tp`); each row
    also has `share` (of the modelled step, every op summed) and `totals` per pass."""
    ops = list(table.ops)
    if tp > 1:
        at = max(i for i, op in enumerate(ops) if op.name == "o_proj") + 1
        ar = allreduce_ops(table, shape.hidden, shape.layers, tp)
        ops.insert(at, ar[0])
        at = max(i for i, op in enumerate(ops) if op.block == "mlp" and op.stage == "layer")
        ops.insert(at + 1, ar[1])
    weights_kv = bound_bytes(table.part_bytes()) / tp
    bandwidth = peaks.bandwidth_for(weights_kv) * 1e9
    rows = []
    for op in ops:
        row = op.to_dict() | op_time(op, peaks, bandwidth, tp, interconnect_gbps)
        row["total_flops"], row["total_bytes"] = op.total_flops / tp, op.total_bytes / tp
        row["phase"] = table.phase
        rows.append(row)
    step = sum(r["time_s"] for r in rows) or 1.0
    for r in rows:
        r["share"] = r["time_s"] / step
    return rows


def top(rows: list[dict], n: int = 3) -> list[dict]:
    """The n ops that take the most modelled (or measured, where set) time."""
    key = lambda r: r.get("measured_s") if r.get("measured_s") is not None else r["time_s"]  # noqa: E731
    return sorted(rows, key=key, reverse=True)[:n]


def summary(table: OpTable, rows: list[dict]) -> dict[str, Any]:
    """Counts and totals a reader checks first: ops per layer, step time, bound shares."""
    step = sum(r["time_s"] for r in rows)
    by_bound: dict[str, float] = {}
    for r in rows:
        by_bound[r["bound"]] = by_bound.get(r["bound"], 0.0) + r["time_s"]
    return {
        "phase": table.phase,
        "ops_per_layer": len({r["name"] for r in rows if r["stage"] == "layer"}),
        "ops": len(rows),
        "step_s": step,
        "bound_share": {k: v / step for k, v in by_bound.items()} if step else {},
        "top": [(r["name"], r["time_s"], r["bound"]) for r in top(rows)],
    }
