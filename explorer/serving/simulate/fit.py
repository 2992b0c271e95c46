"""The what-if's fitted settings, each fitted on the data that isolates it, split by source.

`explorer bench simulate --published --fit` runs fit(); it prints the split, each fitted value
with the data that determined it, and the median |error| per metric on the fitted and the
held-out runs side by side. In three stages:

1. The chip's realisation, on Vidur's measured operator table (assets/published/vidur-operators/:
   A100 and H100 kernel times, a GPU source independent of the serving runs; see
   explorer.serving.simulate.operators), no serving run used:
     flop_efficiency       median FLOPs / (peak x time) of the GEMMs at >= 1,024 tokens
     bw_efficiency         median bytes / (peak x time) of the GEMMs at <= 16 tokens that move at
                           least 20 us of bytes at peak (smaller ones sit on the launch floor)
     kernel_floor_s        median time of the small elementwise kernels at <= 16 tokens
     layer_overhead_s      median time per layer of the kernels the work sum gives no bytes
                           (two norms, RoPE, activation, residual add) at <= 16 tokens
     allreduce_latency_s   median time of an all-reduce of <= 256 KiB
   Per chip family (hopper: H100, H200; ampere: A100) where the two chips' values differ by more
   than FAMILY_APART of the pooled one; otherwise one pooled value (DEFAULTS), said in the report.
   Chips of no measured family (MI300X, ...) take the pooled values.
2. Light training runs (concurrency <= LIGHT, one request stream or a few): the per-step overhead
   on their TPOT / ITL (bisection on the median signed log error), then the per-request latency
   outside the engine (HTTP, tokenising, streaming; a constant on TTFT and E2E) on their TTFT.
3. Decode-heavy training runs (every request at once, output at least half the prompt), replayed
   whole: the API server's seconds per streamed token of each request (detokenising, SSE; a
   process beside the GPU, so an iteration takes at least requests x this) on their output
   throughput and TPOT. The engine-side per-request-in-a-step overhead (sequence_overhead_s,
   added to every iteration) is not fitted: these runs cannot tell it from the API server's,
   and an additive term fitted on them (0.16 ms per request) made every batch of 256-2,048
   requests (S1's and S7's) far too slow. Offline harnesses (S7's trtllm-bench, S8's vLLM
   benchmark_latency / _throughput) have no API server: their runs set both API terms to 0.

The split is by source, never by point (two runs of one source share an engine, a harness and a
lab): TRAIN_SOURCES are fitted, every other source is held out. While fitting, a run is
simulated with at most FIT_AT_MOST requests (FIT_TOKENS output tokens), as the table is not.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field

from explorer.serving.simulate import published
from explorer.serving.simulate.fit_replay import (  # noqa: F401 (fit.Term, fit.replay, ... are this module's API)
    RATE_METRICS,
    SIMULATED,
    Term,
    replay,
    secant,
    settings_for,
    slowness,
)
from explorer.serving.simulate.fit_stack import STACK_SOURCES, fit_stack
from explorer.serving.simulate.published import _at_most
from explorer.serving.simulate.whatif_settings import CHIP_FAMILIES

# the training split of the serving stages, by source (printed by the fit); the stack families'
# own sources (fit_stack.STACK_SOURCES) are fitted sources too, for their family's terms only, and
# ENGINE_SOURCES for their engine's request latency only (the light runs of that engine there)
ENGINE_SOURCES = {"sglang": "S16", "trtllm": "S16"}
TRAIN_SOURCES = tuple(
    s
    for s in published.FIT_SOURCES
    if s not in STACK_SOURCES.values() and s not in ENGINE_SOURCES.values()
)
FIT_AT_MOST = 300  # requests per run simulated while fitting (the table simulates all of them)
FIT_TOKENS = 40_000  # and output tokens per run while fitting
LIGHT = 8  # a run of at most this many concurrent requests is light
FAMILY_APART = 0.10  # per-family values where the families differ by more than this share
EVALS = {"iteration_overhead_s": 3, "stream_token_s": 2}  # replays per term (secant)
SEARCH = {"iteration_overhead_s": 8e-3, "stream_token_s": 4e-4}  # the most each may be (s)
HEAVY_AT_MOST = 1000  # the heavy stage replays runs of up to this many requests whole
HEAVY_TOKENS = 250_000
HEAVY_METRICS = ("output_throughput", "median_tpot_ms")
# The last fit's values (`explorer bench simulate --published --fit`), rounded: the what-if's
# defaults (explorer.serving.simulate.whatif_settings) are these; a test holds them equal.
FITTED: dict[str, float] = {
    "flop_efficiency": 0.71,
    "bw_efficiency": 0.75,
    "kernel_floor_s": 4e-6,
    "layer_overhead_s": 2.15e-5,
    "allreduce_latency_s": 3.65e-5,
    "iteration_overhead_s": 1.063e-3,
    "request_latency_s": 0.053,
    "stream_token_s": 0.0,
}
FITTED_FAMILIES: dict[str, dict[str, float]] = {
    "hopper": {"bw_efficiency": 0.82, "layer_overhead_s": 1.85e-5, "allreduce_latency_s": 3.6e-5},
    "ampere": {"bw_efficiency": 0.73, "layer_overhead_s": 2.3e-5, "allreduce_latency_s": 4e-5},
}

TIME_METRICS = ("median_tpot_ms", "median_itl_ms", "median_e2el_ms", "median_ttft_ms")


@dataclass
class FitResult:
    settings: dict  # pooled / serving values: the what-if's DEFAULTS
    families: dict  # chip family -> its own values
    terms: list[Term]
    train: list[str]
    held_out: list[str]
    summary: list[dict] = field(default_factory=list)  # published.summary of the fitted values
    seconds: float = 0.0
    stacks: dict = field(default_factory=dict)  # stack family -> its values (fit_stack)
    engines: dict = field(default_factory=dict)  # engine -> its request latency (ENGINE_SOURCES)


# --- stage 1: Vidur's operator table ----------------------------------------------------------

ELEMENTWISE = ("norm", "rope", "mlp_act", "add")
MATMULS = ("qkv_proj", "o_proj", "mlp_up", "mlp_down")


def _vidur_values(rows) -> dict[str, float]:
    """The five stage-1 quantities (see the module docstring) over these operator rows."""
    mm = [r for r in rows if r.op_class in MATMULS]
    small_ew = [r for r in rows if r.op_class in ELEMENTWISE and r.tokens <= 16]
    layers: dict[tuple, float] = {}
    for r in small_ew:
        key = (r.chip, r.model, r.tokens, r.tp)
        layers[key] = layers.get(key, 0.0) + r.measured_ms
    return {
        "flop_efficiency": statistics.median(
            r.compute_floor_ms / r.measured_ms for r in mm if r.tokens >= 1024
        ),
        "bw_efficiency": statistics.median(
            r.memory_floor_ms / r.measured_ms
            for r in mm
            if r.tokens <= 16 and r.memory_floor_ms >= 0.02
        ),
        "kernel_floor_s": statistics.median(r.measured_ms for r in small_ew) / 1e3,
        "layer_overhead_s": statistics.median(layers.values()) / 1e3,
        "allreduce_latency_s": statistics.median(
            r.measured_ms for r in rows if r.op_class == "all_reduce" and r.bytes <= 256 * 1024
        )
        / 1e3,
    }


VIDUR_DATA = {
    "flop_efficiency": "Vidur GEMMs (q/k/v, o, up, down) at >= 1,024 tokens: FLOPs / (peak x time)",
    "bw_efficiency": "Vidur GEMMs at <= 16 tokens moving >= 20 us at peak: bytes / (peak x time)",
    "kernel_floor_s": "Vidur norm / RoPE / activation / add kernels at <= 16 tokens: their time",
    "layer_overhead_s": "Vidur per layer at <= 16 tokens: 2 norms + RoPE + activation + add",
    "allreduce_latency_s": "Vidur NCCL all-reduces of <= 256 KiB on DGX boxes: their time",
}


def operator_terms(rows=None) -> tuple[dict, dict, list[Term]]:
    """(pooled values, per-family values, terms) of stage 1, from Vidur's operator rows."""
    from explorer.serving.simulate import operators

    rows = operators.operator_rows() if rows is None else rows
    per_chip = {c: _vidur_values([r for r in rows if r.chip == c]) for c in {r.chip for r in rows}}
    pooled = _vidur_values(rows)
    families: dict[str, dict] = {}
    terms = []
    for name, value in pooled.items():
        chips = {CHIP_FAMILIES.get(c, c): v[name] for c, v in sorted(per_chip.items())}
        seen = ", ".join(f"{f} {_shown(name, v)}" for f, v in chips.items())
        apart = max(chips.values()) - min(chips.values()) > FAMILY_APART * value
        if apart:
            for fam, v in chips.items():
                families.setdefault(fam, {})[name] = v
                terms.append(Term(name, v, fam, f"{VIDUR_DATA[name]} ({seen}: apart)"))
        verdict = "apart: per family" if apart else f"within {FAMILY_APART:.0%}: one value"
        terms.append(Term(name, value, "all", f"{VIDUR_DATA[name]} ({seen}; {verdict})"))
    return pooled, families, terms


