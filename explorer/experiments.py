"""Sweeps that show where inference time goes, each a tidy pandas DataFrame.

    cache(lm)    per-step latency and cumulative time vs position, KV cache on vs off
    prefill(lm)  prefill time and tokens/s vs prompt length; decode latency vs context length
    batch(lm)    decode step latency, per-user and total tokens/s vs batch size, the roofline knee
    dtype(lm)    fp32 vs bf16 vs fp16: bytes and measured decode latency

Column names say what each figure is: `*_measured` (timed here: device-synchronised, warm-up
discarded, median of `repeats`), `*_modelled` (explorer.costs formulas, against the peaks in
attrs["peaks"]) and `*_derived` (modelled bytes / measured time). df.attrs holds the device,
dtype, repeats, threads, timer, the peaks, a description of every column, and "notes": why a
sweep stopped early (out of memory, beyond the model's positions) -- a sweep never crashes on a
size that does not fit and never loses the rows it already has.

Every sweep runs explorer.engine.forward (the same phase function the Session uses) with
last_only=True (logits of the last position only, as generate() does); token ids are drawn from
a seeded generator, so a sweep feeds the same tokens every time.
"""

from __future__ import annotations

import copy
import gc
import statistics
from collections.abc import Callable, Iterable
from typing import Any

import pandas as pd
import torch
from transformers import DynamicCache

from explorer import costs, hardware
from explorer.engine import copy_cache, crop_cache, forward, kv_cache_bytes
from explorer.loading import DTYPES, LoadedModel, ModelInfo, load, model_info, resolve_device
from explorer.timing import Timer, time_call

Progress = Callable[[int, int], None]

COLUMNS: dict[str, str] = {
    "mode": "'cache on' or 'cache off'",
    "use_cache": "whether the KV cache was used",
    "step": "forward pass index (0 = prefill)",
    "phase": "'prefill' or 'decode'",
    "batch": "rows in the batch",
    "tokens_fed": "tokens fed per row in this pass",
    "context_len": "tokens attended over (cached prefix + fed)",
    "dtype": "parameter and cache dtype",
    "supported": "whether the device ran this dtype",
    "latency_s_measured": "forward pass, device-synchronised, median of repeats (s)",
    "cumulative_s_measured": "running sum of latency_s_measured (s)",
    "tokens_per_s_measured": "tokens produced (decode) or processed (prefill) per second, per row",
    "tokens_per_s_total_measured": "batch / latency: tokens per second over all rows",
    "tokens_per_s_per_user_measured": "1 / latency: tokens per second each row sees",
    "kv_cache_bytes_measured": "bytes the DynamicCache tensors hold after the pass",
    "weight_bytes_counted": "bytes of the model's parameter tensors (counted, tied once)",
    "flops_modelled": "FLOPs of the pass (explorer.costs)",
    "bytes_modelled": "bytes the roofline counts: weights + KV (explorer.costs.bound_bytes)",
    "intensity_modelled": "flops_modelled / bytes_modelled (FLOP per byte)",
    "bound_s_modelled": "roofline lower bound max(FLOPs / peak FLOP/s, bytes / peak GB/s) (s)",
    "bound_modelled": "'memory' or 'compute': which side of the roofline binds",
    "cumulative_bound_s_modelled": "running sum of bound_s_modelled (s)",
    "tokens_per_s_total_bound_modelled": "batch / bound_s_modelled: the roofline's best total tokens/s",
    "knee_batch_modelled": "smallest batch at which decode becomes compute-bound (roofline)",
    "peak_flops_measured": "dense matmul FLOP/s of this device in this dtype (explorer.hardware)",
    "achieved_gbps_derived": "bytes_modelled / latency_s_measured (GB/s)",
    "pct_of_peak_bw_derived": "achieved_gbps_derived / measured peak bandwidth x 100",
}


# --- small helpers -------------------------------------------------------------------------------


class _Bar:
    """A tqdm.auto bar (notebook-aware) plus an optional progress(done, total) callback."""

    def __init__(self, total: int, desc: str, progress: Progress | None, bar: bool):
        from tqdm.auto import tqdm

        self.total, self.done, self.callback = total, 0, progress
        self.tqdm = tqdm(total=total, desc=desc, leave=False) if bar else None

    def update(self, n: int = 1) -> None:
        self.done += n
        if self.tqdm is not None:
            self.tqdm.update(n)
        if self.callback is not None:
            self.callback(self.done, self.total)

    def close(self) -> None:
        if self.tqdm is not None:
            self.tqdm.close()


