"""Mixture of experts: the moe sweep's chart, the router's choice in one step, the load per expert.

    moe sweep chart      experts touched per layer (measured vs uniform formula), bytes per step
                         beside dense models of the same total / active size, ms per step
    routing_figure(r)    one step: each layer's chosen experts and their weights (row 0's newest token),
                         the experts the whole batch touched outlined
    expert_load_figure(r)  over a trace: tokens routed to each expert, per layer

`r` is what Session.routing() returns (explorer.engine.routing.routing_of): for one step or for
the whole trace.
"""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from explorer.plots.common import MB, Columns, _house_style
from explorer.plots.sweeps import _MEASURED, _MODELLED, _col, sweep_plot

DENSE_COLORS = {"MoE": "#1f77b4", "dense, same total": "#d62728", "dense, same active": "#2ca02c"}


# --- the moe sweep ------------------------------------------------------------------------------


def _moe_columns(df) -> Columns:
    x = _col(df, "batch")
    return {
        "experts touched per layer (measured)": {"x": x, "y": _col(df, "experts_touched")},
        "uniform routing E(1-(1-k/E)^B) (modelled)": {
            "x": x,
            "y": _col(df, "experts_touched_formula"),
        },
        "MoE, experts touched (modelled)": {"x": x, "y": _col(df, "bytes_per_step", 1 / MB)},
        "dense, same total (modelled)": {
            "x": x,
            "y": _col(df, "bytes_per_step_dense_total_modelled", 1 / MB),
        },
        "dense, same active (modelled)": {
            "x": x,
            "y": _col(df, "bytes_per_step_dense_active_modelled", 1 / MB),
        },
        "MoE step (measured)": {"x": x, "y": _col(df, "ms_per_step")},
        "MoE bound (modelled)": {"x": x, "y": _col(df, "bound_ms_modelled")},
        "dense same total, bound (modelled)": {
            "x": x,
            "y": _col(df, "ms_per_step_dense_total_modelled"),
        },
        "dense same active, bound (modelled)": {
            "x": x,
            "y": _col(df, "ms_per_step_dense_active_modelled"),
        },
    }


def _moe_shapes(df) -> dict:
    """E as a horizontal line on the experts panel: the most a batch can touch."""
    experts = (df.attrs or {}).get("experts")
    if not experts:
        return {"shapes": []}
    line = dict(type="line", xref="x domain", x0=0, x1=1, yref="y", y0=experts, y1=experts)
    return {
        "shapes": [{**line, "line": dict(color="#555", dash="dash")}],
        "title.text": f"Mixture of experts: {experts} experts per layer, "
        f"{df.attrs.get('experts_per_token')} per token",
    }


def _trace(fig: go.Figure, col: int, name: str, color: str, style: dict) -> None:
    line = {**style.get("line", {}), "color": color}
    fig.add_trace(
        go.Scatter(
            name=name, x=[], y=[], marker=dict(color=color, size=5), **{**style, "line": line}
        ),
        row=1,
        col=col,
    )


@sweep_plot("moe", _moe_columns, _moe_shapes)
def _moe_sweep_figure() -> go.Figure:
    fig = make_subplots(
        rows=1,
        cols=3,
        subplot_titles=("experts touched per layer", "bytes per decode step", "ms per decode step"),
        horizontal_spacing=0.08,
    )
    fig.update_layout(title=dict(text="Mixture of experts: batch size", font=dict(size=13)))
    moe, total, active = DENSE_COLORS.values()
    _trace(fig, 1, "experts touched per layer (measured)", moe, _MEASURED)
    _trace(fig, 1, "uniform routing E(1-(1-k/E)^B) (modelled)", "#555", _MODELLED)
    _trace(fig, 2, "MoE, experts touched (modelled)", moe, _MODELLED)
    _trace(fig, 2, "dense, same total (modelled)", total, _MODELLED)
    _trace(fig, 2, "dense, same active (modelled)", active, _MODELLED)
    _trace(fig, 3, "MoE step (measured)", moe, _MEASURED)
    _trace(fig, 3, "MoE bound (modelled)", moe, _MODELLED)
    _trace(fig, 3, "dense same total, bound (modelled)", total, _MODELLED)
    _trace(fig, 3, "dense same active, bound (modelled)", active, _MODELLED)
    fig.update_xaxes(title_text="batch size", type="log")
    fig.update_yaxes(title_text="experts", row=1, col=1, rangemode="tozero")
    fig.update_yaxes(title_text="MB (modelled)", row=1, col=2, rangemode="tozero")
    fig.update_yaxes(title_text="ms", row=1, col=3, rangemode="tozero")
    return fig


