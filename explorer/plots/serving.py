"""Serving views: what many requests on one machine did, from a ServingResult (measured, or a
simulator's modelled one: the title says which).

    gantt_figure(res)       queue / prefill / decode per request along wall time, token ticks
    itl_figure(res)         every inter-token gap at the time it ended, prefill iterations marked
    cdf_figure(results)     latency CDFs (TTFT, TPOT, E2E) of several runs side by side
    engine_figure(res)      batch size and KV blocks in use per engine iteration
    pareto_figure(df)       a serving sweep: output tok/s per machine vs tok/s per user
    capacity_figure(rows)   a simulated latency-throughput curve with the SLOs (modelled)
The serving sweep's own chart is registered with @sweep_plot("serving") at the bottom.
"""

from __future__ import annotations

import math

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from explorer._format import rate
from explorer.plots.common import _layout, _style_axes, log_ticks
from explorer.plots.sweeps import _col, sweep_plot
from explorer.serving.engines import names as engine_names

PHASES = {"queue": "#c7c7c7", "prefill": "#ff7f0e", "decode": "#1f77b4"}
ENGINE_COLORS = {
    "sequential": "#7f7f7f",
    "static": "#2ca02c",
    "continuous": "#1f77b4",
    "http": "#9467bd",
    "simulated": "#d62728",
}
SPARE_COLORS = ("#8c564b", "#e377c2", "#bcbd22", "#17becf")  # engines without a colour above


def engine_color(engine: str | None) -> str | None:
    """An engine's colour (a newly registered engine gets a spare one)."""
    if engine in ENGINE_COLORS or engine not in engine_names():
        return ENGINE_COLORS.get(engine)
    return SPARE_COLORS[engine_names().index(engine) % len(SPARE_COLORS)]


def _kind(res) -> str:
    return "modelled" if res.meta.get("modelled") else "measured"


def _title(res, what: str) -> str:
    m = res.meta
    where = f"{m.get('model', '?')} on {m.get('device', '?')}"
    return f"{what}: {res.label}, {len(res.records)} requests, {where} ({_kind(res)})"


def gantt_figure(res, max_requests: int = 64) -> go.Figure:
    """One row per request: grey queue, orange prefill (to the first token), blue decode; ticks
    at every token. Requests that failed are drawn to where they stopped, in red."""
    recs = sorted(res.records, key=lambda r: r.sent_s if r.sent_s is not None else 1e9)[
        :max_requests
    ]
    fig = go.Figure(
        layout=_layout(
            title=_title(res, "Requests over time"),
            barmode="stack",
            height=max(260, 18 * len(recs) + 120),
            xaxis=dict(title="wall time since the run started (s)", rangemode="tozero"),
            yaxis=dict(title="request", autorange="reversed"),
        )
    )
    names = [r.id for r in recs]
    spans = _phase_spans(recs)
    for p, (base, length) in spans.items():
        fig.add_trace(
            go.Bar(
                name=p,
                y=names,
                x=length,
                base=base,
                orientation="h",
                marker=dict(color=PHASES[p]),
                hovertemplate="%{y}: " + p + " %{base:.3f}s + %{x:.3f}s<extra></extra>",
            )
        )
    tx = [t for r in recs for t in r.token_s]
    ty = [r.id for r in recs for _ in r.token_s]
    fig.add_trace(
        go.Scatter(
            name="token",
            x=tx,
            y=ty,
            mode="markers",
            marker=dict(symbol="line-ns-open", size=7, color="black"),
            hovertemplate="%{y}: token at %{x:.3f}s<extra></extra>",
        )
    )
    bad = [r for r in recs if not r.ok]
    if bad:
        fig.add_trace(
            go.Scatter(
                name="failed",
                x=[r.end_s or r.sent_s or 0 for r in bad],
                y=[r.id for r in bad],
                mode="markers",
                marker=dict(symbol="x", size=9, color="#d62728"),
                text=[r.error for r in bad],
                hovertemplate="%{y}: %{text}<extra></extra>",
            )
        )
    return fig