def is_out_of_memory(err: BaseException) -> bool:
    """torch.OutOfMemoryError, MemoryError, or a RuntimeError saying the allocator ran out."""
    oom = getattr(torch, "OutOfMemoryError", None) or getattr(torch.cuda, "OutOfMemoryError", ())
    if isinstance(err, (MemoryError,) + ((oom,) if isinstance(oom, type) else ())):
        return True
    text = str(err).lower()
    return isinstance(err, RuntimeError) and ("out of memory" in text or "can't allocate memory" in text)


def available_bytes(device: torch.device) -> int | None:
    """Memory free for new tensors: cudaMemGetInfo on CUDA; MemAvailable (and any cgroup limit) on CPU."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    if device.type != "cpu":
        return None
    free = None
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemAvailable:"):
                free = int(line.split()[1]) * 1024
    except OSError:
        return None
    try:
        limit, used = (open(f"/sys/fs/cgroup/memory.{k}").read().strip() for k in ("max", "current"))
        if limit != "max" and free is not None:
            free = min(free, int(limit) - int(used))
    except (OSError, ValueError):
        pass
    return free


def _gb(n: float) -> str:
    return f"{n / 1e9:.2f} GB"


def _check_count(name: str, value, low: int = 1) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ValueError(f"{name} must be a whole number >= {low}, got {value!r}")


def _sizes(name: str, values: Iterable[int], low: int = 1) -> list[int]:
    values = list(values)
    if not values:
        raise ValueError(f"{name} must list at least one size")
    for v in values:
        _check_count(f"every value of {name}", v, low)
    return sorted(set(values))


def _check_context(info: ModelInfo, context_len: int, what: str = "context_len") -> None:
    if info.max_positions and context_len > info.max_positions:
        raise ValueError(f"{what} {context_len} exceeds the model's {info.max_positions} positions")


def _token_ids(info: ModelInfo, rows: int, length: int, device, seed: int) -> torch.Tensor:
    gen = torch.Generator(device="cpu").manual_seed(seed)
    return torch.randint(0, info.vocab_size, (rows, length), generator=gen).to(device)  # [B, T]


def _peaks(lm: LoadedModel, peaks) -> hardware.Peaks:
    return peaks if peaks is not None else hardware.measure(lm.device, lm.info.dtype)


def _plain_peaks(peaks) -> dict[str, Any]:
    d = peaks.to_dict()
    d.pop("details", None)
    return d


def _attrs(sweep: str, lm: LoadedModel, peaks, repeats: int, warmup: int, notes: list[str], columns,
           **extra) -> dict[str, Any]:
    peaks_d = _plain_peaks(peaks)
    return {"sweep": sweep, "model": lm.info.name, "device": str(lm.device), "dtype": lm.info.dtype,
            "repeats": repeats, "warmup": warmup, "statistic": "median", "threads": torch.get_num_threads(),
            "timer": Timer(lm.device).method, "load_average": hardware.load_average(), "peaks": peaks_d, "notes": notes,
            "columns": {c: COLUMNS[c] for c in columns}, **extra}


def _frame(rows: list[dict], columns: list[str], attrs: dict) -> pd.DataFrame:
    df = pd.DataFrame(rows, columns=columns)
    df.attrs.update(attrs)
    return df


def _modelled(info: ModelInfo, peaks, *, batch: int, tokens_fed: int, context_len: int, use_cache: bool = True
              ) -> dict[str, Any]:
    cost = costs.forward_cost(info, batch=batch, tokens_fed=tokens_fed, context_len=context_len,
                              use_cache=use_cache, logits_positions=1)
    bound_s, bound = costs.roofline(cost.total_flops, cost.bound_bytes, peaks)
    return {"flops_modelled": cost.total_flops, "bytes_modelled": cost.bound_bytes,
            "intensity_modelled": cost.intensity, "bound_s_modelled": bound_s, "bound_modelled": bound}


def _derived(row: dict, peaks) -> None:
    gbps = row["bytes_modelled"] / row["latency_s_measured"] / 1e9
    row["achieved_gbps_derived"] = gbps
    row["pct_of_peak_bw_derived"] = 100.0 * gbps / peaks.bandwidth_gbps


def _prefill(model, ids: torch.Tensor) -> DynamicCache:
    return forward(model, ids, DynamicCache(), last_only=True)[1]


def time_decode(model, cache: DynamicCache, feed: torch.Tensor, *, repeats: int, warmup: int, device,
                tick: Callable[[], None] | None = None) -> list[float]:
    """Seconds of `repeats` decode passes feeding `feed` [B, 1] onto `cache`, each from the same
    cache length (cropped back after every pass); `warmup` untimed passes first."""
    past = cache.get_seq_length()
    samples = []
    for i in range(warmup + repeats):
        _, seconds = time_call(lambda: forward(model, feed, cache, last_only=True), device)
        crop_cache(cache, past)
        if i >= warmup:
            samples.append(seconds)
            if tick is not None:
                tick()
    return samples


# --- cache on vs off -----------------------------------------------------------------------------

CACHE_COLUMNS = ["mode", "use_cache", "step", "phase", "tokens_fed", "context_len", "latency_s_measured",
                 "cumulative_s_measured", "kv_cache_bytes_measured", "flops_modelled", "bytes_modelled",
                 "bound_s_modelled", "cumulative_bound_s_modelled"]


def _generate_timed(model, prompt: torch.Tensor, new_tokens: int, use_cache: bool, device
                    ) -> list[tuple[float, int]]:
    """Greedy generation of new_tokens, one timed forward per token: [(seconds, kv bytes after)]."""
    ids, cache, out = prompt, (DynamicCache() if use_cache else None), []
    for _ in range(new_tokens):
        past = cache.get_seq_length() if cache is not None else 0
        feed = ids[:, past:] if use_cache else ids  # [1, T]
        (logits, cache), seconds = time_call(lambda: forward(model, feed, cache, last_only=True), device)  # noqa: B023
        out.append((seconds, kv_cache_bytes(cache)))
        ids = torch.cat([ids, logits[:, -1].argmax(-1, keepdim=True)], dim=1)  # [1, L + 1]
    return out


def cache(lm: LoadedModel, *, new_tokens: int = 64, prompt_len: int = 8, repeats: int = 1, peaks=None,
          progress: Progress | None = None, bar: bool = True, seed: int = 0) -> pd.DataFrame:
    """Per-step latency and cumulative time vs position with the KV cache on and off (batch 1).

    Each mode generates new_tokens greedily after a prompt_len prompt (prefill + new_tokens - 1
    decode passes). repeats > 1 repeats each whole generation and takes per-step medians.
    Without the cache every pass feeds the whole sequence, so cumulative time grows quadratically.
    """
    _check_count("new_tokens", new_tokens)
    _check_count("prompt_len", prompt_len)
    _check_count("repeats", repeats)
    _check_context(lm.info, prompt_len + new_tokens - 1, "prompt_len + new_tokens - 1")
    peaks = _peaks(lm, peaks)
    prompt = _token_ids(lm.info, 1, prompt_len, lm.device, seed)
    _prefill(lm.model, prompt)  # warm-up, untimed
    rows, notes = [], []
    progress_bar = _Bar(2 * repeats, "cache sweep", progress, bar)
    try:
        for use_cache in (True, False):
            try:
                runs = []
                for _ in range(repeats):
                    runs.append(_generate_timed(lm.model, prompt, new_tokens, use_cache, lm.device))
                    progress_bar.update()
            except Exception as err:
                if not is_out_of_memory(err):
                    raise
                notes.append(f"stopped cache={'on' if use_cache else 'off'}: out of memory ({err})")
                continue
            rows += _cache_rows(lm.info, peaks, runs, prompt_len, use_cache)
    finally:
        progress_bar.close()
    return _frame(rows, CACHE_COLUMNS, _attrs("cache", lm, peaks, repeats, 1, notes, CACHE_COLUMNS,
                                              prompt_len=prompt_len, new_tokens=new_tokens))


def _cache_rows(info: ModelInfo, peaks, runs, prompt_len: int, use_cache: bool) -> list[dict]:
    rows, total, total_bound = [], 0.0, 0.0
    for step, (fed, context) in enumerate(costs.generation_steps(prompt_len, len(runs[0]), use_cache)):
        latency = statistics.median(run[step][0] for run in runs)
        model = _modelled(info, peaks, batch=1, tokens_fed=fed, context_len=context, use_cache=use_cache)
        total += latency
        total_bound += model["bound_s_modelled"]
        rows.append({"mode": "cache on" if use_cache else "cache off", "use_cache": use_cache, "step": step,
                     "phase": "prefill" if step == 0 else "decode", "tokens_fed": fed, "context_len": context,
                     "latency_s_measured": latency, "cumulative_s_measured": total,
                     "kv_cache_bytes_measured": runs[0][step][1], "flops_modelled": model["flops_modelled"],
                     "bytes_modelled": model["bytes_modelled"], "bound_s_modelled": model["bound_s_modelled"],
                     "cumulative_bound_s_modelled": total_bound})
    return rows


# --- prefill vs decode ---------------------------------------------------------------------------

PREFILL_COLUMNS = ["phase", "context_len", "tokens_fed", "latency_s_measured", "tokens_per_s_measured",
                   "flops_modelled", "bytes_modelled", "intensity_modelled", "bound_s_modelled", "bound_modelled",
                   "achieved_gbps_derived", "pct_of_peak_bw_derived"]


def prefill(lm: LoadedModel, *, lengths: Iterable[int] = (16, 32, 64, 128, 256, 512, 1024, 2048), repeats: int = 3,
            decode: bool = True, peaks=None, progress: Progress | None = None, bar: bool = True,
            seed: int = 0) -> pd.DataFrame:
    """Prefill latency and tokens/s vs prompt length, and (decode=True) the latency of one decode pass
    at each context length, with the modelled arithmetic intensity of each. Lengths beyond the
    model's positions, or that run out of memory, end the sweep with a note."""
    lengths = _sizes("lengths", lengths)
    _check_count("repeats", repeats)
    peaks = _peaks(lm, peaks)
    ids = _token_ids(lm.info, 1, max(lengths) + 1, lm.device, seed)
    _prefill(lm.model, ids[:, : min(lengths)])  # warm-up, untimed
    rows, notes = [], []
    progress_bar = _Bar(len(lengths) * repeats * (2 if decode else 1), "prefill sweep", progress, bar)
    try:
        for L in lengths:
            if lm.info.max_positions and L > lm.info.max_positions:
                notes.append(f"stopped at length {L}: beyond the model's {lm.info.max_positions} positions")
                break
            try:
                rows += _prefill_rows(lm, peaks, ids, L, repeats, decode, progress_bar.update)
            except Exception as err:
                if not is_out_of_memory(err):
                    raise
                notes.append(f"stopped at length {L}: out of memory ({err})")
                break
    finally:
        progress_bar.close()
        gc.collect()
    return _frame(rows, PREFILL_COLUMNS, _attrs("prefill", lm, peaks, repeats, 1, notes, PREFILL_COLUMNS))


