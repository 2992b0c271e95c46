"""The regime map: decode step latency over a grid of batch size x context length, each cell
classified memory / compute / overhead, with the predicted boundaries between them.

Two boundaries are predicted by the cost model (attrs):
- kv_equals_weights_tokens: batch x context at which the K/V read per step equals the weight bytes
  (weight bytes / KV bytes per token); beyond it the cache, not the model, is what moves;
- critical_batch_by_context: the batch at which decode turns compute-bound at each context (the
  roofline's knee, explorer.costs.decode_knee; None where KV traffic keeps it memory-bound).
The overhead boundary is the measured overhead floor (attrs["overhead_floor_s"], a skeleton of the
same model, explorer.costs.overhead): cells whose bound is below it are overhead-bound.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import pandas as pd
import torch

from explorer import costs
from explorer.costs.calibrate import Calibration, active
from explorer.costs.overhead import overhead_floor
from explorer.model.loader import LoadedModel
from explorer.model.passes import copy_cache, crop_cache
from explorer.sweeps import REPEATS, Param, Sweep, register
from explorer.sweeps._common import (
    NOISE_COLUMNS,
    Bar,
    Progress,
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
from explorer.sweeps.batch_size import wont_fit

COLUMNS = [
    "batch",
    "context_len",
    "latency_s_measured",
    "tokens_per_s_total_measured",
    "tokens_per_s_per_user_measured",
    "flops_modelled",
    "bytes_modelled",
    "kv_bytes_modelled",
    "kv_over_weights_modelled",
    "bound_s_modelled",
    "bound_modelled",
    "bound_err_pct_derived",
    "latency_s_calibrated",
    "calibrated_err_pct_derived",
    "overhead_s_derived",
    "mbu_derived",
    "mfu_derived",
    "regime_derived",
    *NOISE_COLUMNS,
]


WARMUP = 1  # untimed decode passes before each cell's timed ones


def run(
    lm: LoadedModel,
    *,
    batches: Iterable[int] = (1, 4, 16, 64),
    contexts: Iterable[int] = (64, 256, 1024, 4096),
    repeats: int = 3,
    peaks=None,
    calibration: Calibration | dict | None = None,
    memory_limit_bytes: int | None = None,
    progress: Progress | None = None,
    bar: bool = True,
    seed: int = 0,
    stop: threading.Event | None = None,
) -> pd.DataFrame:
    """Decode ms/token and tokens/s at every (batch, context) cell, smallest first.

    One row of max(contexts) - 1 tokens is prefilled once; each cell crops a copy of that cache
    to context - 1 positions, repeats it B times and times decode passes of B tokens. Contexts
    beyond the model's positions are dropped with a note; a cell that would not fit in memory
    (modelled pre-check, or an out-of-memory error) ends that context's row of larger batches with
    a note. calibration (or the one in use for this model, explorer.costs.calibrate.use) fills
    latency_s_calibrated."""
    batches = sizes("batches", batches)
    contexts = sizes("contexts", contexts, low=2)
    check_count("repeats", repeats)
    notes: list[str] = []
    contexts = _within_positions(lm, contexts, notes)
    contexts = _contexts_that_fit(lm, contexts, min(batches), memory_limit_bytes, notes)
    if isinstance(calibration, dict):
        calibration = Calibration.from_dict(calibration)
    grid = _Grid(
        lm,
        peaks=peaks_for(lm, peaks),
        calibration=calibration or active(lm.info.name, str(lm.device), lm.info.dtype),
        floor=overhead_floor(lm.model),
        base=prefill_cache(lm.model, token_ids(lm.info, 1, max(contexts) - 1, lm.device, seed)),
        repeats=repeats,
        seed=seed,
        memory_limit_bytes=memory_limit_bytes,
        notes=notes,
    )
    cells = [(c, B) for c in contexts for B in batches]
    progress_bar = Bar(len(cells) * repeats, "regime map", progress, bar)
    grid.tick = progress_bar.update
    try:
        rows = measure_points(cells, grid.measure, notes, label=_label, stop=stop)
    finally:
        progress_bar.close()
    return frame(rows, COLUMNS, grid.frame_attrs(contexts))


def _within_positions(lm: LoadedModel, contexts: list[int], notes: list[str]) -> list[int]:
    """The contexts the model has positions for; the others dropped with a note."""
    limit = lm.info.max_positions
    if not limit:
        return contexts
    beyond = [c for c in contexts if c > limit]
    if beyond:
        notes.append(f"contexts {beyond} dropped: beyond the model's {limit} positions")
    kept = [c for c in contexts if c <= limit]
    if not kept:
        raise ValueError(f"every context is beyond the model's {limit} positions")
    return kept


def _label(cell) -> str:
    return f"B={cell[1]}, context {cell[0]}"


@dataclass
class _Grid:
    """What every cell of one regime map shares: the model, the prefilled cache, peaks, calibration,
    the overhead floor, and the contexts whose larger batches no longer fit."""

    lm: LoadedModel
    peaks: object
    calibration: Calibration | None
    floor: dict
    base: object  # the prefilled cache of max(contexts) - 1 positions, cropped per cell
    repeats: int
    seed: int
    memory_limit_bytes: int | None
    notes: list[str]
    tick: Callable[[], None] | None = None
    too_big: set[int] = field(default_factory=set)  # contexts whose larger batches are skipped

    def measure(self, cell: tuple[int, int]) -> dict | list:
        """One cell's row; [] when it (or a smaller batch at its context) would not fit."""
        ctx, B = cell
        if ctx in self.too_big:
            return []
        reason = wont_fit(self.lm, B, ctx, self.memory_limit_bytes)
        if reason:
            self.too_big.add(ctx)
            self.notes.append(f"context {ctx}: batches from {B} skipped: {reason}")
            return []
        lm = self.lm
        cache = crop_cache(copy_cache(self.base), ctx - 1)
        with torch.inference_mode():
            cache.batch_repeat_interleave(B)
        feed = token_ids(lm.info, B, 1, lm.device, self.seed + 1)
        timed = time_decode(
            lm.model, cache, feed, repeats=self.repeats, warmup=WARMUP, device=lm.device,
            tick=self.tick,
        )  # fmt: skip
        del cache
        return self._row(B, ctx, timed.estimate) | noise_columns(timed)

    def _row(self, B: int, ctx: int, latency: float) -> dict:
        """Measured latency beside the modelled bound, calibrated prediction and KV size."""
        info = self.lm.info
        model = modelled(
            info, self.peaks, batch=B, tokens_fed=1, context_len=ctx, calibration=self.calibration
        )
        kv = float(costs.shape_of(info).kv_bytes_per_token * B * (ctx - 1))
        predicted = model["latency_s_calibrated"]
        row = {
            "batch": B,
            "context_len": ctx,
            "latency_s_measured": latency,
            "tokens_per_s_total_measured": B / latency,
            "tokens_per_s_per_user_measured": 1 / latency,
            **model,
            "kv_bytes_modelled": kv,
            "kv_over_weights_modelled": kv / info.weight_bytes,
            "bound_err_pct_derived": (model["bound_s_modelled"] - latency) / latency * 100,
            "calibrated_err_pct_derived": (
                (predicted - latency) / latency * 100 if predicted is not None else None
            ),
        }
        derived(row, self.peaks, self.floor["floor_s"])
        return row

    def frame_attrs(self, contexts: list[int]) -> dict:
        """The frame's attrs, with the predicted boundaries (module doc) beside the measurements."""
        lm, cal = self.lm, self.calibration
        per_token = costs.shape_of(lm.info).kv_bytes_per_token
        return attrs(
            "regime-map",
            lm,
            self.peaks,
            self.notes,
            COLUMNS,
            repeats=self.repeats,
            warmup=WARMUP,
            layers=lm.info.layers,
            weight_bytes=lm.info.weight_bytes,
            kv_bytes_per_token=per_token,
            kv_equals_weights_tokens=lm.info.weight_bytes / per_token,
            critical_batch_by_context={
                ctx: costs.decode_knee(lm.info, context_len=ctx, peaks=self.peaks)
                for ctx in contexts
            },
            overhead_floor_s=self.floor["floor_s"],
            overhead_floor=self.floor,
            calibration=cal.to_dict() if cal is not None else None,
            regime_rule=costs.split.REGIME_RULE,
        )


