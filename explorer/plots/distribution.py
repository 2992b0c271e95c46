"""The distribution of one step: top tokens raw vs final, the stages, where the draw fell."""

from __future__ import annotations

from typing import Any

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from explorer.engine.trace import Step
from explorer.plots.common import Columns, _arr, _layout, _objs, _style_axes, replace, show_token

PANEL_TITLES = (  # short: each title must fit its panel in a narrow column (JupyterLab)
    "top-n: raw (grey), final (blue)",
    "stages: mass kept",
    "draw vs final CDF",
)


def distribution_traces() -> dict[str, tuple[int, go.Bar | go.Scatter]]:
    """The figure's traces, empty, by name (the keys of distribution_columns), each with its panel."""
    hover = dict(hovertext=[], hoverinfo="text", showlegend=False)
    return {**_bar_traces(hover), **_cdf_traces(hover)}


def _bar_traces(hover: dict) -> dict[str, tuple[int, go.Bar]]:
    """Panel 1, the raw and final probability bars; panel 2, the mass each stage keeps."""
    bar_ids = dict(x=[], y=[], customdata=[], **hover)
    return {
        "raw": (1, go.Bar(name="raw", marker=dict(color="#b0b0b0"), **bar_ids)),
        "final": (
            1,
            go.Bar(
                name="final",
                marker=dict(color="#1f77b4", line=dict(color="#111", width=[])),
                **bar_ids,
            ),
        ),
        "stages": (
            2,
            go.Bar(
                name="stages",
                x=[],
                y=[],
                text=[],
                textposition="outside",
                marker=dict(color="#55a868"),
                **hover,
            ),
        ),
    }


def _cdf_traces(hover: dict) -> dict[str, tuple[int, go.Scatter]]:
    """Panel 3: the final distribution's CDF, the chosen token's band and the uniform draw u."""
    silent = dict(hoverinfo="skip", showlegend=False)
    return {
        "cdf": (
            3,
            go.Scatter(
                name="cdf",
                x=[],
                y=[],
                mode="lines+markers",
                line=dict(shape="hv", color="#1f77b4"),
                **hover,
            ),
        ),
        "chosen band": (
            3,
            go.Scatter(
                name="chosen band",
                x=[],
                y=[],
                mode="lines",
                line=dict(color="#d62728", width=8),
                **silent,
            ),
        ),
        "u": (
            3,
            go.Scatter(
                name="u",
                x=[],
                y=[],
                mode="lines+text",
                text=[],
                textposition="top right",
                line=dict(color="#d62728", dash="dash"),
                **silent,
            ),
        ),
    }


def distribution_layout(titled: bool, height: int) -> dict:
    """The figure's layout: the house style, the title (or none), the margins."""
    title = (
        dict(text="Next-token distribution", font=dict(size=14), y=0.98, yanchor="top")
        if titled
        else None
    )
    return _layout(
        height=height if titled else height - 5,
        barmode="group",
        clickmode="event",
        title=title,
        margin=dict(l=60, r=20, t=95 if titled else 50, b=60 if titled else 100),
    )


def distribution_figure(titled: bool = True, *, height: int = 360) -> go.Figure:
    """Three panels for one step: top-n bars (raw vs final), the stage waterfall, the draw on the CDF.

    titled=False: no figure title (the dashboard shows the step's title as HTML above the chart: a
    plotly title that changes every step costs ~12 ms of text layout per redraw in the browser).
    """
    fig = make_subplots(
        rows=1,
        cols=3,
        column_widths=[0.52, 0.22, 0.26],
        horizontal_spacing=0.07,
        subplot_titles=PANEL_TITLES,
    )
    for col, trace in distribution_traces().values():
        fig.add_trace(trace, row=1, col=col)
    _style_axes(fig)
    fig.update_layout(**distribution_layout(titled, height))
    fig.update_yaxes(title_text="probability", range=[0, 1], row=1, col=1)
    fig.update_yaxes(title_text="mass kept", range=[0, 1.15], row=1, col=2)
    fig.update_yaxes(title_text="cumulative final p", range=[0, 1.05], row=1, col=3)
    fig.update_xaxes(title_text="rank by final p", row=1, col=3)
    if not titled:
        # The dashboard's chart, redrawn every step: fixed label angles and margins. With automargin
        # the new step's token labels (other lengths) move the margins, and plotly.js draws the
        # whole figure a second time to fit them. Measured in headless chromium on a loaded 2-core
        # machine, 20 steps' updates, 3 alternations: median Plotly.update 142-180 ms with fixed
        # margins (labels at -45 degrees) against 154-232 ms as before; noisy, not a claim.
        fig.update_xaxes(automargin=False)
        fig.update_yaxes(automargin=False)
        fig.update_xaxes(tickangle=-90, row=1, col=1)
        fig.update_xaxes(tickangle=-30, row=1, col=2)
    return fig