def _prefill_rows(lm: LoadedModel, peaks, ids: torch.Tensor, L: int, repeats: int, decode: bool, tick
                  ) -> list[dict]:
    samples, cache = [], None
    for _ in range(repeats):
        cache, seconds = time_call(lambda: _prefill(lm.model, ids[:, :L]), lm.device)
        samples.append(seconds)
        tick()
    latency = statistics.median(samples)
    row = {"phase": "prefill", "context_len": L, "tokens_fed": L, "latency_s_measured": latency,
           "tokens_per_s_measured": L / latency, **_modelled(lm.info, peaks, batch=1, tokens_fed=L, context_len=L)}
    _derived(row, peaks)
    rows = [row]
    if decode and L >= 2:
        crop_cache(cache, L - 1)
        samples = time_decode(lm.model, cache, ids[:, L - 1: L], repeats=repeats, warmup=1, device=lm.device,
                              tick=tick)
        latency = statistics.median(samples)
        row = {"phase": "decode", "context_len": L, "tokens_fed": 1, "latency_s_measured": latency,
               "tokens_per_s_measured": 1 / latency,
               **_modelled(lm.info, peaks, batch=1, tokens_fed=1, context_len=L)}
        _derived(row, peaks)
        rows.append(row)
    return rows


# --- batch size ----------------------------------------------------------------------------------