def _contexts_that_fit(lm, contexts: list[int], B: int, limit, notes: list[str]) -> list[int]:
    """Checked before the prefill: contexts whose smallest batch would not fit are dropped with a
    note; none left is one error naming the memory needed and available."""
    reasons = {c: wont_fit(lm, B, c, limit) for c in contexts}
    fit = [c for c in contexts if reasons[c] is None]
    if not fit:
        c = min(contexts)
        raise ValueError(
            f"regime map: no cell fits in memory: batch {B} at context {c} {reasons[c]}; "
            "give smaller --contexts or --batches"
        )
    if len(fit) < len(contexts):
        dropped = [c for c in contexts if reasons[c]]
        notes.append(f"contexts {dropped} dropped before the prefill: {reasons[dropped[0]]}")
    return fit


def points(df: pd.DataFrame) -> list[dict]:
    """The frame's cells as calibration points (explorer.costs.calibrate)."""
    return [
        {
            "model": df.attrs["model"],
            "device": df.attrs["device"],
            "dtype": df.attrs["dtype"],
            "layers": df.attrs["layers"],
            "batch": int(r.batch),
            "context_len": int(r.context_len),
            "latency_s": float(r.latency_s_measured),
            "bytes": float(r.bytes_modelled),
            "flops": float(r.flops_modelled),
            "bound_s": float(r.bound_s_modelled),
            "noisy": bool(getattr(r, "noisy", False)),  # marked by explorer.costs.noise
        }
        for r in df.itertuples()
    ]


