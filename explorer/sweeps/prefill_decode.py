"""Prefill vs decode: prefill time and tokens/s vs prompt length; one decode pass at each context."""

from __future__ import annotations

import threading
from collections.abc import Iterable

import pandas as pd
import torch

from explorer.costs.timing import alternate
from explorer.model.loader import LoadedModel
from explorer.model.passes import crop_cache
from explorer.sweeps import REPEATS, Param, Sweep, register
from explorer.sweeps._common import (
    NOISE_COLUMNS,
    Bar,
    Progress,
    StopSweep,
    attrs,
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
    "phase",
    "context_len",
    "tokens_fed",
    "latency_s_measured",
    "tokens_per_s_measured",
    "flops_modelled",
    "bytes_modelled",
    "intensity_modelled",
    "bound_s_modelled",
    "bound_modelled",
    "latency_s_calibrated",
    "achieved_gbps_derived",
    "pct_of_peak_bw_derived",
    *NOISE_COLUMNS,
]


def run(
    lm: LoadedModel,
    *,
    lengths: Iterable[int] = (16, 32, 64, 128, 256, 512, 1024, 2048),
    repeats: int = 3,
    decode: bool = True,
    peaks=None,
    progress: Progress | None = None,
    bar: bool = True,
    seed: int = 0,
    stop: threading.Event | None = None,
) -> pd.DataFrame:
    """Prefill latency and tokens/s vs prompt length, and (decode=True) the latency of one decode pass
    at each context length, with the modelled arithmetic intensity of each. Lengths beyond the
    model's positions, or that run out of memory, end the sweep with a note."""
    lengths = sizes("lengths", lengths)
    check_count("repeats", repeats)
    peaks = peaks_for(lm, peaks)
    ids = token_ids(lm.info, 1, max(lengths) + 1, lm.device, seed)
    prefill_cache(lm.model, ids[:, : min(lengths)])  # warm-up, untimed
    notes: list[str] = []
    progress_bar = Bar(
        len(lengths) * repeats * (2 if decode else 1), "prefill sweep", progress, bar
    )

    def point(L: int) -> list[dict]:
        if lm.info.max_positions and L > lm.info.max_positions:
            raise StopSweep(f"beyond the model's {lm.info.max_positions} positions")
        return _rows(lm, peaks, ids, L, repeats, decode, progress_bar.update)

    try:
        rows = measure_points(lengths, point, notes, label=lambda L: f"length {L}", stop=stop)
    finally:
        progress_bar.close()
    return frame(
        rows, COLUMNS, attrs("prefill", lm, peaks, notes, COLUMNS, repeats=repeats, warmup=1)
    )


def _rows(
    lm: LoadedModel, peaks, ids: torch.Tensor, L: int, repeats: int, decode: bool, tick
) -> list[dict]:
    arm = {"prefill": lambda: prefill_cache(lm.model, ids[:, :L])}
    timed = alternate(arm, repeats, lm.device, tick=tick, keep=True)["prefill"]
    cache, latency = timed.results[-1], timed.estimate
    row = {
        "phase": "prefill",
        "context_len": L,
        "tokens_fed": L,
        "latency_s_measured": latency,
        **noise_columns(timed),
        "tokens_per_s_measured": L / latency,
        **modelled(lm.info, peaks, batch=1, tokens_fed=L, context_len=L),
    }
    derived(row, peaks)
    rows = [row]
    if decode and L >= 2:
        crop_cache(cache, L - 1)
        timed = time_decode(
            lm.model,
            cache,
            ids[:, L - 1 : L],
            repeats=repeats,
            warmup=1,
            device=lm.device,
            tick=tick,
        )
        latency = timed.estimate
        row = {
            "phase": "decode",
            "context_len": L,
            "tokens_fed": 1,
            "latency_s_measured": latency,
            **noise_columns(timed),
            "tokens_per_s_measured": 1 / latency,
            **modelled(lm.info, peaks, batch=1, tokens_fed=1, context_len=L),
        }
        derived(row, peaks)
        rows.append(row)
    return rows


SWEEP = register(
    Sweep(
        name="prefill",
        title="Prefill vs decode",
        run=run,
        columns=COLUMNS,
        order=20,
        help="prompt lengths: one prefill and one decode pass each",
        params=(
            Param(
                "lengths", "ints", "context lengths", "16, 32, 64, 128, 256, 512", "prompt lengths"
            ),
            REPEATS,
        ),
    )
)
