"""The roofline: each step's arithmetic intensity against this machine's ceilings."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import plotly.graph_objects as go

from explorer.engine.trace import Step, Trace
from explorer.plots.common import (
    LOG_AXIS_WIDE,
    PHASE_COLORS,
    Columns,
    _arr,
    _layout,
    _objs,
    _peak,
    _peaks_label,
    _phase_of,
    extend,
)

# --- roofline ----------------------------------------------------------------------------------------

AI_RANGE = (1e-2, 1e4)  # FLOP per byte, the x range of the ceilings
OVERHEAD_CEILING = "overhead ceiling (step FLOPs / measured overhead floor)"


def roofline_figure(peaks: Any = None, known_chips: Any = None, *, height: int = 420) -> go.Figure:
    """Each step as a point (arithmetic intensity vs achieved FLOP/s) under the machine's ceilings.

    The measured ceiling is min(peak FLOP/s, intensity x peak bandwidth) from explorer.costs.hardware's
    measurements on this machine; known chips are datasheet numbers (modelled), hidden until
    clicked in the legend.
    """
    fig = go.Figure(
        data=[
            go.Scatter(
                name="prefill",
                x=[],
                y=[],
                mode="markers",
                customdata=[],
                marker=dict(size=11, symbol="diamond", color=PHASE_COLORS["prefill"]),
                hovertext=[],
                hovertemplate="%{hovertext}<extra>prefill</extra>",
            ),
            go.Scatter(
                name="decode",
                x=[],
                y=[],
                mode="markers",
                customdata=[],
                marker=dict(size=6, color=PHASE_COLORS["decode"], opacity=0.7),
                hovertext=[],
                hovertemplate="%{hovertext}<extra>decode</extra>",
            ),
            go.Scatter(
                name="overhead ceiling (step FLOPs / measured overhead floor)",
                x=[],
                y=[],
                mode="markers",
                hovertext=[],
                hoverinfo="text",
                marker=dict(symbol="line-ew", size=14, line=dict(width=2, color="#937860")),
            ),
        ],
        layout=_layout(
            height=height,
            title=dict(
                text="Roofline: modelled FLOPs and bytes over measured latency", font=dict(size=13)
            ),
            xaxis=dict(
                type="log", title="arithmetic intensity (FLOP / byte, modelled)", **LOG_AXIS_WIDE
            ),
            yaxis=dict(type="log", title="achieved FLOP/s", **LOG_AXIS_WIDE),
            legend=dict(orientation="v", x=1.02, y=1),
        ),
    )
    set_ceilings(fig, peaks, known_chips)
    return fig


def ceiling_line(bandwidth_gbps: float, flops: float, n: int = 60) -> tuple[np.ndarray, np.ndarray]:
    """x = intensity, y = min(flops, x * bandwidth): the roofline of one machine."""
    x = np.logspace(math.log10(AI_RANGE[0]), math.log10(AI_RANGE[1]), n)
    return x, np.minimum(flops, x * bandwidth_gbps * 1e9)


def set_ceilings(fig: go.Figure, peaks: Any, known_chips: Any = None) -> None:
    """Replace the ceiling traces: this machine's (measured), and each known chip's (modelled)."""
    fig.data = tuple(t for t in fig.data if t.name in ("prefill", "decode", OVERHEAD_CEILING))
    bw, fl = _peak(peaks, "bandwidth_gbps"), _peak(peaks, "flops")
    if bw and fl:
        x, y = ceiling_line(bw, fl)
        label = _peaks_label(peaks)
        fig.add_trace(
            go.Scatter(
                name=f"this machine (measured{': ' + label if label else ''})",
                x=x,
                y=y,
                mode="lines",
                line=dict(color="#111", width=3),
                hoverinfo="skip",
            )
        )
    for name, chip in _chips(known_chips):
        x, y = ceiling_line(chip["bandwidth_gbps"], chip["flops"])
        fig.add_trace(
            go.Scatter(
                name=f"{name} (modelled: datasheet)",
                x=x,
                y=y,
                mode="lines",
                line=dict(dash="dot", width=1.5),
                visible="legendonly",
                hoverinfo="skip",
            )
        )


def _chips(known: Any) -> list[tuple[str, dict]]:
    """Known chips as (name, {"bandwidth_gbps", "flops"}), from a dict of dicts/objects or a list."""
    if not known:
        return []
    items = (
        known.items()
        if isinstance(known, dict)
        else [(getattr(c, "name", str(i)), c) for i, c in enumerate(known)]
    )
    out = []
    for name, chip in items:
        bw, fl = _peak(chip, "bandwidth_gbps"), _peak(chip, "flops")
        if bw and fl:
            out.append((str(name), {"bandwidth_gbps": bw, "flops": fl}))
    return out


def roofline_columns(steps: Sequence[Step]) -> Columns:
    cols: Columns = {}
    for phase in ("prefill", "decode"):
        mine = [
            s for s in steps if _phase_of(s) == phase and s.flops and s.bytes and s.latency_s > 0
        ]
        if mine:
            cols[phase] = {
                "x": _arr(s.flops / s.total_bytes for s in mine),
                "y": _arr(s.flops / s.latency_s for s in mine),
                "customdata": _arr((s.index for s in mine), np.float64),
                "hovertext": _objs(_hover(s) for s in mine),
            }
    # The third regime: a step cannot take less than the overhead floor (a near-empty forward of
    # the same graph, measured), so it cannot reach more than its FLOPs / floor. A point at its
    # ceiling mark is overhead-bound whatever the memory and compute roofs allow.
    floored = [s for s in steps if s.flops and s.bytes and s.latency_s > 0 and s.overhead_floor_s]
    if floored:
        cols[OVERHEAD_CEILING] = {
            "x": _arr(s.flops / s.total_bytes for s in floored),
            "y": _arr(s.flops / s.overhead_floor_s for s in floored),
            "hovertext": _objs(
                f"step {s.index}: at most {_si(s.flops / s.overhead_floor_s)}FLOP/s if it took only the "
                f"overhead floor {s.overhead_floor_s * 1e3:.3g} ms (measured)"
                for s in floored
            ),
        }
    return cols


def _si(x: float) -> str:
    """1.23e9 -> '1.23 G' (SI prefix, three significant digits)."""
    for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= factor:
            return f"{x / factor:.3g} {prefix}"
    return f"{x:.3g} "


def _hover(s: Step) -> str:
    """A roofline point's hover: intensity, FLOP/s and the step's split."""
    out = (
        f"step {s.index}: {s.flops / s.total_bytes:.2f} FLOP/B, {_si(s.flops / s.latency_s)}FLOP/s"
        f"<br>{s.latency_s * 1e3:.3g} ms measured"
    )
    if s.bound_s is not None:
        out += f", bound {s.bound_s * 1e3:.3g} ms ({s.bound})"
    if s.overhead_s is not None:
        out += f", overhead {s.overhead_s * 1e3:.3g} ms"
    if s.mbu is not None:
        out += f"<br>MBU {s.mbu:.2f}, MFU {s.mfu:.3f}"
    if s.regime:
        out += f" · {s.regime}-bound"
    return out


def roofline(trace: Trace, known_chips: Any = None) -> go.Figure:
    fig = roofline_figure(trace.hardware, known_chips)
    extend(fig, roofline_columns(trace.steps))
    return fig


# --- speculative decoding ------------------------------------------------------------------------------
