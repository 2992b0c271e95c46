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
    regime      = the largest of three floors: "overhead" when the overhead floor (the measured
                  latency of the same model's skeleton, explorer.costs.overhead) exceeds the
                  bound, else the side that binds the bound ("memory" or "compute"). Without a
                  measured overhead floor (older traces) the fallback rule: "overhead" when
                  overhead_s > bound_s (the step takes more than twice its bound)

The peak bandwidth is the one the roofline uses for a pass of that size (Peaks.bandwidth_for:
cache speed when the bytes fit in the last-level cache), so mbu <= 1 exactly when the latency is
at least the memory floor. `stack` is the additive view, which sums to latency_s exactly: the
binding side's floors, then the overhead. step_roofline() gives all of a Step's cost fields.
"""

from __future__ import annotations

from typing import Any

from explorer.costs.parts import BOUND_EXCLUDES, forward_cost, roofline
from explorer.costs.shape import info_key
from explorer.model.loader import ModelInfo

REGIME_RULE = (
    "the largest floor: overhead when the measured overhead floor (a near-empty forward of the same "
    "model) exceeds the roofline bound, else the side that binds the bound"
)
FALLBACK_RULE = (
    "without an overhead floor: overhead when latency - bound > bound; else the binding side"
)
MEMORY_PARTS = ("weights", "kv_read", "kv_write")
SPLIT_FIELDS = ("floors", "overhead_s", "mbu", "mfu", "regime")  # set on a Step beside bound_s
STEP_COST_FIELDS = (
    "flops",
    "bytes",
    "bound_s",
    "bound",
    "achieved_gbps",
    "pct_of_peak_bw",
    *SPLIT_FIELDS,
    "overhead_floor_s",
)


def _floor_bytes(parts: dict[str, float]) -> dict[str, float]:
    """Bytes by part grouped into the split's memory floors (weights/* summed)."""
    grouped = {"weights": 0.0, "kv_read": 0.0, "kv_write": 0.0, "activations": 0.0}
    for name, value in parts.items():
        key = "weights" if name.startswith("weights/") else name
        grouped[key] = grouped.get(key, 0.0) + float(value)
    return grouped


def regime(bound_s: float, overhead_s: float, bound_side: str, floor_s: float | None = None) -> str:
    """REGIME_RULE with a measured overhead floor_s; FALLBACK_RULE without one."""
    if floor_s is not None:
        return "overhead" if floor_s > bound_s else bound_side
    return "overhead" if overhead_s > bound_s else bound_side


def utilisation(
    flops: float, counted_bytes: float, latency_s: float, peaks, floor_s: float | None = None
) -> dict[str, Any]:
    """bound_s, bound, overhead_s, mbu, mfu and regime of a pass that took latency_s (> 0),
    from its FLOPs and the bytes the roofline counts; floor_s: the measured overhead floor."""
    bound_s, side = roofline(flops, counted_bytes, peaks)
    overhead = latency_s - bound_s
    return {
        "bound_s": bound_s,
        "bound": side,
        "overhead_s": overhead,
        "mbu": counted_bytes / latency_s / (peaks.bandwidth_for(counted_bytes) * 1e9),
        "mfu": float(flops) / latency_s / peaks.roofline_flops,
        "regime": regime(bound_s, overhead, side, floor_s),
    }


def split(
    flops: float,
    nbytes: dict[str, float],
    latency_s: float | None,
    peaks,
    floor_s: float | None = None,
) -> dict[str, Any]:
    """The split of one step: floors (s) by part, bound_s, bound, overhead_s, mbu, mfu, regime,
    stack. flops: modelled FLOPs of the pass; nbytes: modelled bytes by part (Step.bytes); peaks:
    an explorer.costs.hardware.Peaks; floor_s: the measured overhead floor (None: fallback rule).
    Without a latency the floors and bound are still given."""
    floors, counted = _floors(flops, nbytes, peaks)
    return _split_with(flops, counted, floors, latency_s, peaks, floor_s)


def _floors(flops: float, nbytes: dict[str, float], peaks) -> tuple[dict[str, float], float]:
    """The floors (s) by part at `peaks`, and the bytes the bound counts (no latency needed)."""
    grouped = _floor_bytes(nbytes)
    counted = sum(v for k, v in grouped.items() if k not in BOUND_EXCLUDES)
    bandwidth = peaks.bandwidth_for(counted) * 1e9  # bytes/s, as roofline() uses
    floors = {k: v / bandwidth for k, v in grouped.items()}
    floors["compute"] = float(flops) / peaks.roofline_flops
    return floors, counted


def _split_with(flops, counted, floors, latency_s, peaks, floor_s) -> dict[str, Any]:
    """split() from its floors and counted bytes (_floors)."""
    if latency_s is None or latency_s <= 0:
        bound_s, side = roofline(flops, counted, peaks)
        out = {"bound_s": bound_s, "bound": side, **dict.fromkeys(SPLIT_FIELDS)}
        return {**out, "floors": floors, "stack": None}
    out = utilisation(flops, counted, latency_s, peaks, floor_s)
    binding = MEMORY_PARTS if out["bound"] == "memory" else ("compute",)
    stack = {k: floors[k] for k in binding} | {"overhead": out["overhead_s"]}
    return {**out, "floors": floors, "stack": stack}


def step_roofline(
    info: ModelInfo,
    *,
    batch: int,
    tokens_fed: int,
    context_len: int,
    use_cache: bool,
    latency_s: float | None,
    peaks=None,
    logits_positions: int | None = None,
    floor_s: float | None = None,
    experts_touched: list[float] | None = None,
    kv_dtype: str | None = None,
) -> dict[str, Any]:
    """The cost fields of one engine Step (STEP_COST_FIELDS): flops, bytes (by part), achieved_gbps,
    pct_of_peak_bw, bound_s, bound and the split (floors, overhead_s, mbu, mfu, regime).
    achieved_* are None without a latency; the bound and split are None without peaks.
    achieved_gbps = bound_bytes / latency (weights + KV, not the activations estimate).
    logits_positions=1 when the forward computed the last position's logits only (last_only=True).
    experts_touched (MoE): distinct experts per MoE layer, as the router chose them in this pass."""
    shape = (batch, tokens_fed, context_len, use_cache, logits_positions, experts_touched, kv_dtype)
    key = _pass_key(info, *shape)
    flops, nbytes, counted = _pass_cost(key, info, *shape)
    out: dict[str, Any] = dict.fromkeys(STEP_COST_FIELDS)
    out.update(flops=flops, bytes=nbytes)
    if latency_s is not None and latency_s > 0:
        out["achieved_gbps"] = counted / latency_s / 1e9
        if peaks is not None:
            out["pct_of_peak_bw"] = 100.0 * out["achieved_gbps"] / peaks.bandwidth_gbps
    if peaks is not None:
        floors, split_counted = _pass_floors(key, flops, nbytes, peaks)
        parts = _split_with(flops, split_counted, floors, latency_s, peaks, floor_s)
        out.update({k: parts[k] for k in ("bound_s", "bound", *SPLIT_FIELDS)})
        out["overhead_floor_s"] = floor_s
    return out


# the latency-free part of a Step's costs, computed once per distinct pass shape: the model of a
# shape never changes, and a Session's steps meet the same shapes again (a rerun, a rewind, a
# fork, a benchmark's repeats); the oldest shape goes first past _CACHED_MAX
_PASS_COSTS: dict[tuple, tuple[float, dict[str, float], float]] = {}
_PASS_FLOORS: dict[tuple, tuple[Any, dict[str, float], float]] = {}
_CACHED_MAX = 4096


def _pass_key(
    info: ModelInfo, batch, tokens_fed, context_len, use_cache, logits_positions, experts, kv_dtype
) -> tuple:
    experts = None if experts is None else tuple(experts)
    return (info_key(info), batch, tokens_fed, context_len, use_cache, logits_positions, experts,
            kv_dtype)  # fmt: skip


def _pass_cost(
    key: tuple, info: ModelInfo, batch, tokens_fed, context_len, use_cache, logits_positions,
    experts, kv_dtype,
) -> tuple[float, dict[str, float], float]:  # fmt: skip
    """(total FLOPs, bytes by part (a fresh dict), bound bytes) of one pass, from forward_cost."""
    hit = _PASS_COSTS.get(key)
    if hit is None:
        cost = forward_cost(
            info,
            batch=batch,
            tokens_fed=tokens_fed,
            context_len=context_len,
            use_cache=use_cache,
            logits_positions=logits_positions,
            experts_touched=experts,
            kv_dtype=kv_dtype,
        )
        hit = _remember(_PASS_COSTS, key, (cost.total_flops, dict(cost.bytes), cost.bound_bytes))
    return hit[0], dict(hit[1]), hit[2]


def _pass_floors(key: tuple, flops: float, nbytes: dict[str, float], peaks):
    """(floors by part (a fresh dict), counted bytes) of one pass at `peaks` (_floors)."""
    hit = _PASS_FLOORS.get((key, id(peaks)))
    if hit is None or hit[0] is not peaks:  # the Peaks object is kept: its id stays its own (a
        # Peaks is measured once per process and device, then only read)
        hit = _remember(_PASS_FLOORS, (key, id(peaks)), (peaks, *_floors(flops, nbytes, peaks)))
    return dict(hit[1]), hit[2]


def _remember(cache: dict, key, value):
    if len(cache) >= _CACHED_MAX:
        del cache[next(iter(cache))]
    cache[key] = value
    return value


def split_step(step, peaks, floor_s: float | None = None) -> dict[str, Any]:
    """The split of a recorded Step (needs its flops and bytes, as the engine fills them);
    floor_s defaults to the step's own recorded overhead floor."""
    if step.flops is None or step.bytes is None:
        raise ValueError(
            f"step {step.index} has no modelled flops/bytes (recorded with roofline=False?)"
        )
    if floor_s is None:
        floor_s = getattr(step, "overhead_floor_s", None)
    return split(step.flops, step.bytes, step.latency_s, peaks, floor_s)


def split_trace(trace) -> list[dict[str, Any]]:
    """The split of every step of a Trace (a saved one too: the peaks come from trace.hardware),
    filled into the steps in place (bound_s, bound and SPLIT_FIELDS); returns one dict per step."""
    from explorer.costs.hardware import Peaks

    if not trace.hardware:
        raise ValueError(
            "this trace has no measured peaks (trace.hardware is empty): it was recorded with "
            "roofline=False, so there is no bound to split against"
        )
    peaks = Peaks(**trace.hardware) if isinstance(trace.hardware, dict) else trace.hardware
    floor = (getattr(trace, "overhead_floor", None) or {}).get("floor_s")
    out = []
    for step in trace.steps:
        result = split_step(step, peaks, floor)
        if floor is not None:
            step.overhead_floor_s = floor
        for key in ("bound_s", "bound", *SPLIT_FIELDS):
            setattr(step, key, result[key])
        out.append({"index": step.index, "phase": step.phase, **result})
    return out