def _phase_spans(recs) -> dict[str, tuple[list[float], list[float]]]:
    """Per phase (queue, prefill, decode), each request's (start, length) in seconds."""
    spans = {p: ([], []) for p in PHASES}  # base, length
    for r in recs:
        sent = r.sent_s or 0.0
        start = r.start_s if r.start_s is not None else sent
        first = r.token_s[0] if r.token_s else (r.end_s or start)
        end = r.end_s if r.end_s is not None else first
        for p, (a, b) in (
            ("queue", (sent, start)),
            ("prefill", (start, first)),
            ("decode", (first, end)),
        ):
            spans[p][0].append(a)
            spans[p][1].append(max(0.0, b - a))
    return spans


def itl_figure(res) -> go.Figure:
    """Every inter-token latency at the time its token came, coloured by request; the engine's
    prefill iterations shaded: a long prompt's prefill is the gap every decoding request feels."""
    fig = go.Figure(
        layout=_layout(
            title=_title(res, "Inter-token latency"),
            xaxis=dict(title="wall time since the run started (s)", rangemode="tozero"),
            yaxis=dict(title="ITL (ms)"),
            height=360,
            showlegend=True,
        )
    )
    x, y, who = [], [], []
    for r in res.records:
        for t, gap in zip(r.token_s[1:], r.itl):
            x.append(t)
            y.append(gap * 1e3)
            who.append(r.id)
    fig.add_trace(
        go.Scatter(
            name="ITL",
            x=x,
            y=y,
            mode="markers",
            text=who,
            marker=dict(size=4, color="#1f77b4"),
            hovertemplate="%{text}: %{y:.1f} ms at %{x:.3f}s<extra></extra>",
        )
    )
    shapes = [
        dict(
            type="rect",
            xref="x",
            yref="paper",
            x0=i.start_s,
            x1=i.end_s,
            y0=0,
            y1=1,
            fillcolor=PHASES["prefill"],
            opacity=0.25,
            line=dict(width=0),
        )
        for i in res.iterations
        if i.prefill_tokens > 0
    ]
    fig.update_layout(shapes=shapes)
    if shapes:  # a legend entry for the shading
        fig.add_trace(
            go.Scatter(
                name="iteration with prefill",
                x=[None],
                y=[None],
                mode="markers",
                marker=dict(symbol="square", size=10, color=PHASES["prefill"]),
            )
        )
    return fig


def cdf_figure(results) -> go.Figure:
    """Latency CDFs of several runs (TTFT, TPOT, E2E): measured solid, modelled dotted."""
    results = results if isinstance(results, (list, tuple)) else [results]
    fig = make_subplots(rows=1, cols=3, subplot_titles=("TTFT", "TPOT", "E2E latency"))
    for k, res in enumerate(results):
        color = engine_color(res.engine.get("engine"))
        dash = "dot" if res.meta.get("modelled") else None
        for col, name in enumerate(("ttft", "tpot", "e2el"), start=1):
            vals = np.sort(
                [getattr(r, name) * 1e3 for r in res.records if getattr(r, name) is not None]
            )
            frac = np.arange(1, len(vals) + 1) / max(len(vals), 1)
            fig.add_trace(
                go.Scatter(
                    name=f"{res.label} ({_kind(res)})",
                    x=vals,
                    y=frac,
                    mode="lines",
                    legendgroup=str(k),
                    showlegend=col == 1,
                    line=dict(color=color, dash=dash, shape="hv"),
                ),
                row=1,
                col=col,
            )
    _style_axes(fig)
    fig.update_xaxes(title_text="ms")
    fig.update_yaxes(title_text="fraction of requests", row=1, col=1, range=[0, 1.02])
    fig.update_layout(
        height=360,
        template="none",
        title="Latency CDFs",
        legend=dict(orientation="h", x=0, y=0, yref="container", yanchor="bottom"),
        margin=dict(l=60, r=20, t=80, b=90),
    )
    return fig


