"""The step, drawn: one forward pass as a picture of the model, op by op (explorer.costs.operators).

    token in -> embedding -> the layer stack (one layer opened) -> final norm -> lm_head ->
    the sampling stages -> token out

The opened layer's operators sit on the right in the order they run (attention half, MLP half);
each box's size and label give its share of the step (measured where a row has `measured_s`,
modelled otherwise), its colour what bounds it; hover says what the op does, its shapes, FLOPs,
bytes and time. Pure: rows in (explorer.costs.optime.timed, or with measured columns from
explorer.costs.opprofile), a Figure out.
"""

from __future__ import annotations

import html
from typing import Any

import plotly.graph_objects as go

from explorer.plots.common import PHASE_COLORS, _layout, log_ticks

BOUND_COLORS = {
    "memory": "#4c72b0",
    "compute": "#c44e52",
    "overhead": "#8c8c8c",
    "interconnect": "#8172b3",
    "stage": "#dddddd",
}
EXPERT_COLORS = {"routed": "#dd8452", "idle": "#eeeeee"}
LEFT, ATTN, MLP = 0.0, 1.8, 3.6
STACK_SPAN = 9.0  # y units the layer stack takes in the left column


def _shown_time(r: dict) -> float:
    m = r.get("measured_s")
    return r["time_s"] if m is None else m


def _bound(r: dict) -> str:
    return r.get("measured_bound") or r["bound"]


def _fmt(x: float, unit: str) -> str:
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale:
            return f"{x / scale:.3g} {prefix}{unit}"
    return f"{x:.3g} {unit}"


def hover_text(r: dict) -> str:
    """What the op does in one sentence, its shapes, FLOPs, bytes and time (HTML for plotly)."""
    t = f"{r['time_s'] * 1e3:.4g} ms modelled ({r['bound']}-bound)"
    if r.get("measured_s") is not None:
        t += f"; {r['measured_s'] * 1e3:.4g} ms measured"
    elif r.get("measured_note"):
        t += f"; measured: {r['measured_note']}"
    lines = [
        f"<b>{html.escape(r['name'])}</b> x{r['count']}",
        html.escape(r["what"]),
        f"shapes: {html.escape(r['shapes'])}",
        f"FLOPs {_fmt(r['total_flops'], 'FLOP')}, bytes {_fmt(r['total_bytes'], 'B')}",
        html.escape(t),
        f"{100 * r.get('shown_share', r['share']):.1f}% of the step",
    ]
    return "<br>".join(lines)


def _shares(rows: list[dict]) -> None:
    total = sum(_shown_time(r) for r in rows) or 1.0
    for r in rows:
        r["shown_share"] = _shown_time(r) / total


def _size(share: float) -> float:
    return 14 + 26 * min(1.0, share * 3) ** 0.5


def _op_points(rows: list[dict]) -> list[dict]:
    """The opened layer's operators: (x, y, row), attention ops then MLP ops, top down."""
    layer = [r for r in rows if r["stage"] == "layer"]
    out = []
    for block, x in (("attention", ATTN), ("mlp", MLP)):
        mine = [r for r in layer if r["block"] == block]
        for i, r in enumerate(mine):
            out.append({"x": x, "y": 1.0 + i * (STACK_SPAN + 6) / max(len(mine), 12), "row": r})
    return out


def _left_points(rows: list[dict], layers: int) -> tuple[list[dict], float, float]:
    """Token in, embedding, the stack's slot, final norm, head, sampling stages, token out."""
    pts, y = [], 1.0
    for r in rows:
        if r["stage"] == "embedding":
            pts.append({"x": LEFT, "y": y, "row": r})
            y += 1.2
    stack_y = y
    y += STACK_SPAN + 1.2
    for r in rows:
        if r["stage"] in ("final", "head", "sampling", "overhead"):
            pts.append({"x": LEFT, "y": y, "row": r})
            y += 1.2
    return pts, stack_y, y


def _boxes(rows: list[dict], layers: int | None) -> dict[str, Any]:
    """Where each box sits and what it shows (rows gain shown_share)."""
    _shares(rows)
    layer_rows = [r for r in rows if r["stage"] == "layer"]
    n_layers = layers or max((r["count"] for r in layer_rows), default=1)
    left, stack_y, bottom = _left_points(rows, n_layers)
    per_layer = sum(_shown_time(r) / max(r["count"], 1) for r in layer_rows)
    return {"points": left + _op_points(rows), "stack_y": stack_y, "bottom": bottom,
            "layers": n_layers, "per_layer": per_layer}  # fmt: skip


