"""dtype: fp32 vs bf16 vs fp16, bytes and measured decode latency."""

from __future__ import annotations

import threading
from collections.abc import Iterable

import pandas as pd
import torch

from explorer.costs import hardware
from explorer.costs.timing import Timer
from explorer.model.device import DTYPES, dtype_name, dtype_problem, resolve_device
from explorer.model.loader import LoadedModel, load, with_weights
from explorer.model.passes import forward, kv_cache_bytes
from explorer.model.quant import weights_of
from explorer.sweeps import CONTEXT, REPEATS, Param, Sweep, register
from explorer.sweeps._common import COLUMNS as GLOSSARY
from explorer.sweeps._common import (
    NOISE_COLUMNS,
    Bar,
    Progress,
    check_context,
    check_count,
    derived,
    frame,
    measure_points,
    modelled,
    noise_columns,
    plain_peaks,
    prefill_cache,
    time_decode,
    token_ids,
)

COLUMNS = [
    "dtype",
    "supported",
    "batch",
    "context_len",
    "weight_bytes_counted",
    "kv_cache_bytes_measured",
    "latency_s_measured",
    "tokens_per_s_measured",
    "peak_flops_measured",
    "flops_modelled",
    "bytes_modelled",
    "bound_s_modelled",
    "bound_modelled",
    "achieved_gbps_derived",
    "pct_of_peak_bw_derived",
    *NOISE_COLUMNS,
]


def dtype_supported(device: torch.device, dt: torch.dtype) -> bool:
    """Whether the device runs a matmul in this dtype."""
    return dtype_problem(device, dt) is None


def in_dtype(lm: LoadedModel | str, dt: torch.dtype, device) -> LoadedModel:
    """The model converted to dt (a copy, cached on lm; a name is loaded in dt)."""
    if isinstance(lm, str):
        return load(lm, device=device, dtype=dt)
    return with_weights(lm, weights_of(dt))


def run(
    lm: LoadedModel | str,
    *,
    dtypes: Iterable[str] = ("float32", "bfloat16", "float16"),
    context_len: int = 64,
    batch_size: int = 1,
    repeats: int = 3,
    device: str | torch.device | None = None,
    progress: Progress | None = None,
    bar: bool = True,
    seed: int = 0,
    stop: threading.Event | None = None,
) -> pd.DataFrame:
    """Decode step latency and bytes in each dtype the device supports (a loaded model is copied and
    converted; a name is loaded in each dtype). Peaks are measured per dtype (explorer.costs.hardware)."""
    names = list(dtypes)
    if not names:
        raise ValueError("dtypes must list at least one dtype, e.g. ('float32', 'bfloat16')")
    for name in names:
        if name not in DTYPES:
            raise ValueError(f"unknown dtype {name!r}; use one of {sorted(set(DTYPES))}")
    check_count("context_len", context_len, 2)
    check_count("batch_size", batch_size)
    check_count("repeats", repeats)
    dev = resolve_device(device or (lm.device if isinstance(lm, LoadedModel) else "auto"))
    first = lm if isinstance(lm, LoadedModel) else None
    notes: list[str] = []
    unique = list(dict.fromkeys(dtype_name(n) for n in names))  # "bf16" == "bfloat16"
    progress_bar = Bar(len(unique) * repeats, "dtype sweep", progress, bar)

    def point(name: str) -> dict:
        dt = DTYPES[name]
        if not dtype_supported(dev, dt):
            notes.append(f"{name}: not supported on {dev}")
            progress_bar.update(repeats)
            return {
                "dtype": name,
                "supported": False,
                "batch": batch_size,
                "context_len": context_len,
            }
        return _row(lm, dt, dev, context_len, batch_size, repeats, seed, progress_bar.update)

    try:
        rows = measure_points(unique, point, notes, label=lambda n: n, stop=stop)
    finally:
        progress_bar.close()
    return frame(rows, COLUMNS, _attrs(first.info.name if first else lm, dev, rows, repeats, notes))


def _attrs(model: str, dev: torch.device, rows: list[dict], repeats: int, notes: list[str]) -> dict:
    """The sweep's attrs: what was measured, how, and the peaks of each supported dtype."""
    return {
        "sweep": "dtype",
        "model": model,
        "device": str(dev),
        "dtype": [r["dtype"] for r in rows],
        "repeats": repeats,
        "warmup": 1,
        "statistic": "median",
        "threads": torch.get_num_threads(),
        "timer": Timer(dev).method,
        "load_average": hardware.load_average(),
        "peaks": {
            r["dtype"]: plain_peaks(hardware.measure(dev, r["dtype"]))
            for r in rows
            if r["supported"]
        },
        "notes": notes,
        "columns": {c: GLOSSARY[c] for c in COLUMNS},
    }


def _row(
    lm, dt: torch.dtype, dev, context_len: int, batch_size: int, repeats: int, seed: int, tick
) -> dict:
    m = in_dtype(lm, dt, dev)
    check_context(m.info, context_len)
    peaks = hardware.measure(dev, dt)
    prompt = token_ids(m.info, batch_size, context_len - 1, dev, seed)
    cache = prefill_cache(m.model, prompt)
    feed = token_ids(m.info, batch_size, 1, dev, seed + 1)
    timed = time_decode(m.model, cache, feed, repeats=repeats, warmup=1, device=dev, tick=tick)
    latency = timed.estimate
    forward(m.model, feed, cache, last_only=True)
    row = {
        "dtype": m.info.dtype,
        "supported": True,
        "batch": batch_size,
        "context_len": context_len,
        "weight_bytes_counted": m.info.weight_bytes,
        "kv_cache_bytes_measured": kv_cache_bytes(cache),
        "latency_s_measured": latency,
        **noise_columns(timed),
        "tokens_per_s_measured": 1 / latency,
        "peak_flops_measured": peaks.flops,
        **modelled(m.info, peaks, batch=batch_size, tokens_fed=1, context_len=context_len),
    }
    row.pop("intensity_modelled")
    derived(row, peaks)
    return row


SWEEP = register(
    Sweep(
        name="dtype",
        title="dtype",
        run=run,
        columns=COLUMNS,
        order=40,
        help="the model converted to each (float16 is slow on most CPUs)",
        params=(
            Param(
                "dtypes", "names", "dtypes", "float32, bfloat16", "e.g. float32,bfloat16,float16"
            ),
            CONTEXT,
            REPEATS,
        ),
    )
)
