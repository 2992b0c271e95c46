"""Where does it pay? One optimisation ("trick") against its baseline, measured side by side at each
value of one axis (batch, prompt length, draft length k, ...), beside the cost model's prediction
and the split's regime of the baseline step, with the axis value where the speedup crosses 1.

    explorer sweep pays --trick kv-cache --over length --values 8,64,256 --json
    df = explorer.sweeps.run("pays", lm, trick="speculative", over="batch", values=[1, 4, 16])
    df.attrs["crossover_measured"], df.attrs["crossover_predicted"]

Rows (ROW_KEYS): trick, axis, value, baseline_s, trick_s, speedup (baseline_s / trick_s, measured),
predicted_speedup (the calibrated cost model's), regime (of the baseline step), how ("measured" or
"modelled from measured parts"), why (one line written from the split), skipped (null, or why the
point could not run here) and partial (the sweep stopped before its last value). attrs: what every
sweep frame has (model, device, dtype, threads, repeats, warmup, timer, notes, ...), plus
crossover_measured and crossover_predicted (crossover(): null when the speedup does not cross 1
in range), spread_pct (per row, the widest half-range of its timed repeats, % of the median), the calibration the predictions used, and whatever the trick adds.

How another module registers a trick (a module in this package is imported on discovery):

    from explorer.sweeps.pays import MEASURED, Axis, TrickContext, Trick, figures, register_trick

    def setup(ctx: TrickContext):                      # once per sweep, before the first point
        ...                                       # load what it needs; ctx.lm is the --model
        def point(value) -> dict:                 # one row's figures at ctx.axis = value
            return figures(baseline_s, trick_s, predicted_speedup,
                           ctx.split(...)["regime"], why, how=MEASURED)  # or MODELLED
        return point                              # raise StopSweep to end early with a note

    register_trick(Trick(
        name="my-trick", title="what it is", baseline="what it is compared with",
        axes=(Axis("batch", "ints", (1, 4, 16), "rows in the batch"),), setup=setup))

A point may return {"skipped": "why"} (and None for the figures): that row says why, the sweep
goes on. ctx.tick() after each timed repeat moves the progress bar; ctx.repeats and ctx.warmup
say how many; ctx.notes and ctx.attrs take the trick's notes and attrs. ctx.split(latency_s,
batch=, tokens_fed=, context_len=) is the speed-of-light split of a measured pass (regime, floors,
overhead); ctx.predict(batch=, tokens_fed=, context_len=) its calibrated latency;
ctx.time_pair(base, fast) times two callables alternately; ctx.options holds run()'s extra
keywords. Axis kinds: "ints", "floats", "names" (e.g. model names: no crossover); high may be a
function of the ModelInfo (checked once the model is loaded). Values a user types reach the trick
parsed and sorted (names keep their order).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from explorer._registry import Registry
from explorer.engine.settings import Spec
from explorer.sweeps import REPEATS, Param, Sweep, register
from explorer.sweeps._common import COLUMNS as GLOSSARY
from explorer.sweeps._common import Bar, Progress, attrs, frame, measure_points
from explorer.sweeps.pays._context import TrickContext

MEASURED, MODELLED = "measured", "modelled from measured parts"
ROW_KEYS = [
    "trick",
    "axis",
    "value",
    "baseline_s",
    "trick_s",
    "speedup",
    "predicted_speedup",
    "regime",
    "how",
    "why",
    "skipped",
    "partial",
    "noisy",
    "noisy_reason",
]
DESCRIPTIONS = {
    "trick": "the optimisation (explorer.sweeps.pays.names())",
    "axis": "what the sweep varies (the trick's axes)",
    "value": "the axis value of this row",
    "baseline_s": "the baseline's time for the unit of work the trick names (s, a low quantile, measured "
    "alternately with the trick; see attrs['unit'])",
    "trick_s": "the same work with the trick (s, a low quantile; modelled from measured parts where "
    "`how` says so)",
    "speedup": "baseline_s / trick_s (> 1: the trick pays here)",
    "predicted_speedup": "the calibrated cost model's speedup (attrs['calibration'], the trick's "
    "formula in explorer.costs.tricks)",
    "regime": "memory | compute | overhead: the split of the baseline's step "
    "(explorer.costs.split)",
    "how": "'measured', or 'modelled from measured parts' (a formula over measured passes)",
    "why": "one line from the split: why the trick pays or not at this point",
    "skipped": "null, or why this point could not run here",
    "partial": "the sweep stopped (Stop, Ctrl-C, out of memory, limit) before its last value",
    "noisy": "a time behind this row is noisy (explorer.costs.noise: spread or other work)",
    "noisy_reason": "why, e.g. 'other work took 40% of this CPU during this measurement'",
}
for _key, _text in DESCRIPTIONS.items():
    GLOSSARY.setdefault(_key, _text)  # shared keys keep their text there; attrs get ours


@dataclass(frozen=True)
class Axis:
    """One axis a trick sweeps: its name (the --over word), kind ("ints", "floats" or "names"),
    default values, help, and the range of a value (high: a number, or info -> number or None)."""

    name: str
    kind: str
    default: tuple
    help: str
    low: float = 1
    high: float | Callable[[Any], float | None] | None = None
    memory: Callable[[Any, float], float] | None = None  # (info, value) -> bytes a point needs

    def spec(self) -> Spec:
        """The Spec of one value (its high, when a function of the model, is checked later)."""
        label = f"--values for --over {self.name}"
        if self.kind == "names":
            return Spec(str, label, self.help)
        high = None if callable(self.high) else self.high
        return Spec(
            int if self.kind == "ints" else float, label, self.help, low=self.low, high=high
        )

    def parse(self, values: Sequence) -> list:
        """The values as this axis's kind, in range, sorted (names keep their order): ValueError,
        one line naming --values (Spec.parse_list)."""
        if not [v for v in values if str(v).strip()]:
            raise ValueError(f"--values: give at least one value, e.g. {_join(self.default)}")
        out = self.spec().parse_list(list(values))
        return out if self.kind == "names" else sorted(set(out))

    def limit(self, info) -> float | None:
        return self.high(info) if callable(self.high) else None

    def fitting(self, values: list, info, notes: list[str]) -> list:
        """The values within the model's limit; a note names those left out."""
        high = self.limit(info)
        keep = [v for v in values if high is None or v <= high]
        if len(keep) < len(values):
            left = _join(v for v in values if v not in keep)
            notes.append(f"default {self.name} values {left} left out: {info.name} allows {high}")
        return keep or [high]

    def check_memory(self, values: list, lm) -> None:
        """The largest value's modelled bytes against what lm's device has free (NotEnoughMemory:
        one line naming both), before any point runs, as the loader checks weights."""
        if self.memory is None or not values:
            return
        from explorer.model.memory import check_fits

        top = max(values)
        fit = [v for v in values if self._fits(v, lm)]
        offer = f"the values up to {max(fit)} fit" if fit else "try smaller values"
        check_fits(
            self.memory(lm.info, top), lm.device, f"--values for --over {self.name}: {top}", offer
        )

    def _fits(self, value, lm) -> bool:
        from explorer.model.memory import fits

        return fits(self.memory(lm.info, value), lm.device)

    def check_model(self, values: list, info) -> None:
        """Values against the loaded model (e.g. a prompt longer than its positions)."""
        high = self.limit(info)
        bad = [v for v in values if high is not None and v > high]
        if bad:
            raise ValueError(
                f"--values for --over {self.name}: {_join(bad)} exceed(s) {high}, the most "
                f"{info.name} allows"
            )


