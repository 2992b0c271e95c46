"""The token strip: one cell per generated token, coloured by probability or entropy."""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go

from explorer.costs.noise import busy_reason
from explorer.engine.trace import Step, Trace
from explorer.plots.common import NOISY_COLOR, Columns, _arr, _layout, _objs, extend, show_token

STRIP_WINDOW = 24
# colour scale, its range and the colour bar's title; entropy uses a fixed 0-5 nats like the text strip
STRIP_SCALES = {
    "prob": ("RdYlGn", 0.0, 1.0, "p final"),
    "entropy": ("RdYlGn_r", 0.0, 5.0, "H (nats)"),
}


def strip_figure(color_by: str = "prob", *, height: int = 150) -> go.Figure:
    """The generated tokens as a row of cells, coloured by probability (or entropy).

    Outlined cell: the token the prefill pass produced; hatched cell: a forced token (chosen by
    the user, not sampled). x is the step index; a cell's customdata is its step index.
    """
    _check_color_by(color_by)
    name, lo, hi, title = STRIP_SCALES[color_by]
    fig = go.Figure(
        data=[
            go.Bar(
                name="tokens",
                x=[],
                y=[],
                text=[],
                customdata=[],
                hovertext=[],
                hoverinfo="text",
                textposition="inside",
                insidetextanchor="middle",
                textangle=0,
                textfont=dict(size=13, color="#111"),
                width=0.96,
                marker=dict(color=[]),
                showlegend=False,
            ),
            # carries the colour bar only (the cells get their colours as strings, see strip_colors)
            go.Scatter(
                name="scale",
                x=[None, None],
                y=[None, None],
                mode="markers",
                hoverinfo="skip",
                marker=dict(coloraxis="coloraxis", color=[lo, hi]),
                showlegend=False,
            ),
        ],
        layout=_layout(
            height=height,
            margin=dict(l=10, r=10, t=30, b=30),
            # left-aligned: in a narrow column (JupyterLab) the end is cut, not both ends
            title=dict(
                text=_strip_title(color_by), font=dict(size=12), x=0, xanchor="left", xref="paper"
            ),
            coloraxis=dict(
                colorscale=name, cmin=lo, cmax=hi, colorbar=dict(title=title, thickness=10)
            ),
            bargap=0.04,
            clickmode="event",
            yaxis=dict(visible=False, range=[0, 1], fixedrange=True),
            xaxis=dict(title=None, dtick=5, fixedrange=True),
        ),
    )
    return fig


def strip_colors(values: Sequence[float], color_by: str = "prob") -> np.ndarray:
    """Cell colours ('rgb(...)' strings) for probabilities or entropies on the strip's colour scale.

    Mapped here rather than by plotly: bars given numbers make plotly.js warn (console.trace) once
    per cell on every redraw, which costs more than the redraw itself in a browser on a small machine.
    """
    name, lo, hi, _ = STRIP_SCALES[color_by]
    table = _color_table(name)
    last = len(table) - 1
    where = [min(max((float(v) - lo) / (hi - lo), 0.0), 1.0) if v == v else 0.0 for v in values]
    return _objs(table[round(w * last)] for w in where)


@functools.lru_cache(maxsize=8)
def _color_table(name: str, n: int = 256) -> tuple[str, ...]:
    """The colour scale sampled once at n points (sampling per step looked the scale up by name
    each time: ~10 ms of a Step's ~50 ms of Python, profiled on 2 cores)."""
    from plotly.colors import sample_colorscale

    return tuple(sample_colorscale(name, [i / (n - 1) for i in range(n)]))


def _check_color_by(color_by: str) -> None:
    if color_by not in ("prob", "entropy"):
        raise ValueError(f"color_by must be 'prob' or 'entropy', got {color_by!r}")


def _strip_title(color_by: str) -> str:
    what = (
        "p final of the chosen token" if color_by == "prob" else "entropy of the final distribution"
    )
    return (
        f"Colour: {what}  ·  outlined: prefill  ·  orange edge: noisy timing  ·  hatched: forced"
        "  ·  click a cell to inspect it"
    )


def strip_columns(steps: Sequence[Step], color_by: str = "prob") -> Columns:
    """One cell per step for strip_figure's 'tokens' trace."""
    _check_color_by(color_by)
    color = [s.prob_final if color_by == "prob" else s.entropy_final for s in steps]
    noisy = [busy_reason(s.cpu_share) for s in steps]
    hover = [
        f"step {s.index} ({s.phase}{', forced' if s.forced else ''})<br>{show_token(s.token_text)!s} "
        f"id {s.token_id}<br>p raw {s.prob_raw:.3f} · p final {s.prob_final:.3f}<br>"
        f"rank raw {s.rank_raw} · H {s.entropy_final:.2f} nats"
        + (f"<br>noisy timing: {why}" if why else "")
        for s, why in zip(steps, noisy, strict=True)
    ]
    return {
        "tokens": {
            "x": _arr((s.index for s in steps), np.float64),
            "y": np.ones(len(steps)),
            "text": _objs(show_token(s.token_text) for s in steps),
            "hovertext": _objs(hover),
            "customdata": _arr((s.index for s in steps), np.float64),
            "marker.color": strip_colors(color, color_by),
            "marker.line.width": _arr(
                3.0 if s.phase == "prefill" else 2.0 if why else 0.5
                for s, why in zip(steps, noisy, strict=True)
            ),
            "marker.line.color": _objs(
                "#222" if s.phase == "prefill" else NOISY_COLOR if why else "#fff"
                for s, why in zip(steps, noisy, strict=True)
            ),
            "marker.pattern.shape": _objs("x" if s.forced else "" for s in steps),
        }
    }


def strip_range(last_index: int, window: int = STRIP_WINDOW) -> list[float]:
    """x-axis range that shows the last `window` cells."""
    return [max(-0.5, last_index - window + 0.5), max(last_index + 0.5, window - 0.5)]


def token_strip(trace: Trace, color_by: str = "prob", window: int | None = None) -> go.Figure:
    """The whole run's token strip (the last `window` tokens when given)."""
    fig = strip_figure(color_by)
    steps = trace.steps[-window:] if window else trace.steps
    extend(fig, strip_columns(steps, color_by))
    if steps:
        fig.update_xaxes(range=strip_range(steps[-1].index, window or len(steps)))
    return fig


# --- next-token distribution ----------------------------------------------------------------------
