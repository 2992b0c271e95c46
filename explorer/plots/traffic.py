"""Memory traffic per step: modelled bytes by part, and the achieved bandwidth."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from explorer.engine.trace import Step, Trace
from explorer.plots.common import (
    MB,
    PART_COLORS,
    TRAFFIC_PARTS,
    Columns,
    _arr,
    _layout,
    _peak,
    _peaks_label,
    _style_axes,
    extend,
)


def traffic_group(part: str) -> str:
    """Which stack a cost-model part belongs to: 'weights/mlp' -> 'weights', 'kv_read' -> 'kv_read'."""
    head = part.split("/", 1)[0]
    return head if head in TRAFFIC_PARTS else "other"


def traffic_figure(
    peak_gbps: float | None = None, *, label: str = "", height: int = 520
) -> go.Figure:
    """Bytes moved per step (modelled, stacked by part), achieved bandwidth vs the measured peak,
    and the KV cache size (measured from the cache tensors)."""
    fig = make_subplots(
        rows=3,
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.08,
        row_heights=[0.45, 0.3, 0.25],
        subplot_titles=(
            "bytes moved per step (modelled, by part)",
            "achieved bandwidth = modelled bytes / measured latency",
            "KV cache held (measured)",
        ),
    )
    _add_traces(fig)
    _style_axes(fig)
    fig.update_layout(
        **_layout(
            height=height,
            title=dict(text="Memory traffic per step", font=dict(size=14)),
            legend=dict(orientation="v", x=1.02, y=1, traceorder="normal"),
        )
    )
    fig.update_yaxes(title_text="MB", row=1, col=1)
    fig.update_yaxes(title_text="GB/s", rangemode="tozero", row=2, col=1)
    fig.update_yaxes(title_text="MB", rangemode="tozero", row=3, col=1)
    fig.update_xaxes(title_text="step", row=3, col=1)
    set_peak_bandwidth(fig, peak_gbps, label)
    return fig


def _add_traces(fig: go.Figure) -> None:
    """The empty traces the live chart fills: bytes by part (row 1), achieved GB/s (row 2), the KV
    cache held (row 3)."""
    for part in TRAFFIC_PARTS:  # stacked areas, not bars: one SVG path per part however many steps
        fig.add_trace(
            go.Scatter(
                name=part,
                x=[],
                y=[],
                mode="lines",
                stackgroup="bytes",
                line=dict(color=PART_COLORS[part], width=0.5, shape="hvh"),
                hovertemplate=f"step %{{x}}: %{{y:.3f}} MB<extra>{part}</extra>",
            ),
            row=1,
            col=1,
        )
    fig.add_trace(
        go.Scatter(
            name="achieved GB/s",
            x=[],
            y=[],
            mode="lines",
            line=dict(color="#333"),
            hovertemplate="step %{x}: %{y:.2f} GB/s<extra></extra>",
        ),
        row=2,
        col=1,
    )
    fig.add_trace(
        go.Scatter(
            name="KV cache",
            x=[],
            y=[],
            mode="lines",
            fill="tozeroy",
            line=dict(color="#dd8452"),
            hovertemplate="step %{x}: %{y:.3f} MB<extra>KV cache</extra>",
        ),
        row=3,
        col=1,
    )


def set_peak_bandwidth(fig: go.Figure, peak_gbps: float | None, label: str = "") -> None:
    """Draw (or redraw) the measured peak bandwidth as a dashed line on the bandwidth panel."""
    fig.layout.shapes = ()
    fig.layout.annotations = tuple(a for a in fig.layout.annotations if a.name != "peak")
    if peak_gbps is None or not math.isfinite(peak_gbps):
        return
    fig.add_shape(
        type="line",
        xref="x2 domain",
        x0=0,
        x1=1,
        yref="y2",
        y0=peak_gbps,
        y1=peak_gbps,
        line=dict(color="#d62728", dash="dash"),
    )
    fig.add_annotation(
        name="peak",
        xref="x2 domain",
        x=1,
        xanchor="right",
        yref="y2",
        y=peak_gbps,
        yanchor="bottom",
        showarrow=False,
        font=dict(color="#d62728", size=11),
        text=f"measured peak {peak_gbps:.1f} GB/s{(' (' + label + ')') if label else ''}",
    )
    fig.update_layout(
        {"yaxis2.range": [0, peak_gbps * 1.15]}
    )  # by name: a FigureWidget made from a dict has no grid


def traffic_columns(steps: Sequence[Step]) -> Columns:
    with_bytes = [s for s in steps if s.bytes]
    cols: Columns = {}
    if with_bytes:
        x = _arr((s.index for s in with_bytes), np.float64)
        for part in TRAFFIC_PARTS:
            y = _arr(
                sum(v for k, v in s.bytes.items() if traffic_group(k) == part) / MB
                for s in with_bytes
            )
            cols[part] = {"x": x, "y": y}
        cols["achieved GB/s"] = {"x": x, "y": _arr(_achieved_gbps(s) for s in with_bytes)}
    cols["KV cache"] = {
        "x": _arr((s.index for s in steps), np.float64),
        "y": _arr(s.kv_cache_bytes / MB for s in steps),
    }
    return cols


def _achieved_gbps(step: Step) -> float:
    if step.achieved_gbps is not None:
        return float(step.achieved_gbps)
    if step.bytes and step.latency_s > 0:
        return step.total_bytes / step.latency_s / 1e9
    return float("nan")


def traffic(trace: Trace) -> go.Figure:
    fig = traffic_figure(
        _peak(trace.hardware, "bandwidth_gbps"), label=_peaks_label(trace.hardware)
    )
    extend(fig, traffic_columns(trace.steps))
    return fig