@dataclass(frozen=True)
class Trick:
    """One optimisation against its baseline: setup(ctx) -> point(value) -> row figures."""

    name: str
    title: str
    baseline: str  # what it is compared with, e.g. "the target model alone"
    axes: tuple[Axis, ...]
    setup: Callable[[TrickContext], Callable[[Any], dict]]
    help: str = ""
    unit: str = "one forward pass"  # what baseline_s and trick_s time
    order: int = 100

    def axis(self, name: str | None) -> Axis:
        if name is None:
            return self.axes[0]
        for a in self.axes:
            if a.name == name:
                return a
        raise ValueError(
            f"--over: trick {self.name} sweeps {', '.join(a.name for a in self.axes)}; got {name!r}"
        )


TRICKS: Registry[Trick] = Registry("trick", same=lambda t: t.setup)


def register_trick(trick: Trick) -> Trick:
    if not trick.axes:
        raise ValueError(f"trick {trick.name} sweeps no axis")
    return TRICKS.add(trick.name, trick)


def names() -> list[str]:
    return TRICKS.names()


def get_trick(name: str) -> Trick:
    return TRICKS.get(name)


def figures(
    baseline_s: float, trick_s: float, predicted: float | None, regime: str, why: str,
    how: str = MEASURED,
) -> dict:  # fmt: skip
    """A point's figures, as a trick's point() returns them."""
    return {
        "baseline_s": baseline_s,
        "trick_s": trick_s,
        "predicted_speedup": predicted,
        "regime": regime,
        "how": how,
        "why": why,
    }