def _shown(name: str, v: float) -> str:
    return f"{v * 1e6:.1f} us" if name.endswith("_s") else f"{v:.3f}"


# --- stages 2 and 3: the serving runs ---------------------------------------------------------


def split(points: list[dict]) -> tuple[list[dict], list[dict]]:
    """(training runs, held-out runs): by source, TRAIN_SOURCES against the rest."""
    train = [p for p in points if p["source"] in TRAIN_SOURCES]
    return train, [p for p in points if p["source"] not in TRAIN_SOURCES]


def is_light(point: dict) -> bool:
    cap = point["workload"].get("max_concurrency")
    return cap is not None and cap <= LIGHT


def is_heavy(point: dict) -> bool:
    wl = point["workload"]
    return wl.get("max_concurrency") is None and wl.get("request_rate") is None


def is_decode_heavy(point: dict) -> bool:
    """Every request at once and its output at least half its prompt: a run whose time is
    decode steps of big batches (prefill-bound runs and 4-token runs isolate other terms)."""
    wl = point["workload"]
    prompt = wl.get("input_mean") or wl.get("input_len") or 0
    output = wl.get("output_mean") or wl.get("output_len") or 0
    return is_heavy(point) and output >= prompt / 2 and output >= 32


def _start(name: str, points: list[dict]) -> tuple[float, float]:
    """Where the secant starts: 0 and a quarter of the range; the API server's time per token
    from the heavy runs' TPOT over their batch (where that term sets the pace, it is that)."""
    if name != "stream_token_s":
        return 0.0, SEARCH[name] / 4
    from explorer.serving.simulate.whatif_settings import DEFAULTS

    per_token = []
    for p in points:
        tpot, n = p["measured"].get("median_tpot_ms"), p["workload"].get("num_prompts")
        if tpot and n:
            batch = min(n, p.get("what_if", {}).get("max_batch", DEFAULTS["max_batch"]))
            per_token.append(tpot / 1e3 / batch)
    guess = statistics.median(per_token) if per_token else SEARCH[name] / 4
    return guess, 1.3 * guess