BATCH_COLUMNS = ["batch", "context_len", "latency_s_measured", "tokens_per_s_per_user_measured",
                 "tokens_per_s_total_measured", "flops_modelled", "bytes_modelled", "intensity_modelled",
                 "bound_s_modelled", "bound_modelled", "tokens_per_s_total_bound_modelled", "knee_batch_modelled",
                 "achieved_gbps_derived", "pct_of_peak_bw_derived"]


def batch_memory_bytes(info: ModelInfo, batch: int, context_len: int) -> int:
    """Modelled extra memory one decode pass at this batch needs: the repeated cache, the copy
    DynamicCache's torch.cat makes while growing it, the logits, and the layer activations."""
    shape = costs.shape_of(info)
    kv = batch * context_len * shape.kv_bytes_per_token
    logits = batch * info.vocab_size * (shape.bytes_per_value + 4) * 2
    acts = batch * shape.act_elems * shape.bytes_per_value
    return 2 * kv + logits + acts


def batch(lm: LoadedModel, *, batches: Iterable[int] = (1, 2, 4, 8, 16, 32, 64, 128, 256), context_len: int = 128,
          repeats: int = 3, peaks=None, memory_limit_bytes: int | None = None, progress: Progress | None = None,
          bar: bool = True, seed: int = 0) -> pd.DataFrame:
    """Decode step latency, per-user and total tokens/s vs batch size at a fixed context length.

    One prompt of context_len - 1 tokens is prefilled once; each batch size repeats that cache B
    times (DynamicCache.batch_repeat_interleave) and times decode passes of B tokens. Batches run
    smallest first; the first one that would not fit (a pre-check of the modelled memory against
    memory_limit_bytes or the free memory, or an out-of-memory error) ends the sweep with a note.
    attrs["knee_batch_modelled"]: the roofline's batch where decode stops being memory-bound.
    """
    batches = _sizes("batches", batches)
    _check_count("context_len", context_len, 2)
    _check_count("repeats", repeats)
    _check_context(lm.info, context_len)
    peaks = _peaks(lm, peaks)
    knee = costs.decode_knee(lm.info, context_len=context_len, peaks=peaks)
    prompt = _token_ids(lm.info, 1, context_len - 1, lm.device, seed)
    base = _prefill(lm.model, prompt)
    rows, notes = [], []
    progress_bar = _Bar(len(batches) * repeats, "batch sweep", progress, bar)
    try:
        for B in batches:
            reason = _wont_fit(lm, B, context_len, memory_limit_bytes)
            if reason:
                notes.append(f"stopped at B={B}: {reason}")
                break
            try:
                rows.append(_batch_row(lm, peaks, base, B, context_len, repeats, knee, seed, progress_bar.update))
            except Exception as err:
                if not is_out_of_memory(err):
                    raise
                notes.append(f"stopped at B={B}: out of memory ({str(err).splitlines()[0]})")
                break
            finally:
                gc.collect()
    finally:
        progress_bar.close()
    return _frame(rows, BATCH_COLUMNS, _attrs("batch", lm, peaks, repeats, 1, notes, BATCH_COLUMNS,
                                              context_len=context_len, knee_batch_modelled=knee))


