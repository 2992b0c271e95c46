"""Speculative decoding: rounds (accepted / rejected), alpha, accepted lengths, speedup per k."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import plotly.graph_objects as go

from explorer.engine.trace import Trace
from explorer.plots.common import (
    Columns,
    _arr,
    _field,
    _layout,
    _num,
    _objs,
    extend,
    replace,
    show_token,
)

OUTCOME_COLORS = {
    "accepted": "#2ca02c",
    "rejected": "#d62728",
    "not tested": "#c7c7c7",
    "resampled": "#ff7f0e",
    "bonus": "#1f77b4",
}
SPEC_ROUNDS_WINDOW = 12  # rounds shown at once: each row as tall as its 30 px cells (24 overlapped)


def rounds_figure(*, height: int = 560) -> go.Figure:
    """Each round as a row: the k drafted tokens marked accepted / rejected / not tested, then the
    token the target added (resampled from the residual after a rejection, or the bonus)."""
    fig = go.Figure(
        data=[
            go.Scatter(
                name=outcome,
                x=[],
                y=[],
                text=[],
                hovertext=[],
                hoverinfo="text",
                mode="markers+text",
                marker=dict(symbol="square", size=30, color=color),
                textfont=dict(size=11),
                textposition="middle center",
            )
            for outcome, color in OUTCOME_COLORS.items()
        ],
        layout=_layout(
            height=height,
            title=dict(
                text="Rounds: drafted tokens and what the target did with them", font=dict(size=13)
            ),
            xaxis=dict(
                title="position in the round (drafts, then the target's token)",
                dtick=1,
                zeroline=False,
            ),
            yaxis=dict(title="round", autorange="reversed", dtick=1, zeroline=False),
            legend=dict(orientation="h", x=0, y=0, yref="container", yanchor="bottom"),
            margin=dict(l=60, r=20, t=50, b=110),
        ),
    )
    return fig


def rounds_columns(rounds: Sequence[Any]) -> Columns:
    """One cell per drafted token, plus the residual / bonus cell, per round."""
    cells: dict[str, list[tuple[float, float, str, str]]] = {k: [] for k in OUTCOME_COLORS}
    for r in rounds:
        index = _field(r, "index")
        lookup = _field(r, "lookup")
        source = (
            f"copied by prompt lookup from positions {lookup['from']}..{lookup['to'] - 1} "
            f"(after a {lookup['n']}-gram match)<br>"
            if lookup
            else ""
        )
        for pos, d in enumerate(_field(r, "drafts", [])):
            outcome = {True: "accepted", False: "rejected", None: "not tested"}[d.get("accepted")]
            hover = (
                f"round {index}, draft {pos + 1}: {show_token(d['text'])} (id {d['id']})<br>"
                + source
                + f"q {d['q']:.3f} · p {d['p']:.3f} · accept prob {d['accept_prob']:.3f}"
                + (f" · u {d['u']:.3f}" if d.get("u") is not None else "")
                + f"<br>{outcome}"
            )
            cells[outcome].append((pos, index, show_token(d["text"]), hover))
        residual, bonus = _field(r, "residual"), _field(r, "bonus")
        extra = residual or bonus
        if extra is not None:
            kind = "resampled" if residual is not None else "bonus"
            pos = residual["position"] if residual is not None else len(_field(r, "drafts", []))
            why = (
                f"resampled from the residual max(0, p - q) (mass {residual['mass']:.3f})"
                if residual is not None
                else f"bonus from the target's last distribution (p {bonus['p']:.3f})"
            )
            cells[kind].append(
                (
                    pos,
                    index,
                    show_token(extra["text"]),
                    f"round {index}: {show_token(extra['text'])} (id {extra['id']})<br>{why}",
                )
            )
    cols: Columns = {}
    for outcome, rows in cells.items():
        if rows:
            cols[outcome] = {
                "x": _arr((c[0] for c in rows), np.float64),
                "y": _arr((c[1] for c in rows), np.float64),
                "text": _objs(c[2] for c in rows),
                "hovertext": _objs(c[3] for c in rows),
            }
    return cols


def rounds_range(last_round: int, window: int = SPEC_ROUNDS_WINDOW) -> list[float]:
    """y range (reversed axis) that shows the last `window` rounds."""
    return [last_round + 0.5, max(-0.5, last_round - window + 0.5)]


def alpha_figure(*, height: int = 300) -> go.Figure:
    """Acceptance per round and the running alpha (accepted / tested drafts): measured counts."""
    return go.Figure(
        data=[
            go.Bar(
                name="accepted / k this round",
                x=[],
                y=[],
                marker=dict(color="#9ecae1"),
                hovertemplate="round %{x}: %{y:.2f}<extra></extra>",
            ),
            go.Scatter(
                name="running alpha (accepted / tested)",
                x=[],
                y=[],
                mode="lines+markers",
                line=dict(color="#08519c"),
                hovertemplate="round %{x}: alpha %{y:.3f}<extra></extra>",
            ),
            go.Scatter(
                name="running alpha from overlap, sum min(p, q)",
                x=[],
                y=[],
                mode="lines",
                line=dict(color="#fd8d3c", dash="dot"),
                hovertemplate="round %{x}: %{y:.3f}<extra>overlap</extra>",
            ),
        ],
        layout=_layout(
            height=height,
            title=dict(text="Acceptance rate alpha", font=dict(size=13)),
            xaxis=dict(title="round", autorangeoptions=dict(include=[0, 4])),  # whole rounds
            yaxis=dict(title="alpha", range=[0, 1.05]),
            legend=dict(orientation="h", x=0, y=0, yref="container", yanchor="bottom"),
            margin=dict(l=60, r=20, t=50, b=130),
        ),
    )


def alpha_columns(rounds: Sequence[Any], before: dict | None = None) -> Columns:
    """Per-round acceptance and running alpha; `before` carries the counts of earlier rounds
    ({"tested", "accepted", "overlap_sum", "overlap_n"}) so appending stays O(new rounds)."""
    acc = dict(before or {"tested": 0, "accepted": 0, "overlap_sum": 0.0, "overlap_n": 0})
    x, frac, run, over = [], [], [], []
    for r in rounds:
        k, n = _field(r, "k"), _field(r, "accepted")
        if not k:
            continue
        tested = n + (1 if n < k else 0)
        acc["tested"] += tested
        acc["accepted"] += n
        for d in _field(r, "drafts", [])[:tested]:
            acc["overlap_sum"] += d["overlap"]
            acc["overlap_n"] += 1
        x.append(_field(r, "index"))
        frac.append(n / k)
        run.append(acc["accepted"] / acc["tested"])
        over.append(acc["overlap_sum"] / acc["overlap_n"] if acc["overlap_n"] else float("nan"))
    if before is not None:
        before.update(acc)
    if not x:
        return {}
    xs = _arr(x, np.float64)
    return {
        "accepted / k this round": {"x": xs, "y": _arr(frac)},
        "running alpha (accepted / tested)": {"x": xs, "y": _arr(run)},
        "running alpha from overlap, sum min(p, q)": {"x": xs, "y": _arr(over)},
    }


def accepted_histogram_figure(*, height: int = 300) -> go.Figure:
    return go.Figure(
        data=[
            go.Bar(
                name="rounds",
                x=[],
                y=[],
                marker=dict(color="#2ca02c"),
                hovertemplate="%{x} accepted: %{y} rounds<extra></extra>",
            )
        ],
        layout=_layout(
            height=height,
            title=dict(text="Accepted drafts per round (measured counts)", font=dict(size=13)),
            xaxis=dict(title="draft tokens accepted", dtick=1),
            yaxis=dict(title="rounds"),
        ),
    )


def accepted_histogram_columns(histogram: Sequence[int]) -> Columns:
    return {
        "rounds": {
            "x": np.arange(len(histogram), dtype=np.float64),
            "y": _arr(histogram, np.float64),
        }
    }


def speedup_figure(rows: Sequence[dict] = (), *, height: int = 340) -> go.Figure:
    """Predicted (Leviathan et al. eq. 1, from measured alpha and c) vs measured speedup, per k."""
    fig = go.Figure(
        data=[
            go.Bar(
                name="predicted (modelled: eq. 1, verify = 1 decode pass)",
                x=[],
                y=[],
                marker=dict(color="#9ecae1"),
            ),
            go.Bar(
                name="predicted with measured verify cost (modelled)",
                x=[],
                y=[],
                marker=dict(color="#4292c6"),
            ),
            go.Bar(name="measured (forward passes)", x=[], y=[], marker=dict(color="#d62728")),
        ],
        layout=_layout(
            height=height,
            barmode="group",
            title=dict(text="Speedup over target-only decoding, per k", font=dict(size=13)),
            xaxis=dict(title="k (draft tokens per round)", dtick=1),
            yaxis=dict(title="speedup (x)"),
            legend=dict(orientation="h", x=0, y=0, yref="container", yanchor="bottom"),
            margin=dict(l=60, r=20, t=50, b=100),
        ),
    )
    fig.add_hline(y=1, line=dict(color="#555", dash="dash"))
    if rows:
        replace(fig, speedup_columns(rows))
    return fig


def speedup_columns(rows: Sequence[dict]) -> Columns:
    ks = _arr((r["k"] for r in rows), np.float64)
    return {
        "predicted (modelled: eq. 1, verify = 1 decode pass)": {
            "x": ks,
            "y": _arr(_num(r.get("predicted")) for r in rows),
        },
        "predicted with measured verify cost (modelled)": {
            "x": ks,
            "y": _arr(_num(r.get("predicted_with_verify_cost")) for r in rows),
        },
        "measured (forward passes)": {"x": ks, "y": _arr(_num(r.get("measured")) for r in rows)},
    }


def speculative_rounds(trace: Trace) -> go.Figure:
    """A speculative Trace's rounds as one figure (for notebooks)."""
    fig = rounds_figure()
    extend(fig, rounds_columns(trace.rounds))
    return fig


# --- sweeps (explorer.sweeps DataFrames) ------------------------------------------------------------