def distribution_columns(step: Step, top_n: int | None = None) -> Columns:
    """The panels' data for one step (replaces, never appends: the selected step changes)."""
    top = step.top[:top_n] if top_n else step.top
    chosen = [t["id"] == step.token_id for t in top]
    labels = [f"{show_token(t['text'])} ({t['id']})" for t in top]
    x = np.arange(len(top), dtype=np.float64)
    ids = _arr((t["id"] for t in top), np.float64)
    hover = [
        f"{lab}<br>raw {t['raw']:.4f} · final {t['final']:.4f}" + ("<br><b>chosen</b>" if c else "")
        for lab, t, c in zip(labels, top, chosen)
    ]
    stages = step.stages or []
    cdf = _cdf_columns(step, top)
    return {
        "raw": {
            "x": x,
            "y": _arr(t["raw"] for t in top),
            "customdata": ids,
            "hovertext": _objs(hover),
        },
        "final": {
            "x": x,
            "y": _arr(t["final"] for t in top),
            "customdata": ids,
            "hovertext": _objs(hover),
            "marker.line.width": _arr(3.0 if c else 0.0 for c in chosen),
        },
        "stages": {
            "x": _objs(s["name"].replace("_", " ") for s in stages),
            "y": _arr(s["mass"] for s in stages),
            "text": _objs(f"{s['kept']:,}" for s in stages),
            "hovertext": _objs(
                f"{s['name']}: kept {s['kept']:,} tokens holding {s['mass']:.3f} of the mass "
                "entering the stage"
                for s in stages
            ),
        },
        **cdf,
    }


def _cdf_columns(step: Step, top: list[dict]) -> Columns:
    """Tokens sorted by final probability, their running sum, and where the uniform draw fell."""
    ranked = sorted(top, key=lambda t: -t["final"])
    cum = np.cumsum([t["final"] for t in ranked]) if ranked else np.empty(0)
    hover = [
        f"{show_token(t['text'])}: final {t['final']:.4f}, cumulative {c:.4f}"
        for t, c in zip(ranked, cum)
    ]
    draw = step.draw or {}
    lo, hi = draw.get("cdf_lo"), draw.get("cdf_hi")
    rank = min(step.rank_final, len(ranked))  # a token beyond the top-n sits just right of them
    beyond = (
        f"<br>chosen: rank {step.rank_final} (past the top {len(ranked)})"
        if step.rank_final >= len(ranked)
        else ""
    )
    band_x = np.array([rank, rank], dtype=np.float64) if lo is not None else np.empty(0)
    band_y = np.array([lo, hi], dtype=np.float64) if lo is not None else np.empty(0)
    u = draw.get("u")
    if u is not None:
        # the label at the line's right end: at its left end it sat on the chosen band (rank 0);
        # below the line when the line is high (the CDF runs along the top there)
        where = "bottom left" if u > 0.8 else "top left"
        u_cols = {
            "x": np.array([0.0, max(len(ranked), rank, 1)]),
            "y": np.array([u, u]),
            "text": _objs(["", f"u = {u:.3f}{beyond}"]),
            "textposition": _objs([where, where]),
        }
    else:
        label = "forced: chosen by you" if step.forced else "greedy: argmax (no draw)"
        # low in the panel: at the top the label would sit on the panel's title
        u_cols = {
            "x": np.array([0.0]),
            "y": np.array([0.1]),
            "text": _objs([label]),
            "textposition": _objs(["top right"]),
        }
    return {
        "cdf": {"x": np.arange(len(ranked), dtype=np.float64), "y": cum, "hovertext": _objs(hover)},
        "chosen band": {"x": band_x, "y": band_y},
        "u": u_cols,
    }


def distribution_title(step: Step) -> str:
    """What was chosen at this step, how, and how likely it was."""
    how = (
        "forced" if step.forced else ("greedy" if (step.draw or {}).get("u") is None else "sampled")
    )
    return (
        f"Step {step.index} ({step.phase}): {show_token(step.token_text)!s} id {step.token_id} {how}, "
        f"p final {step.prob_final:.3f} (rank {step.rank_final}), H {step.entropy_final:.2f} nats"
    )


def distribution_labels(
    step: Step, top_n: int | None = None, titled: bool = True
) -> dict[str, Any]:
    """Layout updates for one step: the bars' token labels (and the title)."""
    top = step.top[:top_n] if top_n else step.top
    labels = {
        "xaxis.tickvals": list(range(len(top))),
        "xaxis.ticktext": [show_token(t["text"]) for t in top],
    }
    return {**labels, "title.text": distribution_title(step)} if titled else labels


def distribution(step: Step, top_n: int | None = None) -> go.Figure:
    """The distribution panels of one step as a standalone figure."""
    fig = distribution_figure()
    replace(fig, distribution_columns(step, top_n))
    fig.update_layout(distribution_labels(step, top_n))
    return fig


# --- latency ---------------------------------------------------------------------------------------