def engine_figure(res) -> go.Figure:
    """Per engine iteration: requests decoding, prompt tokens prefilled, waiting queue, KV blocks."""
    its = res.iterations
    # one quantity per panel, each axis titled: requests (~16) and prompt tokens (~250) apart
    fig = make_subplots(
        rows=3,
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.07,
        subplot_titles=(
            "requests per iteration",
            "prompt tokens prefilled per iteration",
            "KV cache blocks",
        ),
    )
    t = [i.end_s for i in its]
    lines = [  # (name, Iteration field, row, line style)
        ("requests decoding", "decode_requests", 1, dict(shape="hv", color=PHASES["decode"])),
        ("requests waiting", "waiting", 1, dict(shape="hv", color="#7f7f7f", dash="dot")),
        ("prompt tokens prefilled", "prefill_tokens", 2, dict(shape="hv", color=PHASES["prefill"])),
    ]
    has_kv = any(i.kv_blocks_total for i in its)
    if has_kv:
        lines += [
            ("KV blocks in use", "kv_blocks_used", 3, dict(shape="hv", color="#9467bd")),
            ("KV budget", "kv_blocks_total", 3, dict(color="black", dash="dash")),
        ]
    for name, key, row, line in lines:
        y = [getattr(i, key) for i in its]
        fig.add_trace(go.Scatter(name=name, x=t, y=y, mode="lines", line=line), row, 1)
    if has_kv:
        pre = [i for i in its if i.preempted]
        if pre:
            fig.add_trace(
                go.Scatter(
                    name="preemption",
                    x=[i.end_s for i in pre],
                    y=[i.kv_blocks_used for i in pre],
                    mode="markers",
                    marker=dict(symbol="x", color="#d62728", size=9),
                ),
                3,
                1,
            )
    _style_axes(fig)
    # from the run's start, as the Gantt above it (the first iteration ends a little after 0)
    fig.update_xaxes(autorangeoptions=dict(include=[0]))
    fig.update_xaxes(title_text="wall time since the run started (s)", row=3, col=1)
    for row, unit in ((1, "requests"), (2, "tokens"), (3, "blocks")):
        fig.update_yaxes(title_text=unit, rangemode="tozero", row=row, col=1)
    fig.update_layout(
        height=560,
        template="none",
        title=_title(res, "Inside the engine"),
        legend=dict(orientation="h", y=-0.12),
        margin=dict(l=60, r=20, t=70, b=90),
    )
    return fig


def pareto_figure(df) -> go.Figure:
    """A serving sweep's rows: output tok/s per machine vs tok/s per user, the front joined."""
    fig = go.Figure(
        layout=_layout(
            title="Throughput per machine vs speed per user (measured)",
            xaxis=dict(title="tokens/s per user (1000 / median TPOT)"),
            yaxis=dict(title="output tokens/s per machine"),
            height=380,
        )
    )
    for engine, g in df.groupby("engine"):
        fig.add_trace(
            go.Scatter(
                name=engine,
                x=g["tok_s_per_user"],
                y=g["output_throughput"],
                mode="markers+text",
                text=[f"{v:g}" for v in g["value"]],
                textposition="top center",
                marker=dict(size=9, color=engine_color(engine)),
            )
        )
    front = df[df["pareto"]].sort_values("tok_s_per_user")
    fig.add_trace(
        go.Scatter(
            name="Pareto front",
            x=front["tok_s_per_user"],
            y=front["output_throughput"],
            mode="lines",
            line=dict(color="black", dash="dot"),
        )
    )
    return fig


def capacity_figure(rows: list[dict], slos: dict | None = None, title: str = "") -> go.Figure:
    """p99 TTFT and p99 TPOT against output tok/s, one point per request rate (simulated rows
    of explorer.serving.simulate.capacity.curve); the SLOs as dashed lines; points that meet
    every SLO filled, unstable ones (past saturation: the queue grows) as crosses; each point's
    utilization (offered rate / modelled capacity) beside it and in its hover."""
    slos = slos or {}
    fig = make_subplots(rows=1, cols=2, subplot_titles=("p99 TTFT (ms)", "p99 TPOT (ms)"))
    x = [r["output_throughput"] for r in rows]
    ok = [r["meets_slos"] for r in rows]
    text = [_capacity_label(r) for r in rows]
    symbols = [
        "x" if r.get("steady") is False else ("circle" if o else "circle-open")
        for r, o in zip(rows, ok)
    ]
    for col, key, slo in ((1, "p99_ttft_ms", "ttft"), (2, "p99_tpot_ms", "tpot")):
        fig.add_trace(
            go.Scatter(
                name=f"{key} (modelled)",
                x=x,
                y=[r[key] for r in rows],
                text=text,
                mode="lines+markers+text",
                textposition=_label_positions(x, [r[key] for r in rows]),
                textfont=dict(size=9),
                marker=dict(size=9, symbol=symbols, color=ENGINE_COLORS["simulated"]),
                customdata=[[r["request_rate"], r.get("stability") or ""] for r in rows],
                hovertemplate="%{customdata[0]:.3g} req/s (utilization %{text})<br>%{x:.0f} "
                "tok/s<br>%{y:.1f} ms<br>%{customdata[1]}<extra></extra>",
                showlegend=False,
            ),
            row=1,
            col=col,
        )
        if slo in slos:
            _slo_line(fig, col, slos[slo])
    head = rows[0] if rows else {}
    label = title or (
        f"{head.get('model', '?')} on {head.get('tp', 1)} x {head.get('chip', '?')}: latency vs "
        "throughput (modelled; filled: every SLO met at p99; x: unstable; labels: utilization)"
    )
    fig.update_layout(**_layout(title=label, height=380))
    fig.update_xaxes(title_text="output tokens/s (modelled)", type="log")
    fig.update_yaxes(type="log")
    _style_axes(fig)
    log_ticks(fig)
    return fig