def _join(values) -> str:
    return ",".join(str(v) for v in values)


# --- the crossover -------------------------------------------------------------------------------


def crossings(values: Sequence, speedups: Sequence) -> list[float]:
    """Every axis value where the speedup crosses 1 (its side of 1 changes), in axis order:
    linearly interpolated between the neighbouring points on either side, or the first point
    exactly at 1 between them. Touching 1 without changing side, or starting or ending at 1, is
    no crossing. Points without a number (skipped rows, a non-numeric axis) are left out."""
    pts = sorted(
        (float(v), float(s))
        for v, s in zip(values, speedups, strict=True)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and s is not None and s == s
    )
    out: list[float] = []
    last = None  # (x, s) of the last point off 1
    at_one: list[float] = []  # points exactly at 1 since then
    for x, sp in pts:
        if sp == 1:
            at_one.append(x)
            continue
        if last is not None and (last[1] - 1) * (sp - 1) < 0:
            x0, s0 = last
            out.append(at_one[0] if at_one else x0 + (1 - s0) * (x - x0) / (sp - s0))
        last, at_one = (x, sp), []
    return out


def crossover(values: Sequence, speedups: Sequence) -> float | None:
    """The first (smallest) axis value where the speedup crosses 1; None when it does not cross in
    range (or the axis is not numeric). Further crossings: crossings()."""
    found = crossings(values, speedups)
    return found[0] if found else None


# --- the sweep -----------------------------------------------------------------------------------


def check(kw: dict[str, Any]) -> None:
    """The keywords together: a known trick, an axis it sweeps, values in that axis's range."""
    trick = get_trick(kw.get("trick", DEFAULT_TRICK))
    axis = trick.axis(kw.get("over"))
    if kw.get("values") is not None:
        axis.parse(kw["values"])


def run(
    lm,
    *,
    trick: str = "kv-cache",
    over: str | None = None,
    values: Sequence | None = None,
    repeats: int = 3,
    warmup: int = 1,
    progress: Progress | None = None,
    bar: bool = True,
    seed: int = 0,
    stop: threading.Event | None = None,
    peaks=None,
    calibration=None,
    **options,
) -> pd.DataFrame:
    """The trick against its baseline at each value of `over` (its first axis by default).
    peaks: the Peaks the split uses (default: measured for the model's device and dtype);
    calibration: the Calibration every prediction uses (default: the one in use for each model,
    else one fitted here). options go to the trick's setup as ctx.options (e.g. draft=LoadedModel
    for speculative, new_tokens=, k=, batch=, prefix=, cache_len=)."""
    t = get_trick(trick)
    axis = t.axis(over)
    notes: list[str] = []
    if values is None:  # the trick's defaults, less those beyond this model
        values = axis.fitting(axis.parse(axis.default), lm.info, notes)
    values = axis.parse(values)
    axis.check_model(values, lm.info)
    axis.check_memory(values, lm)
    if not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"--repeats must be a whole number >= 1, got {repeats!r}")
    ctx = TrickContext(lm, axis.name, values, repeats, warmup, notes, {}, seed, options)
    ctx.preset(peaks, calibration)
    progress_bar = Bar(len(values) * repeats, f"pays {t.name}", progress, bar)
    ctx.tick = progress_bar.update
    try:
        point = t.setup(ctx)
        ctx.take_noise()  # the setup's own timings belong to no row
        rows = measure_points(
            values,
            lambda v: _row(t, axis, v, {**point(_measuring(ctx, v)), **ctx.take_noise()}),
            notes,
            label=lambda v: f"{axis.name}={v}",
            stop=stop,
        )
    finally:
        progress_bar.close()
    partial = len(rows) < len(values)
    for row in rows:
        row["partial"] = partial
    return frame(rows, ROW_KEYS, _attrs(ctx, t, rows, partial))


