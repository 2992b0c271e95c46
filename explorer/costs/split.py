"""Why a step took its time: the speed-of-light split of one measured forward pass.

For one step, the cost model (explorer.costs.parts) gives the bytes moved by part and the FLOPs;
the measured peaks (explorer.costs.hardware) turn each into a *floor*, the time it would take
alone at peak speed on this machine:

    floors["weights"]      sum of the weights/* bytes / peak bandwidth
    floors["kv_read"]      cached K/V read / peak bandwidth
    floors["kv_write"]     fed tokens' K/V written / peak bandwidth
    floors["activations"]  the activations ESTIMATE / peak bandwidth (shown, not in the bound)
    floors["compute"]      FLOPs / peak matmul FLOP/s

    bound_s     = max(weights + kv_read + kv_write, compute)   (the roofline lower bound)
    overhead_s  = latency_s - bound_s                          (everything the floors do not explain:
                  Python, kernel launches, framework bookkeeping, and kernels running below peak)
    mbu         = bound bytes / latency_s / peak bandwidth     (model bandwidth utilisation)
    mfu         = FLOPs / latency_s / peak FLOP/s              (model FLOP/s utilisation)
    regime      = "overhead" when overhead_s > bound_s (the step takes more than twice its
                  bound: most of it is not the memory or the math), else the side that binds
                  the bound ("memory" or "compute")

The peak bandwidth is the one the roofline uses for a pass of that size (Peaks.bandwidth_for:
cache speed when the bytes fit in the last-level cache), so mbu <= 1 exactly when the latency is
at least the memory floor. `stack` is the additive view, which sums to latency_s exactly: the
binding side's floors, then the overhead.
"""

from __future__ import annotations

from typing import Any

from explorer.costs.parts import BOUND_EXCLUDES

REGIME_RULE = "overhead when latency - bound > bound (over 2x the bound); else the binding side"
MEMORY_PARTS = ("weights", "kv_read", "kv_write")


def _floor_bytes(parts: dict[str, float]) -> dict[str, float]:
    """Bytes by part grouped into the split's memory floors (weights/* summed)."""
    grouped = {"weights": 0.0, "kv_read": 0.0, "kv_write": 0.0, "activations": 0.0}
    for name, value in parts.items():
        key = "weights" if name.startswith("weights/") else name
        grouped[key] = grouped.get(key, 0.0) + float(value)
    return grouped


def split(flops: float, nbytes: dict[str, float], latency_s: float | None, peaks) -> dict[str, Any]:
    """The split of one step: floors (s) by part, bound_s, overhead_s, mbu, mfu, regime, stack.

    flops: modelled FLOPs of the pass; nbytes: modelled bytes by part (Step.bytes); peaks: a
    explorer.costs.hardware.Peaks. Without a latency the floors and bound are still given."""
    grouped = _floor_bytes(nbytes)
    counted = sum(v for k, v in grouped.items() if k not in BOUND_EXCLUDES)
    bandwidth = peaks.bandwidth_for(counted) * 1e9  # bytes/s
    floors = {k: v / bandwidth for k, v in grouped.items()}
    floors["compute"] = float(flops) / peaks.roofline_flops
    memory_s = sum(floors[k] for k in MEMORY_PARTS)
    bound_side = "memory" if memory_s >= floors["compute"] else "compute"
    bound_s = max(memory_s, floors["compute"])
    out: dict[str, Any] = {
        "floors": floors,
        "bound_s": bound_s,
        "bound": bound_side,
        "overhead_s": None,
        "mbu": None,
        "mfu": None,
        "regime": None,
        "stack": None,
    }
    if latency_s is None or latency_s <= 0:
        return out
    overhead = latency_s - bound_s
    bound_parts = (
        {k: floors[k] for k in MEMORY_PARTS}
        if bound_side == "memory"
        else {"compute": floors["compute"]}
    )
    out.update(
        overhead_s=overhead,
        mbu=counted / latency_s / bandwidth,
        mfu=float(flops) / latency_s / peaks.roofline_flops,
        regime=regime(bound_s, overhead, bound_side),
        stack={**bound_parts, "overhead": overhead},
    )
    return out


def regime(bound_s: float, overhead_s: float, bound_side: str) -> str:
    """'overhead' when the unexplained time exceeds the bound, else the binding side (REGIME_RULE)."""
    return "overhead" if overhead_s > bound_s else bound_side


STEP_FIELDS = ("floors", "bound_s", "overhead_s", "mbu", "mfu", "regime")


def split_step(step, peaks) -> dict[str, Any]:
    """The split of a recorded Step (needs its flops and bytes, as the engine fills them)."""
    if step.flops is None or step.bytes is None:
        raise ValueError(
            f"step {step.index} has no modelled flops/bytes (recorded with roofline=False?)"
        )
    return split(step.flops, step.bytes, step.latency_s, peaks)


def fill_step(step, peaks) -> None:
    """Set the split's fields (STEP_FIELDS) on a Step in place."""
    result = split_step(step, peaks)
    for key in STEP_FIELDS:
        setattr(step, key, result[key])


def split_trace(trace) -> list[dict[str, Any]]:
    """The split of every step of a Trace (a saved one too: the peaks come from trace.hardware),
    filled into the steps in place; returns one dict per step."""
    from explorer.costs.hardware import Peaks

    if not trace.hardware:
        raise ValueError(
            "this trace has no measured peaks (trace.hardware is empty): it was recorded with "
            "roofline=False, so there is no bound to split against"
        )
    peaks = Peaks(**trace.hardware) if isinstance(trace.hardware, dict) else trace.hardware
    out = []
    for step in trace.steps:
        fill_step(step, peaks)
        out.append({"index": step.index, "phase": step.phase, **split_step(step, peaks)})
    return out
