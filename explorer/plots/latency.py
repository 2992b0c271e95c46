"""Latency per step (measured), and an earlier run beside it."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go

from explorer.engine.trace import Step, Trace
from explorer.plots.common import PHASE_COLORS, Columns, _arr, _layout, _phase_of, extend


def latency_figure(device: str = "", dtype: str = "", *, height: int = 300) -> go.Figure:
    """Measured forward-pass latency per step, prefill and decode told apart; an earlier run overlaid."""
    where = f" on {device}, {dtype}" if device else ""
    fig = go.Figure(
        data=[
            go.Scatter(
                name="earlier run",
                x=[],
                y=[],
                mode="lines",
                line=dict(color=PHASE_COLORS["previous"]),
                hovertemplate="step %{x}: %{y:.2f} ms<extra>earlier run</extra>",
            ),
            go.Scatter(
                name="prefill",
                x=[],
                y=[],
                mode="markers",
                marker=dict(size=11, symbol="diamond", color=PHASE_COLORS["prefill"]),
                hovertemplate="prefill: %{y:.2f} ms<extra></extra>",
            ),
            go.Scatter(
                name="decode",
                x=[],
                y=[],
                mode="lines",
                line=dict(color=PHASE_COLORS["decode"]),
                hovertemplate="step %{x}: %{y:.2f} ms<extra>decode</extra>",
            ),
        ],
        layout=_layout(
            height=height,
            title=dict(
                text=f"Latency per step (measured{where}: one forward pass each, device-synchronised)",
                font=dict(size=13),
            ),
            # the autorange holds steps 0..8 at least: whole-step ticks, never half steps
            xaxis=dict(title="step", autorangeoptions=dict(include=[0, 8])),
            yaxis=dict(title="ms", rangemode="tozero"),
            legend=dict(orientation="h", x=0, y=1.12),
        ),
    )
    return fig


def latency_columns(steps: Sequence[Step]) -> Columns:
    cols: Columns = {}
    for phase in ("prefill", "decode"):
        mine = [s for s in steps if _phase_of(s) == phase]
        if mine:
            cols[phase] = {
                "x": _arr((s.index for s in mine), np.float64),
                "y": _arr(s.latency_s * 1e3 for s in mine),
            }
    return cols


def earlier_run_columns(steps: Sequence[Step], name: str = "earlier run") -> Columns:
    """The 'earlier run' trace (named `name`): a previous run's latencies (e.g. with the cache the other way)."""
    return {
        name: {
            "x": _arr((s.index for s in steps), np.float64),
            "y": _arr(s.latency_s * 1e3 for s in steps),
        }
    }


def earlier_run_name(use_cache: bool | None) -> str:
    return (
        "earlier run"
        if use_cache is None
        else f"earlier run (cache {'on' if use_cache else 'off'})"
    )


def latency(trace: Trace, earlier: Trace | None = None) -> go.Figure:
    fig = latency_figure(trace.device, trace.dtype)
    extend(fig, latency_columns(trace.steps))
    if earlier is not None:
        fig.data[0].name = earlier_run_name(earlier.settings.get("use_cache"))
        extend(fig, earlier_run_columns(earlier.steps, fig.data[0].name))
    return fig


# --- memory traffic ---------------------------------------------------------------------------------
