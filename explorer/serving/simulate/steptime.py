"""The time of one engine iteration, from the cost model's bytes and FLOPs and a fitted machine.

An iteration is a list of passes, one per request in the batch: [query tokens, past KV tokens]
(a decoding request is [1, its context so far]; a prefill chunk is [chunk, tokens already cached]),
exactly what explorer.serving.Iteration.passes records for the real engines. Its modelled work:

    bytes = every weight once (at its real bytes per value) + K/V read for each pass's past
            + K/V written for each pass's query                                 (explorer.costs)
            (a mixture of experts: only the experts the iteration's tokens touch, expected
            E x (1 - (1 - k/E)^tokens) per MoE layer for uniform routing; Shape.weight_bytes_read)
    flops = the sum over passes of forward_flops(query, past + query, one logit row)

and its time (STEP_RULE), with seven non-negative parameters fitted to measured iterations:

    seconds = bytes / effective bandwidth + flops / effective FLOP/s
              + per-iteration overhead + requests x per-request overhead + tokens x per-token overhead
              + mixed x query tokens x key tokens x per-element overhead
              + (more than one query token) x weight bytes x extra seconds per byte

The mask term is what a batch with a prompt in it costs beyond its FLOPs on transformers' paged
engine without a fused varlen kernel: one dense [all query tokens, all key tokens] mask and score
matrix over the whole batch (decode-only batches take the fast path and skip it). The gemm term is
the kernel switch: a pass of one token runs matrix-vector kernels, a pass of two or more runs
matrix-matrix kernels, which on a CPU can read the weights at a different speed (measured here:
the 135M shape's decode step takes 42 ms for one request and 80 ms for two).

Fitted with the calibration's non-negative least squares on the relative error
(explorer.costs.calibrate), on the iterations of a profiling run through the real engine; the
held-out error is on iterations of profiling workloads the fit did not see. The same formula
runs on paper for a known chip (explorer.serving.simulate.whatif) with the chip's peaks x an
efficiency instead of fitted speeds.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from explorer._stats import percentile
from explorer.costs.calibrate import EffectiveRates
from explorer.costs.calibrate_rule import nnls
from explorer.costs.parts import Shape, shape_of
from explorer.serving.simulate.work import Work, iteration_work

STEP_RULE = (
    "seconds = bytes / effective bandwidth + FLOPs / effective FLOP/s + per-iteration overhead "
    "+ requests x per-request overhead + tokens x per-token overhead + (batches with a prompt) "
    "query x key tokens x per-element overhead + (passes of 2+ tokens) weight bytes x extra "
    "seconds per byte (non-negative least squares on relative error, "
    "fitted to measured iterations)"
)
PARAMS = (
    "s_per_byte",
    "s_per_flop",
    "iteration_s",
    "request_s",
    "token_s",
    "mask_s",
    "gemm_s_per_byte",
)


@dataclass(frozen=True)
class IterationTime:
    """One iteration as a machine times it: its seconds, what limits it ("memory bandwidth",
    "FLOPs" or "overheads": the largest of the machine's terms) and the work it read."""

    seconds: float
    limit: str
    work: Work


def _row(work: Work) -> list[float]:
    return [
        work["bytes"],
        work["flops"],
        1.0,
        work["requests"],
        work["tokens"],
        work["mask"],
        work["gemm_bytes"],
    ]


@dataclass
class StepModel(EffectiveRates):
    """A fitted (or on-paper) iteration-time formula; plain data (to_dict / from_dict)."""

    s_per_byte: float
    s_per_flop: float
    iteration_s: float
    request_s: float
    token_s: float
    mask_s: float = 0.0
    gemm_s_per_byte: float = 0.0
    gap_s: float = 0.0  # measured idle gap between back-to-back iterations (scheduling, Python)
    startup_s: float = 0.0  # measured: from a run's first send to its engine's first iteration
    method: str = "fitted"  # "fitted" (measured iterations) | "modelled" (a chip on paper)
    rule: str = STEP_RULE
    key: dict[str, Any] = field(default_factory=dict)  # model, dtype, device, versions, engine
    n_train: int = 0
    n_heldout: int = 0
    train_err_pct: float | None = None
    heldout_err_pct: float | None = None  # median |error| on held-out iterations
    heldout_p90_err_pct: float | None = None
    assumptions: list[str] = field(default_factory=list)

    def seconds(self, shape: Shape, passes: list[list[int]]) -> float:
        return self.step(shape, passes).seconds

    def step(self, shape: Shape, passes: list[list[int]]) -> IterationTime:
        """The iteration's seconds (STEP_RULE) and its largest term: the bytes and the weights'
        kernel-switch terms are memory bandwidth, the FLOPs term FLOPs, the rest overheads."""
        w = iteration_work(shape, passes)
        terms = [a * getattr(self, p) for a, p in zip(_row(w), PARAMS)]
        memory, flops = terms[0] + terms[6], terms[1]
        return IterationTime(float(sum(terms)), largest(memory, flops, sum(terms[2:6])), w)

    def summary(self) -> str:
        gbps = f"{self.effective_gbps:.1f} GB/s" if self.effective_gbps else "bandwidth term 0"
        gf = f"{self.effective_gflops:.1f} GFLOP/s" if self.effective_gflops else "FLOP term 0"
        held = (
            f"held-out median |error| {self.heldout_err_pct:.1f}% (p90 "
            f"{self.heldout_p90_err_pct:.1f}%) on {self.n_heldout} iterations"
            if self.heldout_err_pct is not None
            else "no held-out iterations"
        )
        return (
            f"{self.method}: effective {gbps}, {gf}, {self.iteration_s * 1e3:.2f} ms/iteration "
            f"+ {self.request_s * 1e3:.3f} ms/request + {self.token_s * 1e3:.4f} ms/token "
            f"+ {self.mask_s * 1e9:.2f} ns per mixed-batch mask element, weights read "
            f"{_gemm_text(self)} in passes of 2+ tokens, "
            f"gap {self.gap_s * 1e3:.2f} ms, engine start {self.startup_s * 1e3:.1f} ms; {held}"
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> StepModel:
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})


