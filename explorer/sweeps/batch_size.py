"""Batch size: decode step latency, per-user and total tokens/s, and the roofline knee."""

from __future__ import annotations

import threading
from collections.abc import Iterable

import pandas as pd
import torch
from transformers import DynamicCache

from explorer import costs
from explorer._format import gb
from explorer.model.device import available_bytes
from explorer.model.loader import LoadedModel, ModelInfo
from explorer.model.passes import copy_cache
from explorer.sweeps import CONTEXT, REPEATS, Param, Sweep, register
from explorer.sweeps._common import (
    NOISE_COLUMNS,
    Bar,
    Progress,
    StopSweep,
    attrs,
    check_context,
    check_count,
    derived,
    frame,
    measure_points,
    modelled,
    noise_columns,
    peaks_for,
    prefill_cache,
    sizes,
    time_decode,
    token_ids,
)

COLUMNS = [
    "batch",
    "context_len",
    "latency_s_measured",
    "tokens_per_s_per_user_measured",
    "tokens_per_s_total_measured",
    "flops_modelled",
    "bytes_modelled",
    "intensity_modelled",
    "bound_s_modelled",
    "bound_modelled",
    "latency_s_calibrated",
    "tokens_per_s_total_bound_modelled",
    "knee_batch_modelled",
    "achieved_gbps_derived",
    "pct_of_peak_bw_derived",
    "overhead_s_derived",
    "mbu_derived",
    "mfu_derived",
    "regime_derived",
    *NOISE_COLUMNS,
]


def batch_memory_bytes(info: ModelInfo, batch: int, context_len: int) -> int:
    """Modelled extra memory one decode pass at this batch needs: the repeated cache, the copy
    DynamicCache's torch.cat makes while growing it, the logits, and the layer activations."""
    shape = costs.shape_of(info)
    kv = batch * context_len * shape.kv_bytes_per_token
    logits = batch * info.vocab_size * (shape.bytes_per_value + 4) * 2
    acts = batch * shape.act_elems * shape.bytes_per_value
    return 2 * kv + logits + acts


def run(
    lm: LoadedModel,
    *,
    batches: Iterable[int] = (1, 2, 4, 8, 16, 32, 64, 128, 256),
    context_len: int = 128,
    repeats: int = 3,
    peaks=None,
    memory_limit_bytes: int | None = None,
    progress: Progress | None = None,
    bar: bool = True,
    seed: int = 0,
    stop: threading.Event | None = None,
) -> pd.DataFrame:
    """Decode step latency, per-user and total tokens/s vs batch size at a fixed context length.

    One prompt of context_len - 1 tokens is prefilled once; each batch size repeats that cache B
    times (DynamicCache.batch_repeat_interleave) and times decode passes of B tokens. Batches run
    smallest first; the first one that would not fit (a pre-check of the modelled memory against
    memory_limit_bytes or the free memory, or an out-of-memory error) ends the sweep with a note.
    attrs["knee_batch_modelled"]: the roofline's batch where decode stops being memory-bound
    (the critical batch, peak FLOP/s / peak bandwidth in tokens, KV traffic included);
    attrs["knee_batch_measured"]: the smallest batch whose step took over 2x the smallest
    batch's (where batching stops being nearly free), None if none did.
    """
    batches = sizes("batches", batches)
    check_count("context_len", context_len, 2)
    check_count("repeats", repeats)
    check_context(lm.info, context_len)
    peaks = peaks_for(lm, peaks)
    knee = costs.decode_knee(lm.info, context_len=context_len, peaks=peaks)
    base = prefill_cache(lm.model, token_ids(lm.info, 1, context_len - 1, lm.device, seed))
    notes: list[str] = []
    progress_bar = Bar(len(batches) * repeats, "batch sweep", progress, bar)

    def point(B: int) -> dict:
        reason = wont_fit(lm, B, context_len, memory_limit_bytes)
        if reason:
            raise StopSweep(reason)
        return _row(lm, peaks, base, B, context_len, repeats, knee, seed, progress_bar.update)

    try:
        rows = measure_points(batches, point, notes, label=lambda B: f"B={B}", stop=stop)
    finally:
        progress_bar.close()
    return frame(
        rows,
        COLUMNS,
        attrs(
            "batch",
            lm,
            peaks,
            notes,
            COLUMNS,
            repeats=repeats,
            warmup=1,
            context_len=context_len,
            knee_batch_modelled=knee,
            knee_batch_measured=measured_knee(rows),
        ),
    )


def measured_knee(rows: list[dict]) -> int | None:
    """Smallest batch whose decode step took over 2x the smallest batch's step (None if none)."""
    if not rows:
        return None
    first = rows[0]["latency_s_measured"]
    return next((r["batch"] for r in rows if r["latency_s_measured"] > 2 * first), None)


def wont_fit(lm: LoadedModel, B: int, context_len: int, limit: int | None) -> str | None:
    need = batch_memory_bytes(lm.info, B, context_len)
    free = available_bytes(lm.device) if limit is None else limit
    if free is not None and need > 0.9 * free:
        return f"needs about {gb(need)} (modelled), {gb(free)} available"
    return None


def _row(
    lm: LoadedModel,
    peaks,
    base: DynamicCache,
    B: int,
    context_len: int,
    repeats: int,
    knee,
    seed: int,
    tick,
) -> dict:
    cache = copy_cache(base)
    with torch.inference_mode():
        cache.batch_repeat_interleave(B)  # [B, kv_heads, L - 1, head_dim] per layer
    feed = token_ids(lm.info, B, 1, lm.device, seed + 1)  # [B, 1]
    timed = time_decode(
        lm.model, cache, feed, repeats=repeats, warmup=1, device=lm.device, tick=tick
    )
    del cache
    latency = timed.estimate
    model = modelled(lm.info, peaks, batch=B, tokens_fed=1, context_len=context_len)
    row = {
        "batch": B,
        "context_len": context_len,
        "latency_s_measured": latency,
        **noise_columns(timed),
        "tokens_per_s_per_user_measured": 1 / latency,
        "tokens_per_s_total_measured": B / latency,
        **model,
        "tokens_per_s_total_bound_modelled": B / model["bound_s_modelled"],
        "knee_batch_modelled": knee,
    }
    derived(row, peaks)
    return row


SWEEP = register(
    Sweep(
        name="batch",
        title="Batch size",
        run=run,
        columns=COLUMNS,
        order=30,
        help="decode passes of B rows at context 128",
        params=(
            Param(
                "batches",
                "ints",
                "batch sizes",
                "1, 2, 4, 8, 16, 32, 64",
                "batch sizes, e.g. 1,2,4,8",
            ),
            CONTEXT,
            REPEATS,
        ),
    )
)