def calibration_from(
    frames: Iterable[pd.DataFrame], *, refuse_busy: bool = False, rule: str = "gemm"
) -> Calibration:
    """One calibration fitted to the default train split of the cells of regime-map frames (one
    per model; explorer.costs.calibrate.split_points), scored on their held-out cells. Measured
    while other work held the CPU (calibrate.too_busy): MachineTooBusy, no fit, with refuse_busy
    (the CLI and the dashboard, which keep the last good fit); else fitted, with a note saying so."""
    from explorer.costs import calibrate

    frames = list(frames)
    if not frames:
        raise ValueError("calibration needs at least one measured regime map")
    cells = [
        {"cpu_share": r.get("cpu_share_measured"), "spread": r.get("spread_measured")}
        | {"noisy": r.get("noisy")}
        for df in frames
        for r in df.to_dict("records")
    ]
    if refuse_busy:
        calibrate.check_quiet(cells)
    busy = calibrate.too_busy(cells)
    pts = [p for df in frames for p in points(df)]
    train, heldout = calibrate.split_points(pts)
    a = frames[0].attrs
    cal = calibrate.fit(
        train, heldout, device=a["device"], dtype=a["dtype"], threads=a["threads"], rule=rule
    )
    if rule != "linear":  # the rule before, refitted to the same points: the comparison
        cal.heldout_err_linear_pct = calibrate.fit(train, heldout).heldout_err_after_pct
    cal.interference = calibrate.interference(cells)
    if busy:
        cal.notes.append(f"fitted anyway, so read it with care: {busy}")
    return cal


SWEEP = register(
    Sweep(
        name="regime-map",
        title="Regime map",
        run=run,
        columns=COLUMNS,
        order=35,
        help="decode passes over a batch x context grid, each cell's regime and MBU",
        params=(
            Param("batches", "ints", "batch sizes", "1, 4, 16, 64", "batch sizes, e.g. 1,4,16"),
            Param(
                "contexts",
                "ints",
                "context lengths",
                "64, 256, 1024, 4096",
                "context lengths, e.g. 64,256,1024 (beyond the model's positions: dropped)",
                low=2,
            ),
            REPEATS,
        ),
    )
)