def _search(name, points, metrics, values, families, progress) -> float:
    """The serving term `name` fitted on `points` (the others at `values`)."""
    if not points:
        return values[name]

    def too_slow(v: float) -> float:
        s = slowness(replay(points, {**values, name: v}, families), metrics)
        if progress:
            progress(f"{name} = {v * 1e3:.4f} ms: median log(simulated / measured) {s:+.4f}")
        return s

    value = secant(too_slow, *_start(name, points), SEARCH[name], EVALS[name])
    if value >= SEARCH[name] * (1 - 1e-9):  # ran to the edge: the data do not determine it
        if progress:
            progress(f"{name} ran to its bound ({value * 1e3:.3f} ms): not determined, left at 0")
        return 0.0
    return value


def fit_serving(
    train: list[dict], pooled: dict, families: dict, progress=None, at_most: int = FIT_AT_MOST
) -> tuple[dict, list[Term]]:
    """Stages 2 and 3 on the training runs, from the stage-1 `pooled` / `families` values: the
    light stage, the heavy stage, then the light stage again at the heavy stage's value."""
    light = [_at_most(p, at_most, FIT_TOKENS) for p in train if is_light(p)]
    heavy = [_at_most(p, HEAVY_AT_MOST, HEAVY_TOKENS) for p in train if is_decode_heavy(p)]
    values = {**pooled, "iteration_overhead_s": 0.0, "stream_token_s": 0.0}
    values["request_latency_s"] = 0.0
    tpot = ("median_tpot_ms", "median_itl_ms")
    for stage in ("light", "heavy", "light"):
        if stage == "light":
            values["iteration_overhead_s"] = _search(
                "iteration_overhead_s", light, tpot, values, families, progress
            )
            no_latency = {**values, "request_latency_s": 0.0}
            values["request_latency_s"] = fit_latency(replay(light, no_latency, families))
        else:
            values["stream_token_s"] = _search(
                "stream_token_s", heavy, HEAVY_METRICS, values, families, progress
            )
    ids = lambda ps: ", ".join(p["id"] for p in ps) or "none"  # noqa: E731
    terms = [
        Term("iteration_overhead_s", values["iteration_overhead_s"], "all",
             f"TPOT / ITL of the light training runs ({ids(light)})"),
        Term("request_latency_s", values["request_latency_s"], "all",
             f"median TTFT of the light training runs ({ids(light)})"),
        Term("stream_token_s", values["stream_token_s"], "all",
             "output throughput and TPOT of the decode-heavy training runs, replayed whole "
             f"(every request at once; {ids(heavy)}); 0 where the search ran to its bound, "
             f"{SEARCH['stream_token_s'] * 1e3:.1f} ms: then no value in range fits them"),
    ]  # fmt: skip
    return values, terms