def box_update(rows: list[dict], *, layers: int | None = None) -> dict[str, dict]:
    """The per-step values of the picture's traces, by trace name: what changes from one step to
    the next when the operators are the same (a live view restyles these instead of redrawing)."""
    rows = [dict(r) for r in rows]
    b = _boxes(rows, layers)
    pts = b["points"]
    phase = PHASE_COLORS.get(rows[0].get("phase", "decode"), "#333")
    ops = {
        "x": [p["x"] for p in pts],
        "y": [p["y"] for p in pts],
        "text": [f"{p['row']['name']} {100 * p['row']['shown_share']:.0f}%" for p in pts],
        "marker.size": [_size(p["row"]["shown_share"]) for p in pts],
        "marker.color": [BOUND_COLORS.get(_bound(p["row"]), "#999") for p in pts],
        "marker.line.color": phase,
        "hovertext": [hover_text(p["row"]) for p in pts],
        "customdata": [p["row"]["name"] for p in pts],
    }
    n = b["layers"]
    stack = [f"layer {i}: {b['per_layer'] * 1e3:.4g} ms (click to open)" for i in range(n)]
    return {"operators": ops, "layers": {"hovertext": stack}}


def _box_trace(values: dict) -> go.Scatter:
    return go.Scatter(
        name="operators", mode="markers+text", textposition="middle right", showlegend=False,
        marker=dict(symbol="square", line=dict(width=2)),
        hovertemplate="%{hovertext}<extra></extra>",
    ).update(values)  # fmt: skip


def _legend_trace(bound: str) -> go.Scatter:
    return go.Scatter(
        name=f"{bound}-bound" if bound in ("memory", "compute") else bound, x=[None], y=[None],
        mode="markers", marker=dict(symbol="square", size=12, color=BOUND_COLORS[bound]),
    )  # fmt: skip


def stack_colors(layers: int, opened: int, lit: int | None = None) -> list[str]:
    """The layer stack's colours: the opened layer blue, a lit one (the walk) amber."""
    return ["#f2b134" if i == lit else "#6c8ebf" if i == opened else "#c9d3e6" for i in
            range(layers)]  # fmt: skip


def _stack_trace(layers: int, y0: float, opened: int, per_layer: float, lit: int | None):
    ys = [y0 + STACK_SPAN * i / max(layers - 1, 1) for i in range(layers)]
    colors = stack_colors(layers, opened, lit)
    return go.Scatter(
        name="layers",
        x=[LEFT] * layers,
        y=ys,
        mode="markers",
        marker=dict(symbol="square", size=max(4, min(14, 300 / layers)), color=colors),
        hovertext=[f"layer {i}: {per_layer * 1e3:.4g} ms (click to open)" for i in range(layers)],
        hovertemplate="%{hovertext}<extra></extra>",
        customdata=list(range(layers)),
        showlegend=False,
    )