def _wont_fit(lm: LoadedModel, B: int, context_len: int, limit: int | None) -> str | None:
    need = batch_memory_bytes(lm.info, B, context_len)
    free = available_bytes(lm.device) if limit is None else limit
    if free is not None and need > 0.9 * free:
        return f"needs about {_gb(need)} (modelled), {_gb(free)} available"
    return None


def _batch_row(lm: LoadedModel, peaks, base: DynamicCache, B: int, context_len: int, repeats: int, knee,
               seed: int, tick) -> dict:
    cache = copy_cache(base)
    with torch.inference_mode():
        cache.batch_repeat_interleave(B)  # [B, kv_heads, L - 1, head_dim] per layer
    feed = _token_ids(lm.info, B, 1, lm.device, seed + 1)  # [B, 1]
    samples = time_decode(lm.model, cache, feed, repeats=repeats, warmup=1, device=lm.device, tick=tick)
    del cache
    latency = statistics.median(samples)
    model = _modelled(lm.info, peaks, batch=B, tokens_fed=1, context_len=context_len)
    row = {"batch": B, "context_len": context_len, "latency_s_measured": latency,
           "tokens_per_s_per_user_measured": 1 / latency, "tokens_per_s_total_measured": B / latency, **model,
           "tokens_per_s_total_bound_modelled": B / model["bound_s_modelled"], "knee_batch_modelled": knee}
    _derived(row, peaks)
    return row


# --- dtype ---------------------------------------------------------------------------------------

DTYPE_COLUMNS = ["dtype", "supported", "batch", "context_len", "weight_bytes_counted", "kv_cache_bytes_measured",
                 "latency_s_measured", "tokens_per_s_measured", "peak_flops_measured", "flops_modelled",
                 "bytes_modelled", "bound_s_modelled", "bound_modelled", "achieved_gbps_derived",
                 "pct_of_peak_bw_derived"]


def dtype_supported(device: torch.device, dt: torch.dtype) -> bool:
    """Whether the device runs a matmul in this dtype."""
    if device.type == "cuda" and dt == torch.bfloat16 and not torch.cuda.is_bf16_supported():
        return False
    try:
        a = torch.ones(8, 8, device=device, dtype=dt)
        (a @ a).sum().item()
    except (RuntimeError, TypeError):
        return False
    return True


