"""Seeing it break: a failure scenario's broken run beside its fixed run, on the same charts over time
(explorer.serving.scenarios; any two ServingResults work too).

    scenario_figure(scen)               queue, KV blocks in use (preemptions marked), TTFT by
                                        arrival time, ITL by token time; broken red, fixed green;
                                        the title carries the verdict
    scenario_figure(broken, fixed)      the same from two ServingResults
    scenario_columns(res)               the numbers one run puts on those charts (numpy arrays)

Time runs from each run's own start, so the two runs line up at their first arrival. A run that
was stopped (partial) says so in its legend; a modelled run (the simulator) says modelled.
"""

from __future__ import annotations

import textwrap

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from explorer.plots.common import _house_style

RUN_COLORS = {"broken": "#d62728", "fixed": "#2ca02c"}
PANELS = (  # (key, subplot title, y axis title)
    ("queue", "requests waiting (the queue)", "requests"),
    ("kv", "KV cache blocks in use", "blocks"),
    ("ttft", "TTFT of each request, at its arrival", "ms"),
    ("itl", "inter-token latency, at each token", "ms"),
)


def _kind(res) -> str:
    return "modelled" if res.meta.get("modelled") else "measured"


def run_label(role: str, res) -> str:
    """'broken: continuous #1 (measured)' (', partial' when the run was stopped)."""
    extra = ", partial" if res.meta.get("partial") else ""
    return f"{role}: {res.label} ({_kind(res)}{extra})"


def queue_from_records(res) -> tuple[np.ndarray, np.ndarray]:
    """(time, requests waiting) from the records alone: sent but not yet started (engines that
    record no iterations: static, sequential, a server over http)."""
    events = []
    for r in res.records:
        if r.sent_s is None:
            continue
        start = r.start_s if r.start_s is not None else (r.token_s[0] if r.token_s else r.end_s)
        if start is not None and start <= r.sent_s:
            continue  # never waited
        events.append((r.sent_s, 1))
        if start is not None:
            events.append((start, -1))
    events.sort()  # a start before an arrival at the same instant: no spike that never was
    t = np.array([e[0] for e in events], dtype=float)
    return t, np.cumsum([e[1] for e in events]).astype(float)


def scenario_columns(res) -> dict[str, dict[str, np.ndarray]]:
    """{panel: {"x": ..., "y": ...}} of one run, plus "budget" and "preempted" for the KV panel
    (empty arrays where the run has none: an engine without a paged cache records no blocks)."""
    its = res.iterations
    if any(i.waiting is not None for i in its):
        queue = (
            np.array([i.end_s for i in its], dtype=float),
            np.array([np.nan if i.waiting is None else i.waiting for i in its], dtype=float),
        )
    else:
        queue = queue_from_records(res)
    kv_its = [i for i in its if i.kv_blocks_used is not None]
    pre = [i for i in kv_its if i.preempted]
    ok = [r for r in res.records if r.ok]
    itl = [(t, gap) for r in ok for t, gap in zip(r.token_s[1:], r.itl)]
    return {
        "queue": {"x": queue[0], "y": queue[1]},
        "kv": {
            "x": np.array([i.end_s for i in kv_its], dtype=float),
            "y": np.array([i.kv_blocks_used for i in kv_its], dtype=float),
        },
        "budget": {
            "x": np.array([i.end_s for i in kv_its if i.kv_blocks_total], dtype=float),
            "y": np.array([i.kv_blocks_total for i in kv_its if i.kv_blocks_total], dtype=float),
        },
        "preempted": {
            "x": np.array([i.end_s for i in pre], dtype=float),
            "y": np.array([i.kv_blocks_used for i in pre], dtype=float),
            "n": np.array([i.preempted for i in pre], dtype=float),
        },
        "ttft": {
            "x": np.array([r.sent_s for r in ok], dtype=float),
            "y": np.array([r.ttft * 1e3 for r in ok], dtype=float),
        },
        "itl": {
            "x": np.array([t for t, _ in itl], dtype=float),
            "y": np.array([g * 1e3 for _, g in itl], dtype=float),
        },
    }


