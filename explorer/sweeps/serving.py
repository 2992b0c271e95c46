"""Serving sweeps: one seeded workload on each setting, through a real engine.

    over="rate"         request rate (Poisson) -> throughput vs p50/p99 latency, the knee marked
    over="concurrency"  closed loop with C in flight (all requests ready at t=0)
    over="batch"        the engine's batch limit (its Knobs.batch_knob: static max_batch,
                        continuous max_requests_per_batch) ->
                        output tok/s per machine vs tok/s per user: the Pareto front
    over="kv"           the KV block budget (Knobs.kv_knob: continuous num_blocks) -> preemptions

Knee (rate sweeps): the highest rate before median TTFT first exceeds twice its value at the
lightest rate -- past it, requests queue faster than the engine drains them. No knee is marked
when TTFT never doubles within the rates swept.

Steady (rate sweeps): each measured point is judged by the same trend test as a simulated run
(explorer.serving.steady: the waiting queue does not grow over the second half of the arrivals).
Rates are swept from the lowest up; once an engine's point is unstable (past saturation) its
higher rates are not run: a rate past saturation measures the run's length, not the engine. The
frame says so in attrs["saturated"] ({engine: first unstable rate}) and in its notes.
"""

from __future__ import annotations

import threading

import pandas as pd

from explorer.serving import Workload, serve
from explorer.serving.engines import get as get_engine
from explorer.serving.engines import names as engine_names
from explorer.serving.run import RunInterrupted
from explorer.sweeps import Param, Sweep, register
from explorer.sweeps._common import COLUMNS as GLOSSARY
from explorer.sweeps._common import Bar, Progress, attrs, frame, measure_points

OVER = ("rate", "concurrency", "batch", "kv")

COLUMNS = [
    "engine",
    "over",
    "value",
    "completed",
    "failed",
    "request_throughput",
    "output_throughput",
    "tok_s_per_user",
    "median_ttft_ms",
    "p99_ttft_ms",
    "median_tpot_ms",
    "p99_tpot_ms",
    "median_itl_ms",
    "p99_itl_ms",
    "median_e2el_ms",
    "p99_e2el_ms",
    "preemptions",
    "steady",
    "queue_growth",
    "offered_tok_s_modelled",
    "pareto",
    "knee",
    "partial",
]

GLOSSARY.update(
    {
        "engine": f"serving engine ({', '.join(engine_names(local_only=True))})",
        "over": "what the sweep varies: rate, concurrency, batch or kv",
        "value": "the setting: requests/s, in-flight limit, batch limit or KV blocks",
        "completed": "requests that finished",
        "failed": "requests that did not finish (stopped, errors)",
        "request_throughput": "completed requests / run duration (req/s, measured)",
        "output_throughput": "output tokens / run duration (tok/s per machine, measured)",
        "tok_s_per_user": "1000 / median TPOT: tokens per second one user sees (measured)",
        "median_ttft_ms": "median time to first token (ms, measured, vLLM's definition)",
        "p99_ttft_ms": "99th percentile TTFT (ms)",
        "median_tpot_ms": "median time per output token after the first (ms)",
        "p99_tpot_ms": "99th percentile TPOT (ms)",
        "median_itl_ms": "median inter-token latency (ms)",
        "p99_itl_ms": "99th percentile inter-token latency (ms)",
        "median_e2el_ms": "median end-to-end latency (ms)",
        "p99_e2el_ms": "99th percentile end-to-end latency (ms)",
        "preemptions": "requests the continuous engine evicted from its KV cache (all iterations)",
        "steady": "rate sweeps: the waiting queue does not trend up over the second half of the "
        "arrivals (explorer.serving.steady; False: unstable, past saturation)",
        "queue_growth": "rate sweeps: the waiting queue's growth per arrival over the second half "
        "of the arrivals (about 1 - 1/utilisation when overloaded; steady up to 0.05)",
        "offered_tok_s_modelled": "rate sweeps: requests/s x output tokens per request, the output "
        "tok/s asked for (modelled; throughput cannot exceed it)",
        "pareto": "on the front of output tok/s vs tok/s per user (no other row beats it on both)",
        "knee": "rate sweeps: the last rate before median TTFT exceeds 2x its lightest-rate value",
        "partial": "the run did not complete (stopped, interrupted or failed requests): its figures "
        "are what it measured before that, not a finished run",
    }
)


ONE_RUN_NOTE = "one run per setting (its percentiles are over its requests); repeats not used"