def _in_dtype(lm: LoadedModel | str, dt: torch.dtype, device) -> LoadedModel:
    if isinstance(lm, str):
        return load(lm, device=device, dtype=dt)
    if lm.model.dtype == dt:
        return lm
    model = copy.deepcopy(lm.model).to(dt)
    info = model_info(model, name=lm.info.name, source=lm.info.source, random_weights=lm.info.random_weights,
                      hub_id=lm.info.hub_id)
    return LoadedModel(model=model, tokenizer=lm.tokenizer, info=info)


def dtype(lm: LoadedModel | str, *, dtypes: Iterable[str] = ("float32", "bfloat16", "float16"), context_len: int = 64,
          batch_size: int = 1, repeats: int = 3, device: str | torch.device | None = None,
          progress: Progress | None = None, bar: bool = True, seed: int = 0) -> pd.DataFrame:
    """Decode step latency and bytes in each dtype the device supports (a loaded model is copied and
    converted; a name is loaded in each dtype). Peaks are measured per dtype (explorer.hardware)."""
    names = list(dtypes)
    if not names:
        raise ValueError("dtypes must list at least one dtype, e.g. ('float32', 'bfloat16')")
    for name in names:
        if name not in DTYPES:
            raise ValueError(f"unknown dtype {name!r}; use one of {sorted(set(DTYPES))}")
    _check_count("context_len", context_len, 2)
    _check_count("batch_size", batch_size)
    _check_count("repeats", repeats)
    dev = resolve_device(device or (lm.device if isinstance(lm, LoadedModel) else "auto"))
    first = lm if isinstance(lm, LoadedModel) else None
    rows, notes = [], []
    unique = list(dict.fromkeys(str(DTYPES[n]).replace("torch.", "") for n in names))  # "bf16" == "bfloat16"
    progress_bar = _Bar(len(unique) * repeats, "dtype sweep", progress, bar)
    try:
        for name in unique:
            dt = DTYPES[name]
            if not dtype_supported(dev, dt):
                notes.append(f"{name}: not supported on {dev}")
                rows.append({"dtype": name, "supported": False, "batch": batch_size, "context_len": context_len})
                progress_bar.update(repeats)
                continue
            try:
                row = _dtype_row(lm, dt, dev, context_len, batch_size, repeats, seed, progress_bar.update)
            except Exception as err:
                if not is_out_of_memory(err):
                    raise
                notes.append(f"stopped at {name}: out of memory ({str(err).splitlines()[0]})")
                break
            finally:
                gc.collect()
            rows.append(row)
    finally:
        progress_bar.close()
    attrs = {"sweep": "dtype", "model": first.info.name if first else lm, "device": str(dev),
             "dtype": [r["dtype"] for r in rows], "repeats": repeats, "warmup": 1, "statistic": "median",
             "threads": torch.get_num_threads(), "timer": Timer(dev).method, "load_average": hardware.load_average(),
             "peaks": {r["dtype"]: _plain_peaks(hardware.measure(dev, r["dtype"])) for r in rows if r["supported"]},
             "notes": notes, "columns": {c: COLUMNS[c] for c in DTYPE_COLUMNS}}
    return _frame(rows, DTYPE_COLUMNS, attrs)


def _dtype_row(lm, dt: torch.dtype, dev, context_len: int, batch_size: int, repeats: int, seed: int, tick) -> dict:
    m = _in_dtype(lm, dt, dev)
    _check_context(m.info, context_len)
    peaks = hardware.measure(dev, dt)
    prompt = _token_ids(m.info, batch_size, context_len - 1, dev, seed)
    cache = _prefill(m.model, prompt)
    feed = _token_ids(m.info, batch_size, 1, dev, seed + 1)
    samples = time_decode(m.model, cache, feed, repeats=repeats, warmup=1, device=dev, tick=tick)
    latency = statistics.median(samples)
    forward(m.model, feed, cache, last_only=True)
    row = {"dtype": m.info.dtype, "supported": True, "batch": batch_size, "context_len": context_len,
           "weight_bytes_counted": m.info.weight_bytes, "kv_cache_bytes_measured": kv_cache_bytes(cache),
           "latency_s_measured": latency, "tokens_per_s_measured": 1 / latency, "peak_flops_measured": peaks.flops,
           **_modelled(m.info, peaks, batch=batch_size, tokens_fed=1, context_len=context_len)}
    row.pop("intensity_modelled")
    _derived(row, peaks)
    return row
