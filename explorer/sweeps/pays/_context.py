"""What a trick's setup gets: the model, the sweep's settings, and the shared measuring helpers
(peaks, the overhead floor and a calibration, each measured once and only when a trick asks):

    ctx.time(fn)                   seconds of fn() over ctx.repeats after ctx.warmup (the estimate of
                                   explorer.costs.timing.measure: a low quantile; ctx.take_noise()
                                   gives the noisy mark of what was timed)
    ctx.time_pair(base, fast)      both, measured alternately (A B, B A, ...)
    ctx.split(latency_s, ...)      the speed-of-light split of a measured pass (regime, floors)
    ctx.predict(...)               the calibrated latency of a pass (explorer.costs.calibrate)
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import DynamicCache

from explorer import costs
from explorer.costs import calibrate, hardware
from explorer.costs.overhead import overhead_floor
from explorer.costs.split import split
from explorer.costs.timing import Measurement, alternate, measure
from explorer.model.loader import LoadedModel
from explorer.model.passes import crop_cache, forward
from explorer.sweeps._common import token_ids

CAL_BATCHES, CAL_CONTEXTS, CAL_PREFILL = (1, 4), (16, 128), 64  # the passes a fit here times


@dataclass
class TrickContext:
    lm: LoadedModel
    axis: str
    values: list
    repeats: int
    warmup: int
    notes: list[str]
    attrs: dict[str, Any]
    seed: int = 0
    options: dict[str, Any] = field(default_factory=dict)
    tick: Callable[[], None] = lambda: None
    _peaks: dict = field(default_factory=dict)
    _floors: dict = field(default_factory=dict)
    _cals: dict = field(default_factory=dict)
    _fixed_cal: calibrate.Calibration | None = None
    timed: list[Measurement] = field(default_factory=list)  # since the last take_noise()
    at: Any = None  # the axis value being measured (run() sets it before each point)
    spreads: dict = field(default_factory=dict)  # value -> half-ranges (% of median) timed there

    def preset(self, peaks=None, calibration=None) -> None:
        """Peaks for ctx.lm's device and dtype, and one calibration for every model (else each is
        measured or fitted when first asked for)."""
        if peaks is not None:
            self._peaks[(str(self.lm.device), self.lm.info.dtype)] = peaks
        self._fixed_cal = calibration

    # --- timing ----------------------------------------------------------------------------------

    def time(self, fn: Callable[[], object], lm: LoadedModel | None = None) -> float:
        """Seconds of fn() (explorer.costs.timing.measure's estimate) over `repeats` timed calls
        after `warmup` untimed ones; the Measurement joins ctx.timed."""
        m = measure(
            fn, (lm or self.lm).device, repeats=self.repeats, warmup=self.warmup, tick=self.tick
        )
        self.timed.append(m)
        self.keep(m.samples)
        return m.estimate

    def time_pair(
        self, base: Callable[[], object], fast: Callable[[], object], lm: LoadedModel | None = None
    ) -> tuple[float, float]:
        """Seconds of base() and fast(), measured alternately after warm-up of each (estimates)."""
        got = alternate(
            {"base": base, "fast": fast},
            self.repeats,
            (lm or self.lm).device,
            warmup=self.warmup,
            tick=self.tick,
        )
        self.timed.extend(got.values())
        self.keep(got["base"].samples), self.keep(got["fast"].samples)
        return got["base"].estimate, got["fast"].estimate

    def take_noise(self) -> dict:
        """The noisy mark of the figures timed since the last call (then forgotten): noisy when
        any of them is, with their reasons."""
        reasons = list(dict.fromkeys(m.reason for m in self.timed if m.noisy))
        self.timed.clear()
        return {"noisy": bool(reasons), "noisy_reason": "; ".join(reasons)}

    def keep(self, samples: list[float]) -> None:
        """Keep the spread of one timed series at the point being measured (spread_pct)."""
        mid = statistics.median(samples)
        pct = 50 * (max(samples) - min(samples)) / mid if mid > 0 else 0.0
        self.spreads.setdefault(self.at, []).append(pct)

    def spread_pct(self, value) -> float | None:
        """The widest half-range (% of the median) of the series timed at `value`, or None."""
        got = self.spreads.get(value)
        return max(got) if got else None

    # --- the cost model ----------------------------------------------------------------------------

    def peaks(self, lm: LoadedModel | None = None) -> hardware.Peaks:
        lm = lm or self.lm
        key = (str(lm.device), lm.info.dtype)
        if key not in self._peaks:
            self._peaks[key] = hardware.measure(lm.device, lm.info.dtype)
        return self._peaks[key]

    def peaks_if_measured(self):
        return next(iter(self._peaks.values()), None)

    def floor_s(self, lm: LoadedModel | None = None) -> float:
        lm = lm or self.lm
        if lm.info.name not in self._floors:
            self._floors[lm.info.name] = overhead_floor(lm.model)["floor_s"]
        return self._floors[lm.info.name]

    def floor_if_measured(self) -> float | None:
        return self._floors.get(self.lm.info.name)

    def split(
        self,
        latency_s: float,
        *,
        batch: int,
        tokens_fed: int,
        context_len: int,
        use_cache: bool = True,
        lm: LoadedModel | None = None,
    ) -> dict[str, Any]:
        """The split of a measured pass (explorer.costs.split): regime, floors, overhead_s, ...,
        plus its flops and bytes by part."""
        lm = lm or self.lm
        cost = self.cost(lm, batch, tokens_fed, context_len, use_cache)
        out = split(cost.total_flops, cost.bytes, latency_s, self.peaks(lm), self.floor_s(lm))
        return {**out, "flops": cost.total_flops, "bytes": cost.bytes}

    def calibration(self, lm: LoadedModel | None = None) -> calibrate.Calibration:
        """The calibration in use for this model, device and dtype; else one fitted here on a few
        measured passes (CAL_BATCHES x CAL_CONTEXTS decode steps and a CAL_PREFILL-token prefill)
        and the measured overhead floor (explorer.costs.overhead: a skeleton's pass, taken as
        bytes = FLOPs = 0), which keeps the fit from calling a tiny model's overhead bytes."""
        lm = lm or self.lm
        name = lm.info.name
        if self._fixed_cal is not None:
            self._cals[name] = self._fixed_cal
        if name not in self._cals:
            cal = calibrate.active(name, str(lm.device), lm.info.dtype)
            self._cals[name] = cal or self._fit(lm)
            if cal is None:
                self.notes.append(
                    f"{name}: no calibration in use; fitted one here on "
                    f"{self._cals[name].n_train} measured passes, the overhead floor included "
                    f"({self._cals[name].summary().split(';')[0]})"
                )
        return self._cals[name]

    def calibration_dict(self) -> dict | None:
        return {n: c.to_dict() for n, c in self._cals.items()} or None

    def cost(
        self, lm: LoadedModel, batch: int, tokens_fed: int, context_len: int, use_cache=True
    ) -> costs.ForwardCost:
        """The cost model's FLOPs and bytes of one pass (last position's logits only)."""
        return costs.forward_cost(
            lm.info,
            batch=batch,
            tokens_fed=tokens_fed,
            context_len=context_len,
            use_cache=use_cache,
            logits_positions=1,
        )

    def predict(
        self,
        *,
        batch: int,
        tokens_fed: int,
        context_len: int,
        use_cache: bool = True,
        extra_bytes: float = 0.0,
        lm: LoadedModel | None = None,
    ) -> float:
        """The calibrated latency of one pass, plus extra_bytes moved (e.g. a cache copy)."""
        lm = lm or self.lm
        cost = self.cost(lm, batch, tokens_fed, context_len, use_cache)
        return self.calibration(lm).predict(
            bytes=cost.bound_bytes + extra_bytes,
            flops=cost.total_flops,
            layers=lm.info.layers,
            rows=batch * tokens_fed,
        )

    def _fit(self, lm: LoadedModel) -> calibrate.Calibration:
        limit = lm.info.max_positions or max(CAL_CONTEXTS)
        shapes = [(b, 1, min(c, limit)) for b in CAL_BATCHES for c in CAL_CONTEXTS]
        shapes.append((1, min(CAL_PREFILL, limit), min(CAL_PREFILL, limit)))
        points = []
        for batch, fed, context in shapes:
            latency = self._time_pass(lm, batch, fed, context)
            cost = self.cost(lm, batch, fed, context)
            bound_s, _ = costs.roofline(cost.total_flops, cost.bound_bytes, self.peaks(lm))
            points.append(
                {
                    "model": lm.info.name,
                    "layers": lm.info.layers,
                    "batch": batch,
                    "context_len": context,
                    "latency_s": latency,
                    "bytes": cost.bound_bytes,
                    "flops": cost.total_flops,
                    "bound_s": bound_s,
                }
            )
        points.append(  # the overhead floor: a pass of the model's skeleton, bytes and FLOPs ~ 0
            {**points[0], "batch": 1, "context_len": 2, "latency_s": self.floor_s(lm)}
            | {"bytes": 0.0, "flops": 0.0, "bound_s": 0.0}
        )
        return calibrate.fit(
            points,
            device=str(lm.device),
            dtype=lm.info.dtype,
            threads=torch.get_num_threads(),
        )

    def _time_pass(self, lm: LoadedModel, batch: int, fed: int, context: int) -> float:
        run = one_pass(lm, batch, fed, context, seed=self.seed)
        return measure(run, lm.device, repeats=self.repeats, warmup=max(self.warmup, 1)).estimate


def one_pass(
    lm: LoadedModel,
    batch: int,
    fed: int,
    context: int,
    *,
    use_cache: bool = True,
    seed: int = 0,
    cache=None,
    fn=None,
) -> Callable[[], object]:
    """A repeatable pass feeding `fed` seeded tokens per row onto `context - fed` cached ones
    (use_cache=False: the whole `context` tokens with no cache). `cache`: another cache object
    (e.g. a StaticCache) to prefill and crop back after every call; fn: a compiled forward to
    call instead of the model for the timed pass."""
    ids = token_ids(lm.info, batch, context, lm.device, seed)  # [B, L]
    if not use_cache:
        return lambda: forward(lm.model, ids, None, last_only=True, fn=fn)  # [B, L] every call
    cache = DynamicCache() if cache is None else cache
    past = context - fed
    if past:
        forward(lm.model, ids[:, :past], cache, last_only=True)

    def run():
        out = forward(lm.model, ids[:, past:], cache, last_only=True, fn=fn)  # [B, fed]
        crop_cache(cache, past)
        return out

    return run


def decode_memory(context_len: int, tokens_fed: int = 1):
    """An Axis's memory for a batch axis: the modelled bytes of a decode pass of `batch` rows,
    each feeding tokens_fed tokens at context_len (explorer.sweeps.batch_size's model, which
    the batch sweep checks before each point)."""
    from explorer.sweeps.batch_size import batch_memory_bytes

    return lambda info, batch: batch_memory_bytes(info, int(batch) * tokens_fed, context_len)


def context_memory(info, context_len) -> float:
    """An Axis's memory for a context axis: one row's decode pass at that context."""
    from explorer.sweeps.batch_size import batch_memory_bytes

    return batch_memory_bytes(info, 1, int(context_len))