def run(
    lm,
    *,
    over: str = "rate",
    values=(1.0, 2.0, 4.0, 8.0, 16.0),
    engines=("continuous",),
    num_prompts: int = 24,
    input_len: int = 32,
    output_len: int = 32,
    seed: int = 0,
    progress: Progress | None = None,
    bar: bool = True,
    stop: threading.Event | None = None,
    repeats: int = 1,
    **knobs,
) -> pd.DataFrame:
    """One row per (engine, value): the serving metrics of the same seeded workload.

    One run per setting: a run is already many requests, and its percentiles are over them
    (`repeats`, which the other sweeps take, is noted and not used)."""
    over, points = _points(over, values, engines)
    notes: list[str] = [] if repeats == 1 else [ONE_RUN_NOTE]
    saturated: dict = {}
    progress_bar = Bar(len(points), f"serving sweep over {over}", progress, bar)
    stop = stop or threading.Event()

    def point(p) -> dict | list:
        engine, value = p
        if engine in saturated:  # past saturation: not run
            progress_bar.update()
            return []
        wl, kn = _setting(over, value, engine, num_prompts, input_len, output_len, seed)
        try:
            res = serve(lm, wl, engine, stop=stop, **{**knobs, **kn})
        except RunInterrupted as stopped:  # Ctrl-C: keep what this point measured, marked partial
            cut.append({**_row(engine, over, value, stopped.result), "partial": True})
            raise
        progress_bar.update()
        if res.meta["status"] != "complete":
            notes.append(f"{engine} at {over}={value}: {res.meta['status']}")
        row = {**_row(engine, over, value, res), "partial": res.meta["status"] != "complete"}
        row["offered_tok_s_modelled"] = float(value) * output_len if over == "rate" else None
        if over == "rate" and res.result.get("steady") is False:
            saturated[engine] = value
            notes.append(
                f"{engine}: stopped at rate {value:g} req/s, past saturation "
                f"({res.result['stability']}); higher rates not run"
            )
        return row

    cut: list[dict] = []  # the interrupted point's row, partial
    try:
        rows = measure_points(
            points, point, notes, label=lambda p: f"{p[0]} {over}={p[1]}", stop=stop
        )
    finally:
        progress_bar.close()
    return _table(lm, rows + cut, notes, over, saturated)


def _points(over, values, engines) -> tuple[str, list[tuple]]:
    """The axis checked and the (engine, value) points of the sweep, in the order they run."""
    over = over[0] if isinstance(over, list) else over
    if over not in OVER:
        raise ValueError(f"over must be one of {', '.join(OVER)}, got {over!r}")
    if over == "kv":  # only the engines with a KV budget knob
        engines = [e for e in engine_names(local_only=True) if get_engine(e).Knobs.kv_knob]
    if over == "rate":
        values = sorted(values)  # lowest first: the sweep stops past saturation
    return over, [(e, v) for e in engines for v in values]


def _table(lm, rows: list[dict], notes: list[str], over: str, saturated: dict) -> pd.DataFrame:
    """The sweep's frame: its rows, its notes, the knee marked, the saturated rates."""
    df = frame(
        rows, COLUMNS, attrs("serving", lm, None, notes, COLUMNS, repeats=1, warmup=0, over=over)
    )
    mark(df)
    df.attrs["saturated"] = dict(saturated)
    df.attrs["knee"] = (
        {e: v for e, v in df[df["knee"]][["engine", "value"]].values} if len(df) else {}
    )
    return df


def _setting(over, value, engine, n, input_len, output_len, seed):
    wl = dict(num_prompts=n, input_len=input_len, output_len=output_len, seed=seed)
    kn: dict = {}
    if over == "rate":
        wl.update(arrival="poisson", request_rate=float(value))
    elif over == "concurrency":
        wl.update(max_concurrency=int(value))
    else:  # batch or kv: the engine's knob for it, as its Knobs declare (none: unchanged)
        knob = getattr(get_engine(engine).Knobs, f"{over}_knob")
        kn = {knob: int(value)} if knob else {}
    return Workload(**wl), kn


def _row(engine, over, value, res) -> dict:
    r = res.result
    tpot = r.get("median_tpot_ms")
    pre = sum(i.preempted for i in res.iterations)
    row = {k: r.get(k) for k in COLUMNS if k in r}
    if over != "rate":  # a closed loop or a burst has no arrival rate to be steady at
        row.update(steady=None, queue_growth=None)
    return {
        **row,
        "engine": engine,
        "over": over,
        "value": value,
        "preemptions": pre,
        "tok_s_per_user": 1000.0 / tpot if tpot else None,
    }


def mark(df: pd.DataFrame) -> None:
    """Fill the pareto and knee columns (in place)."""
    df["pareto"] = False
    df["knee"] = False
    if df.empty:
        return
    pts = df[["output_throughput", "tok_s_per_user"]].fillna(0).values
    for i, (a, b) in enumerate(pts):
        beaten = any((x >= a and y >= b) and (x > a or y > b) for x, y in pts)
        df.loc[df.index[i], "pareto"] = not beaten
    if df["over"].iloc[0] != "rate":
        return
    for _, g in df.groupby("engine"):
        g = g.sort_values("value")
        base = g["median_ttft_ms"].iloc[0]
        over = g[g["median_ttft_ms"] > 2 * base]
        if not len(over):  # never past twice the lightest: no knee within the rates swept
            continue
        knee = g[g["value"] < over["value"].iloc[0]]
        if len(knee):
            df.loc[knee.index[-1], "knee"] = True


register(
    Sweep(
        name="serving",
        title="Serving",
        run=run,
        columns=COLUMNS,
        help="one seeded workload through an engine at each rate, concurrency, batch limit or KV budget",
        params=(
            Param("values", "floats", "values", "1,2,4,8,16", "the settings to sweep"),
            Param("over", "names", "over", "rate", "rate | concurrency | batch | kv"),
            Param(
                "engines",
                "names",
                "engines",
                "continuous",
                ", ".join(engine_names(local_only=True)),
            ),
            Param("num_prompts", "int", "requests", "24", "requests per point"),
            Param("input_len", "int", "input length", "32", "prompt tokens per request"),
            Param("output_len", "int", "output length", "32", "output tokens per request"),
        ),
        order=80,
    )
)