# --- inside one step and over a trace -----------------------------------------------------------


def _empty(title: str, height: int) -> go.Figure:
    fig = go.Figure(layout=dict(title=dict(text=title, font=dict(size=13))))
    fig.update_xaxes(title_text="expert")
    fig.update_yaxes(title_text="layer", autorange="reversed")
    return _house_style(fig, height=height)


def newest_token(step: dict) -> int:
    """Index of row 0's newest fed token in a step's routing (token t: row t // fed)."""
    fed = max(1, step["tokens"] // max(1, step["batch"]))
    return fed - 1


def routing_figure(routing: dict | None = None, *, height: int = 320) -> go.Figure:
    """One step's router choice (session.routing(step)): a layer x expert grid of row 0's newest
    token's router weights (blank where not chosen), the experts the whole batch touched outlined."""
    fig = _empty("Router choice in this step (measured)", height)
    steps = (routing or {}).get("steps") or []
    if not steps or not steps[0].get("layers"):
        return fig
    step, experts = steps[0], routing["num_experts"]
    layers, t = step["layers"], newest_token(step)
    z = np.full((len(layers), experts), np.nan)
    for i, layer in enumerate(layers):
        for e, w in zip(layer["experts"][t], layer["weights"][t]):
            z[i, e] = w
    ys = [layer["layer"] for layer in layers]
    fig.add_trace(
        go.Heatmap(
            name="router weight, row 0 (measured)",
            z=z,
            x=list(range(experts)),
            y=ys,
            colorscale="Blues",
            zmin=0,
            zmax=1,
            colorbar=dict(title="weight"),
            hovertemplate="layer %{y} expert %{x}: weight %{z:.3f}<extra></extra>",
        )
    )
    fig.add_trace(
        go.Scatter(
            name="touched by the batch (measured)",
            x=[e for layer in layers for e in layer["touched"]],
            y=[layer["layer"] for layer in layers for _ in layer["touched"]],
            mode="markers",
            marker=dict(symbol="square-open", size=12, color="#d62728", line=dict(width=2)),
            hovertemplate="layer %{y}: expert %{x} read this step<extra></extra>",
        )
    )
    return fig


def expert_load_figure(routing: dict | None = None, *, height: int = 320) -> go.Figure:
    """Over a trace (session.routing()): the share of each layer's routed tokens that each expert
    received (measured); a uniform router gives every cell k/E."""
    fig = _empty("Load per expert over the trace (measured)", height)
    if not routing or not routing.get("load"):
        return fig
    load = np.asarray(routing["load"], dtype=float)  # [layers, experts]
    share = load / np.maximum(load.sum(axis=1, keepdims=True), 1)
    fig.add_trace(
        go.Heatmap(
            name="share of routed tokens (measured)",
            z=share,
            x=list(range(load.shape[1])),
            y=routing["layers"],
            customdata=load,
            colorscale="Oranges",
            zmin=0,
            colorbar=dict(title="share"),
            hovertemplate="layer %{y} expert %{x}: %{customdata:.0f} tokens (%{z:.1%})"
            "<extra></extra>",
        )
    )
    return fig
