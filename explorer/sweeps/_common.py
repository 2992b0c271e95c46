"""What every sweep shares: the column glossary, timing of decode passes, modelled and derived
columns, the attrs every frame carries, and the one loop that runs a sweep's points.

Column names say what each figure is: `*_measured` (timed here: device-synchronised, warm-up
discarded, a low quantile of `repeats`, with its noise columns), `*_modelled` (explorer.costs formulas, against the peaks in
attrs["peaks"]) and `*_derived` (modelled bytes / measured time). df.attrs holds the device,
dtype, repeats, threads, timer, the peaks, a description of every column, and "notes": why a
sweep stopped early (out of memory, beyond the model's positions, a Stop, Ctrl-C) -- a sweep never
crashes on a size that does not fit and never loses the rows it already has.

Every sweep runs explorer.engine.forward (the same phase function the Session uses) with
last_only=True (logits of the last position only, as generate() does); token ids are drawn from
a seeded generator, so a sweep feeds the same tokens every time.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Callable, Iterable
from typing import Any

import pandas as pd
import torch
from transformers import DynamicCache

from explorer import costs
from explorer._heap import new_objects_only
from explorer.costs import hardware, noise
from explorer.costs.split import utilisation
from explorer.costs.timing import Measurement, Timer, measure
from explorer.model.device import is_out_of_memory
from explorer.model.loader import LoadedModel, ModelInfo
from explorer.model.passes import crop_cache, forward

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
    "latency_s_measured": "forward pass, device-synchronised, a low quantile of the repeats (s; "
    "explorer.costs.noise: p25 from 4 repeats, else the minimum)",
    "spread_measured": "(median - estimate) / estimate of the repeats behind the row's time",
    "cpu_share_measured": "share of the timed wall time x threads this process ran on a CPU",
    "noisy": "the row's time is noisy: spread or other work past explorer.costs.noise's limits",
    "noisy_reason": "why the row is noisy (e.g. other work took 40% of this CPU)",
    "cumulative_s_measured": "running sum of latency_s_measured (s)",
    "tokens_per_s_measured": "tokens produced (decode) or processed (prefill) per second, per row",
    "tokens_per_s_total_measured": "batch / latency: tokens per second over all rows",
    "tokens_per_s_per_user_measured": "1 / latency: tokens per second each row sees",
    "kv_cache_bytes_measured": "bytes the DynamicCache tensors hold after the pass",
    "weight_bytes_counted": "bytes of the model's parameter tensors (counted, tied once)",
    "flops_modelled": "FLOPs of the pass (explorer.costs)",
    "bytes_modelled": "bytes the roofline counts: weights + KV (explorer.costs.bound_bytes)",
    "intensity_modelled": "flops_modelled / bytes_modelled (FLOP per byte)",
    "overhead_s_derived": "latency_s_measured - bound_s_modelled: what the floors do not explain (s)",
    "mbu_derived": "model bandwidth utilisation: bytes_modelled / latency / peak bandwidth",
    "mfu_derived": "model FLOP/s utilisation: flops_modelled / latency / peak FLOP/s",
    "regime_derived": "memory | compute | overhead (explorer.costs.split.REGIME_RULE against "
    "attrs['overhead_floor_s'] where measured, else overhead when latency > 2x the bound)",
    "kv_bytes_modelled": "K/V bytes read from the cache by the pass (batch x cached tokens x KV bytes/token)",
    "kv_over_weights_modelled": "kv_bytes_modelled / weight bytes: > 1 where the cache outweighs the model",
    "latency_s_calibrated": "latency predicted by the calibrated cost model (attrs['calibration']) (s)",
    "calibrated_err_pct_derived": "(latency_s_calibrated - latency_s_measured) / latency_s_measured x 100",
    "bound_err_pct_derived": "(bound_s_modelled - latency_s_measured) / latency_s_measured x 100",
    "knee_batch_measured": "smallest batch whose decode step takes over 2x the smallest batch's",
    "bound_s_modelled": "roofline lower bound max(FLOPs / peak FLOP/s, bytes / peak GB/s) (s)",
    "bound_modelled": "'memory' or 'compute': which side of the roofline binds",
    "cumulative_bound_s_modelled": "running sum of bound_s_modelled (s)",
    "tokens_per_s_total_bound_modelled": "batch / bound_s_modelled: the roofline's best total tokens/s",
    "knee_batch_modelled": "smallest batch at which decode becomes compute-bound (roofline)",
    "peak_flops_measured": "dense matmul FLOP/s of this device in this dtype (explorer.costs.hardware)",
    "achieved_gbps_derived": "bytes_modelled / latency_s_measured (GB/s)",
    "pct_of_peak_bw_derived": "achieved_gbps_derived / measured peak bandwidth x 100",
    # the optimisation ladder (explorer.sweeps.ladder): the keys its --json rows promise
    "rung": "the optimisation (RUNGS: Session options, prompt lookup or prefix caching)",
    "weights": "the weights that ran, with their backend (int8:fbgemm, int8:torchao, bf16, ...)",
    "ms_per_token": "median decode Step latency (each row gets one token per step), ms, measured "
    "after a warm-up Session and after any compile; prompt lookup: decode wall time / tokens",
    "tokens_per_s_total": "batch x 1000 / ms_per_token (measured)",
    "ttft_ms": "the prefill Step's latency (prefix cache: median first step with the cache), ms",
    "bytes_per_step": "modelled bytes of one decode step, all rows (weights at their real bytes "
    "per weight + KV read/write; explorer.costs; a mixture of experts: the experts touched only)",
    "bytes_per_token": "bytes_per_step / batch (modelled)",
    "achieved_gbps": "bytes_per_token x tokens_per_s_total (modelled bytes / measured time, GB/s)",
    "pct_of_copy_bw": "achieved_gbps / the measured copy bandwidth (attrs['copy_gbps']) x 100",
    "speedup": "the baseline's figure / this rung's (of speedup_of), measured side by side",
    "speedup_of": "'ms_per_token' or 'ttft_ms': which figure speedup compares",
    "greedy_equal": "row 0's greedy tokens equal the baseline's over all new_tokens",
    "first_divergence": "index of the first token that differs from the baseline's (null: none)",
    "max_abs_logit_diff": "largest |logit - baseline logit| over row 0's steps, teacher-forced on "
    "the baseline's tokens (null: not collected, e.g. prompt lookup, whose verify pass scores "
    "several tokens at once)",
    "perplexity": "exp(mean next-token loss) of these weights on held-out text "
    "(attrs['perplexity_text']), eager forward; null where meaningless (random weights)",
    "memory_bytes": "CUDA: torch.cuda.max_memory_allocated over the timed run (measured); "
    "CPU: weight bytes + KV cache bytes at the end (counted)",
    "compile_s": "one-off torch.compile time (warm-up passes included), measured apart",
    "recompiles": "graphs dynamo compiled during the timed run (0: no recompilation)",
    "skipped": "null, or why this rung did not run here",
    # mixture of experts (explorer.sweeps.moe)
    "experts": "routed experts per MoE layer (E)",
    "experts_per_token": "experts each token is routed to per layer (k)",
    "experts_touched": "distinct experts the batch's tokens were routed to in one decode step, "
    "mean over MoE layers (measured: read from the router during the pass)",
    "experts_touched_per_layer": "experts_touched of every MoE layer, in layer order (measured)",
    "experts_touched_formula": "E x (1 - (1 - k/E)^batch): the expectation if every token picked "
    "its k experts uniformly at random (modelled)",
    "flops_per_token_modelled": "FLOPs of the step / batch: the active experts' only (modelled)",
    "ms_per_step": "decode step, device-synchronised, median of repeats (ms, measured)",
    "bound_ms_modelled": "roofline lower bound of the step on the measured peaks (ms, modelled)",
    "regime": "memory | compute | overhead of the measured step (explorer.costs.split)",
    "bytes_per_step_dense_total_modelled": "a dense model of the same total size: every expert "
    "read every step (modelled bytes)",
    "bytes_per_step_dense_active_modelled": "a dense model of the same active size: k experts per "
    "layer whatever the batch (modelled bytes)",
    "ms_per_step_dense_total_modelled": "roofline time of the dense same-total model (ms, modelled)",
    "ms_per_step_dense_active_modelled": "roofline time of the dense same-active model (ms, "
    "modelled)",
}


# --- small helpers -------------------------------------------------------------------------------


class Bar:
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


def check_count(name: str, value, low: int = 1) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ValueError(f"{name} must be a whole number >= {low}, got {value!r}")


def sizes(name: str, values: Iterable[int], low: int = 1) -> list[int]:
    values = list(values)
    if not values:
        raise ValueError(f"{name} must list at least one size")
    for v in values:
        check_count(f"every value of {name}", v, low)
    return sorted(set(values))


def check_context(info: ModelInfo, context_len: int, what: str = "context_len") -> None:
    """The sweep's context against the model's positions (ModelInfo.check_context's wording)."""
    info.check_context(context_len, f"{what} {context_len:,}")


def token_ids(info: ModelInfo, rows: int, length: int, device, seed: int) -> torch.Tensor:
    gen = torch.Generator(device="cpu").manual_seed(seed)
    return torch.randint(0, info.vocab_size, (rows, length), generator=gen).to(device)  # [B, T]


def peaks_for(lm: LoadedModel, peaks) -> hardware.Peaks:
    return peaks if peaks is not None else hardware.measure(lm.device, lm.info.dtype)


def plain_peaks(peaks) -> dict[str, Any]:
    if peaks is None:  # a sweep that times whole runs, not passes against the roofline
        return None
    d = peaks.to_dict()
    d.pop("details", None)
    return d


def attrs(
    sweep: str,
    lm: LoadedModel,
    peaks,
    notes: list[str],
    columns,
    *,
    repeats: int,
    warmup: int,
    **extra,
) -> dict[str, Any]:
    """A sweep frame's attrs: what ran where (model, device, dtype, threads, timer), how it was
    measured (repeats, warm-up passes, the statistic), the peaks and calibration used, the notes."""
    from explorer.costs.calibrate import active

    peaks_d = plain_peaks(peaks)
    if "calibration" not in extra and "latency_s_calibrated" in columns:
        cal = active(lm.info.name, str(lm.device), lm.info.dtype)  # what latency_s_calibrated used
        extra["calibration"] = cal.to_dict() if cal is not None else None
    return {
        "sweep": sweep,
        "model": lm.info.name,
        "device": str(lm.device),
        "dtype": lm.info.dtype,
        "repeats": repeats,
        "warmup": warmup,
        "statistic": "median",
        "threads": torch.get_num_threads(),
        "timer": Timer(lm.device).method,
        "load_average": hardware.load_average(),
        "peaks": peaks_d,
        "notes": notes,
        "columns": {c: COLUMNS[c] for c in columns},
        **extra,
    }


def frame(rows: list[dict], columns: list[str], attrs: dict) -> pd.DataFrame:
    df = pd.DataFrame(rows, columns=columns)
    df.attrs.update(attrs)
    return df


def modelled(
    info: ModelInfo,
    peaks,
    *,
    batch: int,
    tokens_fed: int,
    context_len: int,
    use_cache: bool = True,
    calibration=None,
) -> dict[str, Any]:
    """The cost model's figures for one pass, and latency_s_calibrated: the prediction of
    `calibration` (default: the one in use for this model, explorer.costs.calibrate.use), or None."""
    from explorer.costs.calibrate import active

    cost = costs.forward_cost(
        info,
        batch=batch,
        tokens_fed=tokens_fed,
        context_len=context_len,
        use_cache=use_cache,
        logits_positions=1,
    )
    bound_s, bound = costs.roofline(cost.total_flops, cost.bound_bytes, peaks)
    cal = calibration or active(info.name, info.device, info.dtype)
    return {
        "flops_modelled": cost.total_flops,
        "bytes_modelled": cost.bound_bytes,
        "intensity_modelled": cost.intensity,
        "bound_s_modelled": bound_s,
        "bound_modelled": bound,
        "latency_s_calibrated": (
            cal.predict(
                bytes=cost.bound_bytes,
                flops=cost.total_flops,
                layers=info.layers,
                rows=batch * tokens_fed,
            )
            if cal is not None
            else None
        ),
    }


def derived(row: dict, peaks, floor_s: float | None = None) -> None:
    """Measured against modelled: achieved bandwidth, and the speed-of-light split's overhead,
    MBU, MFU and regime (explorer.costs.split; floor_s: the measured overhead floor)."""
    latency = row["latency_s_measured"]
    gbps = row["bytes_modelled"] / latency / 1e9
    row["achieved_gbps_derived"] = gbps
    row["pct_of_peak_bw_derived"] = 100.0 * gbps / peaks.bandwidth_gbps
    split = utilisation(row["flops_modelled"], row["bytes_modelled"], latency, peaks, floor_s)
    for key in ("overhead_s", "mbu", "mfu", "regime"):
        row[f"{key}_derived"] = split[key]


def prefill_cache(model, ids: torch.Tensor) -> DynamicCache:
    return forward(model, ids, DynamicCache(), last_only=True)[1]


def time_decode(
    model,
    cache: DynamicCache,
    feed: torch.Tensor,
    *,
    repeats: int,
    warmup: int,
    device,
    tick: Callable[[], None] | None = None,
) -> Measurement:
    """`repeats` decode passes feeding `feed` [B, 1] onto `cache`, each from the same cache length
    (cropped back after every pass, untimed); `warmup` untimed passes first. The Measurement's
    .estimate is the figure a row reports (noise_columns(m) carries its spread and noisy mark)."""
    past = cache.get_seq_length()
    return measure(
        lambda: forward(model, feed, cache, last_only=True),
        device,
        repeats=repeats,
        warmup=warmup,
        tick=tick,
        after=lambda: crop_cache(cache, past),
    )


def from_steps(latencies: list[float], shares: list[float | None] | None = None) -> Measurement:
    """The Measurement of recorded latencies, each its own timed region (e.g. a Session's decode
    Steps, shares their Step.cpu_share): the one estimator over them, and the interference from the
    shares that are known (none known, e.g. on a GPU: the spread alone decides)."""
    known = [(t, s) for t, s in zip(latencies, shares or [], strict=False) if s is not None]
    usage = noise.Usage(
        threads=1,  # a Step's share is already per thread
        wall_s=sum(t for t, _ in known),
        cpu_s=sum(t * s for t, s in known),
        on_cpu=bool(known),
    )
    return Measurement(list(latencies), usage=usage)


NOISE_COLUMNS = ["spread_measured", "cpu_share_measured", "noisy", "noisy_reason"]


def noise_columns(m: Measurement) -> dict:
    """The noise columns of a row measured by `m` (explorer.costs.noise)."""
    return {
        "spread_measured": m.spread,
        "cpu_share_measured": m.cpu_share,
        "noisy": m.noisy,
        "noisy_reason": m.reason,
    }


# --- the one loop ----------------------------------------------------------------------------------


class StopSweep(Exception):
    """Raised by a point to end the sweep early with a note (e.g. beyond the model's positions)."""


def measure_points(
    points: Iterable,
    measure: Callable[[Any], dict | list[dict]],
    notes: list[str],
    *,
    label: Callable[[Any], str] = str,
    stop: threading.Event | None = None,
) -> list[dict]:
    """Measure each point in order and return the rows. Out of memory, StopSweep, a set `stop` event
    or Ctrl-C end the sweep with a note in `notes`; the rows measured so far are kept."""
    with new_objects_only():  # the collection after each point walks only what the sweep made
        return _measure_in_turn(points, measure, notes, label, stop)


def _measure_in_turn(points, measure, notes, label, stop) -> list[dict]:
    rows: list[dict] = []
    for point in points:
        if stop is not None and stop.is_set():
            notes.append(f"stopped on request before {label(point)}: {len(rows)} rows kept")
            break
        got, note = _measure_one(measure, point, label, len(rows))
        collected = _collect_garbage()  # Ctrl-C may land here too: the point's rows are kept
        if got is not None:
            rows.extend(got if isinstance(got, list) else [got])
        if note is None and not collected:
            note = f"interrupted (Ctrl-C) after {label(point)}: {len(rows)} rows kept"
        if note is not None:
            notes.append(note)
            break
    return rows


def _measure_one(measure, point, label, kept: int) -> tuple[dict | list | None, str | None]:
    """(the point's row(s), None) or (None, the note that ends the sweep)."""
    try:
        return measure(point), None
    except StopSweep as why:
        return None, f"stopped at {label(point)}: {why}"
    except KeyboardInterrupt:
        return None, f"interrupted (Ctrl-C) at {label(point)}: {kept} rows kept"
    except Exception as err:
        if not is_out_of_memory(err):
            raise
        first = str(err).splitlines()[0] if str(err) else repr(err)
        return None, f"stopped at {label(point)}: out of memory ({first})"


def _collect_garbage() -> bool:
    """gc.collect(); False when Ctrl-C interrupted it."""
    try:
        gc.collect()
    except KeyboardInterrupt:
        return False
    return True


def interrupted(df: pd.DataFrame) -> bool:
    """Whether a sweep's frame ended on Ctrl-C (its rows are partial)."""
    return any(n.startswith("interrupted (Ctrl-C)") for n in df.attrs.get("notes", []))