def _add_run(fig: go.Figure, role: str, res) -> None:
    """One run's traces on the four panels, in its colour, one legend entry for the run."""
    cols, color, name = scenario_columns(res), RUN_COLORS[role], run_label(role, res)
    dots = dict(size=4, color=color, opacity=0.6)
    traces = (  # (panel row, columns key, trace style)
        (1, "queue", dict(mode="lines", line=dict(color=color, shape="hv"))),
        (2, "kv", dict(mode="lines", line=dict(color=color, shape="hv"))),
        (3, "ttft", dict(mode="markers", marker=dict(size=6, color=color))),
        (4, "itl", dict(mode="markers", marker=dots)),
    )
    for row, key, style in traces:
        fig.add_trace(
            go.Scatter(name=name, legendgroup=role, showlegend=row == 1, **cols[key], **style),
            row,
            1,
        )
    used, budget = cols["kv"]["y"], cols["budget"]["y"]
    if len(budget) and used.max(initial=0) >= 0.5 * budget.max():  # else it flattens the use
        fig.add_trace(
            go.Scatter(
                name=f"{role}: KV budget",
                legendgroup=role,
                showlegend=False,
                mode="lines",
                line=dict(color=color, dash="dash", width=1),
                **cols["budget"],
            ),
            2,
            1,
        )
    pre = cols["preempted"]
    if len(pre["x"]):
        fig.add_trace(
            go.Scatter(
                name=f"{role}: preemption ({int(pre['n'].sum())})",
                legendgroup=role,
                x=pre["x"],
                y=pre["y"],
                customdata=pre["n"],
                mode="markers",
                marker=dict(symbol="x", size=9, color=color, line=dict(width=1)),
                hovertemplate="%{customdata:.0f} request(s) evicted at %{x:.3f}s<extra></extra>",
            ),
            2,
            1,
        )


def _runs(scen, fixed) -> tuple[object, object, str | None, str]:
    """(broken, fixed, verdict, name) from a ScenarioResult or from two ServingResults."""
    if fixed is None and hasattr(scen, "broken"):
        return (
            scen.broken,
            scen.fixed,
            getattr(scen, "verdict", None),
            getattr(scen, "scenario", ""),
        )
    return scen, fixed, None, ""


def scenario_figure(scen, fixed=None, *, verdict: str | None = None, title: str = "") -> go.Figure:
    """The broken run (red) beside the fixed run (green): queue, KV blocks in use with preemptions
    marked (x) and the budget dashed (when a run comes near it), TTFT by arrival time, ITL by token time. The title carries
    the verdict (a ScenarioResult's own, or `verdict`)."""
    broken, fixed, own, name = _runs(scen, fixed)
    verdict = verdict or own
    fig = make_subplots(
        rows=len(PANELS),
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.06,
        subplot_titles=[p[1] for p in PANELS],
    )
    for role, res in (("broken", broken), ("fixed", fixed)):
        if res is not None:
            _add_run(fig, role, res)
    head = title or (f"{name}: broken vs fixed" if name else "broken vs fixed")
    lines = textwrap.wrap(verdict, 120)[:3] if verdict else []
    if lines:
        head += "<br><span style='font-size:12px'>" + "<br>".join(lines) + "</span>"
    for row, (_, _, unit) in enumerate(PANELS, start=1):
        fig.update_yaxes(title_text=unit, rangemode="tozero", row=row, col=1)
    fig.update_xaxes(autorangeoptions=dict(include=[0]))
    fig.update_xaxes(title_text="wall time since the run started (s)", row=len(PANELS), col=1)
    _no_kv_note(fig, broken, fixed)
    return _house_style(
        fig,
        height=840 + 16 * len(lines),
        title=dict(text=head, x=0.01, xanchor="left"),
        legend=dict(orientation="h", x=0, y=-0.09, yanchor="top"),
        margin=dict(l=60, r=20, t=100 + 16 * len(lines), b=100),
    )


def _no_kv_note(fig: go.Figure, *runs) -> None:
    """Say so on the KV panel when neither run records its cache (which engine does)."""
    if any(r is not None and any(i.kv_blocks_used is not None for i in r.iterations) for r in runs):
        return
    fig.add_annotation(
        text="no KV-cache record: only the continuous engine (and the simulator) report blocks",
        xref="x2 domain",
        yref="y2 domain",
        x=0.5,
        y=0.5,
        showarrow=False,
        font=dict(color="#777"),
    )