def _row(trick: Trick, axis: Axis, value, got: dict) -> dict:
    row = dict.fromkeys(ROW_KEYS) | {"trick": trick.name, "axis": axis.name, "value": value}
    row.update({k: got[k] for k in ROW_KEYS if k in got})
    base, fast = row.get("baseline_s"), row.get("trick_s")
    row["speedup"] = base / fast if base and fast else None
    return row


def _attrs(ctx: TrickContext, trick: Trick, rows: list[dict], partial: bool) -> dict:
    vals = [r["value"] for r in rows]
    measured = crossings(vals, [r["speedup"] for r in rows])
    predicted = crossings(vals, [r["predicted_speedup"] for r in rows])
    for what, found in (("measured", measured), ("predicted", predicted)):
        if len(found) > 1:
            ctx.notes.append(
                f"the {what} speedup crosses 1 {len(found)} times (at {', '.join(f'{x:.3g}' for x in found)}); "
                f"crossover_{what} is the first"
            )
    if trick.axis(ctx.axis).kind != "names":  # models have no order to cross 1 along
        ctx.notes.append(
            f"speedup crosses 1 at {ctx.axis} = {_at(measured)} (measured), {_at(predicted)} "
            "(predicted)"
        )
    out = attrs(
        "pays",
        ctx.lm,
        ctx.peaks_if_measured(),
        ctx.notes,
        [],
        repeats=ctx.repeats,
        warmup=ctx.warmup,
        trick=trick.name,
        trick_title=trick.title,
        baseline=trick.baseline,
        unit=trick.unit,
        axis=ctx.axis,
        values=list(ctx.values),
        crossover_measured=measured[0] if measured else None,
        crossover_predicted=predicted[0] if predicted else None,
        spread_pct=[ctx.spread_pct(r["value"]) for r in rows],
        crossover_rule="first value where the speedup crosses 1, linear between neighbouring points",
        partial=partial,
        calibration=ctx.calibration_dict(),
        overhead_floor_s=ctx.floor_if_measured(),
        **ctx.attrs,
    )
    out["columns"] = dict(DESCRIPTIONS)
    return out


def _measuring(ctx: TrickContext, value):
    ctx.at = value  # the timings of this point keep their spread under it
    return value


def _at(found: list[float]) -> str:
    return f"{found[0]:.3g}" if found else "none in range"


DEFAULT_TRICK = "kv-cache"
TRICKS.discover(__name__)

SWEEP = register(
    Sweep(
        name="pays",
        title="Where does it pay?",
        run=run,
        columns=ROW_KEYS,
        order=90,
        help="one optimisation against its baseline along one axis: measured and predicted "
        "speedup, the baseline's regime, and where the speedup crosses 1",
        params=(
            Param(
                "values",
                "names",
                "values",
                None,
                "the axis values, comma-separated (default: the trick's own)",
            ),
            Param(
                "trick",
                "word",
                "trick",
                DEFAULT_TRICK,
                "the optimisation: " + ", ".join(names()),
                choices=names,
            ),
            Param(
                "over",
                "word",
                "over",
                None,
                "the axis (default: the trick's first)",
                choices=lambda: sorted({a.name for t in TRICKS.values() for a in t.axes}),
            ),
            REPEATS,
        ),
        check=check,
    )
)
__all__ = [
    "MEASURED",
    "MODELLED",
    "Axis",
    "TrickContext",
    "Trick",
    "crossings",
    "crossover",
    "figures",
    "get_trick",
    "names",
    "register_trick",
]