def fit_engine_latency(points, pooled, families, stacks, progress=None):
    """({engine: {"request_latency_s": s}}, terms): each engine of ENGINE_SOURCES on the light
    runs of that engine in its source (fit_latency on their median TTFT, the other settings at
    the fitted values)."""
    from explorer.serving.simulate.engine_map import policy_of

    engines, terms = {}, []
    zero = {**pooled, "request_latency_s": 0.0}
    for engine, source in ENGINE_SOURCES.items():
        light = [p for p in points if p["source"] == source and is_light(p)
                 and policy_of(p["engine"]) == engine]  # fmt: skip
        if not light:
            continue
        value = fit_latency(replay(light, zero, families, stacks, engines={}))
        engines[engine] = {"request_latency_s": value}
        ids = ", ".join(p["id"] for p in light)
        terms.append(Term("request_latency_s", value, engine, f"median TTFT of {ids}"))
        if progress:
            progress(f"{engine}: request_latency_s {value * 1e3:.0f} ms")
    return engines, terms


def fit_latency(rows: list[dict]) -> float:
    """The per-request latency (s) that minimises the mean |log error| of TTFT (grid, 1 ms)."""
    ttft = [r for r in rows if r["metric"] == "median_ttft_ms" and r["simulated"]]
    if not ttft:
        return 0.0

    def err(ms: float) -> float:
        return statistics.fmean(abs(math.log((r["simulated"] + ms) / r["measured"])) for r in ttft)

    return min(range(0, 201), key=err) / 1e3