DEPLOYMENT_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd")


def deployments_figure(
    curves: dict[str, list[dict]], slos: dict | None = None, answers: dict | None = None
) -> go.Figure:
    """Deployments of one model side by side (label -> capacity.curve rows): p99 TTFT and p99
    TPOT against the request rate, one line each; unstable points as crosses (past saturation a
    run's percentiles are no rate's); the SLOs dashed; each deployment's largest rate meeting the
    SLOs (answers: label -> req/s or None) as a dotted line of its colour. All modelled."""
    slos, answers = slos or {}, answers or {}
    fig = make_subplots(rows=1, cols=2, subplot_titles=("p99 TTFT (ms)", "p99 TPOT (ms)"))
    for i, (label, rows) in enumerate(curves.items()):
        color = DEPLOYMENT_COLORS[i % len(DEPLOYMENT_COLORS)]
        symbols = ["x" if r.get("steady") is False else "circle" for r in rows]
        for col, key in ((1, "p99_ttft_ms"), (2, "p99_tpot_ms")):
            trace = go.Scatter(
                name=label,
                legendgroup=label,
                showlegend=col == 1,
                x=[r["request_rate"] for r in rows],
                y=[r[key] for r in rows],
                mode="lines+markers",
                line=dict(color=color),
                marker=dict(size=8, symbol=symbols, color=color),
                hovertemplate=f"{label}<br>%{{x:.3g}} req/s<br>%{{y:.1f}} ms<extra></extra>",
            )
            fig.add_trace(trace, row=1, col=col)
            if answers.get(label):
                fig.add_vline(x=answers[label], line=dict(color=color, dash="dot"), row=1, col=col)
    for col, slo in ((1, "ttft"), (2, "tpot")):
        if slo in slos:
            _slo_line(fig, col, slos[slo])
    title = "latency vs request rate (modelled; x: unstable; dotted: largest rate meeting the SLOs)"
    fig.update_layout(**_layout(title=title, height=400))
    fig.update_xaxes(title_text="request rate (req/s, modelled)")
    fig.update_yaxes(type="log")
    _style_axes(fig)
    log_ticks(fig)
    return fig


def _slo_line(fig: go.Figure, col: int, ms: float) -> None:
    """A dashed SLO line across subplot `col` with its label. The axes are logarithmic: a shape's y
    is a data value but an annotation's y is in log10 units there (500 ms is y=2.7, not 10^500)."""
    axis = "" if col == 1 else str(col)
    fig.add_shape(
        type="line",
        xref=f"x{axis} domain",
        yref=f"y{axis}",
        x0=0,
        x1=1,
        y0=ms,
        y1=ms,
        line=dict(color="black", dash="dash"),
    )
    fig.add_annotation(  # at the left end: the curve's labels crowd the right end (the knee)
        text=f"SLO {ms:g} ms",
        xref=f"x{axis} domain",
        yref=f"y{axis}",
        x=0.01,
        y=math.log10(ms) if ms > 0 else 0,
        xanchor="left",
        yanchor="bottom",
        showarrow=False,
    )


