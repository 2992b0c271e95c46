"""Predicted speedups of the optimisations the pays sweep measures (explorer.sweeps.pays): pure
formulas over pass times, each a ratio baseline time / trick time. The pass times come from the
calibrated cost model (explorer.costs.calibrate) or from measured passes; nothing here times.

    kv cache        t(no-cache pass over L tokens) / t(cached pass: 1 token onto L - 1)
    speculative     E[tokens per round] / (t_verify(k+1) / t_1 + k t_draft / t_1)   (Leviathan eq. 1,
                    with the verify pass measured at batch B instead of assumed to cost one pass)
    fewer bytes     t(bytes, flops) / t(weight bytes x r + other bytes, flops)       (r = new / old
                    bytes per weight: only the bytes term of the calibrated model shrinks)
    compile         t / (t - removed overhead)                                       (a ceiling: all
                    of the fitted per-step and per-layer overhead removed, no byte or FLOP saved)
    prefix cache    t_full / (h t_hit + (1 - h) t_full)                              (h: hit fraction)
"""

from __future__ import annotations

from explorer.costs.speculation import expected_tokens_per_round


def ratio(baseline_s: float | None, trick_s: float | None) -> float | None:
    """baseline_s / trick_s; None when either is missing or not positive."""
    if not baseline_s or not trick_s or baseline_s <= 0 or trick_s <= 0:
        return None
    return baseline_s / trick_s


def speculative_round_cost(verify_s: float, draft_s: float, k: int, one_s: float) -> float:
    """A round's cost in 1-token target passes: (verify pass of k+1 tokens + k draft passes) / t_1."""
    return (verify_s + k * draft_s) / one_s


def speculative_speedup(
    alpha: float, k: int, verify_s: float, draft_s: float, one_s: float
) -> float:
    """Expected tokens per round / the round's cost in 1-token target passes (all at one batch):
    (1 - alpha^(k+1)) / (1 - alpha) / ((verify_s + k draft_s) / one_s)."""
    return expected_tokens_per_round(alpha, k) / speculative_round_cost(verify_s, draft_s, k, one_s)


def fewer_bytes_latency(
    cal,
    *,
    weight_bytes: float,
    other_bytes: float,
    flops: float,
    layers: int,
    bytes_ratio: float,
    rows: int = 1,
) -> float:
    """Calibrated latency of a pass whose weights take bytes_ratio of their bytes (KV unchanged);
    `rows`: the pass's batch x tokens fed (a calibration's multi-row term needs it)."""
    return cal.predict(
        bytes=weight_bytes * bytes_ratio + other_bytes, flops=flops, layers=layers, rows=rows
    )


def fewer_bytes_speedup(
    cal,
    *,
    weight_bytes: float,
    other_bytes: float,
    flops: float,
    layers: int,
    bytes_ratio: float,
    rows: int = 1,
) -> float:
    """t(weights at their bytes) / t(weights at bytes_ratio of them), both calibrated: near
    1 / bytes_ratio where the bytes term dominates, near 1 where FLOPs or overhead do."""
    same = dict(other_bytes=other_bytes, flops=flops, layers=layers, rows=rows)
    before = fewer_bytes_latency(cal, weight_bytes=weight_bytes, bytes_ratio=1.0, **same)
    after = fewer_bytes_latency(cal, weight_bytes=weight_bytes, bytes_ratio=bytes_ratio, **same)
    return before / after


def overhead_removed_s(cal, layers: int) -> float:
    """The calibrated model's fixed cost of one pass: step overhead + layers x per-layer overhead."""
    return cal.step_overhead_s + layers * (cal.layer_overhead_s or 0.0)


def overhead_cut_speedup(total_s: float, overhead_s: float, kept: float = 0.0) -> float:
    """total / (total - (1 - kept) x overhead): the speedup of removing overhead, keeping `kept` of
    it (0: all removed, the ceiling of what compiling or CUDA graphs can give)."""
    if not 0 <= kept <= 1:
        raise ValueError(f"kept must be in 0..1, got {kept!r}")
    left = total_s - (1 - kept) * min(overhead_s, total_s)
    return total_s / left if left > 0 else float("inf")


def prefix_expected_s(full_s: float, hit_s: float, hit_fraction: float) -> float:
    """Expected prefill time when hit_fraction of requests find their prefix cached."""
    if not 0 <= hit_fraction <= 1:
        raise ValueError(f"hit fraction must be in 0..1, got {hit_fraction!r}")
    return hit_fraction * hit_s + (1 - hit_fraction) * full_s


def prefix_speedup(full_s: float, hit_s: float, hit_fraction: float) -> float:
    """t_full / (h t_hit + (1 - h) t_full)."""
    return full_s / prefix_expected_s(full_s, hit_s, hit_fraction)


def kv_copy_bytes(kv_bytes_per_token: float, tokens: int, batch: int = 1) -> float:
    """Bytes one copy of `tokens` tokens' K/V moves (read + write, one copy per row): what a
    DynamicCache's torch.cat moves per step for its cached tokens, and what a prefix-cache hit
    copies for its prefix."""
    return 2.0 * kv_bytes_per_token * tokens * batch