def fit(points: list[dict], progress=None, at_most: int = FIT_AT_MOST, rows=None) -> FitResult:
    """Every stage (module docstring) on the training split of `points`; then the fitted and
    held-out runs replayed at the fitted values (at most `at_most` requests each), summarised."""
    start = time.perf_counter()
    train, _ = split(points)
    if not train:
        raise ValueError(
            f"--fit: no published run of the training sources ({', '.join(TRAIN_SOURCES)})"
        )
    short = [_at_most(p, at_most, FIT_TOKENS) for p in points]
    pooled, families, terms = operator_terms(rows)
    serving, more = fit_serving(train, pooled, families, progress, at_most)
    stacks, stacked = fit_stack(points, serving, families, progress)
    engines, by_engine = fit_engine_latency(points, serving, families, stacks, progress)
    stacked += by_engine
    if progress:
        progress("replaying every run at the fitted values")
    summary = published.summary(replay(short, serving, families, stacks, engines))
    fitted = {p["source"] for p in train} | {STACK_SOURCES[f] for f in stacks}
    fitted |= {ENGINE_SOURCES[e] for e in engines}
    return FitResult(
        serving,
        families,
        terms + more + stacked,
        sorted(fitted),
        sorted({p["source"] for p in points} - fitted),
        summary,
        time.perf_counter() - start,
        stacks,
        engines,
    )


def report_lines(result: FitResult) -> list[str]:
    """The split, each fitted value with its data, and fitted vs held-out error per metric."""
    lines = [
        f"training split, by source: fitted {', '.join(result.train)}; held out "
        f"{', '.join(result.held_out)}",
        "fitted values (and the data that determined each):",
    ]
    for t in result.terms:
        lines.append(f"  {t.name:<22}{t.family:<8}{_shown(t.name, t.value):>11}  {t.data}")
    lines.append(
        "chips of no measured family (MI300X, L4, ...) take the values marked all, unless a "
        "stack family (below) names the chip and its engine"
    )
    lines.append(
        f"median |error| per metric at the fitted values, runs cut to {FIT_AT_MOST:,} requests "
        f"and {FIT_TOKENS:,} output tokens (an all-at-once run cut below its batch reads slow "
        "here; `explorer bench simulate --published` replays every run whole):"
    )
    lines.append(f"  {'metric':<20}{'fitted':>15} | {'held out':>13}")
    for s in result.summary:
        f, h = (f"{s[k]:.1f}%" if s[k] is not None else "-" for k in ("fitted", "held_out"))
        target = f"  (target {s['target_pct']:.0f}%)" if s["target_pct"] else ""
        lines.append(
            f"  {s['metric']:<20}{f:>8} ({s['n_fitted']}) | {h:>7} ({s['n_held_out']}){target}"
        )
    pooled, families = rounded(result)
    if {k: pooled[k] for k in FITTED} == FITTED and families == FITTED_FAMILIES:
        lines.append("the what-if's defaults (whatif_settings.py, fit.FITTED) are these, rounded")
    else:
        lines.append(
            f"the what-if's defaults differ from this fit: put {pooled} and the families' "
            f"{families} in whatif_settings.py and fit.FITTED / FITTED_FAMILIES"
        )
    from explorer.serving.simulate.fit_stack import report_lines as stack_lines

    lines += stack_lines(result.stacks)
    from explorer.serving.simulate.whatif_settings import ENGINE_DEFAULTS

    same = ENGINE_DEFAULTS == rounded_engines(result.engines)
    lines.append(
        f"per-engine request latency {rounded_engines(result.engines)}: "
        + (
            "the what-if's ENGINE_DEFAULTS are these"
            if same
            else "put these in whatif_settings.ENGINE_DEFAULTS"
        )  # fmt: skip
    )
    lines.append(f"fit took {result.seconds:.0f} s")
    return lines


def rounded_engines(engines: dict) -> dict:
    return {e: {k: round(v, 3) for k, v in d.items()} for e, d in engines.items()}


def rounded(result: FitResult) -> tuple[dict, dict]:
    """The fitted values as the what-if declares them (efficiencies to 0.01, times to 0.1 us)."""

    def r(name: str, v: float) -> float:
        return round(v, 2) if name.endswith("efficiency") else round(v, 7)

    pooled = {k: r(k, v) for k, v in result.settings.items()}
    fams = {f: {k: r(k, v) for k, v in d.items()} for f, d in result.families.items()}
    return pooled, fams