def largest(memory: float, flops: float, overheads: float) -> str:
    """The name of the largest of an iteration's memory, FLOP and overhead seconds."""
    named = {"memory bandwidth": memory, "FLOPs": flops, "overheads": overheads}
    return max(named, key=named.get)


def _pct_errors(model: StepModel, shape: Shape, its: list[dict]) -> list[float]:
    return [abs(model.seconds(shape, i["passes"]) - i["seconds"]) / i["seconds"] * 100 for i in its]


def fit(shape: Shape, train: list[dict], heldout: list[dict] | None = None, **meta) -> StepModel:
    """Fit STEP_RULE to measured iterations ({"passes", "seconds"}); score it on `heldout`."""
    train = [i for i in train if i["seconds"] > 0 and i["passes"]]
    if len(train) < len(PARAMS):
        raise ValueError(
            f"the step-time fit needs at least {len(PARAMS)} measured iterations, got {len(train)}"
        )
    A = np.array([_row(iteration_work(shape, i["passes"])) for i in train], dtype=float)
    t = np.array([i["seconds"] for i in train], dtype=float)
    scale = A.max(axis=0)
    scale[scale == 0] = 1.0
    x = nnls((A / scale) / t[:, None], np.ones_like(t)) / scale  # minimise relative error
    model = StepModel(*map(float, x), n_train=len(train), **meta)
    model.train_err_pct = statistics.median(_pct_errors(model, shape, train))
    held = [i for i in heldout or [] if i["seconds"] > 0 and i["passes"]]
    if held:
        errs = _pct_errors(model, shape, held)
        model.n_heldout = len(held)
        model.heldout_err_pct = statistics.median(errs)
        model.heldout_p90_err_pct = percentile(errs, 90)
    return model


def busy_gap(iterations: list) -> float:
    """Median idle time between back-to-back iterations while requests were waiting or running
    (the engine's own scheduling and bookkeeping outside the timed step)."""
    gaps = [
        b.start_s - a.end_s
        for a, b in zip(iterations, iterations[1:])
        if (b.decode_requests > 0 or (b.waiting or 0) > 0) and b.start_s - a.end_s < 0.05
    ]
    return statistics.median(gaps) if gaps else 0.0


def _gemm_text(m: StepModel) -> str:
    if m.s_per_byte <= 0 or m.gemm_s_per_byte <= 0:
        return "at the same speed"
    return f"{(m.s_per_byte + m.gemm_s_per_byte) / m.s_per_byte:.2f}x slower"


def startup_delay(results: list) -> float:
    """Median over runs of the time from the first request sent to the engine's first iteration
    (the engine starting: for transformers' manager, its thread and paged cache)."""
    delays = []
    for res in results:
        sent = [r.sent_s for r in res.records if r.sent_s is not None]
        if sent and res.iterations:
            delays.append(max(0.0, res.iterations[0].start_s - min(sent)))
    return statistics.median(delays) if delays else 0.0


def one_at_a_time_rate(info, model: StepModel, input_len: int, output_len: int) -> float:
    """Requests/s that one-request-at-a-time service would sustain (modelled, from the fit)."""
    shape = shape_of(info)
    s = model.seconds(shape, [[input_len, 0]]) + sum(
        model.seconds(shape, [[1, input_len + k]]) for k in range(output_len - 1)
    )
    return 1.0 / (s + output_len * model.gap_s)
