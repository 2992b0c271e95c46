"""Two serving tricks, measured through the serving lab's real engines (explorer.serving.serve).

continuous       continuous batching (transformers' engine, max_requests_per_batch = B) against
                 static batching (batches of up to B, each run until its longest request ends),
                 on the same seeded workload. Unit: a request's mean end-to-end latency.
                   --over spread   output-length spread of a burst: 0 is every output the same
                                   length, s > 0 lognormal with sigma s (static waits for the longest)
                   --over rate     Poisson arrivals, requests/s, fixed lengths (static makes a
                                   newcomer wait for the running batch); a rate at which either
                                   engine's waiting queue grows (explorer.serving.steady) is past
                                   saturation: marked unstable, its figures kept out of the speedup
chunked-prefill  the continuous engine with max_batch_tokens = the chunk (a long prompt is
                 prefilled chunk by chunk between the other requests' decode steps) against the same
                 engine with room for the whole prompt in one iteration: the head-of-line
                 scenario's experiment (its workload, arrival rule and figures, at its small
                 sizes). speedup = the short requests' p99 inter-token latency gain;
                 the long prompt's TTFT cost is in each row's why and attrs["long_prompt_ttft_s"].
                   --over chunk    max_batch_tokens

predicted_speedup: the serving simulator (explorer.serving.simulate: each engine's scheduler as a
policy over the same knobs, iteration times from STEP_RULE) on the same requests, its step models
fitted at setup on profiling runs through each real engine ("modelled from measured parts"). The
regime is that of the baseline's typical decode iteration (continuous) or of its long-prompt
iteration (chunked-prefill), from the split of that measured iteration.
"""

from __future__ import annotations

import statistics

from explorer._format import ms
from explorer.costs.parts import shape_of
from explorer.costs.timing import alternate
from explorer.costs.tricks import ratio
from explorer.serving import Workload, serve
from explorer.serving.scenarios import head_of_line
from explorer.serving.simulate import simulate
from explorer.serving.simulate.steptime import StepModel, busy_gap, fit, startup_delay
from explorer.sweeps._common import StopSweep
from explorer.sweeps.pays import MEASURED, Axis, Trick, TrickContext, register_trick
from explorer.sweeps.pays._why import regime_phrase

# tiny workloads: one point takes a couple of seconds on a laptop CPU (a GPU user raises them)
NUM_PROMPTS, INPUT_LEN, OUTPUT_LEN, MAX_BATCH = 8, 16, 12, 4
RATE_PROMPTS = 24  # a rate point needs 8+ arrivals in its second half to be judged steady or not
RATE_SPREAD = 0.0  # the rate axis keeps lengths fixed: one reason at a time
MAX_SPREAD, MAX_RATE = 3.0, 10_000.0  # the continuous trick's axes: beyond, nothing new


def _opt(ctx: TrickContext, name: str, default):
    return ctx.options.get(name, default)


def _run(ctx: TrickContext, requests, engine: str, knobs: dict):
    res = serve(ctx.lm, requests, engine, **knobs)
    if res.meta["status"] != "complete":
        raise StopSweep(f"a {engine} run did not complete ({res.meta['status']})")
    return res


def _fit_steps(ctx: TrickContext, runs) -> StepModel:
    """A step-time model (STEP_RULE) fitted on the measured iterations of some runs, with their
    measured idle gap between iterations and engine start (as explorer.serving.simulate.profile)."""
    points = [{"passes": i.passes, "seconds": i.seconds} for r in runs for i in r.iterations]
    model = fit(shape_of(ctx.lm.info), points, key={"engine": "pays setup"})
    model.gap_s = busy_gap([i for r in runs for i in r.iterations])
    model.startup_s = startup_delay(runs)
    return model


def _median(values, ctx: TrickContext | None = None) -> float | None:
    """The median of the values that are not None; ctx: keep their spread for the row."""
    values = [v for v in values if v is not None]
    if ctx is not None and values:
        ctx.keep(values)
    return statistics.median(values) if values else None