def _experts_trace(routed: dict, x: float, y: float) -> go.Scatter:
    """One small square per expert of the opened layer; the ones this step routed to lit."""
    e, lit = routed["num_experts"], set(routed["touched"])
    per_row = 16
    return go.Scatter(
        name="experts routed this step",
        x=[x + 0.9 + 0.07 * (i % per_row) for i in range(e)],
        y=[y + 0.35 * (i // per_row) for i in range(e)],
        mode="markers",
        marker=dict(symbol="square", size=7,
                    color=[EXPERT_COLORS["routed" if i in lit else "idle"] for i in range(e)]),
        hovertext=[f"expert {i}: {'routed' if i in lit else 'not used'} this step" for i in range(e)],
        hovertemplate="%{hovertext}<extra></extra>",
    )  # fmt: skip


def step_figure(
    rows: list[dict[str, Any]] | None = None,
    *,
    title: str = "",
    layers: int | None = None,
    opened: int = 0,
    lit: int | None = None,
    routed: dict | None = None,
    note: str = "",
    height: int = 640,
) -> go.Figure:
    """The picture of one step from its operator rows (empty rows: a placeholder). layers: the
    stack's size (default: the count of the layer ops); opened: the layer drawn open; lit: a layer
    highlighted (Play); routed: {"num_experts", "touched"} of the opened layer (MoE)."""
    fig = go.Figure(layout=_layout(height=height, showlegend=True, hovermode="closest"))
    fig.update_layout(margin=dict(l=20, r=20, t=70, b=20), title=dict(text=title, x=0.01))
    fig.update_xaxes(visible=False, range=[-0.6, 5.4])
    fig.update_yaxes(visible=False, autorange="reversed")
    if not rows:
        fig.add_annotation(text="Take a step to draw it.", showarrow=False, x=2, y=5)
        fig.update_yaxes(range=[10, 0], autorange=False)
        return fig
    values = box_update(rows, layers=layers)
    b = _boxes([dict(r) for r in rows], layers)
    fig.add_trace(_box_trace(values["operators"]))
    for bound in ("memory", "compute", "overhead"):
        fig.add_trace(_legend_trace(bound))
    if any(r["bound"] == "interconnect" for r in rows):
        fig.add_trace(_legend_trace("interconnect"))
    stack = _stack_trace(b["layers"], b["stack_y"], opened, b["per_layer"], lit)
    fig.add_trace(stack)
    bottom = b["bottom"]
    _frame(fig, b["stack_y"], bottom, opened, b["layers"])
    experts = next((p for p in b["points"] if p["row"]["name"] == "experts_gate_up"), None)
    if routed and experts and routed.get("num_experts"):
        fig.add_trace(_experts_trace(routed, experts["x"], experts["y"]))
    if note:
        fig.add_annotation(text=html.escape(note), showarrow=False, x=2.6, y=bottom,
                           xanchor="center", font=dict(color="#a33"))  # fmt: skip
    return fig


def _frame(fig: go.Figure, stack_y: float, bottom: float, opened: int, layers: int) -> None:
    """Token in / token out labels, the opened layer's outline and its two halves' titles."""
    notes = [("token in", LEFT, 0.0), ("token out", LEFT, bottom),
             (f"layer {opened} of {layers}, opened: attention", ATTN - 0.2, 0.2),
             ("MLP", MLP, 0.2), (f"{layers} layers", LEFT - 0.35, stack_y + STACK_SPAN / 2)]  # fmt: skip
    for text, x, y in notes:
        fig.add_annotation(text=f"<b>{text}</b>", x=x, y=y, showarrow=False, xanchor="left")
    fig.add_shape(type="rect", x0=ATTN - 0.3, x1=5.3, y0=0.0, y1=STACK_SPAN + 7.4,
                  line=dict(color="#6c8ebf", dash="dot"), layer="below")  # fmt: skip
    fig.add_shape(type="line", x0=LEFT + 0.15, x1=ATTN - 0.3, y0=stack_y, y1=0.0,
                  line=dict(color="#6c8ebf", dash="dot"))  # fmt: skip


def ops_roofline_update(rows: list[dict] | None, peaks: Any = None) -> dict[str, dict]:
    """The operators roofline's trace values by name (points per bound, the roofs' line)."""
    pts = [r for r in rows or [] if r.get("intensity") and r["time_s"] > 0]
    out = {}
    for bound in ("memory", "compute"):
        mine = [r for r in pts if r["bound"] == bound]
        out[f"{bound}-bound ops"] = {
            "x": [r["intensity"] for r in mine],
            "y": [r["total_flops"] / r["time_s"] for r in mine],
            "text": [r["name"] for r in mine],
            "hovertext": [hover_text(r | {"shown_share": r["share"]}) for r in mine],
        }
    xs: list[float] = []
    ys: list[float] = []
    if peaks is not None and pts:
        flops, bw = peaks.roofline_flops, peaks.bandwidth_gbps * 1e9
        lo, hi = min(r["intensity"] for r in pts) / 2, max(r["intensity"] for r in pts) * 2
        xs = sorted({lo, min(max(flops / bw, lo), hi), hi})
        ys = [min(flops, x * bw) for x in xs]
    out["roofs"] = {"x": xs, "y": ys}
    return out


def ops_roofline_figure(
    rows: list[dict] | None = None, peaks: Any = None, *, title: str = "", height: int = 420
) -> go.Figure:
    """Each operator as a point: intensity (FLOP/byte) against the FLOP/s it attains at the roofs
    (modelled), under the machine's (or chip's) two ceilings."""
    fig = go.Figure(layout=_layout(height=height, title=dict(text=title, x=0.01)))
    fig.update_xaxes(type="log", title="FLOPs per byte (modelled)")
    fig.update_yaxes(type="log", title="FLOP/s at the roofs (modelled)")
    values = ops_roofline_update(rows, peaks)
    for bound in ("memory", "compute"):
        fig.add_trace(go.Scatter(
            name=f"{bound}-bound ops", mode="markers+text", textposition="top center",
            marker=dict(size=9, color=BOUND_COLORS[bound]),
            hovertemplate="%{hovertext}<extra></extra>",
        ).update(values[f"{bound}-bound ops"]))  # fmt: skip
    label = f"roofs: {peaks.device}" if peaks is not None else "roofs"
    fig.add_trace(go.Scatter(name=label, mode="lines", line=dict(color="#333", dash="dash"))
                  .update(values["roofs"]))  # fmt: skip
    return log_ticks(fig)
