"""KV cache on vs off: per-step latency and cumulative time vs position (batch 1)."""

from __future__ import annotations

import threading

import pandas as pd
import torch
from transformers import DynamicCache

from explorer import costs
from explorer.costs.timing import Timer
from explorer.model.loader import LoadedModel, ModelInfo
from explorer.model.passes import forward, kv_cache_bytes
from explorer.sweeps import REPEATS, Param, Sweep, register
from explorer.sweeps._common import (
    NOISE_COLUMNS,
    Bar,
    Progress,
    attrs,
    check_context,
    check_count,
    frame,
    from_steps,
    measure_points,
    modelled,
    noise_columns,
    peaks_for,
    prefill_cache,
    token_ids,
)

COLUMNS = [
    "mode",
    "use_cache",
    "step",
    "phase",
    "tokens_fed",
    "context_len",
    "latency_s_measured",
    "cumulative_s_measured",
    "kv_cache_bytes_measured",
    "flops_modelled",
    "bytes_modelled",
    "bound_s_modelled",
    "cumulative_bound_s_modelled",
    *NOISE_COLUMNS,
]


def generate_timed(
    model, prompt: torch.Tensor, new_tokens: int, use_cache: bool, device
) -> list[tuple[float, int, float | None]]:
    """Greedy generation of new_tokens, one timed forward per token: [(seconds, kv bytes after,
    the pass's CPU share (Timer.cpu_share))]."""
    ids, cache, out = prompt, (DynamicCache() if use_cache else None), []
    timer = Timer(torch.device(device))
    for _ in range(new_tokens):
        past = cache.get_seq_length() if cache is not None else 0
        feed = ids[:, past:] if use_cache else ids  # [1, T]
        with timer.region():
            logits, cache = forward(model, feed, cache, last_only=True)
        out.append((timer.seconds, kv_cache_bytes(cache), timer.cpu_share))
        ids = torch.cat([ids, logits[:, -1].argmax(-1, keepdim=True)], dim=1)  # [1, L + 1]
    return out


def run(
    lm: LoadedModel,
    *,
    new_tokens: int = 64,
    prompt_len: int = 8,
    repeats: int = 1,
    peaks=None,
    progress: Progress | None = None,
    bar: bool = True,
    seed: int = 0,
    stop: threading.Event | None = None,
) -> pd.DataFrame:
    """Per-step latency and cumulative time vs position with the KV cache on and off (batch 1).

    Each mode generates new_tokens greedily after a prompt_len prompt (prefill + new_tokens - 1
    decode passes). repeats > 1 repeats each whole generation and takes a per-step low quantile
    (explorer.costs.noise; the noise columns say how busy the machine was).
    Without the cache every pass feeds the whole sequence, so cumulative time grows quadratically.
    """
    check_count("new_tokens", new_tokens)
    check_count("prompt_len", prompt_len)
    check_count("repeats", repeats)
    check_context(lm.info, prompt_len + new_tokens - 1, "prompt_len + new_tokens - 1")
    peaks = peaks_for(lm, peaks)
    prompt = token_ids(lm.info, 1, prompt_len, lm.device, seed)
    prefill_cache(lm.model, prompt)  # warm-up, untimed
    notes: list[str] = []
    progress_bar = Bar(2 * repeats, "cache sweep", progress, bar)

    def mode(use_cache: bool) -> list[dict]:
        runs = []
        for _ in range(repeats):
            runs.append(generate_timed(lm.model, prompt, new_tokens, use_cache, lm.device))
            progress_bar.update()
        return _rows(lm.info, peaks, runs, prompt_len, use_cache)

    try:
        rows = measure_points(
            (True, False), mode, notes, label=lambda on: f"cache={'on' if on else 'off'}", stop=stop
        )
    finally:
        progress_bar.close()
    return frame(
        rows,
        COLUMNS,
        attrs(
            "cache",
            lm,
            peaks,
            notes,
            COLUMNS,
            repeats=repeats,
            warmup=1,
            prompt_len=prompt_len,
            new_tokens=new_tokens,
        ),
    )


def _rows(info: ModelInfo, peaks, runs, prompt_len: int, use_cache: bool) -> list[dict]:
    rows, total, total_bound = [], 0.0, 0.0
    for step, (fed, context) in enumerate(
        costs.generation_steps(prompt_len, len(runs[0]), use_cache)
    ):
        timed = from_steps([run[step][0] for run in runs], [run[step][2] for run in runs])
        latency = timed.estimate
        model = modelled(
            info, peaks, batch=1, tokens_fed=fed, context_len=context, use_cache=use_cache
        )
        total += latency
        total_bound += model["bound_s_modelled"]
        rows.append(
            {
                "mode": "cache on" if use_cache else "cache off",
                "use_cache": use_cache,
                "step": step,
                "phase": "prefill" if step == 0 else "decode",
                "tokens_fed": fed,
                "context_len": context,
                "latency_s_measured": latency,
                **noise_columns(timed),
                "cumulative_s_measured": total,
                "kv_cache_bytes_measured": runs[0][step][1],
                "flops_modelled": model["flops_modelled"],
                "bytes_modelled": model["bytes_modelled"],
                "bound_s_modelled": model["bound_s_modelled"],
                "cumulative_bound_s_modelled": total_bound,
            }
        )
    return rows


SWEEP = register(
    Sweep(
        name="cache",
        title="KV cache on/off",
        run=run,
        columns=COLUMNS,
        order=10,
        help="tokens generated with the cache on, then off (batch 1)",
        params=(
            Param("new_tokens", "int", "new tokens", "48", "tokens generated per mode"),
            REPEATS,
        ),
    )
)