def _label_positions(xs: list[float], ys: list[float], near: float = 0.05) -> list[str]:
    """Where each point's label goes: above it, unless the point sits within `near` decades of a
    neighbour on both (log) axes (the knee, where rates pile up): then beside it, alternately
    right and left along the run of crowded points, so that neighbouring labels do not overlap."""

    def close(i: int, j: int) -> bool:
        a, b = (xs[i], ys[i]), (xs[j], ys[j])
        return (
            min(*a, *b) > 0
            and abs(math.log10(a[0] / b[0])) < near
            and abs(math.log10(a[1] / b[1])) < near
        )

    out, side = [], 0
    for i in range(len(xs)):
        if (i > 0 and close(i, i - 1)) or (i + 1 < len(xs) and close(i, i + 1)):
            out.append(("middle right", "middle left")[side % 2])
            side += 1
        else:
            out.append("top center")
            side = 0
    return out


def _capacity_label(row: dict) -> str:
    """'0.9 x' (utilization = rate / modelled capacity) or the rate when there is none."""
    u = row.get("utilization")
    return f"{u:.2f}x" if u is not None else rate(row["request_rate"])


# --- the serving sweep's chart (explorer.sweeps.serving) -----------------------------------------

_SWEEP_ENGINES = engine_names(local_only=True)  # the engines the serving sweep runs
OFFERED = "offered load (modelled: rate x output tokens)"


def _serving_columns(df):
    cols = {}
    for e in _SWEEP_ENGINES:
        part = df[df["engine"] == e] if len(df) else df
        x = _col(part, "value")
        cols[f"{e}: output tok/s (measured)"] = {"x": x, "y": _col(part, "output_throughput")}
        cols[f"{e}: p50 TTFT (measured)"] = {"x": x, "y": _col(part, "median_ttft_ms")}
        cols[f"{e}: p99 TTFT (measured)"] = {"x": x, "y": _col(part, "p99_ttft_ms")}
    first = df.drop_duplicates("value") if len(df) else df
    cols[OFFERED] = {"x": _col(first, "value"), "y": _col(first, "offered_tok_s_modelled")}
    return cols


def _serving_shapes(df):
    shapes = []
    if len(df) and "knee" in df:
        for v in df[df["knee"]]["value"]:
            shapes.append(
                dict(
                    type="line",
                    xref="x",
                    yref="paper",
                    x0=v,
                    x1=v,
                    y0=0,
                    y1=1,
                    line=dict(color="#d62728", dash="dash"),
                )
            )
    over = df["over"].iloc[0] if len(df) else "rate"
    return {
        "shapes": shapes,
        "title.text": f"Serving sweep over {over} (measured; dashed: the knee)",
    }


@sweep_plot("serving", _serving_columns, _serving_shapes)
def _serving_figure() -> go.Figure:
    fig = make_subplots(
        rows=1, cols=2, subplot_titles=("output throughput", "TTFT (p50 solid, p99 dotted)")
    )
    for e in _SWEEP_ENGINES:
        c = engine_color(e)
        fig.add_trace(
            go.Scatter(
                name=f"{e}: output tok/s (measured)",
                x=[],
                y=[],
                mode="lines+markers",
                line=dict(color=c),
            ),
            1,
            1,
        )
        fig.add_trace(
            go.Scatter(
                name=f"{e}: p50 TTFT (measured)",
                x=[],
                y=[],
                mode="lines+markers",
                line=dict(color=c),
            ),
            1,
            2,
        )
        fig.add_trace(
            go.Scatter(
                name=f"{e}: p99 TTFT (measured)",
                x=[],
                y=[],
                mode="lines",
                line=dict(color=c, dash="dot"),
            ),
            1,
            2,
        )
    fig.add_trace(  # what arrives: no engine can deliver more than it is asked for
        go.Scatter(name=OFFERED, x=[], y=[], mode="lines", line=dict(color="grey", dash="dash")),
        1,
        1,
    )
    fig.update_xaxes(title_text="setting (requests/s, in flight, batch limit or KV blocks)")
    fig.update_yaxes(title_text="tok/s", row=1, col=1)
    fig.update_yaxes(title_text="ms", row=1, col=2)
    return fig


def placeholder_figure(title: str, hint: str = "Run a workload to draw this view") -> go.Figure:
    """An empty view with its title and a hint (the dashboard's Serving tab before its first run)."""
    fig = go.Figure(layout=_layout(title=title, height=300))
    fig.add_annotation(text=hint, showarrow=False, xref="paper", yref="paper", x=0.5, y=0.5)
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return fig