def _alternate(ctx: TrickContext, runs: dict) -> dict[str, list]:
    """Each named run (a no-argument function -> ServingResult) ctx.repeats times, alternately
    (A B, B A, ...; explorer.costs.timing.alternate), so drift on a shared machine falls on both
    alike; the runs' results by name. How busy the machine was joins ctx.timed (the noisy mark)."""
    got = alternate(runs, ctx.repeats, ctx.lm.device, tick=ctx.tick, keep=True)
    ctx.timed.extend(got.values())
    return {name: m.results for name, m in got.items()}


def _decode_split(ctx: TrickContext, res) -> dict:
    """The split of the run's median decode-only iteration (its batch and mean context)."""
    its = [i for i in res.iterations if i.passes and i.prefill_tokens == 0 and i.decode_requests]
    its = sorted(its, key=lambda i: i.seconds)
    it = its[len(its) // 2] if its else max(res.iterations, key=lambda i: i.seconds)
    batch = max(1, len(it.passes))
    context = max(2, round(sum(q + p for q, p in it.passes) / batch))
    return {
        **ctx.split(it.seconds, batch=batch, tokens_fed=1, context_len=context),
        "batch": batch,
    }


# --- continuous vs static batching ----------------------------------------------------------------


def _workload(ctx: TrickContext, value: float) -> Workload:
    n = _opt(ctx, "num_prompts", NUM_PROMPTS if ctx.axis == "spread" else RATE_PROMPTS)
    inp, out = _opt(ctx, "input_len", INPUT_LEN), _opt(ctx, "output_len", OUTPUT_LEN)
    common = dict(num_prompts=n, input_len=inp, output_len=out, seed=ctx.seed)
    if ctx.axis == "spread":
        dist = "lognormal" if value > 0 else "fixed"
        return Workload(**common, output_dist=dist, output_spread=float(value))
    spread = _opt(ctx, "spread", RATE_SPREAD)
    return Workload(
        **common,
        arrival="poisson",
        request_rate=float(value),
        output_dist="lognormal" if spread > 0 else "fixed",
        output_spread=float(spread),
    )


def setup_continuous(ctx: TrickContext):
    batch = _opt(ctx, "max_batch", MAX_BATCH)
    knobs = {
        "static": {"max_batch": batch},
        "continuous": {"max_requests_per_batch": batch},
    }
    ctx.attrs.update(max_batch=batch, engines_knobs=knobs, metric="mean_e2el_ms")
    steps = _fitted_steps(ctx, knobs)
    saturated: list[float] = []

    def point(value: float) -> dict:
        if saturated:  # past saturation both engines already were: a higher rate measures nothing
            return _not_run(value, saturated[0])
        requests = _workload(ctx, value).requests(ctx.lm)
        got = _alternate(ctx, {e: (lambda e=e: _run(ctx, requests, e, knobs[e])) for e in knobs})
        base, fast = got["static"], got["continuous"]
        parts = _decode_split(ctx, base[0])
        sim = {
            e: simulate(ctx.lm.info, requests, e, steps[e], requests=requests, **knobs[e])
            for e in knobs
        }
        predicted = ratio(
            sim["static"].result["mean_e2el_ms"], sim["continuous"].result["mean_e2el_ms"]
        )
        row = {
            "baseline_s": _median((r.result["mean_e2el_ms"] for r in base), ctx) / 1e3,
            "trick_s": _median((r.result["mean_e2el_ms"] for r in fast), ctx) / 1e3,
            "predicted_speedup": predicted,
            "regime": parts["regime"],
            "how": MEASURED,
        }
        unstable = [  # any repeat whose waiting queue grew: that engine is past saturation here
            f"{e}: {bad[0].result['stability']}"
            for e, runs in (("static", base), ("continuous", fast))
            if (bad := [r for r in runs if r.result.get("steady") is False])
        ]
        if any(res.result.get("steady") is False for res in sim.values()):
            row["predicted_speedup"] = None  # the simulated queue grows too: no steady figure
        if unstable:
            if len(unstable) == 2:
                saturated.append(value)
            row.update(
                baseline_s=None,
                trick_s=None,
                skipped="unstable (past saturation): " + "; ".join(unstable),
            )
            row["why"] = f"rate {value:g} req/s is past saturation, not averaged: " + "; ".join(
                unstable
            )
            return row
        row["why"] = _continuous_why(ctx, value, requests, base[0], fast[0], parts, batch)
        return row

    return point


def _fitted_steps(ctx: TrickContext, knobs: dict[str, dict]) -> dict:
    """Per engine, the simulator's step model fitted on one profiling run here (after a
    discarded warm-up run); the note says so."""
    profile = Workload(num_prompts=6, input_len=INPUT_LEN, output_len=OUTPUT_LEN, seed=99,
                       output_dist="lognormal", output_spread=0.8).requests(ctx.lm)  # fmt: skip
    steps = {}
    for engine, kn in knobs.items():
        _run(ctx, profile[:1], engine, kn)  # warm-up, discarded
        steps[engine] = _fit_steps(ctx, [_run(ctx, profile, engine, kn)])
    ctx.notes.append(
        "predicted_speedup: the serving simulator's static and continuous policies on the same "
        "requests, step models fitted on one profiling run of each engine here"
    )
    return steps


def _not_run(value: float, first: float) -> dict:
    why = f"not run: both engines were past saturation at {first:g} req/s already"
    return {"regime": None, "how": MEASURED, "skipped": why, "why": why, "predicted_speedup": None}


def _continuous_why(ctx, value, requests, base, fast, parts, batch: int) -> str:
    outs = [r.max_tokens for r in requests]
    head = (
        f"output lengths {min(outs)}-{max(outs)}: a static batch runs until its longest request ends"
        if ctx.axis == "spread"
        else f"{value:g} req/s: a newcomer waits for the running static batch to end"
    )
    return (
        f"{head} ({len(base.iterations)} iterations) while continuous refills a freed slot at once "
        f"({len(fast.iterations)}); static's decode step at batch {parts['batch']} is "
        f"{regime_phrase(parts)}"
    )


# --- chunked prefill -----------------------------------------------------------------------------


def _chunk_requests(ctx: TrickContext):
    """The head-of-line scenario's experiment (explorer.serving.scenarios.head_of_line) at its
    small sizes: short requests decoding from t=0, and its long prompt (capped at the model's
    context); options long_len, short_prompts, short_output resize it."""
    small = head_of_line.SMALL
    cap = (ctx.lm.info.max_positions or 10**6) - head_of_line.LONG_OUTPUT - 1
    sizes = {
        **small,
        "long_len": min(_opt(ctx, "long_len", small["long_len"]), cap),
        "shorts": _opt(ctx, "short_prompts", small["shorts"]),
        "output_len": _opt(ctx, "short_output", small["output_len"]),
    }
    shorts, long = head_of_line.workloads(sizes, seed=ctx.seed)
    return shorts.requests(ctx.lm), long.requests(ctx.lm)


def _figure_s(runs, key: str) -> float | None:
    """The median over runs of one of the scenario's figures (head_of_line.figures, ms), in s."""
    got = _median(head_of_line.figures(r)[key] for r in runs)
    return None if got is None else got / 1e3


def setup_chunked(ctx: TrickContext):
    shorts, long = _chunk_requests(ctx)
    long_len = len(long[0].prompt_ids)
    whole = {"max_batch_tokens": long_len + len(shorts) + 1}
    _run(ctx, shorts[:1], "continuous", whole)  # warm-up, discarded
    alone = _run(ctx, shorts, "continuous", whole)
    at = head_of_line.long_arrival(alone.result) or 0.0  # the scenario's rule: while they decode
    requests = head_of_line.with_long(shorts, long, at)
    probe = _run(ctx, requests, "continuous", {"max_batch_tokens": 16})
    steps = _fit_steps(ctx, [alone, probe, _run(ctx, requests, "continuous", whole)])
    ctx.attrs.update(
        long_prompt_len=long_len,
        long_prompt_arrival_s=at,
        baseline_max_batch_tokens=whole["max_batch_tokens"],
        metric="the short requests' p99 inter-token latency",
        long_prompt_ttft_s={},
    )

    def point(chunk: int) -> dict:
        trick = {"max_batch_tokens": int(chunk)}
        got = _alternate(ctx, {
            "base": lambda: _run(ctx, requests, "continuous", whole),
            "fast": lambda: _run(ctx, requests, "continuous", trick),
        })  # fmt: skip
        base_itl = _figure_s(got["base"], "others_p99_itl_ms")
        fast_itl = _figure_s(got["fast"], "others_p99_itl_ms")
        ttft = (_figure_s(got["base"], "long_ttft_ms"), _figure_s(got["fast"], "long_ttft_ms"))
        ctx.attrs["long_prompt_ttft_s"][chunk] = {"baseline": ttft[0], "trick": ttft[1]}
        sim = [simulate(ctx.lm.info, requests, "continuous", steps, requests=requests, **k)
               for k in (whole, trick)]  # fmt: skip
        parts = _prefill_split(ctx, got["base"][0], long_len)
        return {
            "baseline_s": base_itl,
            "trick_s": fast_itl,
            "predicted_speedup": ratio(*(_figure_s([r], "others_p99_itl_ms") for r in sim)),
            "regime": parts["regime"],
            "how": MEASURED,
            "why": _chunk_why(chunk, long_len, parts, base_itl, fast_itl, ttft),
        }

    return point


def _prefill_split(ctx: TrickContext, res, long_len: int) -> dict:
    """The split of the baseline's iteration that prefilled the long prompt (as one prompt pass of
    long_len tokens: the decode rows beside it are a few tokens more)."""
    it = max(res.iterations, key=lambda i: i.prefill_tokens)
    return {
        **ctx.split(it.seconds, batch=1, tokens_fed=long_len, context_len=long_len),
        "seconds": it.seconds,
    }


def _chunk_why(chunk, long_len, parts, base_itl, fast_itl, ttft) -> str:
    pieces = -(-long_len // int(chunk))
    cost = ratio(ttft[1], ttft[0])
    return (
        f"chunk {chunk}: the {long_len}-token prompt's prefill iteration ({ms(parts['seconds'])}) "
        f"is {regime_phrase(parts)}; every decoding request waits for it. In {pieces} chunk(s) the "
        f"others' p99 gap goes {ms(base_itl)} -> {ms(fast_itl)}, the long prompt's TTFT "
        f"{ms(ttft[0])} -> {ms(ttft[1])}" + (f" ({cost:.2g}x)" if cost else "")
    )


register_trick(
    Trick(
        name="continuous",
        title="continuous vs static batching",
        baseline=f"static batching (batches of up to {MAX_BATCH}, each until its longest request ends)",
        unit="a request's mean end-to-end latency over the workload (s)",
        axes=(
            Axis(
                "spread",
                "floats",
                (0.0, 0.25, 0.5, 1.0),
                "output-length spread of a burst: 0 fixed, s > 0 lognormal sigma s (at most "
                f"{MAX_SPREAD:g}: past it the lengths overrun any context)",
                low=0,
                high=MAX_SPREAD,
            ),
            Axis(
                "rate",
                "floats",
                (4.0, 8.0, 16.0, 32.0),
                f"Poisson request rate (req/s), fixed lengths (at most {MAX_RATE:g}: past it "
                "every request arrives at once)",
                low=0.01,
                high=MAX_RATE,
            ),
        ),  # fmt: skip
        setup=setup_continuous,
        help="the same requests through the static and the continuous engine",
        order=70,
    )
)
register_trick(
    Trick(
        name="chunked-prefill",
        title="chunked prefill (max batch tokens)",
        baseline="the continuous engine with room for the whole long prompt in one iteration",
        unit="the short requests' p99 inter-token latency (s)",
        axes=(
            Axis(
                "chunk",
                "ints",
                (16, 32, 64, 128, 256),
                "max_batch_tokens: query tokens per iteration, the prefill chunk (at most the "
                "model's context: a larger chunk is the whole prompt)",
                low=8,
                high=lambda info: info.max_positions or None,
            ),
        ),  # fmt: skip
        setup=setup_chunked,
        help="a long prompt arriving among decoding requests, prefilled in chunks",
        order=75,
    )
)
